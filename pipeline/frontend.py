"""The acoustic front end that runs inside the training step (on the accelerator), not in the input
pipeline: CMVN, SpecAugment, vocal tract length perturbation, cepstra and frame stacking.

The input pipeline hands over the stored features (8-bit codes or float16 log-mel, padded) with
each utterance's affine map to normalized features beside them (dequantization merged with speaker
or split-wide CMVN), and with `cmvn="utterance"` a flag that asks for each utterance's own
statistics instead; the step casts, normalizes, augments and stacks. That keeps the CPU's work per
frame to reading and decoding, shrinks what crosses to a GPU, and puts training, evaluation and
serving on one normalization function. What it reads is made by one function too, `acoustic_batch`:
the input pipeline calls it on the parsed shards (pipeline/dataset.py `asr_assembler`), a served or
transcribing acoustic model on float log-mel computed from audio, with the identity as its
dequantization (models/asr/inference.py).
"""

from __future__ import annotations

import numpy as np
import scipy.fft
import tensorflow as tf


def acoustic_batch(feats, lengths, dequant, stats, cmvn: str) -> dict:
    """The acoustic model's input, as every path builds it: `feats` [N, T, D] as stored (uint8 codes
    or float log-mel, padded), `feat_lengths` [N], `feat_scale` and `feat_offset` float32 [N, D] (the
    dequantization `dequant` = (scale, offset) [N, D], stored -> log-mel, merged with the CMVN
    `stats` = (mean, inverse std) [N, D]: normalized = feats * feat_scale + feat_offset) and
    `utterance_cmvn` bool [N] (cmvn "utterance": `normalize` then uses each utterance's own
    statistics; `stats` should then be the identity). tf tensors inside the input pipeline's graph,
    numpy arrays from audio (serving, transcription); `normalize` takes either."""
    scale, offset = dequant
    mean, inv_std = stats
    flag = cmvn == "utterance"
    if isinstance(lengths, np.ndarray):
        utterance_cmvn = np.full(lengths.shape, flag)
    else:
        utterance_cmvn = tf.fill(tf.shape(lengths), flag)
    return {
        "feats": feats,
        "feat_lengths": lengths,
        "feat_scale": scale * inv_std,
        "feat_offset": (offset - mean) * inv_std,
        "utterance_cmvn": utterance_cmvn,  # [N] bool
    }


def normalize(feats, scale, offset, lengths, utterance_cmvn=None):
    """The stored features of a padded batch, normalized: `feats * scale + offset` per utterance and
    dimension (dequantization and speaker CMVN in one), then, for the utterances `utterance_cmvn`
    flags, mean and variance normalization by the statistics of their own real frames; padding set
    to 0.

    feats [B, T, D] (uint8 codes or float), scale and offset float32 [B, D], lengths [B],
    utterance_cmvn bool [B] or None (none flagged) -> float32 [B, T, D].
    """
    mask = tf.sequence_mask(lengths, tf.shape(feats)[1], tf.float32)[..., None]  # [B, T, 1]
    x = (tf.cast(feats, tf.float32) * scale[:, None, :] + offset[:, None, :]) * mask
    if utterance_cmvn is None:
        return x
    return tf.where(utterance_cmvn[:, None, None], utterance_normalize(x, lengths), x)


def utterance_normalize(x, lengths):
    """Each utterance of a padded float batch [B, T, D] minus the mean and over the standard deviation
    (floored at 1e-4) of its own real frames, per dimension; padding 0. Two passes, so frames far
    from zero (log-mel sits around 10 to 20) keep their precision. What `cmvn="utterance"` trains
    with: the statistics a served model has of a speaker it never heard, one request."""
    mask = tf.sequence_mask(lengths, tf.shape(x)[1], tf.float32)[..., None]  # [B, T, 1]
    count = tf.maximum(tf.cast(lengths, tf.float32), 1.0)[:, None, None]  # [B, 1, 1]
    mean = tf.reduce_sum(x * mask, axis=1, keepdims=True) / count  # [B, 1, D]
    centered = (x - mean) * mask
    var = tf.reduce_sum(centered * centered, axis=1, keepdims=True) / count  # [B, 1, D]
    return centered * tf.math.rsqrt(tf.maximum(var, 1e-8))


def cepstral_basis(dim: int, count: int) -> np.ndarray:
    """float32 [dim, count]: the first `count` basis vectors of the orthonormal DCT-II over `dim` bins,
    so `feats @ basis` are each frame's first cepstral coefficients (MFCCs of log-mel features)."""
    return scipy.fft.dct(np.eye(dim), norm="ortho", axis=0)[:count].T.astype(np.float32)


