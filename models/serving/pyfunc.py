"""The MLflow pyfunc model that serves a trained model directory, and its logging to MLflow.

Generic: `SpeechModel` opens the model directory (models/trained_model.py `load_model_dir`), reads the
operator's limits from the environment (models/serving/request_policy.py `ServingConfig`) and hands every
request to its model's server, which it finds only through the catalog (common/catalog.py
`ModelEntry.server`, `catalog.resolve`); the server says what a request holds and what the answer
is: models/asr/server.py (audio in, text out), models/tts/server.py (text in, WAV audio and
log-mels out). The signature and input example of a logged model are its server's too.

A model directory (`WORKDIR/model`) holds the weights (`ckpt-*.npz`), the resolved `config.yaml`
and `data.json` (vocabulary, feature dimension, the training split's mel statistics, and the
feature stage's `FeatureConfig` under `features`). Training logs it at its end (TrainConfig
`log_model`, through common/catalog.py `PYFUNC_LOGGER`, so the trainer imports no serving code).
"""

from __future__ import annotations

import warnings
from pathlib import Path

import mlflow

from models.serving.request_policy import ServingConfig
from models.trained_model import load_model_dir


class SpeechModel(mlflow.pyfunc.PythonModel):
    """The pyfunc model of a model directory; what it accepts is set by the operator's environment
    (models/serving/request_policy.py). What it answers is its model's server (common/catalog.py
    `ModelEntry.server`: models/asr/server.py, models/tts/server.py)."""

    def load_context(self, context):
        self.settings = ServingConfig.from_env()
        self.model, self.config, self.data = load_model_dir(context.artifacts["model_dir"])
        self.server = server_class(self.config)(self.model, self.config, self.data)

    def predict(self, context, model_input, params=None):
        return self.server.predict(model_input, params or {}, self.settings)


def server_class(config):
    """The server of the model `config` (a TrainConfig) trained."""
    from common import catalog

    return catalog.resolve(catalog.model(config.model).server)


def signature(config, data: dict):
    """Inputs, outputs and params of the served model; the time axes are free."""
    return server_class(config).signature(config, data)


def input_example(config, data: dict) -> dict:
    """A small valid request."""
    return server_class(config).example(config, data)


def log_model(model_dir: Path, config, data: dict, name: str = "model"):
    """Logs the model directory as an MLflow pyfunc model with its signature and an input example."""
    root = Path(__file__).resolve().parents[2]
    import kaldi_native_fbank
    import keras
    import scipy
    import soundfile
    import tensorflow as tf

    requirements = [
        f"tensorflow-cpu=={tf.__version__}",
        f"keras=={keras.__version__}",
        f"kaldi-native-fbank=={kaldi_native_fbank.__version__}",
        f"soundfile=={soundfile.__version__}",
        f"scipy=={scipy.__version__}",
        "numpy<2",
        "pyyaml",
    ]
    requirements += attached_lm_requirements(Path(model_dir))
    # A phone model logged by its training run has no graph yet (models.tune_lm attaches it and the
    # registry logs the model again): no example request MLflow could answer, which it would try.
    no_words_yet = data.get("targets") == "phones" and not (Path(model_dir) / "lm" / "lang.json").is_file()
    with warnings.catch_warnings():
        # MLflow suggests typed predict() signatures; ours is given explicitly (`signature` above).
        warnings.filterwarnings("ignore", message=".*type hint.*")
        return mlflow.pyfunc.log_model(
            name=name,
            python_model=SpeechModel(),
            artifacts={"model_dir": str(model_dir)},
            code_paths=[str(root / "common"), str(root / "models"), str(root / "pipeline")],
            signature=signature(config, data),
            input_example=None if no_words_yet else input_example(config, data),
            pip_requirements=requirements,
        )


def attached_lm_requirements(model_dir: Path) -> list[str]:
    """The pip requirements of the LM attached to a model directory (models/asr/lm.py `attach`), at the
    versions installed here: kenlm and pyctcdecode for a word n-gram (lm/lm.json), kaldifst and
    kaldi_decoder for a phone model's decoding graph (lm/lang.json); none without one."""
    from importlib.metadata import version

    if (model_dir / "lm" / "lm.json").is_file():
        return [f"kenlm=={version('kenlm')}", f"pyctcdecode=={version('pyctcdecode')}"]
    if (model_dir / "lm" / "lang.json").is_file():
        return [f"kaldifst=={version('kaldifst')}", f"kaldi_decoder=={version('kaldi_decoder')}"]
    return []
