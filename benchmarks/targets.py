"""Characters against phones: the demo's acoustic recipe trained on each kind of CTC target, on the
same shards and audio, each decoded greedily and through its word LM, as the mean of its seeds.

    python benchmarks/targets.py --demo-run DIR [--seeds 0,1] [--json out.json] [--work DIR] [--tiny]

DIR is a finished demo run (`benchmarks/demo.py --keep WORK` leaves it under WORK/pipeline/): its
`shards/` (with every transcript's characters and its phone targets), its word LM `lm/` (the ARPA of
its leak-free LM text of general English) and its decoding graph `lang/` (HLG of that LM and the
text's lexicon). Per arm and seed, the real stages:

- `models.train` of `configs/demo_asr.yaml` with `asr.targets=ARM` and `seed=S` at `horovodrun -np 2`.
  The demo run's own acoustic model `asr/` (a phone model) is its arm's seed that its config names
  when it was trained with that config as the file is now: its model is copied and scored here, not
  trained again (the JSON's `source` and `demo_model`); a seed already trained in `--work` with the
  same settings is read back too;
- `models.tune_lm --attach` with the model's own copy of the run's `lm/` (chars: the LM weight and
  word bonus) or `lang/` (phones: the acoustic scale and word penalty), chosen on `dev_engine` (else
  `dev`, never a test split);
- `models.evaluate` of every split of dev, test, test_noisy and test_engine the shards have: chars
  greedy CER and WER, phones greedy PER, and the words through the LM (WER, CER), with the share of
  each split's words the LM (or the graph) lacks.

`--tiny`: synthetic shards with phone targets from an espeak-ng lexicon of their sentences, an LM and
a graph of those sentences, and each arm trained for a few steps of the tiny config, one seed (the tests).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
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
    run_training,
    synthetic_shards,
    write_json,
)

DEMO_ASR = ROOT / "configs/demo_asr.yaml"
TINY_ASR = ROOT / "tests/configs/tiny_asr.yaml"
ARMS = ("chars", "phones")
SPLITS = ("dev", "test", "test_noisy", "test_engine")
# What models.evaluate reports per split for each arm (`{split}_{figure}`); `_lm` is the words through
# the arm's LM: a char model's beam search with the n-gram, a phone model's search of HLG.
FIGURES = {
    "chars": ("cer", "wer", "cer_beam", "wer_beam", "cer_lm", "wer_lm", "lm_oov_rate", "lm_3gram_hit"),
    "phones": ("per", "per_beam", "cer_lm", "wer_lm", "lm_oov_rate", "lm_3gram_hit", "decode_rtf_lm"),
}
# Counted per split by both arms: the same audio and the same transcripts give the same counts.
COUNTS = ("utterances", "words")
# The run directory's decoder per arm: the word n-gram, the decoding graph.
DECODER = {"chars": "lm", "phones": "lang"}
RUN_TIMEOUT_S = 3600
TINY_STEPS = ["max_steps=4", "checkpoint_every=100000", "log_every=100000", "epochs=1000"]
# --tiny: two points each, where the tune's choice reaches the evaluation
TINY_GRID = {
    "chars": ["--weights", "0,0.5", "--word-bonuses", "1"],
    "phones": ["--acoustic-scales", "0.5,1.0", "--word-penalties", "0"],
}


def run(cmd: list[str]) -> str:
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
    return proc.stdout


def stage(module: str, *args) -> str:
    """`python -m MODULE ARGS` (paths as text) in the repository; its stdout."""
    return run([PYTHON, "-m", module, *(str(a) for a in args)])


def trained_with(workdir: Path, config: Path, sets: list[str]):
    """The TrainConfig the model of the training workdir `workdir` saved (model/config.yaml) when it is
    what `config` with the `--set` items `sets` trains (every setting of the file as it is now and every
    item hold in it), else None: no finished training there, or one of other settings (a lever, or the
    file edited since)."""
    from common import config as configlib
    from models.training.config import TrainConfig

    saved_path = workdir / "model" / "config.yaml"
    if not saved_path.is_file() or not (workdir / "train_summary.json").is_file():
        return None
    saved = configlib.load(TrainConfig, saved_path)
    return saved if configlib.load(TrainConfig, config, sets, base=saved) == saved else None


def copy_decoder(source: Path, out: Path) -> Path:
    """`source` (an LM or lang dir) as a directory of this model's own: models.tune_lm writes the model's
    decoding.json into it (by rename, so hard links to the large files are safe). The source's own
    decoding.json is left out: each model's settings are chosen afresh."""
    if not source.is_dir():
        raise FileNotFoundError(
            f"{source}: missing: the demo run has no {source.name}/ (a run of a phone model has both)"
        )
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    for path in source.iterdir():
        if path.is_file() and path.name != "decoding.json":
            try:
                os.link(path, out / path.name)
            except OSError:  # another file system
                shutil.copy2(path, out / path.name)
    return out


