"""The decoding graph stage: a lexicon and an ARPA word LM -> a lang dir with HLG.fst, torch-free.

    python -m pipeline.lang --dict DIR --arpa lm.arpa --out DIR [--g2p] [--set sil_prob=0.5]
    python -m pipeline.lang --lang DIR --arpa lm.arpa --out DIR

It follows icefall's `local/prepare_lang.py` and `local/prepare_lang_fst.py` with kaldifst and
kaldilm (icefall itself imports torch). From a Kaldi dict dir (`--dict`) it writes:
- `tokens.txt`: the CTC output layer, `<blk>` 0, then the lexicon's phone set (`pipeline/lexicon.py`),
  then the disambiguation symbols `#0`..`#k`;
- `words.txt`: `<eps>` 0, the lexicon's words, `#0`, `<s>`, `</s>`;
- `lexicon_disambig.txt` (`WORD PROB PHONE...`): pronunciations made unique and prefix-free with
  `#1`.. (Kaldi's `add_lex_disambig.pl`), `L.fst` and `L_disambig.fst` (optional silence after every word);
- `G.fst` (kaldilm's `arpa2fst`, `#0` on the back-off arcs) and `HLG.fst`: H, the CTC topology,
  composed with det(min(L o G)), determinized and minimized, the `#k` then replaced by epsilon.
From a Kaldi lang dir (`--lang`: `phones.txt`, `words.txt`, `L_disambig.fst`) its L is used as it is,
and the output layer is `phones.txt` less `<eps>` and the `#k` symbols, silence and position
variants (`_B/_E/_I/_S`) kept, after `<blk>`.
`lang.json` records the graph's size and checksum (the decoder refuses another file), the counts
below, and the optional silence between words (the dict dir's `optional_silence.txt`, a lang dir's
`phones/optional_silence.txt` when it has one), which a CTM leaves out of the words' times.

Labels: an FST input label is a token id + 1, so that 0 stays epsilon and the CTC blank is 1
(kaldi-decoder's `DecodableCtc` reads column `ilabel - 1`); an output label is a words.txt id.
LM words the lexicon cannot spell leave their n-grams out of G (arpa2fst skips them); they are
counted in `lang.json`, and `--g2p` gives them pronunciations instead (dict dirs only): espeak-ng's,
or for a CMUdict lexicon (pipeline/cmudict_lexicon.py) CMUdict's, then espeak-ng's mapped to ARPAbet.
The stage writes into a temporary directory renamed into place, and does nothing when `lang.json`
records the same inputs, settings and code.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import shutil
import sys
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import kaldifst

from common import cli, fsutil
from common import config as configlib
from pipeline import cmudict_lexicon, phonemes, text_lexicon
from pipeline import lexicon as lexlib

BLANK = "<blk>"
EPS = "<eps>"
TOKENS, WORDS, LEXICON_DISAMBIG = "tokens.txt", "words.txt", "lexicon_disambig.txt"
L_FST, L_DISAMBIG, G_FST, HLG_FST = "L.fst", "L_disambig.fst", "G.fst", "HLG.fst"
RECORD = "lang.json"  # the done-marker, and the graph's size and checksum the decoder checks
PHONES = "phones.txt"  # a Kaldi lang dir's phone table
KALDI_OPTIONAL_SILENCE = "phones/optional_silence.txt"  # in a Kaldi lang dir: the phone L puts between words

__all__ = ["BLANK", "HLG_FST", "RECORD", "TOKENS", "WORDS", "LangConfig", "Tables", "build", "main"]


@dataclasses.dataclass(frozen=True)
class LangConfig:
    sil_prob: float = 0.5  # probability of the optional silence after a word (Kaldi's default); 0: none
    g2p: bool = False  # LM words the dict dir lacks get its G2P's pronunciations (below), instead of leaving G
    voice: str = phonemes.DEFAULT_VOICE  # espeak-ng's accent for those pronunciations

    def __post_init__(self):
        if not 0.0 <= self.sil_prob < 1.0:
            raise ValueError(f"sil_prob must be in [0, 1), got {self.sil_prob}")


@dataclasses.dataclass(frozen=True)
class Tables:
    """A lang dir's symbol tables, each in id order."""

    tokens: tuple[str, ...]  # <blk>, the output layer's phones, #0..#k
    words: tuple[str, ...]  # <eps>, words, #0, <s>, </s>

    @property
    def num_outputs(self) -> int:
        """The CTC output layer's size: the tokens less the disambiguation symbols."""
        return sum(1 for t in self.tokens if not is_disambig(t))

    @property
    def disambig_labels(self) -> range:
        """The FST input labels of #0..#k (they follow every output token)."""
        return range(self.num_outputs + 1, len(self.tokens) + 1)


