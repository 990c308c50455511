"""The demo as a user meets it: `make demo`'s script (scripts/demo.sh) with the DAG's defaults, timed
from launch to exit, each task's minutes as Airflow recorded them, both trainings' figures and both
models' evaluations, in one JSON (docs/benchmarks.md#the-demo).

    python benchmarks/demo.py [--json out.json] [--conf '{"demo_utterances": 300}'] [--keep DIR]

Airflow, MLflow and the run's files go to a new directory (`--keep DIR` names it and leaves it for
benchmarks/tts_seeds.py), so the user's `.runs/` is left alone. `make setup` is not counted.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import calibrate, report_runs  # noqa: E402
from benchmarks.harness import ROOT, write_json  # noqa: E402

AIRFLOW = ROOT / ".venv-airflow" / "bin" / "airflow"
DAG_ID = "speech_pipeline"
# What the report keeps of a training's train_summary.json (rank 0's, with every rank's shares).
TRAINING_KEYS = (
    "steps",
    "selected_step",
    "measured_seconds",
    "frames_per_s_total",
    "share_compute",
    "share_communication",
    "share_input",
    "input_wait_share_max_10_step_window",
)


def demo_env(work: Path) -> dict[str, str]:
    """scripts/demo.sh's environment with its stores under `work` (the script keeps what is set)."""
    return dict(
        os.environ,
        AIRFLOW_HOME=str(work / "airflow"),
        MLFLOW_TRACKING_URI=f"sqlite:///{work / 'mlflow.db'}",
        SPEECHFLOW_WORK_ROOT=str(work / "pipeline"),
    )


def task_minutes(env: dict[str, str], run_id: str | None = None) -> dict[str, float]:
    """Minutes of each task of the DAG's run `run_id` (default: its latest), from Airflow's record."""
    if run_id is None:
        runs = airflow_json(env, "dags", "list-runs", DAG_ID)
        run_id = max(runs, key=lambda r: r.get("start_date") or "")["run_id"]
    ran = [ti for ti in airflow_json(env, "tasks", "states-for-dag-run", DAG_ID, run_id) if ti.get("end_date")]
    minutes = {}
    for ti in sorted(ran, key=lambda ti: ti["start_date"]):  # in the order they ran
        took = datetime.datetime.fromisoformat(ti["end_date"]) - datetime.datetime.fromisoformat(ti["start_date"])
        minutes[ti["task_id"]] = took.total_seconds() / 60
    return minutes


def airflow_json(env: dict[str, str], *args: str) -> list[dict]:
    """The JSON list an `airflow ... -o json` command prints last (Airflow may log lines before it)."""
    out = subprocess.run([str(AIRFLOW), *args, "-o", "json"], env=env, capture_output=True, text=True, check=True)
    for line in reversed(out.stdout.splitlines()):
        if line.startswith("["):
            return json.loads(line)
    raise ValueError(f"airflow {' '.join(args)} printed no JSON list:\n{out.stdout[-2000:]}")


def collect(run_dir: Path) -> dict:
    """Both models' evaluations (the run's summary.json) and trainings (each train_summary.json)."""
    summary = json.loads((run_dir / "summary.json").read_text())
    results: dict = {"models": sorted(summary["models"])}
    for model, info in summary["models"].items():
        results[model] = info["metrics"]
        trained = json.loads((Path(info["workdir"]) / "train_summary.json").read_text())
        results[f"{model}_training"] = {k: trained[k] for k in TRAINING_KEYS if k in trained}
        results[f"{model}_training"].update({k: v for k, v in trained.items() if k.startswith("profile_")})
    return results


def training_seed(params: dict) -> int:
    """The training seed of a run whose DAG params are `params`: a `seed=N` of `train_overrides`, or 0."""
    for item in params.get("train_overrides") or ():
        key, _, value = str(item).partition("=")
        if key.strip() == "seed":
            return int(value)
    return 0


def estimate_from(previous: Path | None, calibration: dict) -> dict | None:
    """The estimate the measured run in `previous` (a results file with a calibration) makes for the
    machine of `calibration`: {"minutes", "from": its machine and commit}; None without one."""
    if not previous or not previous.is_file():
        return None
    record = json.loads(previous.read_text())
    if not record.get("calibration") or record.get("params") not in (None, {}):
        return None
    predicted = calibrate.estimate(record, calibration)
    return {"minutes": predicted["minutes"], "from": {k: record["meta"].get(k) for k in ("commit", "machine")}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path)
    parser.add_argument("--conf", default="{}", help="the DAG's params as JSON (DEMO_CONF); default: its defaults")
    parser.add_argument("--keep", type=Path, help="directory for Airflow, MLflow and the run (kept)")
    args = parser.parse_args(argv)
    work = args.keep.resolve() if args.keep else Path(tempfile.mkdtemp(prefix="demo-"))
    work.mkdir(parents=True, exist_ok=True)
    # This machine's calibration, taken before the demo and recorded with it (what the demo's estimate
    # on another machine scales by: benchmarks/calibrate.py); the demo's own estimate line uses it too.
    calibration = calibrate.calibrate()
    (work / "calibration.json").write_text(json.dumps(calibration))
    env = dict(demo_env(work), DEMO_CONF=args.conf, DEMO_CALIBRATION=str(work / "calibration.json"))
    started = time.perf_counter()
    proc = subprocess.run(["bash", "scripts/demo.sh"], cwd=ROOT, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - started
    (work / "demo-output.log").write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        print(proc.stdout[-4000:], proc.stderr[-4000:], sep="\n", file=sys.stderr)
        print(f"scripts/demo.sh failed ({proc.returncode}); its output: {work / 'demo-output.log'}", file=sys.stderr)
        return 1
    run_dir = max((work / "pipeline").glob("*/summary.json"), key=lambda p: p.stat().st_mtime).parent  # this run's
    results = {"params": json.loads(args.conf), "demo_wall_s": wall, "task_minutes": task_minutes(env)}
    results["calibration"] = calibration
    estimated = None if results["params"] else estimate_from(args.json, calibration)
    if estimated:  # what the measured run before this one predicted for this machine
        results["estimated_minutes"] = estimated
    results.update(collect(run_dir))
    print(proc.stdout[proc.stdout.rfind("speech_pipeline succeeded") :])
    record = write_json(args.json, results, {"demo_corpus": 0, "training": training_seed(results["params"])})
    print("\n".join(report_runs.demo(record)))
    print(f"run directory: {run_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
