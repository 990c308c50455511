#!/usr/bin/env bash
# make demo: the whole pipeline on the demo corpus, end to end, with `airflow dags test` (no scheduler
# needed): SQLite for Airflow and MLflow, files under .runs/. Ends with a summary of the models.
#
#   make demo                                              # the DAG's defaults
#   DEMO_CONF='{"demo_utterances": 300, "max_steps": 100}' make demo   # other params, as JSON
#
# The stages' output scrolls by; Airflow's own log of the run is in .runs/demo.log.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
RUNS=$ROOT/.runs

say() { printf '\033[1m[demo]\033[0m %s\n' "$*"; }
die() { printf '\033[1;31m[demo] %s\033[0m\n' "$*" >&2; exit 1; }

[ -x .venv-airflow/bin/airflow ] || die "no .venv-airflow: run 'make setup' first"
[ -x .venv/bin/python ] || die "no .venv (the training environment the tasks run): run 'make setup' first"

export AIRFLOW_HOME=${AIRFLOW_HOME:-$RUNS/airflow}
export MLFLOW_TRACKING_URI=${MLFLOW_TRACKING_URI:-sqlite:///$RUNS/mlflow.db}
export SPEECHFLOW_WORK_ROOT=${SPEECHFLOW_WORK_ROOT:-$RUNS/pipeline}
export AIRFLOW__CORE__DAGS_FOLDER=$ROOT/dags
export AIRFLOW__CORE__LOAD_EXAMPLES=${AIRFLOW__CORE__LOAD_EXAMPLES:-False}
export PYTHONPATH=$ROOT${PYTHONPATH:+:$PYTHONPATH}
export PATH=$ROOT/.venv-airflow/bin:$PATH
CONF=${DEMO_CONF:-"{}"}
LOG=$RUNS/demo.log
mkdir -p "$RUNS" "$AIRFLOW_HOME" "$SPEECHFLOW_WORK_ROOT"

say "Airflow database: $AIRFLOW_HOME"
airflow db migrate >"$RUNS/airflow-db-migrate.log" 2>&1 \
  || { tail -20 "$RUNS/airflow-db-migrate.log" >&2; die "airflow db migrate failed (log: $RUNS/airflow-db-migrate.log)"; }

# How long it will take: this machine's last `make demo` with the same params and the same recipe
# (configs, DAG, code), else the committed measured run of the defaults (benchmarks/results/demo.json)
# scaled by a calibration of this machine (benchmarks/calibrate.py: a few steps of each model).
LAST=$RUNS/last_demo.json
RECIPE=$(.venv/bin/python -c 'from benchmarks.calibrate import recipe; print(recipe())')
known=0
.venv/bin/python - "$CONF" "$LAST" "$RECIPE" <<'EOF' || known=$?
import json
import sys
from pathlib import Path

conf, last, recipe = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
run = json.loads(last.read_text()) if last.is_file() else {}
if run.get("params") == json.loads(conf or "{}") and run.get("recipe") == recipe:
    print(f"\033[1m[demo]\033[0m this takes about {round(run['wall_s'] / 60)} minutes (this machine's last run "
          "with these params and this recipe)")
    sys.exit(3)  # known: no calibration needed
EOF
if [ "$known" != 3 ]; then
  if [ "$CONF" = "{}" ] && [ -f benchmarks/results/demo.json ]; then
    say "calibrating this machine (a few training steps of each model) to estimate the demo's time"
    calibration=${DEMO_CALIBRATION:-}  # benchmarks/demo.py measures it before, to record it
    if line=$(.venv/bin/python benchmarks/calibrate.py --estimate benchmarks/results/demo.json \
        ${calibration:+--calibration "$calibration"} 2>"$RUNS/calibrate.log" | tail -1); then
      say "$line"
    else
      say "the calibration failed (its log: $RUNS/calibrate.log): no estimate"
    fi
  else
    say "no estimate of its time for these params yet (the next run with them will have one)"
  fi
fi
started=$(date +%s)
since=$(mktemp)
trap 'rm -f "$since"' EXIT
say "running speech_pipeline with params $CONF (MLflow: $MLFLOW_TRACKING_URI)"
# Airflow's log lines carry a timestamp, a level, the message and its logger. Shown here: which task
# starts, the stages' own output (loggers workflow.* and speechflow.dag), errors and tracebacks.
set +e
airflow dags test speech_pipeline -c "$CONF" 2>&1 | tee "$LOG" | sed -un -E \
  -e '/graphviz/d' \
  -e 's/^[0-9-]+T[0-9:.]+Z \[info +\] \[DAG TEST\] starting task_id=([a-z_]+).*/\n== \1/p' -e t \
  -e 's/^[0-9-]+T[0-9:.]+Z \[info +\] (.*) \[(workflow\.[a-z]+|speechflow\.dag)\] loc=.*/  \1/p' -e t \
  -e '/^[0-9-]+T[0-9:.]+Z \[(error|critical)/p' -e '/^[0-9-]+T[0-9:.]+Z /d' -e p
status=${PIPESTATUS[0]}
set -e
elapsed=$(($(date +%s) - started))
[ "$status" -ne 0 ] || printf '{"params": %s, "recipe": "%s", "wall_s": %d}\n' "$CONF" "$RECIPE" "$elapsed" >"$LAST"

summary=$(find "$SPEECHFLOW_WORK_ROOT" -maxdepth 2 -name summary.json -newer "$since" -printf '%T@ %p\n' \
  | sort -n | tail -1 | cut -d' ' -f2-)
[ -n "$summary" ] || die "the DAG run wrote no summary (exit status $status); see $LOG"

.venv/bin/python - "$summary" "$elapsed" "$status" "$ROOT" "$LOG" <<'EOF'
import json
import os
import sys
from pathlib import Path

from common.voices import describe as voices  # ENGINE:VOICE specs, grouped by engine

summary_file, elapsed, status, root, log = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[4]), sys.argv[5]
s = json.loads(Path(summary_file).read_text())
home = os.environ["AIRFLOW_HOME"]


