"""The synthesis model's figure is the mean of its seeds: the demo's synthesis config trained alone at
`horovodrun -np 2` with each seed on a demo run's shards, each evaluated as the DAG evaluates it
(`models.evaluate`, dev and test, heard by that run's acoustic model).

    python benchmarks/tts_seeds.py --demo-run DIR [--json out.json] [--seeds 0,1,2] [--config C]
                                   [--run-config C] [--set KEY=VALUE ...] [--max-utterances 100]

DIR is a finished demo run (`benchmarks/demo.py --keep WORK` leaves it under WORK/pipeline/): its
`shards/`, its acoustic model `asr/` as the listener (or `--listener WORKDIR`; the JSON pins it by its
weights' sha256) and its `summary.json`. The run's own synthesis model (trained with `--run-config`,
default the demo's) is the seed its saved config names: when `--config` is that config and every
setting of the file as it is now and every `--set` item hold in the run's saved config (e.g. a
`max_steps` it was run with), its evaluation is read from the summary, not trained again; a `--set`
the run did not have (a lever) trains that seed here too.
Reports each seed's dev and test intelligibility CER (free-running), teacher-forced CER, the CER of
the free-running speech through the vocoder (what a person hears) and steps, and their means (quality
only: the seeds' training time is the demo's, benchmarks/demo.py). `--lever NAME --levers-json FILE`
also keeps the run in FILE under NAME beside the levers run before (benchmarks/results/
tts_seed_levers.json: every lever tried, kept or rejected).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import report_tts  # noqa: E402
from benchmarks.harness import ROOT, evaluate_model, run_training, write_json  # noqa: E402

DEMO_TTS = ROOT / "configs/demo_tts.yaml"
FIGURES = (
    "dev_intelligibility_cer",
    "test_intelligibility_cer",
    "dev_intelligibility_cer_teacher_forced",
    "dev_intelligibility_cer_recordings",
    "dev_intelligibility_cer_vocoded",
    "dev_mel_l1",
)
RUN_TIMEOUT_S = 3600


def evaluate(workdir: Path, shards: Path, listener: Path, max_utterances: int) -> dict:
    """`models.evaluate` of a synthesis model on dev and test, as the DAG's evaluate_tts task runs it."""
    return evaluate_model(workdir, shards, "--asr-model", str(listener), "--max-utterances", str(max_utterances))


def pinned(listener: Path, run_dir: Path) -> dict:
    """What pins the listener every seed is heard by: its model's weights file and their sha256, and
    where it came from (the demo run's own acoustic model, or another workdir)."""
    import hashlib

    weights = sorted((listener / "model").glob("ckpt-*.npz"))
    if not weights:
        raise SystemExit(f"{listener}: no acoustic model (model/ckpt-*.npz); pass --listener a finished asr workdir")
    return {
        "model": "the demo run's acoustic model" if listener == run_dir / "asr" else listener.name,
        "weights": weights[-1].name,
        "sha256": hashlib.sha256(weights[-1].read_bytes()).hexdigest(),
    }


def seed_of_run(run_dir: Path, config: Path, run_config: Path, sets: list[str]) -> int | None:
    """The seed the demo run's synthesis model was trained with, when that model is what `config`
    with the `--set` items `sets` trains: `config` is the run's config (`run_config`), and every
    setting of that file as it is now and every item already hold in the model's saved config. None
    otherwise (a lever the run did not have, or the file edited since): then every seed is trained here."""
    from common import config as configlib
    from models.training.config import TrainConfig

    saved_path = run_dir / "tts" / "config.yaml"
    if config.resolve() != run_config.resolve() or not saved_path.is_file():
        return None
    saved = configlib.load(TrainConfig, saved_path)
    # The config file as it is now and the --set items, applied over what the run saved: a setting
    # either changed (a lever, or the file edited since the run) trains the run's seed again.
    if configlib.load(TrainConfig, config, sets, base=saved) != saved:
        print(
            f"{config.name} {' '.join(sets)}: not what the demo run trained; its seed {saved.seed} is trained here too"
        )
        return None
    return saved.seed


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--demo-run", type=Path, required=True, help="a finished demo run's directory")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--config", type=Path, default=DEMO_TTS, help="synthesis config to train")
    parser.add_argument("--run-config", type=Path, default=DEMO_TTS, help="config the demo run trained with")
    parser.add_argument("--set", action="append", default=[], help="config override for the seeds trained here")
    parser.add_argument("--max-utterances", type=int, default=100, help="sentences per split (the DAG's default)")
    parser.add_argument(
        "--work", type=Path, help="where the seeds' training workdirs go (default: a new temporary one)"
    )
    parser.add_argument(
        "--listener",
        type=Path,
        help="the acoustic model that hears every seed (a training workdir; default: the demo run's asr/)",
    )
    parser.add_argument("--lever", help="a name for this run among the levers (with --levers-json)")
    parser.add_argument("--levers-json", type=Path, help="the file that keeps every lever's run")
    return parser.parse_args(argv)


