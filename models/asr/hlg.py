"""Decoding a phone CTC model into words through an HLG graph (pipeline/lang.py builds it).

The decoder is kaldi-decoder's `FasterDecoder` over `DecodableCtc`, as sherpa-onnx's offline HLG
decoding runs it: a Viterbi beam search in which a frame costs `-acoustic_scale x log-posterior` of
the token on an arc's input (label = token id + 1, 0 epsilon) and the graph adds the lexicon's and
the LM's costs; the words are the output labels of the best path. `word_penalty` is added to every
arc that emits a word (Kaldi's word insertion penalty): positive values favour fewer words.

A graph is opened with the size of the model's output layer and refused, naming the file and the
fix, when it is missing, when it is not the HLG.fst its lang.json describes (truncated, another
build's), or when its tokens.txt does not match the model's outputs.

`GraphDecoder` is the graph as models/asr/lm.py hands it to every command that decodes a phone model
(`lm.choose`): the surface of the n-gram's `LmDecoder`, its settings from the lang dir's
decoding.json, which `tune` (models.tune_lm) chooses on a dev split.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from pathlib import Path

import kaldi_decoder
import kaldifst
import numpy as np

# kaldifst's `ArcIterator` takes vector FSTs only; the iterator of the Lattice a search's best path is
# is bound, but not exported (kaldifst 1.8.3). `HlgDecoder.align` walks the path with it.
from kaldifst.lib._kaldifst import _ArcIteratorLattice as _LatticeArcs

from common import fsutil
from models.asr import decoder_dir
from pipeline import lang as langstage

__all__ = ["GraphDecoder", "HlgDecoder", "HlgDecoding", "HlgGraph", "graph_record", "load_graph", "tune"]

_REBUILD = "build it with `python -m pipeline.lang --dict DIR | --lang DIR --arpa LM --out DIR`"


@dataclasses.dataclass(frozen=True)
class HlgDecoding:
    """The search's settings; acoustic_scale and word_penalty are tuned on a dev split."""

    acoustic_scale: float = 1.0  # weight of the log-posteriors against the graph's costs (1 / LM weight)
    word_penalty: float = 0.0  # cost added per word emitted (natural-log units, as the graph's)
    # The search's width, chosen on dev and dev_engine with the demo's phone model: beam 16 and 3000
    # states (sherpa-onnx's values) read dev_engine 0.65 points better at four times the time
    # (real-time factor 0.031 on one core, over the 0.02 a served model may take).
    beam: float = 12.0  # paths kept within this cost of the best, per frame
    max_active: int = 1000  # most states kept per frame

    def __post_init__(self):
        if self.acoustic_scale <= 0 or self.beam <= 0 or self.max_active < 1:
            raise ValueError(
                f"acoustic_scale and beam must be positive and max_active 1 or more, got {self.acoustic_scale}, "
                f"{self.beam}, {self.max_active}"
            )


@dataclasses.dataclass(frozen=True)
class HlgGraph:
    """An opened lang dir: its HLG and symbol tables."""

    path: Path  # the lang dir
    fst: kaldifst.StdVectorFst = dataclasses.field(compare=False, repr=False)
    tokens: tuple[str, ...]  # tokens.txt in id order: <blk>, the outputs, #k
    words: tuple[str, ...]  # words.txt in id order
    record: dict = dataclasses.field(default_factory=dict, compare=False, repr=False)  # lang.json

    @property
    def num_outputs(self) -> int:
        return langstage.Tables(self.tokens, self.words).num_outputs


def load_graph(lang_dir: Path, num_outputs: int, outputs: Sequence[str] | None = None) -> HlgGraph:
    """Opens LANG_DIR/HLG.fst for a model of `num_outputs` CTC outputs (blank included); `outputs`,
    when given, are the model's output symbols in id order, checked against tokens.txt.

    FileNotFoundError when a file is missing; ValueError when HLG.fst is not the file lang.json
    records (truncated or foreign) or the tokens do not match the model."""
    lang_dir = Path(lang_dir)
    record = graph_record(lang_dir)
    tokens = langstage.read_table(lang_dir / langstage.TOKENS)
    words = langstage.read_table(lang_dir / langstage.WORDS)
    graph_outputs = langstage.Tables(tokens, words).num_outputs
    if graph_outputs != num_outputs:
        raise ValueError(
            f"{lang_dir / langstage.TOKENS}: the graph has {graph_outputs} CTC outputs and the model {num_outputs}; "
            f"{_REBUILD} from the lexicon (or lang dir) the model was trained with"
        )
    if outputs is not None and len(outputs) != num_outputs:
        raise ValueError(
            f"{len(outputs)} output symbols for a model of {num_outputs} outputs;"
            " give one symbol per output, blank first"
        )
    if outputs is not None and tuple(outputs) != tokens[:graph_outputs]:
        differ = next(i for i, (a, b) in enumerate(zip(outputs, tokens)) if a != b)
        raise ValueError(
            f"{lang_dir / langstage.TOKENS}:{differ + 1}: token {tokens[differ]!r} where the model's output {differ} "
            f"is {outputs[differ]!r}; {_REBUILD} from the lexicon (or lang dir) the model was trained with"
        )
    path = lang_dir / langstage.HLG_FST
    fst = kaldifst.StdVectorFst.read(str(path))  # None, with OpenFst's reason on stderr, when unreadable
    if fst is None:
        raise ValueError(f"{path}: not an OpenFst vector FST; {_REBUILD}")
    return HlgGraph(lang_dir, fst, tokens, words, record)


