"""Decoding the acoustic model with a word language model: CTC beam search with an n-gram.

pipeline/lm.py builds the n-gram (a KenLM ARPA and its record, lm.json, in one directory); here it is
opened, checked and used. The decoder is pyctcdecode's beam search, which scores each word as it
ends with the n-gram through the `kenlm` module (both from PyPI; `kenlm` compiled from its sdist):
open vocabulary (a word the n-gram lacks is allowed at a penalty, `unk_offset`, so a name the text
never had can still be spelled), character-level CTC prefixes, the stack wav2vec 2.0's users decode
with. Its score of a hypothesis is the acoustic log-probability + `weight` x the n-gram's
log-probability + `word_bonus` x the number of words (alpha and beta in its terms).

`LmDecoding` holds those settings; `DECODING` (decoding.json, beside lm.json) the ones a grid on a
dev split chose (models/tune_lm.py), which every decoder of that LM then uses unless told otherwise.

An LM travels with its acoustic model when it is attached (`attach`, `models.tune_lm --attach`): a
copy in the model directory's `lm/`, which the MLflow model logged from that directory carries to
the registry, so every command that opens the model (evaluation, transcription, the served model)
decodes with it unless told not to (`--no-lm`, the request param `lm: false`); `choose` says which.

A phone model (its data record's `targets: phones`) decodes into words through a lang dir's HLG
graph instead (pipeline/lang.py builds it, models/asr/hlg.py `GraphDecoder` decodes with it), by the
same mechanism: the graph is attached, chosen, tuned (its acoustic scale and word penalty, in
decoding.json) and tagged as an n-gram is; `is_graph` tells the two kinds of directory apart. A phone
model spells words only through its graph, so it has no `--no-lm`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

from common import fsutil
from models.asr import decoder_dir
from pipeline import lm as lmstage
from pipeline.text import BLANK, UNK

DECODING = decoder_dir.DECODING
GRAPH_RECORD = "lang.json"  # pipeline/lang.py RECORD, named here so that a char model's LM needs no kaldifst
GRAPH_FILES = ("HLG.fst", "tokens.txt", "words.txt", GRAPH_RECORD)  # what a phone model decodes with
TARGETS = ("chars", "phones")  # a model's data record's `targets`: what its output layer spells
ATTACHED = "lm"  # in a model directory: the LM the model decodes with unless told otherwise (`attach`)
DATA_KEY = "lm_dir"  # in a loaded model's data record: where its attached LM is (models/trained_model.py)
MODEL_KEY = "model_dir"  # in a loaded model's data record: its directory, which errors name (models/trained_model.py)
UNK_LABEL = "\u2047"  # how the decoder is told of our `<unk>` id: a label no word holds


@dataclasses.dataclass(frozen=True)
class LmDecoding:
    """The beam search's settings with an LM."""

    weight: float = 0.5  # the n-gram's log-probability weight (pyctcdecode's alpha)
    word_bonus: float = 1.0  # added per word (beta): offsets the LM's pull toward fewer, longer words
    beam_width: int = 32  # prefixes kept per frame
    unk_offset: float = -10.0  # log10 score added to a word the n-gram has never seen

    def __post_init__(self):
        if self.beam_width < 1 or self.weight < 0:
            raise ValueError(f"beam_width must be 1 or more and weight 0 or more, got {self.beam_width}, {self.weight}")


class LmError(ValueError):
    """An LM directory that cannot be decoded with, naming the file and the fix."""


def _rebuild(lm_dir: Path) -> str:
    return f"build it again: `python -m pipeline.lm --data DATA/train --vocabulary-from SHARDS --out {lm_dir}`"


def record_of(lm_dir: str | Path) -> dict:
    """The LM's record (lm.json), after checking that its ARPA is the file the record describes."""
    lm_dir = Path(lm_dir)
    if not lm_dir.is_dir():
        raise LmError(f"{lm_dir}: no such LM directory (it holds lm.arpa and lm.json); {_rebuild(lm_dir)}")
    record = fsutil.read_json(lm_dir / lmstage.RECORD)
    if not isinstance(record, dict) or "arpa" not in record:
        raise LmError(
            f"{lm_dir / lmstage.RECORD}: missing or not an LM record (an unfinished build?); {_rebuild(lm_dir)}"
        )
    arpa = lm_dir / record["arpa"]["file"]
    if not arpa.is_file():
        raise LmError(f"{arpa}: missing (lm.json names it); {_rebuild(lm_dir)}")
    if fsutil.file_sha256(arpa) != record["arpa"]["sha256"]:
        raise LmError(
            f"{arpa}: not the file lm.json records (sha256 differs: truncated, or changed after it was built); "
            f"{_rebuild(lm_dir)}"
        )
    return record


