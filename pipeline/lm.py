"""Language model stage: a word n-gram of a text, as an ARPA file, for decoding the acoustic model.

    python -m pipeline.lm --data DIR/train --vocabulary-from SHARDS --out DIR/lm [--set order=3]
    python -m pipeline.lm --text-file corpus.txt --vocabulary-from SHARDS --out DIR/lm
    python -m pipeline.lm --text-file lm_text.txt --lexicon DICT --out DIR/lm   # a phone model's

writes `OUT/lm.arpa` and then `OUT/lm.json`, the done marker: the order, the text's source, sha256,
sentences, words and vocabulary size, the n-gram counts and the ARPA's sha256. models/asr/lm.py
decodes with it (pyctcdecode's beam search, querying the n-gram through the `kenlm` module).

The text: the training split's transcripts by default (`--data`, a Kaldi data directory's `text`),
or a corpus of the user's domain (`--text-file`, one sentence per line). Each line is normalized by
the function that made the transcripts: a transcript by the shards' (pipeline/text.py
`normalize_transcript`), a line of a corpus as the corpus stage normalizes open English
(pipeline/open_text.py `normalize`: numbers, money and abbreviations spelled out, punctuation
removed), which leaves out a line it cannot say as written and counts it by its reason (`left_out` in
lm.json). A line with a character outside the acoustic model's alphabet (`--vocabulary-from`: the
shards or a trained model) is then an error that names the file, the line and the characters, since
a word the model cannot spell can never be decoded; so is a text with no sentences. A phone model's
LM (`--lexicon`: the dict dir or lang dir that spells its words) has no alphabet to check.

The estimator is KenLM's `lmplz` (modified Kneser-Ney, interpolated), built from the sources in
KenLM's PyPI sdist by `make setup` and the training image. It is the estimator of the library the
decoder queries the model with (the `kenlm` module, from the same sdist), and the one wav2vec 2.0's
and pyctcdecode's users build with; IRSTLM (in Debian) would save the build, but its scripts default
to Witten-Bell smoothing and add a second n-gram toolkit beside the one the decoder needs anyway.
`--discount_fallback` lets lmplz estimate from a few thousand sentences (the demo's), whose counts
of counts are too small for its discounts.

`plan` is the pure core (lines -> the normalized sentences, or the error); `build_lm` runs lmplz and
writes the directory. A re-run with the same text, alphabet, settings and code does nothing.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from common import cli, fsutil
from common import config as configlib
from pipeline import open_text
from pipeline import text as textlib

ARPA, RECORD = "lm.arpa", "lm.json"
LMPLZ_ENV = "LMPLZ"  # the lmplz binary to run, where it is not beside the Python that runs this stage


@dataclasses.dataclass(frozen=True)
class LmConfig:
    """The n-gram's settings (`--set KEY=VALUE`, or a YAML file with `--config`)."""

    order: int = 3
    memory: str = "10%"  # lmplz -S: the sorting memory, a share of RAM or a size (1G)

    def __post_init__(self):
        if not 1 <= self.order <= 6:
            raise ValueError(f"order must be 1-6, got {self.order}")


class TextError(ValueError):
    """A text the LM cannot be built from, with the file, the line and the fix."""


