"""What a training run reports to MLflow: rank 0's run shared with every rank, its params at the
start, and at its end every rank's figures gathered and the final record: functions of the set-up
(models/training/setup.py) and of the values they report."""

from __future__ import annotations

import json
import resource
import time

from common import catalog
from common import config as configlib
from models.tracking import runs as tracking


def shared_run_id(setup, rank: int, run_id: str | None) -> str:
    """Rank 0's MLflow run id on every rank. Horovod: a broadcast; in an elastic job (which a
    worker may join at any time, when no other rank would join a broadcast) from the run file."""
    if not setup.config.elastic:
        return setup.hvd.broadcast_object(run_id, root_rank=0)
    deadline = time.monotonic() + 300
    while run_id is None:
        run_id = (tracking.load_run_file(setup.workdir) or {}).get("run_id")
        if run_id is None:
            if time.monotonic() > deadline:
                raise RuntimeError(f"rank {rank}: rank 0 wrote no {tracking.RUN_FILE} in {setup.workdir}")
            time.sleep(0.5)
    return run_id


def log_params(setup, plan) -> None:
    """Logs the new run's params (the resolved config of this model, the world size, the steps,
    the shards, the threads and the library versions) and the shards as its input dataset."""
    c = setup.config
    params = configlib.flatten(configlib.to_dict(c))  # the chosen model's section and strategy's options
    params.update(
        world_size=plan.size,
        steps_per_epoch=plan.steps_per_epoch,
        total_steps=plan.total_steps,
        shards=str(setup.shards.root.resolve()),
        **{f"threads.{k}": v for k, v in setup.threads.items()},
        **tracking.versions(),
    )
    tracking.log_params(params)
    tracking.log_shards_input(setup.shards)


def log_step(setup, progress, log, step: int, record: dict) -> dict:
    """Rank 0's metrics record of step `step` (`record`: loss, learning rate, epoch, the task's
    metrics), completed by the step times since the last record, the strategy's figures and the
    profile, to MLflow through `log`; returns the completed record (a line of the run's history)."""
    record = {**record, **progress.times.flush_window(), **setup.strategy.metrics()}
    if progress.profiles:
        record.update(progress.profile_ms())
    log.log_metrics({k: float(v) for k, v in record.items()}, step=step)
    return {"step": step, **record}


def gather(setup, summary: dict) -> dict:
    """Every rank's throughput, peak memory and bound cores (a collective: all ranks call it once,
    at the end)."""
    mine = {
        "frames_per_s": summary.get("frames_per_s", 0.0),
        "cores": setup.threads["cores"],  # common/runtime.py; empty: not bound
        "peak_memory_mb": _peak_memory_mb(setup.tf),
        "steps": summary["steps"],
        "trained": {k: summary[f"trained_{k}"] for k in ("batches", "utterances", "frames")},
        "weights_digest": _weights_digest(setup.model),
        "rounds_before_merge": summary.get("gossip_rounds_before_merge"),  # delay-by-one only
    }
    # Horovod: collect one small record per rank on every rank.
    everyone = setup.hvd.allgather_object(mine)
    return {
        "frames_per_s_total": sum(r["frames_per_s"] for r in everyone),
        "per_rank_frames_per_s": [r["frames_per_s"] for r in everyone],
        "per_rank_steps": [r["steps"] for r in everyone],
        "per_rank_trained": [r["trained"] for r in everyone],
        "per_rank_peak_memory_mb": [r["peak_memory_mb"] for r in everyone],
        "per_rank_cores": [r["cores"] for r in everyone],
        "per_rank_weights_digest": [r["weights_digest"] for r in everyone],
        "ranks_agree": len({r["weights_digest"] for r in everyone}) == 1,
        **(
            {"per_rank_gossip_rounds_before_merge": [r["rounds_before_merge"] for r in everyone]}
            if mine["rounds_before_merge"] is not None
            else {}
        ),
    }


def _peak_memory_mb(tf) -> float:
    """This process's peak memory: the GPU allocator's peak when on a GPU, else the resident set."""
    if tf.config.list_logical_devices("GPU"):
        return tf.config.experimental.get_memory_info("GPU:0")["peak"] / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _weights_digest(model) -> str:
    """A hash of this rank's trainable weights: equal on every rank when they hold the same model."""
    import hashlib

    digest = hashlib.sha256()
    for variable in model.trainable_variables:
        digest.update(variable.numpy().tobytes())
    return digest.hexdigest()[:16]


def log_final(setup, mlflow, summary: dict) -> None:
    from models.training import plots

    scalars = {k: v for k, v in summary.items() if isinstance(v, (int, float)) and k not in ("rank",)}
    mlflow.log_metrics({f"final_{k}": float(v) for k, v in scalars.items()})
    if "consensus_distance_before_final_average" in summary:
        # The last point of the consensus-distance curve: the gossip thread measures every
        # `consensus_every` rounds and may lag the last metrics record, so the curve always
        # ends with the distance measured just before the final average.
        mlflow.log_metric(
            "consensus_distance",
            float(summary["consensus_distance_before_final_average"]),
            step=int(summary["steps"]),
        )
    for rank, (fps, mem) in enumerate(zip(summary["per_rank_frames_per_s"], summary["per_rank_peak_memory_mb"])):
        mlflow.log_metrics({f"rank{rank}_frames_per_s": fps, f"rank{rank}_peak_memory_mb": mem})
    plot_dir = setup.workdir / "plots"
    plot_dir.mkdir(exist_ok=True)
    for path in plots.training_plots(summary["history"], summary, plot_dir):
        mlflow.log_artifact(str(path), artifact_path="plots")
    mlflow.log_artifact(str(setup.workdir / "config.yaml"))
    if not setup.config.log_model:
        return
    catalog.resolve(catalog.PYFUNC_LOGGER)(
        setup.workdir / "model",
        setup.config,
        json.loads((setup.workdir / "model" / "data.json").read_text()),
    )