def is_disambig(symbol: str) -> bool:
    return symbol.startswith("#") and symbol[1:].isdigit()


def add_disambig(entries: Sequence[lexlib.Entry]) -> tuple[list[lexlib.Entry], int]:
    """Entries whose phones end in `#1`, `#2`... where a pronunciation is another's or a prefix of
    another's (Kaldi's `add_lex_disambig.pl`), and the highest k used (0 when none)."""
    count = Counter(e.phones for e in entries)
    prefixes = {e.phones[:n] for e in entries for n in range(1, len(e.phones))}
    last: dict[tuple[str, ...], int] = {}
    out: list[lexlib.Entry] = []
    for entry in entries:
        if count[entry.phones] == 1 and entry.phones not in prefixes:
            out.append(entry)
            continue
        last[entry.phones] = last.get(entry.phones, 0) + 1
        out.append(dataclasses.replace(entry, phones=entry.phones + (f"#{last[entry.phones]}",)))
    return out, max(last.values(), default=0)


def dict_tables(lexicon: lexlib.Lexicon, max_disambig: int) -> Tables:
    """The tables of a lang dir built from `lexicon`; #0 is G's back-off symbol, #1.. the lexicon's."""
    disambig = tuple(f"#{k}" for k in range(max_disambig + 1))
    return Tables((BLANK, *lexicon.phones, *disambig), (EPS, *lexicon.words, "#0", "<s>", "</s>"))


def make_lexicon_fst(
    entries: Sequence[lexlib.Entry], tables: Tables, silence: str, sil_prob: float, disambig: bool
) -> kaldifst.StdVectorFst:
    """L (or L_disambig with `disambig`: the entries carry their #k, and a #0:#0 self-loop passes G's
    back-off symbol through) in icefall's and Kaldi's shape: a loop state words leave from and return
    to, with `silence` optional after each word at probability `sil_prob`. A pronunciation costs
    -ln(prob), on its first arc."""
    token = {t: i + 1 for i, t in enumerate(tables.tokens)}
    word = {w: i for i, w in enumerate(tables.words)}
    fst = kaldifst.StdVectorFst()
    start, loop = fst.add_state(), fst.add_state()
    fst.start = start
    fst.set_final(state=loop, weight=0)
    if sil_prob > 0:
        sil_state = fst.add_state()
        _arc(fst, start, loop, 0, 0, -math.log(1 - sil_prob))
        _arc(fst, start, sil_state, 0, 0, -math.log(sil_prob))
        _arc(fst, sil_state, loop, token[silence], 0, 0)
        ends = [(loop, -math.log(1 - sil_prob)), (sil_state, -math.log(sil_prob))]
    else:
        _arc(fst, start, loop, 0, 0, 0)
        ends = [(loop, 0.0)]
    for entry in entries:
        state, cost = loop, -math.log(entry.prob)
        olabel = word[entry.word]
        for phone in entry.phones[:-1]:
            nxt = fst.add_state()
            _arc(fst, state, nxt, token[phone], olabel, cost)
            state, olabel, cost = nxt, 0, 0.0
        for end, end_cost in ends:
            _arc(fst, state, end, token[entry.phones[-1]], olabel, cost + end_cost)
    if disambig:
        _arc(fst, loop, loop, token["#0"], word["#0"], 0)
    return fst


