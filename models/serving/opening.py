"""One way to name and open a trained model, for every command that reads one (`models.evaluate`,
`models.transcribe`, `models.synthesize`, `models.registry`, the pyfunc server).

A trained model is named in one of three forms, the same for every command:
  - a training workdir (`runs/asr`: what `models.train --workdir` wrote; its model is `model/`),
  - that workdir's model directory (`runs/asr/model`: config.yaml, data.json, ckpt-*.npz),
  - a registry URI as MLflow names it, `models:/NAME@ALIAS` (the champion:
    `models:/speechflow-asr@champion`), `models:/NAME/VERSION` or `runs:/RUN/PATH`.
`locate` says which (a workdir is known for the first two only); `open_model` opens any of them to
what serving runs: the Keras model with its trained weights, the TrainConfig and the data record
(vocabulary, feature settings, voices).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

FORMS = "a training workdir (runs/asr), its model directory (runs/asr/model) or a registry URI such as models:/speechflow-asr@champion"


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
    from models.serving import pyfunc as serving

    source = locate(spec)
    if source.uri is None:
        return serving.load_model_dir(source.model_dir)
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
