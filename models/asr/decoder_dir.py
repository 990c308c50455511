"""A decoder's directory, a word n-gram's (models/asr/lm.py) or a decoding graph's lang dir
(models/asr/hlg.py): what both hold alike, the settings a grid chose (`decoding.json`), and how well
the decoder's words know a split. Both decoders read them from here, so neither imports the other's
module for them (lm.py's `choose` opens a graph; hlg.py needs nothing of lm.py)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path

from common import fsutil

DECODING = "decoding.json"  # in an LM directory or lang dir: the settings models.tune_lm chose


def chosen_settings(directory: str | Path, kind: type, **overrides):
    """`kind` (a settings dataclass) from DIRECTORY/decoding.json's settings (defaults where it has
    none), then `overrides` that are not None."""
    chosen = fsutil.read_json(Path(directory) / DECODING) or {}
    names = {f.name for f in dataclasses.fields(kind)}
    values = {k: v for k, v in chosen.get("settings", {}).items() if k in names}
    values.update({k: v for k, v in overrides.items() if v is not None})
    return kind(**values)


def coverage_of(words: set[str], known: set[str] | None, references: Sequence[str]) -> dict:
    """How well a decoder's words know the references: the share of their words outside `words`
    (`lm_oov_rate`) and the share of their word 3-grams in `known` (`lm_3gram_hit`; None: unknown)."""
    tokens = [w for r in references for w in r.split()]
    trigrams = [" ".join(ws[i : i + 3]) for r in references for ws in [r.split()] for i in range(len(ws) - 2)]
    return {
        "lm_oov_rate": sum(w not in words for w in tokens) / max(len(tokens), 1),
        "lm_3gram_hit": None if known is None else sum(t in known for t in trigrams) / max(len(trigrams), 1),
    }