def seed_figures(args, seed: int, run_seed: int | None, work: Path, listener: Path, summary: dict) -> dict:
    """One seed's figures: read from the demo run's `summary` when it is the run's own model, else trained
    and heard here."""
    run_dir = args.demo_run.resolve()
    shards = run_dir / "shards"
    if seed == run_seed:
        metrics = summary["models"]["tts"]["metrics"]
        trained = json.loads((run_dir / "tts" / "train_summary.json").read_text())
        source = "the demo run"
    else:
        workdir = work / f"seed{seed}"
        trained = run_training(
            shards,
            workdir,
            2,
            args.config.resolve(),
            [*args.set, f"seed={seed}"],
            env_extra={"MLFLOW_TRACKING_URI": f"sqlite:///{work / 'mlflow.db'}"},
            timeout=RUN_TIMEOUT_S,
        )
        metrics = evaluate(workdir, shards, listener, args.max_utterances)
        source = "trained here"
    return {**{k: metrics.get(k) for k in FIGURES}, "steps": trained["steps"], "source": source}


def seeds_results(args, per_seed: dict, seeds: list[int], listener: Path, summary: dict) -> dict:
    """The results file: the config, its listener, each seed's figures and their mean and spread."""
    run_dir = args.demo_run.resolve()
    # A figure the evaluation of a seed lacks (a demo run's evaluation without it) is left out.
    measured = {k: [s[k] for s in per_seed.values() if s[k] is not None] for k in FIGURES}
    config = args.config.resolve()
    return {
        "config": str(config.relative_to(ROOT)) if config.is_relative_to(ROOT) else str(args.config),
        "overrides": args.set,
        "listener_test_cer": summary["models"].get("asr", {}).get("metrics", {}).get("test_cer")
        if args.listener is None
        else None,
        "listener": pinned(listener, run_dir),
        "max_utterances": args.max_utterances,
        "seeds": per_seed,
        "mean": {k: float(np.mean(v)) if len(v) == len(seeds) else None for k, v in measured.items()},
        "spread": {k: float(np.ptp(v)) if len(v) == len(seeds) else None for k, v in measured.items()},
    }


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    run_dir = args.demo_run.resolve()
    listener = (args.listener or run_dir / "asr").resolve()
    summary = json.loads((run_dir / "summary.json").read_text())
    seeds = [int(s) for s in args.seeds.split(",")]
    # Another listener has not heard the run's own model: every seed is trained and heard here.
    run_seed = seed_of_run(run_dir, args.config, args.run_config, args.set) if args.listener is None else None
    work = args.work.resolve() if args.work else Path(tempfile.mkdtemp(prefix="tts-seeds-"))
    work.mkdir(parents=True, exist_ok=True)
    per_seed = {str(seed): seed_figures(args, seed, run_seed, work, listener, summary) for seed in seeds}
    results = seeds_results(args, per_seed, seeds, listener, summary)
    record = write_json(args.json, results, {"training": seeds, "demo_corpus": 0})
    print("\n".join(report_tts.tts_seeds(record)))
    if args.levers_json:
        keep_lever(args.levers_json, args.lever or "+".join(args.set) or "demo config", results, seeds)
    return 0


def keep_lever(path: Path, name: str, results: dict, seeds: list[int]) -> None:
    """Adds (or replaces) `name`'s run in the levers file, keeping the other levers' runs; the file's
    own metadata is the last run's (the page names its commit and machine)."""
    from benchmarks.harness import run_metadata

    levers = json.loads(path.read_text())["levers"] if path.is_file() else {}
    levers[name] = {**results, "meta": run_metadata({"training": seeds, "demo_corpus": 0})}
    write_json(path, {"levers": levers}, {"training": seeds, "demo_corpus": 0})


if __name__ == "__main__":
    sys.exit(main())
