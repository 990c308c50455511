"""Augmentation stage: a training split and perturbed copies of its audio, as a Kaldi data directory.

    python -m pipeline.augment --data DIR/train --out DIR/train_aug [--config FILE.yaml]
        [--set speed_factors=[0.9,1.1]] [--set reverb_share=0.3] [--set noise_share=0.3]
        [--set telephone_share=0.2] [--jobs N] [--allow-pipes] [--no-progress]

writes `OUT/` (`wav.scp`, `text`, `utt2spk`, `spk2utt`, and `utt2voice`, `segments`,
`reco2file_and_channel` where the input has them): every utterance of the input as it is (its
wav.scp entry unchanged) and the copies the settings ask for (pipeline/augment_config.py
`CopiesConfig`, which the acoustic model's training config holds as `asr.augment.copies`), each a
16 kHz mono 16-bit wav under `OUT/wav/`, then `OUT/augment.json` as the done marker. The feature
and shard stages then read OUT like any data directory (the DAG names it split `train_aug`).

A copy's utterance and speaker ids get the prefix of its kind, as Kaldi's recipes name them:
`sp0.9-UTT` of speaker `sp0.9-SPK` (perturb_data_dir_speed.sh), `rvb1-`, `noise1-`, `tel1-` (as
reverberate_data_dir.py's `--prefix`). A speaker that is a prefix of its utterances stays one, so
the copies sort with their speakers as utils/validate_data_dir.sh requires, and each kind of copy
is a speaker of its own for per-speaker CMVN (a new channel, or a new voice for a speed copy).

Kinds (each off unless asked for): speed perturbation (sox `speed`, tempo and pitch together, as
Kaldi's recipe), a simulated room (sox `reverb`, Freeverb, with reverberance, damping, room size
and pre-delay drawn per utterance), additive noise at a drawn SNR (babble of other training
utterances, or sox's white, pink or brown noise) and a telephone channel (band-pass, 8 kHz,
G.711 u-law or GSM 06.10 through sox, back to 16 kHz). sox is the library: the corpus stage already
needs it, Kaldi's recipes use it for the same perturbations, its `-R` makes every run the same
bytes, and its codecs are the real ones; pyroomacoustics (image-method rooms) would be a second
audio stack for a lever whose worth is not measured yet, and none of its rooms is a measured one either.

`plan_copies` is the pure core (settings + the input's utterances -> the copies, every draw seeded
per utterance and kind); `augment_data_dir` runs sox for each copy in a thread pool (the work is in
the subprocesses) and writes the directory. A re-run with the same input tables, audio files,
settings and code does nothing; a changed one writes the directory again and removes the wavs of
the copies it does not make now.
"""

from __future__ import annotations

import argparse
import collections
import logging
import os
import random
import re
import sys
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path
from typing import NamedTuple

import numpy as np
import soundfile as sf

from common import cli, fsutil
from common import config as configlib
from common.progress import progress as progress_bar
from pipeline import audio_io, augment_config, kaldi, synthesizers
from pipeline.augment_config import CopiesConfig

log = logging.getLogger(__name__)

SAMPLE_RATE = 16000  # of every copy (the feature stage's rate)
TELEPHONE_RATE = 8000
MARKER = "augment.json"
# The input's tables the output keeps (for its clean utterances); wav.scp, text, utt2spk and spk2utt
# are written with the copies' lines, and so are segments and utt2voice when the input has them.
KEPT_TABLES = ("reco2file_and_channel",)
NOISE_SECONDS = 30  # of each synthetic noise, from which every copy takes its own stretch
PEAK = 0.99 * 32767  # a copy louder than this (a reverberant room's gain) is scaled down to it


class Utterance(NamedTuple):
    """One clean utterance of the input: what a copy is made of."""

    utt_id: str
    speaker: str
    text: str


class Copy(NamedTuple):
    """One planned copy: its ids and transcript, the utterance it is made of, and how."""

    utt_id: str
    speaker: str
    text: str
    source: str  # the clean utterance's id
    kind: str  # "speed", "reverb", "noise" or "telephone"
    effects: tuple[str, ...] = ()  # sox effects at 16 kHz (speed, reverb, band-pass)
    codec: str = ""  # telephone: "mulaw" or "gsm" at 8 kHz
    noise: str = ""  # noise: "babble", "white", "pink" or "brown"
    snr_db: float = 0.0  # noise: over the whole utterance
    babble: tuple[str, ...] = ()  # noise "babble": the other utterances talking at once
    offset: float = 0.0  # noise: where in each noise (a fraction of its length) this copy's stretch starts


