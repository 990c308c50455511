"""Sentences of open English for the demo corpus: a source of text, normalized into what the voices say.

The default source is WordNet 3.0's example sentences and phrases (Debian's `wordnet-base`, WordNet's
own permissive licence): the quoted examples of the glosses in `data.noun`, `data.verb`, `data.adj`
and `data.adv` ("the ship slipped away in the darkness"), about 48,000, 31,000 distinct words. A user's
file of one sentence per line (`CorpusConfig.text_file`) takes its place.

`normalize` is the pure core: a sentence -> its spoken, lower-case words, or `Unspeakable` with the
reason. Numbers, years, ordinals, money and percentages are spelled out by num2words (the library
most English TTS front ends use for it); the few abbreviations and symbols it leaves are in `_SPOKEN`
below. No well-kept library covers the rest without a grammar compiler (NeMo's text normalization
needs pynini and its grammars), so what the table does not know is left out and counted, never
spoken with a guessed transcript: acronyms (a voice spells "FBI"; the transcript would not),
initials, letters outside English's, digits inside words.
"""

from __future__ import annotations

import functools
import hashlib
import re
import unicodedata
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path

WORDNET_DIR = Path("/usr/share/wordnet")  # where Debian's wordnet-base puts WordNet's database
WORDNET_FILES = ("data.noun", "data.verb", "data.adj", "data.adv")
INSTALL_HINT = "install Debian's wordnet-base ('sudo apt-get install wordnet-base', or 'make setup' as root)"
ALPHABET = frozenset("abcdefghijklmnopqrstuvwxyz' ")  # what a transcript may hold after normalizing


class Unspeakable(ValueError):
    """A sentence `normalize` cannot turn into words a voice says as written; `reason` names why."""

    def __init__(self, reason: str, sentence: str):
        super().__init__(f"{reason}: {sentence!r}")
        self.reason = reason


# Abbreviations and symbols as spoken. Lower-cased keys; an abbreviation keeps its full stop.
_SPOKEN = {
    "mr.": "mister",
    "mrs.": "missus",
    "ms.": "miz",
    "dr.": "doctor",
    "st.": "saint",
    "prof.": "professor",
    "jr.": "junior",
    "sr.": "senior",
    "vs.": "versus",
    "etc.": "et cetera",
    "e.g.": "for example",
    "i.e.": "that is",
    "no.": "number",
    "jan.": "january",
    "feb.": "february",
    "aug.": "august",
    "sept.": "september",
    "oct.": "october",
    "nov.": "november",
    "dec.": "december",
    "&": "and",
    "%": "percent",
}
_SYMBOLS = re.compile(r"[=^+<>\[\]{}|\\@#*_~]")  # mathematics, markup: no one way to say them
_MONEY = re.compile(r"\$(\d[\d,]*(?:\.\d+)?)")
_ORDINAL = re.compile(r"\b(\d+)(st|nd|rd|th)\b", re.IGNORECASE)
_DECADE = re.compile(r"\b(1[1-9]|20)(\d0)'?s\b")
_NUMBER = re.compile(r"\b\d[\d,]*(?:\.\d+)?\b")


def _number(text: str, year: bool = False, ordinal: bool = False) -> str:
    from num2words import num2words

    value = text.replace(",", "")
    if ordinal:
        return num2words(int(value), to="ordinal")
    if "." in value:
        return num2words(float(value))
    number = int(value)
    if year and 1100 <= number <= 2099 and len(value) == 4:
        return num2words(number, to="year")
    return num2words(number)


def _plural(words: str) -> str:
    """ "nineteen ninety" -> "nineteen nineties"."""
    return words[:-1] + "ies" if words.endswith("y") else words + "s"


