"""What a served model accepts, and a request's rows read and checked: the operator's settings (the
directory whose files requests may name, the size limits), each row's audio or text read as the
feature stage reads it, and the refusal of a bad row as an HTTP 400 that names the row and the fault.

Every model's server (common/catalog.py `ModelEntry.server`: models/asr/server.py,
models/tts/server.py) reads its rows with these, and the pyfunc model (models/serving/pyfunc.py)
hands it the settings. It is the floor of the serving package: the only module of it a model's
server imports, and it imports nothing of models/ and no TensorFlow (tests/test_layering.py).

The settings come from the serving process's environment (`ServingConfig.from_env`), so an operator
sets them beside `mlflow models serve` without re-logging the model:

  SPEECHFLOW_SERVE_AUDIO_DIR            files a request may name, only inside this directory (unset:
                                        no file is read; audio comes as base64 or a waveform)
  SPEECHFLOW_SERVE_MAX_ROWS             utterances (or sentences) per request
  SPEECHFLOW_SERVE_MAX_SECONDS          audio per utterance
  SPEECHFLOW_SERVE_MAX_REQUEST_SECONDS  audio per request, all rows together
  SPEECHFLOW_SERVE_MAX_AUDIO_BYTES      one `audio` string (base64 or a path), before decoding
  SPEECHFLOW_SERVE_MAX_TEXT_CHARS       one sentence for the synthesis model
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import math
import numbers
import os
import tempfile
from pathlib import Path

import numpy as np
from mlflow.exceptions import MlflowException
from mlflow.protos.databricks_pb2 import INVALID_PARAMETER_VALUE

ENV_PREFIX = "SPEECHFLOW_SERVE_"
# Rates a waveform or file may have: resampling from an odd rate designs a filter as long as the
# rate, so a request could buy seconds of CPU with one number.
MIN_RATE, MAX_RATE = 4000, 192000


@dataclasses.dataclass(frozen=True)
class ServingConfig:
    # Defaults suit a 2-core server: a request of max_request_seconds takes about 2.5 s there
    # (benchmarks/serving.py), far inside MLflow's 60-s request timeout.
    audio_dir: str = ""  # the only directory whose files a request may name ("": none)
    max_rows: int = 32  # utterances (or sentences) per request
    max_seconds: float = 30.0  # audio per utterance
    max_request_seconds: float = 120.0  # audio per request, all rows together
    max_audio_bytes: int = 16 * 2**20  # one `audio` string (base64 or path), before decoding
    max_text_chars: int = 400  # one sentence for the synthesis model

    @classmethod
    def from_env(cls, environ=None) -> ServingConfig:
        """The defaults, overridden by SPEECHFLOW_SERVE_<FIELD> variables; a bad value raises
        ValueError naming the variable, so the server refuses to start rather than serve unguarded."""
        environ = os.environ if environ is None else environ
        values = {}
        for field in dataclasses.fields(cls):
            name = ENV_PREFIX + field.name.upper()
            raw = environ.get(name, "").strip()
            if not raw:
                continue
            kind = type(field.default)
            if kind is str:
                values[field.name] = raw
                continue
            try:
                value = kind(raw)
            except ValueError:
                raise ValueError(f"{name}={raw!r} is not a number; unset it for {field.default}") from None
            if not value > 0:
                raise ValueError(f"{name}={raw!r}: a limit must be positive; unset it for {field.default}")
            values[field.name] = value
        config = cls(**values)
        if config.audio_dir and not Path(config.audio_dir).is_dir():
            raise ValueError(f"{ENV_PREFIX}AUDIO_DIR={config.audio_dir!r} is not a directory")
        return config


class RequestError(MlflowException, ValueError):
    """A request the model refuses. MLflow's scoring server answers an MlflowException of
    INVALID_PARAMETER_VALUE with HTTP 400 and this message; any other exception gets a generic
    message that names neither the row nor the fault. A ValueError too, for callers in Python."""

    def __init__(self, message: str):
        super().__init__(message, error_code=INVALID_PARAMETER_VALUE)


def allowed_file(value: str, config: ServingConfig) -> Path | None:
    """The file an `audio` string names inside the allowed directory, resolved (symlinks and `..`
    followed), or None when it names no file there (the string is then read as base64).

    No file outside the directory is opened or even looked up: with no directory allowed nothing
    is; a path that resolves outside it raises RequestError, unless the string is also valid base64
    (then it is read as that)."""
    if not config.audio_dir or len(value) > 4096 or "\0" in value:
        return None
    root = Path(os.path.realpath(config.audio_dir))
    named = Path(value)
    resolved = Path(os.path.realpath(named if named.is_absolute() else root / named))
    if resolved == root or root not in resolved.parents:
        if looks_like_base64(value):
            return None
        raise RequestError(
            f"`audio` names {value[:200]!r}, which is outside the directory the server reads files from; "
            "send the file's bytes as base64 instead"
        )
    return resolved if resolved.is_file() else None


def looks_like_base64(value: str) -> bool:
    try:
        base64.b64decode("".join(value.split()), validate=True)
    except (binascii.Error, ValueError):
        return False
    return True


def check_rate(rate) -> int:
    """A row's `sample_rate` as an int Hz, or RequestError saying what it must be."""
    if isinstance(rate, bool) or not isinstance(rate, numbers.Real) or rate != rate:
        raise RequestError(f"`sample_rate` must be a number of Hz, got {rate!r}")
    if rate != int(rate) or not MIN_RATE <= rate <= MAX_RATE:
        raise RequestError(f"`sample_rate` must be a whole number of Hz in [{MIN_RATE}, {MAX_RATE}], got {rate!r}")
    return int(rate)