def _arc(fst: kaldifst.StdVectorFst, src: int, dst: int, ilabel: int, olabel: int, cost: float) -> None:
    fst.add_arc(state=src, arc=kaldifst.StdArc(ilabel=ilabel, olabel=olabel, weight=cost, nextstate=dst))


def make_ctc_topo(tables: Tables) -> kaldifst.StdVectorFst:
    """H: icefall's standard CTC topology over the output tokens (a state per token, every state final;
    a token's repeats and the blank output epsilon), with a self-loop per #k on every state so that
    the disambiguation symbols of L o G pass through the composition."""
    fst = kaldifst.StdVectorFst()
    n = tables.num_outputs
    for _ in range(n):
        fst.set_final(state=fst.add_state(), weight=0)
    fst.start = 0  # the blank's state
    for src in range(n):
        for dst in range(n):
            _arc(fst, src, dst, dst + 1, dst + 1 if dst not in (0, src) else 0, 0)
        for label in tables.disambig_labels:
            _arc(fst, src, src, label, label, 0)
    return fst


def make_grammar_fst(arpa: Path, words_txt: Path) -> kaldifst.StdVectorFst:
    """G from an ARPA file over words.txt's ids, `#0` on its back-off arcs and the sentence ends as
    epsilon (kaldilm's arpa2fst, Kaldi's); n-grams with a word words.txt lacks are skipped."""
    import kaldilm  # here, not at the top: decoding with a built graph (models/asr/hlg.py) needs no kaldilm

    text = kaldilm.arpa2fst(str(arpa), disambig_symbol="#0", read_symbol_table=str(words_txt))
    if not text.strip():
        raise ValueError(f"{arpa}: no n-gram of it has only words of {words_txt}; is it the LM of this lexicon?")
    return kaldifst.compile(s=text, acceptor=False)


def compose_hlg(
    h: kaldifst.StdVectorFst, l_disambig: kaldifst.StdVectorFst, g: kaldifst.StdVectorFst, tables: Tables
) -> kaldifst.StdVectorFst:
    """HLG = det(H o min(det(L o G))) with the #k input labels then epsilon (icefall's build_HLG),
    minimized while the #k still keep it deterministic."""
    l_disambig, h = kaldifst.StdVectorFst(l_disambig), kaldifst.StdVectorFst(h)  # the arcsorts change them
    kaldifst.arcsort(l_disambig, sort_type="olabel")
    kaldifst.arcsort(g, sort_type="ilabel")
    lg = kaldifst.compose(l_disambig, g)
    kaldifst.determinize_star(lg)
    kaldifst.minimize_encoded(lg)
    kaldifst.arcsort(lg, sort_type="ilabel")
    kaldifst.arcsort(h, sort_type="olabel")
    hlg = kaldifst.compose(h, lg)
    kaldifst.determinize_star(hlg)
    kaldifst.minimize_encoded(hlg)
    return _without_disambig_inputs(hlg, tables)


def _without_disambig_inputs(hlg: kaldifst.StdVectorFst, tables: Tables) -> kaldifst.StdVectorFst:
    """`hlg` with its #k input labels replaced by epsilon: composed after a one-state FST that maps
    every token to itself and epsilon to each #k. OpenFst's composition runs in C++; walking the
    graph's millions of arcs in Python took four times as long."""
    relabel = kaldifst.StdVectorFst()
    loop = relabel.add_state()
    relabel.start = loop
    relabel.set_final(state=loop, weight=0)
    for label in range(1, len(tables.tokens) + 1):
        keep = 0 if label in tables.disambig_labels else label
        relabel.add_arc(state=loop, arc=kaldifst.StdArc(ilabel=keep, olabel=label, weight=0, nextstate=loop))
    kaldifst.arcsort(relabel, sort_type="olabel")
    kaldifst.arcsort(hlg, sort_type="ilabel")
    out = kaldifst.compose(relabel, hlg)
    kaldifst.arcsort(out, sort_type="ilabel")
    return out


