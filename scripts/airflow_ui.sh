#!/usr/bin/env bash
# make airflow-ui: Airflow's UI, API server, scheduler, DAG processor and triggerer (`airflow standalone`)
# on http://127.0.0.1:8080, with this repository's DAGs, SQLite, and the MLflow store `make mlflow-ui`
# shows. Trigger `speech_pipeline` from its form (the Trigger button). Ctrl-C stops everything.
#
# Log in as `admin`; the password is in $AIRFLOW_HOME/simple_auth_manager_passwords.json.generated
# (AIRFLOW_HOME is .runs/airflow unless set). Environment knobs: AIRFLOW_PORT (8080),
# AIRFLOW__CORE__PARALLELISM (2: concurrent tasks), MLFLOW_TRACKING_URI, SPEECHFLOW_WORK_ROOT.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
RUNS=$ROOT/.runs
PORT=${AIRFLOW_PORT:-8080}

[ -x .venv-airflow/bin/airflow ] || { echo "no .venv-airflow: run 'make setup' first" >&2; exit 1; }
[ -x .venv/bin/python ] || {
  echo "no .venv (the training environment the tasks run): run 'make setup' first" >&2
  exit 1
}

export AIRFLOW_HOME=${AIRFLOW_HOME:-$RUNS/airflow}
export MLFLOW_TRACKING_URI=${MLFLOW_TRACKING_URI:-sqlite:///$RUNS/mlflow.db}
export SPEECHFLOW_WORK_ROOT=${SPEECHFLOW_WORK_ROOT:-$RUNS/pipeline}
export AIRFLOW__CORE__DAGS_FOLDER=$ROOT/dags
export AIRFLOW__CORE__LOAD_EXAMPLES=${AIRFLOW__CORE__LOAD_EXAMPLES:-False}
# standalone runs 32 task processes at once unless told otherwise; training alone keeps every core busy.
export AIRFLOW__CORE__PARALLELISM=${AIRFLOW__CORE__PARALLELISM:-2}
# The DAG processor re-parses an unchanged DAG file every 30 s by default, each time importing it and writing
# the serialized DAG, on the cores a triggered run's tasks are using. An edit to dags/ is still picked up at
# once (a file newer than its last parse goes first); only edits to the modules it imports wait this long.
export AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL=${AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL:-300}
# A task's supervisor waits on its task process in a select() whose timeout is the heartbeat interval, and
# when the task's sockets close before it has exited, it sees the exit only when that times out: every task
# holds its executor slot, and a skipped one holds up its downstream tasks, up to that long (5 s by default).
# Heartbeating every second costs the API server a request a second per running task.
export AIRFLOW__WORKERS__MIN_HEARTBEAT_INTERVAL=${AIRFLOW__WORKERS__MIN_HEARTBEAT_INTERVAL:-1}
# A task's supervisor tells the execution API that the task started, and gives each try of that call this long.
# On two cores that training keeps busy, the API server's answer can take longer than the default 5 s on every
# try; when the tries run out, the supervisor kills the task before it has run (CI saw this at the first task).
export AIRFLOW__WORKERS__EXECUTION_API_TIMEOUT=${AIRFLOW__WORKERS__EXECUTION_API_TIMEOUT:-60}
# Only this machine can reach it; tasks reach the execution API at the same address.
export AIRFLOW__API__HOST=127.0.0.1
export AIRFLOW__API__PORT=$PORT
export AIRFLOW__API__BASE_URL=http://127.0.0.1:$PORT
# The DAG's cluster mode renders pods with workflow.pods and workflow.training_job, which need no
# installation from here.
export PYTHONPATH=$ROOT${PYTHONPATH:+:$PYTHONPATH}
# standalone starts its parts as `airflow ...` from PATH.
export PATH=$ROOT/.venv-airflow/bin:$PATH
mkdir -p "$AIRFLOW_HOME" "$SPEECHFLOW_WORK_ROOT"

cat <<EOF
Airflow:  http://127.0.0.1:$PORT  (user admin, password in $AIRFLOW_HOME/simple_auth_manager_passwords.json.generated)
MLflow:   make mlflow-ui, then http://127.0.0.1:5000  (store $MLFLOW_TRACKING_URI)
Runs:     $SPEECHFLOW_WORK_ROOT
EOF
exec airflow standalone
