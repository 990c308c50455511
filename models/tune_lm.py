"""Choosing a word LM's decoding settings: `python -m models.tune_lm --model W --shards S --lm DIR`.

A small grid, each point decoding one split of the shards with the acoustic model's output (its
forward pass run once): for a char model and an n-gram's directory, of the LM's weight and word bonus
(models/asr/lm.py `LmDecoding`); for a phone model and a lang dir (pipeline/lang.py), of the graph's
acoustic scale and word penalty (models/asr/hlg.py `HlgDecoding`), the words through the graph scored
against the transcripts' words. The point with the lowest WER is written to `DIR/decoding.json` with
the split, the model and the whole grid, and every later decoder of that LM (models.evaluate --lm,
models.transcribe --lm) uses it. `--attach` then copies the LM with those settings into the model's
directory (models/asr/lm.py `attach`), where every command that opens the model finds it, and the
model logged to MLflow carries it. The split is one for choosing decoding settings: `dev_engine`
(sentences of their own in the held-out speakers' voices) where the shards have it, else `dev`; never
a test split. A re-run for the same weights, LM, split and grid does nothing (the DAG's task is
retried and cleared like any stage).
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
    p.add_argument(
        "--lm",
        required=True,
        type=Path,
        help="a char model's word LM directory (python -m pipeline.lm), or a phone model's lang dir (python -m "
        "pipeline.lang)",
    )
    p.add_argument("--split", help="the split the settings are chosen on (default: dev_engine, else dev)")
    p.add_argument("--weights", default="0.2,0.35,0.5,0.75,1.0", help="word LM: weights to try, comma-separated")
    p.add_argument("--word-bonuses", default="0,0.5,1,2", help="word LM: word bonuses to try, comma-separated")
    p.add_argument("--beam-width", type=int, default=32, help="word LM: the beam search's width")
    p.add_argument(
        "--acoustic-scales", default="0.6,0.7,0.85,1.0", help="lang dir: acoustic scales to try, comma-separated"
    )
    p.add_argument(
        "--word-penalties",
        default="-2,-1,0",
        help="lang dir: word insertion penalties to try, comma-separated (positive: fewer words)",
    )
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
    from models.asr import lm

    if args.split in TEST_SPLITS:
        raise ValueError(
            f"--split {args.split} is a test split: choose decoding settings on a dev split, never on test"
        )
    source, model, config, data, shards, split = _open(args)
    lm.check_kind(data, args.lm)  # an LM of the other kind is named here, before the forward pass
    graph = lm.is_graph(args.lm)
    asked = _asked(args, split, source.model_dir, graph)  # a broken LM fails here too
    done = fsutil.read_json(args.lm / lm.DECODING) or {}
    if source.model_dir is not None and done.get("chosen_on", {}).get("asked") == asked:
        print(f"up to date: chosen on {split}: {_settings_text(lm.settings_of(args.lm))} ({args.lm / lm.DECODING})")
    else:
        decoder = _graph_decoder(args.lm, data) if graph else None
        references, log_probs = _forward(model, config, shards, split, data["vocabulary"])
        if graph:
            best, grid = _tune_graph(args, references, log_probs, decoder)
        else:
            best, grid = _tune_ngram(args, references, log_probs, data["vocabulary"])
        chosen_on = {"split": split, "utterances": len(references), "model": str(args.model), "grid": grid}
        lm.write_decoding(args.lm, best, {**chosen_on, "asked": asked})
        for point in grid:
            print(_point_text(point))
        print(f"chosen on {split}: {_settings_text(best)} -> {args.lm / lm.DECODING}")
    if args.attach:
        print(f"attached to the model: {lm.attach(args.lm, source.model_dir)}")


def _open(args: argparse.Namespace):
    """(source, model, config, data, shards, split) of the command line's model and shards, each
    checked: an acoustic model, shards of its vocabulary, a split they have."""
    from common.runtime import configure_tensorflow
    from models import trained_model
    from models.evaluate import check_vocabulary
    from pipeline.records import open_shard_set

    source = trained_model.locate(args.model)
    if args.attach and source.model_dir is None:
        raise ValueError(
            f"--attach needs a training workdir or its model/, not {args.model}: the registry's is read-only"
        )
    configure_tensorflow()
    model, config, data = trained_model.open_model(args.model)
    if config.model != "asr":
        raise ValueError(f"{args.model} is a {config.model} model; an LM decodes an acoustic model")
    shards = open_shard_set(args.shards)
    check_vocabulary(data, shards, args.model)
    split = args.split or ("dev_engine" if "dev_engine" in shards.splits else "dev")
    if split not in shards.splits:
        raise ValueError(f"{args.shards} has no split {split!r} (it has {', '.join(shards.splits)})")
    return source, model, config, data, shards, split


def _asked(args: argparse.Namespace, split: str, model_dir: Path | None, graph: bool) -> dict:
    """What a grid is asked for (decoding.json keeps it: the same again is up to date), the LM's
    record checked on the way."""
    from models.asr import hlg, lm

    if graph:
        return {
            "split": split,
            "acoustic_scales": _floats(args.acoustic_scales),
            "word_penalties": _floats(args.word_penalties),
            "graph_sha256": hlg.graph_record(args.lm)["hlg"]["sha256"],
            "model_sha256": _weights_sha256(model_dir),
        }
    return {
        "split": split,
        "weights": _floats(args.weights),
        "word_bonuses": _floats(args.word_bonuses),
        "beam_width": args.beam_width,
        "lm_sha256": lm.record_of(args.lm)["arpa"]["sha256"],
        "model_sha256": _weights_sha256(model_dir),
    }


def _graph_decoder(lang_dir: Path, data: dict):
    """The lang dir's graph for the model's outputs (refused when they differ), at the default settings
    the grid starts from."""
    from models.asr import hlg

    return hlg.GraphDecoder(lang_dir, data["outputs"], hlg.HlgDecoding())


def _forward(model, config, shards, split: str, vocabulary: list[str]) -> tuple[list[str], list]:
    """The split's references (its transcripts' words) and the model's log-posteriors of each
    utterance [T', outputs]: the forward pass, once for the whole grid."""
    from common import catalog
    from models.asr import lm
    from models.asr import network as asr
    from models.asr.task import AsrTask
    from models.evaluate import split_batches

    task = catalog.task_class("asr").create(config, shards, None)
    references, log_probs = [], []
    for batch in split_batches(task, config, shards, split, 40000):
        logits, lengths = asr.forward(model, AsrTask.features(batch), batch["feat_lengths"])
        log_probs += lm.log_probs_of(logits, lengths)
        tokens, token_lengths = batch["tokens"].numpy(), batch["token_lengths"].numpy()
        references += ["".join(vocabulary[t] for t in tokens[i, : token_lengths[i]]) for i in range(len(tokens))]
    return references, log_probs


def _tune_ngram(args: argparse.Namespace, references: list[str], log_probs: list, vocabulary: list[str]):
    from models.asr import lm

    weights, bonuses = _floats(args.weights), _floats(args.word_bonuses)
    return lm.tune(references, log_probs, args.lm, vocabulary, weights, bonuses, args.beam_width, not args.no_progress)


def _tune_graph(args: argparse.Namespace, references: list[str], log_probs: list, decoder):
    from models.asr import hlg

    scales, penalties = _floats(args.acoustic_scales), _floats(args.word_penalties)
    return hlg.tune(references, log_probs, decoder, scales, penalties, progress=not args.no_progress)


def _settings_text(settings) -> str:
    """The chosen settings of either kind of LM, as the command prints them."""
    if hasattr(settings, "acoustic_scale"):
        return f"acoustic scale {settings.acoustic_scale}, word penalty {settings.word_penalty}"
    return f"weight {settings.weight}, word bonus {settings.word_bonus}"


def _point_text(point: dict) -> str:
    """One line of the printed grid."""
    rates = f"WER {100 * point['wer']:6.2f}%  CER {100 * point['cer']:6.2f}%"
    if "acoustic_scale" in point:
        return f"acoustic scale {point['acoustic_scale']:<5} word penalty {point['word_penalty']:<4} {rates}"
    return f"weight {point['weight']:<5} word bonus {point['word_bonus']:<4} {rates}"


def _weights_sha256(model_dir: Path | None) -> str | None:
    """The trained weights' fingerprint (a model directory's checkpoint files); None for a registry URI."""
    if model_dir is None:
        return None
    return fsutil.fingerprint_files(sorted(Path(model_dir).glob("ckpt-*")))


if __name__ == "__main__":
    sys.exit(main())
