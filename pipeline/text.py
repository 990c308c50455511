"""The tokenizer: transcripts <-> character ids, the same for shards, training, evaluation and serving.

Ids: 0 is CTC's blank (and the padding id), 1 stands for a character the training split never had,
then every character of the training transcripts, sorted. The vocabulary is stored in the shards'
manifest and in every model directory, so a served model encodes and decodes exactly as it trained.
Phonemes (pipeline/phonemes.py) use the same ids and functions: a list of symbols encodes as a
string of characters does.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from common import fsutil
from pipeline import records

BLANK, UNK = "<blank>", "<unk>"


def normalize_transcript(text: str, lowercase: bool = True) -> str:
    """Collapses whitespace; lower-cases when the shards were written with `lowercase` (the default)."""
    text = " ".join(text.split())
    return text.lower() if lowercase else text


def build_vocabulary(transcripts: list[str]) -> list[str]:
    """`[<blank>, <unk>, ' ', "'", 'a', ...]`: every character of the transcripts, sorted."""
    return [BLANK, UNK, *sorted({ch for text in transcripts for ch in text})]


def encode(text: str, vocabulary: list[str]) -> list[int]:
    """Character ids of `text` (already normalized); characters outside the vocabulary become 1."""
    index = {ch: i for i, ch in enumerate(vocabulary)}
    return [index.get(ch, 1) for ch in text]


def decode(ids: list[int], vocabulary: list[str]) -> str:
    """The text of `ids`, leaving out the blank and the unknown-character id."""
    return "".join(vocabulary[i] for i in ids if 1 < i < len(vocabulary))


def pad_batch(ids: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    """Id lists -> (ids int32 [B, L] 0-padded, lengths int32 [B])."""
    lengths = np.asarray([len(x) for x in ids], np.int32)
    tokens = np.zeros([len(ids), max(1, int(lengths.max(initial=0)))], np.int32)
    for i, x in enumerate(ids):
        tokens[i, : len(x)] = x
    return tokens, lengths


def load_vocabulary(path: str | Path) -> dict:
    """{"vocabulary": [...], "lowercase": bool, "phonemes": voice, "phoneme_vocabulary": [...],
    "phone_vocabulary": [...], "phones": {...} ("" and empty: none)} of a trained model or of shards
    (`--vocabulary-from`): `path` is a training workdir, its model/ directory or model/data.json, a
    shards directory or its manifest.json."""
    path = Path(path)
    tried = [path] if path.is_file() else [path / records.MANIFEST, path / "data.json", path / "model" / "data.json"]
    for candidate in tried:
        value = fsutil.read_json(candidate) if candidate.is_file() else None
        if isinstance(value, dict) and isinstance(value.get("vocabulary"), list):
            return {
                "vocabulary": list(value["vocabulary"]),
                "lowercase": bool(value.get("lowercase", True)),
                "phonemes": str(value.get("phonemes", "")),
                "phoneme_vocabulary": list(value.get("phoneme_vocabulary", [])),
                "phone_vocabulary": list(value.get("phone_vocabulary", [])),
                "phones": dict(value.get("phones", {})),
            }
    raise FileNotFoundError(
        f"--vocabulary-from {path}: none of {[str(t) for t in tried]} holds a vocabulary; name a training "
        "workdir, its model/data.json, a shards directory or its manifest.json"
    )
