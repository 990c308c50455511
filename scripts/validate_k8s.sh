#!/usr/bin/env bash
# Validates the Kubernetes side without a cluster, with the tools of .venv-k8s (requirements/k8s.in):
#   1. renders k8s/base and every overlay with `kubectl kustomize`, and the pods, MPIJobs (fixed-size
#      and Horovod elastic), tf.data service objects and model server that `python -m workflow.manifests`
#      prints for each overlay's cluster.yaml (the gpu overlay's with two extensions named);
#   2. kubernetes-validate (strict: unknown fields are errors) on every manifest of a built-in kind;
#   3. the MPIJobs (k8s/mpijob/ and the rendered ones) against the MPIJob CRD schema of the MPI
#      Operator (made strict), its controller's own rules, and their pod templates against Kubernetes;
#   4. checkov on k8s/, on each rendering together with the pods `workflow.manifests` prints, and on
#      docker/: every failed check fails, unless the manifest skips it with a reason;
#   5. hadolint on docker/*.Dockerfile, shellcheck on the shell scripts embedded in the manifests,
#      yamllint on k8s/ (the third-party schemas in k8s/schemas/ excepted).
# Runs every step, then exits 1 if any failed.
#   K8S_VERSION=1.32.0 scripts/validate_k8s.sh
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2

K8S_VERSION=${K8S_VERSION:-1.32.0}
VENV=${VENV_K8S:-.venv-k8s}
CRD=${MPIJOB_CRD:-k8s/schemas/mpijobs.kubeflow.org-v0.8.2.yaml}
OVERLAYS=(gpu single-node)

say() { printf '\033[1m[validate-k8s]\033[0m %s\n' "$*"; }
die() { printf '\033[1;31m[validate-k8s] %s\033[0m\n' "$*" >&2; exit 2; }

[ -x "$VENV/bin/python" ] \
  || die "$VENV is missing: python3.11 -m venv $VENV &&" \
    "$VENV/bin/pip install -r requirements/k8s.in -c requirements/k8s.lock"
# kubectl renders the kustomizations: the one pinned in .venv-k8s, else the machine's.
KUBECTL="$VENV/bin/kubectl"
[ -x "$KUBECTL" ] || KUBECTL=$(command -v kubectl) \
  || die "kubectl not found (requirements/k8s.in installs one into $VENV)"
[ -f "$CRD" ] || die "MPIJob CRD $CRD not found (it ships in k8s/schemas/; set MPIJOB_CRD=...)"
PY="$VENV/bin/python"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
failed=()
step() {  # step NAME COMMAND...: runs it, records a failure, never stops the script
  local name=$1
  shift
  say "$name"
  if ! "$@"; then
    failed+=("$name")
    printf '\033[1;31m[validate-k8s] FAILED: %s\033[0m\n' "$name"
  fi
}

# ---- 1. renderings ---------------------------------------------------------------------------
render() {
  "$KUBECTL" kustomize k8s/base > "$OUT/kustomize-base.yaml" || return 1
  local overlay
  for overlay in "${OVERLAYS[@]}"; do
    "$KUBECTL" kustomize "k8s/overlays/$overlay" > "$OUT/kustomize-$overlay.yaml" || return 1
    local settings="k8s/overlays/$overlay/cluster.yaml"
    local k8s=("$PY" -m workflow.manifests --settings "$settings")
    # One overlay's pods carry extensions (their variable and the read-only mount of their code), the
    # other's do not: both shapes are checked.
    local extensions=""
    [ "$overlay" = gpu ] && extensions=tests.extension.speaker_id,tests.extension.local_sgd
    export SPEECHFLOW_EXTENSIONS=$extensions
    # The DAG's training job (reading from a tf.data service), an elastic one, the data service and
    # each kind of stage pod, as the DAG would submit them.
    {
      "${k8s[@]}" mpijob --name "train-$overlay" --num-workers 2 -- \
        --model asr --strategy allreduce --shards /data/shards --workdir /data/runs/train \
        --data-service "grpc://data-$overlay-dispatcher:5050" &&
        echo --- &&
        "${k8s[@]}" mpijob --name "elastic-$overlay" --num-workers 3 --min-workers 1 -- \
          --model asr --strategy allreduce --shards /data/shards --workdir /data/runs/elastic
    } > "$OUT/mpijob-$overlay.yaml" || return 1
    "${k8s[@]}" data-service --name "data-$overlay" --num-workers 2 \
      --work-dir /data/runs/train/data-service/asr/try-1 > "$OUT/data-service-$overlay.yaml" || return 1
    "${k8s[@]}" serving --name serve-asr --model-uri models:/speechflow-asr@champion \
      --serve-setting SPEECHFLOW_SERVE_MAX_ROWS=16 > "$OUT/serving-$overlay.yaml" || return 1
    {
      "${k8s[@]}" stage-pod --name corpus --module pipeline.corpus -- --out /data/corpus &&
        echo --- &&
        "${k8s[@]}" stage-pod --name features --module pipeline.features -- --data-dir /data/corpus/train &&
        echo --- &&
        "${k8s[@]}" stage-pod --name shards --module pipeline.shards -- \
          --split train=/data/corpus/train --split dev=/data/corpus/dev --out /data/shards &&
        echo --- &&
        "${k8s[@]}" stage-pod --name evaluate --module models.evaluate --gpus 1 -- \
          --model /data/runs/train --shards /data/shards
    } > "$OUT/stage-pods-$overlay.yaml" || return 1
  done
  unset SPEECHFLOW_EXTENSIONS
  ls "$OUT"
}
step "render kustomizations and pipeline objects" render

