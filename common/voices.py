"""The demo corpus' synthesizers and their voices, by name: the registry of engines, and the voices
each group of the corpus hears. Names only, so the DAG form and the plan read them.

A voice is named `ENGINE:VOICE`:
  espeak-ng:en-gb-x-rp+f2        an espeak-ng voice (`espeak-ng --voices=en`) with a variant
                                 (`espeak-ng --voices=variant`), the timbre: formant synthesis
  flite:awb                      a flite voice (`flite -lv`): awb (Scottish English male), rms (US
                                 male) and slt (US female) are statistical voices, kal and kal16
                                 (US male, 8 and 16 kHz) diphone ones
  festival:ked_diphone           a Festival voice (`(voice.list)`): ked and kal (US male) diphone
                                 voices, cmu_us_slt_arctic_hts (US female, HTS)

An engine is one registered module (`EngineEntry.runner`, pipeline/engines/): its voice inventory,
its speakers and its batch runner; pipeline/corpus.py runs whichever engines are registered. The
statistical and diphone voices are built from recordings of real people (`EngineEntry.natural`);
their speakers slt (female) and kal (male) are held out in every engine that has them
(`TEST_ENGINE_VOICES`), and training's natural speakers are awb, rms and ked. Nothing here imports
numpy or TensorFlow (the Airflow image has neither).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable


@dataclasses.dataclass(frozen=True)
class EngineEntry:
    name: str  # the ENGINE of ENGINE:VOICE
    voice_pattern: str  # a regular expression every VOICE of this engine matches
    example: str  # a voice of it, for error messages: "flite:awb"
    runner: str  # "module:attribute" of its pipeline/engines/ Engine, imported only to synthesize
    packages: tuple[str, ...]  # Debian packages that install it and its voices
    # Its voices are built from recordings of real speakers (diphone, unit or statistical
    # synthesis), not formant rules: the natural share of training counts their seconds.
    natural: bool = False


_ENGINES: dict[str, EngineEntry] = {}


def register_engine(entry: EngineEntry) -> EngineEntry:
    re.compile(entry.voice_pattern)  # re.error naming the pattern
    _ENGINES[entry.name] = entry
    global ENGINES
    ENGINES = tuple(_ENGINES)
    return entry


def engine(name: str) -> EngineEntry:
    """The registered engine `name`; ValueError naming the registered ones."""
    if name not in _ENGINES:
        raise ValueError(f"no synthesizer engine {name!r} is registered; the engines are {list(_ENGINES)}")
    return _ENGINES[name]


ENGINES: tuple[str, ...] = ()
register_engine(
    EngineEntry(
        "espeak-ng",
        r"[a-z0-9-]+(\+[A-Za-z0-9]+)?",
        "espeak-ng:en-us+f2",
        "pipeline.engines.espeak_ng:ENGINE",
        ("espeak-ng",),
    )
)
register_engine(EngineEntry("flite", r"[A-Za-z0-9_]+", "flite:awb", "pipeline.engines.flite:ENGINE", ("flite",), True))
register_engine(
    EngineEntry(
        "festival",
        r"[A-Za-z0-9_]+",
        "festival:ked_diphone",
        "pipeline.engines.festival:ENGINE",
        ("festival", "festvox-kdlpc16k", "festvox-kallpc16k", "festvox-us-slt-hts"),
        True,
    )
)

# Every accent espeak-ng has for English is heard in training, as in a real corpus whose test
# speakers are new people from the same dialect regions; the variants (the voice timbre) m3, f4,
# m7 and klatt3 are never heard in training and make the test voices.
ESPEAK_ACCENTS = ("en", "en-us", "en-gb-x-rp", "en-gb-scotland", "en-029", "en-gb-x-gbclan", "en-gb-x-gbcwmd")
ESPEAK_TRAIN_VARIANTS = ("m1", "m2", "m4", "m6", "f1", "f2", "f3", "klatt")
# The natural speakers heard in training: awb, rms (flite) and ked (Festival).
NATURAL_TRAIN_VOICES = ("flite:awb", "flite:rms", "festival:ked_diphone")
TRAIN_VOICES = (
    *(f"espeak-ng:{accent}+{variant}" for accent in ESPEAK_ACCENTS for variant in ESPEAK_TRAIN_VARIANTS),
    *NATURAL_TRAIN_VOICES,
)
TEST_VOICES = tuple(
    f"espeak-ng:{v}"
    for v in (
        "en+m3",
        "en-us+f4",
        "en-gb-x-rp+m7",
        "en-gb-scotland+klatt3",
        "en-029+m3",
        "en-gb-x-gbclan+f4",
        "en-gb-x-gbcwmd+m7",
        "en-us+klatt3",
    )
)
# The held-out speakers slt (female) and kal (male) in every rendering the engines have.
TEST_ENGINE_VOICES = (
    "flite:slt",
    "flite:kal16",
    "flite:kal",
    "festival:cmu_us_slt_arctic_hts",
    "festival:kal_diphone",
)


def parse(spec: str) -> tuple[str, str]:
    """`ENGINE:VOICE` -> (engine, voice); ValueError naming the spec and the expected form."""
    name, sep, voice = spec.partition(":")
    if not sep or name not in _ENGINES:
        raise ValueError(
            f"voice {spec!r} does not name its engine: write ENGINE:VOICE with ENGINE one of "
            f"{', '.join(_ENGINES)}, e.g. {' or '.join(e.example for e in _ENGINES.values())}"
        )
    if not re.fullmatch(_ENGINES[name].voice_pattern, voice):
        raise ValueError(f"voice {spec!r}: {voice!r} is not a {name} voice name")
    return name, voice


def is_natural(spec: str) -> bool:
    """Whether the voice is built from recordings of a real speaker (its engine's `natural`)."""
    return engine(parse(spec)[0]).natural


def is_natural_speaker(speaker: str) -> bool:
    """Whether a demo corpus speaker id (pipeline/engines/ `speaker_id`) is one of a natural voice:
    those ids start with their engine's name ("flite-awb-r110", "festival-ked_diphone-r101")."""
    return any(speaker.startswith(f"{e.name}-") for e in _ENGINES.values() if e.natural)


def of_engines(specs: Iterable[str], engines: Iterable[str]) -> tuple[str, ...]:
    """The specs whose engine is one of `engines`, in their order."""
    keep = set(engines)
    return tuple(s for s in specs if parse(s)[0] in keep)


def check_engines(engines: Iterable[str]) -> tuple[str, ...]:
    """`engines` as a tuple; ValueError when one is unknown or none is given."""
    engines = tuple(engines)
    unknown = [e for e in engines if e not in _ENGINES]
    if unknown or not engines:
        raise ValueError(f"engines must be a non-empty selection of {list(_ENGINES)}, got {list(engines)}")
    return engines


def describe(specs: Iterable[str], most: int = 4) -> str:
    """Voices grouped by engine, for people: `espeak-ng (56 voices), flite (awb, rms)`; an engine's
    voices are named when it has at most `most`."""
    by_engine: dict[str, list[str]] = {}
    for spec in specs:
        name, voice = parse(spec)
        by_engine.setdefault(name, []).append(voice)
    return ", ".join(
        f"{name} ({', '.join(vs) if len(vs) <= most else f'{len(vs)} voices'})" for name, vs in by_engine.items()
    )
