"""A demo speech corpus as a Kaldi data root, synthesized with espeak-ng.

    python -m pipeline.corpus --out DIR [--num-utterances 2500] [--seed 0] [--jobs 2]

writes `DIR/{train,dev,test,test_noisy}/` (Kaldi data directories: `wav.scp`, `text`, `utt2spk`,
`spk2utt`, sorted by id) over 16 kHz mono 16-bit wavs under `DIR/wav/`, then `DIR/corpus.json`
as the done marker. Speakers are espeak-ng voices with variants (`en-gb-x-rp+f2`) at a per-speaker
rate and pitch; `test/` uses voice combinations training never hears, and `test_noisy/` is the
same utterances mixed with pink noise at a fixed SNR. Sentences come from a small grammar of
commands, numbers, names, places and times, spelled out exactly as spoken.

`plan_corpus` is the pure core (config -> list of utterances); `build_corpus` runs espeak-ng and
sox in a thread pool (the work happens in the subprocesses, so threads suffice).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import math
import os
import random
import re
import shutil
import subprocess
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
from pipeline.grammar import grammar_vocabulary, make_sentence

log = logging.getLogger(__name__)

SPLITS = ("train", "dev", "test")  # what the plan holds; test_noisy mirrors test
ALL_SPLITS = (*SPLITS, "test_noisy")
INSTALL_HINT = "install both with `apt-get install espeak-ng sox`"
# Fewer voices than this and a model trained on the corpus cannot learn speaker-independent
# features, or the test set cannot show whether it did.
MIN_TRAIN_VOICES, MIN_TEST_VOICES = 8, 3
# Every accent espeak-ng has for English is heard in training, as in a real corpus whose test
# speakers are new people from the same dialect regions; the variants (the voice timbre) m3, f4,
# m7 and klatt3 are never heard in training and make the test voices.
_ACCENTS = ("en", "en-us", "en-gb-x-rp", "en-gb-scotland", "en-029", "en-gb-x-gbclan", "en-gb-x-gbcwmd")
_TRAIN_VARIANTS = ("m1", "m2", "m4", "m6", "f1", "f2", "f3", "klatt")


@dataclasses.dataclass(frozen=True)
class CorpusConfig:
    # Utterances in train + dev + test; test_noisy mirrors test and is not counted.
    num_utterances: int = 2500
    # Seeds sentences, speaker rates and pitches, and noise offsets; same seed, same bytes.
    seed: int = 0
    # Share of num_utterances for dev (same speakers as train, new sentences).
    dev_fraction: float = 0.1
    # Share of num_utterances for test (unseen voices, new sentences); train gets the rest.
    test_fraction: float = 0.1
    # espeak-ng `voice+variant` specs heard in training (dev uses the same speakers).
    train_voices: tuple[str, ...] = tuple(f"{b}+{v}" for b in _ACCENTS for v in _TRAIN_VARIANTS)
    # Held-out voices: a variant training never hears, on an accent it does.
    test_voices: tuple[str, ...] = (
        "en+m3", "en-us+f4", "en-gb-x-rp+m7", "en-gb-scotland+klatt3",
        "en-029+m3", "en-gb-x-gbclan+f4", "en-gb-x-gbcwmd+m7", "en-us+klatt3",
    )  # fmt: skip
    # Inclusive range of a speaker's speaking rate, in words per minute (espeak-ng default 175).
    rate_range: tuple[int, int] = (130, 190)
    # Inclusive range of a speaker's espeak-ng pitch, 0-99 (default 50).
    pitch_range: tuple[int, int] = (30, 70)
    # espeak-ng amplitude (default 100): 60 leaves headroom so resampling and noise never clip.
    amplitude: int = 60
    # Signal-to-noise ratio of test_noisy, in dB, over the whole utterance.
    snr_db: float = 15.0
    # Output sample rate in Hz (espeak-ng synthesizes at 22050).
    sample_rate: int = 16000
    # Fewest words in a sentence; shorter grammar outputs are redrawn.
    min_words: int = 3
    # Most words in a sentence; longer grammar outputs are redrawn.
    max_words: int = 14

    def __post_init__(self):
        if not (self.dev_fraction > 0 and self.test_fraction > 0 and self.dev_fraction + self.test_fraction < 1):
            raise ValueError("dev_fraction and test_fraction must be positive and sum to less than 1")
        if min(split_sizes(self).values()) < 1:
            raise ValueError(f"num_utterances={self.num_utterances} leaves a split empty; use at least 10")
        overlap = sorted(set(self.train_voices) & set(self.test_voices))
        if overlap:
            raise ValueError(f"voices {overlap} are in both train_voices and test_voices; test voices must be unseen")
        for spec in (*self.train_voices, *self.test_voices):
            if not re.fullmatch(r"[a-z0-9-]+(\+[A-Za-z0-9]+)?", spec):
                raise ValueError(f"voice {spec!r} is not an espeak-ng `voice` or `voice+variant` spec")
        if not (
            80 <= self.rate_range[0] <= self.rate_range[1] <= 450
            and 0 <= self.pitch_range[0] <= self.pitch_range[1] <= 99
        ):
            raise ValueError(f"rate_range {self.rate_range} must lie in 80-450, pitch_range {self.pitch_range} in 0-99")
        if not 1 <= self.min_words <= self.max_words:
            raise ValueError(f"need 1 <= min_words <= max_words, got {self.min_words}, {self.max_words}")
        if not 0 < self.amplitude <= 200 or self.sample_rate < 8000:
            raise ValueError(
                f"need 0 < amplitude <= 200 and sample_rate >= 8000, got {self.amplitude}, {self.sample_rate}"
            )


def split_sizes(config: CorpusConfig) -> dict[str, int]:
    """Utterances per split: {"train", "dev", "test"} -> count, summing to num_utterances."""
    dev = round(config.num_utterances * config.dev_fraction)
    test = round(config.num_utterances * config.test_fraction)
    return {"train": config.num_utterances - dev - test, "dev": dev, "test": test}


# --- plan ---------------------------------------------------------------------------------------
class VoiceInventory(NamedTuple):
    """What this espeak-ng installation has: base voice names and variant names."""

    bases: frozenset[str]
    variants: frozenset[str]


class Speaker(NamedTuple):
    id: str  # Kaldi speaker id: voice spec, rate and pitch, e.g. "en-gb-x-rp-f2-r150-p45"
    voice: str  # espeak-ng spec, e.g. "en-gb-x-rp+f2"
    rate: int  # words per minute
    pitch: int  # espeak-ng pitch, 0-99


class PlannedUtterance(NamedTuple):
    split: str  # "train", "dev" or "test" (test_noisy mirrors test)
    utt_id: str  # starts with the speaker id, as Kaldi sorting requires
    speaker: str
    voice: str
    rate: int
    pitch: int
    text: str


def select_voices(
    config: CorpusConfig, inventory: VoiceInventory | None = None
) -> tuple[list[str], list[str], list[str]]:
    """(train voices, test voices, skipped voices): config voices that `inventory` has, in config order.

    inventory=None assumes every voice exists. Raises ValueError when fewer than
    MIN_TRAIN_VOICES / MIN_TEST_VOICES remain.
    """

    def exists(spec: str) -> bool:
        base, _, variant = spec.partition("+")
        return inventory is None or (base in inventory.bases and (not variant or variant in inventory.variants))

    train = [v for v in config.train_voices if exists(v)]
    test = [v for v in config.test_voices if exists(v)]
    skipped = [v for v in (*config.train_voices, *config.test_voices) if not exists(v)]
    if len(train) < MIN_TRAIN_VOICES or len(test) < MIN_TEST_VOICES:
        raise ValueError(
            f"only {len(train)} train and {len(test)} test voices exist here (need {MIN_TRAIN_VOICES} and "
            f"{MIN_TEST_VOICES}); missing: {skipped}. Check `espeak-ng --voices=en` and "
            "`espeak-ng --voices=variant`, and edit train_voices / test_voices"
        )
    return train, test, skipped


def _speaker(voice: str, config: CorpusConfig) -> Speaker:
    # Seeded per voice, not from one shared stream, so a skipped voice leaves the others unchanged.
    rng = random.Random(f"{config.seed}/{voice}")
    rate, pitch = rng.randint(*config.rate_range), rng.randint(*config.pitch_range)
    return Speaker(f"{voice.replace('+', '-')}-r{rate:03d}-p{pitch:02d}", voice, rate, pitch)


def plan_corpus(config: CorpusConfig, inventory: VoiceInventory | None = None) -> list[PlannedUtterance]:
    """Every utterance of the corpus, without synthesizing: train, then dev, then test.

    Sentences are unique across the corpus, so dev and test never repeat a training sentence.
    Utterances go round-robin over a shuffled speaker list; dev uses the speakers of train.
    """
    train_voices, test_voices, _ = select_voices(config, inventory)
    rng = random.Random(config.seed)
    seen: set[str] = set()
    plan: list[PlannedUtterance] = []
    used_in_train: list[Speaker] = []
    for split, size in split_sizes(config).items():
        if split == "dev":
            speakers = used_in_train
        else:
            speakers = [_speaker(v, config) for v in (train_voices if split == "train" else test_voices)]
            rng.shuffle(speakers)
        for i in range(size):
            for _ in range(1000):
                text = make_sentence(rng, config.min_words, config.max_words)
                if text not in seen:
                    break
            else:
                raise ValueError(f"the grammar ran out of new sentences after {len(seen)}; lower num_utterances")
            seen.add(text)
            spk = speakers[i % len(speakers)]
            plan.append(
                PlannedUtterance(split, f"{spk.id}-{len(plan) + 1:05d}", spk.id, spk.voice, spk.rate, spk.pitch, text)
            )
        if split == "train":
            used_in_train = speakers[:size]
    return plan


def kaldi_files(rows: Sequence[tuple[str, str, str, str]]) -> dict[str, str]:
    """(utt_id, speaker, text, wav path) rows -> contents of wav.scp, text, utt2spk, spk2utt, sorted."""
    rows = sorted(rows)
    spk2utt: dict[str, list[str]] = {}
    for utt, spk, _, _ in rows:
        spk2utt.setdefault(spk, []).append(utt)
    return {
        "wav.scp": "".join(f"{u} {p}\n" for u, _, _, p in rows),
        "text": "".join(f"{u} {t}\n" for u, _, t, _ in rows),
        "utt2spk": "".join(f"{u} {s}\n" for u, s, _, _ in rows),
        "spk2utt": "".join(f"{s} {' '.join(us)}\n" for s, us in sorted(spk2utt.items())),
    }


def mix_at_snr(clean: np.ndarray, noise: np.ndarray, snr_db: float) -> tuple[np.ndarray, float]:
    """Adds `noise` scaled so that 10 log10(power(clean) / power(noise)) is `snr_db`.

    clean: [samples] int16; noise: [samples] float (any scale). Returns the noisy [samples] int16
    and the SNR measured after rounding and clipping, in dB.
    """
    signal = clean.astype(np.float64)
    p_signal, p_noise = np.mean(signal**2), np.mean(np.asarray(noise, np.float64) ** 2)
    if p_signal == 0 or p_noise == 0:
        raise ValueError("mix_at_snr needs a non-silent signal and noise")
    gain = np.sqrt(p_signal / (p_noise * 10 ** (snr_db / 10)))
    noisy = np.clip(np.rint(signal + gain * noise), -32768, 32767).astype(np.int16)
    residual = noisy.astype(np.float64) - signal
    return noisy, float(10 * np.log10(p_signal / np.mean(residual**2)))


# --- I/O driver ---------------------------------------------------------------------------------
def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise FileNotFoundError(f"{name} is not on PATH; the corpus needs espeak-ng and sox: {INSTALL_HINT}")
    return path


def _run(cmd: list[str], what: str, **kwargs) -> bytes:
    proc = subprocess.run(cmd, capture_output=True, **kwargs)
    if proc.returncode != 0:
        raise RuntimeError(f"{what}: `{' '.join(cmd)}` exited {proc.returncode}: {proc.stderr.decode()[-2000:]}")
    return proc.stdout


def installed_voices() -> VoiceInventory:
    """Asks espeak-ng which English voices and which variants exist on this machine.

    Needed because espeak-ng does not fail on a missing voice: `-v en-xx` or `-v en+nosuch`
    silently speaks with the default voice, which would give two "speakers" the same voice.
    """
    bases, variants = set(), set()
    for line in _run([_tool("espeak-ng"), "--voices=en"], "listing voices").decode().splitlines()[1:]:
        fields = line.split()
        # mbrola voices (mb/) need separately installed data; !v/ entries are variants.
        if len(fields) >= 5 and not fields[4].startswith(("mb/", "!v/")):
            bases |= {fields[1], *re.findall(r"\((\S+) \d+\)", line)}
    for line in _run([_tool("espeak-ng"), "--voices=variant"], "listing variants").decode().splitlines()[1:]:
        variants |= set(re.findall(r"!v/(\S+)", line))
    return VoiceInventory(frozenset(bases), frozenset(variants))


def code_version() -> str:
    """Hash of this module's source: a changed grammar or pipeline invalidates old corpora."""
    return fsutil.code_version(sys.modules[__name__])


