"""What a served model accepts: the operator's settings (the directory whose files requests may name,
the size limits) and the refusal of a bad row as an HTTP 400 that names the row and the fault.

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

import dataclasses
import numbers
import os
from pathlib import Path

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
    import base64
    import binascii

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
