"""Does gossip train as well as allreduce? The same budget for each, then test CER; and how long a
job with a slow worker takes to reach allreduce's result.

    python benchmarks/convergence.py [--json out.json] [--tiny] [--shards DIR] [--epochs E] [--seeds 2]
                                     [--variants allreduce,delay-by-one] [--no-half-speed]
                                     [--targets 0.05,0.03] [--reference earlier.json]

1. Trains the acoustic model with `horovodrun -np 2` under allreduce and under each gossip
   variant (fixed ring, random ring, delay-by-one), and hierarchical gossip on two "hosts" of two
   ranks each (-np 4), on the demo config's own schedule (or `--epochs E`), the same training
   samples for each, with `--seeds` seeds each, and reports the test CER (voices never heard in
   training): mean and spread. Goal from the research: every variant within 10% relative of
   allreduce. And time to accuracy: every run's dev CER at the config's `eval_every`, against minutes
   from launching horovodrun; the minutes until it first reached each of `--targets` and the level
   every run reached (the highest of the runs' best dev CERs), and a plot of every curve (`out_dev.png`).
2. With rank 1 at half speed (`--straggler-factor 2`), allreduce and the best gossip variant of
   part 1: the minutes from the start of training until its dev CER first reaches what allreduce
   reached at the end of its undisturbed run (dev CER every `eval_every` steps,
   models/training/dev_selection.py), and a plot of both dev CER curves beside the JSON (`out.png`).
Without --shards it builds the demo corpus first (espeak-ng + sox, fbank, shards).
`--reference earlier.json` (same shards and epochs): the seeds that run measured are read, not
trained again, and its variants not named in `--variants` stay in the table, each row saying where
it was measured, as does its second part under `--no-half-speed`; so a table of 25-minute runs can be
completed over several sittings.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import report_runs  # noqa: E402
from benchmarks.harness import (  # noqa: E402
    PYTHON,
    ROOT,
    delay_rounds,
    dev_curve_from_launch,
    evaluate_model,
    pick_variants,
    run_training,
    synthetic_shards,
    write_json,
)

# A 15-epoch run of the demo model takes 24-27 minutes at np=2 on a 2-core AVX2 machine; the
# hierarchical run (np=4 on the same cores) and part 2's half-speed runs take about twice that. The
# harness's default of 30 minutes cut such runs short.
RUN_TIMEOUT_S = 4 * 3600

VARIANTS = {
    "allreduce": ["--strategy", "allreduce"],
    "fixed-ring": ["--strategy", "adpsgd", "--set", "strategy.gossip=fixed-ring"],
    "random-ring": ["--strategy", "adpsgd", "--set", "strategy.gossip=random-ring"],
    "delay-by-one": ["--strategy", "adpsgd", "--set", "strategy.gossip=delay-by-one"],
    "hierarchical": [
        "--strategy",
        "adpsgd",
        "--set",
        "strategy.gossip=fixed-ring",
        "--set",
        "strategy.hierarchical=true",
    ],
}
HOSTS = "localhost:2,127.0.0.1:2"  # two hosts of two ranks on this machine (Horovod groups by host name)


def demo_copies() -> list[str]:
    """`pipeline.augment --set` items of the copies configs/demo_asr.yaml asks for; [] for none."""
    from common import config as configlib
    from models.training.config import TrainConfig

    copies = configlib.load(TrainConfig, ROOT / "configs/demo_asr.yaml").settings.augment.copies
    return [f"{k}={json.dumps(v)}" for k, v in configlib.to_dict(copies).items()] if copies.enabled else []


def same_budget(config: Path, np_: int) -> list[str]:
    """`--set` items that give a run of `np_` ranks the training samples and dev evaluations of the
    config's own schedule at two ranks: max_steps and eval_every count each rank's steps, so four ranks
    on the config's values would train on twice the batches. [] at two ranks."""
    from common import config as configlib
    from models.training.config import TrainConfig

    cfg = configlib.load(TrainConfig, config)
    if np_ == 2 or not cfg.max_steps:
        return []
    every = [f"eval_every={max(1, cfg.eval_every * 2 // np_)}"] if cfg.eval_every else []  # 0: no dev evaluations
    return [f"max_steps={cfg.max_steps * 2 // np_}", *every]