# --- the pure core ------------------------------------------------------------------------------
def _draw(config: CopiesConfig, kind: str, utt_id: str) -> random.Random:
    """The random stream of one utterance's copy of one kind: the same whatever the job count."""
    return random.Random(f"{config.seed}/{kind}/{utt_id}")


def _chosen(config: CopiesConfig, kind: str, share: float, utts: Sequence[Utterance]) -> list[Utterance]:
    """round(share x utterances) of `utts`, those whose draw for `kind` is smallest, in id order."""
    count = round(share * len(utts))
    ranked = sorted(utts, key=lambda u: (_draw(config, f"{kind}/pick", u.utt_id).random(), u.utt_id))
    return sorted(ranked[:count])


def _uniform(rng: random.Random, bounds: tuple[float, float], digits: int = 1) -> float:
    return round(rng.uniform(*bounds), digits)


def plan_copies(config: CopiesConfig, utts: Sequence[Utterance]) -> list[Copy]:
    """The copies `config` asks for of `utts` (the input's clean utterances), sorted by id.

    Speed: every utterance once per factor, speaker `spF-SPK`. Reverb, noise, telephone: the share
    of utterances each kind's draw picks, one copy each, speaker `rvb1-SPK`, `noise1-SPK`, `tel1-SPK`.
    Every value a copy has (room, noise, talkers, SNR, codec) is drawn from its own stream."""
    utts = sorted(utts)
    copies: list[Copy] = []
    for factor in config.speed_factors:
        prefix = f"sp{factor:g}-"
        effects = ("speed", f"{factor:g}")
        copies += [Copy(prefix + u.utt_id, prefix + u.speaker, u.text, u.utt_id, "speed", effects) for u in utts]
    for u in _chosen(config, "reverb", config.reverb_share, utts):
        rng = _draw(config, "reverb", u.utt_id)
        room = [
            _uniform(rng, config.reverb_reverberance),
            _uniform(rng, config.reverb_damping),
            _uniform(rng, config.reverb_room_scale),
            100.0,  # stereo depth: nothing to spread in a mono copy
            _uniform(rng, config.reverb_pre_delay_ms),
        ]
        effects = ("reverb", *(f"{v:g}" for v in room))
        copies.append(Copy("rvb1-" + u.utt_id, "rvb1-" + u.speaker, u.text, u.utt_id, "reverb", effects))
    others = [u.utt_id for u in utts]
    for u in _chosen(config, "noise", config.noise_share, utts):
        rng = _draw(config, "noise", u.utt_id)
        noise = rng.choice(config.noise_kinds)
        snr = _uniform(rng, config.noise_snr_db)
        offset = round(rng.random(), 6)
        babble: tuple[str, ...] = ()
        if noise == "babble":
            pool = [o for o in others if o != u.utt_id]
            if not pool:
                raise ValueError(
                    f"{u.utt_id}: babble needs other utterances and the split has none; leave babble out of noise_kinds"
                )
            talkers = min(rng.randint(*config.babble_talkers), len(pool))
            babble = tuple(sorted(rng.sample(pool, talkers)))
        copies.append(
            Copy(
                "noise1-" + u.utt_id,
                "noise1-" + u.speaker,
                u.text,
                u.utt_id,
                "noise",
                noise=noise,
                snr_db=snr,
                babble=babble,
                offset=offset,
            )
        )
    low, high = config.telephone_band_hz
    for u in _chosen(config, "telephone", config.telephone_share, utts):
        codec = _draw(config, "telephone", u.utt_id).choice(config.telephone_codecs)
        effects = ("sinc", f"{low:g}-{high:g}")
        copies.append(Copy("tel1-" + u.utt_id, "tel1-" + u.speaker, u.text, u.utt_id, "telephone", effects, codec))
    return sorted(copies)


# --- running sox on one copy --------------------------------------------------------------------
def _raw(rate: int, codec: str = "f32") -> list[str]:
    """sox's description of headerless mono audio on a pipe."""
    kind = {"f32": ["-t", "f32"], "mulaw": ["-t", "ul"], "gsm": ["-t", "gsm"]}[codec]
    return [*kind, "-r", str(rate), "-c", "1", "-"]


def _sox(sox: str, samples: np.ndarray, effects: Sequence[str], what: str) -> np.ndarray:
    """`samples` (float [n], int16 scale, 16 kHz) through sox `effects`, back at 16 kHz."""
    pipe = (samples / 32768.0).astype("<f4").tobytes()
    out = synthesizers.run([sox, "-R", *_raw(SAMPLE_RATE), *_raw(SAMPLE_RATE), *effects], what, input=pipe)
    return np.frombuffer(out, dtype="<f4").astype(np.float64) * 32768.0


