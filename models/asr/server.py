"""The served acoustic model: rows with audio in, one transcript each out (common/catalog.py
`ModelEntry.server`; models/serving/pyfunc.py `SpeechModel` hands it each request).

Rows (a pandas DataFrame, or JSON `dataframe_records` / `dataframe_split` over HTTP) whose `audio` is
  a path of an audio file on the serving machine (WAV, FLAC, SPHERE: what the feature stage reads;
  any sample rate, resampled; several channels are averaged), or the base64-encoded bytes of such a
  file, or a waveform: a list of floats in [-1, 1] with the row's `sample_rate` (Hz);
returns one transcript per utterance: greedy CTC decoding (param `beam_width` > 0: beam search), or,
for a model with an attached word LM (models/asr/lm.py), beam search with it (param `lm: false`: without).
A phone model answers words through its attached decoding graph (models/asr/hlg.py), always: it spells
words no other way, so the params `lm: false` and `beam_width` > 0 are refused (HTTP 400), and a graph
that is missing, cut short or not its output layer's stops the server from starting (`decoding_params`).
What a request may hold is the operator's (models/serving/request_policy.py).

No skew between training and serving. The served model takes audio and runs what training ran on
it: the feature stage's reading and resampling (`pipeline.features.prepare_waveform`) and fbank
(`compute_fbank`) with the training data's FeatureConfig (data.json, models/trained_model.py
`feature_config`), straight to float log-mel (no 8-bit storage in between), then the training
step's normalization itself (`AsrTask.features` -> `pipeline.frontend.normalize`) on a batch built
by the input pipeline's own function (`pipeline.frontend.acoustic_batch`, models/asr/inference.py).
Per-speaker statistics do not exist for a speaker heard in one request, so the models meant for
serving train with `input.cmvn: utterance` (configs/demo_asr.yaml): each utterance normalized by
the mean and variance of its own frames, in training, evaluation and serving alike. A model trained
with `cmvn: global` is served with the training split's statistics (what its training used; note
that `models.evaluate` normalizes each split by its own), one with `cmvn: none` without
normalization. A model trained with per-speaker CMVN has no exact counterpart for a new speaker: it
is served with per-utterance statistics, and loading it warns that this differs from its training.
"""

from __future__ import annotations

import warnings

import numpy as np

from models.asr import lm
from models.asr.inference import transcribe_features
from models.serving.request_policy import (
    ENV_PREFIX,
    RequestError,
    audio_features,
    bounded_param,
    check_rows,
    utterances,
)
from models.trained_model import feature_config


class AsrServer:
    """Rows with `audio` (and `sample_rate`) -> one transcript each (see the module docstring)."""

    def __init__(self, model, config, data: dict):
        from models.asr import network as asr

        self.config, self.data = config, data
        if config.input.cmvn == "speaker":
            warnings.warn(
                "this acoustic model was trained with per-speaker CMVN, which a new speaker has no "
                "statistics for: it is served with per-utterance statistics, unlike its training "
                "(train with input.cmvn=utterance for a served model)",
                stacklevel=3,
            )
        # Its attached word LM or a phone model's graph (models/asr/lm.py), opened now: a broken one, or
        # none for a phone model, stops the server from starting.
        self.lm = lm.choose(data)
        self.phones = lm.targets_of(data) == "phones"
        self.infer = asr.compiled(model, data["feature_dim"])
        # Trace now, so the first request does not wait for the graph (about a second).
        dim = data["feature_dim"]
        transcribe_features(
            self.infer, config, data, [np.zeros([100, dim], np.float32)], 0, self.lm if self.phones else None
        )

    def predict(self, model_input, params: dict, settings) -> list[str]:
        cfg = feature_config(self.data)  # refuses here, not at loading, when Kaldi made the features
        beam, use_lm = decoding_params(params, self.phones)
        with_lm = self.lm if use_lm else None
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
        return transcribe_features(self.infer, self.config, self.data, feats, beam, with_lm)

    @classmethod
    def signature(cls, config, data: dict):
        from mlflow.models import ModelSignature
        from mlflow.types import DataType
        from mlflow.types.schema import AnyType, ColSpec, ParamSchema, ParamSpec, Schema

        # Any: a cell holds a string (path or base64) or a waveform; MLflow's typed columns take
        # neither both kinds nor a missing sample rate beside a file.
        inputs = Schema([ColSpec(AnyType(), "audio"), ColSpec(AnyType(), "sample_rate", required=False)])
        params = ParamSchema([ParamSpec("beam_width", DataType.long, 0), ParamSpec("lm", DataType.boolean, True)])
        return ModelSignature(inputs=inputs, outputs=Schema([ColSpec(DataType.string)]), params=params)

    @classmethod
    def example(cls, config, data: dict) -> dict:
        """Half a second of a tone."""
        tone = 0.1 * np.sin(2 * np.pi * 440 * np.arange(8000) / 16000)
        return {"audio": [tone.round(4).tolist()], "sample_rate": [16000]}


def decoding_params(params: dict, phones: bool) -> tuple[int, bool]:
    """(beam width, whether to decode with the attached LM) of a request's params `beam_width` (default
    0: greedy) and `lm` (default true); `phones`: the model is a phone model, which spells words only
    through its graph, so `lm: false` and a `beam_width` over 0 are refused with RequestError (HTTP 400)."""
    beam = bounded_param(params, "beam_width", 0, 0, 256)
    use_lm = params.get("lm", True) not in (False, "false", 0)
    if phones and not use_lm:
        raise RequestError(
            "param `lm: false`: this is a phone model, which spells words only through its decoding graph, so "
            "every answer is words through it; leave `lm` out (or true)"
        )
    if phones and beam:
        raise RequestError(
            f"param `beam_width` {beam}: this is a phone model, which spells words only through its decoding graph "
            "(its own search, tuned with it), so a CTC beam width does not apply; leave `beam_width` out (or 0)"
        )
    return beam, use_lm