def arpa_vocabulary(arpa: Path) -> set[str]:
    """The words of an ARPA file's unigrams, less <s> and </s>."""
    words: set[str] = set()
    section = ""
    with open(arpa, encoding="utf-8") as handle:
        for line in handle:
            line = line.strip()
            if line.startswith("\\"):
                section = line
            elif section == "\\1-grams:" and line:
                fields = line.split()
                if len(fields) >= 2:
                    words.add(fields[1])
    if not words:
        raise ValueError(f"{arpa}: no \\1-grams: section with words; is it an ARPA file?")
    return words - {"<s>", "</s>"}


def write_table(path: Path, symbols: Sequence[str]) -> None:
    fsutil.atomic_write_text(path, "".join(f"{s} {i}\n" for i, s in enumerate(symbols)))


def read_table(path: Path) -> tuple[str, ...]:
    """A Kaldi symbol table (`SYMBOL ID` a line, ids 0..n-1 in order) -> its symbols in id order."""
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file (a lang dir has one; build it with python -m pipeline.lang)")
    symbols: list[str] = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        fields = line.split()
        if not fields:
            continue
        if len(fields) != 2 or fields[1] != str(len(symbols)):
            raise ValueError(
                f"{path}:{number}: expected `SYMBOL {len(symbols)}`, got {line!r}; ids run 0, 1, ... "
                "in order, one symbol a line"
            )
        symbols.append(fields[0])
    if not symbols:
        raise ValueError(f"{path}: empty symbol table")
    return tuple(symbols)


def read_lang_dir(path: Path) -> tuple[Tables, kaldifst.StdVectorFst]:
    """A Kaldi lang dir -> its tables in this stage's terms and its L_disambig relabelled to token labels.

    The output layer is phones.txt less <eps> and #k, in phones.txt's order, after <blk>."""
    phones = read_table(path / PHONES)
    words = read_table(path / WORDS)
    if phones[0] != EPS or words[0] != EPS:
        raise ValueError(f"{path}: {PHONES} and {WORDS} start with `<eps> 0` in a Kaldi lang dir")
    missing = [w for w in ("#0", "<s>", "</s>") if w not in words]
    if missing or "#0" not in phones:
        raise ValueError(
            f"{path}: {WORDS} lacks {' '.join(missing) or '-'} or {PHONES} lacks #0; "
            "it is not a lang dir of Kaldi's utils/prepare_lang.sh"
        )
    outputs = [p for p in phones[1:] if not is_disambig(p)]
    disambig = [p for p in phones[1:] if is_disambig(p)]
    tables = Tables((BLANK, *outputs, *disambig), words)
    token_label = {t: n + 1 for n, t in enumerate(tables.tokens)}
    label = {i: token_label[p] for i, p in enumerate(phones) if i} | {0: 0}  # phones.txt id -> input label
    fst = _read_fst(path / L_DISAMBIG)
    for state in kaldifst.StateIterator(fst):
        for arc in kaldifst.ArcIterator(fst, state):
            if arc.ilabel not in label:
                raise ValueError(
                    f"{path / L_DISAMBIG}: input label {arc.ilabel} is not in {path / PHONES}; "
                    "the lang dir's files are from different runs of prepare_lang.sh"
                )
            arc.ilabel = label[arc.ilabel]
    return tables, fst


def _read_fst(path: Path) -> kaldifst.StdVectorFst:
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file (a Kaldi lang dir has it: utils/prepare_lang.sh writes it)")
    fst = kaldifst.StdVectorFst.read(str(path))  # None, with OpenFst's reason on stderr, when unreadable
    if fst is None:
        raise ValueError(f"{path}: not a whole OpenFst vector FST (truncated, or another format); write it again")
    return fst


