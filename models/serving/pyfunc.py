"""Loading a trained model directory, and the MLflow pyfunc model that serves it: audio in, text out
(acoustic model); text in, WAV audio and log-mels out (synthesis model).

A model directory (`WORKDIR/model`) holds the weights (`ckpt-*.npz`), the resolved `config.yaml`
and `data.json` (vocabulary, feature dimension, the training split's mel statistics, and the
feature stage's `FeatureConfig` under `features`).

No skew between training and serving. The served acoustic model takes audio and runs what training
ran on it: the feature stage's reading and resampling (`pipeline.features.prepare_waveform`) and
fbank (`compute_fbank`) with the training data's FeatureConfig, straight to float log-mel (no
8-bit storage in between), then the training step's normalization itself (`AsrTask.features` ->
`pipeline.frontend.normalize`) on a batch built as the input pipeline builds it. Per-speaker
statistics do not exist for a speaker heard in one request, so the models meant for serving train
with `input.cmvn: utterance` (configs/demo_asr.yaml): each utterance normalized by the mean and
variance of its own frames, in training, evaluation and serving alike. A model trained with
`cmvn: global` is served with the training split's statistics (what its training used; note that
`models.evaluate` normalizes each split by its own), one with `cmvn: none` without normalization.
A model trained with per-speaker CMVN has no exact counterpart for a new speaker: it is served with
per-utterance statistics, and loading it warns that this differs from its training.

Acoustic model: rows (a pandas DataFrame, or JSON `dataframe_records` / `dataframe_split` over
HTTP) whose `audio` is
  a path of an audio file on the serving machine (WAV, FLAC, SPHERE: what the feature stage reads;
  any sample rate, resampled; several channels are averaged), or the base64-encoded bytes of such a
  file, or a waveform: a list of floats in [-1, 1] with the row's `sample_rate` (Hz);
returns one transcript per utterance (greedy CTC decoding; param `beam_width` > 0: beam search).

Synthesis model: rows with `text` (a sentence, or a list of them) and an optional `voice`: the name
of a training voice (the model's `voices`, recorded in its data.json; empty: the first); a name the
model lacks is refused with the list of its voices. Returns `audio` (base64-encoded 16-bit WAV
files, one per sentence, Griffin-Lim from the predicted mels), `voices` (the voice of each
sentence), `sample_rate`, `mels` float32 [B, T, D] (log-mel as the feature stage computes it, zero
after each sentence's length) and `lengths` int32 [B]. Params
`max_steps` (decoder steps, default 400) and `griffin_lim_iters` (default 48; 0: no audio).
"""

from __future__ import annotations

import base64
import dataclasses
import warnings
from pathlib import Path

import mlflow
import numpy as np

from common import config as configlib
from common.fsutil import read_json
from models.serving.opening import load_model_dir  # noqa: F401 (serving.load_model_dir)
from models.serving.policy import ServingConfig
from pipeline.records import ShardSet

FRAMES_PER_BATCH = 40000  # padded input frames per batch of a request (the evaluation's batch size)


def recorded_feature_config(shards: ShardSet, split: str = "train") -> dict | None:
    """The FeatureConfig (as a dict) that the feature stage used for `split` of a shard set
    (pipeline/records.py `ShardSet`), from the done-marker in the split's data directory; None when
    the stage did not make those features (Kaldi made them) or the directory is not readable from
    here. For `data.json`."""
    from pipeline import features

    data_dir = shards.splits[split].data_dir if split in shards.splits else None
    marker = read_json(Path(data_dir) / features.MARKER) if data_dir else None
    if not marker or marker.get("state") != "done":
        return None
    return (marker.get("fingerprint") or {}).get("config")


def feature_config(data: dict):
    """The FeatureConfig that made the training features, from a model's `data.json`.

    A model directory written before `features` was recorded gets the feature stage's defaults at
    its feature dimension; one whose features Kaldi made (`features: null`) cannot take audio."""
    from pipeline import features

    if "features" not in data:
        return features.FeatureConfig(num_mel_bins=data["feature_dim"])
    if data["features"] is None:
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