def rel(path) -> str:
    path = Path(path)
    return str(path.relative_to(root)) if path.is_relative_to(root) else str(path)


def pct(metrics, key):
    return f"{100 * metrics[key]:.1f}%" if key in metrics else "n/a"


def trained(info) -> str:
    """Steps and minutes of a model's training (its train_summary.json; rank 0's measured loop)."""
    path = Path(info["workdir"]) / "train_summary.json"
    if not path.exists():
        return "training time n/a (no train_summary.json)"
    t = json.loads(path.read_text())
    return f"trained {t['steps']} steps in {t['measured_seconds'] / 60:.1f} min"


def registry(info) -> str:
    r = info.get("registered")
    if not r:
        return "not registered"
    verdict = "now the champion" if r["promoted"] else f"champion stays version {r['champion_version']}"
    return f"registered {r['name']} version {r['version']}, {verdict} ({r['reason']})"


# The demo corpus' voices per split (pipeline/corpus.py corpus.json); absent when data_dir was given.
corpus_file = Path(summary_file).parent / "corpus" / "corpus.json"
heard = json.loads(corpus_file.read_text()).get("voices", {}) if corpus_file.exists() else {}

print()
print(f"speech_pipeline {'succeeded' if status == 0 else 'FAILED'} in {elapsed // 60} min {elapsed % 60} s "
      f"(MLflow parent run {s['parent_run_id']}, {s['status']})")
models = s["models"]
def char_table(m):
    print(f"                   {'split':<12} {'CER greedy':>10} {'beam':>6} {'LM':>6}   {'WER greedy':>10} {'beam':>6} {'LM':>6}")
    for split in ("dev", "test", "test_noisy", "test_engine"):
        if f"{split}_cer" in m:
            print(f"                   {split:<12} {pct(m, f'{split}_cer'):>10} {pct(m, f'{split}_cer_beam'):>6} "
                  f"{pct(m, f'{split}_cer_lm'):>6}   {pct(m, f'{split}_wer'):>10} {pct(m, f'{split}_wer_beam'):>6} "
                  f"{pct(m, f'{split}_wer_lm'):>6}")