# ---- 2. Kubernetes schemas -------------------------------------------------------------------
kube_validate() {
  # Source manifests (not the Kustomization files), every rendering, the stage pods. MPIJobs are
  # not a built-in kind: kubernetes-validate skips them with a warning, step 3 validates them.
  local sources
  mapfile -t sources < <(find k8s/base k8s/elastic -name '*.yaml' ! -name kustomization.yaml | sort)
  "$VENV/bin/kubernetes-validate" --kubernetes-version "$K8S_VERSION" --strict --quiet \
    "${sources[@]}" "$OUT"/kustomize-*.yaml "$OUT"/stage-pods-*.yaml "$OUT"/data-service-*.yaml \
    "$OUT"/serving-*.yaml
}
step "kubernetes-validate --strict (Kubernetes $K8S_VERSION)" kube_validate

# ---- 3. MPIJobs ------------------------------------------------------------------------------
mpijobs() {
  "$PY" scripts/validate_mpijob.py --crd "$CRD" --k8s-version "$K8S_VERSION" \
    --pods-out "$OUT/mpijob-pods.yaml" k8s/mpijob/*.yaml "$OUT"/mpijob-*.yaml
}
step "MPIJobs against the CRD schema ($(basename "$CRD")) and the operator's rules" mpijobs

# ---- 4. checkov ------------------------------------------------------------------------------
CHECKOV=("$VENV/bin/checkov" --skip-download --compact --quiet)
checkov_sources() {
  "${CHECKOV[@]}" --framework kubernetes -d k8s
}
checkov_rendered() {
  # Each overlay's rendering together with the pods `workflow.manifests` prints for it, so that checks
  # relating pods to NetworkPolicies see both. MPIJob pod templates are checked as Pods.
  local overlay status=0
  for overlay in "${OVERLAYS[@]}"; do
    "$PY" scripts/validate_mpijob.py --crd "$CRD" --pods-out "$OUT/mpijob-pods-$overlay.yaml" \
      "$OUT/mpijob-$overlay.yaml" >/dev/null || status=1
    {
      cat "$OUT/kustomize-$overlay.yaml"
      echo ---
      cat "$OUT/stage-pods-$overlay.yaml"
      echo ---
      cat "$OUT/data-service-$overlay.yaml"
      echo ---
      cat "$OUT/serving-$overlay.yaml"
      echo ---
      cat "$OUT/mpijob-pods-$overlay.yaml"
    } > "$OUT/all-$overlay.yaml"
    "${CHECKOV[@]}" --framework kubernetes -f "$OUT/all-$overlay.yaml" || status=1
  done
  return $status
}
checkov_docker() {
  "${CHECKOV[@]}" --framework dockerfile -d docker
}
step "checkov: k8s/ sources" checkov_sources
step "checkov: renderings with the pipeline's pods" checkov_rendered
step "checkov: docker/" checkov_docker

# ---- 5. linters ------------------------------------------------------------------------------
step "hadolint docker/*.Dockerfile" "$VENV/bin/hadolint" docker/*.Dockerfile
shell_scripts() {
  # The scripts embedded in ConfigMaps and containers' commands run in images we cannot start
  # here; lint them as the shells that will run them.
  "$PY" - "$OUT" k8s/base/postgres.yaml k8s/base/mlflow.yaml <<'PYTHON' || return 1
import sys
from pathlib import Path

import yaml

out = Path(sys.argv[1])
for manifest in sys.argv[2:]:
    for doc in yaml.safe_load_all(Path(manifest).read_text()):
        if not doc:
            continue
        name = doc["metadata"]["name"]
        if doc["kind"] == "ConfigMap":
            for key, text in doc["data"].items():
                if key.endswith(".sh"):
                    (out / f"{name}-{key}").write_text(text)
        for container in ((doc.get("spec") or {}).get("template") or {}).get("spec", {}).get("containers", []):
            if container.get("command", [])[:2] == ["/bin/sh", "-c"]:
                (out / f"{name}-{container['name']}.sh").write_text("#!/bin/sh\n" + container["args"][0])
PYTHON
  "$VENV/bin/shellcheck" "$OUT"/*.sh scripts/validate_k8s.sh scripts/discover_hosts.sh
}
step "shellcheck: scripts embedded in manifests, this one, and elastic host discovery" shell_scripts
step "yamllint k8s/" "$VENV/bin/yamllint" --strict -c k8s/.yamllint k8s

if [ ${#failed[@]} -gt 0 ]; then
  printf '\033[1;31m[validate-k8s] %d step(s) failed:\033[0m\n' "${#failed[@]}"
  printf '  %s\n' "${failed[@]}"
  exit 1
fi
say "all checks passed (Kubernetes $K8S_VERSION)"
