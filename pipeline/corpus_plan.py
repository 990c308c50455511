"""The demo corpus' plan, its pure core: which speakers (a voice at its own rate, pitch and warp)
speak which sentences in which split, from a `CorpusConfig` (pipeline/corpus.py; `config` below) and
the voices this machine has; and the Kaldi tables of a split. No engine runs here (pipeline/synthesizers.py runs them).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import NamedTuple

from common import voices
from pipeline import open_text, synthesizers
from pipeline.grammar import make_sentence
from pipeline.synthesizers import VoiceInventory

SPLITS = ("train", "dev", "test", "test_engine", "dev_engine")  # what the plan holds; test_noisy mirrors test
ALL_SPLITS = ("train", "dev", "test", "test_noisy", "test_engine", "dev_engine")
ENGINE_SPLITS = ("test_engine", "dev_engine")  # in the held-out natural speakers' voices: made only where one exists
# Fewer voices than this and a model trained on the corpus cannot learn speaker-independent
# features, or the test set cannot show whether it did.
MIN_TRAIN_VOICES, MIN_TEST_VOICES = 2, 1


def split_sizes(config) -> dict[str, int]:
    """Utterances per split: {"train", "dev", "test"} -> count, summing to num_utterances."""
    dev = round(config.num_utterances * config.dev_fraction)
    test = round(config.num_utterances * config.test_fraction)
    return {"train": config.num_utterances - dev - test, "dev": dev, "test": test}


class Speaker(NamedTuple):
    # Kaldi speaker id, the engine's `speaker_id`: espeak-ng voice, rate and pitch
    # ("en-gb-x-rp-f2-r150-p45"); for flite and Festival the engine, voice, duration stretch, F0
    # and warp ("flite-awb-r110-p140-w115"; no -p: the voice's own pitch, no -w: no warp, nothing
    # after the voice: as it ships)
    id: str
    engine: str  # a registered engine (common/voices.py): "espeak-ng", "flite", "festival"
    voice: str  # the engine's name of it: "en-gb-x-rp+f2", "awb", "ked_diphone"
    rate: int  # espeak-ng: words per minute; flite, Festival: duration stretch in percent (100: its own)
    pitch: int  # espeak-ng: pitch 0-99; flite: int_f0_target_mean in Hz (0: its own)
    warp: int = 100  # vocal-tract warp in percent (CorpusConfig.warp_range); 100: none


class PlannedUtterance(NamedTuple):
    split: str  # "train", "dev", "test", "test_engine" or "dev_engine" (test_noisy mirrors test)
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
            f"{_listings(config.engines)}, and edit train_voices / test_voices (ENGINE:VOICE) or engines"
        )
    if wanted["test_engine"] and not found["test_engine"]:
        raise ValueError(
            f"none of the test_engine voices {list(wanted['test_engine'])} exists here; check "
            f"{_listings(config.engines)} and edit test_engine_voices"
        )
    return VoiceSelection(found["train"], found["test"], found["test_engine"], skipped)


def _listings(engines) -> str:
    return " and ".join(synthesizers.engine(e).listing for e in engines)


def _speakers(spec: str, count: int, config) -> list[Speaker]:
    """`count` speakers of one voice, each its own rate and pitch."""
    name, voice = voices.parse(spec)
    engine = synthesizers.engine(name)
    # Seeded per voice, not from one shared stream, so a skipped voice leaves the others unchanged.
    rng = random.Random(f"{config.seed}/{spec}")
    speakers: dict[str, Speaker] = {}
    for _ in range(1000 * count):
        rate, pitch, warp = engine.draw(voice, rng, config)
        speaker = Speaker(engine.speaker_id(voice, rate, pitch, warp), name, voice, rate, pitch, warp)
        speakers.setdefault(speaker.id, speaker)
        if len(speakers) == count:
            return list(speakers.values())
    raise ValueError(f"{spec}: the rate, pitch and warp ranges hold fewer than {count} speakers; widen them")


def _as_shipped(spec: str) -> Speaker:
    name, voice = voices.parse(spec)
    engine = synthesizers.engine(name)
    rate, pitch, warp = engine.shipped(voice)
    return Speaker(engine.speaker_id(voice, rate, pitch, warp), name, voice, 100 if rate is None else rate, pitch, warp)


def _heard_speakers(natural: list[Speaker], others: list[Speaker], size: int, share: float, rng) -> list[Speaker]:
    """The speaker of each of `size` utterances of train or dev: a `share` of them natural
    speakers (all or none when only one kind is heard), round-robin within each kind, shuffled."""
    count = size if not others else 0 if not natural else round(size * share)
    slots = [natural[i % len(natural)] for i in range(count)] + [others[i % len(others)] for i in range(size - count)]
    rng.shuffle(slots)
    return slots


def sentence_draw(config, rng: random.Random, sentences: Sequence[str] | None = None):
    """A function giving the next sentence of the corpus' text, never one it gave before:
    `config.text` "open" (the shuffled `sentences`, by default open_text.load_pool's of
    `config.text_file`) or "grammar" (pipeline/grammar.py's, redrawn until new)."""
    if config.text == "grammar":
        seen: set[str] = set()

        def from_grammar() -> str:
            for _ in range(1000):
                text = make_sentence(rng, config.min_words, config.max_words)
                if text not in seen:
                    seen.add(text)
                    return text
            raise ValueError(f"the grammar ran out of new sentences after {len(seen)}; lower num_utterances")

        return from_grammar
    if sentences is None:
        sentences = open_text.load_pool(config.text_file, config.min_words, config.max_words)[0]
    pool = list(sentences)
    random.Random(f"{config.seed}/text").shuffle(pool)
    source = iter(pool)

    def from_pool() -> str:
        text = next(source, None)
        if text is None:
            raise ValueError(
                f"the text has {len(pool)} usable sentences of {config.min_words}-{config.max_words} words, fewer "
                "than num_utterances and dev_engine's share of it (dev_engine_fraction); lower num_utterances or "
                "dev_engine_fraction, widen min_words/max_words or give a larger text_file"
            )
        return text

    return from_pool


def plan_corpus(
    config, inventory: VoiceInventory | None = None, sentences: Sequence[str] | None = None
) -> list[PlannedUtterance]:
    """Every utterance of the corpus, without synthesizing: train, dev, test, test_engine, then dev_engine.

    Sentences are unique across train, dev, test and dev_engine, so no other split repeats a training
    sentence; test_engine speaks the test sentences again, and dev_engine new ones in the same voices
    (`config.dev_engine_fraction` of num_utterances, drawn last so that the other splits' sentences do not
    depend on it: a split for choosing decoding settings in voices training never hears). In train and dev
    (the same speakers) `config.natural_share` of the utterances go to the natural voices' speakers; test's go
    round-robin over a shuffled list of the held-out voices. `sentences`: the open text's
    normalized sentences (default: `config.text_file`'s, or WordNet's; see `sentence_draw`).
    """
    selection = select_voices(config, inventory)
    per_voice = dict(config.speakers_per_voice)
    rng = random.Random(config.seed)
    next_sentence = sentence_draw(config, rng, sentences)
    plan: list[PlannedUtterance] = []
    heard = [s for v in selection.train for s in _speakers(v, per_voice.get(voices.parse(v)[0], 1), config)]
    natural = [s for s in heard if voices.engine(s.engine).natural]
    others = [s for s in heard if not voices.engine(s.engine).natural]
    rng.shuffle(natural)
    rng.shuffle(others)
    held_out = [s for v in selection.test for s in _speakers(v, 1, config)]
    rng.shuffle(held_out)
    for split, size in split_sizes(config).items():
        if split == "test":
            speakers = [held_out[i % len(held_out)] for i in range(size)]
        else:  # train, and dev in the same speakers and the same natural share
            speakers = _heard_speakers(natural, others, size, config.natural_share, rng)
        for spk in speakers:
            text = next_sentence()
            plan.append(PlannedUtterance(split, f"{spk.id}-{len(plan) + 1:05d}", spk.id, *spk[1:5], text, spk.warp))
    # The held-out engine's voices say the test sentences, with the test utterances' numbers.
    engine_speakers = [_as_shipped(v) for v in selection.test_engine]
    for i, utt in enumerate([u for u in plan if u.split == "test"] if engine_speakers else []):
        spk = engine_speakers[i % len(engine_speakers)]
        number = utt.utt_id.rsplit("-", 1)[1]
        plan.append(PlannedUtterance("test_engine", f"{spk.id}-{number}", spk.id, *spk[1:5], utt.text, spk.warp))
    for i in range(round(config.num_utterances * config.dev_engine_fraction) if engine_speakers else 0):
        spk = engine_speakers[i % len(engine_speakers)]
        plan.append(
            PlannedUtterance(
                "dev_engine", f"{spk.id}-{len(plan) + 1:05d}", spk.id, *spk[1:5], next_sentence(), spk.warp
            )
        )
    return plan


def corpus_splits(plan: Sequence[PlannedUtterance]) -> tuple[str, ...]:
    """The splits a plan makes, of ALL_SPLITS: test_engine and dev_engine only when they have utterances."""
    return tuple(s for s in ALL_SPLITS if s not in ENGINE_SPLITS or any(u.split == s for u in plan))


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