# ---- acoustic model: audio -> log-mel -> the training normalization -> text -----------------------


def asr_batch(feats: list[np.ndarray], cmvn: str, data: dict) -> dict:
    """Float log-mels [T_i, D] -> the batch the training input pipeline would assemble from float
    storage: `feats` [B, T, D] zero-padded, `feat_lengths`, the affine map of `cmvn` ("global": the
    training split's statistics; otherwise the identity) and `utterance_cmvn` ("utterance", and
    "speaker", whose statistics a new speaker does not have)."""
    dim = feats[0].shape[1]
    lengths = np.asarray([len(f) for f in feats], np.int32)
    padded = np.zeros([len(feats), lengths.max(), dim], np.float32)  # [B, T, D]
    for i, f in enumerate(feats):
        padded[i, : len(f)] = f
    scale, offset = np.ones([len(feats), dim], np.float32), np.zeros([len(feats), dim], np.float32)
    if cmvn == "global":
        inv_std = (1.0 / np.asarray(data["mel_std"], np.float64)).astype(np.float32)
        scale *= inv_std
        offset -= np.asarray(data["mel_mean"], np.float32) * inv_std
    return {
        "feats": padded,
        "feat_lengths": lengths,
        "feat_scale": scale,
        "feat_offset": offset,
        "utterance_cmvn": np.full([len(feats)], cmvn in ("utterance", "speaker")),
    }


def transcribe_features(model, config, data: dict, feats: list[np.ndarray], beam_width: int = 0) -> list[str]:
    """Transcripts of float log-mels [T_i, D] (in order), normalized as `config.input.cmvn` trained
    the model, in batches of about FRAMES_PER_BATCH padded frames of similar lengths."""
    from models.asr import network as asr
    from models.asr.task import AsrTask

    order = sorted(range(len(feats)), key=lambda i: len(feats[i]))
    out = [""] * len(feats)
    start = 0
    while start < len(order):
        end = start + 1
        while end < len(order) and (end - start + 1) * len(feats[order[end]]) <= FRAMES_PER_BATCH:
            end += 1
        chunk = order[start:end]
        batch = asr_batch([feats[i] for i in chunk], config.input.cmvn, data)
        hyps = asr.transcribe(
            model, AsrTask.features(batch), batch["feat_lengths"], data["vocabulary"], beam_width=beam_width
        )
        for i, hyp in zip(chunk, hyps):
            out[i] = hyp
        start = end
    return out


# ---- synthesis model: text -> log-mel -> Griffin-Lim audio ----------------------------------------


def wavs_base64(log_mels: list[np.ndarray], iterations: int) -> list[str]:
    """Griffin-Lim audio of each sentence's log-mel [T_i, D] (one batch) as base64-encoded 16-bit WAV files."""
    from models.tts import audio

    waves = audio.griffin_lim_batch(log_mels, n_iter=iterations)
    return [base64.b64encode(audio.wav_bytes(wave)).decode("ascii") for wave in waves]


class SpeechModel(mlflow.pyfunc.PythonModel):
    """The pyfunc model of a model directory (see the module docstring for inputs and outputs);
    what it accepts is set by the operator's environment (models/serving/policy.py). What it
    answers is its model's server (common/catalog.py `ModelEntry.server`: models/asr/server.py, models/tts/server.py)."""

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
    with warnings.catch_warnings():
        # MLflow suggests typed predict() signatures; ours is given explicitly (`signature` above).
        warnings.filterwarnings("ignore", message=".*type hint.*")
        return mlflow.pyfunc.log_model(
            name=name,
            python_model=SpeechModel(),
            artifacts={"model_dir": str(model_dir)},
            code_paths=[str(root / "common"), str(root / "models"), str(root / "pipeline")],
            signature=signature(config, data),
            input_example=input_example(config, data),
            pip_requirements=requirements,
        )
