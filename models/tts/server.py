"""The served synthesis model: rows with text (and a voice) in, WAV audio and log-mels out
(common/catalog.py `ModelEntry.server`; models/serving/pyfunc.py `SpeechModel` hands it each request).

Rows with `text` (a sentence, or a list of them) and an optional `voice`: the name of a training
voice (the model's `voices`, recorded in its data.json; empty: the first); a name the model lacks
is refused with the list of its voices. Returns `audio` (base64-encoded 16-bit WAV files, one per
sentence, Griffin-Lim from the predicted mels), `voices` (the voice of each sentence),
`sample_rate`, `mels` float32 [B, T, D] (log-mel as the feature stage computes it, zero after each
sentence's length) and `lengths` int32 [B]. Params `max_steps` (decoder steps, default 400) and
`griffin_lim_iters` (default 48; 0: no audio). What a request may hold is the operator's
(models/serving/request_policy.py).
"""

from __future__ import annotations

import shutil

import numpy as np

from models.serving.request_policy import ENV_PREFIX, RequestError, bounded_param, check_rows, texts_and_voices


class TtsServer:
    """Rows with `text` (and `voice`) -> WAV audio, voices and log-mels (see the module docstring)."""

    def __init__(self, model, config, data: dict):
        self.model, self.config, self.data = model, config, data
        if config.settings.input == "phonemes" and shutil.which("espeak-ng") is None:
            # fail when the server starts, not at its first request
            raise FileNotFoundError(
                "this synthesis model reads phonemes, which espeak-ng makes from the typed text, and espeak-ng is "
                "not on PATH: install it where the model serves (`apt-get install espeak-ng`; the training "
                "image has it)"
            )

    def predict(self, model_input, params: dict, settings) -> dict:
        from models.tts import audio
        from models.tts.task import speak

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
            out = speak(self.model, self.data, texts, voices, max_steps=max_steps)
        except ValueError as err:  # a voice the model lacks (models/tts/base.py speaker_ids names its voices)
            raise RequestError(str(err)) from err
        mels, lengths = out["mels"], out["lengths"]
        return {
            "audio": audio.wavs_base64([m[:n] for m, n in zip(mels, lengths)], iterations)
            if iterations > 0
            else [""] * len(mels),
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
