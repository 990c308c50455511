"""Time to accuracy: the demo's acoustic model, dev CER against wall-clock minutes from launching
`horovodrun -np 2`, for two configs in one run: by default the demo's on Keras' LSTM path ("before")
and the demo's as it runs ("after": models/layers/lstm.py's CPU path).

    python benchmarks/time_to_accuracy.py [--json out.json] [--tiny] [--shards DIR] [--utterances 2500]
                                          [--before benchmarks/configs/demo_asr_keras_path.yaml]
                                          [--after configs/demo_asr.yaml]
                                          [--evaluations 12]
                                          [--targets 0.02,0.015] [--seeds 0,1] [--before-seeds 0]

Each arm is the real command a user runs (`horovodrun -np 2 -H localhost:2 --gloo python -m
models.train --config ...`), with the dev CER measured about `--evaluations` times in its run (the
same number for both arms, so both pay the same share of evaluation); a point's minutes run from
launching horovodrun to that evaluation's end, so start-up, input, evaluation and checkpoints are all
in them. Reported per arm: the minutes until the dev CER first reached each target, the job's
minutes from launch to exit, its final dev CER, and the test CER (greedy, voices never heard in
training) of the model it saved, and on the held-out engine's voices (test_engine) where the shards
have them. `--seeds`: the after arm runs once per training seed and its figures are their means (one
seed's test CER differs by most of a point between two CPUs), each seed's beside them; the before
arm runs `--before-seeds`. A plot of every run's curve is written beside the JSON (`out.png`).
Without --shards it builds the demo corpus first (espeak-ng + sox, fbank, shards), as `make demo` does.
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import report_runs  # noqa: E402
from benchmarks.convergence import demo_shards, first_below  # noqa: E402
from benchmarks.harness import (  # noqa: E402
    ROOT,
    dev_curve_from_launch,
    evaluate_model,
    run_training,
    synthetic_shards,
    write_json,
)

BEFORE = ROOT / "benchmarks/configs/demo_asr_keras_path.yaml"
AFTER = ROOT / "configs/demo_asr.yaml"
RUN_TIMEOUT_S = 2 * 3600  # an arm of the demo's config takes about 20 minutes on a 2-core CPU


def steps_of(config: Path, shards: Path, sets: list[str], workers: int) -> int:
    """Steps a run of `config` takes on `shards` with `workers` ranks (as models/training/schedule.py counts them)."""
    from common import config as configlib
    from models.training.config import TrainConfig
    from pipeline.dataset import batch_plan
    from pipeline.records import open_shard_set

    c = configlib.load(TrainConfig, config, sets)
    per_epoch = batch_plan(open_shard_set(shards).split("train"), workers, c.input, training=True).batches
    total = c.epochs * per_epoch
    return min(total, c.max_steps) if c.max_steps else total


def run_arm(
    name: str,
    config: Path,
    sets: list[str],
    shards: Path,
    work: Path,
    evaluations: int,
    tracking: str,
    seeds: list[int],
    targets: list[float],
) -> dict:
    """One arm: a run per seed, its figures the seeds' means (`runs`: each seed's)."""
    runs = [
        run_seed(f"{name}-seed{seed}", config, [*sets, f"seed={seed}"], shards, work, evaluations, tracking)
        for seed in seeds
    ]
    for run, seed in zip(runs, seeds):
        run["seed"] = seed
        for target in targets:
            run[f"minutes_to_{target:g}"] = first_below(run["dev_curve"], target)
    mean = {}
    for key in (
        "steps",
        "job_minutes",
        "startup_minutes",
        "final_dev_cer",
        "selected_dev_cer",
        "test_cer",
        "test_engine_cer",
    ):
        values = [r[key] for r in runs]
        mean[key] = None if any(v is None for v in values) else sum(values) / len(values)
    for target in targets:  # a seed that never reached it: the arm did not reach it
        values = [r[f"minutes_to_{target:g}"] for r in runs]
        mean[f"minutes_to_{target:g}"] = None if None in values else sum(values) / len(values)
    return {"config": runs[0]["config"], "eval_every": runs[0]["eval_every"], **mean, "seeds": seeds, "runs": runs}


def run_seed(
    name: str, config: Path, sets: list[str], shards: Path, work: Path, evaluations: int, tracking: str
) -> dict:
    steps = steps_of(config, shards, sets, 2)
    every = max(1, math.ceil(steps / evaluations))
    launched = time.time()
    summary = run_training(
        shards,
        work / name,
        2,
        config,
        [*sets, f"eval_every={every}"],
        env_extra={"MLFLOW_TRACKING_URI": tracking},
        timeout=RUN_TIMEOUT_S,
    )
    test = evaluate_test(work / name, shards)
    curve = dev_curve_from_launch(summary, launched)
    return {
        "config": str(config.relative_to(ROOT)) if config.is_relative_to(ROOT) else str(config),
        "steps": summary["steps"],
        "eval_every": every,
        "job_minutes": summary["job_wall_s"] / 60,
        "startup_minutes": (summary["dev_clock_started_unix_s"] - launched) / 60,  # launch -> the trainer set up
        "final_dev_cer": summary.get("last_dev_cer"),
        "selected_dev_cer": summary.get("selected_dev_cer"),
        "test_cer": test.get("test_cer"),
        "test_engine_cer": test.get("test_engine_cer"),
        "dev_curve": curve,
    }


def evaluate_test(workdir: Path, shards: Path) -> dict:
    """Greedy CER of the saved model on test, and on test_engine where the shards have it."""
    from pipeline.records import open_shard_set

    held_out = [s for s in ("test", "test_engine") if s in open_shard_set(shards).splits]
    return evaluate_model(workdir, shards, *(a for s in held_out for a in ("--split", s)), "--beam-width", "4")


def plot(arms: dict[str, dict], targets: list[float], path: Path) -> Path:
    """Dev CER (log scale) against minutes from launch, one line per arm, and the targets."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for name, arm in arms.items():
        for run in arm["runs"]:
            label = f"{name} ({arm['config']}, seed {run['seed']})"
            ax.plot(*zip(*run["dev_curve"]), marker="o", markersize=3, label=label)
    for target in targets:
        ax.axhline(target, color="grey", linestyle="--", linewidth=0.8)
    ax.set_yscale("log")
    ax.set_xlabel("minutes from launching horovodrun -np 2")
    ax.set_ylabel("dev CER (greedy)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path)
    parser.add_argument("--tiny", action="store_true", help="synthetic shards and a tiny model (tests)")
    parser.add_argument("--shards", type=Path, help="shards with train, dev and test splits (default: the demo corpus)")
    parser.add_argument(
        "--utterances", type=int, default=2500, help="demo corpus size when building it (the DAG's default)"
    )
    parser.add_argument("--before", type=Path, default=BEFORE, help="config of the first arm")
    parser.add_argument("--after", type=Path, default=AFTER, help="config of the second arm")
    parser.add_argument(
        "--arms",
        type=lambda v: [a for a in ("after", "before") if a in v.split(",")],
        default=["after", "before"],
        help="which arms to run (after,before; one alone is a quick look, not a comparison)",
    )
    parser.add_argument("--evaluations", type=int, default=12, help="dev evaluations in each arm's run")
    parser.add_argument("--targets", default="0.02,0.015", help="dev CERs to report the minutes to")
    seeds = lambda v: [int(x) for x in v.split(",")]  # noqa: E731
    parser.add_argument("--seeds", type=seeds, default=[0, 1], help="training seeds of the after arm (their mean)")
    parser.add_argument("--before-seeds", type=seeds, default=[0], help="training seeds of the before arm")
    args = parser.parse_args(argv)
    targets = [float(t) for t in args.targets.split(",")]
    work = Path(tempfile.mkdtemp(prefix="time-to-accuracy-"))
    tracking = f"sqlite:///{work / 'mlflow.db'}"
    if args.tiny:
        shards = args.shards or synthetic_shards(
            work, 48, mean_frames=60, dim=13, num_shards=4, test_utterances=8, dev_utterances=8
        )
        tiny = ROOT / "tests/configs/tiny_asr.yaml"
        common = ["max_steps=8", "log_model=false"]
        plan = {"before": (tiny, common), "after": (tiny, [*common, "asr.subsample=2"])}
        evaluations = 2
        args.seeds, args.before_seeds = args.seeds[:2], args.before_seeds[:1]
    else:
        shards = args.shards or demo_shards(work, args.utterances)
        plan = {"before": (args.before.resolve(), []), "after": (args.after.resolve(), [])}
        evaluations = args.evaluations
    # The new config runs first (its figures are the ones a reader waits for); the table keeps before, after.
    seeds_of = {"after": args.seeds, "before": args.before_seeds}
    ran = {
        name: run_arm(name, *plan[name], shards, work, evaluations, tracking, seeds_of[name], targets)
        for name in args.arms
    }
    arms = {name: ran[name] for name in plan if name in ran}
    results: dict = {"tiny": args.tiny, "workers": 2, "targets": targets, "arms": arms}
    seeds = {"training": args.seeds, "demo_corpus" if not args.tiny else "synthetic_shards": 0}
    record = write_json(args.json, results, seeds)
    print("\n".join(report_runs.time_to_accuracy(record)))
    if args.json:
        print("plot:", plot(arms, targets, args.json.with_suffix(".png")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
