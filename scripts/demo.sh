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

.venv/bin/python scripts/demo_summary.py "$summary" "$elapsed" "$status" "$ROOT" "$LOG"
exit "$status"