def _telephone(sox: str, samples: np.ndarray, effects: Sequence[str], codec: str, what: str) -> np.ndarray:
    """Band-limited, down to 8 kHz, encoded and decoded with `codec`, and back up to 16 kHz."""
    pipe = (samples / 32768.0).astype("<f4").tobytes()
    coded = synthesizers.run([sox, "-R", *_raw(SAMPLE_RATE), *_raw(TELEPHONE_RATE, codec), *effects], what, input=pipe)
    out = synthesizers.run([sox, "-R", *_raw(TELEPHONE_RATE, codec), *_raw(SAMPLE_RATE)], what, input=coded)
    return np.frombuffer(out, dtype="<f4").astype(np.float64) * 32768.0


def synthetic_noise(sox: str, kind: str) -> np.ndarray:
    """NOISE_SECONDS of sox's `kind` noise (white, pink, brown) at 16 kHz, float [samples]; the same
    bytes every time (`-R`)."""
    cmd = [sox, "-R", "-n", *_raw(SAMPLE_RATE), "synth", str(NOISE_SECONDS), f"{kind}noise"]
    return np.frombuffer(synthesizers.run(cmd, f"making {kind} noise"), dtype="<f4").astype(np.float64)


def _stretch(noise: np.ndarray, offset: float, length: int) -> np.ndarray:
    """`length` samples of `noise` from `offset` (a fraction of it) on, wrapping around."""
    start = int(offset * len(noise)) % len(noise)
    return np.resize(np.roll(noise, -start), length)


def _babble(copy: Copy, length: int, read) -> np.ndarray:
    """The talkers of `copy.babble` at equal power, summed, each from its own point: float [length]."""
    total = np.zeros(length)
    for i, utt in enumerate(copy.babble):
        voice = read(utt)
        power = np.mean(voice**2)
        if power > 0:
            total += _stretch(voice / np.sqrt(power), (copy.offset + i / len(copy.babble)) % 1.0, length)
    return total


def render(copy: Copy, read, sox: str, noises: dict[str, np.ndarray]) -> np.ndarray:
    """The copy's samples, int16 [n] at 16 kHz. `read(utt_id)`: a clean utterance, float [n] (int16
    scale, 16 kHz); `noises`: kind -> `synthetic_noise`."""
    from pipeline.corpus import mix_at_snr

    clean = read(copy.source)
    what = f"sox for {copy.utt_id}"
    if copy.kind == "telephone":
        out = _telephone(sox, clean, copy.effects, copy.codec, what)
    elif copy.effects:
        out = _sox(sox, clean, copy.effects, what)
    else:
        out = clean
    if copy.kind == "noise":
        noise = (
            _babble(copy, len(out), read)
            if copy.noise == "babble"
            else _stretch(noises[copy.noise], copy.offset, len(out))
        )
        if not np.any(out) or not np.any(noise):
            raise ValueError(
                f"{copy.source}: silent audio (or silent babble) has no SNR; drop it from the data directory"
            )
        mixed, _ = mix_at_snr(np.clip(np.rint(out), -32768, 32767).astype(np.int16), noise, copy.snr_db)
        out = mixed.astype(np.float64)
    peak = np.max(np.abs(out)) if len(out) else 0.0
    if peak > PEAK:
        out = out * (PEAK / peak)
    return np.rint(out).astype(np.int16)


# --- I/O driver ---------------------------------------------------------------------------------
def code_version() -> str:
    return fsutil.code_version(sys.modules[__name__], augment_config, synthesizers)


def _fingerprint(data_dir: Path, config: CopiesConfig) -> dict:
    from pipeline import features

    tables = [data_dir / name for name in ("wav.scp", "segments", "utt2spk", "text", "utt2voice", *KEPT_TABLES)]
    return {
        "tables": fsutil.fingerprint_files(tables),
        "audio": fsutil.fingerprint_files(features.audio_files(data_dir), content=False),
        "config": configlib.to_dict(config),
        "code": code_version(),
    }


