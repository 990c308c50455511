"""What each part of the synthesis model's speech costs a listener (inference only, minutes): dev
sentences spoken with the alignment search's own durations, with them plus noise, with the predicted
durations, and the predicted speech through the vocoder a user gets (models/tts/diagnosis.py).

    python benchmarks/tts_durations.py --demo-run DIR [--model W [--model W2 ...]] [--split dev]
                                       [--max-utterances 100] [--json out.json]

DIR is a finished demo run (`benchmarks/demo.py --keep WORK` leaves it under WORK/pipeline/): its
`shards/`, its acoustic model `asr/` as the listener (as in benchmarks/tts_seeds.py) and its synthesis
model `tts/`, or the ones `--model` names (any form `models.evaluate --model` takes: a tts_seeds seed's
workdir). With several models (one per training seed: the demo run's `tts/` and tts_seeds' other seeds),
each arm's figure is their mean and each model's is kept beside it: one seed is not the model's figure.
Prints each arm's CER and WER and how the predicted durations differ from the searched ones.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import report_tts  # noqa: E402
from benchmarks.harness import write_json  # noqa: E402


def diagnose(model_spec: str, shards_dir: Path, listener, split: str, max_utterances: int) -> dict:
    """The arms' CER and WER (models/tts/diagnosis.py) of `model_spec` on `split`, heard by `listener`
    (models/tts/evaluation.py's Listener)."""
    from common import catalog
    from models import trained_model
    from models.evaluate import check_vocabulary, split_batches
    from models.tts import diagnosis
    from models.tts.config import TtsEvalConfig
    from pipeline.records import open_shard_set

    model, config, data = trained_model.open_model(model_spec)
    if config.model != "tts" or config.settings.alignment != "durations":
        raise ValueError(f"{model_spec}: not a synthesis model with durations (alignment: durations)")
    shards = open_shard_set(shards_dir)
    check_vocabulary(data, shards, model_spec)
    cfg = TtsEvalConfig(max_utterances=max_utterances)
    task = catalog.task_class(config.model).create(config, shards, cfg)
    dataset = split_batches(task, config, shards, split, cfg.frames_per_batch)
    arms = diagnosis.speak_arms(model, config, data, dataset, max_utterances)
    rates = diagnosis.heard(arms, data["vocabulary"], listener)
    return {
        "split": split,
        "utterances": len(arms["voices"]),
        "arms": rates,
        "durations": arms["durations"],
        "training_seed": config.seed,
    }


def combine(runs: list[dict]) -> dict:
    """One figure per arm and per duration measure from several models' `diagnose` results: their mean,
    each model's kept under "models". The models must have heard the same sentences."""
    first = runs[0]
    for run in runs[1:]:
        if (run["split"], run["utterances"]) != (first["split"], first["utterances"]):
            raise ValueError(
                f"training seed {run['training_seed']} spoke {run['utterances']} {run['split']} sentences, seed "
                f"{first['training_seed']} {first['utterances']} {first['split']}: give every model the same shards"
            )
        if set(run["arms"]) != set(first["arms"]):
            raise ValueError(f"training seed {run['training_seed']}'s arms differ from seed {first['training_seed']}'s")
    arms = {
        name: {key: float(np.mean([run["arms"][name][key] for run in runs])) for key in ("cer", "wer")}
        for name in first["arms"]
    }
    durations = {key: float(np.mean([run["durations"][key] for run in runs])) for key in first["durations"]}
    return {
        "split": first["split"],
        "utterances": first["utterances"],
        "arms": arms,
        "durations": durations,
        "models": runs,
        "training_seeds": [run["training_seed"] for run in runs],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--demo-run", type=Path, required=True, help="a finished demo run's directory")
    parser.add_argument(
        "--model",
        action="append",
        help="a synthesis model, once per training seed (default: the demo run's tts/)",
    )
    parser.add_argument("--split", default="dev")
    parser.add_argument("--max-utterances", type=int, default=100, help="sentences (the DAG's evaluation default)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    from common.runtime import configure_tensorflow

    configure_tensorflow()
    from models.tts.evaluation import Listener

    run_dir = args.demo_run.resolve()
    summary = json.loads((run_dir / "summary.json").read_text())
    specs = args.model or [str(run_dir / "tts")]
    listener = Listener(str(run_dir / "asr"))
    runs = []
    for n, spec in enumerate(specs, 1):
        print(f"model {n} of {len(specs)}: {spec}", file=sys.stderr, flush=True)
        run = diagnose(spec, run_dir / "shards", listener, args.split, args.max_utterances)
        run["source"] = "the demo run" if args.model is None or Path(spec).resolve() == run_dir / "tts" else "--model"
        runs.append(run)
    results = combine(runs)
    results["listener_test_cer"] = summary["models"].get("asr", {}).get("metrics", {}).get("test_cer")
    record = write_json(args.json, results, {"demo_corpus": 0, "training": results["training_seeds"]})
    print("\n".join(report_tts.tts_durations(record)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
