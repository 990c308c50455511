"""The word LM's text of general English, with no held-out sentence in it.

    python -m pipeline.lm_text --data ROOT --out DIR [--set text_file=corpus.txt]

writes `DIR/lm_text.txt` (one normalized sentence a line; `python -m pipeline.lm --text-file` reads
it) and then `DIR/lm_text.json`, the done marker: what each input gave, what was dropped and why,
and each split's coverage.

The text is the open-text source's sentences (pipeline/open_text.py: WordNet's examples, or
`text_file`'s) that no split of the data root holds, then the training transcripts (`ROOT/train/text`),
each normalized as the corpus normalizes open English (`open_text.normalize`). A source sentence that
is a training transcript is left to the transcript, so that it is counted as often as it was said.

No held-out sentence (`dev`, `dev_engine`, `test`, `test_engine`, `test_noisy`: those the root has),
normalized the same way, is equal to a line of the text or a substring of one: a line that holds one,
even inside a longer sentence, is dropped, whether it comes from the source or from the training
transcripts. The match is on characters, not whole words, so it drops a superset of what a match on
word boundaries would: the property a reader checks with `sentence in line` holds as stated.

Beside each split the record gives its out-of-vocabulary rate against the text's words and the share
of its word 3-grams (within a sentence) that occur in the text: what a decoding figure on that split
owes to the LM's coverage.

`plan_text` is the pure core; `build_lm_text` reads the root and writes the directory. A re-run with
the same inputs, settings and code does nothing.
"""

from __future__ import annotations

import argparse
import bisect
import dataclasses
import hashlib
import sys
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from common import cli, fsutil
from common import config as configlib
from pipeline import lm, open_text

TRAIN = "train"
HELD_OUT = ("dev", "dev_engine", "test", "test_engine", "test_noisy")
TEXT, RECORD = "lm_text.txt", "lm_text.json"
EXAMPLES = 10  # dropped lines the record shows beside their counts

__all__ = ["HELD_OUT", "LmText", "LmTextConfig", "build_lm_text", "coverage", "plan_text"]


@dataclasses.dataclass(frozen=True)
class LmTextConfig:
    """Where the source's sentences come from (`--set KEY=VALUE`, or a YAML file with `--config`)."""

    text_file: str = ""  # a UTF-8 file of one sentence per line; "": WordNet's examples (open_text.py)
    min_words: int = 1  # source sentences with fewer words are left out
    max_words: int = 0  # source sentences with more words are left out; 0: no limit

    def __post_init__(self):
        if self.min_words < 1 or (self.max_words and self.max_words < self.min_words):
            raise ValueError(
                f"need 1 <= min_words <= max_words (or max_words 0), got {self.min_words}, {self.max_words}"
            )


@dataclasses.dataclass(frozen=True)
class LmText:
    """The LM's text and what was left out of it."""

    lines: tuple[str, ...]  # the source's kept sentences, then the kept training transcripts
    dropped: dict[str, int]  # reason -> lines left out
    examples: tuple[tuple[str, str], ...]  # (a dropped line, the held-out sentence inside it)


def normalize_held_out(transcripts: Iterable[str]) -> set[str]:
    """Held-out transcripts as the corpus normalizes open English. Never strict: a transcript the
    corpus could not say as written still has words that must stay out of the text."""
    return {s for s in (open_text.normalize(t, strict=False) for t in transcripts) if s}


def normalize_train(transcripts: Iterable[str]) -> tuple[list[str], Counter]:
    """(the training transcripts normalized, {reason: transcripts left out})."""
    kept, left_out = [], Counter()
    for transcript in transcripts:
        try:
            kept.append(open_text.normalize(transcript))
        except open_text.Unspeakable as err:
            left_out[f"train: {err.reason}"] += 1
    return kept, left_out


def holding(lines: Sequence[str], sentences: Iterable[str]) -> dict[int, str]:
    """{index of a line of `lines`: one of `sentences` it equals or holds as a substring}.

    One joined string searched once per sentence (str.find runs in C): a sentence has no newline,
    so a match never spans two lines."""
    joined = "\n".join(lines)
    starts, offset = [], 0
    for line in lines:
        starts.append(offset)
        offset += len(line) + 1
    found: dict[int, str] = {}
    for sentence in sorted(sentences):
        at = joined.find(sentence)
        while at >= 0:
            found.setdefault(bisect.bisect_right(starts, at) - 1, sentence)
            at = joined.find(sentence, at + 1)
    return found


def plan_text(source: Sequence[str], train: Sequence[str], held_out: Iterable[str]) -> LmText:
    """The LM text of `source` (normalized, distinct sentences), `train` (normalized transcripts,
    repeats kept) and `held_out` (normalized sentences that must not be in it, nor inside a line)."""
    held = set(held_out)
    transcripts = set(train)
    dropped: Counter = Counter()
    candidates: list[tuple[str, str]] = []  # (origin, line)
    for sentence in source:
        if sentence in held:
            dropped["source: a held-out sentence"] += 1
        elif sentence in transcripts:
            dropped["source: a training transcript (kept as the transcript)"] += 1
        else:
            candidates.append(("source", sentence))
    candidates += [("train", t) for t in train]
    leaks = holding([line for _, line in candidates], held)
    examples = []
    for index in sorted(leaks):
        origin, line = candidates[index]
        equal = line == leaks[index]
        dropped[f"{origin}: {'a held-out sentence' if equal else 'holds a held-out sentence'}"] += 1
        if len(examples) < EXAMPLES:
            examples.append((line, leaks[index]))
    lines = tuple(line for i, (_, line) in enumerate(candidates) if i not in leaks)
    return LmText(lines, dict(dropped), tuple(examples))