def demo_model(run_dir: Path, workdir: Path) -> Path:
    """The demo run's acoustic model copied into `workdir` without its attached LM, so attaching this
    benchmark's leaves the demo run as it was."""
    shutil.rmtree(workdir, ignore_errors=True)
    shutil.copytree(run_dir / "asr" / "model", workdir / "model", ignore=shutil.ignore_patterns("lm", ".lm.partial"))
    for name in ("config.yaml", "train_summary.json"):
        shutil.copy2(run_dir / "asr" / name, workdir / name)
    return workdir


def model_of(arm: str, seed: int, recipe: dict, run_dir: Path, work: Path) -> tuple[Path, str, dict]:
    """(workdir, where its model came from, its train_summary.json) of one arm's seed: the demo run's
    own model where it is this arm and seed (`recipe["demo"]`), one trained before in `work` with the
    same settings, else trained here on the run's shards."""
    workdir = work / f"{arm}-seed{seed}"
    sets = [f"asr.targets={arm}", f"seed={seed}", *recipe["sets"]]
    if (arm, seed) == recipe["demo"]:
        source = "the demo run"
        demo_model(run_dir, workdir)
    elif trained_with(workdir, recipe["config"], sets):
        source = "trained here (read back from --work)"
    else:
        source = "trained here"
        env = {"MLFLOW_TRACKING_URI": f"sqlite:///{work / 'mlflow.db'}"}
        run_training(
            run_dir / "shards", workdir, recipe["np"], recipe["config"], sets, env_extra=env, timeout=RUN_TIMEOUT_S
        )
    print(f"  {arm} seed {seed}: {source}")
    return workdir, source, json.loads((workdir / "train_summary.json").read_text())


def decode(arm: str, workdir: Path, shards: Path, decoder: Path, splits: list[str], grid: list[str]) -> dict:
    """Tunes the model's LM (`decoder`, its own copy) on models.tune_lm's dev split over `grid` (its
    flags), attaches it, and evaluates every split with it: the chosen settings and each split's figures."""
    model = ["--model", workdir, "--shards", shards]
    stage("models.tune_lm", *model, "--lm", decoder, *grid, "--attach", "--no-progress")
    out = workdir.with_name(f"{workdir.name}-eval")
    split_args = [a for s in splits for a in ("--split", s)]
    stage("models.evaluate", *model, *split_args, "--out-dir", out, "--no-mlflow")
    metrics = json.loads((out / "eval.json").read_text())
    decoding = json.loads((decoder / "decoding.json").read_text())
    return {
        "tuned": {**decoding["settings"], "on": decoding["chosen_on"]["split"]},
        "grid": decoding["chosen_on"]["grid"],
        "splits": {s: {k: metrics.get(f"{s}_{k}") for k in (*FIGURES[arm], *COUNTS)} for s in splits},
    }


def arm_runs(arm: str, seeds: list[int], recipe: dict, run_dir: Path, work: Path, splits: list[str]) -> dict:
    """One arm: each seed's model, its tuned settings and figures per split, and per split the mean
    of each figure over the seeds (None where a seed lacks it)."""
    runs = {}
    for seed in seeds:
        workdir, source, trained = model_of(arm, seed, recipe, run_dir, work)
        decoder = copy_decoder(run_dir / DECODER[arm], work / f"{arm}-seed{seed}-{DECODER[arm]}")
        runs[str(seed)] = {
            "source": source,
            "steps": trained["steps"],
            **decode(arm, workdir, run_dir / "shards", decoder, splits, recipe["grid"][arm]),
        }
    mean = {}
    for split in splits:
        values = {k: [r["splits"][split][k] for r in runs.values()] for k in (*FIGURES[arm], *COUNTS)}
        mean[split] = {k: statistics.fmean(v) if None not in v else None for k, v in values.items()}
    return {"seeds": seeds, "decoder": DECODER[arm], "runs": runs, "mean": mean}