def check_duration(samples: int, rate: int, config: ServingConfig) -> float:
    """Seconds of `samples` at `rate`, or RequestError when over the per-utterance limit."""
    seconds = samples / rate
    if seconds > config.max_seconds:
        raise RequestError(
            f"{seconds:.1f} s of audio, over this server's limit of {config.max_seconds:g} s per utterance "
            f"({ENV_PREFIX}MAX_SECONDS); split the recording"
        )
    return seconds


# ---- reading a request's rows ----------------------------------------------------------------


def _missing(value) -> bool:
    """A DataFrame cell left empty (None, or NaN where pandas filled a column)."""
    return value is None or (isinstance(value, float) and math.isnan(value))


def _rows(model_input) -> list[dict]:
    """The request's rows as dicts (a DataFrame, a dict of columns, or a list of dicts)."""
    if hasattr(model_input, "to_dict"):
        return model_input.to_dict(orient="records")
    if isinstance(model_input, dict):
        return [model_input]
    return list(model_input)


def utterances(model_input) -> list[tuple[str, object, object]]:
    """The request's utterances in order: (label, audio, sample rate or None) for each, the label
    naming the row (and the item of a row's list) for error messages.

    A row's `audio` is a string (base64 file bytes, or a file path inside the directory the operator
    allowed), a waveform (a list or array of numbers, with the row's `sample_rate`), or a list of
    strings (MLflow makes one row of a dict `{"audio": ["a.wav", "b.wav"]}`)."""
    out = []
    for i, row in enumerate(_rows(model_input)):
        audio, rate = row.get("audio"), row.get("sample_rate")
        if isinstance(audio, str):
            out.append((f"row {i}", audio, None))
        elif isinstance(audio, (list, tuple, np.ndarray)) and len(audio) and all(isinstance(a, str) for a in audio):
            out += [(f"row {i} item {k}", a, None) for k, a in enumerate(audio)]
        elif isinstance(audio, (list, tuple, np.ndarray)):
            out.append((f"row {i}", audio, None if _missing(rate) else rate))
        else:
            raise RequestError(
                f"row {i}: `audio` must be base64 file bytes, a file path or a waveform, got {str(audio)[:80]!r}"
            )
    return out


def read_audio_cell(value: str, settings: ServingConfig) -> tuple[int, np.ndarray]:
    """An `audio` string: base64 of a file's bytes (or a data: URI of them), or a file path inside
    `settings.audio_dir` (absolute, or relative to it). Returns (rate, float32 [samples, channels]
    on the int16 scale), read as the feature stage reads files, after checking from the header that
    it is no longer than the limit."""
    if len(value) > settings.max_audio_bytes:
        raise RequestError(
            f"`audio` is {len(value)} characters, over this server's limit of {settings.max_audio_bytes} "
            f"({ENV_PREFIX}MAX_AUDIO_BYTES)"
        )
    path = allowed_file(value, settings)
    if path is not None:
        return _read_checked(path, settings)
    encoded = value.split(",", 1)[1] if value.startswith("data:") else value  # a data: URI's payload
    try:
        raw = base64.b64decode("".join(encoded.split()), validate=True)
    except (binascii.Error, ValueError) as err:
        files = (
            f"nor a file in {settings.audio_dir}"
            if settings.audio_dir
            else "(this server reads no file a request names: the operator allows a directory with "
            f"{ENV_PREFIX}AUDIO_DIR)"
        )
        raise RequestError(f"`audio` is not base64 file bytes {files}: {value[:80]!r}") from err
    if not raw:
        raise RequestError("`audio` is empty")
    with tempfile.TemporaryDirectory() as tmp:  # read_file checks and decodes files, so the bytes become one
        path = Path(tmp) / "audio"
        path.write_bytes(raw)
        return _read_checked(path, settings)


