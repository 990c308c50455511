"""Transcripts of float log-mels computed from audio: what the served acoustic model
(models/asr/server.py) and batch transcription (models/asr/transcribe.py) run on their features.

The batch is the one the training input pipeline assembles from float storage: the same function
builds it (pipeline/frontend.py `acoustic_batch`), here with the identity as its dequantization, and
the training step's own `AsrTask.features` normalizes it. Utterances go in batches of similar
lengths, about FRAMES_PER_BATCH padded frames each.
"""

from __future__ import annotations

import numpy as np

FRAMES_PER_BATCH = 40000  # padded input frames per batch (the evaluation's batch size)


def training_stats(cmvn: str, data: dict) -> tuple[np.ndarray, np.ndarray]:
    """(mean, inverse std) float32 [D] of the split-wide CMVN a model trained with: for cmvn "global"
    the training split's statistics (its `data.json`), otherwise the identity (zeros, ones)."""
    dim = data["feature_dim"]
    if cmvn != "global":
        return np.zeros(dim, np.float32), np.ones(dim, np.float32)
    inv_std = (1.0 / np.asarray(data["mel_std"], np.float64)).astype(np.float32)
    return np.asarray(data["mel_mean"], np.float32), inv_std


def served_cmvn(cmvn: str) -> str:
    """The normalization a served model applies for the one it trained with: per-speaker statistics
    do not exist for a speaker heard in one request, so "speaker" is served per utterance."""
    return "utterance" if cmvn == "speaker" else cmvn


def features_batch(feats: list[np.ndarray], stats: tuple, cmvn: str) -> dict:
    """Float log-mels [T_i, D] -> the batch the training input pipeline would assemble from float
    storage (`acoustic_batch`'s keys): `feats` [B, T, D] zero-padded, `feat_lengths` int32 [B], the
    affine map of the CMVN `stats` (mean, inverse std), each float32 [D] (one for all) or [B, D], and
    `utterance_cmvn` [B] (cmvn "utterance")."""
    from pipeline import frontend

    dim = feats[0].shape[1]
    lengths = np.asarray([len(f) for f in feats], np.int32)
    padded = np.zeros([len(feats), lengths.max(), dim], np.float32)  # [B, T, D]
    for i, f in enumerate(feats):
        padded[i, : len(f)] = f
    identity = (np.ones([len(feats), dim], np.float32), np.zeros([len(feats), dim], np.float32))  # float storage
    return frontend.acoustic_batch(padded, lengths, identity, stats, cmvn)


def served_batch(feats: list[np.ndarray], cmvn: str, data: dict) -> dict:
    """The batch a served model transcribes: `features_batch` of float log-mels [T_i, D] with the
    normalization of a model that trained with `cmvn` (`served_cmvn`; its statistics from `data`,
    the model's data.json)."""
    served = served_cmvn(cmvn)
    return features_batch(feats, training_stats(served, data), served)


def length_batches(lengths: list[int], frames_per_batch: int = FRAMES_PER_BATCH) -> list[list[int]]:
    """Indices of `lengths` from the shortest, in batches of at most `frames_per_batch` padded frames
    (an utterance longer than that is a batch of its own)."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    batches, start = [], 0
    while start < len(order):
        end = start + 1
        while end < len(order) and (end - start + 1) * lengths[order[end]] <= frames_per_batch:
            end += 1
        batches.append(order[start:end])
        start = end
    return batches


def transcribe_features(
    model, config, data: dict, feats: list[np.ndarray], beam_width: int = 0, lm_decoder=None
) -> list[str]:
    """What the served model answers: transcripts of float log-mels [T_i, D] (in order), in batches
    `served_batch` builds; greedy, or CTC beam search of `beam_width`, or with `lm_decoder`
    (models/asr/lm.py) beam search with its word LM, or for a phone model (which needs it) the words
    through its graph."""
    from models.asr import lm
    from models.asr import network as asr
    from models.asr.task import AsrTask

    if lm_decoder is None and lm.targets_of(data) == "phones":
        raise ValueError("a phone model spells words only through its decoding graph: give its decoder (lm.choose)")

    out = [""] * len(feats)
    for chunk in length_batches([len(f) for f in feats]):
        batch = served_batch([feats[i] for i in chunk], config.input.cmvn, data)
        if lm_decoder is not None:
            logits, lengths = asr.forward(model, AsrTask.features(batch), batch["feat_lengths"])
            hyps = lm_decoder.decode(lm.log_probs_of(logits, lengths))
        else:
            hyps = asr.transcribe(
                model, AsrTask.features(batch), batch["feat_lengths"], data["vocabulary"], beam_width=beam_width
            )
        for i, hyp in zip(chunk, hyps):
            out[i] = hyp
    return out
