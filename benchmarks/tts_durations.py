"""What each part of the synthesis model's speech costs a listener (inference only, minutes): dev
sentences spoken with the alignment search's own durations, with them plus noise, with the predicted
durations, and the predicted speech through the vocoder a user gets (models/tts/diagnosis.py).

    python benchmarks/tts_durations.py --demo-run DIR [--model W] [--split dev] [--max-utterances 100]
                                       [--json out.json]

DIR is a finished demo run (`benchmarks/demo.py --keep WORK` leaves it under WORK/pipeline/): its
`shards/`, its acoustic model `asr/` as the listener (as in benchmarks/tts_seeds.py) and its synthesis
model `tts/`, or the one `--model` names (any form `models.evaluate --model` takes: a tts_seeds seed's
workdir). Prints each arm's CER and WER and how the predicted durations differ from the searched ones.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.harness import print_table, write_json  # noqa: E402
from benchmarks.report_tts import DURATION_ARMS  # noqa: E402


def diagnose(model_spec: str, shards_dir: Path, listener_spec: str, split: str, max_utterances: int) -> dict:
    """The arms' CER and WER (models/tts/diagnosis.py) of `model_spec` on `split`, heard by `listener_spec`."""
    from common import catalog
    from common.runtime import configure_tensorflow
    from models import opening
    from models.evaluate import check_vocabulary, split_batches
    from models.tts import diagnosis
    from models.tts.config import TtsEvalConfig
    from models.tts.evaluation import Listener
    from pipeline.records import open_shard_set

    configure_tensorflow()
    model, config, data = opening.open_model(model_spec)
    if config.model != "tts" or config.settings.alignment != "durations":
        raise ValueError(f"{model_spec}: not a synthesis model with durations (alignment: durations)")
    shards = open_shard_set(shards_dir)
    check_vocabulary(data, shards, model_spec)
    cfg = TtsEvalConfig(max_utterances=max_utterances)
    task = catalog.task_class(config.model).create(config, shards, cfg)
    dataset = split_batches(task, config, shards, split, cfg.frames_per_batch)
    arms = diagnosis.speak_arms(model, config, data, dataset, max_utterances)
    rates = diagnosis.heard(arms, data["vocabulary"], Listener(listener_spec))
    return {
        "split": split,
        "utterances": len(arms["voices"]),
        "arms": rates,
        "durations": arms["durations"],
        "training_seed": config.seed,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--demo-run", type=Path, required=True, help="a finished demo run's directory")
    parser.add_argument("--model", help="the synthesis model (default: the demo run's tts/)")
    parser.add_argument("--split", default="dev")
    parser.add_argument("--max-utterances", type=int, default=100, help="sentences (the DAG's evaluation default)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    run_dir = args.demo_run.resolve()
    summary = json.loads((run_dir / "summary.json").read_text())
    model = args.model or str(run_dir / "tts")
    results = diagnose(model, run_dir / "shards", str(run_dir / "asr"), args.split, args.max_utterances)
    results["model"] = "the demo run's" if args.model is None else "--model"
    results["listener_test_cer"] = summary["models"].get("asr", {}).get("metrics", {}).get("test_cer")
    print_table(
        ["arm", f"{args.split} CER", f"{args.split} WER", "what"],
        [[name, r["cer"], r["wer"], DURATION_ARMS.get(name, "")] for name, r in results["arms"].items()],
    )
    print_table(["predicted against searched durations", "value"], [[k, v] for k, v in results["durations"].items()])
    write_json(args.json, results, {"demo_corpus": 0, "training": results["training_seed"]})
    return 0


if __name__ == "__main__":
    sys.exit(main())
