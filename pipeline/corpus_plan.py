"""The demo corpus' plan, its pure core: which speakers (a voice at its own rate, pitch and warp)
speak which sentences in which split, from a `CorpusConfig` (pipeline/corpus.py; `config` below) and
the voices this machine has; and the Kaldi tables of a split. No engine runs here (pipeline/synthesizers.py runs them).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import NamedTuple

from common import voices
from pipeline.grammar import make_sentence
from pipeline.synthesizers import VoiceInventory

SPLITS = ("train", "dev", "test", "test_engine")  # what the plan holds; test_noisy mirrors test
ALL_SPLITS = ("train", "dev", "test", "test_noisy", "test_engine")
# Fewer voices than this and a model trained on the corpus cannot learn speaker-independent
# features, or the test set cannot show whether it did.
MIN_TRAIN_VOICES, MIN_TEST_VOICES = 2, 1
# flite voices whose F0 model (rms: SPAM) ignores int_f0_target_mean: they keep their own pitch,
# and their speakers differ in rate only (tests/test_corpus.py checks it still holds).
FLITE_OWN_PITCH = frozenset({"rms"})


def split_sizes(config) -> dict[str, int]:
    """Utterances per split: {"train", "dev", "test"} -> count, summing to num_utterances."""
    dev = round(config.num_utterances * config.dev_fraction)
    test = round(config.num_utterances * config.test_fraction)
    return {"train": config.num_utterances - dev - test, "dev": dev, "test": test}


class Speaker(NamedTuple):
    # Kaldi speaker id: espeak-ng voice, rate and pitch ("en-gb-x-rp-f2-r150-p45"), or for flite
    # "flite-", voice, duration stretch, F0 and warp ("flite-awb-r110-p140-w115"; no -p: the voice's
    # own pitch, no -w: no warp, nothing after the voice: as it ships)
    id: str
    engine: str  # "espeak-ng" or "flite"
    voice: str  # the engine's name of it: "en-gb-x-rp+f2", "awb"
    rate: int  # espeak-ng: words per minute; flite: duration_stretch in percent (100: its own)
    pitch: int  # espeak-ng: pitch 0-99; flite: int_f0_target_mean in Hz (0: its own)
    warp: int = 100  # flite: vocal-tract warp in percent (CorpusConfig.warp_range); 100: none


class PlannedUtterance(NamedTuple):
    split: str  # "train", "dev", "test" or "test_engine" (test_noisy mirrors test)
    utt_id: str  # starts with the speaker id, as Kaldi sorting requires
    speaker: str
    engine: str
    voice: str
    rate: int
    pitch: int
    text: str
    warp: int = 100

    @property
    def spec(self) -> str:
        """`ENGINE:VOICE`, as the config and utt2voice name it."""
        return f"{self.engine}:{self.voice}"


class VoiceSelection(NamedTuple):
    """The config's voices of the engines in use that this machine has, in config order."""

    train: list[str]
    test: list[str]
    test_engine: list[str]  # empty: no test_engine split
    skipped: list[str]  # of the engines in use, but not installed here


def select_voices(config, inventory: VoiceInventory | None = None) -> VoiceSelection:
    """The voices of `config.engines` that `inventory` has (None: assume every voice exists).

    Raises ValueError when fewer than MIN_TRAIN_VOICES / MIN_TEST_VOICES remain, or when the
    test_engine voices of the engines in use are all missing.
    """

    def exists(spec: str) -> bool:
        return inventory is None or inventory.has(spec)

    wanted = {
        name: voices.of_engines(specs, config.engines)
        for name, specs in (
            ("train", config.train_voices),
            ("test", config.test_voices),
            ("test_engine", config.test_engine_voices),
        )
    }
    found = {name: [v for v in specs if exists(v)] for name, specs in wanted.items()}
    skipped = [v for specs in wanted.values() for v in specs if not exists(v)]
    engines = ", ".join(config.engines)
    if len(found["train"]) < MIN_TRAIN_VOICES or len(found["test"]) < MIN_TEST_VOICES:
        raise ValueError(
            f"only {len(found['train'])} train and {len(found['test'])} test voices of the engines in use "
            f"({engines}) exist here (need {MIN_TRAIN_VOICES} and {MIN_TEST_VOICES}); missing: {skipped}. Check "
            "`espeak-ng --voices=en`, `espeak-ng --voices=variant` and `flite -lv`, and edit train_voices / "
            "test_voices (ENGINE:VOICE) or engines"
        )
    if wanted["test_engine"] and not found["test_engine"]:
        raise ValueError(
            f"none of the test_engine voices {list(wanted['test_engine'])} exists here; check `flite -lv` "
            "and edit test_engine_voices"
        )
    return VoiceSelection(found["train"], found["test"], found["test_engine"], skipped)