def phone_table(m):
    print(f"                   {'split':<12} {'PER greedy':>10} {'beam':>6}   {'WER':>6} {'CER':>6}   {'RTF':>6}")
    for split in ("dev", "test", "test_noisy", "test_engine"):
        if f"{split}_per" in m:
            rtf = f"{m[f'{split}_decode_rtf_lm']:.3f}" if f"{split}_decode_rtf_lm" in m else "n/a"
            print(f"                   {split:<12} {pct(m, f'{split}_per'):>10} {pct(m, f'{split}_per_beam'):>6}   "
                  f"{pct(m, f'{split}_wer_lm'):>6} {pct(m, f'{split}_cer_lm'):>6}   {rtf:>6}")


def decoding(m, lm_dir):
    """The attached LM's or graph's line (models/tune_lm.py chose its settings)."""
    if not (lm_dir / "decoding.json").exists():
        print("                   no word LM attached (the param word_lm is off, or tune_lm_asr did not run: see its log)")
        return
    d = json.loads((lm_dir / "decoding.json").read_text())
    chosen = d["settings"]
    if (lm_dir / "lang.json").exists():  # an HLG graph (pipeline/lang.py)
        g = json.loads((lm_dir / "lang.json").read_text())
        print(f"                   HLG graph: {g['words']:,} words, {g['hlg']['states']:,} states, {g['hlg']['arcs']:,} arcs "
              f"({g['hlg']['bytes'] / 1e6:.0f} MB), acoustic scale {chosen['acoustic_scale']}, word penalty "
              f"{chosen['word_penalty']} (chosen on {d['chosen_on']['split']}); its words miss "
              f"{pct(m, 'test_lm_oov_rate')} of test's")
        return
    lm_text = json.loads((lm_dir / "lm.json").read_text())["text"]
    print(f"                   word LM: {lm_text['sentences']:,} sentences, {lm_text['vocabulary_size']:,} words, "
          f"weight {chosen['weight']}, word bonus {chosen['word_bonus']} (chosen on "
          f"{d['chosen_on']['split']}); its words miss {pct(m, 'test_lm_oov_rate')} of test's")


def speakers(m, workdir, phones):
    """test_engine per speaker (eval/test_engine_speakers.tsv): the held-out speakers, each engine apart."""
    table = Path(workdir) / "eval" / "test_engine_speakers.tsv"
    if not table.exists():
        return
    print(f"                   test_engine: the test sentences in {voices(heard.get('test_engine', [])) or 'n/a'}, "
          "voices never heard in training; per speaker:")
    for row in (line.split("\t") for line in table.read_text().splitlines()[1:] if line):
        if phones:  # speaker utterances phones per per_beam words wer_lm cer_lm
            speaker, utts, _, per, _, _, wer, _ = row
            print(f"                     {speaker:<34} PER {100 * float(per):5.1f}%, WER {100 * float(wer):5.1f}%, "
                  f"{utts} utterances")
        else:  # speaker utterances chars cer cer_beam wer wer_beam
            speaker, utts, _, cer, cer_beam, wer, _ = row
            print(f"                     {speaker:<34} CER {100 * float(cer):5.1f}% (beam {100 * float(cer_beam):5.1f}%), "
                  f"WER {100 * float(wer):5.1f}%, {utts} utterances")