def _from_dict(dict_dir: Path, arpa: Path, config: LangConfig, tmp: Path) -> dict:
    """Writes the dict dir's tables, lexicon_disambig.txt, L.fst and L_disambig.fst into `tmp`; returns
    L_disambig and the counts lang.json reports."""
    lexicon = lexlib.read_dict_dir(dict_dir)
    lm_words = arpa_vocabulary(arpa)
    unspelled = sorted(lm_words - set(lexicon.words))
    filled: tuple[str, ...] = ()
    if config.g2p and unspelled:
        marker = text_lexicon.marker_config(dict_dir)
        say, said_by = cmudict_lexicon.g2p_for(marker.get("g2p", ""), bool(marker.get("fold_stress")), config.voice)
        lexicon, filled = lexlib.fill_missing(lexicon, unspelled, True, config.voice, str(arpa), say, said_by)
        unspelled = []
    entries, max_disambig = add_disambig(lexicon.entries)
    tables = dict_tables(lexicon, max_disambig)
    silence = lexicon.optional_silence
    make_lexicon_fst(lexicon.entries, tables, silence, config.sil_prob, disambig=False).write(str(tmp / L_FST))
    l_disambig = make_lexicon_fst(entries, tables, silence, config.sil_prob, disambig=True)
    l_disambig.write(str(tmp / L_DISAMBIG))
    lines = [f"{e.word} {e.prob:.6g} {' '.join(e.phones)}" for e in entries]
    fsutil.atomic_write_text(tmp / LEXICON_DISAMBIG, "".join(f"{line}\n" for line in lines))
    return {
        "tables": tables,
        "L": l_disambig,
        "g2p_filled": len(filled),
        "lm_words_unspelled": len(unspelled),
        "optional_silence": silence,
    }


def _from_lang(lang_dir: Path, arpa: Path) -> dict:
    tables, l_disambig = read_lang_dir(lang_dir)
    unspelled = arpa_vocabulary(arpa) - set(tables.words)
    optional = lang_dir / KALDI_OPTIONAL_SILENCE
    silence = optional.read_text(encoding="utf-8").strip() if optional.is_file() else None
    if silence is not None and silence not in tables.tokens:
        raise ValueError(
            f"{optional}: {silence!r} is not a phone of {lang_dir / PHONES}; write the phone L puts between words"
        )
    return {
        "tables": tables,
        "L": l_disambig,
        "g2p_filled": 0,
        "lm_words_unspelled": len(unspelled),
        "optional_silence": silence,
    }


def _inputs(source: Path, arpa: Path) -> list[Path]:
    names = [
        lexlib.LEXICONP,
        lexlib.LEXICON,
        lexlib.NONSILENCE,
        lexlib.SILENCE,
        lexlib.OPTIONAL_SILENCE,
        PHONES,
        WORDS,
        L_DISAMBIG,
        KALDI_OPTIONAL_SILENCE,
    ]
    return [Path(arpa)] + [Path(source) / n for n in names]


def fingerprint(source: Path, arpa: Path, config: LangConfig, kind: str) -> str:
    """A hash of the inputs' bytes, the settings and this stage's code: lang.json's `fingerprint`."""
    files = fsutil.fingerprint_files(_inputs(source, arpa))
    code = fsutil.code_version(sys.modules[__name__], lexlib)
    return fsutil.config_hash({"files": files, "kind": kind, "config": dataclasses.asdict(config), "code": code})


