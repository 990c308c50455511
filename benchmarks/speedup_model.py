"""The research's ring-parallel speedup model, fed with times measured here, against measurement.

    python benchmarks/speedup_model.py [--json out.json] [--tiny] [--shards DIR]

Measures, for the acoustic model:
- Tcalc: one training step's computation on one worker (np=1, one intra-op thread: a worker's
  share of this machine when two ranks run, so np=1 and np=2 are comparable);
- Ttransmit: one exchange of the whole model between two ranks (a 2-rank Horovod allreduce of the
  flat weight vector, under horovodrun);
- Tmerge: one averaging (w <- w + (average - snapshot) over the flat weight vector, numpy).
Then applies Speedup = n (Tcalc + Tmerge) / (Tcalc + Tmerge + Twait), with
Twait = max(n Ttransmit + (n - 1) Tmerge - Tcalc, 0) for the ring (allreduce) and the gossip form
of benchmarks/speedup_theory.py, compares the prediction at n = 1 and 2 with the measured throughput
ratio, plots both predicted curves to n = 128 and logs the plot and numbers to MLflow.

Then the same model for a GPU cluster: Tcalc from the GPU calibration (benchmarks/data/gpu_calibration.json,
PyTorch on an H100, copied with its provenance), Ttransmit the model's float32 weights over an assumed
link and Tmerge three passes over them at the GPU's memory bandwidth (`GPU_ASSUMPTIONS`), predicted at 8,
32 and 128 workers beside the speedups the research reported for AD-PSGD (`REPORTED`).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import report_speed  # noqa: E402
from benchmarks.harness import (  # noqa: E402
    HOROVODRUN,
    PYTHON,
    ROOT,
    SHORT_RUN_SEEDS,
    asr_setup,
    run_training,
    write_json,
)

WORKERS = (8, 32, 128)  # the cluster sizes predicted
CALIBRATION = Path(__file__).resolve().parent / "data" / "gpu_calibration.json"
# The research's AD-PSGD on Switchboard-2000, time to accuracy: a week (168 h) on one GPU, 11.5 h on 32
# GPUs, under 2 h on 128 (so at least 84x).
REPORTED = {32: 168 / 11.5, 128: 168 / 2}
# What the GPU projection assumes beyond the calibration: each GPU's own 200 Gb/s link (InfiniBand HDR,
# one adapter a GPU, as GPU nodes are built), its latency left out; an H100 SXM's memory bandwidth
# (NVIDIA's data sheet) for the merge; float32 weights and gradients.
GPU_ASSUMPTIONS = {"link_bytes_per_s": 25e9, "hbm_bytes_per_s": 3.35e12, "bytes_per_weight": 4}

PROBE = """
import sys, time, numpy as np, tensorflow as tf, horovod.tensorflow as hvd
from common.runtime import configure_tensorflow
configure_tensorflow(); hvd.init()
x = tf.constant(np.random.default_rng(hvd.rank()).normal(size=int(sys.argv[1])).astype(np.float32))
for _ in range(3): hvd.allreduce(x, op=hvd.Average, name="warm").numpy()
times = []
for i in range(int(sys.argv[2])):
    start = time.perf_counter()
    hvd.allreduce(x, op=hvd.Average, name="probe").numpy()
    times.append(time.perf_counter() - start)