def read_lines(data: Path | None, text_file: Path | None) -> tuple[Path, list[tuple[int, str]]]:
    """(the file read, its (line number, sentence) pairs): a data directory's `text` (each line's
    utterance id dropped) or a text file of one sentence per line; blank lines are skipped."""
    if (data is None) == (text_file is None):
        raise ValueError("give one of --data (a Kaldi data directory) and --text-file")
    path = (data / "text") if data is not None else text_file
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file" + (" (a Kaldi data directory has one)" if data else ""))
    lines = []
    with path.open(encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if data is not None:  # the utterance id goes; an utterance with an empty transcript has no words
                line = (line.split(maxsplit=1) + [""])[1]
            if line.strip():
                lines.append((number, line))
    return path, lines


def plan(
    path: Path,
    lines: Sequence[tuple[int, str]],
    vocabulary: Sequence[str] | None,
    lowercase: bool,
    spoken: bool = False,
) -> tuple[list[str], Counter]:
    """(the sentences the n-gram is estimated from, {reason: lines left out}): each line normalized
    as the transcripts are (`spoken`: a corpus' line, as pipeline/open_text.py normalizes open
    English; else a transcript). TextError for a text with no sentences or a line with characters
    outside `vocabulary` (the model's; None: a phone model's LM, whose words a lexicon spells)."""
    alphabet = None if vocabulary is None else {ch for ch in vocabulary if len(ch) == 1}
    sentences, bad, left_out = [], [], Counter()
    for number, line in lines:
        if spoken:
            try:
                sentence = open_text.normalize(line)
            except open_text.Unspeakable as err:
                left_out[err.reason] += 1
                continue
        else:
            sentence = textlib.normalize_transcript(line, lowercase)
        outside = [] if alphabet is None else sorted({ch for ch in sentence if ch not in alphabet})
        if outside:
            bad.append((number, outside, sentence))
        else:
            sentences.append(sentence)
    if bad:
        shown = "; ".join(f"line {n}: {''.join(chars)!r} in {s[:60]!r}" for n, chars, s in bad[:3])
        raise TextError(
            f"{path}: {len(bad)} of {len(lines)} lines hold characters outside the acoustic model's alphabet "
            f"({''.join(sorted(alphabet))!r}), which it can never spell ({shown}). Normalize the text first: "
            "numbers and symbols spelled out, punctuation removed (pipeline/open_text.py `normalize` does it "
            "for English), or leave those lines out"
        )
    if not sentences:
        dropped = f" ({sum(left_out.values())} left out: {dict(left_out)})" if left_out else ""
        raise TextError(f"{path}: no sentences{dropped}; the language model needs a text of one sentence per line")
    return sentences, left_out


def lmplz() -> str:
    """The lmplz binary: $LMPLZ, beside the running Python (where `make setup` installs it), or on PATH."""
    for candidate in (os.environ.get(LMPLZ_ENV), str(Path(sys.executable).parent / "lmplz"), shutil.which("lmplz")):
        if candidate and Path(candidate).is_file() and os.access(candidate, os.X_OK):
            return candidate
    raise FileNotFoundError(
        "KenLM's lmplz was not found (beside this Python, on PATH, or in $LMPLZ): `make setup` builds it "
        "into .venv/bin; elsewhere build it from KenLM's sources (its README) and set LMPLZ=/path/to/lmplz"
    )


def ngram_counts(arpa: Path) -> dict[int, int]:
    """{order: count} of an ARPA file's header (`ngram 1=NNN`); ValueError naming the file when it
    has no header (not an ARPA file, or a truncated one)."""
    counts = {}
    with arpa.open(encoding="utf-8", errors="replace") as f:
        first = f.readline().strip()
        for line in f:
            found = re.match(r"ngram (\d+)=(\d+)", line.strip())
            if found:
                counts[int(found.group(1))] = int(found.group(2))
            elif counts and not line.strip():
                break
    if first != "\\data\\" or not counts:
        raise ValueError(f"{arpa}: not an ARPA file (no \\data\\ header with ngram counts); build it again")
    return counts


def _fingerprint(text_sha: str, config: LmConfig, vocabulary: Sequence[str] | None, lowercase: bool) -> str:
    return fsutil.config_hash(
        {
            "text": text_sha,
            "config": dataclasses.asdict(config),
            "alphabet": None if vocabulary is None else list(vocabulary),
            "lowercase": lowercase,
            "code": fsutil.code_version(sys.modules[__name__], textlib, open_text),
        }
    )


def build_lm(
    path: Path,
    lines: Sequence[tuple[int, str]],
    out: Path,
    config: LmConfig,
    vocabulary: Sequence[str] | None,
    lowercase: bool = True,
    spoken: bool = False,
) -> dict:
    """Writes OUT/lm.arpa from the text `lines` of `path` (`spoken`: a corpus' lines, see `plan`) and
    then OUT/lm.json; returns the record. Nothing is done when OUT/lm.json says the same text,
    alphabet, settings and code made OUT/lm.arpa."""
    sentences, left_out = plan(path, lines, vocabulary, lowercase, spoken)
    body = "\n".join(sentences) + "\n"
    text_sha = hashlib.sha256(body.encode()).hexdigest()
    fingerprint = _fingerprint(text_sha, config, vocabulary, lowercase)
    earlier = fsutil.read_json(out / RECORD)
    if (
        isinstance(earlier, dict)
        and earlier.get("fingerprint") == fingerprint
        and (out / ARPA).is_file()
        and fsutil.file_sha256(out / ARPA) == earlier.get("arpa", {}).get("sha256")
    ):
        return {**earlier, "skipped": True}
    out.mkdir(parents=True, exist_ok=True)
    (out / RECORD).unlink(missing_ok=True)  # the marker goes first: a half-written ARPA is never "done"
    with tempfile.TemporaryDirectory(prefix="lmplz-") as tmp:
        partial = Path(tmp) / ARPA
        cmd = [lmplz(), "-o", str(config.order), "-S", config.memory, "-T", tmp, "--discount_fallback"]
        done = subprocess.run(cmd + ["--arpa", str(partial)], input=body, text=True, capture_output=True)
        if done.returncode != 0:
            raise RuntimeError(f"lmplz failed ({done.returncode}) on {path}: {done.stderr.strip()[-2000:]}")
        counts = ngram_counts(partial)
        shutil.move(str(partial), out / ARPA)
    words = [w for s in sentences for w in s.split()]
    record = {
        "order": config.order,
        "config": dataclasses.asdict(config),
        "text": {
            "source": str(path),
            "sha256": text_sha,
            "sentences": len(sentences),
            "words": len(words),
            "vocabulary_size": len(set(words)),
            "left_out": dict(left_out),
        },
        "arpa": {
            "file": ARPA,
            "sha256": fsutil.file_sha256(out / ARPA),
            "ngrams": {str(k): n for k, n in counts.items()},
        },
        "lowercase": lowercase,
        "estimator": "KenLM lmplz, modified Kneser-Ney (--discount_fallback)",
        "fingerprint": fingerprint,
    }
    fsutil.atomic_write_json(out / RECORD, record)
    return record


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m pipeline.lm",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--data", type=Path, help="a Kaldi data directory whose transcripts (text) are the LM's text")
    source.add_argument("--text-file", type=Path, help="the LM's text: one sentence per line (a domain's corpus)")
    spelling = parser.add_mutually_exclusive_group(required=True)
    spelling.add_argument(
        "--vocabulary-from",
        type=Path,
        help="the acoustic model's alphabet: its shards directory, training workdir or model/ (a character model)",
    )
    spelling.add_argument(
        "--lexicon",
        type=Path,
        help="a phone model's: the words are spelled by this dict dir or lang dir, so no alphabet is checked",
    )
    parser.add_argument("--out", required=True, type=Path, help="the directory to write lm.arpa and lm.json into")
    cli.add_config_arguments(parser, "LmConfig")
    args = parser.parse_args(argv)
    return cli.run(lambda: _main(args))


def _main(args: argparse.Namespace) -> None:
    config = configlib.load(LmConfig, args.config, args.set)
    vocab = textlib.load_vocabulary(args.vocabulary_from) if args.vocabulary_from else None
    if args.lexicon and not args.lexicon.is_dir():
        raise FileNotFoundError(f"--lexicon {args.lexicon}: no such directory (a Kaldi dict dir or lang dir)")
    path, lines = read_lines(args.data, args.text_file)
    alphabet, lowercase = (vocab["vocabulary"], vocab["lowercase"]) if vocab else (None, True)
    record = build_lm(path, lines, args.out, config, alphabet, lowercase, spoken=args.text_file is not None)
    text = record["text"]
    print(
        f"{'up to date' if record.get('skipped') else 'wrote'} {args.out / ARPA}: order {record['order']}, "
        f"{text['sentences']} sentences, {text['words']} words, {text['vocabulary_size']} distinct; "
        f"n-grams {record['arpa']['ngrams']}" + (f"; left out: {text['left_out']}" if text["left_out"] else "")
    )


if __name__ == "__main__":
    sys.exit(main())
