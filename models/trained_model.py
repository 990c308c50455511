"""A trained model named and opened, one way for every command that reads one (`models.evaluate`,
`models.transcribe`, `models.synthesize`, `models.tune_lm`, the pyfunc server), and the feature
settings a model directory records.

It lives here, beside the model packages and below the serving layer (models/serving/), because
evaluation, transcription and synthesis open models too: they import this module, never serving,
and the served pyfunc model opens its directory with the same `load_model_dir`.

A trained model is named in one of three forms, the same for every command:
  - a training workdir (`runs/asr`: what `models.train --workdir` wrote; its model is `model/`),
  - that workdir's model directory (`runs/asr/model`: config.yaml, data.json, ckpt-*.npz),
  - a registry URI as MLflow names it, `models:/NAME@ALIAS` (the champion:
    `models:/speechflow-asr@champion`), `models:/NAME/VERSION` or `runs:/RUN/PATH`.
`locate` says which (a workdir is known for the first two only); `open_model` opens any of them to
what serving runs: the Keras model with its trained weights, the TrainConfig and the data record
(`data.json`: vocabulary, feature dimension, the training split's mel statistics, voices, and the
feature stage's FeatureConfig under `features`: pipeline/features.py `recorded_config` gives it at
training, `feature_config` reads it back).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from types import SimpleNamespace

from common import config as configlib
from models.training import checkpoint

FORMS = (
    "a training workdir (runs/asr), its model directory (runs/asr/model) "
    "or a registry URI such as models:/speechflow-asr@champion"
)


@dataclasses.dataclass(frozen=True)
class ModelSource:
    """Where a named model is: `model_dir` (local, holds config.yaml) or `uri` (the registry's)."""

    spec: str
    model_dir: Path | None = None
    workdir: Path | None = None  # the training workdir, when the spec names one or its model/
    uri: str | None = None


def locate(spec: str | Path) -> ModelSource:
    """Which of the three forms `spec` is (see the module docstring); FileNotFoundError naming the
    forms when a path is neither a workdir with a model nor a model directory."""
    text = str(spec)
    if text.startswith(("models:/", "runs:/")):
        return ModelSource(text, uri=text)
    path = Path(text)
    if (path / "model" / "config.yaml").is_file():
        return ModelSource(text, model_dir=path / "model", workdir=path)
    if (path / "config.yaml").is_file() and (path / "data.json").is_file():
        # A model directory; a training wrote it as WORKDIR/model, beside mlflow_run.json and eval.json.
        workdir = path.parent if path.name == "model" else None
        return ModelSource(text, model_dir=path, workdir=workdir)
    raise FileNotFoundError(f"{path} holds no trained model (no config.yaml, nor model/config.yaml): give {FORMS}")


def open_model(spec: str | Path):
    """(model, TrainConfig, data dict) of a model named in any of the three forms."""
    source = locate(spec)
    if source.uri is None:
        return load_model_dir(source.model_dir)
    import mlflow

    try:
        loaded = mlflow.pyfunc.load_model(source.uri)
    except mlflow.exceptions.MlflowException as err:
        raise ValueError(
            f"cannot load {source.uri} from the MLflow store at {mlflow.get_tracking_uri()}: {err.message} "
            "(set MLFLOW_TRACKING_URI to the store that registered it; `make demo` registers champions)"
        ) from err
    python_model = loaded.unwrap_python_model()
    return python_model.model, python_model.config, python_model.data


def load_model_dir(model_dir: Path):
    """Returns (model, TrainConfig, data dict) with the trained weights in place."""
    from common import catalog
    from models.training.config import TrainConfig

    model_dir = Path(model_dir)
    weights = checkpoint.latest(model_dir)
    if weights is None or not (model_dir / "config.yaml").is_file():
        raise FileNotFoundError(f"{model_dir} holds no trained model (config.yaml and ckpt-*.npz); train first")
    config = configlib.load(TrainConfig, model_dir / "config.yaml")
    data = json.loads((model_dir / "data.json").read_text())
    # What a task reads of a shard set, as the model recorded it (no splits: its voices are its own).
    sizes = SimpleNamespace(
        root=None,
        feature_dim=data["feature_dim"],
        vocabulary=data["vocabulary"],
        phonemes=data.get("phonemes", ""),
        phoneme_vocabulary=data.get("phoneme_vocabulary", []),
        # a phone model's output layer (<blk> and the phones) and the lexicon they came from
        phone_vocabulary=tuple(data["outputs"]) if data.get("targets") == "phones" else (),
        phones=data.get("phones", {}),
        num_targets=0,
        splits={},
    )
    task = catalog.task_class(config.model).create(config, sizes)
    model = task.build()
    checkpoint.restore(weights, model.weights, owners=(model.name,))
    data["model_dir"] = str(model_dir)  # what errors about the model name (models/asr/lm.py `choose`)
    # an attached word LM: an n-gram's (lm.json) or a lang dir's graph (lang.json; models/asr/lm.py `attach`)
    if any((model_dir / "lm" / record).is_file() for record in ("lm.json", "lang.json")):
        data["lm_dir"] = str(model_dir / "lm")
    return model, config, data


def feature_config(data: dict):
    """The FeatureConfig that made the training features, from a model's `data.json`; a model whose
    features Kaldi made (`features: null`) cannot take audio (ValueError)."""
    from pipeline import features

    if data.get("features") is None:
        raise ValueError(
            "data.json records no feature-stage settings: the training features were made by Kaldi (or "
            "their data directory was not readable when the model was saved), so audio cannot be featurized "
            "as they were. Train on features from `python -m pipeline.features` to serve a model on audio"
        )
    known = {f.name for f in dataclasses.fields(features.FeatureConfig)}
    cfg = configlib.from_dict(features.FeatureConfig, {k: v for k, v in data["features"].items() if k in known})
    if cfg.num_mel_bins != data["feature_dim"]:
        raise ValueError(f"data.json: features has {cfg.num_mel_bins} mel bins, the model {data['feature_dim']}")
    return cfg
