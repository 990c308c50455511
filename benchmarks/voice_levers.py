"""Levers of the demo corpus and the acoustic model's augmentations, judged on held-out speakers:
each arm builds its corpus through the real stages, trains the demo's acoustic model at
`horovodrun -np 2` once per seed, and scores the saved model on `test` (espeak-ng voices never
heard) and `test_engine` (the held-out speakers slt and kal in every engine's rendering), per voice.

    python benchmarks/voice_levers.py --arms base,natural_third [--seeds 0,1] [--json out.json]
                                      [--text grammar|open] [--utterances 2500] [--work DIR] [--tiny]

An arm is corpus settings (`pipeline.corpus --set`), augmented copies of the training split
(`asr.augment.copies.*`: `pipeline.augment` makes `train_aug`, which the acoustic model then trains
on) and other training settings (`models.train --set`); arms with the same corpus share it. An arm
with copies trains the base arm's number of steps (`max_steps=BASE`): the same budget over more
audio, as the demo's time allows. A lever is kept when its
seeds' mean held-out CER improves on the base arm's by more than the seeds' spread and `test`
stays <= 3.0% (the JSON holds each seed's figures to judge it). `--text`: the
corpus' sentences (`pipeline.corpus --text`): the grammar's (default: the arms of
benchmarks/results/voice_levers.json were judged on them) or open English (text_levers.json). `--tiny`: 40
utterances and a few steps of the tiny config, for the tests.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import report_recognition  # noqa: E402
from benchmarks.harness import (  # noqa: E402
    NO_COPIES,
    PYTHON,
    ROOT,
    evaluate_model,
    run_metadata,
    run_training,
    write_json,
)

# name -> (corpus --set items, asr.augment.copies items, other training --set items)
ARMS: dict[str, tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]] = {
    "base": ((), (), ()),
    "natural_third": (("natural_share=0.3333",), (), ()),
    "natural_half": (("natural_share=0.5",), (), ()),
    "speed": ((), ("speed_factors=[0.9, 1.1]",), ("max_steps=BASE",)),
    "reverb": ((), ("reverb_share=0.5",), ("max_steps=BASE",)),
    "noise": ((), ("noise_share=0.5",), ("max_steps=BASE",)),
    "telephone": ((), ("telephone_share=0.5",), ("max_steps=BASE",)),
    # the two levers that moved the held-out speakers most, together
    "natural_third_speed": (("natural_share=0.3333",), ("speed_factors=[0.9, 1.1]",), ("max_steps=BASE",)),
}
SPLITS = ("test", "test_engine")


def run(cmd: list[str]) -> None:
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-4000:]}")


def shards_for(
    work: Path, corpus_sets: tuple[str, ...], copies: tuple[str, ...], utterances: int, text: str = "grammar"
) -> tuple[Path, dict]:
    """The arm's corpus (-> augmented copies) -> features -> shards (the stages skip work that is up
    to date); (shards, corpus.json)."""
    key = [corpus_sets, utterances] + ([text] if text != "grammar" else [])  # the grammar's corpora keep their names
    data = work / f"corpus-{hashlib.sha256(json.dumps(key).encode()).hexdigest()[:10]}"
    shards = work / f"shards-{hashlib.sha256(json.dumps([*key, copies]).encode()).hexdigest()[:10]}"
    sets = [a for item in (f"text={text}", *corpus_sets) for a in ("--set", item)]
    run([PYTHON, "-m", "pipeline.corpus", "--out", str(data), "--num-utterances", str(utterances), *sets])
    splits = [s for s in ("train", "dev", *SPLITS) if (data / s).is_dir()]
    if copies:  # a train_aug of its own per arm, beside the corpus
        augmented = shards.with_name(shards.name + "-train_aug")
        sets = [a for item in copies for a in ("--set", item)]
        run(
            [
                PYTHON,
                "-m",
                "pipeline.augment",
                "--data",
                str(data / "train"),
                "--out",
                str(augmented),
                *sets,
                "--no-progress",
            ]
        )
        run([PYTHON, "-m", "pipeline.features", "--data-dir", str(augmented), "--no-progress"])
    for split in splits:
        run([PYTHON, "-m", "pipeline.features", "--data-dir", str(data / split), "--no-progress"])
    split_args = [a for s in splits for a in ("--split", f"{s}={data / s}")]
    split_args += ["--split", f"train_aug={augmented}"] if copies else []
    run([PYTHON, "-m", "pipeline.shards", *split_args, "--out", str(shards), "--no-progress"])
    return shards, json.loads((data / "corpus.json").read_text())


def finished(workdir: Path, items: list[str]) -> tuple[dict, dict] | None:
    """(train_summary.json, eval.json) of a seed's run that ended and was evaluated with these
    training settings (its `run.json` records them), else None: a rerun after an interruption
    trains only what is missing. A reused run has no job minutes (the harness timed the launch)."""
    try:
        same = json.loads((workdir / "run.json").read_text())["items"] == items
        summary = json.loads((workdir / "train_summary.json").read_text())
        metrics = json.loads((workdir / "eval.json").read_text())
    except (FileNotFoundError, KeyError, json.JSONDecodeError):
        return None
    wall = json.loads((workdir / "run.json").read_text()).get("job_wall_s")
    return ({**summary, **({"job_wall_s": wall} if wall is not None else {})}, metrics) if same else None


def config_steps(tiny: bool) -> int | None:
    """The training config's own max_steps (what the base arm trains), for an arm with copies
    measured before the base arm; None when the config sets none."""
    import yaml

    config = yaml.safe_load((ROOT / ("tests/configs/tiny_asr.yaml" if tiny else "configs/demo_asr.yaml")).read_text())
    return config.get("max_steps")


def per_voice(workdir: Path, split: str) -> dict[str, float]:
    """speaker -> greedy CER of `split` (models/asr/evaluation.py `{split}_speakers.tsv`)."""
    table = workdir / "eval" / f"{split}_speakers.tsv"
    rows = [line.split("\t") for line in table.read_text().splitlines()[1:] if line]
    return {row[0]: float(row[3]) for row in rows}


def arm_settings(arm: str, base_steps: int | None) -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]:
    """The arm's (corpus --set items, copies items, training --set items), its base steps filled in."""
    corpus_sets, copies, train_sets = ARMS[arm]
    if "max_steps=BASE" in train_sets:
        if base_steps is None:
            raise ValueError(f"arm {arm} trains the base arm's steps: run the base arm first (--arms base,{arm})")
        # (without a base arm in the JSON: the config's max_steps, which the base arm trains)
        train_sets = tuple(f"max_steps={base_steps}" if s == "max_steps=BASE" else s for s in train_sets)
        train_sets = ("epochs=1000", *train_sets)
    # Every arm's copies are its own: none but those it names, whatever the demo config holds.
    train_sets = (NO_COPIES, *(f"asr.augment.copies.{item}" for item in copies), *train_sets)
    return corpus_sets, copies, train_sets