def settings_of(lm_dir: str | Path, **overrides):
    """The decoding settings of an LM directory: decoding.json's (the tuned ones) or the defaults,
    then `overrides` that are not None; an LmDecoding, or for a lang dir (`is_graph`) models/asr/hlg.py's
    HlgDecoding."""
    if is_graph(lm_dir):
        from models.asr.hlg import HlgDecoding as kind
    else:
        kind = LmDecoding
    return decoder_dir.chosen_settings(lm_dir, kind, **overrides)


def is_graph(lm_dir: str | Path) -> bool:
    """Whether `lm_dir` is a lang dir (pipeline/lang.py: its record lang.json beside HLG.fst), which
    decodes a phone model, rather than an n-gram's directory (lm.json), which decodes a char model.
    Its record alone says so: a lang dir whose HLG.fst is missing is still one, and opening it says
    what is missing."""
    return (Path(lm_dir) / GRAPH_RECORD).is_file()


def labels(vocabulary: Sequence[str]) -> list[str]:
    """The decoder's labels for the model's ids: "" for the blank, a mark for `<unk>`, else the character."""
    return ["" if v == BLANK else UNK_LABEL if v == UNK else v for v in vocabulary]


class LmDecoder:
    """Beam search with the n-gram of `lm_dir` over the model's output of `vocabulary`."""

    def __init__(self, lm_dir: str | Path, vocabulary: Sequence[str], settings: LmDecoding | None = None):
        import kenlm
        from pyctcdecode import Alphabet, BeamSearchDecoderCTC, LanguageModel

        self.lm_dir = Path(lm_dir)
        self.record = record_of(self.lm_dir)
        self.settings = settings or settings_of(self.lm_dir)
        arpa = self.arpa = self.lm_dir / self.record["arpa"]["file"]
        words = unigrams(arpa)
        self.words, self._trigrams = set(words), None  # the 3-grams are read on the first `coverage`
        alphabet = {ch for ch in vocabulary if len(ch) == 1}
        outside = sorted({ch for w in words for ch in w} - alphabet)
        if outside:
            raise LmError(
                f"{arpa}: its words hold characters outside the acoustic model's alphabet ({''.join(outside)!r}), "
                "which it can never spell: build the LM with the model's vocabulary "
                f"(`python -m pipeline.lm ... --vocabulary-from MODEL`); {_rebuild(self.lm_dir)}"
            )
        try:
            model = kenlm.Model(str(arpa))
        except (OSError, RuntimeError) as err:  # kenlm raises OSError for a file it cannot parse
            raise LmError(f"{arpa}: KenLM cannot read it ({err}); {_rebuild(self.lm_dir)}") from err
        s = self.settings
        language_model = LanguageModel(model, words, alpha=s.weight, beta=s.word_bonus, unk_score_offset=s.unk_offset)
        self._decoder = BeamSearchDecoderCTC(Alphabet.build_alphabet(labels(vocabulary)), language_model)

    def coverage(self, references: Sequence[str]) -> dict:
        """`coverage` of this decoder's LM, from the n-grams it has read already."""
        if self._trigrams is None and self.record["order"] >= 3:
            self._trigrams = ngrams(self.arpa, 3)
        return decoder_dir.coverage_of(self.words, self._trigrams, references)

    def use(self, settings: LmDecoding) -> LmDecoder:
        """Decodes with `settings` from now on (the n-gram stays loaded: a grid loads it once)."""
        self.settings = settings
        self._decoder.reset_params(
            alpha=settings.weight, beta=settings.word_bonus, unk_score_offset=settings.unk_offset
        )
        return self

    def decode(self, log_probs: Iterable[np.ndarray]) -> list[str]:
        """The best transcript of each utterance's log-probabilities float32 [T', V] (its real frames)."""
        out = []
        for lp in log_probs:
            text = self._decoder.decode(lp, beam_width=self.settings.beam_width)
            out.append(" ".join(text.replace(UNK_LABEL, "").split()))
        return out

    def describe(self) -> dict:
        """What a figure decoded with this LM names: its text, order and settings."""
        text = self.record["text"]
        return {
            "lm_order": self.record["order"],
            "lm_text_sha256": text["sha256"],
            "lm_vocabulary_size": text["vocabulary_size"],
            **{f"lm_{k}": v for k, v in dataclasses.asdict(self.settings).items()},
        }