def build(source: Path, arpa: Path, out: Path, config: LangConfig, kind: str = "dict") -> dict:
    """Builds OUT (tokens.txt, words.txt, L_disambig.fst, G.fst, HLG.fst, lang.json ...) from a Kaldi
    dict dir (`kind="dict"`) or lang dir (`kind="lang"`) and an ARPA LM; returns lang.json's record.
    Nothing is done when OUT/lang.json records the same fingerprint and HLG.fst's checksum."""
    if kind not in ("dict", "lang"):
        raise ValueError(f"kind is dict or lang, got {kind!r}")
    if not Path(arpa).is_file():
        raise FileNotFoundError(f"{arpa}: no such ARPA file (python -m pipeline.lm writes one)")
    out = Path(out)
    stamp = fingerprint(source, arpa, config, kind)
    earlier = fsutil.read_json(out / RECORD)
    if _up_to_date(earlier, stamp, out):
        return {**earlier, "skipped": True}
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        record = _build_into(Path(source), Path(arpa), tmp, config, kind)
        record["fingerprint"] = stamp
        fsutil.atomic_write_json(tmp / RECORD, record)
        _replace_dir(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return record


def _up_to_date(earlier: object, stamp: str, out: Path) -> bool:
    """OUT/lang.json records `stamp` and OUT/HLG.fst is still the file it describes."""
    if not isinstance(earlier, dict) or earlier.get("fingerprint") != stamp or not (out / HLG_FST).is_file():
        return False
    return fsutil.file_sha256(out / HLG_FST) == earlier.get("hlg", {}).get("sha256")


def _build_into(source: Path, arpa: Path, tmp: Path, config: LangConfig, kind: str) -> dict:
    started = time.perf_counter()
    parts = _from_dict(source, arpa, config, tmp) if kind == "dict" else _from_lang(source, arpa)
    tables: Tables = parts["tables"]
    write_table(tmp / TOKENS, tables.tokens)
    write_table(tmp / WORDS, tables.words)
    g = make_grammar_fst(arpa, tmp / WORDS)
    g.write(str(tmp / G_FST))
    hlg = compose_hlg(make_ctc_topo(tables), parts["L"], g, tables)
    hlg.write(str(tmp / HLG_FST))
    return {
        "source": {"kind": kind, "path": str(source), "arpa": str(arpa)},
        "config": dataclasses.asdict(config),
        "num_outputs": tables.num_outputs,
        "tokens": len(tables.tokens),
        "words": len(tables.words),
        "g2p_filled": parts["g2p_filled"],
        "lm_words_unspelled": parts["lm_words_unspelled"],
        # the token between words that is no word's (a CTM leaves it out of the words' times); None: unknown
        "optional_silence": parts["optional_silence"],
        "hlg": {
            "file": HLG_FST,
            "sha256": fsutil.file_sha256(tmp / HLG_FST),
            "bytes": (tmp / HLG_FST).stat().st_size,
            "states": hlg.num_states,
            "arcs": sum(hlg.num_arcs(s) for s in range(hlg.num_states)),
        },
        "build_seconds": round(time.perf_counter() - started, 3),
    }


def _replace_dir(new: Path, out: Path) -> None:
    """Renames `new` to `out`; an old `out` is moved aside first and removed after."""
    old = out.with_name(f".{out.name}.old-{os.getpid()}")
    if out.exists():
        out.rename(old)
    new.rename(out)
    shutil.rmtree(old, ignore_errors=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m pipeline.lang",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--dict", type=Path, help="a Kaldi dict dir (lexiconp.txt or lexicon.txt and the phone files)")
    source.add_argument("--lang", type=Path, help="a Kaldi lang dir (phones.txt, words.txt, L_disambig.fst)")
    parser.add_argument("--arpa", required=True, type=Path, help="the word LM (python -m pipeline.lm writes one)")
    parser.add_argument("--out", required=True, type=Path, help="the lang dir to write (tokens.txt ... HLG.fst)")
    parser.add_argument(
        "--g2p",
        action="store_true",
        default=None,
        help="give LM words the dict dir lacks espeak-ng pronunciations (otherwise they leave G)",
    )
    cli.add_config_arguments(parser, "LangConfig")
    args = parser.parse_args(argv)
    return cli.run(lambda: _main(args))


def _main(args: argparse.Namespace) -> None:
    config = configlib.load(LangConfig, args.config, args.set, flags={"g2p": args.g2p})
    kind, source = ("dict", args.dict) if args.dict is not None else ("lang", args.lang)
    record = build(source, args.arpa, args.out, config, kind)
    hlg = record["hlg"]
    print(
        f"{'up to date' if record.get('skipped') else 'wrote'} {args.out / HLG_FST}: {record['num_outputs']} outputs, "
        f"{record['words']} words, {hlg['states']} states, {hlg['arcs']} arcs, {hlg['bytes']} bytes in "
        f"{record['build_seconds']} s; G2P filled {record['g2p_filled']}, "
        f"LM words without a pronunciation {record['lm_words_unspelled']}"
    )


if __name__ == "__main__":
    sys.exit(main())
