"""The synthesis network: `build_tts` builds the model a config's `alignment` names, the durations
model (models/tts/durations.py, the demo's) or the attention Tacotron (models/tts/attention.py)."""

from __future__ import annotations

from models.tts.attention import AttentionTacotron
from models.tts.base import SynthesisModel
from models.tts.config import TtsConfig
from models.tts.durations import DurationsTts


def build_tts(config: TtsConfig) -> SynthesisModel:
    """The synthesis model `config.alignment` names, every variable created (so models/training/checkpoint.py
    can restore into it): `DurationsTts` for "durations", `AttentionTacotron` for "attention"."""
    model = DurationsTts(config) if config.alignment == "durations" else AttentionTacotron(config)
    return model.build_variables()