def unigrams(arpa: Path) -> list[str]:
    """The words of an ARPA file's 1-gram section, without <s>, </s> and <unk>."""
    return sorted(ngrams(arpa, 1))


def ngrams(arpa: Path, n: int) -> set[str]:
    """The n-grams of an ARPA file's n-gram section, as space-joined words (none: an LM of a lower
    order). LmError naming the file when it ends inside the section (truncated)."""
    found, inside, ended = set(), False, False
    with Path(arpa).open(encoding="utf-8", errors="replace") as f:
        for line in f:
            line = line.rstrip("\n")
            if line.startswith("\\"):
                if inside:
                    ended = True
                    break
                inside = line == f"\\{n}-grams:"
                continue
            if inside and line:
                words = line.split("\t")[1]
                if n == 1 and words in ("<s>", "</s>", "<unk>"):
                    continue
                found.add(words)
    if inside and not ended:
        raise LmError(f"{arpa}: ends inside its {n}-gram section (truncated); {_rebuild(Path(arpa).parent)}")
    return found


def coverage(lm_dir: str | Path, references: Sequence[str]) -> dict:
    """How well the LM's text knows a split's sentences, beside every figure decoded with it: the
    share of the references' words the LM has never seen (`lm_oov_rate`) and the share of their word
    3-grams (within a sentence) that its text had (`lm_3gram_hit`; None for an LM of order < 3)."""
    record = record_of(lm_dir)
    arpa = Path(lm_dir) / record["arpa"]["file"]
    return decoder_dir.coverage_of(set(unigrams(arpa)), ngrams(arpa, 3) if record["order"] >= 3 else None, references)


def attach(lm_dir: str | Path, model_dir: str | Path) -> Path:
    """Copies the LM of `lm_dir` (an n-gram's ARPA, record and chosen settings; or a lang dir's
    HLG.fst, tokens.txt, words.txt, lang.json and chosen settings, not its L and G) into
    `model_dir`/lm, replacing any LM attached before; returns that directory."""
    import shutil

    lm_dir = Path(lm_dir)
    if is_graph(lm_dir):
        from models.asr import hlg

        hlg.graph_record(lm_dir)  # a graph cut short or another build's is not attached
        names = (*GRAPH_FILES, DECODING)
    else:
        names = (record_of(lm_dir)["arpa"]["file"], lmstage.RECORD, DECODING)
    if not (lm_dir / DECODING).is_file():
        raise LmError(f"{lm_dir / DECODING}: missing: choose the LM's settings first (python -m models.tune_lm)")
    target = Path(model_dir) / ATTACHED
    staging = Path(model_dir) / f".{ATTACHED}.partial"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    for name in names:
        shutil.copy2(lm_dir / name, staging / name)
    shutil.rmtree(target, ignore_errors=True)
    staging.rename(target)
    return target


def attached(model_dir: str | Path) -> Path | None:
    """The LM (an n-gram's directory or a lang dir) attached to a model directory, or None."""
    target = Path(model_dir) / ATTACHED
    return target if (target / lmstage.RECORD).is_file() or is_graph(target) else None


def targets_of(data: dict) -> str:
    """What a model's output layer spells, from its data record: "chars" (absent: a model of before
    phone targets) or "phones"."""
    targets = data.get("targets", "chars")
    if targets not in TARGETS:
        raise ValueError(f"data.json: targets {targets!r}, expected one of {', '.join(TARGETS)}")
    return targets