def seed_run(arm: str, seed: int, work: Path, shards: Path, train_sets: tuple[str, ...], tiny: bool) -> dict:
    """One seed of the arm trained (or its finished run read back) and scored on every split, per voice."""
    config = ROOT / ("tests/configs/tiny_asr.yaml" if tiny else "configs/demo_asr.yaml")
    workdir = work / f"{arm}-seed{seed}"
    items = [f"seed={seed}", "log_model=false", *train_sets, *(["max_steps=4"] if tiny else [])]
    done = finished(workdir, items)
    if done:  # an interrupted run of the benchmark: this seed's run ended, read it back
        summary, metrics = done
        print(f"  {arm} seed {seed}: reusing the finished run in {workdir}")
    else:
        summary = run_training(shards, workdir, 2, config, items, timeout=3600)
        split_args = [a for s in SPLITS for a in ("--split", s)]
        metrics = evaluate_model(workdir, shards, *split_args)  # eval.json: {split}_cer, {split}_wer, ...
        (workdir / "run.json").write_text(json.dumps({"items": items, "job_wall_s": summary["job_wall_s"]}) + "\n")
    return {
        "seed": seed,
        "job_minutes": summary["job_wall_s"] / 60 if "job_wall_s" in summary else None,
        "steps": summary["steps"],
        **{f"{s}_cer": metrics[f"{s}_cer"] for s in SPLITS},
        **{f"{s}_wer": metrics[f"{s}_wer"] for s in SPLITS},
        # the words no training sentence has: their share and CER (open text; none in the grammar's test)
        **{f"{s}_{k}": metrics[f"{s}_{k}"] for s in SPLITS for k in ("oov_rate", "oov_cer") if f"{s}_{k}" in metrics},
        "test_engine_voices": per_voice(workdir, "test_engine"),
    }


