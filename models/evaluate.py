"""Evaluation: `python -m models.evaluate --model W --shards OUT [--split test]`.

The entry point: it opens the trained model (`--model`: a training workdir, its `model/` or a
registry URI, as every command names a model: models/trained_model.py), builds each split's input, and
runs the model's evaluation (models/asr/evaluation.py, models/tts/evaluation.py), then logs to MLflow.

Acoustic model: CER and WER with greedy and beam-search decoding (and with `--lm DIR`, beam search
with that word language model: models/asr/lm.py), and a file of hypotheses next to the references,
for the test split and, when the shards have them, the noisy test and the test in an engine's voices
never heard in training (test_engine); for a phone model, the phone error rate greedy and by beam
search, and WER and CER of its words through its decoding graph (models/asr/phone_evaluation.py).
Synthesis model: mel L1 (teacher-forced) and filterbank cepstral distance (free-running,
DTW-aligned) against the references, attention plots and a monotonicity measure,
predicted-versus-reference mel plots, Griffin-Lim audio for a few sentences, and intelligibility: an
acoustic model (`--asr-model`, named in any of the same forms) transcribes the synthesized mels and
we report its CER. Everything goes to `W/eval.json`, `W/eval/` (or `--out-dir`, which a registry URI needs), and the
MLflow run that trained the model.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from common import catalog, cli
from common import config as configlib
from common.fsutil import atomic_write_json
from pipeline.records import ShardSet


def _options_class(config) -> type | None:
    return catalog.eval_settings_class(config.model) if config.model else None


@dataclasses.dataclass(frozen=True)
class EvalConfig:
    """What `models.evaluate` evaluates: the splits every model shares, and beside them the
    evaluated model's own options (its catalog entry's `eval_settings`: `beam_width` for the
    acoustic model, `max_utterances`, `voice`, ... for synthesis)."""

    model: str = ""  # the evaluated model, which chooses `options` (set from the model itself)
    # empty: the model's own (common/catalog.py `eval_splits`: dev, test, and test_noisy and test_engine
    # for the acoustic model), of those the shards have
    splits: tuple[str, ...] = ()
    options: Any = configlib.registered_field(_options_class)  # the model's own options, beside `splits`

    def __post_init__(self):
        configlib.fill_registered(self)


def eval_config(model: str, yaml_path=None, assignments=(), flags=None) -> EvalConfig:
    """The EvalConfig of model `model` from the dataclass defaults, a YAML file, `--set` items and flags."""
    return configlib.load(EvalConfig, yaml_path, assignments, base=EvalConfig(model=model), flags=flags)


def output_dir(model: str | Path, out_dir: Path | None = None) -> Path:
    """Where the evaluation of `model` writes eval.json and eval/: `out_dir`, or else the training
    workdir the model was named by (a workdir or its model/); a registry URI needs `out_dir`."""
    from models import trained_model

    if out_dir is not None:
        return Path(out_dir)
    source = trained_model.locate(model)
    if source.workdir is None:
        raise ValueError(f"{model} is not in a training workdir: say where the evaluation goes with --out-dir DIR")
    return source.workdir


def evaluate(
    model: str | Path,
    shards: Path,
    cfg: EvalConfig | Callable[[str], EvalConfig] = EvalConfig(),
    asr_model: str | Path | None = None,
    out_dir: Path | None = None,
) -> dict:
    """Evaluates the trained `model` (any form models/trained_model.py opens) on `cfg.splits` of
    `shards` with its model's evaluation (common/catalog.py `ModelEntry.evaluation`) and options
    (`cfg.options`; `cfg` may be a function of the model's name that loads them, or an EvalConfig
    without a model: its options' defaults). Writes `eval.json` and `eval/` (hypotheses, plots,
    audio) into `output_dir(model, out_dir)`; returns the metrics."""
    from models import trained_model
    from pipeline.records import open_shard_set

    root = output_dir(model, out_dir)
    model_spec = model
    model, config, data = trained_model.open_model(model_spec)
    shards = open_shard_set(shards)
    check_vocabulary(data, shards, model_spec)
    cfg = cfg(config.model) if callable(cfg) else cfg
    if not cfg.model:
        cfg = dataclasses.replace(cfg, model=config.model)
    elif cfg.model != config.model:
        raise ValueError(
            f"the evaluation options are model {cfg.model!r}'s, but {model_spec} is a {config.model!r} model"
        )
    entry = catalog.model(config.model)
    splits = list(cfg.splits) or [s for s in entry.eval_splits if s in shards.splits]
    out_dir = root / "eval"
    out_dir.mkdir(parents=True, exist_ok=True)
    task = catalog.task_class(config.model).create(config, shards, cfg.options)

    def batches(split: str, frames_per_batch: int):
        return split_batches(task, config, shards, split, frames_per_batch)

    listener = asr_model if entry.listener else None  # a model whose output is heard
    metrics = {"model": config.model}
    evaluation = catalog.resolve(entry.evaluation)
    metrics.update(evaluation(model, config, data, batches, splits, cfg.options, out_dir, listener))
    atomic_write_json(root / "eval.json", metrics)
    return metrics


def split_batches(task, config, shards: ShardSet, split: str, frames_per_batch: int):
    """`split` of `shards` as `task` (the model's Task) reads it for evaluation: in order, unshuffled,
    in batches of about `frames_per_batch` padded frames."""
    evaluation = dataclasses.replace(
        config.input, frames_per_batch=frames_per_batch, max_batch_size=64, shuffle_buffer=1
    )
    return task.dataset(shards, split, evaluation, 0, 1, 0, False)[0]


def check_vocabulary(data: dict, shards: ShardSet, model_dir: str | Path) -> None:
    """ValueError with the fix when the shards' token ids do not mean the model's characters (or, for
    a model with phoneme input, its phonemes): the references would be decoded with the wrong
    characters (or as `<unk>`) and every CER be wrong, or the model would read other phonemes. For
    a phone model, the shards' phone targets must be of its output layer too (`check_phones`)."""
    check_phones(data, shards, model_dir)
    ours, theirs = list(data["vocabulary"]), list(shards.vocabulary)
    lowercase = bool(data.get("lowercase", True)), shards.lowercase
    phonemes = list(data.get("phoneme_vocabulary", []))
    if phonemes and phonemes != list(shards.phoneme_vocabulary):
        ours, theirs = phonemes, list(shards.phoneme_vocabulary)  # a model with phoneme input: its ids
    elif ours == theirs and lowercase[0] == lowercase[1]:
        return
    if ours == theirs:
        differs = f"the model was trained {'lower-cased' if lowercase[0] else 'with case kept'}, the shards are not"
    else:
        first = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), min(len(ours), len(theirs)))
        differs = (
            f"token {first} is {ours[first] if first < len(ours) else None!r} for the model and "
            f"{theirs[first] if first < len(theirs) else None!r} in the shards ({len(ours)} and {len(theirs)} "
            f"tokens; only the model's: {sorted(set(ours) - set(theirs))}, only the shards': "
            f"{sorted(set(theirs) - set(ours))})"
        )
    raise ValueError(
        f"the shards in {shards.root} were not made with the vocabulary of the model in {model_dir}: {differs}. "
        f"Make them again with it: `python -m pipeline.shards ... --vocabulary-from {model_dir} --out DIR`"
    )