def choose(data: dict, lm_dir: str | Path | None = None, no_lm: bool = False):
    """The decoder a command uses beside the model of `data` (its loaded record): `lm_dir` when given,
    else the model's attached one, else none; `no_lm`: none (and an `lm_dir` beside it is an error).
    A char model decodes with an n-gram (`LmDecoder`); a phone model through a lang dir's graph
    (models/asr/hlg.py `GraphDecoder`), always: it spells words only that way, so without a graph,
    or with `no_lm`, it is an error naming the fix. LmError when the LM's kind is not the model's."""
    phones = targets_of(data) == "phones"
    model = data.get(MODEL_KEY, "the model")
    if no_lm:
        if lm_dir:
            raise ValueError("both an LM directory and no LM were asked for: give one of them")
        if phones:
            raise LmError(
                f"{model} is a phone model: it spells words only through its decoding graph, never without it"
            )
        return None
    chosen = lm_dir or data.get(DATA_KEY)
    if not chosen:
        if phones:
            raise LmError(
                f"{model} is a phone model with no decoding graph: it spells words only through one. Attach it "
                f"with `python -m models.tune_lm --model {model} --shards SHARDS --lm LANG_DIR --attach` "
                "(python -m pipeline.lang builds LANG_DIR)"
            )
        return None
    check_kind(data, chosen)
    if phones:
        from models.asr.hlg import GraphDecoder

        return GraphDecoder(chosen, data["outputs"])
    return LmDecoder(chosen, data["vocabulary"])


def check_kind(data: dict, lm_dir: str | Path) -> None:
    """LmError naming both when `lm_dir` is not the kind of LM the model of `data` decodes with: a
    lang dir (`is_graph`) for a phone model, an n-gram's directory for a char model."""
    phones, graph = targets_of(data) == "phones", is_graph(lm_dir)
    if phones == graph:
        return
    model = data.get(MODEL_KEY, "the model")
    if graph:
        raise LmError(
            f"{lm_dir} is a decoding graph (a lang dir: HLG.fst), for a phone model; {model} is a char model, "
            "which decodes with a word n-gram (python -m pipeline.lm builds one): give that directory instead"
        )
    raise LmError(
        f"{lm_dir} is a word n-gram's directory, for a char model; {model} is a phone model, which spells "
        "words only through a decoding graph: give a lang dir (python -m pipeline.lang --arpa ... builds one)"
    )


def write_decoding(lm_dir: str | Path, settings: LmDecoding, chosen_on: dict) -> None:
    """Records the settings a grid chose (`chosen_on`: the split, the model, the grid's figures)."""
    fsutil.atomic_write_json(
        Path(lm_dir) / DECODING, {"settings": dataclasses.asdict(settings), "chosen_on": chosen_on}
    )


def log_probs_of(logits, lengths) -> list[np.ndarray]:
    """Per utterance, the log-softmax of the model's logits [B, T', V] over its real frames."""
    import tensorflow as tf

    lp = tf.nn.log_softmax(logits).numpy()
    return [lp[i, : int(n)] for i, n in enumerate(np.asarray(lengths))]


def tune(
    references: Sequence[str],
    log_probs: Sequence[np.ndarray],
    lm_dir: str | Path,
    vocabulary: Sequence[str],
    weights: Sequence[float],
    word_bonuses: Sequence[float],
    beam_width: int,
    progress: bool = True,
) -> tuple[LmDecoding, list[dict]]:
    """The grid's best settings by WER on a split (its `references` and the model's `log_probs`; CER
    breaks a tie), and every point's figures. The model's forward pass is done once by the caller."""
    from common.progress import progress as progress_bar
    from models.asr.scoring import error_rates

    grid = []
    points = [(w, b) for w in weights for b in word_bonuses]
    decoder = LmDecoder(lm_dir, vocabulary, LmDecoding(beam_width=beam_width))
    for weight, bonus in progress_bar(points, desc="LM grid", unit="point", disable=not progress):
        settings = LmDecoding(weight=weight, word_bonus=bonus, beam_width=beam_width)
        rates = error_rates(list(references), decoder.use(settings).decode(log_probs))
        grid.append({"weight": weight, "word_bonus": bonus, "wer": rates["wer"], "cer": rates["cer"]})
    best = min(grid, key=lambda g: (g["wer"], g["cer"]))
    return LmDecoding(weight=best["weight"], word_bonus=best["word_bonus"], beam_width=beam_width), grid
