"""The trainer: `python -m models.train`, alone or under `horovodrun -np N`.

    horovodrun -np 2 -H localhost:2 --gloo python -m models.train --model asr --strategy adpsgd \
        --shards shards/ --workdir runs/asr [--epochs 10] [--max-steps 500] [--config c.yaml] \
        [--set strategy.gossip=delay-by-one] [--set asr.units=256]

Rank 0 writes checkpoints, logs to MLflow and shows the progress bar; every rank trains. A re-run
with the same workdir resumes from the latest checkpoint (weights, optimizer state, step and data
position) and refuses a workdir whose saved configuration has another architecture. The config
lives in models/training/config.py, the loop in models/training/loop.py `train`; this file only parses.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from common import catalog, cli
from common import config as configlib
from models.training.config import TrainConfig
from models.training.faults import Faults
from models.training.loop import train


def build_config(args: argparse.Namespace) -> TrainConfig:
    flags = {
        "model": args.model,
        "epochs": args.epochs,
        "max_steps": args.max_steps,
        "experiment": args.experiment,
        "data_service": args.data_service,
        "elastic": args.elastic or None,
        "strategy": {"name": args.strategy},
    }
    return configlib.load(TrainConfig, args.config, args.set, flags=flags)


def build_faults(args: argparse.Namespace) -> Faults:
    return Faults(
        straggler_rank=args.straggler_rank,
        straggler_delay_ms=args.straggler_delay_ms,
        straggler_factor=args.straggler_factor,
        fail_at_step=args.fail_at_step,
        fail_rank=args.fail_rank,
    )


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m models.train", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", choices=list(catalog.models()), help="which model to train (default asr)")
    p.add_argument("--strategy", choices=list(catalog.strategies()), help="how workers combine (default allreduce)")
    p.add_argument("--shards", required=True, type=Path, help="directory with manifest.json and the TFRecord shards")
    p.add_argument("--workdir", required=True, type=Path, help="checkpoints, config and the final model go here")
    p.add_argument("--epochs", type=int, help="passes over the training split")
    p.add_argument("--max-steps", type=int, help="stop after this many steps (0: no limit)")
    cli.add_config_arguments(p, "TrainConfig")
    p.add_argument(
        "--data-service", metavar="grpc://HOST:PORT", help="read batches from this tf.data service dispatcher"
    )
    p.add_argument(
        "--elastic",
        action="store_true",
        help="Horovod elastic: survive lost workers and take new ones (horovodrun --min-np/--max-np "
        "--host-discovery-script; allreduce only)",
    )
    p.add_argument("--experiment", help="MLflow experiment name (default speechflow)")
    p.add_argument("--mlflow-parent-run-id", help="nest the training run under this MLflow run (the DAG's)")
    p.add_argument("--run-name", help="MLflow run name")
    testing = p.add_argument_group("benchmarks and tests (models.training.faults.Faults)")
    testing.add_argument("--straggler-rank", type=int, default=-1, help="slow down this rank")
    testing.add_argument(
        "--straggler-delay-ms", type=float, default=0.0, help="milliseconds added to each of the straggler's steps"
    )
    testing.add_argument(
        "--straggler-factor",
        type=float,
        default=1.0,
        help="the straggler computes each step this many times (a slower or shared device)",
    )
    testing.add_argument("--fail-at-step", type=int, default=0, help="raise at this step (0: never)")
    testing.add_argument("--fail-rank", type=int, default=0, help="the rank that raises at --fail-at-step")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    # A user's mistake (ValueError, FileNotFoundError) becomes one line, as common/cli.py `run` makes it;
    # caught here, the loop is one call below main.
    try:
        summary = train(
            build_config(args), args.shards, args.workdir, args.mlflow_parent_run_id, args.run_name, build_faults(args)
        )
    except (ValueError, FileNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    if summary.get("rank", 0) == 0:
        print(json.dumps({k: v for k, v in summary.items() if not isinstance(v, (list, dict))}, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
