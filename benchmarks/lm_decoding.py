"""Decoding with a word LM: greedy, beam search and beam search with the LM, side by side on every
split of a demo run, for an LM of the corpus' training text and one of general text.

    python benchmarks/lm_decoding.py --demo-run DIR [--json out.json] [--orders 3] [--work DIR] [--tiny]

DIR is a finished demo run (`benchmarks/demo.py --keep WORK` leaves it under WORK/pipeline/): its
acoustic model `asr/`, its `shards/` and its corpus `corpus/`. Each condition runs the real stages:
`pipeline.lm` builds the n-gram, `models.tune_lm` chooses its weight and word bonus on a dev split
(never a test split: `dev_engine`, new sentences in the held-out voices, where the run has it, else
`dev`, as the DAG does), and `models.evaluate --lm` scores every split with greedy decoding, beam search
and beam search with the LM from one forward pass. The conditions:

- `corpus`: the training split's transcripts (the DAG's default LM text);
- `general`: open English the corpus did not use: WordNet's example sentences (pipeline/open_text.py)
  less every sentence of every split of the run, so no test sentence is in it.

Beside each LM figure: the split's share of words the LM never saw and the share of its word
3-grams the LM's text had (models/asr/lm.py `coverage`). `--tiny` (the tests): a small general text and a
grid of two points; without `--demo-run`, on a tiny acoustic model trained for a few steps on synthetic shards.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import report_recognition  # noqa: E402
from benchmarks.harness import NO_COPIES, PYTHON, ROOT, run_training, synthetic_shards, write_json  # noqa: E402

SPLITS = ("dev", "test", "test_noisy", "test_engine")
FIGURES = ("cer", "wer", "cer_beam", "wer_beam", "cer_lm", "wer_lm", "oov_rate", "lm_oov_rate", "lm_3gram_hit")


def run(cmd: list[str]) -> str:
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
    return proc.stdout


def general_text(corpus: Path, vocabulary: list[str], out: Path, limit: int | None = None) -> Path:
    """WordNet's example sentences (normalized as the corpus normalizes them) that no split of the
    corpus holds, in the words the model can spell, one a line (the first `limit` of WordNet's, for --tiny)."""
    from pipeline import open_text

    used = set()
    for text in corpus.glob("*/text"):
        used |= {line.split(" ", 1)[1].strip() for line in text.read_text().splitlines() if " " in line}
    pool, _ = open_text.sentence_pool(open_text.wordnet_examples()[:limit], 1, 1000)
    alphabet = {ch for ch in vocabulary if len(ch) == 1}
    # a word the model cannot spell is dropped (none, for a model of open English: --tiny's has a few letters)
    spellable = (" ".join(w for w in s.split() if set(w) <= alphabet) for s in pool if s not in used)
    kept = [s for s in spellable if len(s.split()) > 1]
    out.write_text("".join(s + "\n" for s in kept), encoding="utf-8")
    return out


def condition(name: str, source: list[str], order: int, asr: Path, shards: Path, work: Path, splits, grid) -> dict:
    """Builds the LM of `source` (pipeline.lm's text flags), tunes it on models.tune_lm's dev split over
    `grid` (its flags), evaluates every split."""
    lm_dir = work / f"lm-{name}-o{order}"
    lm_flags = [*source, "--vocabulary-from", str(asr), "--out", str(lm_dir), "--set", f"order={order}"]
    run([PYTHON, "-m", "pipeline.lm", *lm_flags])
    model = ["--model", str(asr), "--shards", str(shards)]
    run([PYTHON, "-m", "models.tune_lm", *model, "--lm", str(lm_dir), *grid, "--no-progress"])
    out = work / f"eval-{name}-o{order}"
    split_args = [a for s in splits for a in ("--split", s)]
    run(
        [
            PYTHON,
            "-m",
            "models.evaluate",
            *model,
            *split_args,
            "--lm",
            str(lm_dir),
            "--out-dir",
            str(out),
            "--no-mlflow",
        ]
    )
    metrics = json.loads((out / "eval.json").read_text())
    record = json.loads((lm_dir / "lm.json").read_text())
    decoding = json.loads((lm_dir / "decoding.json").read_text())
    per_split = {}
    for split in splits:
        figures = {k: metrics.get(f"{split}_{k}") for k in FIGURES}
        figures["wer_lm_over_beam"] = figures["wer_lm"] / figures["wer_beam"] if figures["wer_beam"] else None
        per_split[split] = figures
    return {
        "text": name,
        "order": order,
        "sentences": record["text"]["sentences"],
        "vocabulary_size": record["text"]["vocabulary_size"],
        "text_sha256": record["text"]["sha256"],
        "chosen": {**decoding["settings"], "on": decoding["chosen_on"]["split"]},
        "grid": decoding["chosen_on"]["grid"],
        "splits": per_split,
    }


def tiny_run(work: Path) -> Path:
    """A demo run's layout from synthetic shards and a tiny acoustic model of a few steps."""
    shards = synthetic_shards(work, 48, mean_frames=150, dim=13, num_shards=2, test_utterances=8, dev_utterances=8)
    items = [NO_COPIES, "max_steps=4", "checkpoint_every=100000", "log_every=100000", "log_model=false", "epochs=1000"]
    env = {"MLFLOW_TRACKING_URI": f"sqlite:///{work / 'mlflow.db'}"}
    run_training(shards, work / "asr", 1, ROOT / "tests/configs/tiny_asr.yaml", items, env_extra=env)
    (work / "corpus").symlink_to(work / "data")
    return work


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--demo-run", type=Path, help="a finished demo run's directory")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--orders", default="3", help="n-gram orders, comma-separated")
    parser.add_argument("--texts", default="corpus,general", help="LM texts: corpus, general")
    parser.add_argument("--work", type=Path, help="where the LMs and evaluations go (default: a temporary one)")
    parser.add_argument("--tiny", action="store_true")
    args = parser.parse_args(argv)
    work = (args.work or Path(tempfile.mkdtemp(prefix="lm-decoding-"))).resolve()
    work.mkdir(parents=True, exist_ok=True)
    if args.demo_run:
        run_dir = args.demo_run.resolve()
    elif args.tiny:
        run_dir = tiny_run(work / "run")
    else:
        parser.error("give --demo-run DIR (or --tiny)")
    asr, shards, corpus = run_dir / "asr", run_dir / "shards", run_dir / "corpus"
    from pipeline.records import open_shard_set
    from pipeline.text import load_vocabulary

    splits = [s for s in SPLITS if s in open_shard_set(shards).splits]
    vocabulary = load_vocabulary(asr)["vocabulary"]
    general = general_text(corpus, vocabulary, work / "general.txt", 3000 if args.tiny else None)
    sources = {"corpus": ["--data", str(corpus / "train")], "general": ["--text-file", str(general)]}
    # --tiny: two points, where the test checks that the grid's choice reaches the evaluation
    grid = ["--weights", "0,0.5", "--word-bonuses", "1"] if args.tiny else []
    conditions = {}
    for name in args.texts.split(","):
        for order in (int(o) for o in args.orders.split(",")):
            conditions[f"{name}_o{order}"] = condition(name, sources[name], order, asr, shards, work, splits, grid)
    summary = json.loads((run_dir / "summary.json").read_text()) if (run_dir / "summary.json").is_file() else {}
    results = {"demo_run": summary.get("dag_run_id"), "splits": splits, "conditions": conditions}
    record = write_json(args.json, results, {"demo_corpus": 0, "training": [0]})
    print("\n".join(report_recognition.lm_decoding(record)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
