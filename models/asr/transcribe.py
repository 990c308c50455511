"""Batch transcription: a Kaldi data directory or audio files -> Kaldi-style `text` and a CTM.

    python -m models.transcribe --model models:/speechflow-asr@champion --data-dir data/test --out decode/test
    python -m models.transcribe --model runs/asr a.wav b.flac --out decode/mine [--beam-width 8] [--lm runs/lm]

Audio is read as the feature stage reads it (pipeline/features.py): `wav.scp` files and the
decoder commands of Kaldi recipes (other commands only with `--allow-pipes`), `segments`, the
channel `reco2file_and_channel` names, resampling to the model's rate; then the model's own fbank
settings and the normalization it trained with: per-speaker CMVN (`input.cmvn: speaker`) from the
statistics of each speaker's utterances here (`utt2spk`; an audio file is its own speaker), as the
feature stage computes them. Utterances are decoded in batches of similar length.

Written to `--out`: `text` (`UTT hypothesis`, as Kaldi's decode step writes it), `ctm` (`UTT 1
START DURATION WORD`, seconds from the utterance's start), and `rejected.tsv` (utterances whose audio
could not be used, with the reason; they are also counted on stderr). A char model's CTM times come
from the CTC alignment of the hypothesis, so a word starts where its first character is emitted. A
phone model answers words through its decoding graph always (models/asr/lm.py `choose`; no
`--no-lm`, no `--beam-width`), and its CTM times come from the graph's best path (models/asr/hlg.py
`HlgDecoder.align`): a word starts at the frame where the path emits it, which is late by the phones
it shares with other words at its start, and ends after its last phone, the silence between words
left out.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import numpy as np

from common import fsutil
from common.progress import progress as progress_bar
from models import trained_model
from models.asr import alignment, inference, lm
from pipeline import features, kaldi, text


@dataclasses.dataclass(frozen=True)
class TranscribeConfig:
    beam_width: int = 0  # 0: greedy CTC decoding; > 0: CTC beam search of this width (a char model only)
    lm: str = ""  # a word LM's directory (pipeline/lm.py), or a phone model's lang dir; empty: the attached one
    no_lm: bool = False  # decode without an LM, even the model's attached one (a char model only)
    allow_pipes: bool = False  # run `cmd |` entries of wav.scp that are not a recognized decoder call
    progress: bool = True  # a progress bar on stderr


def audio_entries(data_dir: Path | None, files: list[Path], allow_pipes: bool):
    """(entries, rejections) of a data directory (pipeline/kaldi.py's checks, transcripts not
    needed), or of audio files: each its own utterance and speaker, named by its file name's stem."""
    if data_dir is not None:
        return kaldi.scan_data_dir(data_dir, allow_pipes, need_text=False, source="audio")
    entries, seen = [], {}
    for path in files:
        utt = path.stem
        if utt in seen:
            raise ValueError(f"{seen[utt]} and {path} would both be utterance {utt!r}: rename one")
        seen[utt] = path
        entries.append(kaldi.Entry(utt, utt, None, None, str(path), None))
    return entries, []


def compute_features(entries, cfg, progress: bool):
    """{utt: fbank float32 [T, D]} and rejections, recording by recording as the feature stage does."""
    feats, rejections = {}, []
    groups = features.group_by_recording(entries)
    for spec, group in progress_bar(groups, desc="features", unit="rec", disable=not progress):
        for utt, matrix, rejection in features.featurize_recording((spec, group, cfg)):
            if rejection is not None:
                rejections.append(rejection)
            else:
                feats[utt] = matrix
    return feats, rejections


def normalization(feats: dict, speakers: dict, cmvn: str, data: dict) -> dict:
    """{utt: (mean [D], inverse std [D])}, float32: the CMVN statistics the model trained with
    (per speaker: of each speaker's utterances here; per utterance: the identity, as the step
    normalizes each utterance itself)."""
    if cmvn != "speaker":
        stats = inference.training_stats(cmvn, data)
        return {utt: stats for utt in feats}
    dim = next(iter(feats.values())).shape[1]
    accumulated = features.CmvnAccumulator()
    for utt, matrix in feats.items():
        accumulated.add(speakers[utt], matrix)
    out = {}
    for utt in feats:
        s = accumulated.stats[speakers[utt]]
        mean = s[0, :dim] / s[0, dim]
        # in float32 from here, as the input pipeline has them (pipeline/dataset.py cmvn_tables)
        inv_std = (1.0 / np.sqrt(np.maximum(s[1, :dim] / s[0, dim] - mean * mean, 1e-8))).astype(np.float32)
        out[utt] = (mean.astype(np.float32), inv_std)
    return out