def normalize(sentence: str, strict: bool = True) -> str:
    """`sentence` as the voices say it and its transcript reads: lower-case words of a-z and
    apostrophes, single spaces. Raises Unspeakable naming the reason when it cannot be said as
    written. `strict=False` (a sentence typed for the synthesis model to speak) never raises: what
    the corpus would leave out is kept as letters (an acronym as a word, "café" as "cafe") or dropped
    (a symbol), since the model has no other way to say it."""
    text = " ".join(sentence.split())
    if not strict:
        text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode()
        text = _SYMBOLS.sub(" ", text)
    if strict and (not text or text.startswith("-")):  # WordNet's "- Author Name;" citations
        raise Unspeakable("a citation or empty", sentence)
    if _SYMBOLS.search(text):
        raise Unspeakable("a symbol", sentence)
    text = text.replace("`", "'").replace("\u2019", "'").replace("/", " , ")
    text = _MONEY.sub(lambda m: f"{_number(m[1])} {'dollar' if m[1] == '1' else 'dollars'}", text)
    text = _ORDINAL.sub(lambda m: f" {_number(m[1], ordinal=True)} ", text)
    text = _DECADE.sub(lambda m: _plural(_number(m[1] + m[2], year=True)), text)
    text = _NUMBER.sub(lambda m: " " + _number(m[0], year=True) + " ", text)
    words = []
    for token in text.split():
        spoken = _SPOKEN.get(token.lower()) or _SPOKEN.get(token.lower().rstrip(",;:!?)\"'"))
        if spoken:
            words.append(spoken)
            continue
        core = token.strip(".,;:!?()\"'-")
        if not strict:
            words.append(token)
            continue
        if re.search(r"\w\.\w|^\w\.$", token.strip(",;:!?()\"'")) or re.fullmatch(r"[A-Z]\.?", core) and core != "I":
            raise Unspeakable("initials or an abbreviation", sentence)
        if len(core) > 1 and core.isupper() and core.isalpha():
            raise Unspeakable("an acronym", sentence)
        if re.search(r"\d", core):
            raise Unspeakable("digits inside a word", sentence)
        words.append(token)
    text = " ".join(words).lower()
    text = re.sub(r"[-\u2013\u2014]+", " ", text)  # black-and-white, twenty-one: the hyphen is a pause at most
    text = re.sub(r"[.,;:!?()\"]+", " ", text)
    # Quotes made of apostrophes ('truth') go; an apostrophe inside a word (didn't, rock'n'roll) stays.
    text = " ".join(w.strip("'") for w in text.split())
    text = " ".join(text.split())
    if not strict:
        return " ".join("".join(ch for ch in text if ch in ALPHABET).split())
    if not text:
        raise Unspeakable("no words", sentence)
    if outside := sorted(set(text) - ALPHABET):
        raise Unspeakable(f"characters {''.join(outside)!r}", sentence)
    return text


def wordnet_examples(directory: Path = WORDNET_DIR) -> list[str]:
    """The quoted examples of WordNet's glosses, in file order."""
    missing = [name for name in WORDNET_FILES if not (directory / name).is_file()]
    if missing:
        raise FileNotFoundError(
            f"WordNet's {', '.join(missing)} are not in {directory}: {INSTALL_HINT}, or use --text grammar"
        )
    examples = []
    for name in WORDNET_FILES:
        with open(directory / name, encoding="utf-8", errors="replace") as lines:
            for line in lines:
                if line.startswith("  "):  # the licence header
                    continue
                _, _, gloss = line.partition(" | ")
                examples += re.findall(r'"([^"]+)"', gloss)
    return examples


def read_sentences(path: Path) -> list[str]:
    """A user's text file: one sentence per line, blank lines skipped."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise FileNotFoundError(
            f"text_file {path} does not exist; name a UTF-8 file of one sentence per line"
        ) from None
    except UnicodeDecodeError as err:
        raise ValueError(f"text_file {path} is not UTF-8 ({err}); convert it, e.g. with iconv") from None
    sentences = [line.strip() for line in lines if line.strip()]
    if not sentences:
        raise ValueError(f"text_file {path} holds no sentences; write one sentence per line")
    return sentences


def sentence_pool(raw: Iterable[str], min_words: int, max_words: int) -> tuple[list[str], Counter]:
    """(normalized sentences of `min_words`-`max_words` words, distinct, in first-seen order;
    {reason: count} of the raw sentences left out)."""
    seen: set[str] = set()
    kept, left_out = [], Counter()
    for sentence in raw:
        try:
            text = normalize(sentence)
        except Unspeakable as err:
            left_out[err.reason] += 1
            continue
        if not min_words <= len(text.split()) <= max_words:
            left_out[f"not {min_words}-{max_words} words"] += 1
        elif text in seen:
            left_out["a repeat"] += 1
        else:
            seen.add(text)
            kept.append(text)
    return kept, left_out


def load_pool(text_file: str, min_words: int, max_words: int) -> tuple[tuple[str, ...], dict]:
    """The corpus' sentences of `text_file` ("": WordNet's examples) and what was left out:
    (sentences, {"source", "sha256", "sentences", "left_out": {reason: count}}). Read once a process
    while the file stays as it is (WordNet's take seconds to normalize)."""
    path = Path(text_file) if text_file else WORDNET_DIR / WORDNET_FILES[0]
    stamp = (path.stat().st_mtime_ns, path.stat().st_size) if path.is_file() else None
    return _load_pool(text_file, stamp, min_words, max_words)


@functools.lru_cache(maxsize=4)
def _load_pool(text_file: str, stamp, min_words: int, max_words: int) -> tuple[tuple[str, ...], dict]:
    raw = read_sentences(Path(text_file)) if text_file else wordnet_examples()
    kept, left_out = sentence_pool(raw, min_words, max_words)
    digest = hashlib.sha256("\n".join(raw).encode()).hexdigest()
    source = text_file or f"WordNet 3.0 examples ({WORDNET_DIR})"
    return tuple(kept), {"source": source, "sha256": digest, "sentences": len(kept), "left_out": dict(left_out)}


def oov_rates(texts: dict[str, Sequence[str]], known: set[str]) -> dict[str, float]:
    """split -> the share of its word tokens that `known` (the training text's words) lacks."""
    rates = {}
    for split, lines in texts.items():
        tokens = [w for line in lines for w in line.split()]
        rates[split] = round(sum(w not in known for w in tokens) / max(len(tokens), 1), 4)
    return rates