def _read_checked(path: Path, settings: ServingConfig) -> tuple[int, np.ndarray]:
    import soundfile

    from pipeline import audio_io

    try:
        info = soundfile.info(str(path))
    except Exception:  # not audio: read_file says why, in the feature stage's words
        info = None
    if info is not None:
        check_duration(info.frames, max(info.samplerate, 1), settings)  # before decoding (a FLAC of hours)
    rate, samples = audio_io.read_file(path)
    check_rate(rate)
    return rate, samples


def audio_features(audio, sample_rate, cfg, settings: ServingConfig | None = None) -> np.ndarray:
    """One utterance (see `utterances`) -> log-mel fbank float32 [frames, D], as the feature stage
    computes it: read, mixed down and resampled by `prepare_waveform`, then `compute_fbank`.
    Raises RequestError for audio that is unusable or over `settings`' limits (default: the defaults)."""
    from pipeline import features
    from pipeline.audio_io import AudioError

    settings = settings or ServingConfig()
    try:
        if isinstance(audio, str):
            rate, waveform = read_audio_cell(audio, settings)
        else:
            if sample_rate is None:
                raise RequestError("a waveform needs its `sample_rate` (Hz)")
            rate = check_rate(sample_rate)
            check_duration(len(audio), rate, settings)
            try:
                waveform = np.asarray(audio, np.float32)
            except (TypeError, ValueError) as err:
                raise RequestError(f"a waveform is one list of numbers in [-1, 1] ({err})") from err
            if waveform.ndim != 1:
                raise RequestError(f"a waveform is one list of samples, got an array of shape {waveform.shape}")
            if not np.isfinite(waveform).all() or np.abs(waveform).max(initial=0.0) > 1.0:
                raise RequestError("a waveform's samples must be finite numbers in [-1, 1]")
            waveform = waveform[:, None] * 32768.0  # [samples, 1]; [-1, 1] -> the int16 scale
        wave = features.prepare_waveform(rate, waveform, None, cfg)
    except AudioError as err:
        raise RequestError(f"unusable audio ({err.reason}): {err}") from err
    feats = features.compute_fbank(wave, cfg)  # [frames, D]
    if len(feats) == 0:
        raise RequestError(
            f"{len(wave) / cfg.sample_rate:.3f} s of audio give no frame ({cfg.frame_length_ms} ms needed)"
        )
    return feats


def texts_and_voices(model_input) -> tuple[list[str], list[str | None]]:
    """The `text` column's sentences (one cell may hold a list of them) and each one's `voice` (the
    row's; None where the column or the cell is missing)."""
    cells = list(model_input["text"])
    column = model_input.get("voice") if hasattr(model_input, "get") else None
    row_voices = list(column) if column is not None else [None] * len(cells)
    texts, voices = [], []
    for cell, voice in zip(cells, row_voices):
        sentences = list(cell) if isinstance(cell, (list, tuple, np.ndarray)) else [cell]
        texts += [str(t) for t in sentences]
        voices += [None if _missing(voice) or not str(voice) else str(voice)] * len(sentences)
    return texts, voices


def bounded_param(params: dict, name: str, default: int, low: int, high: int) -> int:
    """A request's whole-number param `name` (default when absent), refused outside [low, high]."""
    value = params.get(name)
    value = default if value is None else value
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not low <= value <= high:
        raise RequestError(f"param `{name}` must be a whole number in [{low}, {high}], got {value!r}")
    return int(value)


def check_rows(count: int, settings) -> None:
    if count > settings.max_rows:
        raise RequestError(
            f"{count} rows, over this server's limit of {settings.max_rows} per request "
            f"({ENV_PREFIX}MAX_ROWS); send them in several requests"
        )