def tiny_run(work: Path) -> Path:
    """A demo run's layout from synthetic shards (`work`/shards, lm_text, dict, lm, lang): the shards
    with phone targets from an espeak-ng lexicon of the training sentences (each word's likeliest
    pronunciation), and the word LM of those sentences with its decoding graph."""
    synthetic = work / "synthetic"
    synthetic_shards(synthetic, 48, mean_frames=150, dim=13, num_shards=2, test_utterances=8, dev_utterances=8)
    text = work / "lm_text" / "lm_text.txt"
    text.parent.mkdir(parents=True, exist_ok=True)
    transcripts = (synthetic / "data" / "train" / "text").read_text().splitlines()
    text.write_text("".join(line.split(" ", 1)[1] + "\n" for line in transcripts))
    dict_dir, shards, lm_dir = work / "dict", work / "shards", work / "lm"
    stage("pipeline.text_lexicon", "--text", text, "--out", dict_dir, "--no-progress")
    # the shard stage again, with phone targets: in this process, where synthetic_shards loaded TensorFlow
    from pipeline import shards as shard_stage

    config = shard_stage.ShardConfig(num_shards=2, phones_from=str(dict_dir), phone_source="lexicon")
    splits = {s: synthetic / "data" / s for s in ("train", "dev", "test")}
    shard_stage.make_shards(splits, shards, config, progress=False)
    stage("pipeline.lm", "--text-file", text, "--vocabulary-from", shards, "--out", lm_dir)
    stage("pipeline.lang", "--dict", dict_dir, "--arpa", lm_dir / "lm.arpa", "--out", work / "lang")
    return work


def recipe_of(tiny: bool, run_dir: Path) -> dict:
    """How the arms train: the config, the ranks, the `--set` items beside each arm's targets and seed,
    the tune grids' flags, and which arm and seed the demo run's own model is (None: neither; the
    demo trains a phone model: `asr.targets: phones`)."""
    if tiny:
        sets = [NO_COPIES, *TINY_STEPS, "log_model=false"]
        return {"config": TINY_ASR, "np": 1, "sets": sets, "grid": TINY_GRID, "demo": None}
    demo = None
    for arm in ARMS:
        saved = trained_with(run_dir / "asr", DEMO_ASR, [f"asr.targets={arm}"])
        demo = (arm, saved.seed) if saved else demo
    if demo is None:
        print(f"{run_dir / 'asr'}: not what {DEMO_ASR.name} trains as it is now: every seed is trained here")
    grid = {arm: [] for arm in ARMS}  # models.tune_lm's default grids
    return {"config": DEMO_ASR, "np": 2, "sets": ["log_model=false"], "grid": grid, "demo": demo}


def decoders(run_dir: Path) -> dict:
    """What the arms' LMs are: the n-gram's text, order and n-grams (lm/lm.json), the graph's words,
    states, arcs and bytes (lang/lang.json)."""
    lm_record = json.loads((run_dir / "lm" / "lm.json").read_text())
    graph = json.loads((run_dir / "lang" / "lang.json").read_text())
    text = {k: lm_record["text"][k] for k in ("sentences", "words", "vocabulary_size", "sha256")}
    return {
        "lm": {"order": lm_record["order"], "ngrams": lm_record["arpa"]["ngrams"], "text": text},
        "graph": {"words": graph["words"], **{k: graph["hlg"][k] for k in ("states", "arcs", "bytes")}},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--demo-run", type=Path, help="a finished demo run's directory")
    parser.add_argument("--seeds", help="training seeds, comma-separated (default 0,1; --tiny: 0)")
    parser.add_argument("--json", type=Path)
    parser.add_argument(
        "--work", type=Path, help="where the models, LM copies and evaluations go (default: a temporary one)"
    )
    parser.add_argument("--tiny", action="store_true")
    args = parser.parse_args(argv)
    work = (args.work or Path(tempfile.mkdtemp(prefix="targets-"))).resolve()
    work.mkdir(parents=True, exist_ok=True)
    if args.tiny:
        run_dir = tiny_run(work / "run")
    elif args.demo_run:
        run_dir = args.demo_run.resolve()
    else:
        parser.error("give --demo-run DIR (or --tiny)")
    from pipeline.records import open_shard_set

    seeds = [int(s) for s in (args.seeds or ("0" if args.tiny else "0,1")).split(",")]
    recipe = recipe_of(args.tiny, run_dir)
    splits = [s for s in SPLITS if s in open_shard_set(run_dir / "shards").splits]
    arms = {arm: arm_runs(arm, seeds, recipe, run_dir, work, splits) for arm in ARMS}
    summary = json.loads((run_dir / "summary.json").read_text()) if (run_dir / "summary.json").is_file() else {}
    results = {
        "demo_run": summary.get("dag_run_id"),
        "config": recipe["config"].relative_to(ROOT).as_posix(),
        "overrides": recipe["sets"],
        "np": recipe["np"],
        # the demo run's own model: which arm and seed it stands for (null: every model was trained here)
        "demo_model": recipe["demo"] and {"arm": recipe["demo"][0], "seed": recipe["demo"][1]},
        "splits": splits,
        "arms": arms,
        **decoders(run_dir),
    }
    record = write_json(args.json, results, {"training": seeds, "synthetic_shards" if args.tiny else "demo_corpus": 0})
    print("\n".join(report_recognition.targets(record)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
