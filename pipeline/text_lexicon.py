"""A pronunciation lexicon for a text: every word of it in espeak-ng's phonemes, alone and in context.

    python -m pipeline.text_lexicon --text DIR/lm_text.txt --out DIR/dict [--set fold_stress=true]

writes a Kaldi dict dir (pipeline/lexicon.py `write_dict_dir`: lexiconp.txt and the phone files) and
then `DIR/dict/text_lexicon.json`, the done marker with the counts below.

A word's pronunciations are its in-context variants and its pronunciation alone. The variants come
only from phonemizing the text's own sentences (the LM text: pipeline/lm_text.py), never from a
split's shard phonemes, so no held-out sentence shapes the lexicon. espeak-ng separates a sentence's
words by " " (pipeline/phonemes.py `WORD`):
- as many phoneme words as text words: each word's phonemes are a variant of it;
- fewer: espeak-ng ran words together ("of the" as `V v D @2`). The phoneme words are aligned to runs
  of consecutive text words by the least edit distance to the runs' pronunciations alone; a word alone
  in its run gets its variant, and the words of a merged run get none from that sentence (counted):
  where a merged word's phones end is not written anywhere, and a guessed split would put wrong
  variants into the lexicon. The same words have variants from the sentences where they stand apart,
  and the decoding graph lets words follow each other with no boundary between them;
- more (espeak-ng said a word as two): the sentence gives no variants (counted).

The phone set is derived from the lexicon: the symbols espeak-ng used in the text's running speech,
stress kept or folded (`fold_stress`). A word said alone carries stress it never has in context
("the" alone is `D '@2`); such a symbol outside the running speech's set is mapped to its unstressed
form where that is in the set (counted), so the lexicon does not grow phones a model trained on
running speech never emits. A symbol with no such form stays and joins the phone set (counted).

Probabilities (lexiconp.txt) are each variant's count, the pronunciation alone counting once,
over the word's most frequent one's, which is 1.0 as in Kaldi's. espeak-ng runs once per batch of
sentences; a progress bar shows how far it is.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from collections import Counter
from collections.abc import Callable, Collection, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from common import cli, fsutil
from common import config as configlib
from common.progress import progress
from pipeline import lexicon as lexlib
from pipeline import phonemes

RECORD = "text_lexicon.json"
STRESS = "',"  # espeak-ng's primary and secondary stress marks, written before a vowel
COUNTS = (
    "sentences_one_to_one",
    "sentences_merged",
    "sentences_without_variants",
    "merged_runs",
    "words_in_merged_runs",
    "alone_symbols_unstressed",
    "alone_symbols_outside_context",
)
MAX_RUN = 4  # most text words one phoneme word may stand for in the alignment

__all__ = [
    "TextLexiconConfig",
    "build_text_lexicon",
    "count_variants",
    "fit_alone",
    "lexicon_for_text",
    "phone_words",
    "segment",
    "to_entries",
    "unstressed",
    "write_dict_dir_once",
]


@dataclasses.dataclass(frozen=True)
class TextLexiconConfig:
    """The lexicon's settings (`--set KEY=VALUE`, or a YAML file with `--config`)."""

    voice: str = phonemes.DEFAULT_VOICE  # espeak-ng's accent for every pronunciation
    fold_stress: bool = False  # drop stress marks: "'aI" and "aI" become one phone
    min_prob: float = 0.0  # variants whose probability is below this are left out (the likeliest never is)
    batch: int = 1000  # sentences per espeak-ng call
    silence: str = "SIL"  # the silence phone (silence_phones.txt, optional_silence.txt)

    def __post_init__(self):
        if not 0.0 <= self.min_prob <= 1.0:
            raise ValueError(f"min_prob must be in [0, 1], got {self.min_prob}")
        if self.batch < 1:
            raise ValueError(f"batch must be at least 1, got {self.batch}")


def unstressed(symbol: str) -> str:
    """An espeak-ng symbol without its stress mark: "'aI" -> "aI"; a symbol of marks only stays."""
    return symbol.lstrip(STRESS) or symbol