def graph_record(lang_dir: str | Path) -> dict:
    """A lang dir's record (lang.json), once its HLG.fst is checked to be the file it describes: a
    copy cut short or another build's is refused before OpenFst reads it."""
    lang_dir = Path(lang_dir)
    path = lang_dir / langstage.HLG_FST
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file; {_REBUILD}")
    record = fsutil.read_json(lang_dir / langstage.RECORD)
    if not isinstance(record, dict) or not isinstance(record.get("hlg"), dict):
        raise FileNotFoundError(
            f"{lang_dir / langstage.RECORD}: missing or unreadable (the graph's record); {_REBUILD}"
        )
    expected = record["hlg"]
    size = path.stat().st_size
    if size != expected.get("bytes"):
        raise ValueError(
            f"{path}: {size} bytes where {langstage.RECORD} records {expected.get('bytes')} (truncated, or "
            f"another build's); copy the lang dir again whole, or {_REBUILD}"
        )
    if fsutil.file_sha256(path) != expected.get("sha256"):
        raise ValueError(
            f"{path}: its checksum is not the one {langstage.RECORD} records (another build's "
            f"graph); copy the lang dir again whole, or {_REBUILD}"
        )
    return record


class HlgDecoder:
    """Decodes CTC log-posteriors into words; one decoder serves many utterances (a search of its
    own per call, so calls from several threads do not share state)."""

    def __init__(self, graph: HlgGraph, settings: HlgDecoding = HlgDecoding(), fst=None):
        self.graph = graph
        self.settings = settings
        # `fst`: the graph with this word penalty already added (`with_settings` passes it on)
        self._fst = fst if fst is not None else _with_word_penalty(graph.fst, settings.word_penalty, len(graph.words))
        self._options = kaldi_decoder.FasterDecoderOptions(beam=settings.beam, max_active=settings.max_active)

    def with_settings(self, settings: HlgDecoding) -> HlgDecoder:
        """A decoder of the same graph with `settings`; the penalized graph is shared when the word
        penalty is the same (adding one walks every arc)."""
        same = settings.word_penalty == self.settings.word_penalty
        return HlgDecoder(self.graph, settings, self._fst if same else None)

    def decode(self, log_probs: np.ndarray) -> list[str]:
        """[frames, outputs] float32 log-posteriors (a log-softmax) -> the best path's words."""
        best = self._best_path(log_probs)
        if best is None:
            return []
        ok, _, olabels, _ = kaldifst.get_linear_symbol_sequence(best)
        return [self.graph.words[w] for w in olabels if w != 0] if ok else []

    def align(self, log_probs: np.ndarray) -> list[tuple[str, int, int]]:
        """The best path's words with their frames: (word, first frame, end frame exclusive), frames
        of `log_probs` [frames, outputs].

        A word starts at the frame whose arc emits it: the graph, determinized, emits a word once its
        phones so far tell it from every other word, so the start is exact for a word whose first
        phone does, and late by the phones it shares with others otherwise. It ends after its last
        non-blank frame before the next word starts, the optional silence between words (lang.json's
        `optional_silence`) left out."""
        best = self._best_path(log_probs)
        if best is None:
            return []
        silence = self.graph.record.get("optional_silence")
        skip = {0, 1} | ({self.graph.tokens.index(silence) + 1} if silence in self.graph.tokens else set())
        spans: list[list] = []  # [word, first frame, end frame]
        frame, state = 0, best.start
        while True:
            arcs = _LatticeArcs(best, state)
            if arcs.done:
                break
            arc = arcs.value
            if arc.olabel:
                spans.append([self.graph.words[arc.olabel], frame, frame + 1])
            if arc.ilabel:  # an arc with an input label reads one frame
                if spans and arc.ilabel not in skip:
                    spans[-1][2] = frame + 1
                frame += 1
            state = arc.nextstate
        return [(word, first, end) for word, first, end in spans]

    def _best_path(self, log_probs: np.ndarray):
        """The search's best path (a linear kaldifst Lattice), or None when there is none."""
        frames = np.asarray(log_probs, dtype=np.float32)
        if frames.ndim != 2 or frames.shape[1] != self.graph.num_outputs:
            raise ValueError(
                f"log-posteriors of shape {frames.shape} for a graph of {self.graph.num_outputs} "
                "outputs; expected [frames, outputs]"
            )
        if frames.shape[0] == 0:
            return None
        scaled = np.ascontiguousarray(frames * self.settings.acoustic_scale)  # [frames, outputs]
        decoder = kaldi_decoder.FasterDecoder(self._fst, self._options)
        decoder.decode(kaldi_decoder.DecodableCtc(scaled))
        # Kaldi's decoders take the best partial path when no final state survived the beam.
        ok, best = decoder.get_best_path(use_final_probs=decoder.reached_final())
        return best if ok else None


