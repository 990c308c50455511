#!/usr/bin/env bash
# Builds the environments from nothing, or checks them quickly when nothing changed.
#   .venv          training stack (TensorFlow, Horovod compiled against it, MLflow, kaldiio, ...)
#   .venv-airflow  Apache Airflow and its providers (needs protobuf 5+, TensorFlow needs <5)
#   .venv-try      Gradio, for the page that tries the models (`make try`; Gradio needs pillow<13)
#   .venv-benchmarks  pocketsphinx, the reference recognizer of the benchmarks (benchmarks/reference_asr.py)
# Each step leaves a stamp holding the hash of its inputs; a step whose stamp matches is skipped,
# so Horovod (about 3 minutes of C++) is only rebuilt when TensorFlow or Horovod's pin changes.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3.11}
REQ=requirements

say() { printf '\033[1m[setup]\033[0m %s\n' "$*"; }
die() { printf '\033[1;31m[setup] %s\033[0m\n' "$*" >&2; exit 1; }

hash_of() { cat "$@" | sha256sum | cut -c1-16; }
stamp_ok() { [ -f "$1" ] && [ "$(cat "$1")" = "$2" ]; }

# --- system packages --------------------------------------------------------------------------
# command -> Debian package that provides it
declare -A NEED=([espeak-ng]=espeak-ng [flite]=flite [sox]=sox [cmake]=cmake [g++]=g++ [make]=make)
missing=()
for cmd in "${!NEED[@]}"; do command -v "$cmd" >/dev/null 2>&1 || missing+=("${NEED[$cmd]}"); done
# WordNet's example sentences: the demo corpus' open English text (pipeline/open_text.py).
[ -f /usr/share/wordnet/data.noun ] || missing+=(wordnet-base)
# KenLM's lmplz, which builds the word LM (pipeline/lm.py), is compiled below: it needs Boost's libraries
# that its CMake asks for (the unit-test framework too: their CMake configurations are what it finds) and zlib.
for lib in program_options system thread unit_test_framework; do
  compgen -G "/usr/lib/*/cmake/boost_$lib-*" >/dev/null || compgen -G "/usr/lib/cmake/boost_$lib-*" >/dev/null || {
    missing+=(libboost-program-options-dev libboost-system-dev libboost-thread-dev libboost-test-dev)
    break
  }
done
[ -f /usr/include/zlib.h ] || missing+=(zlib1g-dev)
# PostgreSQL's server, for the test of MLflow on PostgreSQL (tests/test_dag.py starts its
# own cluster). Debian keeps initdb off PATH, in /usr/lib/postgresql/VERSION/bin. Optional: without
# root, that test is skipped and says why.
has_postgres() { command -v initdb >/dev/null 2>&1 || compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null; }
# Chromium, for the browser test of the try page (tests/test_try_page.py drives Debian's build; it
# downloads no browser of its own). Optional too: without it that test is skipped and says why.
optional=()
skipped=()
has_postgres || { optional+=(postgresql); skipped+=("PostgreSQL: the test of MLflow on PostgreSQL"); }
command -v chromium >/dev/null 2>&1 || {
  optional+=(chromium)
  skipped+=("Chromium: the browser test of the try page")
}
# Festival and its voices of the demo corpus (common/voices.py: ked and kal diphone, slt HTS).
# Optional: without them the corpus leaves Festival's voices out and says so.
festival=(festival festvox-kdlpc16k festvox-kallpc16k festvox-us-slt-hts)
if ! command -v festival >/dev/null 2>&1 \
  || { command -v dpkg >/dev/null && ! dpkg -s "${festival[@]:1}" >/dev/null 2>&1; }; then
  optional+=("${festival[@]}")
  skipped+=("Festival: its voices in the demo corpus")
