"""A demo speech corpus as a Kaldi data root, synthesized with espeak-ng, flite and Festival.

    python -m pipeline.corpus --out DIR [--num-utterances 2500] [--seed 0] [--jobs 2]
        [--engines espeak-ng flite festival] [--train-voices SPEC ...] [--test-voices SPEC ...]
        [--test-engine-voices SPEC ...] [--text open|grammar] [--text-file FILE]

writes `DIR/{train,dev,test,test_noisy,test_engine,dev_engine}/` (Kaldi data directories: `wav.scp`, `text`,
`utt2spk`, `spk2utt`, sorted by id, and `utt2voice`: each utterance's `ENGINE:VOICE`) over 16 kHz
mono 16-bit wavs under `DIR/wav/`, then `DIR/corpus.json` as the done marker. Voices are named
`ENGINE:VOICE` (common/voices.py): espeak-ng voices with variants (`espeak-ng:en-gb-x-rp+f2`),
flite voices (`flite:awb`) and Festival's (`festival:ked_diphone`). A speaker is a voice at its own
rate, pitch and warp (espeak-ng's `-s`/`-p`; the duration stretch, F0 and a sox `speed` warp of the
others); the few natural voices each make several speakers, and `natural_share` of the training
utterances are theirs. `test/` has espeak-ng voices training never hears, `test_noisy/` the same
utterances mixed with pink noise at a fixed SNR, and `test_engine/` the test sentences again in the
held-out natural speakers slt and kal, in every engine that has them (flite's slt, kal16 and kal,
Festival's slt HTS and kal diphone, as they ship), and `dev_engine/` new sentences in those voices, a dev
split for choosing decoding settings (models.tune_lm); both are left out when none of their voices is of
an engine in use. An engine that is not installed here is left out with a warning naming its
packages. Sentences come from open English text (`--text open`, the default: WordNet's example
sentences, or `--text-file`'s, normalized into what the voices say by pipeline/open_text.py; a
sentence that cannot be said as written is left out and counted in corpus.json) or from a small
grammar of commands, numbers, names, places and times (`--text grammar`). corpus.json records each
split's out-of-vocabulary rate against the training sentences' words.

`plan_corpus` (pipeline/corpus_plan.py) is the pure core (config -> list of utterances); `build_corpus`
runs each engine's batches (pipeline/engines/, one process per batch where the engine can) and sox
in a thread pool (the work happens in the subprocesses, so threads suffice).
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
import sys
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

import numpy as np
import soundfile as sf

from common import cli, fsutil, voices
from common import config as configlib
from common.progress import progress as progress_bar
from pipeline import corpus_plan, grammar, open_text, synthesizers
from pipeline.corpus_plan import (
    ALL_SPLITS,
    PlannedUtterance,
    corpus_splits,
    kaldi_files,
    plan_corpus,
    select_voices,
    split_sizes,
)
from pipeline.grammar import grammar_vocabulary
from pipeline.synthesizers import installed_voices

log = logging.getLogger(__name__)


TEXTS = ("open", "grammar")  # CorpusConfig.text


@dataclasses.dataclass(frozen=True)
class CorpusConfig:
    # Utterances in train + dev + test; test_noisy and test_engine mirror test, and with dev_engine are not counted.
    num_utterances: int = 2500
    # Seeds sentences, speaker rates and pitches, and noise offsets; same seed, same bytes.
    seed: int = 0
    # Share of num_utterances for dev (same speakers as train, new sentences).
    dev_fraction: float = 0.1
    # Share of num_utterances for test (unseen voices, new sentences); train gets the rest.
    test_fraction: float = 0.1
    # dev_engine, beside num_utterances as a share of it: new sentences in the test_engine voices, the
    # split decoding settings are chosen on (models.tune_lm) in voices training never hears; 0: none.
    dev_engine_fraction: float = 0.1
    # Synthesizers whose voices the corpus uses (of common/voices.py ENGINES); the voices below
    # of any other engine are left out.
    engines: tuple[str, ...] = voices.ENGINES
    # `ENGINE:VOICE` specs heard in training (dev uses the same speakers).
    train_voices: tuple[str, ...] = voices.TRAIN_VOICES
    # Held-out voices of the test split: for espeak-ng, a variant training never hears on an accent it does.
    test_voices: tuple[str, ...] = voices.TEST_VOICES
    # Voices of test_engine (the test sentences again), as they ship: never in training.
    test_engine_voices: tuple[str, ...] = voices.TEST_ENGINE_VOICES
    # (engine, n): each training voice of that engine makes n speakers, each its own rate, pitch
    # and warp; engines not named make one.
    speakers_per_voice: tuple[tuple[str, int], ...] = (("flite", 7), ("festival", 7))
    # Share of the train and dev utterances spoken by the natural voices' speakers (common/voices.py
    # EngineEntry.natural); the rest go to espeak-ng's. corpus.json records the share of seconds.
    natural_share: float = 0.25
    # Inclusive range of an espeak-ng speaker's rate, in words per minute (espeak-ng default 175).
    rate_range: tuple[int, int] = (130, 190)
    # Inclusive range of an espeak-ng speaker's pitch, 0-99 (default 50).
    pitch_range: tuple[int, int] = (30, 70)
    # Inclusive range of a flite or Festival speaker's duration stretch, in percent (100: the
    # voice's own pace; 130: 30% slower), about the spread of rate_range.
    stretch_range: tuple[int, int] = (90, 130)
    # Inclusive range of a flite speaker's int_f0_target_mean, in Hz: low male to female pitch.
    f0_range: tuple[int, int] = (85, 190)
    # Inclusive range of a flite or Festival speaker's vocal-tract warp, in percent (100: none): the
    # engine speaks duration_stretch x warp (flite also F0 / warp), then sox plays it `speed` warp
    # times faster, so pace (and flite's pitch) are as drawn and every formant moves by the warp
    # (vocal tract length perturbation: male voices then sound like shorter and longer vocal tracts).
    warp_range: tuple[int, int] = (90, 120)
    # espeak-ng amplitude (default 100): 60 leaves headroom so resampling and noise never clip.
    amplitude: int = 60
    # Signal-to-noise ratio of test_noisy, in dB, over the whole utterance.
    snr_db: float = 15.0
    # Output sample rate in Hz (espeak-ng synthesizes at 22050, flite at 16000 (its kal at 8000),
    # Festival's diphone voices at 16000 and its HTS voice at 32000).
    sample_rate: int = 16000
    # Where the sentences come from: "open" (English text: text_file's sentences, or WordNet's
    # example sentences; pipeline/open_text.py) or "grammar" (pipeline/grammar.py's commands).
    text: str = "open"
    # With text "open": a UTF-8 file of one sentence per line ("": WordNet's examples, Debian's wordnet-base).
    text_file: str = ""
    # Fewest words in a sentence; shorter ones are left out (grammar: redrawn).
    min_words: int = 3
    # Most words in a sentence; longer ones are left out (grammar: redrawn).
    max_words: int = 14

    def __post_init__(self):
        if not (self.dev_fraction > 0 and self.test_fraction > 0 and self.dev_fraction + self.test_fraction < 1):
            raise ValueError("dev_fraction and test_fraction must be positive and sum to less than 1")
        if not 0 <= self.dev_engine_fraction <= 1:
            raise ValueError(
                f"dev_engine_fraction must be 0 (no dev_engine split) to 1, got {self.dev_engine_fraction}"
            )
        if min(split_sizes(self).values()) < 1:
            raise ValueError(f"num_utterances={self.num_utterances} leaves a split empty; use at least 10")
        voices.check_engines(self.engines)
        groups = {"train_voices": self.train_voices, "test_voices": self.test_voices}
        groups["test_engine_voices"] = self.test_engine_voices
        for specs in groups.values():
            for spec in specs:
                voices.parse(spec)  # ValueError naming the spec
        names = list(groups)
        for i, a in enumerate(names):
            for b in names[i + 1 :]:
                if overlap := sorted(set(groups[a]) & set(groups[b])):
                    raise ValueError(f"voices {overlap} are in both {a} and {b}; held-out voices must be unseen")
        for engine, count in self.speakers_per_voice:
            if engine not in voices.ENGINES or count < 1:
                raise ValueError(
                    f"speakers_per_voice: ({engine!r}, {count}) needs an engine of {list(voices.ENGINES)} "
                    "and a count >= 1"
                )
        if not (
            80 <= self.rate_range[0] <= self.rate_range[1] <= 450
            and 0 <= self.pitch_range[0] <= self.pitch_range[1] <= 99
        ):
            raise ValueError(f"rate_range {self.rate_range} must lie in 80-450, pitch_range {self.pitch_range} in 0-99")
        if not (
            25 <= self.stretch_range[0] <= self.stretch_range[1] <= 400
            and 40 <= self.f0_range[0] <= self.f0_range[1] <= 400
            and 70 <= self.warp_range[0] <= self.warp_range[1] <= 150
        ):
            raise ValueError(
                f"stretch_range {self.stretch_range} must lie in 25-400 (percent), "
                f"f0_range {self.f0_range} in 40-400 (Hz), warp_range {self.warp_range} in 70-150 (percent)"
            )
        if not 0 <= self.natural_share <= 1:
            raise ValueError(f"natural_share must lie in 0-1, got {self.natural_share}")
        if self.text not in TEXTS:
            raise ValueError(f"text must be one of {list(TEXTS)}, got {self.text!r}")
        if self.text_file and self.text != "open":
            raise ValueError(f"text_file {self.text_file} is read with text 'open', not {self.text!r}")
        if not 1 <= self.min_words <= self.max_words:
            raise ValueError(f"need 1 <= min_words <= max_words, got {self.min_words}, {self.max_words}")
        if not 0 < self.amplitude <= 200 or self.sample_rate < 8000:
            raise ValueError(
                f"need 0 < amplitude <= 200 and sample_rate >= 8000, got {self.amplitude}, {self.sample_rate}"
            )


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
def code_version() -> str:
    """Hash of this module's source and the voice lists: a changed grammar, pipeline or default voice
    list invalidates old corpora."""
    runners = [sys.modules[synthesizers.engine(name).__class__.__module__] for name in voices.ENGINES]
    return fsutil.code_version(sys.modules[__name__], corpus_plan, synthesizers, grammar, open_text, voices, *runners)


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
    complete = all((out / split / "wav.scp").is_file() for split in done.get("counts", ALL_SPLITS))
    same = done.get("config") == configlib.to_dict(config) and done.get("code_version") == code_version()
    same = same and done.get("text", {}).get("sha256") == _text_source(config)["sha256"]
    return done if complete and same else None


def _text_source(config: CorpusConfig) -> dict:
    """What the sentences came from: {"source", "sha256" (of the raw text: a changed file rebuilds),
    "sentences" (usable), "left_out": {reason: count}}; for the grammar, its name and code hash."""
    if config.text == "grammar":
        return {"source": "grammar", "sha256": fsutil.code_version(grammar), "sentences": None, "left_out": {}}
    return open_text.load_pool(config.text_file, config.min_words, config.max_words)[1]


# Utterances an engine renders in one call (Festival: one process for all of them); small enough
# that the jobs share the work evenly and the progress bar moves.
BATCH = 12


def _render_all(plan, out: Path, config: CorpusConfig, jobs: int, tools: dict[str, str]) -> dict[str, float]:
    """Synthesizes every planned wav (and the noisy copy of each test wav), each engine's utterances
    in batches; returns utt_id -> SNR dB."""
    raw = ["-t", "raw", "-e", "floating-point", "-b", "32", "-L", "-r", str(config.sample_rate), "-c", "1"]
    noise_cmd = [tools["sox"], "-R", "-n", *raw, "-", "synth", "30", "pinknoise"]
    noise = np.frombuffer(synthesizers.run(noise_cmd, "making pink noise"), dtype="<f4")  # [30 s * sample_rate]

    def render(batch: list[PlannedUtterance]) -> dict[str, float]:
        wavs = [out / "wav" / utt.split / f"{utt.utt_id}.wav" for utt in batch]
        synthesizers.engine(batch[0].engine).render(batch, wavs, config.sample_rate, config.amplitude, tools)
        return {
            utt.utt_id: _add_noise(utt.utt_id, wav, out / "wav" / "test_noisy" / wav.name, noise, config)
            for utt, wav in zip(batch, wavs, strict=True)
            if utt.split == "test"
        }

    by_engine: dict[str, list[PlannedUtterance]] = {}
    for utt in plan:
        by_engine.setdefault(utt.engine, []).append(utt)
    batches = [utts[i : i + BATCH] for utts in by_engine.values() for i in range(0, len(utts), BATCH)]
    snrs: dict[str, float] = {}
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        futures = {pool.submit(render, batch): len(batch) for batch in batches}
        try:
            with progress_bar(total=len(plan), desc="synthesizing", unit="utt") as bar:
                for future in as_completed(futures):
                    snrs.update(future.result())
                    bar.update(futures[future])
        except BaseException:
            pool.shutdown(cancel_futures=True)  # fail fast instead of synthesizing the rest
            raise
    return snrs


def _write_data_dirs(plan: list[PlannedUtterance], out: Path, snrs: dict[str, float]) -> dict[str, list]:
    """Writes the Kaldi data dirs (with utt2voice) and snr.tsv, drops stale wavs and a split this plan
    does not make; returns split -> rows (utt_id, speaker, text, wav path, ENGINE:VOICE)."""
    splits = corpus_splits(plan)
    rows: dict[str, list] = {split: [] for split in splits}
    for utt in plan:
        for split in (utt.split, "test_noisy") if utt.split == "test" else (utt.split,):
            wav = str(out / "wav" / split / f"{utt.utt_id}.wav")
            rows[split].append((utt.utt_id, utt.speaker, utt.text, wav, utt.spec))
    for split in splits:
        for name, content in kaldi_files([row[:4] for row in rows[split]]).items():
            fsutil.atomic_write_text(out / split / name, content)
        fsutil.atomic_write_text(out / split / "utt2voice", "".join(f"{r[0]} {r[4]}\n" for r in sorted(rows[split])))
        # Wavs of an earlier, different build (or its unfinished temporaries) would otherwise linger.
        keep = {Path(row[3]).name for row in rows[split]}
        for stale in (out / "wav" / split).iterdir():
            if stale.name not in keep:
                stale.unlink()
    for split in set(ALL_SPLITS) - set(splits):  # an earlier build's test_engine
        for stale in (out / split, out / "wav" / split):
            shutil.rmtree(stale, ignore_errors=True)
    table = "".join(f"{utt}\t{snr:.3f}\n" for utt, snr in sorted(snrs.items()))
    fsutil.atomic_write_text(out / "test_noisy" / "snr.tsv", "utt_id\tsnr_db\n" + table)
    return rows


def _natural_share_seconds(rows: list) -> float:
    """Share of the seconds of `rows` (utt_id, speaker, text, wav, ENGINE:VOICE) in natural voices."""
    seconds = {True: 0.0, False: 0.0}
    for row in rows:
        seconds[voices.is_natural(row[4])] += sf.info(row[3]).duration
    return round(seconds[True] / (sum(seconds.values()) or 1), 4)


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
    tools, engines = _installed_engines(config)
    inventory = installed_voices(engines, tools)
    selection = select_voices(config, inventory)
    for voice in selection.skipped:
        log.warning("voice %s is not installed here; skipping it", voice)
    plan = plan_corpus(config, inventory)
    for split in corpus_splits(plan):
        (out / "wav" / split).mkdir(parents=True, exist_ok=True)
        (out / split).mkdir(parents=True, exist_ok=True)
    snrs = _render_all(plan, out, config, jobs or os.cpu_count() or 1, tools)
    rows = _write_data_dirs(plan, out, snrs)
    summary = _summary(config, plan, rows, snrs, selection.skipped, tools)
    fsutil.atomic_write_text(out / "corpus.json", json.dumps(summary, indent=1) + "\n")  # last: marks the corpus done
    _log_summary(out, summary)
    return summary


def _installed_engines(config: CorpusConfig) -> tuple[dict[str, str], list[str]]:
    """(tool name -> path, sox's and the engines', the engines of `config` installed here, in
    voices.ENGINES' order); an engine that is not installed is left out with a warning naming its packages."""
    tools = {"sox": synthesizers.tool("sox", config.engines)}
    engines = []
    for name in (e for e in voices.ENGINES if e in config.engines):
        try:
            tools |= synthesizers.tools_of([name])
            engines.append(name)
        except FileNotFoundError:
            hint = synthesizers.install_hint([name])
            log.warning("%s is not installed here: its voices are left out of the corpus (%s)", name, hint)
    return tools, engines


def _summary(
    config: CorpusConfig, plan: list, rows: dict[str, list], snrs: dict[str, float], skipped: list, tools: dict
) -> dict:
    """corpus.json's content: the config and code, each split's counts, speakers, voices and engines,
    the words and their out-of-vocabulary rates, the noisy copies' SNRs and the tools' versions."""
    splits = corpus_splits(plan)
    return {
        "config": configlib.to_dict(config),
        "code_version": code_version(),
        "counts": {split: len(rows[split]) for split in splits},
        "speakers": {split: sorted({row[1] for row in rows[split]}) for split in splits},
        # Which voices each split has, and how many of its utterances each engine spoke.
        "voices": {split: sorted({row[4] for row in rows[split]}) for split in splits},
        "engines": {
            split: dict(sorted(Counter(voices.parse(row[4])[0] for row in rows[split]).items())) for split in splits
        },
        "skipped_voices": skipped,
        # Of the train split's seconds, the share spoken by natural voices (config.natural_share counts utterances).
        "natural_share_seconds": _natural_share_seconds(rows["train"]),
        "vocabulary_size": len({w for utt in plan for w in utt.text.split()}),
        "grammar_vocabulary_size": len(grammar_vocabulary()),
        "text": _text_source(config),
        # Of each split's word tokens, the share that no training sentence has.
        "oov_rate": open_text.oov_rates(
            {split: [row[2] for row in rows[split]] for split in splits},
            {w for row in rows["train"] for w in row[2].split()},
        ),
        "snr_db": {
            "min": min(snrs.values()),
            "mean": math.fsum(snrs.values()) / len(snrs),  # fsum: exact, so the order of completion cannot show
            "max": max(snrs.values()),
        },
        "tools": {name: synthesizers.version(path) for name, path in tools.items()},
    }


def _log_summary(out: Path, summary: dict) -> None:
    voices_per_split = {split: voices.describe(v) for split, v in summary["voices"].items()}
    counts, words = summary["counts"], summary["vocabulary_size"]
    log.info("wrote %s: %s utterances, %d words; voices: %s", out, counts, words, voices_per_split)
    source = summary["text"]
    log.info(
        "sentences from %s (%s usable; left out: %s); out-of-vocabulary words per split: %s",
        source["source"],
        source["sentences"],
        source["left_out"] or "none",
        summary["oov_rate"],
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipeline.corpus", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="corpus root to write (Kaldi data dirs, wav/, corpus.json)")
    parser.add_argument("--num-utterances", type=int, help="train + dev + test utterances (default 2500)")
    parser.add_argument("--seed", type=int, help="random seed (default 0)")
    parser.add_argument(
        "--engines", nargs="+", choices=voices.ENGINES, help="synthesizers whose voices to use (default: all)"
    )
    parser.add_argument(
        "--train-voices", nargs="+", metavar="ENGINE:VOICE", help="voices heard in training (default: common/voices.py)"
    )
    parser.add_argument("--test-voices", nargs="+", metavar="ENGINE:VOICE", help="held-out voices of the test split")
    parser.add_argument(
        "--test-engine-voices",
        nargs="+",
        metavar="ENGINE:VOICE",
        help="voices of test_engine, the test sentences in the held-out natural speakers' voices (default: "
        "common/voices.py TEST_ENGINE_VOICES)",
    )
    parser.add_argument("--text", choices=TEXTS, help="open English text (default) or the grammar's sentences")
    parser.add_argument(
        "--text-file", help="with --text open: a UTF-8 file of one sentence per line (default: WordNet's examples)"
    )
    cli.add_jobs_argument(parser)
    cli.add_config_arguments(parser, "CorpusConfig")
    args = parser.parse_args(argv)
    if args.jobs is not None and args.jobs < 1:
        parser.error("--jobs must be at least 1")
    return cli.run(lambda: _main(args))


def _main(args: argparse.Namespace) -> None:
    flags = {
        "num_utterances": args.num_utterances,
        "seed": args.seed,
        "engines": args.engines,
        "train_voices": args.train_voices,
        "test_voices": args.test_voices,
        "test_engine_voices": args.test_engine_voices,
        "text": args.text,
        "text_file": args.text_file,
    }
    config = configlib.load(CorpusConfig, args.config, args.set, flags=flags)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    build_corpus(config, args.out, jobs=args.jobs or os.cpu_count())


if __name__ == "__main__":
    sys.exit(main())
