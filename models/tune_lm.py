"""Choosing a word LM's decoding settings: `python -m models.tune_lm --model W --shards S --lm DIR`.

A small grid of the LM's weight and word bonus (models/asr/lm.py `LmDecoding`), each point decoding
one split of the shards with the acoustic model's output (its forward pass run once): the point with
the lowest WER is written to `DIR/decoding.json` with the split, the model and the whole grid, and
every later decoder of that LM (models.evaluate --lm, models.transcribe --lm) uses it. `--attach` then
copies the LM with those settings into the model's directory (models/asr/lm.py `attach`), where every
command that opens the model finds it, and the model logged to MLflow carries it. The split is one for choosing decoding settings: `dev_engine` (sentences of their own in the
held-out speakers' voices) where the shards have it, else `dev`; never a test split. A re-run for the
same weights, LM, split and grid does nothing (the DAG's task is retried and cleared like any stage).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from common import cli, fsutil

TEST_SPLITS = ("test", "test_noisy", "test_engine")


def _floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x.strip()]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m models.tune_lm", description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--model", required=True, help="the acoustic model: a training workdir, its model/ or a registry URI"
    )
    p.add_argument("--shards", required=True, type=Path, help="directory with manifest.json and the shards")
    p.add_argument("--lm", required=True, type=Path, help="the LM's directory (python -m pipeline.lm)")
    p.add_argument("--split", help="the split the settings are chosen on (default: dev_engine, else dev)")
    p.add_argument("--weights", default="0.2,0.35,0.5,0.75,1.0", help="LM weights to try, comma-separated")
    p.add_argument("--word-bonuses", default="0,0.5,1,2", help="word bonuses to try, comma-separated")
    p.add_argument("--beam-width", type=int, default=32, help="the beam search's width")
    p.add_argument(
        "--attach",
        action="store_true",
        help="then copy the LM with its chosen settings into the model's directory (model/lm/): every command "
        "that opens the model, the registered and served one too, decodes with it",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    args = p.parse_args(argv)
    return cli.run(lambda: _main(args))


def _main(args: argparse.Namespace) -> None:
    from common import catalog
    from common.runtime import configure_tensorflow
    from models import opening
    from models.asr import lm
    from models.asr import network as asr
    from models.asr.task import AsrTask
    from models.evaluate import check_vocabulary, split_batches
    from pipeline.records import open_shard_set

    if args.split in TEST_SPLITS:
        raise ValueError(
            f"--split {args.split} is a test split: choose decoding settings on a dev split, never on test"
        )
    source = opening.locate(args.model)
    if args.attach and source.model_dir is None:
        raise ValueError(
            f"--attach needs a training workdir or its model/, not {args.model}: the registry's is read-only"
        )
    configure_tensorflow()
    model, config, data = opening.open_model(args.model)
    if config.model != "asr":
        raise ValueError(f"{args.model} is a {config.model} model; an LM decodes an acoustic model")
    shards = open_shard_set(args.shards)
    check_vocabulary(data, shards, args.model)
    split = args.split or ("dev_engine" if "dev_engine" in shards.splits else "dev")
    if split not in shards.splits:
        raise ValueError(f"{args.shards} has no split {split!r} (it has {', '.join(shards.splits)})")
    record = lm.record_of(args.lm)  # a broken LM fails here, before the forward pass
    asked = {
        "split": split,
        "weights": _floats(args.weights),
        "word_bonuses": _floats(args.word_bonuses),
        "beam_width": args.beam_width,
        "lm_sha256": record["arpa"]["sha256"],
        "model_sha256": _weights_sha256(source.model_dir),
    }
    done = fsutil.read_json(args.lm / lm.DECODING) or {}
    if source.model_dir is not None and done.get("chosen_on", {}).get("asked") == asked:
        best = lm.settings_of(args.lm)
        print(
            f"up to date: chosen on {split}: weight {best.weight}, word bonus {best.word_bonus} ({args.lm / lm.DECODING})"
        )
        if args.attach:
            print(f"attached to the model: {lm.attach(args.lm, source.model_dir)}")
        return
    vocabulary = data["vocabulary"]
    task = catalog.task_class("asr").create(config, shards, None)
    references, log_probs = [], []
    for batch in split_batches(task, config, shards, split, 40000):
        logits, lengths = asr.forward(model, AsrTask.features(batch), batch["feat_lengths"])
        log_probs += lm.log_probs_of(logits, lengths)
        tokens, token_lengths = batch["tokens"].numpy(), batch["token_lengths"].numpy()
        references += ["".join(vocabulary[t] for t in tokens[i, : token_lengths[i]]) for i in range(len(tokens))]
    best, grid = lm.tune(
        references, log_probs, args.lm, vocabulary, _floats(args.weights), _floats(args.word_bonuses),
        args.beam_width, progress=not args.no_progress,
    )  # fmt: skip
    chosen_on = {"split": split, "utterances": len(references), "model": str(args.model), "grid": grid, "asked": asked}
    lm.write_decoding(args.lm, best, chosen_on)
    for point in grid:
        print(
            f"weight {point['weight']:<5} word bonus {point['word_bonus']:<4} WER {100 * point['wer']:6.2f}%  CER {100 * point['cer']:6.2f}%"
        )
    print(f"chosen on {split}: weight {best.weight}, word bonus {best.word_bonus} -> {args.lm / lm.DECODING}")
    if args.attach:
        print(f"attached to the model: {lm.attach(args.lm, source.model_dir)}")


def _weights_sha256(model_dir: Path | None) -> str | None:
    """The trained weights' fingerprint (a model directory's checkpoint files); None for a registry URI."""
    if model_dir is None:
        return None
    return fsutil.fingerprint_files(sorted(Path(model_dir).glob("ckpt-*")))


if __name__ == "__main__":
    sys.exit(main())
