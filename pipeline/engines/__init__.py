"""Synthesizer engines, one module each (common/voices.py `EngineEntry.runner` names it): what
voices this machine has, the speakers a voice makes, and the batch runner that writes their wavs.

An engine is an `Engine`; pipeline/corpus.py plans with `draw`, `shipped` and `speaker_id` and
renders with `render`, whatever the engine, so adding one is a module here and an `EngineEntry`.
Only the standard library at import: pipeline/corpus_plan.py, the corpus' pure core, reads them.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol


class Engine(Protocol):
    name: str
    # Executables it runs besides sox (each checked on PATH before any work).
    tools: tuple[str, ...]
    # Shell command(s) that list its voices, for error messages.
    listing: str

    def installed(self, tools: dict[str, str]) -> frozenset[str]:
        """The names of its voices this machine has (what `has` reads)."""
        ...

    def has(self, voice: str, installed: frozenset[str]) -> bool:
        """Whether `voice` can be spoken with the `installed` voices."""
        ...

    def draw(self, voice: str, rng: random.Random, config) -> tuple[int, int, int]:
        """A speaker of `voice`: (rate, pitch, warp) drawn with `rng` from `config`'s ranges
        (pipeline/corpus.py CorpusConfig)."""
        ...

    def shipped(self, voice: str) -> tuple[int | None, int, int]:
        """(rate, pitch, warp) of the voice as it ships; rate None: its own pace, unnamed in the id."""
        ...

    def speaker_id(self, voice: str, rate: int | None, pitch: int, warp: int) -> str:
        """The Kaldi speaker id of a speaker: engine, voice and what was drawn."""
        ...

    def render(
        self, utts: Sequence, wavs: Sequence[Path], sample_rate: int, amplitude: int, tools: dict[str, str]
    ) -> None:
        """Writes each planned utterance (pipeline/corpus_plan.py PlannedUtterance) of `utts` as a
        16-bit mono wav at `sample_rate` to the `wavs` path beside it."""
        ...


def stretched_speaker_id(engine: str, voice: str, rate: int | None, pitch: int, warp: int) -> str:
    """`ENGINE-VOICE[-rRATE][-pPITCH][-wWARP]` for engines whose rate is a duration stretch in
    percent (no -r: as it ships; no -p: the voice's own pitch; no -w: no warp)."""
    parts = [f"{engine}-{voice}"]
    parts += [f"r{rate:03d}"] if rate is not None else []
    parts += [f"p{pitch:03d}"] if pitch else []
    parts += [f"w{warp:03d}"] if warp != 100 else []
    return "-".join(parts)
