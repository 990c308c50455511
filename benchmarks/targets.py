"""Characters against phones, and one lexicon's phones against another's: the demo's acoustic recipe
trained on each kind of CTC target, on the same audio, each decoded greedily and through its word LM, as
the mean of its seeds.

    python benchmarks/targets.py --demo-run DIR [--seeds 0,1] [--lexicons cmudict,espeak,espeak-stressed]
        [--json out.json] [--work DIR] [--tiny]

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
- `models.evaluate` of every split of dev, dev_engine, test, test_noisy and test_engine the shards
  have: chars greedy CER and WER, phones greedy PER, and the words through the LM (WER, CER), with the
  share of each split's words the LM (or the graph) lacks.

The phone arms are one per lexicon (`--lexicons`, LEXICONS): the demo run's own (its `dict/`, shards
and graph), and each other one built here from the run's LM text and corpus as the DAG builds its own
(workflow/commands.py): the lexicon stage, the shards of the run's data dirs with that lexicon's phone
targets, the word LM and the graph. Its stages' seconds and its graph's size stand beside its figures.

`--tiny`: synthetic shards with phone targets from an espeak-ng lexicon of their sentences, an LM and
a graph of those sentences, a CMUdict lexicon's arm built from them, and each arm trained for a few
steps of the tiny config, one seed (the tests).
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
import time
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
TARGETS = ("chars", "phones")
SPLITS = ("dev", "dev_engine", "test", "test_noisy", "test_engine")
# The phone arms' lexicons: the form's `lexicon` (workflow/commands.py LEXICON_MODULES) and whether stress is
# folded (the DAG folds it; "-stressed" keeps espeak-ng's stress marks as phones of their own).
LEXICONS = {"cmudict": ("cmudict", True), "espeak": ("espeak", True), "espeak-stressed": ("espeak", False)}
# How the shards take a lexicon's phone targets (as workflow/commands.py shards_args): espeak-ng's
# phonemes of the sentence in context, or each word's pronunciation with CMUdict's G2P for what it lacks.
PHONE_SOURCE = {"espeak": ["--phone-source", "espeak"], "cmudict": ["--phone-source", "lexicon", "--g2p"]}
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


def model_of(name: str, arm: dict, seed: int, recipe: dict, run_dir: Path, work: Path) -> tuple[Path, str, dict]:
    """(workdir, where its model came from, its train_summary.json) of arm `name`'s seed: the demo run's
    own model where it is this arm and seed (`recipe["demo"]`), one trained before in `work` with the
    same settings, else trained here on the arm's shards."""
    workdir = work / f"{name}-seed{seed}"
    sets = [f"asr.targets={arm['targets']}", f"seed={seed}", *recipe["sets"]]
    if (name, seed) == recipe["demo"]:
        source = "the demo run"
        demo_model(run_dir, workdir)
    elif trained_with(workdir, recipe["config"], sets):
        source = "trained here (read back from --work)"
    else:
        source = "trained here"
        env = {"MLFLOW_TRACKING_URI": f"sqlite:///{work / 'mlflow.db'}"}
        run_training(
            arm["dir"] / "shards", workdir, recipe["np"], recipe["config"], sets, env_extra=env, timeout=RUN_TIMEOUT_S
        )
    print(f"  {name} seed {seed}: {source}")
    return workdir, source, json.loads((workdir / "train_summary.json").read_text())


def decode(targets: str, workdir: Path, shards: Path, decoder: Path, splits: list[str], grid: list[str]) -> dict:
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
        "splits": {s: {k: metrics.get(f"{s}_{k}") for k in (*FIGURES[targets], *COUNTS)} for s in splits},
    }


def arm_runs(
    name: str, arm: dict, seeds: list[int], recipe: dict, run_dir: Path, work: Path, splits: list[str]
) -> dict:
    """One arm: each seed's model, its tuned settings and figures per split, and per split the mean
    of each figure over the seeds (None where a seed lacks it); a phone arm's lexicon too."""
    targets, runs = arm["targets"], {}
    for seed in seeds:
        workdir, source, trained = model_of(name, arm, seed, recipe, run_dir, work)
        decoder = copy_decoder(arm["dir"] / DECODER[targets], work / f"{name}-seed{seed}-{DECODER[targets]}")
        runs[str(seed)] = {
            "source": source,
            "steps": trained["steps"],
            **decode(targets, workdir, arm["dir"] / "shards", decoder, splits, recipe["grid"][targets]),
        }
    mean = {}
    for split in splits:
        values = {k: [r["splits"][split][k] for r in runs.values()] for k in (*FIGURES[targets], *COUNTS)}
        mean[split] = {k: statistics.fmean(v) if None not in v else None for k, v in values.items()}
    record = {"targets": targets, "seeds": seeds, "decoder": DECODER[targets], "runs": runs, "mean": mean}
    return {**record, "lexicon": arm["lexicon"]} if arm["lexicon"] else record


