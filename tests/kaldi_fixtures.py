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


def _tables(root: Path, utts: dict[str, str], rng: np.random.Generator, **tables: dict[str, str]) -> None:
    """text, utt2spk (speaker = the id's first field) and spk2utt for `utts`, plus the named tables."""
    utt2spk = {utt: utt.split("-")[0] for utt in utts}
    write_table(root / "text", {utt: sentence(rng) for utt in sorted(utts)})
    write_table(root / "utt2spk", dict(sorted(utt2spk.items())))
    write_table(root / "spk2utt", spk2utt(utt2spk))
    for name, rows in tables.items():
        write_table(root / name, dict(sorted(rows.items())))


def make_recipe_dirs(root: Path) -> tuple[Path, Path]:
    """The same audio twice: `recipe/` as Kaldi recipes list it, `plain/` as plain wav files.

    recipe/wav.scp holds LibriSpeech's `flac -c -d -s F.flac |`, Switchboard's `sph2pipe -f wav -p -c N
    F.sph |` over two-channel SPHERE files (16-bit PCM and u-law, 8 kHz; one recording per channel,
    cut by segments that end at -1) and `sox F.wav -t wav -r 16000 [-c 1] - |` over 48 and 44.1 kHz
    wavs. plain/ has each channel as a wav of its own, explicit segment ends, and the 48/44.1 kHz
    wavs listed as they are (the feature stage resamples and mixes them itself).
    Returns (recipe, plain).
    """
    root = Path(root)
    audio, recipe, plain = root / "audio", root / "recipe", root / "plain"
    for path in (audio, recipe, plain):
        path.mkdir(parents=True, exist_ok=True)
    wav_recipe, wav_plain, seg_recipe, seg_plain = {}, {}, {}, {}
    # LibriSpeech: one flac per utterance (16 kHz).
    for i in range(3):
        rec = f"ls{i}-utt"
        samples = (tone(0.6 + 0.2 * i, 16000, 250 + 90 * i, seed=i) * 32767).astype(np.int16)
        soundfile.write(audio / f"{rec}.flac", samples, 16000, subtype="PCM_16")
        soundfile.write(audio / f"{rec}.wav", samples, 16000, subtype="PCM_16")
        wav_recipe[rec] = f"flac -c -d -s {audio / rec}.flac |"
        wav_plain[rec] = str(audio / f"{rec}.wav")
    # Switchboard: two-channel 8 kHz conversations, each side a recording of its own.
    for conv, subtype in (("sw1", "PCM_16"), ("sw2", "ULAW")):
        seconds = 3.0
        stereo = np.stack([tone(seconds, 8000, 310, seed=5), tone(seconds, 8000, 1250, seed=6)], axis=1)
        soundfile.write(audio / f"{conv}.sph", stereo, 8000, format="NIST", subtype=subtype)
        decoded, _ = soundfile.read(audio / f"{conv}.sph", dtype="int16", always_2d=True)
        for side, channel in (("A", 1), ("B", 2)):
            rec = f"{conv}-{side}"
            # A full path to the program, as older recipes write it; it is never run.
            wav_recipe[rec] = f"/opt/kaldi/tools/sph2pipe_v2.5/sph2pipe -f wav -p -c {channel} {audio / conv}.sph |"
            soundfile.write(audio / f"{rec}.wav", decoded[:, channel - 1], 8000, subtype="PCM_16")
            wav_plain[rec] = str(audio / f"{rec}.wav")
            for k, (start, end) in enumerate([(0.0, 1.25), (1.25, -1)] if side == "A" else [(0.4, -1)]):
                seg_recipe[f"{rec}-{k:04d}"] = f"{rec} {start:.2f} {end:.2f}"
                seg_plain[f"{rec}-{k:04d}"] = f"{rec} {start:.2f} {seconds if end == -1 else end:.2f}"
    # Resampling recipes: sox to 16 kHz (and to mono).
    for rec, rate, channels, extra in (("sx1-utt", 48000, 1, ""), ("sx2-utt", 44100, 2, " -c 1")):
        samples = tone(0.9, rate, 520, channels=channels, seed=9)
        if channels == 2:
            samples[:, 1] = tone(0.9, rate, 1700, seed=10)
        soundfile.write(audio / f"{rec}.wav", samples, rate, subtype="PCM_16")
        wav_recipe[rec] = f"sox {audio / rec}.wav -t wav -r 16000{extra} - |"
        wav_plain[rec] = str(audio / f"{rec}.wav")
    # Segmented recordings' utterances are the segments; the others are their own recording.
    utts = {u: r for u, r in ((u, s.split()[0]) for u, s in seg_recipe.items())}
    utts.update({r: r for r in wav_recipe if not r.startswith("sw")})
    for directory, wav, segs in ((recipe, wav_recipe, seg_recipe), (plain, wav_plain, seg_plain)):
        write_table(directory / "wav.scp", dict(sorted(wav.items())))
        # Unsegmented utterances get a segment over their whole recording, so one segments file serves.
        whole = {r: f"{r} 0 -1" for r in wav if not r.startswith("sw")}
        write_table(directory / "segments", dict(sorted({**segs, **whole}.items())))
        _tables(directory, utts, np.random.default_rng(7))
    return recipe, plain
