"""Decoding a phone CTC model into words through an HLG graph (pipeline/lang.py builds it).

The decoder is kaldi-decoder's `FasterDecoder` over `DecodableCtc`, as sherpa-onnx's offline HLG
decoding runs it: a Viterbi beam search in which a frame costs `-acoustic_scale x log-posterior` of
the token on an arc's input (label = token id + 1, 0 epsilon) and the graph adds the lexicon's and
the LM's costs; the words are the output labels of the best path. `word_penalty` is added to every
arc that emits a word (Kaldi's word insertion penalty): positive values favour fewer words.

A graph is opened with the size of the model's output layer and refused, naming the file and the
fix, when it is missing, when it is not the HLG.fst its lang.json describes (truncated, another
build's), or when its tokens.txt does not match the model's outputs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path

import kaldi_decoder
import kaldifst
import numpy as np

from common import fsutil
from pipeline import lang as langstage

__all__ = ["HlgDecoder", "HlgDecoding", "HlgGraph", "load_graph"]

_REBUILD = "build it with `python -m pipeline.lang --dict DIR | --lang DIR --arpa LM --out DIR`"


@dataclasses.dataclass(frozen=True)
class HlgDecoding:
    """The search's settings; acoustic_scale and word_penalty are tuned on a dev split."""

    acoustic_scale: float = 1.0  # weight of the log-posteriors against the graph's costs (1 / LM weight)
    word_penalty: float = 0.0  # cost added per word emitted (natural-log units, as the graph's)
    beam: float = 16.0  # paths kept within this cost of the best, per frame
    max_active: int = 3000  # most states kept per frame (sherpa-onnx's value)

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

    @property
    def num_outputs(self) -> int:
        return langstage.Tables(self.tokens, self.words).num_outputs


def load_graph(lang_dir: Path, num_outputs: int, outputs: Sequence[str] | None = None) -> HlgGraph:
    """Opens LANG_DIR/HLG.fst for a model of `num_outputs` CTC outputs (blank included); `outputs`,
    when given, are the model's output symbols in id order, checked against tokens.txt.

    FileNotFoundError when a file is missing; ValueError when HLG.fst is not the file lang.json
    records (truncated or foreign) or the tokens do not match the model."""
    lang_dir = Path(lang_dir)
    path = lang_dir / langstage.HLG_FST
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file; {_REBUILD}")
    _check_record(lang_dir, path)
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
            f"{len(outputs)} output symbols for a model of {num_outputs} outputs; give one symbol per output, blank first"
        )
    if outputs is not None and tuple(outputs) != tokens[:graph_outputs]:
        differ = next(i for i, (a, b) in enumerate(zip(outputs, tokens)) if a != b)
        raise ValueError(
            f"{lang_dir / langstage.TOKENS}:{differ + 1}: token {tokens[differ]!r} where the model's output {differ} "
            f"is {outputs[differ]!r}; {_REBUILD} from the lexicon (or lang dir) the model was trained with"
        )
    fst = kaldifst.StdVectorFst.read(str(path))  # None, with OpenFst's reason on stderr, when unreadable
    if fst is None:
        raise ValueError(f"{path}: not an OpenFst vector FST; {_REBUILD}")
    return HlgGraph(lang_dir, fst, tokens, words)


def _check_record(lang_dir: Path, path: Path) -> None:
    """The graph is the one lang.json describes: a copy cut short or another build's is refused
    before OpenFst reads it."""
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


class HlgDecoder:
    """Decodes CTC log-posteriors into words; one decoder serves many utterances (a search of its
    own per call, so calls from several threads do not share state)."""

    def __init__(self, graph: HlgGraph, settings: HlgDecoding = HlgDecoding()):
        self.graph = graph
        self.settings = settings
        self._fst = _with_word_penalty(graph.fst, settings.word_penalty)
        self._options = kaldi_decoder.FasterDecoderOptions(beam=settings.beam, max_active=settings.max_active)

    def decode(self, log_probs: np.ndarray) -> list[str]:
        """[frames, outputs] float32 log-posteriors (a log-softmax) -> the best path's words."""
        frames = np.asarray(log_probs, dtype=np.float32)
        if frames.ndim != 2 or frames.shape[1] != self.graph.num_outputs:
            raise ValueError(
                f"log-posteriors of shape {frames.shape} for a graph of {self.graph.num_outputs} "
                "outputs; expected [frames, outputs]"
            )
        if frames.shape[0] == 0:
            return []
        scaled = np.ascontiguousarray(frames * self.settings.acoustic_scale)  # [frames, outputs]
        decoder = kaldi_decoder.FasterDecoder(self._fst, self._options)
        decoder.decode(kaldi_decoder.DecodableCtc(scaled))
        # Kaldi's decoders take the best partial path when no final state survived the beam.
        ok, best = decoder.get_best_path(use_final_probs=decoder.reached_final())
        if not ok:
            return []
        ok, _, olabels, _ = kaldifst.get_linear_symbol_sequence(best)
        return [self.graph.words[w] for w in olabels if w != 0] if ok else []


def _with_word_penalty(fst: kaldifst.StdVectorFst, penalty: float) -> kaldifst.StdVectorFst:
    """A copy of `fst` with `penalty` added to every arc that emits a word (the graph itself when 0)."""
    if penalty == 0:
        return fst
    out = kaldifst.StdVectorFst(fst)
    for state in kaldifst.StateIterator(out):
        for arc in kaldifst.ArcIterator(out, state):
            if arc.olabel != 0:
                arc.weight = kaldifst.TropicalWeight(arc.weight.value + penalty)
    return out