def lexicon_of(dict_dir: Path) -> str:
    """The LEXICONS-style name of the lexicon in `dict_dir` (its text_lexicon.json): CMUdict's or
    espeak-ng's, "-stressed" where stress is kept."""
    config = json.loads((dict_dir / "text_lexicon.json").read_text())["config"]
    kind = "cmudict" if config.get("g2p") == "cmudict" else "espeak"
    return kind if config["fold_stress"] else f"{kind}-stressed"


def lexicon_record(base: Path, source: str, seconds: dict) -> dict:
    """A phone arm's lexicon as the page shows it: where it was built, its phones and entries (its
    text_lexicon.json), each stage's seconds, and its graph's size (lang/lang.json)."""
    made = json.loads((base / "dict" / "text_lexicon.json").read_text())
    graph = json.loads((base / "lang" / "lang.json").read_text())
    return {
        "name": lexicon_of(base / "dict"),
        "source": source,
        "phones": made["phones"],
        "entries": made["entries"],
        "seconds": seconds,
        "graph": {"words": graph["words"], **{k: graph["hlg"][k] for k in ("states", "arcs", "bytes")}},
    }


def timed(seconds: dict, key: str, module: str, *args) -> None:
    """`stage(module, *args)`, its wall-clock seconds in `seconds[key]`."""
    started = time.perf_counter()
    stage(module, *args)
    seconds[key] = round(time.perf_counter() - started, 1)


def build_lexicon_arm(lexicon: str, run_dir: Path, work: Path) -> Path:
    """A phone arm of `lexicon` (LEXICONS) on the demo run's audio, as the DAG builds its own
    (workflow/commands.py lexicon_args, shards_args, lm_args, graph_args): the lexicon of the run's LM
    text, the shards of the data dirs the run's shards were made from with its phone targets, the word LM
    and the graph, under `work`/lexicon-NAME. One built before is read back (built.json: the seconds)."""
    from pipeline.records import open_shard_set
    from workflow import commands

    base = work / f"lexicon-{lexicon}"
    if (base / "built.json").is_file():
        return base
    shutil.rmtree(base, ignore_errors=True)
    kind, fold = LEXICONS[lexicon]
    text, dict_dir, seconds = run_dir / "lm_text" / commands.LM_TEXT_FILE, base / "dict", {}
    voice = json.loads((run_dir / "dict" / "text_lexicon.json").read_text())["config"]["voice"]
    sets = ["--set", f"voice={voice}", "--set", f"fold_stress={str(fold).lower()}"]
    progress = [] if kind == "cmudict" else ["--no-progress"]
    timed(seconds, "lexicon", commands.LEXICON_MODULES[kind], "--text", text, "--out", dict_dir, *sets, *progress)
    splits = open_shard_set(run_dir / "shards").splits
    corpus = [a for name, split in splits.items() for a in ("--split", f"{name}={split.data_dir}")]
    phones = ["--phonemes", voice, "--phones-from", dict_dir, *PHONE_SOURCE[kind]]
    shard_count = ["--num-shards", len(splits["train"].files), "--no-progress"]
    timed(seconds, "shards", "pipeline.shards", *corpus, *phones, "--out", base / "shards", *shard_count)
    timed(seconds, "lm", "pipeline.lm", "--text-file", text, "--lexicon", dict_dir, "--out", base / "lm")
    lm = base / "lm" / commands.ARPA_FILE
    timed(seconds, "graph", commands.LANG, "--dict", dict_dir, "--arpa", lm, "--out", base / "lang")
    (base / "built.json").write_text(json.dumps(seconds) + "\n")
    return base


