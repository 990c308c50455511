"""The phoneme front-end: text -> espeak-ng's phonemes, one function for every stage that needs them
(the shard stage stores them beside the characters; training, evaluation, batch synthesis and
serving read them from there or call `phonemize` on what a user typed).

    python -m pipeline.phonemes "turn left at the lights" [--voice en-us]

A sentence becomes one symbol per phoneme in espeak-ng's ASCII names (`-x`), a stress mark kept with
its vowel ("'aI" and "aI" are two symbols), and " " between words:
"the cat" -> ["D", "@2", " ", "k", "'a", "t"]. Every utterance is written in one accent (`voice`,
en-us by default) whatever voice or engine spoke it, so the symbols mean the same sounds across the
corpus and a model hears each voice's own way of saying them.

espeak-ng is called directly, one process for a whole list of sentences, rather than through the
`phonemizer` package: that would add its dependencies (segments, csvw, ...) to every environment a
model serves from, for the few lines below. espeak-ng answers each input line with one output line
unless a clause ends inside it (punctuation, which is therefore a space here, or a very long
sentence): when the count of lines differs, each sentence is asked for on its own and its lines
joined, so a reply is never matched to the wrong sentence.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
from collections.abc import Sequence

from common import cli

DEFAULT_VOICE = "en-us"
WORD = " "  # the symbol between words
# Characters that end a clause for espeak-ng (its line would be split) or that it would speak as
# a word; letters, digits, apostrophes and hyphens inside words are left to it.
_CLAUSE = re.compile(r"[^\w'\- ]+|\s+")

__all__ = ["DEFAULT_VOICE", "WORD", "phonemize", "version"]


def phonemize(texts: Sequence[str], voice: str = DEFAULT_VOICE) -> list[list[str]]:
    """Each text's phoneme symbols (see the module's docstring), in one espeak-ng call.

    FileNotFoundError naming the package when espeak-ng is not installed; ValueError with its
    message when it fails (a voice it does not have)."""
    cleaned = [" ".join(_CLAUSE.sub(" ", t).split()) for t in texts]
    spoken = [i for i, t in enumerate(cleaned) if t]
    out: list[list[str]] = [[] for _ in texts]
    if not spoken:
        return out
    lines = _espeak([cleaned[i] for i in spoken], voice)
    for i, line in zip(spoken, lines):
        out[i] = symbols(line)
    return out


def version() -> str:
    """espeak-ng's version line (the shard stage's fingerprint: another version may write other phonemes)."""
    tool = shutil.which("espeak-ng")
    if tool is None:
        return ""
    return subprocess.run([tool, "--version"], capture_output=True, text=True, check=False).stdout.strip()


def symbols(line: str) -> list[str]:
    """One line of `espeak-ng -x --sep=_` ("D_@2 k_'a_t") -> ["D", "@2", " ", "k", "'a", "t"]."""
    words = [[p for p in word.split("_") if p] for word in line.split()]
    out: list[str] = []
    for word in words:
        if not word:
            continue
        if out:
            out.append(WORD)
        out.extend(word)
    return out


def _espeak(lines: list[str], voice: str) -> list[str]:
    """espeak-ng's phoneme line for each of `lines` (none empty, none with clause punctuation)."""
    answer = _run_espeak("\n".join(lines), voice)
    if len(answer) == len(lines):
        return answer
    return [" ".join(_run_espeak(line, voice)) for line in lines]  # one call each: a sentence espeak-ng split


def _run_espeak(text: str, voice: str) -> list[str]:
    """The non-empty output lines of `espeak-ng -q -x --sep=_ -v VOICE` for `text`."""
    tool = shutil.which("espeak-ng")
    if tool is None:
        raise FileNotFoundError(
            "phoneme input needs espeak-ng, which is not on PATH: install it (`apt-get install espeak-ng`) "
            "wherever the model trains, is evaluated or serves"
        )
    proc = subprocess.run(
        [tool, "-q", "-x", "--sep=_", "-v", voice], input=text + "\n", capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        raise ValueError(
            f"espeak-ng -v {voice} failed ({proc.returncode}): {proc.stderr.strip()[-500:]} "
            "(the phonemes' voice is an espeak-ng voice: `espeak-ng --voices=en` lists them)"
        )
    return [line.strip() for line in proc.stdout.splitlines() if line.strip()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Prints the phoneme symbols a model with phoneme input reads.")
    parser.add_argument("text", nargs="+", help="sentences (one argument each)")
    parser.add_argument("--voice", default=DEFAULT_VOICE, help="the espeak-ng voice (accent) the phonemes are in")
    args = parser.parse_args(argv)

    def show() -> None:
        for sentence, phones in zip(args.text, phonemize(args.text, args.voice)):
            print(f"{sentence}\t{' '.join('|' if p == WORD else p for p in phones)}")

    return cli.run(show)


if __name__ == "__main__":
    sys.exit(main())