def _reader(entries: dict[str, kaldi.Entry], allow_pipes: bool):
    """`read(utt_id)` -> the clean utterance as the feature stage would see it: float [n], int16 scale,
    16 kHz mono; ValueError naming the utterance, its wav.scp entry and the fix."""
    from pipeline.features import FeatureConfig, prepare_waveform

    cfg = FeatureConfig(sample_rate=SAMPLE_RATE)

    def read(utt_id: str) -> np.ndarray:
        entry = entries[utt_id]
        try:
            rate, samples = kaldi.read_audio(entry.audio, allow_pipes)
            return prepare_waveform(rate, samples, entry.segment, cfg, entry.channel).astype(np.float64)
        except audio_io.AudioError as err:
            raise ValueError(
                f"{utt_id}: its audio ({entry.audio!r}) cannot be copied: {err}; fix its wav.scp entry or drop "
                f"the utterance from the data directory (utils/fix_data_dir.sh)"
            ) from err

    return read


def _write_tables(source: Path, out: Path, entries: list[kaldi.Entry], copies: list[Copy]) -> None:
    """OUT's Kaldi tables: the clean utterances' lines as the input has them, and the copies'."""
    wav = kaldi.read_table(source / "wav.scp").values
    rows = {e.utt_id: (e.speaker, e.transcript or "") for e in entries}
    rows.update({c.utt_id: (c.speaker, c.text) for c in copies})
    spk2utt: dict[str, list[str]] = {}
    for utt, (speaker, _) in sorted(rows.items()):
        spk2utt.setdefault(speaker, []).append(utt)
    # wav.scp is keyed by recording: the input's recordings, and each copy a recording of its own.
    recordings = {e.segment.recording if e.segment else e.utt_id for e in entries}
    wav_lines = {r: wav[r] for r in recordings} | {c.utt_id: str(out / "wav" / f"{c.utt_id}.wav") for c in copies}
    tables = {
        "wav.scp": "".join(f"{r} {p}\n" for r, p in sorted(wav_lines.items())),
        "text": "".join(f"{u} {t}\n" for u, (_, t) in sorted(rows.items())),
        "utt2spk": "".join(f"{u} {s}\n" for u, (s, _) in sorted(rows.items())),
        "spk2utt": "".join(f"{s} {' '.join(us)}\n" for s, us in sorted(spk2utt.items())),
    }
    if (source / "segments").is_file():
        segments = kaldi.read_table(source / "segments").values
        lines = {e.utt_id: segments[e.utt_id] for e in entries} | {c.utt_id: f"{c.utt_id} 0 -1" for c in copies}
        tables["segments"] = "".join(f"{u} {v}\n" for u, v in sorted(lines.items()))
    if (source / "utt2voice").is_file():
        voice = kaldi.read_table(source / "utt2voice").values
        lines = {u: voice[u] for u in rows if u in voice} | {
            c.utt_id: voice[c.source] for c in copies if c.source in voice
        }
        tables["utt2voice"] = "".join(f"{u} {v}\n" for u, v in sorted(lines.items()))
    for name in KEPT_TABLES:
        if (source / name).is_file():
            tables[name] = (source / name).read_text(encoding="utf-8")
    for name, content in tables.items():
        fsutil.atomic_write_text(out / name, content)
    for name in ("segments", "utt2voice", *KEPT_TABLES):  # an earlier input's table this one lacks
        if name not in tables:
            (out / name).unlink(missing_ok=True)