def phone_arms(lexicons: list[str], run_dir: Path, work: Path) -> dict:
    """{arm name: arm} of the phone arms, one per lexicon: the demo run's own lexicon on its dict, shards
    and graph, each other one built here (build_lexicon_arm)."""
    own, arms = lexicon_of(run_dir / "dict"), {}
    summary = json.loads((run_dir / "summary.json").read_text()) if (run_dir / "summary.json").is_file() else {}
    stages = summary.get("stages", {})
    for lexicon in dict.fromkeys([own, *lexicons]):
        if lexicon == own:
            base, source = run_dir, "the demo run"
            seconds = {task: stages[task]["seconds"] for task in ("lexicon", "graph") if task in stages}
        else:
            print(f"  the {lexicon} lexicon: building its dict, shards, LM and graph")
            base, source = build_lexicon_arm(lexicon, run_dir, work), "built here"
            seconds = json.loads((base / "built.json").read_text())
        arms[f"phones-{lexicon}"] = {"targets": "phones", "dir": base, "lexicon": lexicon_record(base, source, seconds)}
    return arms


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


def demo_lexicon(arms: dict, run_dir: Path) -> str:
    """The phone arm of the lexicon the DAG's form picks by default (workflow/form.py `lexicon`, stress
    folded) when it is one of `arms`, else of the demo run's own lexicon."""
    from workflow import form

    default = f"phones-{form.with_defaults({})['lexicon']}"
    return default if default in arms else f"phones-{lexicon_of(run_dir / 'dict')}"


def recipe_of(tiny: bool, run_dir: Path) -> dict:
    """How the arms train: the config, the ranks, the `--set` items beside each arm's targets and seed,
    the tune grids' flags (per kind of target), and which arm and seed the demo run's own model is
    (None: neither; the demo trains a phone model of its lexicon: `asr.targets: phones`)."""
    if tiny:
        sets = [NO_COPIES, *TINY_STEPS, "log_model=false"]
        return {"config": TINY_ASR, "np": 1, "sets": sets, "grid": TINY_GRID, "demo": None}
    demo = None
    for targets in TARGETS:
        saved = trained_with(run_dir / "asr", DEMO_ASR, [f"asr.targets={targets}"])
        name = targets if targets == "chars" else f"phones-{lexicon_of(run_dir / 'dict')}"
        demo = (name, saved.seed) if saved else demo
    if demo is None:
        print(f"{run_dir / 'asr'}: not what {DEMO_ASR.name} trains as it is now: every seed is trained here")
    grid = {targets: [] for targets in TARGETS}  # models.tune_lm's default grids
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
    parser.add_argument(
        "--lexicons",
        default=",".join(LEXICONS),
        help=f"the phone arms' lexicons beside the demo run's own, comma-separated, of {', '.join(LEXICONS)} "
        "(default: all; --tiny: cmudict)",
    )
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
    lexicons = ["cmudict"] if args.tiny else args.lexicons.split(",")
    unknown = sorted(set(lexicons) - set(LEXICONS))
    if unknown:
        parser.error(f"--lexicons: no lexicon {', '.join(unknown)} (there are {', '.join(LEXICONS)})")
    plan = {"chars": {"targets": "chars", "dir": run_dir, "lexicon": None}, **phone_arms(lexicons, run_dir, work)}
    arms = {name: arm_runs(name, arm, seeds, recipe, run_dir, work, splits) for name, arm in plan.items()}
    summary = json.loads((run_dir / "summary.json").read_text()) if (run_dir / "summary.json").is_file() else {}
    results = {
        "demo_run": summary.get("dag_run_id"),
        "config": recipe["config"].relative_to(ROOT).as_posix(),
        "overrides": recipe["sets"],
        "np": recipe["np"],
        # the demo run's own model: which arm and seed it stands for (null: every model was trained here)
        "demo_model": recipe["demo"] and {"arm": recipe["demo"][0], "seed": recipe["demo"][1]},
        # the phone arm the first table sets against the characters: the DAG's default lexicon's
        "demo_lexicon": demo_lexicon(arms, run_dir),
        "splits": splits,
        "arms": arms,
        **decoders(run_dir),
    }
    record = write_json(args.json, results, {"training": seeds, "synthetic_shards" if args.tiny else "demo_corpus": 0})
    print("\n".join(report_recognition.targets(record)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
