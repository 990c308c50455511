"""Loading a trained model directory, and the MLflow pyfunc model that serves it.

A model directory (`WORKDIR/model`) holds the weights (`ckpt-*.npz`), the resolved `config.yaml`
and `data.json` (vocabulary, feature dimension, the synthesis model's mel normalization).
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import mlflow
import numpy as np

from common import config as configlib
from models import checkpoint
from pipeline import text


def load_model_dir(model_dir: Path):
    """Returns (model, TrainConfig, data dict) with the trained weights in place."""
    from models.tasks import make_task
    from models.train_config import TrainConfig

    model_dir = Path(model_dir)
    weights = checkpoint.latest(model_dir)
    if weights is None or not (model_dir / "config.yaml").is_file():
        raise FileNotFoundError(f"{model_dir} holds no trained model (config.yaml and ckpt-*.npz); train first")
    config = configlib.load(TrainConfig, model_dir / "config.yaml")
    data = json.loads((model_dir / "data.json").read_text())
    manifest_like = {
        "feature_dim": data["feature_dim"],
        "vocabulary": data["vocabulary"],
        "num_targets": config.asr.num_targets,
    }
    task = make_task(config.model, config.asr, config.tts, manifest_like)
    model = task.build()
    checkpoint.restore(weights, model.weights, owners=(model.name,))
    return model, config, data


def utterance_cmvn(feats: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Per-utterance mean/variance normalization [B, T, D], for speakers without statistics."""
    out = np.zeros_like(feats, dtype=np.float32)
    for i, n in enumerate(lengths):
        x = feats[i, :n]
        out[i, :n] = (x - x.mean(0)) / np.maximum(x.std(0), 1e-4)
    return out


class SpeechModel(mlflow.pyfunc.PythonModel):
    """ASR: {"feats": float32 [B, T, D] log-mel, "lengths": int32 [B]} -> transcripts (per-utterance CMVN).
    TTS: {"text": [str]} -> {"mels": float32 [B, T, D] log-mel, "lengths": int32 [B]}."""

    def load_context(self, context):
        self.model, self.config, self.data = load_model_dir(context.artifacts["model_dir"])

    def predict(self, context, model_input, params=None):
        from models import asr

        if self.config.model == "asr":
            feats = np.asarray(model_input["feats"], np.float32)
            lengths = np.asarray(model_input["lengths"], np.int32)
            logits, out_lengths = self.model(utterance_cmvn(feats, lengths), lengths)
            hyps = asr.greedy_decode(logits.numpy(), out_lengths.numpy())
            return [text.decode(h, self.data["vocabulary"]) for h in hyps]
        # MLflow hands the text column as a DataFrame; one cell may hold a whole list of sentences.
        texts = [
            t for cell in model_input["text"] for t in (cell if isinstance(cell, (list, tuple, np.ndarray)) else [cell])
        ]
        tokens, lengths = text.encode_batch(texts, self.data["vocabulary"], self.data.get("lowercase", True))
        out = self.model.infer(tokens, lengths, max_steps=int((params or {}).get("max_steps", 400)))
        mels = out["mels"].numpy() * np.asarray(self.data["mel_std"]) + np.asarray(self.data["mel_mean"])
        return {"mels": mels.astype(np.float32), "lengths": out["lengths"].numpy()}


def signature(config, data: dict):
    """Inputs and outputs with a free batch and time axis (inferring it from an example would fix them)."""
    from mlflow.models import ModelSignature
    from mlflow.types.schema import ColSpec, Schema, TensorSpec

    mels = TensorSpec(np.dtype(np.float32), (-1, -1, data["feature_dim"]), "mels" if config.model == "tts" else "feats")
    lengths = TensorSpec(np.dtype(np.int32), (-1,), "lengths")
    if config.model == "asr":
        return ModelSignature(inputs=Schema([mels, lengths]), outputs=Schema([ColSpec("string")]))
    return ModelSignature(inputs=Schema([ColSpec("string", "text")]), outputs=Schema([mels, lengths]))


def log_model(model_dir: Path, config, data: dict, name: str = "model"):
    """Logs the model directory as an MLflow pyfunc model with its signature and an input example."""
    root = Path(__file__).resolve().parents[1]
    if config.model == "asr":
        example = {"feats": np.zeros([1, 40, data["feature_dim"]], np.float32), "lengths": np.asarray([40], np.int32)}
    else:
        example = {"text": ["hello world"]}
    import keras
    import tensorflow as tf

    with warnings.catch_warnings():
        # MLflow suggests typed predict() signatures; ours is given explicitly (`signature` above).
        warnings.filterwarnings("ignore", message=".*type hint.*")
        return mlflow.pyfunc.log_model(
            name=name,
            python_model=SpeechModel(),
            artifacts={"model_dir": str(model_dir)},
            code_paths=[str(root / "common"), str(root / "models"), str(root / "pipeline")],
            signature=signature(config, data),
            input_example=example,
            pip_requirements=[f"tensorflow-cpu=={tf.__version__}", f"keras=={keras.__version__}", "numpy<2", "pyyaml"],
        )