def check_phones(data: dict, shards: ShardSet, model_dir: str | Path) -> None:
    """ValueError with the fix when the model is a phone model (data.json `targets: phones`) and the
    shards hold no phone targets, or phone ids of another table than its output layer (`outputs`):
    its phone error rate would be scored against other phones."""
    if data.get("targets") != "phones" or list(shards.phone_vocabulary) == list(data["outputs"]):
        return
    theirs, ours = list(shards.phone_vocabulary), list(data["outputs"])
    if not theirs:
        differs = f"hold no phone targets, which the phone model in {model_dir} is scored against"
    else:
        differs = (
            f"hold phone ids of another table than the output layer of the phone model in {model_dir} "
            f"({len(theirs)} and {len(ours)} ids; only the shards': {sorted(set(theirs) - set(ours))}, "
            f"only the model's: {sorted(set(ours) - set(theirs))})"
        )
    raise ValueError(
        f"the shards in {shards.root} {differs}: make them again with its phones and lexicon: "
        f"`python -m pipeline.shards ... --vocabulary-from {model_dir} --out DIR`"
    )


def log_to_mlflow(model_dir: Path, metrics: dict, parent_run_id: str | None) -> str | None:
    """Logs metrics to the training run (when `model_dir`, where eval.json is, is the training
    workdir); with a parent (the DAG), also to an evaluation child run that holds the artifacts.
    Returns the run id that holds the artifacts."""
    from models.tracking import runs as tracking

    trained = tracking.load_run_file(model_dir)
    numbers = {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float))}
    import mlflow

    artifact_run = None
    if trained:
        with tracking.start_run(trained["experiment"], run_id=trained["run_id"]) as run:
            mlflow.log_metrics(numbers)
            mlflow.set_tag("speechflow.primary_metric", metrics["primary_metric"])
            if not parent_run_id:
                mlflow.log_artifacts(str(model_dir / "eval"), artifact_path="eval")
                mlflow.log_artifact(str(model_dir / "eval.json"))
                artifact_run = run.info.run_id
        experiment = trained["experiment"]
    else:
        experiment = "speechflow"
    if parent_run_id:
        stage = f"evaluate_{metrics['model']}"
        tags = {"speechflow.stage": stage, "speechflow.trained_run": (trained or {}).get("run_id", "")}
        # A retried evaluation logs into the child run of the first attempt instead of adding one.
        earlier = mlflow.search_runs(
            experiment_ids=[tracking.ensure_experiment(experiment)],
            output_format="list",
            filter_string=f"tags.mlflow.parentRunId = '{parent_run_id}' and tags.`speechflow.stage` = '{stage}'",
        )
        run_id = earlier[0].info.run_id if earlier else None
        with tracking.start_run(
            experiment, f"evaluate-{metrics['model']}", parent_run_id, run_id=run_id, tags=tags
        ) as run:
            mlflow.log_metrics(numbers)
            mlflow.log_artifacts(str(model_dir / "eval"), artifact_path="eval")
            mlflow.log_artifact(str(model_dir / "eval.json"))
            artifact_run = run.info.run_id
    return artifact_run


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m models.evaluate", description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--model",
        required=True,
        help="a training workdir (runs/asr), its model/ or a registry URI (models:/NAME@ALIAS)",
    )
    p.add_argument("--out-dir", type=Path, help="where eval.json and eval/ go (default: the model's training workdir)")
    p.add_argument("--shards", required=True, type=Path, help="directory with manifest.json and the shards")
    p.add_argument(
        "--split",
        action="append",
        default=[],
        help="split(s) to evaluate (default: dev and test, and test_noisy and test_engine for asr)",
    )
    p.add_argument(
        "--asr-model",
        help="tts: the acoustic model that listens, for intelligibility (any form --model takes)",
    )
    p.add_argument("--beam-width", type=int, help="asr: beam search width (default 16)")
    p.add_argument(
        "--lm",
        help="asr: a word LM's directory (python -m pipeline.lm): beam search with it is reported too; for a "
        "phone model a lang dir (python -m pipeline.lang) to spell its words through (default: the attached one)",
    )
    p.add_argument(
        "--no-lm", action="store_true", default=None, help="asr: no LM, not even the model's attached one (chars only)"
    )
    p.add_argument("--max-utterances", type=int, help="tts: utterances to synthesize (default 100)")
    p.add_argument("--num-audio", type=int, help="tts: sentences to render as audio with Griffin-Lim (default 3)")
    p.add_argument(
        "--voice",
        help="tts: speak every sentence in this training voice (default: see models/tts/config.py TtsEvalConfig.voice)",
    )
    cli.add_config_arguments(p, "EvalConfig")
    p.add_argument("--mlflow-parent-run-id", help="also log to a child run of this MLflow run (the DAG's)")
    p.add_argument("--no-mlflow", action="store_true", help="only write eval.json")
    args = p.parse_args(argv)
    return cli.run(lambda: _main(args))


def _main(args: argparse.Namespace) -> None:
    from common.runtime import configure_tensorflow

    configure_tensorflow()
    flags = {
        "splits": list(args.split) or None,
        "beam_width": args.beam_width,
        "lm": args.lm,
        "no_lm": args.no_lm,
        "max_utterances": args.max_utterances,
        "num_audio": args.num_audio,
        "voice": args.voice,
    }
    root = output_dir(args.model, args.out_dir)
    # The options are the evaluated model's own: read once its name is known (a flag of another model's
    # option is refused, as any unknown key is).
    cfg = functools.partial(eval_config, yaml_path=args.config, assignments=args.set, flags=flags)
    metrics = evaluate(args.model, args.shards, cfg, args.asr_model, root)
    if not args.no_mlflow:
        metrics["mlflow_run_id"] = log_to_mlflow(root, metrics, args.mlflow_parent_run_id)
        atomic_write_json(root / "eval.json", metrics)
    print(json.dumps(metrics, sort_keys=True))


if __name__ == "__main__":
    sys.exit(main())
