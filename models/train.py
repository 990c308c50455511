"""The trainer: `python -m models.train`, alone or under `horovodrun -np N`.

    horovodrun -np 2 -H localhost:2 --gloo python -m models.train --model asr --strategy allreduce \
        --shards shards/ --workdir runs/asr [--epochs 10] [--max-steps 500] [--config c.yaml] [--set k=v]

Rank 0 writes checkpoints, logs to MLflow and shows the progress bar; every rank trains. A re-run
with the same workdir resumes from the latest checkpoint (weights, optimizer state, step and data
position) and refuses a workdir whose saved configuration has another architecture.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import resource
import sys
from pathlib import Path

from models import asr as asr_model
from models import tts as tts_model
from models.strategies import StrategyConfig
from pipeline import config as configlib
from pipeline.dataset import InputConfig


@dataclasses.dataclass(frozen=True)
class OptimConfig:
    learning_rate: float = 1e-3  # per worker; allreduce scales it by the number of workers
    scale_with_workers: bool = True  # allreduce: peak rate = learning_rate x workers (Goyal et al. 2017)
    warmup_steps: int = 100  # linear ramp from learning_rate to the peak (large-batch recipe)
    decay: str = "cosine"  # after warm-up: "cosine" to final_fraction of the peak at the last step, or "none"
    final_fraction: float = 0.1  # where the cosine decay ends
    clip_norm: float = 5.0  # global gradient-norm clipping (LSTMs and CTC spike without it)


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    model: str = "asr"  # "asr" (acoustic model) or "tts" (synthesis)
    asr: asr_model.AsrConfig = asr_model.AsrConfig()  # used when model == "asr"
    tts: tts_model.TtsConfig = tts_model.TtsConfig()  # used when model == "tts"
    input: InputConfig = InputConfig()  # batching, normalization, shuffling
    optim: OptimConfig = OptimConfig()  # optimizer and learning-rate schedule
    strategy: StrategyConfig = StrategyConfig()  # how the workers combine
    epochs: int = 20  # passes over the training split (training stops at epochs or max_steps)
    max_steps: int = 0  # 0: no step limit
    checkpoint_every: int = 200  # steps between checkpoints (and one at the end)
    log_every: int = 10  # steps between metric logs
    profile_every: int = 50  # tts: steps between per-module timings (0: never)
    warmup_exclude: int = 5  # first steps left out of throughput figures (compilation, caches)
    precision: str = "float32"  # "float32" or "mixed_bfloat16"
    seed: int = 0  # weight initialization and data order, the same on every rank
    intra_op_threads: int = 0  # 0: this rank's share of the host's cores
    inter_op_threads: int = 0  # 0: 1
    experiment: str = "speechflow"  # MLflow experiment
    log_model: bool = True  # log the final model to MLflow (benchmarks turn it off)
    fail_at_step: int = 0  # tests: raise at this step on rank fail_rank (0: never)
    fail_rank: int = 0  # tests: the rank that raises

    def __post_init__(self):
        if self.model not in ("asr", "tts"):
            raise ValueError(f"model must be 'asr' or 'tts', got {self.model!r}")
        if self.precision not in ("float32", "mixed_bfloat16"):
            raise ValueError(f"precision must be 'float32' or 'mixed_bfloat16', got {self.precision!r}")


def learning_rate(step: int, cfg: OptimConfig, workers: int, total_steps: int) -> float:
    """The rate for `step` (1-based): warm-up from the base rate to the peak, then optional cosine decay."""
    import math

    peak = cfg.learning_rate * (workers if cfg.scale_with_workers else 1)
    if step <= cfg.warmup_steps:
        return cfg.learning_rate + (peak - cfg.learning_rate) * step / max(1, cfg.warmup_steps)
    if cfg.decay == "none" or total_steps <= cfg.warmup_steps:
        return peak
    progress = min(1.0, (step - cfg.warmup_steps) / max(1, total_steps - cfg.warmup_steps))
    return peak * (cfg.final_fraction + (1 - cfg.final_fraction) * 0.5 * (1 + math.cos(math.pi * progress)))


def architecture(config: TrainConfig) -> dict:
    """The part of a config that fixes the shapes of the weights."""
    return {"model": config.model, config.model: configlib.to_dict(getattr(config, config.model))}


def check_workdir(workdir: Path, config: TrainConfig) -> None:
    """Refuses to resume a workdir trained with another architecture, naming what differs."""
    saved_path = Path(workdir) / "config.yaml"
    if not saved_path.is_file():
        return
    saved = configlib.load(TrainConfig, saved_path)
    old, new = configlib.flatten(architecture(saved)), configlib.flatten(architecture(config))
    diff = {k: (old.get(k), new.get(k)) for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k)}
    if diff:
        details = ", ".join(f"{k}: {a} -> {b}" for k, (a, b) in list(diff.items())[:6])
        raise ValueError(f"{workdir} holds a model with another architecture ({details}); use a new --workdir")


def train_and_evaluate(
    config: TrainConfig, shards: Path, workdir: Path, parent_run_id: str | None = None, run_name: str | None = None
) -> dict:
    """Trains on `shards` into `workdir` (resuming if it holds a checkpoint). Returns a summary dict."""
    from models.loop import Trainer

    return Trainer(config, Path(shards), Path(workdir), parent_run_id, run_name).run()


def build_config(args: argparse.Namespace) -> TrainConfig:
    config = configlib.load(TrainConfig, args.config, args.set)
    strategy = config.strategy
    flags = {
        "name": args.strategy,
        "gossip": args.gossip,
        "gossip_compression": args.gossip_compression,
        "compression": args.compression,
        "straggler_rank": args.straggler_rank,
        "straggler_delay_ms": args.straggler_delay_ms,
    }
    strategy = dataclasses.replace(strategy, **{k: v for k, v in flags.items() if v is not None})
    if args.hierarchical:
        strategy = dataclasses.replace(strategy, hierarchical=True)
    top = {"model": args.model, "epochs": args.epochs, "max_steps": args.max_steps, "experiment": args.experiment}
    return dataclasses.replace(config, strategy=strategy, **{k: v for k, v in top.items() if v is not None})


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", choices=["asr", "tts"], help="which model to train (default asr)")
    p.add_argument("--strategy", choices=["allreduce", "adpsgd"], help="how workers combine (default allreduce)")
    p.add_argument("--shards", required=True, type=Path, help="directory with manifest.json and the TFRecord shards")
    p.add_argument("--workdir", required=True, type=Path, help="checkpoints, config and the final model go here")
    p.add_argument("--epochs", type=int, help="passes over the training split")
    p.add_argument("--max-steps", type=int, help="stop after this many steps (0: no limit)")
    p.add_argument("--config", type=Path, help="YAML file with TrainConfig fields")
    p.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="override a field, e.g. asr.units=256"
    )
    p.add_argument("--compression", choices=["none", "fp16"], help="allreduce: gradient compression")
    p.add_argument("--gossip", choices=["fixed-ring", "random-ring", "delay-by-one"], help="adpsgd: gossip variant")
    # horovodrun's own parser takes `--hierarchical` anywhere on its command line as an abbreviation
    # of its --hierarchical-allreduce/-allgather and stops; under horovodrun, use --hierarchical-gossip.
    p.add_argument(
        "--hierarchical",
        "--hierarchical-gossip",
        dest="hierarchical",
        action="store_true",
        help="adpsgd: average within each host first, one rank per host gossips (H-ADPSGD); "
        "spell it --hierarchical-gossip under horovodrun",
    )
    p.add_argument("--gossip-compression", choices=["none", "fp16"], help="adpsgd: exchange weights as fp16")
    p.add_argument("--straggler-rank", type=int, help="benchmarks: slow down this rank")
    p.add_argument("--straggler-delay-ms", type=float, help="benchmarks: milliseconds added to each of its steps")
    p.add_argument("--experiment", help="MLflow experiment name (default speechflow)")
    p.add_argument("--mlflow-parent-run-id", help="nest the training run under this MLflow run (the DAG's)")
    p.add_argument("--run-name", help="MLflow run name")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        config = build_config(args)
        summary = train_and_evaluate(config, args.shards, args.workdir, args.mlflow_parent_run_id, args.run_name)
    except (ValueError, FileNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    if summary.get("rank", 0) == 0:
        print(json.dumps({k: v for k, v in summary.items() if not isinstance(v, (list, dict))}, sort_keys=True))
    return 0


def peak_memory_mb() -> float:
    """This process's peak memory: the GPU allocator's peak when on a GPU, else the resident set."""
    import tensorflow as tf

    if tf.config.list_logical_devices("GPU"):
        return tf.config.experimental.get_memory_info("GPU:0")["peak"] / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


if __name__ == "__main__":
    sys.exit(main())