def demo_shards(work: Path, utterances: int) -> Path:
    """The demo corpus through the real stages: corpus -> features -> shards."""
    data = work / "data"
    subprocess.run(
        [PYTHON, "-m", "pipeline.corpus", "--out", str(data), "--num-utterances", str(utterances)],
        cwd=ROOT,
        check=True,
        capture_output=True,
    )
    splits = [s for s in ("train", "dev", "test", "test_engine") if (data / s).is_dir()]  # test_engine: flite's
    for split in splits:
        subprocess.run(
            [PYTHON, "-m", "pipeline.features", "--data-dir", str(data / split), "--no-progress"],
            cwd=ROOT,
            check=True,
            capture_output=True,
        )
    out = work / "shards"
    split_args = [arg for s in splits for arg in ("--split", f"{s}={data / s}")]
    if items := demo_copies():  # the demo's acoustic model trains on the clean split and its copies
        augmented = data / "train_aug"
        sets = [a for item in items for a in ("--set", item)]
        for cmd in (
            [PYTHON, "-m", "pipeline.augment", "--data", str(data / "train"), "--out", str(augmented), *sets],
            [PYTHON, "-m", "pipeline.features", "--data-dir", str(augmented)],
        ):
            subprocess.run([*cmd, "--no-progress"], cwd=ROOT, check=True, capture_output=True)
        split_args += ["--split", f"train_aug={augmented}"]
    subprocess.run(
        [PYTHON, "-m", "pipeline.shards", *split_args, "--out", str(out), "--no-progress"],
        cwd=ROOT,
        check=True,
        capture_output=True,
    )
    return out


def evaluate(workdir: Path, shards: Path) -> dict:
    """Test CER, greedy and a beam of four, of a trained acoustic model."""
    return evaluate_model(workdir, shards, "--split", "test", "--beam-width", "4")


def dev_curve(summary: dict) -> list[list[float]]:
    """[minutes since training began, dev CER] at every dev evaluation, the final one included."""
    points = [[p["dev_wall_s"] / 60, p["dev_cer"]] for p in summary.get("dev_history", [])]
    last = summary.get("last_dev_wall_s")
    if last is not None and (not points or last / 60 > points[-1][0]):
        points.append([last / 60, summary["last_dev_cer"]])
    return points


def first_below(curve: list[list[float]], target: float | None) -> float | None:
    """Minutes until the dev CER first reached `target` (None: never)."""
    return next((minutes for minutes, cer in curve if target is not None and cer <= target), None)


def reference(parser, path: Path, epochs: int | None) -> dict:
    """An earlier run's JSON whose seeds are read, not trained again (a run of the demo's schedule
    takes about 16 minutes here); it must have the same budget (`epochs`, None: the config's
    schedule), and the caller gives the same shards."""
    earlier = json.loads(path.read_text())
    if (earlier.get("epochs"), earlier.get("tiny")) != (epochs, False):
        parser.error(
            f"--reference {path}: {earlier.get('epochs')} epochs there, {epochs} asked here; "
            "runs compare only at the same budget"
        )
    return earlier


def earlier_seeds(earlier: dict, name: str, seeds: int) -> tuple[list, list]:
    """The test CERs and WERs of `name`'s seeds 0, 1, ... that an earlier run measured (at most `seeds`)."""
    cers = earlier.get(f"{name}_cers", [])[:seeds]
    # A record of one seed without per-seed WERs: its mean is that seed's WER.
    wers = earlier.get(f"{name}_wers") or ([earlier[f"{name}_wer"]] if len(cers) == 1 else [])
    return list(cers), list(wers[: len(cers)])