def _trigrams(words: Sequence[str]) -> list[tuple[str, ...]]:
    return [tuple(words[i : i + 3]) for i in range(len(words) - 2)]


def coverage(lines: Sequence[str], splits: Mapping[str, Sequence[str]]) -> dict[str, dict]:
    """split -> {"words", "oov_rate": the share of its word tokens the text lacks, "trigrams",
    "trigram_share": the share of its word 3-grams (within a sentence) the text holds}."""
    vocabulary = {w for line in lines for w in line.split()}
    known = {g for line in lines for g in _trigrams(line.split())}
    out = {}
    for split, sentences in splits.items():
        tokens = [w for s in sentences for w in s.split()]
        grams = [g for s in sentences for g in _trigrams(s.split())]
        out[split] = {
            "words": len(tokens),
            "oov_rate": round(sum(w not in vocabulary for w in tokens) / max(len(tokens), 1), 4),
            "trigrams": len(grams),
            "trigram_share": round(sum(g in known for g in grams) / max(len(grams), 1), 4),
        }
    return out


def _source_files(config: LmTextConfig) -> list[Path]:
    if config.text_file:
        return [Path(config.text_file)]
    return [open_text.WORDNET_DIR / name for name in open_text.WORDNET_FILES]


def _split_texts(data: Path) -> dict[str, Path]:
    """{split: its Kaldi `text`} of the data root: train (required), then the held-out splits it has."""
    if not (data / TRAIN / "text").is_file():
        raise FileNotFoundError(
            f"{data / TRAIN / 'text'}: no such file; --data is a corpus root with a train/ Kaldi data directory"
        )
    return {s: data / s / "text" for s in (TRAIN, *HELD_OUT) if (data / s / "text").is_file()}


def fingerprint(data: Path, config: LmTextConfig) -> str:
    """A hash of the source's and the splits' bytes, the settings and this stage's code."""
    files = fsutil.fingerprint_files(_source_files(config) + list(_split_texts(data).values()))
    code = fsutil.code_version(sys.modules[__name__], open_text)
    return fsutil.config_hash({"files": files, "config": dataclasses.asdict(config), "code": code})


def _transcripts(data_dir: Path) -> list[str]:
    return [line for _, line in lm.read_lines(data_dir, None)[1]]


def build_lm_text(data: Path, out: Path, config: LmTextConfig) -> dict:
    """Writes OUT/lm_text.txt from the data root `data` and the source, then OUT/lm_text.json; returns
    the record. Nothing is done when the record holds the same fingerprint and the text's checksum."""
    data, out = Path(data), Path(out)
    stamp = fingerprint(data, config)
    earlier = fsutil.read_json(out / RECORD)
    if (
        isinstance(earlier, dict)
        and earlier.get("fingerprint") == stamp
        and (out / TEXT).is_file()
        and fsutil.file_sha256(out / TEXT) == earlier.get("text", {}).get("sha256")
    ):
        return {**earlier, "skipped": True}
    texts = _split_texts(data)
    source, pool = open_text.load_pool(config.text_file, config.min_words, config.max_words or 10**6)
    train, train_left_out = normalize_train(_transcripts(data / TRAIN))
    held = {s: sorted(normalize_held_out(_transcripts(data / s))) for s in texts if s != TRAIN}
    planned = plan_text(source, train, {x for sentences in held.values() for x in sentences})
    body = "".join(f"{line}\n" for line in planned.lines)
    out.mkdir(parents=True, exist_ok=True)
    (out / RECORD).unlink(missing_ok=True)  # the marker goes first: a text half replaced is never "done"
    fsutil.atomic_write_text(out / TEXT, body)
    record = {
        "source": {**pool, "min_words": config.min_words, "max_words": config.max_words},
        "splits": {s: str(p) for s, p in texts.items()},
        "config": dataclasses.asdict(config),
        "text": {
            "file": TEXT,
            "sha256": hashlib.sha256(body.encode()).hexdigest(),
            "sentences": len(planned.lines),
            "words": sum(len(line.split()) for line in planned.lines),
            "vocabulary_size": len({w for line in planned.lines for w in line.split()}),
        },
        "dropped": {**planned.dropped, **train_left_out},
        "dropped_examples": [{"line": line, "held_out": held_out} for line, held_out in planned.examples],
        "coverage": coverage(planned.lines, {TRAIN: train, **held}),
        "fingerprint": stamp,
    }
    fsutil.atomic_write_json(out / RECORD, record)
    return record


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m pipeline.lm_text",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--data", required=True, type=Path, help="the corpus root (train/, dev/, test/ ... text)")
    parser.add_argument("--out", required=True, type=Path, help="the directory to write lm_text.txt and its record")
    cli.add_config_arguments(parser, "LmTextConfig")
    args = parser.parse_args(argv)
    return cli.run(lambda: _main(args))


def _main(args: argparse.Namespace) -> None:
    config = configlib.load(LmTextConfig, args.config, args.set)
    record = build_lm_text(args.data, args.out, config)
    text = record["text"]
    print(
        f"{'up to date' if record.get('skipped') else 'wrote'} {args.out / TEXT}: {text['sentences']} sentences, "
        f"{text['words']} words, {text['vocabulary_size']} distinct; dropped {record['dropped']}"
    )
    for split, row in record["coverage"].items():
        print(f"  {split}: OOV {row['oov_rate']:.2%}, 3-grams in the text {row['trigram_share']:.2%}")


if __name__ == "__main__":
    sys.exit(main())
