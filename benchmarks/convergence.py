"""Does gossip train as well as allreduce? The same number of training samples for each, then test CER.

    python benchmarks/convergence.py [--json out.json] [--tiny] [--shards DIR] [--epochs E]

Trains the acoustic model with `horovodrun -np 2` under allreduce and under each gossip variant
(fixed ring, random ring, delay-by-one) for the same number of epochs (so the same number of
training samples), evaluates each on the test split (voices never heard in training) and
compares CER. Goal from the research: every variant within 10% relative of allreduce. Without
--shards it builds the demo corpus first (espeak-ng + sox, fbank, shards).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.harness import PYTHON, ROOT, print_table, run_training, synthetic_shards, write_json  # noqa: E402

VARIANTS = {
    "allreduce": ["--strategy", "allreduce"],
    "fixed-ring": ["--strategy", "adpsgd", "--gossip", "fixed-ring"],
    "random-ring": ["--strategy", "adpsgd", "--gossip", "random-ring"],
    "delay-by-one": ["--strategy", "adpsgd", "--gossip", "delay-by-one"],
}


def demo_shards(work: Path, utterances: int) -> Path:
    """The demo corpus through the real stages: corpus -> features -> shards."""
    data = work / "data"
    subprocess.run(
        [PYTHON, "-m", "pipeline.corpus", "--out", str(data), "--num-utterances", str(utterances)],
        cwd=ROOT,
        check=True,
        capture_output=True,
    )
    for split in ("train", "dev", "test"):
        subprocess.run(
            [PYTHON, "-m", "pipeline.features", "--data-dir", str(data / split), "--no-progress"],
            cwd=ROOT,
            check=True,
            capture_output=True,
        )
    out = work / "shards"
    subprocess.run(
        [
            PYTHON,
            "-m",
            "pipeline.shards",
            "--split",
            f"train={data / 'train'}",
            "--split",
            f"dev={data / 'dev'}",
            "--split",
            f"test={data / 'test'}",
            "--out",
            str(out),
            "--no-progress",
        ],
        cwd=ROOT,
        check=True,
        capture_output=True,
    )
    return out


def evaluate(workdir: Path, shards: Path) -> dict:
    subprocess.run(
        [
            PYTHON,
            "-m",
            "models.evaluate",
            "--model-dir",
            str(workdir),
            "--shards",
            str(shards),
            "--split",
            "test",
            "--no-mlflow",
            "--beam-width",
            "4",
        ],
        cwd=ROOT,
        check=True,
        capture_output=True,
    )
    return json.loads((workdir / "eval.json").read_text())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path)
    parser.add_argument("--tiny", action="store_true")
    parser.add_argument(
        "--shards", type=Path, help="shards with train and test splits (default: build the demo corpus)"
    )
    parser.add_argument("--epochs", type=int, default=15)
    parser.add_argument("--utterances", type=int, default=1500, help="demo corpus size when building it")
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="convergence-"))
    if args.tiny:
        config, epochs = ROOT / "tests/configs/tiny_asr.yaml", 2
        shards = args.shards or synthetic_shards(work, 48, mean_frames=60, dim=13, num_shards=4, test_utterances=8)
    else:
        config, epochs = ROOT / "configs/demo_asr.yaml", args.epochs
        shards = args.shards or demo_shards(work, args.utterances)
    results: dict = {"tiny": args.tiny, "epochs": epochs}
    rows = []
    for name, flags in VARIANTS.items():
        summary = run_training(
            shards, work / name, 2, config, [f"epochs={epochs}", "max_steps=0", "log_model=false"], extra_args=flags
        )
        metrics = evaluate(work / name, shards)
        results[f"{name}_cer"] = metrics["test_cer"]
        results[f"{name}_wer"] = metrics["test_wer"]
        results[f"{name}_steps"] = summary["steps"]
        results[f"{name}_train_seconds"] = summary.get("measured_seconds", 0.0)
        results[f"{name}_final_loss"] = summary["final_loss"]
    base = results["allreduce_cer"]
    for name in VARIANTS:
        results[f"{name}_relative_to_allreduce"] = (results[f"{name}_cer"] - base) / base if base else 0.0
        rows.append(
            [
                name,
                results[f"{name}_steps"],
                results[f"{name}_final_loss"],
                results[f"{name}_cer"],
                results[f"{name}_wer"],
                results[f"{name}_relative_to_allreduce"],
            ]
        )
    results["all_within_10_percent"] = all(
        abs(results[f"{n}_relative_to_allreduce"]) <= 0.10 or results[f"{n}_cer"] <= base for n in VARIANTS
    )
    print_table(["strategy", "steps", "final loss", "test CER", "test WER", "CER vs allreduce"], rows)
    write_json(args.json, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