if "asr" in models:
    m = models["asr"]["metrics"]
    phones = "test_per" in m or "dev_per" in m
    if phones:
        print(f"  acoustic model   phones, {trained(models['asr'])}; phone error rate greedy and beam, words through HLG:")
        phone_table(m)
    else:
        print(f"  acoustic model   {trained(models['asr'])}; greedy, beam search and beam search with the word LM:")
        char_table(m)
    decoding(m, Path(models["asr"]["workdir"]) / "model" / "lm")
    speakers(m, models["asr"]["workdir"], phones)
    unheard = [(split, m[f"{split}_oov_rate"], m.get(f"{split}_oov_cer")) for split in ("test", "test_noisy", "test_engine")
               if f"{split}_oov_rate" in m]
    if unheard:  # the words no training sentence has (models/asr/scoring.py oov_figures)
        print("                   words never heard in training: " + "; ".join(
            f"{split} {100 * rate:.1f}% of words" + (f", read at {100 * cer:.1f}% CER" if cer is not None else "")
            for split, rate, cer in unheard))
    print(f"                   {registry(models['asr'])}")
if "tts" in models:
    m = models["tts"]["metrics"]
    fcd = f"{m['test_fbank_cepstral_distance_db']:.2f} dB" if "test_fbank_cepstral_distance_db" in m else "n/a"
    l1 = f"{m['test_mel_l1']:.3f}" if "test_mel_l1" in m else "n/a"
    if "dev_intelligibility_per" in m:  # a phone listener: its PER, and the words through its graph
        print(f"  synthesis model  intelligibility PER {pct(m, 'dev_intelligibility_per')} (dev), "
              f"{pct(m, 'test_intelligibility_per')} (test); WER {pct(m, 'dev_intelligibility_wer')} (dev), "
              f"{pct(m, 'test_intelligibility_wer')} (test); recordings: PER "
              f"{pct(m, 'dev_intelligibility_per_recordings')}, WER {pct(m, 'dev_intelligibility_wer_recordings')} (dev)")
    lead = "                 " if "dev_intelligibility_per" in m else "  synthesis model"
    print(f"{lead}  intelligibility CER {pct(m, 'dev_intelligibility_cer')} in training voices (dev), "
          f"{pct(m, 'test_intelligibility_cer')} for unseen voices (test), the new acoustic model listening; "
          f"{trained(models['tts'])}")
    print(f"                   the same listener on dev: {pct(m, 'dev_intelligibility_cer_teacher_forced')} "
          "teacher-forced (given the recording's frames, or with durations its searched timing), "
          f"{pct(m, 'dev_intelligibility_cer_recordings')} on the recordings themselves")
    print(f"                   filterbank cepstral distance {fcd} (test, free-running), mel L1 {l1} (test, teacher-forced)")
    print(f"                   {registry(models['tts'])}")
text = json.loads(corpus_file.read_text()).get("text") if corpus_file.exists() else None
if text:  # where the sentences came from (pipeline/open_text.py), and what was left out
    left = sum(text["left_out"].values())
    usable = f"{text['sentences']:,} usable sentences, {left:,} left out" if text["sentences"] else "its own sentences"
    print(f"Sentences of the demo corpus: {text['source']} ({usable})")
if heard:  # dev has the voices of train, test_noisy those of test
    print("Voices of the demo corpus (synthetic speech only: the models have never heard a human voice)")
    for split, what in (("train", "heard in training"), ("test", "held out"), ("test_engine", "held out")):
        if split in heard:
            print(f"  {split:<16} {voices(heard[split])}  ({what})")
run_dir = Path(summary_file).parent
print("Artifacts")
print(f"  run directory    {rel(run_dir)}/  (corpus/, shards/, asr/, tts/, summary.json)")
for model, what in (("asr", "hypotheses (eval/test_hypotheses.tsv)"), ("tts", "audio and plots (eval/*.wav, *.png)")):
    if model in models:
        print(f"  {model} model        {rel(models[model]['workdir'])}/  model/, {what}")
print(f"  MLflow store     {s['tracking_uri']}")
print(f"  Airflow log      {rel(log)}")
print("Open the UIs")
print("  make mlflow-ui   then http://127.0.0.1:5000  (the parent run holds one child run per stage)")
print(f"  make airflow-ui  then http://127.0.0.1:8080  (user admin, password in "
      f"{rel(Path(home) / 'simple_auth_manager_passwords.json.generated')}, written at its first start)")
EOF
exit "$status"