if hvd.rank() == 0: print("TTRANSMIT", float(np.median(times)), flush=True)
"""


def measure_transmit(parameters: int, repeats: int) -> float:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=str(ROOT))
    proc = subprocess.run(
        [HOROVODRUN, "-np", "2", "-H", "localhost:2", "--gloo", PYTHON, "-c", PROBE, str(parameters), str(repeats)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    line = next(line for line in proc.stdout.splitlines() if "TTRANSMIT" in line)
    return float(line.split()[-1])


def measure_merge(parameters: int, repeats: int) -> float:
    rng = np.random.default_rng(0)
    w, average, snapshot = (rng.normal(size=parameters).astype(np.float32) for _ in range(3))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        w += average - snapshot
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def gpu_projection(parameters: int) -> dict:
    """The speedup model for a GPU cluster: Tcalc from the calibration's smallest step of the demo model
    (its 4000-frame batches are smaller still, and at these sizes the LSTM is latency-bound: 1% of the
    GPU's peak), Ttransmit and Tmerge from `GPU_ASSUMPTIONS`; predicted speedups at `WORKERS`."""
    from benchmarks import speedup_theory

    calibration = json.loads(CALIBRATION.read_text())
    demo = [s for s in calibration["asr_steps"] if s["model"].startswith("demo") and s["precision"] == "fp32"]
    step = min(demo, key=lambda s: s["batch"] * s["frames"])
    size = parameters * GPU_ASSUMPTIONS["bytes_per_weight"]
    times = {
        "tcalc": step["step_ms"] / 1000,
        "ttransmit": size / GPU_ASSUMPTIONS["link_bytes_per_s"],
        "tmerge": 3 * size / GPU_ASSUMPTIONS["hbm_bytes_per_s"],
    }
    out = {f"{k}_s": v for k, v in times.items()}
    out["step"] = f"{step['batch']} x {step['frames']} frames, {step['precision']}: {step['step_ms']} ms"
    out["provenance"] = calibration["provenance"]
    out["assumptions"] = GPU_ASSUMPTIONS
    for strategy, predict in (
        ("allreduce", speedup_theory.speedup_allreduce),
        ("adpsgd", speedup_theory.speedup_gossip),
    ):
        for n in WORKERS:
            out[f"{strategy}_predicted_speedup_n{n}"] = predict(n, *times.values())
    out["reported_speedup"] = {str(n): v for n, v in REPORTED.items()}
    return out


def job_rate(summary: dict) -> float:
    """Frames trained by all ranks over the job's wall-clock from launch to exit."""
    return sum(r["frames"] for r in summary["per_rank_trained"]) / summary["job_wall_s"]


def measure(args) -> tuple[dict, dict, dict, Path]:
    """The model's size and one step's Tcalc, Ttransmit and Tmerge (results), the single-process run's
    summary, the two-rank runs' summaries by strategy, and the directory they ran in."""
    from common import config as configlib
    from models.asr import network as asr
    from models.asr.task import resolve_asr
    from models.training.config import TrainConfig
    from pipeline.records import open_shard_set

    work, config, shards, common = asr_setup(args, "speedup_model-", tiny_steps=8)
    common.append("intra_op_threads=1")
    model_cfg = resolve_asr(configlib.load(TrainConfig, config).settings, open_shard_set(shards))
    parameters = int(sum(np.prod(v.shape) for v in asr.build_asr(model_cfg).trainable_variables))
    one = run_training(shards, work / "np1", 1, config, common)
    # Tiny (the tests): the gossip run only; allreduce's np=2 run goes through the same lines.
    measured_strategies = ("adpsgd",) if args.tiny else ("allreduce", "adpsgd")
    two = {
        s: run_training(shards, work / f"np2-{s}", 2, config, common, extra_args=["--strategy", s])
        for s in measured_strategies
    }
    results = {
        "tiny": args.tiny,
        "parameters": parameters,
        "tcalc_s": one["time_compute_ms"] / 1000,
        "ttransmit_s": measure_transmit(parameters, 5 if args.tiny else 20),
        "tmerge_s": measure_merge(parameters, 20),
    }
    return results, one, two, work


def predict(results: dict, one: dict, two: dict) -> None:
    """Each strategy's predicted speedups, and the measured ones where it ran on two ranks."""
    from benchmarks import speedup_theory as speedup_model

    times = (results["tcalc_s"], results["ttransmit_s"], results["tmerge_s"])
    for strategy, model in (("allreduce", speedup_model.speedup_allreduce), ("adpsgd", speedup_model.speedup_gossip)):
        for n in (1, 2, *WORKERS):
            results[f"{strategy}_predicted_speedup_n{n}"] = model(n, *times)
        if strategy in two:
            results[f"{strategy}_measured_speedup_n2"] = two[strategy]["frames_per_s_total"] / one["frames_per_s_total"]
            # What a user waits for: the whole job, start-up of the processes included.
            results[f"{strategy}_job_speedup_n2"] = job_rate(two[strategy]) / job_rate(one)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path)
    parser.add_argument("--tiny", action="store_true")
    parser.add_argument("--shards", type=Path)
    parser.add_argument("--steps", type=int, default=40)
    args = parser.parse_args(argv)
    from benchmarks import speedup_theory as speedup_model

    results, one, two, work = measure(args)
    predict(results, one, two)
    results["gpu"] = gpu_projection(results["parameters"])
    times = (results["tcalc_s"], results["ttransmit_s"], results["tmerge_s"])
    plot = speedup_model.plot_speedup(*times, work / "speedup_model.png")
    results["plot"] = plot.name  # logged to MLflow with the numbers
    results["mlflow_run_id"] = log_to_mlflow(results, plot)
    record = write_json(args.json, results, seeds=SHORT_RUN_SEEDS)
    print("\n".join(report_speed.speedup_model(record)))
    return 0


def log_to_mlflow(results: dict, plot: Path) -> str:
    import mlflow

    from models.tracking import runs as tracking

    with tracking.start_run(
        "speechflow-benchmarks", "speedup-model", tags={"speechflow.benchmark": "speedup_model"}
    ) as run:
        mlflow.log_metrics(
            {k: float(v) for k, v in results.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        )
        mlflow.log_artifact(str(plot), artifact_path="plots")
        return run.info.run_id


if __name__ == "__main__":
    sys.exit(main())