def earlier_half_speed(earlier: dict) -> dict:
    """An earlier run's second part (rank 1 at half speed), kept as its rows of part 1 are when this
    run does not repeat it; {} where it has none."""
    if not any("_half_speed_" in k for k in earlier):
        return {}
    return {k: v for k, v in earlier.items() if "half_speed" in k or k == "best_gossip_variant"}


def aim_half_speed(results: dict) -> None:
    """Part 2's minutes to its target, the undisturbed allreduce's final dev CER (the mean over its seeds),
    worked out again from each half-speed curve: an earlier run's part 2 kept beside more seeds of part 1
    is measured against the target those seeds give."""
    target = results.get("allreduce_final_dev_cer")
    results["half_speed_target_dev_cer"] = target
    for key in [k for k in results if k.endswith("_half_speed_dev_curve")]:
        name = key.removesuffix("_half_speed_dev_curve")
        results[f"{name}_half_speed_minutes_to_allreduce_dev_cer"] = first_below(results[key], target)


def time_to_accuracy(results: dict, names: list[str], targets: list[float]) -> None:
    """From each seed's dev curve (`{name}_seed{s}_dev_curve`): the minutes until it first reached
    each target and the common level, per seed and as the strategy's mean, into `results`. The
    common level is the dev CER every run reached: the highest of the runs' best ones (a level such
    as allreduce's final CER, which a run ending a little above it never reaches, would compare
    nothing)."""
    finals = {n: [results[f"{n}_seed{s}_final_dev_cer"] for s in range(len(results[f"{n}_cers"]))] for n in names}
    curves = [results[f"{n}_seed{s}_dev_curve"] for n in names for s in range(len(finals[n]))]
    level = max(min(cer for _, cer in curve) for curve in curves)
    results["common_dev_level"] = level
    levels = {**{f"{t:g}": t for t in targets}, "common_level": level}
    for name in names:
        seeds = range(len(finals[name]))
        results[f"{name}_final_dev_cer"] = float(np.mean(finals[name]))
        results[f"{name}_job_minutes"] = float(np.mean([results[f"{name}_seed{s}_job_wall_s"] for s in seeds])) / 60
        for key, target in levels.items():
            minutes = [first_below(results[f"{name}_seed{s}_dev_curve"], target) for s in seeds]
            for seed, m in zip(seeds, minutes):
                results[f"{name}_seed{seed}_minutes_to_{key}"] = m
            results[f"{name}_minutes_to_{key}"] = None if None in minutes else float(np.mean(minutes))
    base = results["allreduce_minutes_to_common_level"]
    for name in names:
        minutes = results[f"{name}_minutes_to_common_level"]
        ratio = minutes / base if minutes is not None and base else None
        results[f"{name}_minutes_to_common_level_vs_allreduce"] = ratio


def compare_to_allreduce(results: dict, names: list[str]) -> None:
    """Each variant's CER relative to allreduce's, into `results`, and whether all are within a tenth."""
    base = results["allreduce_cer"]
    for name in names:
        results[f"{name}_relative_to_allreduce"] = (results[f"{name}_cer"] - base) / base if base else 0.0
    results["all_within_10_percent"] = all(
        abs(results[f"{n}_relative_to_allreduce"]) <= 0.10 or results[f"{n}_cer"] <= base for n in names
    )