def phone_words(symbols: Sequence[str], fold_stress: bool) -> list[tuple[str, ...]]:
    """phonemize's symbols of one sentence -> its phoneme words, stress folded with `fold_stress`."""
    words: list[tuple[str, ...]] = []
    current: list[str] = []
    for symbol in [*symbols, phonemes.WORD]:
        if symbol != phonemes.WORD:
            current.append(unstressed(symbol) if fold_stress else symbol)
        elif current:
            words.append(tuple(current))
            current = []
    return words


def _distance(a: Sequence[str], b: Sequence[str]) -> int:
    """Levenshtein distance between two symbol sequences."""
    row = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        prev, row[0] = row[0], i
        for j, y in enumerate(b, 1):
            prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (x != y))
    return row[-1]


def segment(
    words: Sequence[str], spoken: Sequence[tuple[str, ...]], alone: Mapping[str, tuple[str, ...]]
) -> list[tuple[int, int]] | None:
    """The runs [start, end) of `words` each phoneme word of `spoken` stands for, in order, with the least
    total edit distance (stress ignored) to the runs' pronunciations alone; None when no run of at
    most MAX_RUN words per phoneme word covers the sentence."""
    n, m = len(words), len(spoken)
    plain = [tuple(unstressed(p) for p in alone.get(w, ())) for w in words]
    inf = float("inf")
    best = [[inf] * (m + 1) for _ in range(n + 1)]
    back: list[list[int]] = [[0] * (m + 1) for _ in range(n + 1)]
    best[0][0] = 0
    for j in range(1, m + 1):
        target = tuple(unstressed(p) for p in spoken[j - 1])
        # Each phoneme word stands for at least one text word, so the first j stand for j to j + n - m.
        for i in range(j, min(n, j + n - m) + 1):
            for k in range(1, min(MAX_RUN, i - j + 1) + 1):
                if best[i - k][j - 1] == inf:
                    continue
                cost = best[i - k][j - 1] + _distance(sum(plain[i - k : i], ()), target)
                if cost < best[i][j]:
                    best[i][j], back[i][j] = cost, k
    if best[n][m] == inf:
        return None
    runs, i = [], n
    for j in range(m, 0, -1):
        runs.append((i - back[i][j], i))
        i -= back[i][j]
    return runs[::-1]


def count_variants(
    sentences: Sequence[str],
    spoken: Sequence[Sequence[str]],
    alone: Mapping[str, tuple[str, ...]],
    fold_stress: bool,
) -> tuple[Counter, Counter]:
    """({(word, phones): in-context count}, the sentences' and words' counts by kind) from each
    sentence and its phonemize symbols; `alone` is each word's pronunciation alone (for aligning)."""
    variants: Counter = Counter()
    stats: Counter = Counter()
    for sentence, symbols in zip(sentences, spoken):
        words, said = sentence.split(), phone_words(symbols, fold_stress)
        runs = [(i, i + 1) for i in range(len(words))] if len(said) == len(words) else None
        if len(said) < len(words):
            runs = segment(words, said, alone)
        if runs is None:
            stats["sentences_without_variants"] += 1
            continue
        merged = sum(1 for start, end in runs if end - start > 1)
        stats["sentences_merged" if merged else "sentences_one_to_one"] += 1
        stats["merged_runs"] += merged
        for (start, end), phones in zip(runs, said):
            if end - start == 1:
                variants[(words[start], phones)] += 1
            else:
                stats["words_in_merged_runs"] += end - start
    return variants, stats


def _reference(spoken: Sequence[Sequence[str]], fold_stress: bool) -> set[str]:
    """The symbols of the sentences' running speech: the phone set a pronunciation alone is held to."""
    return {p for symbols in spoken for word in phone_words(symbols, fold_stress) for p in word}


def fit_alone(phones: tuple[str, ...], reference: Collection[str], stats: Counter) -> tuple[str, ...]:
    """A pronunciation alone with each symbol outside `reference` mapped to its unstressed form where
    `reference` has it (`stats["alone_symbols_unstressed"]`); one with no such form is kept and counted
    (`stats["alone_symbols_outside_context"]`)."""
    out = []
    for phone in phones:
        if phone not in reference and unstressed(phone) in reference:
            stats["alone_symbols_unstressed"] += 1
            phone = unstressed(phone)
        elif phone not in reference:
            stats["alone_symbols_outside_context"] += 1
        out.append(phone)
    return tuple(out)