def _synthesize(utt: PlannedUtterance, wav: Path, config: CorpusConfig, espeak: str, sox: str) -> None:
    """espeak-ng (22050 Hz) piped through sox into a 16-bit mono wav at config.sample_rate."""
    speech = _run([espeak, "-v", utt.voice, "-s", str(utt.rate), "-p", str(utt.pitch),
                   "-a", str(config.amplitude), "--stdout", utt.text], f"espeak-ng for {utt.utt_id}")  # fmt: skip
    tmp = wav.with_name(wav.name + ".tmp")
    # -R: sox dithers with a fixed seed, so the same input gives byte-identical output.
    _run([sox, "-R", "-t", "wav", "-", "-t", "wav", "-r", str(config.sample_rate), "-c", "1", "-b", "16",
          "-e", "signed-integer", str(tmp)], f"sox for {utt.utt_id}", input=speech)  # fmt: skip
    tmp.replace(wav)


def _add_noise(utt_id: str, clean_wav: Path, noisy_wav: Path, noise: np.ndarray, config: CorpusConfig) -> float:
    """Writes clean_wav mixed with a slice of `noise` at config.snr_db to noisy_wav; returns the SNR."""
    clean, _ = sf.read(clean_wav, dtype="int16")
    # A per-utterance offset into one long noise recording, so utterances get different noise.
    start = random.Random(f"{config.seed}/noise/{utt_id}").randrange(len(noise))
    segment = np.resize(np.roll(noise, -start), len(clean))  # [samples], tiled if noise is shorter
    noisy, snr = mix_at_snr(clean, segment, config.snr_db)
    if abs(snr - config.snr_db) > 0.5:
        raise RuntimeError(f"{utt_id}: measured SNR {snr:.2f} dB, wanted {config.snr_db}; lower `amplitude`")
    tmp = noisy_wav.with_name(noisy_wav.name + ".tmp")
    sf.write(tmp, noisy, config.sample_rate, subtype="PCM_16", format="WAV")
    tmp.replace(noisy_wav)
    return snr


