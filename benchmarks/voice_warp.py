"""How much of the acoustic model's error on voices it never heard is vocal-tract length (inference
only, a minute): every utterance of a split heard with its mel axis warped by one factor
(pipeline/frontend.py `vtlp`, the training step's perturbation, with the factor fixed), for a range
of factors, the greedy CER of each voice.

    python benchmarks/voice_warp.py --demo-run DIR [--model W] [--splits test,test_engine]
                                    [--warps 0.8,0.85,0.9,0.95,1.0,1.05,1.1,1.15,1.2]
                                    [--max-utterances N] [--json out.json]

DIR is a finished demo run (`benchmarks/demo.py --keep WORK` leaves it under WORK/pipeline/): its
`shards/`, its corpus' `utt2voice` (each utterance's engine and voice) and its acoustic model `asr/`,
or the one `--model` names (any form `models.evaluate --model` takes). A warp `a` makes what sounded at
f Hz sound at a * f: below 1 it lowers a voice's formants. At 1.0 the figures are the evaluation's.
A voice whose CER falls far at some warp has formants that training did not cover; what is left at
its best warp is not a matter of vocal-tract length.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import report_recognition  # noqa: E402
from benchmarks.harness import write_json  # noqa: E402

WARPS = (0.8, 0.85, 0.9, 0.95, 1.0, 1.05, 1.1, 1.15, 1.2)


def voices_of(corpus: Path, split: str) -> dict[str, str]:
    """utt_id -> "engine:voice" from the corpus' `SPLIT/utt2voice` ({} when it has none)."""
    from pipeline.kaldi import read_optional_table

    table = read_optional_table(corpus / split / "utt2voice")
    return dict(table.values) if table else {}


def open_listener(model_spec: str, shards_dir: Path):
    """(model, its config, its data.json, the shards, the evaluation task and config) of an acoustic model."""
    from common import catalog
    from common.runtime import configure_tensorflow
    from models import trained_model
    from models.asr.config import AsrEvalConfig
    from models.evaluate import check_vocabulary
    from pipeline.records import open_shard_set

    configure_tensorflow()
    model, config, data = trained_model.open_model(model_spec)
    if config.model != "asr":
        raise ValueError(f"{model_spec}: not an acoustic model (model: {config.model})")
    shards = open_shard_set(shards_dir)
    check_vocabulary(data, shards, model_spec)
    cfg = AsrEvalConfig()
    task = catalog.task_class("asr").create(config, shards, cfg)
    return model, config, data, shards, task, cfg


def heard_at(forward, batches: list, warp: float, voices: dict, vocabulary: list, limit: int) -> dict:
    """voice -> (references, greedy hypotheses) of the batches' utterances, their mel axis warped by `warp`."""
    import tensorflow as tf

    from models.asr import network as asr
    from models.asr.task import AsrTask
    from pipeline import frontend, text

    pairs = defaultdict(lambda: ([], []))  # voice -> (references, hypotheses)
    heard = 0
    for batch in batches:
        feats = AsrTask.features(batch)  # [B, T, D] normalized as the evaluation reads them
        if warp != 1.0:
            feats = frontend.vtlp(feats, (warp, warp), tf.zeros([2], tf.int64))
        logits, lengths = forward(feats, batch["feat_lengths"])
        hypotheses = asr.greedy_decode(logits.numpy(), lengths.numpy())
        tokens, token_lengths = batch["tokens"].numpy(), batch["token_lengths"].numpy()
        for i, utt in enumerate(batch["utt_id"].numpy()):
            if limit and heard >= limit:
                break
            utt, heard = utt.decode(), heard + 1
            # a corpus without utt2voice: the speaker is the id without its number
            references, hyps = pairs[voices.get(utt, utt.rsplit("-", 1)[0])]
            references.append("".join(vocabulary[t] for t in tokens[i, : token_lengths[i]]))
            hyps.append(text.decode(hypotheses[i], vocabulary))
    return pairs


def split_rates(per_warp: list[dict]) -> dict:
    """A split's voices (their utterances and CER at each warp) and the whole split's CER at each warp."""
    from models.asr.scoring import error_rates

    names = sorted(per_warp[0])
    voices = {
        name: {"utterances": len(per_warp[0][name][0]), "cer": [error_rates(*pairs[name])["cer"] for pairs in per_warp]}
        for name in names
    }
    every = [
        error_rates([r for name in names for r in pairs[name][0]], [h for name in names for h in pairs[name][1]])["cer"]
        for pairs in per_warp
    ]
    return {"voices": voices, "all": every}


def sweep(model_spec: str, shards_dir: Path, corpus: Path, splits: list[str], warps: list[float], limit: int) -> dict:
    """Per split: each voice's utterances and its greedy CER at each of `warps` (and the split's)."""
    from models.asr import network as asr
    from models.evaluate import split_batches

    model, config, data, shards, task, cfg = open_listener(model_spec, shards_dir)
    forward = asr.compiled(model)
    results = {}
    for split in splits:
        voices = voices_of(corpus, split)
        batches = list(split_batches(task, config, shards, split, cfg.frames_per_batch))
        per_warp = [heard_at(forward, batches, warp, voices, data["vocabulary"], limit) for warp in warps]
        results[split] = split_rates(per_warp)
    return {"warps": list(warps), "splits": results, "training_seed": config.seed}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--demo-run", type=Path, required=True, help="a finished demo run's directory")
    parser.add_argument("--model", help="the acoustic model (default: the demo run's asr/)")
    parser.add_argument("--splits", default="test,test_engine", help="splits of the run's shards, comma-separated")
    parser.add_argument("--warps", default=",".join(map(str, WARPS)), help="warp factors, comma-separated")
    parser.add_argument("--max-utterances", type=int, default=0, help="utterances per split (default: all)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    run_dir = args.demo_run.resolve()
    warps = [float(w) for w in args.warps.split(",")]
    if 1.0 not in warps:
        warps.append(1.0)  # the evaluation's own figure, beside the warped ones
    splits = [s for s in args.splits.split(",") if s]
    model = args.model or str(run_dir / "asr")
    results = sweep(model, run_dir / "shards", run_dir / "corpus", splits, sorted(warps), args.max_utterances)
    results["model"] = "the demo run's" if args.model is None else "--model"
    summary = json.loads((run_dir / "summary.json").read_text())
    results["evaluation_cer"] = {
        split: summary["models"].get("asr", {}).get("metrics", {}).get(f"{split}_cer") for split in splits
    }
    record = write_json(args.json, results, {"demo_corpus": 0, "training": results["training_seed"]})
    print("\n".join(report_recognition.voice_warp(record)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