def stack_and_subsample(feats, lengths, stack: int, subsample: int):
    """[B, T, D] -> [B, ceil(T/subsample), D*stack]: frame i holds frames i..i+stack-1 (zero-padded
    at the end), then every `subsample`-th frame is kept. Lengths follow. Used by the input pipeline
    and by the acoustic model's first layer, so they agree exactly."""
    if stack > 1:
        padded = tf.pad(feats, [[0, 0], [0, stack - 1], [0, 0]])  # [B, T+stack-1, D]
        time = tf.shape(feats)[1]
        feats = tf.concat([padded[:, i : i + time] for i in range(stack)], axis=-1)  # [B, T, D*stack]
    if subsample > 1:
        feats = feats[:, ::subsample]  # [B, ceil(T/subsample), D*stack]
        lengths = (lengths + subsample - 1) // subsample
    return feats, lengths


def spec_augment(feats, lengths, cfg, seed):
    """Masks `freq_masks` bands of bins and `time_masks` runs of frames of every utterance of a
    normalized, padded batch [B, T, D] with zeros (the mean after CMVN), each utterance its own.
    `seed`: a stateless seed [2], so the same batch of the same epoch is masked the same way."""
    batch, frames, dim = tf.shape(feats)[0], tf.shape(feats)[1], tf.shape(feats)[2]
    seeds = tf.random.experimental.stateless_split(seed, 2 * (cfg.freq_masks + cfg.time_masks))

    def draw(i, upper):  # one integer per utterance in [0, upper) ([B] upper bounds)
        u = tf.random.stateless_uniform([batch], seeds[i], 0.0, 1.0)
        return tf.cast(u * tf.cast(upper, tf.float32), tf.int32)

    keep_bins = tf.ones([batch, dim], tf.bool)
    for i in range(cfg.freq_masks):
        width = draw(2 * i, tf.fill([batch], cfg.freq_mask_width + 1))
        start = draw(2 * i + 1, tf.maximum(dim - width, 1))
        bins = tf.range(dim)[None, :]  # [1, D]
        keep_bins &= ~((bins >= start[:, None]) & (bins < (start + width)[:, None]))
    longest = tf.maximum(1, tf.cast(cfg.time_mask_fraction * tf.cast(lengths, tf.float32), tf.int32))  # [B]
    keep_frames = tf.ones([batch, frames], tf.bool)
    for i in range(cfg.time_masks):
        j = 2 * (cfg.freq_masks + i)
        width = draw(j, longest + 1)
        start = draw(j + 1, tf.maximum(lengths - width, 1))
        steps = tf.range(frames)[None, :]  # [1, T]
        keep_frames &= ~((steps >= start[:, None]) & (steps < (start + width)[:, None]))
    keep = keep_frames[:, :, None] & keep_bins[:, None, :]  # [B, T, D]
    return tf.where(keep, feats, tf.zeros_like(feats))


# The band the mel bins span when VTLP places them: Kaldi's fbank defaults at 16 kHz (20 Hz to the
# Nyquist frequency). The feature stage records its own band, but the perturbation only needs each
# bin's frequency roughly: a warp drawn at random is not made wrong by a band a little off.
VTLP_BAND_HZ = (20.0, 8000.0)


def vtlp(feats, warp_range, seed):
    """Vocal tract length perturbation of a padded batch of log-mel features [B, T, D]: every
    utterance's spectrum stretched along frequency by its own factor `alpha`, drawn uniformly from
    `warp_range` with the stateless `seed` [2] (what sounded at f Hz sounds at alpha * f). Bin i
    takes the value at frequency f_i / alpha, interpolated linearly between the two nearest bins
    (held at the edges). Padding frames stay as they are (each frame is remapped on its own)."""
    batch, dim = tf.shape(feats)[0], tf.shape(feats)[2]  # dynamic: the step is traced with unknown shapes
    alpha = tf.random.stateless_uniform([batch], seed, warp_range[0], warp_range[1])  # [B]
    low, high = (1127.0 * tf.math.log1p(f / 700.0) for f in VTLP_BAND_HZ)
    bins = tf.cast(dim, tf.float32)
    centres = tf.linspace(low, high, dim + 2)[1:-1]  # [D] mel, the triangles' centres
    source_hz = 700.0 * tf.math.expm1(centres / 1127.0)[None, :] / alpha[:, None]  # [B, D]
    source = (1127.0 * tf.math.log1p(source_hz / 700.0) - low) / (high - low) * (bins + 1.0) - 1.0
    source = tf.clip_by_value(source, 0.0, bins - 1.0)  # [B, D] fractional bin of each output bin
    below = tf.floor(source)
    weight = tf.cast(source - below, feats.dtype)[:, None, :]  # [B, 1, D]
    below = tf.cast(below, tf.int32)
    above = tf.minimum(below + 1, dim - 1)
    take = lambda index: tf.gather(feats, index, axis=2, batch_dims=1)  # noqa: E731 [B, T, D]
    return take(below) * (1.0 - weight) + take(above) * weight