def to_entries(
    vocabulary: Sequence[str], variants: Counter, alone: Mapping[str, tuple[str, ...]], min_prob: float
) -> tuple[list[lexlib.Entry], list[str]]:
    """(each word's entries, likeliest first, probability its count over the likeliest's; the words
    with no pronunciation at all). The pronunciation alone counts once beside the variants."""
    counts: dict[str, Counter] = {w: Counter() for w in vocabulary}
    for (word, phones), count in variants.items():
        if word in counts:
            counts[word][phones] += count
    entries, unspelled = [], []
    for word in vocabulary:
        if alone.get(word):
            counts[word][alone[word]] += 1
        if not counts[word]:
            unspelled.append(word)
            continue
        ranked = sorted(counts[word].items(), key=lambda item: (-item[1], item[0]))
        top = ranked[0][1]
        entries += [lexlib.Entry(word, p, c / top) for p, c in ranked if c / top >= min_prob]
    return entries, unspelled


def lexicon_for_text(
    sentences: Sequence[str], config: TextLexiconConfig, show_progress: bool = True
) -> tuple[lexlib.Lexicon, dict]:
    """A Lexicon of every word of `sentences` (normalized text, one sentence each), and its counts:
    sentences by kind, merged runs, stress fallbacks, variants, and the words espeak-ng cannot say."""
    vocabulary = sorted({w for s in sentences for w in s.split()})
    if not vocabulary:
        raise ValueError("the text has no words; give the LM text (one normalized sentence a line)")
    # Every count is in the record, a zero included, so that records of different texts compare.
    stats: Counter = Counter(dict.fromkeys(COUNTS, 0))
    spoken = _phonemize(sentences, config, show_progress)
    fold = config.fold_stress
    said_alone = _g2p(vocabulary, config)
    reference = _reference(spoken, fold)
    alone = {
        w: fit_alone(tuple(unstressed(p) if fold else p for p in said_alone[w]), reference, stats) for w in vocabulary
    }
    variants, counted = count_variants(sentences, spoken, alone, fold)
    stats.update(counted)
    entries, unspelled = to_entries(vocabulary, variants, alone, config.min_prob)
    if not entries:
        raise ValueError(f"espeak-ng -v {config.voice} says none of the text's words; is it an English text?")
    # every symbol of the running speech, those only in merged runs too: the phone targets of a
    # sentence are its running speech (pipeline/phones.py "espeak")
    phones = sorted(reference | {p for e in entries for p in e.phones})
    if config.silence in phones:
        raise ValueError(f"silence {config.silence!r} is one of espeak-ng's symbols here; name another silence phone")
    with_context = {w for w, _ in variants}
    record = {
        "sentences": len(sentences),
        **{k: stats[k] for k in sorted(stats)},
        "words": len(vocabulary),
        "words_without_context_variant": sum(1 for w in vocabulary if w not in with_context),
        "entries": len(entries),
        "phones": len(phones),
        "unspelled": len(unspelled),
        "unspelled_examples": unspelled[:20],
    }
    return lexlib.Lexicon(tuple(entries), tuple(phones), (config.silence,), config.silence), record


def _phonemize(sentences: Sequence[str], config: TextLexiconConfig, show_progress: bool) -> list[list[str]]:
    """phonemize's symbols of each sentence, one espeak-ng call per `config.batch` sentences, as many
    calls at once as there are cores (threads: each waits on its own espeak-ng process)."""
    batches = [list(sentences[i : i + config.batch]) for i in range(0, len(sentences), config.batch)]
    spoken: list[list[str]] = []
    bar = progress(total=len(sentences), unit="sentence", desc="espeak-ng", disable=not show_progress)
    with bar, ThreadPoolExecutor(os.cpu_count() or 1) as pool:
        for batch, said in zip(batches, pool.map(lambda b: phonemes.phonemize(b, config.voice), batches)):
            spoken += said
            bar.update(len(batch))
    return spoken