fi
if [ ${#missing[@]} -gt 0 ] || [ ${#optional[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    say "installing system packages: ${missing[*]} ${optional[*]}"
    export DEBIAN_FRONTEND=noninteractive
    if [[ " ${optional[*]} " == *" postgresql "* ]] && [ ! -e /etc/postgresql-common/createcluster.conf ]; then
      # The package would otherwise create and start a cluster on port 5432; the test makes its own.
      mkdir -p /etc/postgresql-common
      echo "create_main_cluster = false" > /etc/postgresql-common/createcluster.conf
    fi
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" "${optional[@]}" >/dev/null
  elif [ ${#missing[@]} -gt 0 ]; then
    die "missing system packages: ${missing[*]} ${optional[*]}. Install them, e.g." \
      "'sudo apt-get install ${missing[*]} ${optional[*]}', then run 'make setup' again."
  else
    for what in "${skipped[@]}"; do say "${what%%:*} is not installed: ${what#*: } will be skipped"; done
    say "to run them: sudo apt-get install ${optional[*]}"
  fi
fi
command -v "$PYTHON" >/dev/null \
  || die "$PYTHON not found: the project needs Python 3.11 (set PYTHON=/path/to/python3.11)."
"$PYTHON" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' || die "$PYTHON is not Python 3.11."

# --- side environments (built in the background while Horovod compiles) -----------------------
build_airflow() {
  local af_hash
  af_hash=$(hash_of "$REQ/airflow.in" "$REQ/airflow.lock" setup.cfg)
  stamp_ok .venv-airflow/.stamp "$af_hash" && return 0
  say "building .venv-airflow (Apache Airflow)"
  [ -x .venv-airflow/bin/python ] || "$PYTHON" -m venv .venv-airflow
  .venv-airflow/bin/python -m pip install -q --upgrade "pip==24.3.1"
  .venv-airflow/bin/python -m pip install -q -r "$REQ/airflow.in" -c "$REQ/airflow.lock"
  # The DAGs import only the project's light, TensorFlow-free modules (cluster objects).
  .venv-airflow/bin/python -m pip install -q --no-deps -e .
  .venv-airflow/bin/python -m pip check >/dev/null || { .venv-airflow/bin/python -m pip check; return 1; }
  echo "$af_hash" > .venv-airflow/.stamp
}

# build_pinned NAME WHAT: .venv-NAME from requirements/NAME.in within NAME.lock, the project not installed.
build_pinned() {
  local name=$1 what=$2 hash venv=".venv-$1"
  hash=$(hash_of "$REQ/$name.in" "$REQ/$name.lock")
  stamp_ok "$venv/.stamp" "$hash" && return 0
  say "building $venv ($what)"
  [ -x "$venv/bin/python" ] || "$PYTHON" -m venv "$venv"
  "$venv/bin/python" -m pip install -q --upgrade "pip==24.3.1"
  "$venv/bin/python" -m pip install -q -r "$REQ/$name.in" -c "$REQ/$name.lock"
  "$venv/bin/python" -m pip check >/dev/null || { "$venv/bin/python" -m pip check; return 1; }
  echo "$hash" > "$venv/.stamp"
}

# The side environments are mostly downloads; compiling Horovod is mostly CPU: run them together.
mkdir -p build
build_airflow > build/setup-airflow.log 2>&1 &
airflow_job=$!
# kubernetes-validate, checkov, yamllint, hadolint, shellcheck and a kubectl with kustomize, for
# checking k8s/ and the Dockerfiles (scripts/validate_k8s.sh); kept apart for their own pins.
build_pinned k8s "Kubernetes manifest validators" > build/setup-k8s.log 2>&1 &
k8s_job=$!
# Gradio, for the page that tries the models (apps/try_page.py, which imports nothing of the project).
build_pinned try "Gradio, for make try" > build/setup-try.log 2>&1 &
try_job=$!
# pocketsphinx, the off-the-shelf recognizer whose CER the benchmarks print beside ours
# (benchmarks/reference_asr.py, which imports only the project's TensorFlow-free modules).
build_pinned benchmarks "pocketsphinx, the reference recognizer of the benchmarks" > build/setup-benchmarks.log 2>&1 &
benchmarks_job=$!

# --- training environment ---------------------------------------------------------------------
train_hash=$(hash_of "$REQ/train.in" "$REQ/train.lock" setup.cfg)
if ! stamp_ok .venv/.stamp-train "$train_hash"; then
  say "building .venv (training stack)"
  [ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
  .venv/bin/python -m pip install -q --upgrade "pip==24.3.1" "setuptools==75.6.0" "wheel==0.45.1"
  .venv/bin/python -m pip install -q -r "$REQ/train.in" -c "$REQ/train.lock"
  .venv/bin/python -m pip install -q --no-deps -e .
  echo "$train_hash" > .venv/.stamp-train
fi

# Horovod: compiled against the TensorFlow installed above, so no build isolation (it would hide
# TensorFlow from Horovod's CMake), and with the system cmake (pip's cmake 4.x rejects the gloo
# that Horovod bundles). MPI is added when an MPI compiler is present.
hvd_flags="HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1"
if command -v mpicxx >/dev/null 2>&1; then
  hvd_flags+=" HOROVOD_WITH_MPI=1"
else
  hvd_flags+=" HOROVOD_WITHOUT_MPI=1"
fi
tf_pin=$(grep -i '^tensorflow-cpu==' "$REQ/train.lock" || true)
hvd_hash=$(echo "$hvd_flags $(cat "$REQ/horovod.in") $tf_pin" | sha256sum | cut -c1-16)
if ! stamp_ok .venv/.stamp-horovod "$hvd_hash" || ! .venv/bin/python -c 'import horovod.tensorflow' 2>/dev/null; then
  say "compiling Horovod against TensorFlow (about 3 minutes on 2 cores; cached by pip afterwards)"
  .venv/bin/python -m pip uninstall -q -y horovod 2>/dev/null || true
  env $hvd_flags MAKEFLAGS="-j$(nproc)" PATH="/usr/bin:$PATH" \
    .venv/bin/python -m pip install -q --no-build-isolation -r "$REQ/horovod.in" -c "$REQ/train.lock" \
    || die "the Horovod build failed; see docs/troubleshooting.md."
  .venv/bin/python -c 'import horovod.tensorflow as h; assert h.gloo_built(), "Horovod built without Gloo"'
  echo "$hvd_hash" > .venv/.stamp-horovod
fi
# KenLM's lmplz and build_binary (the word LM's estimator, pipeline/lm.py), compiled from the sources in
# the sdist of the kenlm module that train.lock pins (that module compiles only KenLM's query code).
# The binaries are kept in the user's cache per version, so a second checkout copies them.
kenlm_version=$(sed -n 's/^kenlm==//p' "$REQ/train.lock")
[ -n "$kenlm_version" ] || die "requirements/train.lock pins no kenlm version"
kenlm_cache="${XDG_CACHE_HOME:-$HOME/.cache}/speechflow/kenlm-$kenlm_version"
if ! stamp_ok .venv/.stamp-lmplz "$kenlm_version" || [ ! -x .venv/bin/lmplz ]; then
  if [ ! -x "$kenlm_cache/bin/lmplz" ] || [ ! -x "$kenlm_cache/bin/build_binary" ]; then
    say "compiling KenLM's lmplz $kenlm_version from its sdist (about 3 minutes on 2 cores; cached afterwards)"
    kenlm_src=$(mktemp -d)
    .venv/bin/python -m pip download -q --no-deps --no-binary kenlm "kenlm==$kenlm_version" -d "$kenlm_src" \
      || die "could not download the kenlm $kenlm_version sdist"
    tar xzf "$kenlm_src/kenlm-$kenlm_version.tar.gz" -C "$kenlm_src"
    { cmake -S "$kenlm_src/kenlm-$kenlm_version" -B "$kenlm_src/build" -DCMAKE_BUILD_TYPE=Release \
        && make -C "$kenlm_src/build" -j"$(nproc)" lmplz build_binary; } > build/setup-kenlm.log 2>&1 \
      || { tail -30 build/setup-kenlm.log >&2; die "the lmplz build failed (log in build/setup-kenlm.log)"; }
    mkdir -p "$kenlm_cache/bin"
    cp "$kenlm_src/build/bin/lmplz" "$kenlm_src/build/bin/build_binary" "$kenlm_cache/bin/"
    rm -rf "$kenlm_src"
  fi
  cp "$kenlm_cache/bin/lmplz" "$kenlm_cache/bin/build_binary" .venv/bin/
  echo "$kenlm_version" > .venv/.stamp-lmplz
fi
.venv/bin/python -m pip check >/dev/null || { .venv/bin/python -m pip check; die ".venv has broken requirements"; }

# --- wait for the side environments -----------------------------------------------------------
for job in "airflow:$airflow_job" "k8s:$k8s_job" "try:$try_job" "benchmarks:$benchmarks_job"; do
  if ! wait "${job#*:}"; then
    cat "build/setup-${job%%:*}.log" >&2
    die "building the ${job%%:*} environment failed (log above, also in build/setup-${job%%:*}.log)"
  fi
  cat "build/setup-${job%%:*}.log"
done
say "environments ready: .venv (training), .venv-airflow (Airflow), .venv-k8s (manifest checks)," \
  ".venv-try (the try page), .venv-benchmarks (the reference recognizer)"