def _speaker_id(engine: str, voice: str, rate: int | None, pitch: int | None, warp: int = 100) -> str:
    if engine == "espeak-ng":
        return f"{voice.replace('+', '-')}-r{rate:03d}-p{pitch:02d}"
    parts = [f"flite-{voice}"]
    parts += [f"r{rate:03d}"] if rate is not None else []
    parts += [f"p{pitch:03d}"] if pitch else []
    parts += [f"w{warp:03d}"] if warp != 100 else []
    return "-".join(parts)


def _speakers(spec: str, count: int, config) -> list[Speaker]:
    """`count` speakers of one voice, each its own rate and pitch."""
    engine, voice = voices.parse(spec)
    # Seeded per voice, not from one shared stream, so a skipped voice leaves the others unchanged.
    rng = random.Random(f"{config.seed}/{spec}")
    speakers: dict[str, Speaker] = {}
    for _ in range(1000 * count):
        warp = 100
        if engine == "espeak-ng":
            rate, pitch = rng.randint(*config.rate_range), rng.randint(*config.pitch_range)
        else:
            rate, pitch = rng.randint(*config.stretch_range), rng.randint(*config.f0_range)
            pitch = 0 if voice in FLITE_OWN_PITCH else pitch
            warp = rng.randint(*config.warp_range)
        speaker = Speaker(_speaker_id(engine, voice, rate, pitch, warp), engine, voice, rate, pitch, warp)
        speakers.setdefault(speaker.id, speaker)
        if len(speakers) == count:
            return list(speakers.values())
    raise ValueError(f"{spec}: the rate, pitch and warp ranges hold fewer than {count} speakers; widen them")


def _as_shipped(spec: str) -> Speaker:
    engine, voice = voices.parse(spec)
    if engine == "espeak-ng":  # its defaults: 175 words per minute, pitch 50
        return Speaker(_speaker_id(engine, voice, 175, 50), engine, voice, 175, 50)
    return Speaker(_speaker_id(engine, voice, None, 0), engine, voice, 100, 0)


def plan_corpus(config, inventory: VoiceInventory | None = None) -> list[PlannedUtterance]:
    """Every utterance of the corpus, without synthesizing: train, dev, test, then test_engine.

    Sentences are unique across train, dev and test, so dev and test never repeat a training
    sentence; test_engine speaks the test sentences again. Utterances go round-robin over a
    shuffled speaker list; dev uses the speakers of train.
    """
    selection = select_voices(config, inventory)
    per_voice = dict(config.speakers_per_voice)
    rng = random.Random(config.seed)
    seen: set[str] = set()
    plan: list[PlannedUtterance] = []
    used_in_train: list[Speaker] = []
    for split, size in split_sizes(config).items():
        if split == "dev":
            speakers = used_in_train
        elif split == "train":
            speakers = [s for v in selection.train for s in _speakers(v, per_voice.get(voices.parse(v)[0], 1), config)]
            rng.shuffle(speakers)
        else:
            speakers = [s for v in selection.test for s in _speakers(v, 1, config)]
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
            plan.append(PlannedUtterance(split, f"{spk.id}-{len(plan) + 1:05d}", spk.id, *spk[1:5], text, spk.warp))
        if split == "train":
            used_in_train = speakers[:size]
    # The held-out engine's voices say the test sentences, with the test utterances' numbers.
    engine_speakers = [_as_shipped(v) for v in selection.test_engine]
    for i, utt in enumerate([u for u in plan if u.split == "test"] if engine_speakers else []):
        spk = engine_speakers[i % len(engine_speakers)]
        number = utt.utt_id.rsplit("-", 1)[1]
        plan.append(PlannedUtterance("test_engine", f"{spk.id}-{number}", spk.id, *spk[1:5], utt.text, spk.warp))
    return plan


def corpus_splits(plan: Sequence[PlannedUtterance]) -> tuple[str, ...]:
    """The splits a plan makes, of ALL_SPLITS: test_engine only when it has voices."""
    return tuple(s for s in ALL_SPLITS if s != "test_engine" or any(u.split == s for u in plan))


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