def decode_batch(model, config, data, utts, feats, norms, beam_width, frame_shift_ms, lm_decoder=None):
    """[(utt, hypothesis, [(word, start s, duration s)])] of one batch; with `lm_decoder`
    (models/asr/lm.py) the hypotheses are its beam search's with the word LM, or for a phone model
    the words through its graph (`graph_words`)."""
    import tensorflow as tf

    from models.asr import network as asr
    from models.asr.task import AsrTask

    stats = tuple(np.stack([norms[u][k] for u in utts]) for k in (0, 1))  # (mean, inverse std) [B, D]
    batch = inference.features_batch([feats[u] for u in utts], stats, config.input.cmvn)
    lengths = batch["feat_lengths"]
    logits, out_lengths = model(AsrTask.features(batch), lengths)  # [B, T', V], [B]
    log_probs = tf.nn.log_softmax(logits).numpy()  # [B, T', V]
    real = [log_probs[i, : out_lengths[i]] for i in range(len(utts))]  # each [T'_i, V]
    frame_seconds = frame_shift_ms / 1000.0 * config.settings.subsample  # one output frame per `subsample` inputs
    if lm.targets_of(data) == "phones":
        return graph_words(utts, lm_decoder.align(real), frame_seconds)
    if lm_decoder is not None:
        hypotheses = lm_decoder.decode(real)
        ids = [text.encode(h, data["vocabulary"]) for h in hypotheses]  # the path to align the words on
    elif beam_width:
        ids = asr.beam_decode(logits, out_lengths, beam_width)
    else:
        ids = asr.greedy_decode(logits.numpy(), out_lengths.numpy())
    out = []
    for i, (u, labels) in enumerate(zip(utts, ids)):
        hypothesis = text.decode(labels, data["vocabulary"])
        path = alignment.ctc_forced_alignment(log_probs[i, : out_lengths[i]], labels)  # label index per frame
        # characters are the labels decode keeps (not the unknown-character id): their index per frame
        kept = np.cumsum([label > 1 for label in labels]) - 1
        char_path = np.where(path >= 0, np.where(np.asarray(labels)[path] > 1, kept[path], -1), -1)
        out.append((u, hypothesis, alignment.word_times(hypothesis, char_path, frame_seconds)))
    return out


def graph_words(utts: list[str], aligned: list[list[tuple[str, int, int]]], frame_seconds: float) -> list[tuple]:
    """`decode_batch`'s rows from a graph's words with their output frames (word, first, end exclusive)
    per utterance, `frame_seconds` an output frame."""
    return [
        (u, " ".join(w for w, _, _ in words), [(w, a * frame_seconds, (b - a) * frame_seconds) for w, a, b in words])
        for u, words in zip(utts, aligned)
    ]


def transcribe(model_spec: str, out_dir: Path, cfg: TranscribeConfig, data_dir: Path | None = None, files=()) -> dict:
    """Transcribes a data directory or audio files into `out_dir` (see the module docstring).
    Returns a summary: utterances transcribed and rejected, the files written."""
    model, config, data = trained_model.open_model(model_spec)
    if config.model != "asr":
        raise ValueError(f"{model_spec} is a {config.model} model; transcription needs an acoustic model")
    feature_cfg = dataclasses.replace(trained_model.feature_config(data), allow_pipes=cfg.allow_pipes)
    if lm.targets_of(data) == "phones" and cfg.beam_width:
        raise ValueError(
            f"{model_spec} is a phone model: it spells words only through its decoding graph, so --beam-width "
            "(a beam search of its phones) does not apply: leave it out"
        )
    # A broken LM fails here, before any audio is read: never a silent fallback to decoding without it.
    decoder = lm.choose(data, cfg.lm, cfg.no_lm)
    entries, rejections = audio_entries(data_dir, [Path(f) for f in files], cfg.allow_pipes)
    feats, unusable = compute_features(entries, feature_cfg, cfg.progress)
    rejections += unusable
    results = []
    if feats:
        speakers = {e.utt_id: e.speaker for e in entries}
        norms = normalization(feats, speakers, config.input.cmvn, data)
        ids = list(feats)
        batches = [[ids[i] for i in b] for b in inference.length_batches([len(feats[u]) for u in ids])]
        bar = progress_bar(total=len(ids), desc="transcribe", unit="utt", disable=not cfg.progress)
        for utts in batches:
            results += decode_batch(
                model, config, data, utts, feats, norms, cfg.beam_width, feature_cfg.frame_shift_ms, decoder
            )
            bar.update(len(utts))
        bar.close()
    results.sort()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    fsutil.atomic_write_text(out_dir / "text", "".join(f"{u} {h}\n" for u, h, _ in results))
    ctm = [f"{u} 1 {start:.2f} {duration:.2f} {word}\n" for u, _, words in results for word, start, duration in words]
    fsutil.atomic_write_text(out_dir / "ctm", "".join(ctm))
    kaldi.write_rejections(out_dir / "rejected.tsv", [("input", r) for r in rejections])
    if rejections:
        print(
            f"{len(rejections)} utterances not transcribed ({kaldi.summarize(rejections)}):"
            f" see {out_dir / 'rejected.tsv'}",
            file=sys.stderr,
        )
    return {"transcribed": len(results), "rejected": len(rejections), "text": str(out_dir / "text")}
