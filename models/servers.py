"""What a served model answers, one server per model (common/catalog.py `ModelEntry.server`):
the acoustic model's audio in, text out; the synthesis model's text in, WAV audio and log-mels out.

models/serving.py `SpeechModel` (the MLflow pyfunc model) loads a model directory and hands each
request to its model's server, with the operator's limits (models/serving_policy.py). A server is
built from (model, TrainConfig, data.json) and has `predict(model_input, params, settings)`, and as
class methods `signature(config, data)` and `example(config, data)` for logging the model.
"""

from __future__ import annotations

import warnings

import numpy as np

from models.serving import feature_config, transcribe_features, wav_base64
from models.serving_policy import ENV_PREFIX, RequestError, audio_features, bounded_param, texts_and_voices, utterances


def check_rows(count: int, settings) -> None:
    if count > settings.max_rows:
        raise RequestError(
            f"{count} rows, over this server's limit of {settings.max_rows} per request "
            f"({ENV_PREFIX}MAX_ROWS); send them in several requests"
        )


class AsrServer:
    """Rows with `audio` (and `sample_rate`) -> one transcript each (see models/serving.py)."""

    def __init__(self, model, config, data: dict):
        from models import asr

        self.config, self.data = config, data
        if config.input.cmvn == "speaker":
            warnings.warn(
                "this acoustic model was trained with per-speaker CMVN, which a new speaker has no "
                "statistics for: it is served with per-utterance statistics, unlike its training "
                "(train with input.cmvn=utterance for a served model)",
                stacklevel=3,
            )
        self.infer = asr.compiled(model, data["feature_dim"])
        # Trace now, so the first request does not wait for the graph (about a second).
        dim = data["feature_dim"]
        transcribe_features(self.infer, config, data, [np.zeros([100, dim], np.float32)])

    def predict(self, model_input, params: dict, settings) -> list[str]:
        cfg = feature_config(self.data)  # refuses here, not at loading, when Kaldi made the features
        beam = bounded_param(params, "beam_width", 0, 0, 256)
        rows = utterances(model_input)
        check_rows(len(rows), settings)
        feats, seconds = [], 0.0
        for label, audio, rate in rows:
            try:
                feats.append(audio_features(audio, rate, cfg, settings))
            except RequestError as err:
                raise RequestError(f"{label}: {err.message}") from err
            seconds += len(feats[-1]) * cfg.frame_shift_ms / 1000
            if seconds > settings.max_request_seconds:
                raise RequestError(
                    f"{label}: the request holds over {settings.max_request_seconds:g} s of audio, this "
                    f"server's limit ({ENV_PREFIX}MAX_REQUEST_SECONDS); send it in several requests"
                )
        if not feats:
            return []
        return transcribe_features(self.infer, self.config, self.data, feats, beam)

    @classmethod
    def signature(cls, config, data: dict):
        from mlflow.models import ModelSignature
        from mlflow.types import DataType
        from mlflow.types.schema import AnyType, ColSpec, ParamSchema, ParamSpec, Schema

        # Any: a cell holds a string (path or base64) or a waveform; MLflow's typed columns take
        # neither both kinds nor a missing sample rate beside a file.
        inputs = Schema([ColSpec(AnyType(), "audio"), ColSpec(AnyType(), "sample_rate", required=False)])
        params = ParamSchema([ParamSpec("beam_width", DataType.long, 0)])
        return ModelSignature(inputs=inputs, outputs=Schema([ColSpec(DataType.string)]), params=params)

    @classmethod
    def example(cls, config, data: dict) -> dict:
        """Half a second of a tone."""
        tone = 0.1 * np.sin(2 * np.pi * 440 * np.arange(8000) / 16000)
        return {"audio": [tone.round(4).tolist()], "sample_rate": [16000]}


class TtsServer:
    """Rows with `text` (and `voice`) -> WAV audio, voices and log-mels (see models/serving.py)."""

    def __init__(self, model, config, data: dict):
        self.model, self.config, self.data = model, config, data

    def predict(self, model_input, params: dict, settings) -> dict:
        from models import audio, tasks

        max_steps = bounded_param(params, "max_steps", 400, 1, 2000)
        iterations = bounded_param(params, "griffin_lim_iters", 48, 0, 200)
        texts, voices = texts_and_voices(model_input)
        check_rows(len(texts), settings)
        for i, sentence in enumerate(texts):
            if not sentence.strip() or len(sentence) > settings.max_text_chars:
                raise RequestError(
                    f"sentence {i}: {len(sentence)} characters; a sentence has 1 to {settings.max_text_chars} "
                    f"({ENV_PREFIX}MAX_TEXT_CHARS)"
                )
        try:
            out = tasks.speak(self.model, self.data, texts, voices, max_steps=max_steps)
        except ValueError as err:  # a voice the model lacks (models/tts_base.py speaker_ids names its voices)
            raise RequestError(str(err)) from err
        mels, lengths = out["mels"], out["lengths"]
        return {
            "audio": [wav_base64(m[:n], iterations) if iterations > 0 else "" for m, n in zip(mels, lengths)],
            "voices": out["voices"],
            "sample_rate": audio.SAMPLE_RATE,
            "mels": mels,
            "lengths": lengths,
        }

    @classmethod
    def signature(cls, config, data: dict):
        from mlflow.models import ModelSignature
        from mlflow.types import DataType
        from mlflow.types.schema import ColSpec, ParamSchema, ParamSpec, Schema, TensorSpec

        outputs = Schema(
            [
                TensorSpec(np.dtype(np.float32), (-1, -1, data["feature_dim"]), "mels"),
                TensorSpec(np.dtype(np.int32), (-1,), "lengths"),
            ]
        )
        inputs = Schema([ColSpec(DataType.string, "text"), ColSpec(DataType.string, "voice", required=False)])
        params = ParamSchema(
            [ParamSpec("max_steps", DataType.long, 400), ParamSpec("griffin_lim_iters", DataType.long, 48)]
        )
        return ModelSignature(inputs=inputs, outputs=outputs, params=params)

    @classmethod
    def example(cls, config, data: dict) -> dict:
        return {"text": ["hello world"]}