def parse(argv: list[str] | None) -> tuple[argparse.ArgumentParser, argparse.Namespace]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path)
    parser.add_argument("--tiny", action="store_true")
    parser.add_argument(
        "--shards", type=Path, help="shards with train, dev and test splits (default: build the demo corpus)"
    )
    parser.add_argument(
        "--epochs", type=int, help="epochs for every run (default: the config's own schedule, epochs and max_steps)"
    )
    parser.add_argument(
        "--targets",
        type=lambda s: [float(t) for t in s.split(",")],
        default=[0.05, 0.03],
        help="dev CERs whose minutes are reported, beside the level every run reached",
    )
    parser.add_argument("--seeds", type=int, default=2, help="training runs per variant, seeds 0..N-1")
    parser.add_argument("--utterances", type=int, default=1500, help="demo corpus size when building it")
    parser.add_argument(
        "--variants",
        default=",".join(VARIANTS),
        help=f"comma-separated, allreduce first (the reference): {','.join(VARIANTS)}",
    )
    parser.add_argument(
        "--reference",
        type=Path,
        help="an earlier run's JSON (same shards and epochs): the seeds it measured are read, not trained again",
    )
    parser.add_argument(
        "--half-speed",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="part 2: allreduce and the best gossip variant with rank 1 at half speed",
    )
    return parser, parser.parse_args(argv)


@dataclasses.dataclass(frozen=True)
class Plan:
    """What every training run of the benchmark shares."""

    work: Path  # the temporary directory the runs write under
    shards: Path  # train, dev and test splits
    config: Path  # the acoustic config every run trains
    epochs: int | None  # every run's budget; None: the config's own schedule
    seeds: int  # part 1's runs per variant, seeds 0..N-1
    variants: dict  # name -> the training flags of each variant part 1 trains
    common: tuple[str, ...]  # `--set` items of every run
    json: Path | None  # where the results go, rewritten after every step
    seeds_used: dict  # the seeds the JSON's meta names


def plan(parser, args) -> Plan:
    chosen = pick_variants(parser, args.variants, VARIANTS, first="allreduce")  # the reference
    work = Path(tempfile.mkdtemp(prefix="convergence-"))
    if args.tiny:
        config, epochs, seeds = ROOT / "tests/configs/tiny_asr.yaml", 2, 1
        eval_every = ["eval_every=20"]
        shards = args.shards or synthetic_shards(
            work, 48, mean_frames=60, dim=13, num_shards=4, test_utterances=8, dev_utterances=8
        )
        variants = {k: VARIANTS[k] for k in ("allreduce", "fixed-ring")}
    else:
        config, epochs, seeds = ROOT / "configs/demo_asr.yaml", args.epochs, args.seeds
        shards = args.shards or demo_shards(work, args.utterances)
        variants = chosen
        eval_every = []  # the config's: the demo's dev evaluations, the same share of each run
    schedule = [] if epochs is None else [f"epochs={epochs}", "max_steps=0"]
    # Part 1 trains seeds 0..N-1 of every variant, part 2 seed 0; the corpus is the stage's seed 0.
    seeds_used = {"training": list(range(seeds)), "demo_corpus" if not args.tiny else "synthetic_shards": 0}
    common = (*schedule, "log_model=false", *eval_every)
    return Plan(work, shards, config, epochs, seeds, variants, common, args.json, seeds_used)


def read_earlier(results: dict, earlier: dict, name: str, seeds: int, reference_name: str) -> tuple[list, list]:
    """The seeds of `name` an earlier run measured (on the same code, shards and budget): their CERs and
    WERs, their own figures copied into `results` (their minutes to each level are worked out again
    over every run)."""
    cers, wers = earlier_seeds(earlier, name, seeds)
    if cers:
        kept = tuple(f"{name}_seed{seed}_" for seed in range(len(cers)))
        results.update({k: v for k, v in earlier.items() if k.startswith(kept) and "_minutes_to_" not in k})
        if name == "allreduce":
            results["allreduce_final_dev_cer"] = earlier.get("allreduce_final_dev_cer")
        read = "seed 0" if len(cers) == 1 else f"seeds 0-{len(cers) - 1}"
        results[f"{name}_from"] = f"{read} from {reference_name}" + (", the rest this run" if len(cers) < seeds else "")
    return cers, wers