def augment_data_dir(
    data_dir: str | Path,
    out_dir: str | Path,
    config: CopiesConfig,
    jobs: int = 1,
    allow_pipes: bool = False,
    progress: bool = True,
) -> dict:
    """Writes OUT (see the module docstring) from the Kaldi data directory `data_dir`; returns the
    done marker's summary. Does nothing when OUT's marker records the same inputs, settings and code;
    `jobs` (threads, each running sox) changes only the speed, never the bytes."""
    source, out = Path(data_dir).resolve(), Path(out_dir).resolve()
    _check_directories(source, out)
    fingerprint = _fingerprint(source, config)
    done = fsutil.read_json(out / MARKER) or {}
    if done.get("fingerprint") == fingerprint and (out / "wav.scp").is_file():
        log.info("%s is up to date with %s and these settings; nothing to do", out, source)
        return {**done["summary"], "skipped": True}
    (out / MARKER).unlink(missing_ok=True)  # first, so that an interrupted run never looks done
    entries, rejections = kaldi.scan_data_dir(source, allow_pipes=allow_pipes, need_text=True, source="audio")
    for rejection in rejections:
        log.warning(
            "%s: not copied (%s: %s); the feature stage rejects it too",
            rejection.utt_id,
            rejection.reason,
            rejection.detail,
        )
    utts = [Utterance(e.utt_id, e.speaker, e.transcript or "") for e in entries]
    copies = plan_copies(config, utts)
    sox = synthesizers.tool("sox")
    (out / "wav").mkdir(parents=True, exist_ok=True)
    kinds = {c.noise for c in copies if c.kind == "noise" and c.noise != "babble"}
    noises = {kind: synthetic_noise(sox, kind) for kind in sorted(kinds)}
    read = _reader({e.utt_id: e for e in entries}, allow_pipes)
    bar = {"desc": f"augment {source.name}", "unit": "copy", "disable": not progress}
    samples = _write_copies(copies, out / "wav", lambda copy: render(copy, read, sox, noises), jobs, bar)
    # Wavs of an earlier, different run (or its unfinished temporaries) would otherwise linger.
    keep = {f"{c.utt_id}.wav" for c in copies}
    for stale in (out / "wav").iterdir():
        if stale.name not in keep:
            stale.unlink()
    _write_tables(source, out, entries, copies)
    summary = {
        "utterances": len(entries),
        "copies": len(copies),
        "kinds": dict(sorted(collections.Counter(c.kind for c in copies).items())),
        "copies_hours": round(samples / SAMPLE_RATE / 3600, 4),
        "not_copied": len(rejections),
    }
    marker = {"fingerprint": fingerprint, "summary": summary, "sox": synthesizers.version(sox)}
    fsutil.atomic_write_json(out / MARKER, marker)  # last: marks the directory done
    log.info("wrote %s: %d utterances and %d copies %s", out, len(entries), len(copies), summary["kinds"])
    return {**summary, "skipped": False}


def _check_directories(source: Path, out: Path) -> None:
    """ValueError or FileNotFoundError unless `source` has audio and `out` is a directory of its own."""
    if source == out:
        raise ValueError(f"--out {out} is the input data directory; name a directory of its own (e.g. train_aug)")
    if re.search(r"\s", str(out)):
        raise ValueError(f"output directory {out} contains whitespace, which Kaldi's wav.scp cannot hold")
    if not (source / "wav.scp").is_file():
        raise FileNotFoundError(
            f"{source / 'wav.scp'} is missing: the augmentation copies audio, so --data names a data directory "
            "with wav.scp (the corpus' train/, before its features)"
        )


def _write_copies(copies: list[Copy], wav_dir: Path, make, jobs: int, bar: dict) -> int:
    """Writes each copy's samples (`make(copy)`) as `wav_dir/UTT.wav` (atomically), `jobs` at once in
    threads; returns the samples written. The first failure cancels the copies not started."""

    def write(copy: Copy) -> int:
        samples = make(copy)
        wav = wav_dir / f"{copy.utt_id}.wav"
        tmp = wav.with_name(f".{wav.name}.tmp")
        sf.write(tmp, samples, SAMPLE_RATE, subtype="PCM_16", format="WAV")
        tmp.replace(wav)
        return len(samples)

    samples = 0
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        futures = [pool.submit(write, copy) for copy in copies]
        try:
            for future in progress_bar(as_completed(futures), total=len(futures), **bar):
                samples += future.result()
        except BaseException:
            pool.shutdown(cancel_futures=True)  # fail fast instead of making the rest
            raise
    return samples


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m pipeline.augment",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--data", required=True, type=Path, help="Kaldi data directory of the training split (wav.scp, text, utt2spk)"
    )
    parser.add_argument(
        "--out", required=True, type=Path, help="the data directory to write: the input's utterances and their copies"
    )
    parser.add_argument(
        "--allow-pipes",
        action="store_true",
        help="run wav.scp commands other than the decoders read in-process (flac, sph2pipe, sox) in a shell",
    )
    parser.add_argument("--jobs", type=int, help="copies made at once, each a sox process (default: one per CPU)")
    cli.add_config_arguments(parser, "CopiesConfig")
    cli.add_progress_argument(parser)
    args = parser.parse_args(argv)
    if args.jobs is not None and args.jobs < 1:
        parser.error("--jobs must be at least 1")
    return cli.run(lambda: _main(args))


def _main(args: argparse.Namespace) -> None:
    config = configlib.load(CopiesConfig, args.config, args.set)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    summary = augment_data_dir(
        args.data,
        args.out,
        config,
        jobs=args.jobs or os.cpu_count() or 1,
        allow_pipes=args.allow_pipes,
        progress=not args.no_progress,
    )
    print(" ".join(f"{k}={v}" for k, v in summary.items()))


if __name__ == "__main__":
    sys.exit(main())