def _g2p(words: Sequence[str], config: TextLexiconConfig) -> dict[str, tuple[str, ...]]:
    """pipeline/lexicon.py `g2p` of every word alone, in batches as `_phonemize` runs them."""
    batches = [list(words[i : i + 4 * config.batch]) for i in range(0, len(words), 4 * config.batch)]
    with ThreadPoolExecutor(os.cpu_count() or 1) as pool:
        return {w: p for said in pool.map(lambda b: lexlib.g2p(b, config.voice), batches) for w, p in said.items()}


def marker_config(dict_dir: Path) -> dict:
    """The config a dict dir's marker (text_lexicon.json, this stage's or cmudict_lexicon's) records; {}
    for a dict dir no builder of ours wrote (a user's)."""
    record = fsutil.read_json(Path(dict_dir) / RECORD) or {}
    return record.get("config", {})


def read_text(path: Path) -> list[str]:
    """A text of one normalized sentence a line (lm_text.txt), blank lines skipped."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file; give the LM text (python -m pipeline.lm_text writes one)")
    return [" ".join(line.split()) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def fingerprint(text: Path, config: TextLexiconConfig) -> str:
    """A hash of the text's bytes, the settings, espeak-ng's version and this stage's code."""
    code = fsutil.code_version(sys.modules[__name__], lexlib, phonemes)
    return fsutil.config_hash(
        {
            "text": fsutil.file_sha256(text),
            "config": dataclasses.asdict(config),
            "espeak": phonemes.version(),
            "code": code,
        }
    )


def build_text_lexicon(text: Path, out: Path, config: TextLexiconConfig, show_progress: bool = True) -> dict:
    """Writes the dict dir OUT for the sentences of `text`, then OUT/text_lexicon.json; returns the record.
    Nothing is done when the record holds the same fingerprint and lexiconp.txt's checksum."""
    sentences = read_text(text)

    def make() -> tuple[lexlib.Lexicon, dict]:
        lexicon, record = lexicon_for_text(sentences, config, show_progress)
        return lexicon, {"config": dataclasses.asdict(config), "espeak": phonemes.version(), **record}

    return write_dict_dir_once(text, out, fingerprint(Path(text), config), make)


def write_dict_dir_once(text: Path, out: Path, stamp: str, make: Callable[[], tuple[lexlib.Lexicon, dict]]) -> dict:
    """The marked dict dir OUT of a lexicon builder (this one's, pipeline/cmudict_lexicon.py's): `make()`'s
    Lexicon written, then OUT/text_lexicon.json with its record, `stamp` and lexiconp.txt's checksum. The
    earlier record, marked skipped, when it holds the same stamp and checksum (nothing is made)."""
    out = Path(out)
    earlier = fsutil.read_json(out / RECORD)
    if (
        isinstance(earlier, dict)
        and earlier.get("fingerprint") == stamp
        and (out / lexlib.LEXICONP).is_file()
        and fsutil.file_sha256(out / lexlib.LEXICONP) == earlier.get("lexiconp_sha256")
    ):
        return {**earlier, "skipped": True}
    lexicon, made = make()
    out.mkdir(parents=True, exist_ok=True)
    (out / RECORD).unlink(missing_ok=True)  # the marker goes first: a dict dir half replaced is never "done"
    lexlib.write_dict_dir(lexicon, out)
    record = {
        "text": str(text),
        **made,
        "lexiconp_sha256": fsutil.file_sha256(out / lexlib.LEXICONP),
        "fingerprint": stamp,
    }
    fsutil.atomic_write_json(out / RECORD, record)
    return record


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m pipeline.text_lexicon",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--text", required=True, type=Path, help="the text: one normalized sentence a line")
    parser.add_argument("--out", required=True, type=Path, help="the Kaldi dict dir to write")
    cli.add_progress_argument(parser)
    cli.add_config_arguments(parser, "TextLexiconConfig")
    args = parser.parse_args(argv)
    return cli.run(lambda: _main(args))


def _main(args: argparse.Namespace) -> None:
    config = configlib.load(TextLexiconConfig, args.config, args.set)
    record = build_text_lexicon(args.text, args.out, config, show_progress=not args.no_progress)
    shown = {k: v for k, v in record.items() if isinstance(v, int) and not isinstance(v, bool)}
    print(f"{'up to date' if record.get('skipped') else 'wrote'} {args.out / lexlib.LEXICONP}: {shown}")


if __name__ == "__main__":
    sys.exit(main())