def train_seed(p: Plan, results: dict, name: str, seed: int) -> dict:
    """Trains and evaluates seed `seed` of variant `name`; its job's figures go into `results`."""
    np_, hosts = (4, HOSTS) if name == "hierarchical" else (2, None)
    budget = same_budget(p.config, np_) if p.epochs is None else []  # epochs: shared by the ranks
    summary = run_training(
        p.shards,
        p.work / f"{name}-{seed}",
        np_,
        p.config,
        [*p.common, *budget, f"seed={seed}"],
        extra_args=p.variants[name],
        hosts=hosts,
        timeout=RUN_TIMEOUT_S,
    )
    results[f"{name}_seed{seed}_job_wall_s"] = summary["job_wall_s"]
    results[f"{name}_seed{seed}_dev_curve"] = dev_curve_from_launch(summary, summary["launched_unix_s"])
    results[f"{name}_seed{seed}_final_dev_cer"] = summary.get("last_dev_cer")
    results.update({f"{name}_seed{seed}_{k}": v for k, v in delay_rounds(summary).items()})
    if name == "allreduce" and seed == 0:
        results["allreduce_final_dev_cer"] = summary.get("last_dev_cer")
    return evaluate(p.work / f"{name}-{seed}", p.shards)


def part1(p: Plan, results: dict, earlier: dict, reference_name: str) -> None:
    """Every variant's seeds, read from the earlier run or trained here, and their test CER and WER."""
    for name in p.variants:
        cers, wers = read_earlier(results, earlier, name, p.seeds, reference_name)
        for seed in range(len(cers), p.seeds):
            metrics = train_seed(p, results, name, seed)
            cers.append(metrics["test_cer"])
            wers.append(metrics["test_wer"])
        results[f"{name}_cer"] = float(np.mean(cers))
        results[f"{name}_cer_spread"] = float(np.max(cers) - np.min(cers))
        results[f"{name}_cers"] = cers
        results[f"{name}_wer"] = float(np.mean(wers))
        results[f"{name}_wers"] = wers
        write_json(p.json, results, seeds=p.seeds_used)  # each variant kept if a later one is cut short


def carry(results: dict, earlier: dict, p: Plan, reference_name: str) -> list[str]:
    """The variants the earlier run measured and this one was not asked for: their rows stay in the table."""
    carried = [n for n in VARIANTS if n not in p.variants and earlier_seeds(earlier, n, p.seeds)[0]]
    for name in carried:
        kept = {k: v for k, v in earlier.items() if k.startswith(f"{name}_") and "_relative_" not in k}
        results.update({k: v for k, v in kept.items() if "_minutes_to_" not in k or "half_speed" in k})
        results[f"{name}_from"] = f"{reference_name} only"
    return carried


def timing(results: dict, timed: list[str], targets: list[float], json_path: Path | None) -> None:
    """Time to accuracy of the runs `timed`, and the plot of their dev curves beside the JSON."""
    time_to_accuracy(results, timed, targets)
    if json_path:
        curves = {
            f"{n} seed {s}": results[f"{n}_seed{s}_dev_curve"] for n in timed for s in range(len(results[f"{n}_cers"]))
        }
        path = json_path.with_name(f"{json_path.stem}_dev.png")
        level = results["common_dev_level"]
        xlabel = "minutes from launching horovodrun"
        print("plot:", dev_cer_plot(curves, level, path, xlabel, "the level every run reached"))


def keep_part2(results: dict, earlier: dict, p: Plan, reference_name: str) -> None:
    """The earlier run's part 2, measured against the target of this run's seeds, when part 2 is not run."""
    if not (part2 := earlier_half_speed(earlier)):
        return
    results.update(part2, half_speed_from=f"{reference_name} only")
    aim_half_speed(results)
    if p.json:  # its plot's target line moves with part 1's seeds
        curves = {n: results[f"{n}_half_speed_dev_curve"] for n in (results["best_gossip_variant"], "allreduce")}
        print("plot:", dev_cer_plot(curves, results["half_speed_target_dev_cer"], p.json.with_suffix(".png")))


