"""How fast this machine runs the demo's work, measured in seconds, and the demo's time predicted from it.

    python benchmarks/calibrate.py [--json out.json] [--tiny]            # measure, print, write
    python benchmarks/calibrate.py --estimate benchmarks/results/demo.json  # "about N minutes on this machine"

The measure: each demo model trains a few steps with its demo config (`models.train`, the real
trainer) on synthetic shards of the demo's utterance lengths; both models at once, each with half of
the cores, as the demo's two Horovod ranks share the machine. Each model's seconds per step are
counted after its first steps (`warmup_exclude`): the first trace of a step is compile time, not
training, and the demo pays it once in a run of a thousand steps. Beside them, one core's speed at
plain Python and NumPy work (`probe_s`), the kind of work of the stages around the trainings
(corpus, features, shards, decoding, Airflow's own tasks).

The estimate scales a measured run's task minutes (benchmarks/demo.py writes them, with a
calibration taken on its machine just before): each `train_MODEL` task by the ratio of that model's
step seconds here and there, every other task by the ratio of the probes. A measured run without a
calibration of its own is scaled by the trainings' ratio alone, and the line says so.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import report_runs  # noqa: E402
from benchmarks.harness import NO_COPIES, PYTHON, ROOT, machine, synthetic_shards, write_json  # noqa: E402

CONFIGS = {"asr": ROOT / "configs/demo_asr.yaml", "tts": ROOT / "configs/demo_tts.yaml"}
TINY_CONFIGS = {"asr": ROOT / "tests/configs/tiny_asr.yaml", "tts": ROOT / "tests/configs/tiny_tts.yaml"}
# Steps per model, and the first ones left out (the trace, the first batches). The calibration's
# time is mostly fixed: TensorFlow's import, the MLflow store and the first trace (about 8 s of the
# synthesis model's on one core of the AVX2-only EPYC); 9 measured steps are about 2 s of it.
STEPS, WARMUP = 12, 3
# The recipe a measured run's time belongs to: its configs, its DAG and the code its tasks run.
RECIPE = ("configs", "dags", "workflow", "models", "pipeline", "common")


def training_items(model: str, steps: int, warmup: int, threads: int) -> list[str]:
    """`--set` items of a calibration run: `steps` steps, no evaluation, checkpoint or model logging,
    `threads` intra-op threads (a rank's share of the cores, as under horovodrun -np 2)."""
    items = [
        f"max_steps={steps}",
        f"warmup_exclude={warmup}",
        "epochs=1000",
        "eval_every=0",
        "checkpoint_every=100000",
        "log_every=100000",
        "log_model=false",
        f"intra_op_threads={threads}",
    ]
    # No speed-perturbed copies to train on (synthetic shards have none), and characters for CTC (they
    # hold no phone targets: the step costs the same but for the output layer's width, 134 phones
    # against 30 characters, a few percent of the LSTMs'); no duration refit after training.
    asr = [NO_COPIES, "asr.targets=chars"]
    return items + (asr if model == "asr" else ["tts.duration_refit_epochs=0"])


def time_trainings(shards: Path, work: Path, configs: dict[str, Path], steps: int, warmup: int) -> dict[str, float]:
    """Seconds per training step of each model of `configs`, all trained at once (one process each)."""
    from workflow import commands

    threads = max(1, (os.cpu_count() or 2) // len(configs))
    procs = {}
    for model, config in configs.items():
        args = commands.train_args(
            shards, work / model, config=config, sets=training_items(model, steps, warmup, threads)
        )
        # A store of its own: two processes making one new SQLite store race on its migrations.
        store = f"sqlite:///{work}/{model}.db"
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=str(ROOT), MLFLOW_TRACKING_URI=store)
        log = open(work / f"{model}.log", "w")  # noqa: SIM115 (closed when the process has ended)
        command = commands.module_command(PYTHON, commands.TRAIN, args)
        procs[model] = (subprocess.Popen(command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT), log)
    step_s = {}
    for model, (proc, log) in procs.items():
        summary = work / model / "train_summary.json"
        # The summary is written (atomically) before the run's plots and MLflow artifacts, which a
        # calibration does not need: about 2 s of each process's end, so it is stopped there.
        while proc.poll() is None and not summary.exists():
            time.sleep(0.1)
        if proc.poll() is None:
            proc.terminate()
        proc.wait()
        log.close()
        if not summary.exists():
            tail = (work / f"{model}.log").read_text(errors="replace")[-3000:]
            raise RuntimeError(f"the {model} calibration run failed ({proc.returncode}); {work / model}.log:\n{tail}")
        step_s[model] = 1 / json.loads(summary.read_text())["steps_per_s"]
    return step_s


def probe_s(repeats: int = 5) -> float:
    """Seconds of a fixed piece of one-core Python and NumPy work: the best of `repeats` of each part,
    added (the best, as other processes only ever slow a part down)."""
    import numpy as np

    def python_part() -> None:  # dictionary and string work, as text normalization and decoding do
        words: dict[str, int] = {}
        for i in range(400_000):
            key = f"w{i % 5000}"
            words[key] = words.get(key, 0) + i % 7

    frames = np.random.default_rng(0).normal(size=(2000, 400)).astype(np.float32)

    def numpy_part() -> None:  # small FFTs and element-wise maths on one core, as feature extraction does
        for _ in range(8):
            np.log1p(np.abs(np.fft.rfft(frames, axis=1))).sum(axis=1)

    total = 0.0
    for part in (python_part, numpy_part):
        best = math.inf
        for _ in range(repeats):
            start = time.perf_counter()
            part()
            best = min(best, time.perf_counter() - start)
        total += best
    return total


def calibrate(tiny: bool = False) -> dict:
    """This machine's calibration: {"asr_step_s", "tts_step_s", "probe_s", "seconds", "machine"}."""
    started = time.perf_counter()
    work = Path(tempfile.mkdtemp(prefix="calibrate-"))
    if tiny:
        shards = synthetic_shards(work, 24, mean_frames=60, dim=13, num_shards=2)
        configs, steps, warmup = TINY_CONFIGS, 4, 2
    else:  # the demo's utterance lengths: about 240 frames on average
        shards = synthetic_shards(work, 64, mean_frames=240, dim=80, num_shards=2)
        configs, steps, warmup = CONFIGS, STEPS, WARMUP
    step_s = time_trainings(shards, work, configs, steps, warmup)
    result = {f"{model}_step_s": s for model, s in step_s.items()}
    result.update(probe_s=probe_s(), steps=steps, warmup_steps=warmup, seconds=time.perf_counter() - started)
    shutil.rmtree(work)  # only when it worked: a failed run's error names its log there
    return {**result, "machine": machine()}


def recipe(root: Path = ROOT) -> str:
    """A fingerprint of what decides the demo's work: the configs, the DAG and the code its tasks run
    (RECIPE's directories, their .py and .yaml files); a last run's time is reused only under the same one."""
    import hashlib

    digest = hashlib.sha256()
    for top in RECIPE:
        for path in sorted(p for p in (root / top).rglob("*") if p.suffix in (".py", ".yaml") and p.is_file()):
            digest.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def estimate(record: dict, here: dict) -> dict:
    """The demo's minutes on the machine of calibration `here`, from the measured run `record`
    (benchmarks/demo.py's JSON): {"minutes", "tasks": {task: minutes}, "ratios", "calibrated"}.

    Each `train_MODEL` task is scaled by that model's step ratio, the other tasks and the time
    between them (the run's wall time less its tasks') by the probe ratio. `calibrated` is False for
    a record without a calibration of its own: its minutes are then given as they are."""
    there = record.get("calibration")
    tasks = record["task_minutes"]
    between = record["demo_wall_s"] / 60 - sum(tasks.values())
    if not there:
        return {"minutes": record["demo_wall_s"] / 60, "tasks": dict(tasks), "ratios": {}, "calibrated": False}
    ratios = {key: here[key] / there[key] for key in there if key.endswith("_step_s") or key == "probe_s"}
    scaled = {}
    for task, minutes in tasks.items():
        model = task.removeprefix("train_")
        scaled[task] = (
            minutes * ratios.get(f"{model}_step_s", ratios["probe_s"])
            if task.startswith("train_")
            else (minutes * ratios["probe_s"])
        )
    total = sum(scaled.values()) + max(0.0, between) * ratios["probe_s"]
    return {"minutes": total, "tasks": scaled, "ratios": ratios, "calibrated": True}


def estimate_line(record: dict, here: dict | None, source: str) -> str:
    """What the demo says before it starts (scripts/demo.sh)."""
    there = record.get("meta", {}).get("machine", {})
    measured = (
        f"{record['demo_wall_s'] / 60:.0f} minutes on a {there.get('cores', '?')}-core {there.get('cpu_model', 'CPU')}"
    )
    if here is None or not record.get("calibration"):
        return f"this takes about {round(record['demo_wall_s'] / 60)} minutes ({source}: {measured}; not calibrated)"
    predicted = estimate(record, here)
    return (
        f"this takes about {max(1, round(predicted['minutes']))} minutes on this machine (calibrated in "
        f"{here['seconds']:.0f} s; {source}: {measured})"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, help="write this machine's calibration here")
    parser.add_argument("--tiny", action="store_true", help="tiny models and data (for tests)")
    parser.add_argument("--estimate", type=Path, help="a measured run (benchmarks/demo.py's JSON): print the estimate")
    parser.add_argument("--calibration", type=Path, help="a calibration of this machine to use instead of measuring")
    args = parser.parse_args(argv)
    here = json.loads(args.calibration.read_text()) if args.calibration else calibrate(args.tiny)
    print("\n".join(report_runs.calibration(here)))
    write_json(args.json, here, {"synthetic_shards": 0, "training": 0})
    if args.estimate:
        record = json.loads(args.estimate.read_text())
        print(
            estimate_line(
                record,
                here,
                str(args.estimate.relative_to(ROOT) if args.estimate.is_relative_to(ROOT) else args.estimate),
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
