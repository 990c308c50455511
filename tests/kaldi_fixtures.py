"""Builders of small Kaldi data directories for tests (features written with kaldiio, audio with soundfile)."""

from __future__ import annotations

from pathlib import Path

import kaldiio
import numpy as np
import soundfile

WORDS = ["turn", "on", "the", "lights", "seven", "oslo", "monday", "call", "anna", "please"]


def sentence(rng: np.random.Generator) -> str:
    return " ".join(rng.choice(WORDS, size=rng.integers(2, 6)))


def write_table(path: Path, rows: dict[str, str] | list[tuple[str, str]]) -> None:
    items = rows.items() if isinstance(rows, dict) else rows
    Path(path).write_text("".join(f"{k} {v}\n" for k, v in items), encoding="utf-8")


def spk2utt(utt2spk: dict[str, str]) -> dict[str, str]:
    grouped: dict[str, list[str]] = {}
    for utt, spk in sorted(utt2spk.items()):
        grouped.setdefault(spk, []).append(utt)
    return {spk: " ".join(utts) for spk, utts in grouped.items()}


def make_feats_dir(
    root: Path,
    num_utts: int = 12,
    dim: int = 13,
    num_speakers: int = 3,
    frames: tuple[int, int] = (20, 80),
    seed: int = 0,
    compression_method: int | None = None,
    text_ark: bool = False,
) -> tuple[Path, dict[str, np.ndarray], dict[str, str]]:
    """A data dir with feats.scp/feats.ark, text, utt2spk, spk2utt. Returns (dir, feats, texts)."""
    rng = np.random.default_rng(seed)
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    feats, texts, utt2spk = {}, {}, {}
    for i in range(num_utts):
        spk = f"spk{i % num_speakers}"
        utt = f"{spk}-utt{i:03d}"
        feats[utt] = (rng.normal(size=(int(rng.integers(*frames)), dim)) * (1 + i % num_speakers)).astype(np.float32)
        texts[utt] = sentence(rng)
        utt2spk[utt] = spk
    spec = f"ark{',t' if text_ark else ''},scp:{root / 'feats.ark'},{root / 'feats.scp'}"
    with kaldiio.WriteHelper(spec, compression_method=compression_method) as writer:
        for utt in sorted(feats):
            writer(utt, feats[utt])
    write_table(root / "text", dict(sorted(texts.items())))
    write_table(root / "utt2spk", dict(sorted(utt2spk.items())))
    write_table(root / "spk2utt", spk2utt(utt2spk))
    return root, feats, texts


def tone(seconds: float, rate: int = 16000, freq: float = 440.0, channels: int = 1, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * rate)) / rate
    wave = 0.3 * np.sin(2 * np.pi * freq * t) + 0.01 * rng.normal(size=t.shape)
    return np.stack([wave] * channels, axis=1) if channels > 1 else wave


def make_wav_dir(root: Path, num_utts: int = 6, rate: int = 16000, seconds: float = 0.5) -> Path:
    """A data dir with wav.scp over real 16-bit wav files, text, utt2spk, spk2utt."""
    root = Path(root)
    (root / "wav").mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(1)
    wav, texts, utt2spk = {}, {}, {}
    for i in range(num_utts):
        spk = f"spk{i % 2}"
        utt = f"{spk}-utt{i:03d}"
        path = root / "wav" / f"{utt}.wav"
        soundfile.write(path, tone(seconds, rate, 200 + 50 * i, seed=i), rate, subtype="PCM_16")
        wav[utt], texts[utt], utt2spk[utt] = str(path), sentence(rng), spk
    write_table(root / "wav.scp", dict(sorted(wav.items())))
    write_table(root / "text", dict(sorted(texts.items())))
    write_table(root / "utt2spk", dict(sorted(utt2spk.items())))
    write_table(root / "spk2utt", spk2utt(utt2spk))
    return root