def part2(p: Plan, results: dict, gossip: list[str]) -> None:
    """Rank 1 at half speed; minutes until allreduce's final dev CER is reached. The gossip run goes
    first: it is the shorter one, and the JSON keeps it if allreduce's is cut short."""
    target = results["half_speed_target_dev_cer"] = results.get("allreduce_final_dev_cer")
    best = min(gossip, key=lambda n: results[f"{n}_cer"])
    results["best_gossip_variant"] = best
    curves = {}
    for name in (best, "allreduce"):
        summary = run_training(
            p.shards,
            p.work / f"{name}-slow",
            2,
            p.config,
            [*p.common, "seed=0"],
            extra_args=[*p.variants[name], "--straggler-rank", "1", "--straggler-factor", "2"],
            timeout=RUN_TIMEOUT_S,
        )
        curves[name] = dev_curve(summary)
        results[f"{name}_half_speed_minutes_to_allreduce_dev_cer"] = first_below(curves[name], target)
        results[f"{name}_half_speed_job_minutes"] = summary["job_wall_s"] / 60
        results[f"{name}_half_speed_dev_curve"] = curves[name]  # [minutes, dev CER] per evaluation
        results[f"{name}_half_speed_final_dev_cer"] = summary.get("last_dev_cer")
        results[f"{name}_half_speed_batches"] = [r["batches"] for r in summary.get("per_rank_trained", [])]
        write_json(p.json, results, seeds=p.seeds_used)
    # A gossip run may end a little above allreduce's CER (never reaching the target); then the
    # level both reached, the higher of the two final dev CERs, compares them at equal quality.
    level = max(results[f"{name}_half_speed_final_dev_cer"] for name in curves)
    results["half_speed_common_dev_cer"] = level
    for name in curves:
        results[f"{name}_half_speed_minutes_to_common_dev_cer"] = first_below(curves[name], level)
    if p.json:
        print("plot:", dev_cer_plot(curves, target, p.json.with_suffix(".png")))


def main(argv: list[str] | None = None) -> int:
    parser, args = parse(argv)
    p = plan(parser, args)
    results: dict = {"tiny": args.tiny, "epochs": p.epochs, "seeds": p.seeds, "targets": args.targets}
    earlier = reference(parser, args.reference, p.epochs) if args.reference else {}
    reference_name = args.reference.name if args.reference else ""
    part1(p, results, earlier, reference_name)
    carried = carry(results, earlier, p, reference_name)
    compare_to_allreduce(results, [*p.variants, *carried])
    # Hierarchical runs four ranks on the same cores: its CER compares, its minutes do not.
    timing(results, [n for n in [*p.variants, *carried] if n != "hierarchical"], args.targets, args.json)
    write_json(args.json, results, seeds=p.seeds_used)  # part 1 kept if part 2 is cut short
    gossip = [n for n in p.variants if n not in ("allreduce", "hierarchical")]
    if not args.half_speed:
        keep_part2(results, earlier, p, reference_name)
    elif gossip:
        part2(p, results, gossip)
    record = write_json(args.json, results, seeds=p.seeds_used)
    print("\n".join(report_runs.convergence(record)))
    return 0


def dev_cer_plot(
    curves: dict[str, list],
    target: float | None,
    path: Path,
    xlabel: str = "minutes since training began (rank 1 at half speed)",
    target_label: str = "allreduce's final dev CER",
) -> Path:
    """Dev CER against minutes, one line per run, and the target."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for name, points in curves.items():
        if points:
            ax.plot(*zip(*points), marker="o", markersize=3, label=name)
    if target is not None:
        ax.axhline(target, color="grey", linestyle="--", label=f"{target_label} ({target:.1%})")
    ax.set_xlabel(xlabel)
    ax.set_ylabel("dev CER")
    ax.set_ylim(0, min(1.0, 4 * (target or 0.25)))
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


if __name__ == "__main__":
    sys.exit(main())
