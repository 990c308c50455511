"""A pronunciation lexicon: a Kaldi dict dir read, validated and written, and G2P for missing words.

A Kaldi dict dir (`data/local/dict`) holds:
- `lexiconp.txt` (`WORD PROB PHONE...`) or `lexicon.txt` (`WORD PHONE...`; every probability 1.0);
  a word may have several lines, one per pronunciation;
- `nonsilence_phones.txt` and `silence_phones.txt`: the phone set, one or more phones a line;
- `optional_silence.txt`: the one silence phone the lexicon FST may put between words.

The phone table a model is trained on is this phone set (nonsilence phones, then silence phones,
in the files' order), never the phones that happen to occur in some training text: a phone that
only test speech needs must still have its output.

G2P fills words a lexicon lacks with espeak-ng's pronunciation of the word alone
(`pipeline/phonemes.py`), or with the `say` its caller gives; the symbols must be in the lexicon's
phone set, which espeak-ng's hold for a lexicon of espeak-ng symbols and not for CMUdict's ARPAbet
(a CMUdict lexicon's `say` is pipeline/cmudict_lexicon.py's: CMUdict, then espeak-ng mapped to ARPAbet).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path

from common import fsutil
from pipeline import phonemes

LEXICONP = "lexiconp.txt"
LEXICON = "lexicon.txt"
NONSILENCE = "nonsilence_phones.txt"
SILENCE = "silence_phones.txt"
OPTIONAL_SILENCE = "optional_silence.txt"
# Symbols the lang dir gives meanings of its own (epsilon, CTC blank, sentence ends, disambiguation).
RESERVED_WORDS = frozenset({"<eps>", "<s>", "</s>", "#0"})
RESERVED_PHONES = frozenset({"<eps>", "<blk>"})

__all__ = [
    "Entry",
    "Lexicon",
    "fill_missing",
    "g2p",
    "read_dict_dir",
    "write_dict_dir",
]


@dataclasses.dataclass(frozen=True)
class Entry:
    """One pronunciation of one word."""

    word: str
    phones: tuple[str, ...]  # never empty
    prob: float = 1.0  # lexiconp.txt's probability, in (0, 1]; the most likely of a word's is 1.0 in Kaldi's


@dataclasses.dataclass(frozen=True)
class Lexicon:
    """A dict dir's contents; `entries` in file order (a word's pronunciations in the order given)."""

    entries: tuple[Entry, ...]
    nonsilence_phones: tuple[str, ...]
    silence_phones: tuple[str, ...]
    optional_silence: str  # one of silence_phones

    @property
    def phones(self) -> tuple[str, ...]:
        """The phone set: nonsilence phones, then silence phones (the model's outputs after blank)."""
        return self.nonsilence_phones + self.silence_phones

    @property
    def words(self) -> tuple[str, ...]:
        """Each word once, in the order of its first entry."""
        return tuple(dict.fromkeys(e.word for e in self.entries))

    def pronunciations(self, word: str) -> tuple[tuple[str, ...], ...]:
        return tuple(e.phones for e in self.entries if e.word == word)


def read_dict_dir(path: Path) -> Lexicon:
    """A Kaldi dict dir -> its Lexicon. FileNotFoundError for a missing file; ValueError naming the
    file, the line and the fix for a malformed line, a phone outside the phone set, or no entries."""
    path = Path(path)
    if not path.is_dir():
        raise FileNotFoundError(
            f"{path}: no such directory (a Kaldi dict dir: {LEXICONP} or {LEXICON}, "
            f"{NONSILENCE}, {SILENCE}, {OPTIONAL_SILENCE})"
        )
    nonsilence = _read_phone_file(path / NONSILENCE)
    silence = _read_phone_file(path / SILENCE)
    _check_phone_sets(path, nonsilence, silence)
    optional = _read_optional_silence(path / OPTIONAL_SILENCE, silence)
    if (path / LEXICONP).is_file():
        entries = _read_lexicon(path / LEXICONP, with_prob=True, phone_set=set(nonsilence + silence))
    elif (path / LEXICON).is_file():
        entries = _read_lexicon(path / LEXICON, with_prob=False, phone_set=set(nonsilence + silence))
    else:
        raise FileNotFoundError(
            f"{path}: neither {LEXICONP} nor {LEXICON} is there; a dict dir needs one "
            "(`WORD PROB PHONE...` or `WORD PHONE...` a line)"
        )
    return Lexicon(entries, nonsilence, silence, optional)


def _lines(path: Path) -> list[tuple[int, list[str]]]:
    """The non-blank lines of `path` as (1-based line number, fields)."""
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file (a Kaldi dict dir has one)")
    text = path.read_text(encoding="utf-8")
    return [(n, line.split()) for n, line in enumerate(text.splitlines(), 1) if line.strip()]


def _read_phone_file(path: Path) -> tuple[str, ...]:
    """The phones of nonsilence_phones.txt / silence_phones.txt (a line may group several)."""
    phones: list[str] = []
    for number, fields in _lines(path):
        for phone in fields:
            if phone in RESERVED_PHONES or phone.startswith("#"):
                raise ValueError(
                    f"{path}:{number}: phone {phone!r} is reserved (<eps>, <blk> and #k are the "
                    "lang dir's own symbols); rename it"
                )
            if phone in phones:
                raise ValueError(f"{path}:{number}: phone {phone!r} is listed twice; keep one")
            phones.append(phone)
    if not phones:
        raise ValueError(f"{path}: no phones; list the phone set, one or more phones a line")
    return tuple(phones)


def _check_phone_sets(path: Path, nonsilence: tuple[str, ...], silence: tuple[str, ...]) -> None:
    both = sorted(set(nonsilence) & set(silence))
    if both:
        raise ValueError(f"{path}: {' '.join(both)} in both {NONSILENCE} and {SILENCE}; a phone is one or the other")


def _read_optional_silence(path: Path, silence: tuple[str, ...]) -> str:
    lines = _lines(path)
    if len(lines) != 1 or len(lines[0][1]) != 1:
        raise ValueError(f"{path}: expected one phone on one line (the silence between words, e.g. SIL)")
    number, (phone,) = lines[0]
    if phone not in silence:
        raise ValueError(
            f"{path}:{number}: {phone!r} is not in {SILENCE}; add it there or name one of {' '.join(silence)}"
        )
    return phone


def _read_lexicon(path: Path, with_prob: bool, phone_set: set[str]) -> tuple[Entry, ...]:
    entries: list[Entry] = []
    for number, fields in _lines(path):
        entries.append(_parse_entry(path, number, fields, with_prob, phone_set))
    if not entries:
        raise ValueError(
            f"{path}: the lexicon is empty; give one `WORD {'PROB ' if with_prob else ''}PHONE...` "
            "a line for every word the LM and the transcripts use"
        )
    return tuple(dict.fromkeys(entries))  # Kaldi's lexicons repeat a line now and then: once is enough


def _parse_entry(path: Path, number: int, fields: list[str], with_prob: bool, phone_set: set[str]) -> Entry:
    where = f"{path}:{number}"
    word, rest = fields[0], fields[1:]
    if word in RESERVED_WORDS or word.startswith("#"):
        raise ValueError(
            f"{where}: word {word!r} is reserved (<eps>, <s>, </s> and #k are the lang dir's); remove the line"
        )
    prob = 1.0
    if with_prob:
        if not rest:
            raise ValueError(f"{where}: {word!r} has no probability; lexiconp.txt lines are `WORD PROB PHONE...`")
        try:
            prob = float(rest[0])
        except ValueError:
            prob = math.nan
        if not 0.0 < prob <= 1.0:
            raise ValueError(
                f"{where}: {word!r} has probability {rest[0]!r}; it must be a number in (0, 1] "
                f"(for `WORD PHONE...` lines without one, name the file {LEXICON})"
            )
        rest = rest[1:]
    if not rest:
        raise ValueError(f"{where}: {word!r} has no phones; give its pronunciation or remove the line")
    unknown = [p for p in rest if p not in phone_set]
    if unknown:
        raise ValueError(
            f"{where}: {word!r} has phone(s) {' '.join(unknown)} outside the phone set; add them to "
            f"{NONSILENCE} or {SILENCE}, or fix the pronunciation"
        )
    return Entry(word, tuple(rest), prob)


def write_dict_dir(lexicon: Lexicon, path: Path) -> None:
    """Writes `lexicon` as a Kaldi dict dir at `path` (lexiconp.txt and the three phone files), each
    file renamed into place whole."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    # Kaldi's own %.6f would round a small probability to 0, which its readers refuse.
    lines = [f"{e.word} {e.prob:.6g} {' '.join(e.phones)}" for e in lexicon.entries]
    fsutil.atomic_write_text(path / NONSILENCE, "".join(f"{p}\n" for p in lexicon.nonsilence_phones))
    fsutil.atomic_write_text(path / SILENCE, "".join(f"{p}\n" for p in lexicon.silence_phones))
    fsutil.atomic_write_text(path / OPTIONAL_SILENCE, f"{lexicon.optional_silence}\n")
    fsutil.atomic_write_text(path / LEXICONP, "".join(f"{line}\n" for line in lines))
    (path / LEXICON).unlink(missing_ok=True)  # a stale lexicon.txt beside it would be ignored, and mislead


def g2p(words: Sequence[str], voice: str = phonemes.DEFAULT_VOICE) -> dict[str, tuple[str, ...]]:
    """Each word's espeak-ng pronunciation alone (one espeak-ng call for all); a word espeak-ng reads as
    several (a number, an abbreviation) keeps all their phones, without word boundaries. A word with
    nothing espeak-ng can say gets an empty tuple."""
    spoken = phonemes.phonemize(list(words), voice)
    return {w: tuple(p for p in phones if p != phonemes.WORD) for w, phones in zip(words, spoken)}


def fill_missing(
    lexicon: Lexicon,
    words: Iterable[str],
    use_g2p: bool,
    voice: str = phonemes.DEFAULT_VOICE,
    source: str = "the text",
    say: Callable[[Sequence[str]], Mapping[str, tuple[str, ...]]] | None = None,
    said_by: str = "",
) -> tuple[Lexicon, tuple[str, ...]]:
    """`lexicon` with a pronunciation for every one of `words`, and the words G2P filled (sorted).

    The G2P is `say` (words -> {word: phones}, `said_by` naming it in errors), espeak-ng's `g2p` in
    `voice` when none is given. With `use_g2p` off, a word without a pronunciation is a ValueError
    naming it and `source`. A G2P pronunciation with a phone outside the phone set, or none at all,
    is a ValueError too."""
    known = set(lexicon.words)
    missing = sorted({w for w in words if w not in known})
    if not missing:
        return lexicon, ()
    if not use_g2p:
        shown = " ".join(missing[:20]) + (f" ... ({len(missing)} in all)" if len(missing) > 20 else "")
        raise ValueError(f"{source}: no pronunciation for {shown}; add them to the lexicon or turn G2P on")
    spoken = say(missing) if say is not None else g2p(missing, voice)
    who = said_by or f"espeak-ng -v {voice}"
    phone_set = set(lexicon.phones)
    for word in missing:
        phones = tuple(spoken.get(word, ()))
        bad = [p for p in phones if p not in phone_set]
        if not phones or bad:
            raise ValueError(
                f"{source}: {who} says {word!r} as {' '.join(phones) or 'nothing'}"
                + (f", and {' '.join(bad)} is not in the lexicon's phone set" if bad else "")
                + "; give the word a pronunciation in the lexicon"
            )
    added = tuple(Entry(w, tuple(spoken[w])) for w in missing)
    return dataclasses.replace(lexicon, entries=lexicon.entries + added), tuple(missing)