def measure(
    arm: str,
    work: Path,
    seeds: list[int],
    utterances: int,
    tiny: bool,
    base_steps: int | None,
    earlier: dict | None,
    text: str = "grammar",
) -> dict:
    """The arm trained and scored once per seed of `seeds`; with `earlier` (this arm's record of an
    earlier run with the same settings) its other seeds' runs are kept beside them."""
    corpus_sets, copies, train_sets = arm_settings(arm, base_steps)
    shards, corpus = shards_for(work, corpus_sets, copies, utterances, text)
    runs = []
    for seed in seeds:
        runs.append(seed_run(arm, seed, work, shards, train_sets, tiny))
        print(f"  {arm} seed {seed}: " + ", ".join(f"{s} CER {100 * runs[-1][f'{s}_cer']:.2f}%" for s in SPLITS))
    if earlier and earlier["train_sets"] == list(train_sets) and earlier["corpus_sets"] == list(corpus_sets):
        runs = sorted([r for r in earlier["runs"] if r["seed"] not in seeds] + runs, key=lambda r: r["seed"])
    voices = sorted(runs[0]["test_engine_voices"])
    return {
        # arms of one JSON may come from runs on other days and machines: each records its own
        "run": {k: v for k, v in run_metadata({"training": seeds, "corpus": 0}).items() if k != "seeds"},
        "corpus_sets": list(corpus_sets),
        "copies": list(copies),
        "train_sets": list(train_sets),
        "natural_share_seconds": corpus.get("natural_share_seconds"),
        "corpus_voices": corpus["voices"],
        "runs": runs,
        "mean": {f"{s}_cer": statistics.fmean(r[f"{s}_cer"] for r in runs) for s in SPLITS},
        "spread": {f"{s}_cer": max(r[f"{s}_cer"] for r in runs) - min(r[f"{s}_cer"] for r in runs) for s in SPLITS},
        "test_engine_voices_mean": {
            v: statistics.fmean(r["test_engine_voices"].get(v, float("nan")) for r in runs) for v in voices
        },
    }


def parse(argv: list[str] | None) -> tuple[argparse.ArgumentParser, argparse.Namespace]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arms", default="base", help=f"comma-separated, of {', '.join(ARMS)}")
    parser.add_argument("--seeds", help="comma-separated training seeds (default 0,1; --tiny: 0)")
    parser.add_argument("--utterances", type=int, default=2500)
    parser.add_argument("--text", choices=("grammar", "open"), default="grammar", help="the corpus' sentences")
    parser.add_argument(
        "--work", type=Path, help="corpora, shards and models (default .runs/voice-levers; --tiny: a temporary one)"
    )
    parser.add_argument("--json", type=Path)
    parser.add_argument("--tiny", action="store_true")
    return parser, parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    parser, args = parse(argv)
    arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    if unknown := [a for a in arms if a not in ARMS]:
        parser.error(f"unknown arms {unknown}; the arms are {list(ARMS)}")
    seeds = [int(s) for s in (args.seeds or ("0" if args.tiny else "0,1")).split(",")]
    utterances = 40 if args.tiny else args.utterances
    work = args.work or (
        Path(tempfile.mkdtemp(prefix="voice-levers-")) if args.tiny else ROOT / ".runs" / "voice-levers"
    )
    work.mkdir(parents=True, exist_ok=True)
    results = {}
    if args.json and args.json.exists():  # arms measured earlier stay; an arm run again is replaced
        earlier = json.loads(args.json.read_text())
        if earlier["text"] != args.text:
            parser.error(f"{args.json} holds arms on --text {earlier['text']}; name another --json")
        results = earlier["arms"]
    for arm in arms:  # the JSON is written as each arm ends
        base_steps = results["base"]["runs"][0]["steps"] if "base" in results else config_steps(args.tiny)
        results[arm] = measure(arm, work, seeds, utterances, args.tiny, base_steps, results.get(arm), args.text)
        record = write_json(
            args.json, {"arms": results, "splits": list(SPLITS), "text": args.text}, {"training": seeds, "corpus": 0}
        )
    render = report_recognition.text_levers if args.text == "open" else report_recognition.voice_levers
    print("\n".join(render(record)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