def _with_word_penalty(fst: kaldifst.StdVectorFst, penalty: float, num_words: int) -> kaldifst.StdVectorFst:
    """`fst` with `penalty` added to every arc that emits a word of words.txt's `num_words` (the graph
    itself when 0): composed
    with a one-state FST whose every word loop costs `penalty`. OpenFst's composition runs in C++,
    several times faster than walking the graph's millions of arcs in Python."""
    if penalty == 0:
        return fst
    per_word = kaldifst.StdVectorFst()
    loop = per_word.add_state()
    per_word.start = loop
    per_word.set_final(state=loop, weight=0)
    for word in range(1, num_words):
        per_word.add_arc(state=loop, arc=kaldifst.StdArc(ilabel=word, olabel=word, weight=penalty, nextstate=loop))
    graph = kaldifst.StdVectorFst(fst)  # the arcsort changes it
    kaldifst.arcsort(graph, sort_type="olabel")
    out = kaldifst.compose(graph, per_word)
    kaldifst.arcsort(out, sort_type="ilabel")
    return out


class GraphDecoder:
    """A lang dir's graph for a phone model, with the surface of models/asr/lm.py `LmDecoder` (what
    `lm.choose` gives a phone model): `decode` utterances into words, `align` them with frames,
    `describe` the graph for the figures, `coverage` of a split's words, `use` other settings.
    Settings default to the lang dir's decoding.json (models.tune_lm chooses them)."""

    def __init__(self, lang_dir: str | Path, outputs: Sequence[str], settings: HlgDecoding | None = None):
        self.lm_dir = Path(lang_dir)
        self.graph = load_graph(self.lm_dir, len(outputs), outputs)
        self.record = self.graph.record
        self.settings = settings or decoder_dir.chosen_settings(self.lm_dir, HlgDecoding)
        self.words = set(self.graph.words) - {langstage.EPS, "#0", "<s>", "</s>"}
        self._decoder = HlgDecoder(self.graph, self.settings)

    def use(self, settings: HlgDecoding) -> GraphDecoder:
        """Decodes with `settings` from now on (the graph stays loaded: a grid loads it once)."""
        self._decoder = self._decoder.with_settings(settings)
        self.settings = settings
        return self

    def decode(self, log_probs: Iterable[np.ndarray]) -> list[str]:
        """The words of each utterance's log-posteriors float32 [T', outputs] (its real frames),
        space-joined."""
        return [" ".join(self._decoder.decode(lp)) for lp in log_probs]

    def align(self, log_probs: Iterable[np.ndarray]) -> list[list[tuple[str, int, int]]]:
        """Per utterance, its words with their output frames (`HlgDecoder.align`)."""
        return [self._decoder.align(lp) for lp in log_probs]

    def describe(self) -> dict:
        """What a figure decoded through this graph names: the graph (checksum, size) and the settings."""
        graph = self.record["hlg"]
        return {
            "lm_kind": "hlg",
            "lm_graph_sha256": graph["sha256"],
            "lm_graph_bytes": graph["bytes"],
            "lm_graph_states": graph["states"],
            "lm_graph_arcs": graph["arcs"],
            "lm_vocabulary_size": len(self.words),
            **{f"lm_{k}": v for k, v in dataclasses.asdict(self.settings).items()},
        }

    def coverage(self, references: Sequence[str]) -> dict:
        """The share of the references' words outside words.txt (`lm_oov_rate`; the graph can never
        spell them); `lm_3gram_hit` None: a lang dir keeps no n-grams of its LM's text."""
        return decoder_dir.coverage_of(self.words, None, references)


def tune(
    references: Sequence[str],
    log_probs: Sequence[np.ndarray],
    decoder: GraphDecoder,
    acoustic_scales: Sequence[float],
    word_penalties: Sequence[float],
    progress: bool = True,
) -> tuple[HlgDecoding, list[dict]]:
    """The grid's best acoustic scale and word penalty by WER against `references` (words; CER breaks
    a tie) of the model's `log_probs` on a split, and every point's figures; the other settings are
    `decoder`'s. The forward pass is the caller's, once; each point decodes every utterance."""
    from common.progress import progress as progress_bar
    from models.asr.scoring import error_rates

    base, grid = decoder.settings, []
    points = [(penalty, scale) for penalty in word_penalties for scale in acoustic_scales]  # one penalized graph each
    for penalty, scale in progress_bar(points, desc="graph grid", unit="point", disable=not progress):
        settings = dataclasses.replace(base, acoustic_scale=scale, word_penalty=penalty)
        rates = error_rates(list(references), decoder.use(settings).decode(log_probs))
        grid.append({"acoustic_scale": scale, "word_penalty": penalty, "wer": rates["wer"], "cer": rates["cer"]})
    best = min(grid, key=lambda g: (g["wer"], g["cer"]))
    return dataclasses.replace(base, acoustic_scale=best["acoustic_scale"], word_penalty=best["word_penalty"]), grid