def _up_to_date(out: Path, config: CorpusConfig) -> dict | None:
    """corpus.json's content when it records this config and code version, else None."""
    try:
        done = json.loads((out / "corpus.json").read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None  # never built, or a marker that is not ours: build
    complete = all((out / split / "wav.scp").is_file() for split in ALL_SPLITS)
    same = done.get("config") == configlib.to_dict(config) and done.get("code_version") == code_version()
    return done if complete and same else None


def _render_all(plan, out: Path, config: CorpusConfig, jobs: int, espeak: str, sox: str) -> dict[str, float]:
    """Synthesizes every planned wav (and the noisy copy of each test wav); returns utt_id -> SNR dB."""
    noise_cmd = [sox, "-R", "-n", "-t", "raw", "-e", "floating-point", "-b", "32", "-L",
                 "-r", str(config.sample_rate), "-c", "1", "-", "synth", "30", "pinknoise"]  # fmt: skip
    noise = np.frombuffer(_run(noise_cmd, "making pink noise"), dtype="<f4")  # [30 s * sample_rate]

    def render(utt: PlannedUtterance) -> float | None:
        wav = out / "wav" / utt.split / f"{utt.utt_id}.wav"
        _synthesize(utt, wav, config, espeak, sox)
        if utt.split == "test":
            return _add_noise(utt.utt_id, wav, out / "wav" / "test_noisy" / wav.name, noise, config)
        return None

    snrs = {}
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        futures = {pool.submit(render, utt): utt.utt_id for utt in plan}
        try:
            for future in progress_bar(as_completed(futures), total=len(plan), desc="synthesizing", unit="utt"):
                if (snr := future.result()) is not None:
                    snrs[futures[future]] = snr
        except BaseException:
            pool.shutdown(cancel_futures=True)  # fail fast instead of synthesizing the rest
            raise
    return snrs


def _write_data_dirs(plan: list[PlannedUtterance], out: Path, snrs: dict[str, float]) -> dict[str, list]:
    """Writes the four Kaldi data dirs and snr.tsv, drops stale wavs; returns split -> rows."""
    rows: dict[str, list] = {split: [] for split in ALL_SPLITS}
    for utt in plan:
        for split in (utt.split, "test_noisy") if utt.split == "test" else (utt.split,):
            rows[split].append((utt.utt_id, utt.speaker, utt.text, str(out / "wav" / split / f"{utt.utt_id}.wav")))
    for split in ALL_SPLITS:
        for name, content in kaldi_files(rows[split]).items():
            fsutil.atomic_write_text(out / split / name, content)
        # Wavs of an earlier, different build (or its unfinished temporaries) would otherwise linger.
        keep = {Path(row[3]).name for row in rows[split]}
        for stale in (out / "wav" / split).iterdir():
            if stale.name not in keep:
                stale.unlink()
    table = "".join(f"{utt}\t{snr:.3f}\n" for utt, snr in sorted(snrs.items()))
    fsutil.atomic_write_text(out / "test_noisy" / "snr.tsv", "utt_id\tsnr_db\n" + table)
    return rows


def build_corpus(config: CorpusConfig, out_dir: str | Path, jobs: int | None = None) -> dict:
    """Synthesizes the corpus into out_dir (see the module docstring); returns corpus.json's content.

    Does nothing when out_dir/corpus.json already records this config and code version; `jobs`
    (default: CPUs) only changes the speed, never the output.
    """
    out = Path(out_dir).resolve()
    if re.search(r"\s", str(out)):
        raise ValueError(f"output directory {out} contains whitespace, which Kaldi's wav.scp cannot hold")
    if (done := _up_to_date(out, config)) is not None:
        log.info("%s is up to date with this config; nothing to do", out)
        return done
    if (out / "corpus.json").exists():
        log.info("%s was built with another config or code version, or is incomplete; rebuilding", out)
        (out / "corpus.json").unlink()  # first, so that an interrupted rebuild never looks done
    espeak, sox = _tool("espeak-ng"), _tool("sox")
    inventory = installed_voices()
    train_voices, test_voices, skipped = select_voices(config, inventory)
    for voice in skipped:
        log.warning("espeak-ng voice %s is not installed here; skipping it", voice)
    plan = plan_corpus(config, inventory)
    for split in ALL_SPLITS:
        (out / "wav" / split).mkdir(parents=True, exist_ok=True)
        (out / split).mkdir(parents=True, exist_ok=True)
    snrs = _render_all(plan, out, config, jobs or os.cpu_count() or 1, espeak, sox)
    rows = _write_data_dirs(plan, out, snrs)
    version = {tool: _run([tool, "--version"], f"{tool} --version").decode().strip() for tool in (espeak, sox)}
    summary = {
        "config": configlib.to_dict(config),
        "code_version": code_version(),
        "counts": {split: len(rows[split]) for split in ALL_SPLITS},
        "speakers": {split: sorted({row[1] for row in rows[split]}) for split in ALL_SPLITS},
        "voices": {"train": train_voices, "test": test_voices, "skipped": skipped},
        "vocabulary_size": len({w for utt in plan for w in utt.text.split()}),
        "grammar_vocabulary_size": len(grammar_vocabulary()),
        "snr_db": {
            "min": min(snrs.values()),
            "mean": math.fsum(snrs.values()) / len(snrs),  # fsum: exact, so the order of completion cannot show
            "max": max(snrs.values()),
        },
        "tools": {"espeak-ng": version[espeak], "sox": version[sox]},
    }
    fsutil.atomic_write_text(out / "corpus.json", json.dumps(summary, indent=1) + "\n")  # last: marks the corpus done
    log.info("wrote %s: %s utterances, %d words", out, summary["counts"], summary["vocabulary_size"])
    return summary


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipeline.corpus", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="corpus root to write (Kaldi data dirs, wav/, corpus.json)")
    parser.add_argument("--num-utterances", type=int, help="train + dev + test utterances (default 2500)")
    parser.add_argument("--seed", type=int, help="random seed (default 0)")
    cli.add_jobs_argument(parser)
    cli.add_config_arguments(parser, "CorpusConfig")
    args = parser.parse_args(argv)
    if args.jobs is not None and args.jobs < 1:
        parser.error("--jobs must be at least 1")
    return cli.run(lambda: _main(args))


def _main(args: argparse.Namespace) -> None:
    flags = {"num_utterances": args.num_utterances, "seed": args.seed}
    config = configlib.load(CorpusConfig, args.config, args.set, flags=flags)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    build_corpus(config, args.out, jobs=args.jobs or os.cpu_count())


if __name__ == "__main__":
    sys.exit(main())
