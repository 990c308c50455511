"""Where each character is spoken: the monotonic alignment search the durations model trains with,
the guided-attention loss, and the metrics that score an alignment (attention's or the search's).

An alignment is [B, S, N]: for each decoder step (S, `reduction_factor` frames each) a weight per
character (N); the attention decoder's is a softmax, the search's one-hot.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

F32 = tf.float32


def beta_binomial_cost(step_lengths: np.ndarray, token_lengths: np.ndarray, steps: int, chars: int) -> np.ndarray:
    """-log of the static alignment prior [B, steps, chars] (Badlani et al. 2021; NeMo's
    `beta_binomial_prior_distribution` with scaling 1): at step s of S an utterance's character
    k of N is drawn from BetaBinomial(N - 1, s + 1, S - s), a band around the diagonal that widens in the
    middle. 0 past each utterance's steps and characters."""
    import scipy.stats

    out = np.zeros((len(step_lengths), steps, chars))
    for i, (s_len, n_len) in enumerate(zip(np.asarray(step_lengths), np.asarray(token_lengths))):
        s_len, n_len = int(s_len), int(n_len)
        a = np.arange(1, s_len + 1, dtype=np.float64)[:, None]  # [S, 1]
        logpmf = scipy.stats.betabinom.logpmf(np.arange(n_len)[None, :], n_len - 1, a, s_len + 1 - a)  # [S, N]
        out[i, :s_len, :n_len] = -np.maximum(logpmf, -1e4)
    return out


def monotonic_alignment(
    cost: np.ndarray, step_lengths: np.ndarray, token_lengths: np.ndarray, prior_weight=0.0, skips=True
) -> np.ndarray:
    """Monotonic alignment search: for each utterance, the path of least total `cost` [B, S, N]
    through (decoder step, character) that starts at character 0, ends at the last character, and
    from one step to the next stays or moves on by one or two characters (a silent letter or a space
    may take no step of its own). Returns int32 [B, S]: each step's character (the last one past
    the utterance's steps). Dynamic programming over steps, every utterance at once: a Python loop
    of S numpy operations (Glow-TTS ships it in Cython; a few milliseconds per batch here).
    `prior_weight` > 0 adds that many times `beta_binomial_cost` to the cost. `skips=False`: every
    character gets at least one step (Glow-TTS' search), except in an utterance with more characters
    than steps, which may still skip."""
    cost = np.asarray(cost, np.float64)
    b, s_max, n_max = cost.shape
    if float(prior_weight) > 0:
        cost = cost + float(prior_weight) * beta_binomial_cost(step_lengths, token_lengths, s_max, n_max)
    # [B, 1]: whether a move of two characters is allowed
    skipping = np.ones((b, 1), bool) if bool(skips) else (np.asarray(token_lengths) > np.asarray(step_lengths))[:, None]
    best = np.full((b, n_max), np.inf)
    best[:, 0] = cost[:, 0, 0]
    moves = np.zeros((b, s_max, n_max), np.int8)  # 0, 1 or 2 characters moved to reach (s, n)
    padded = np.full((b, n_max + 2), np.inf)
    for s in range(1, s_max):
        padded[:, 2:] = best
        two = np.where(skipping, padded[:, :-2], np.inf)
        options = np.stack([padded[:, 2:], padded[:, 1:-1], two])  # stay, +1, +2: [3, B, N]
        move = options.argmin(0)
        step = np.take_along_axis(options, move[None], 0)[0] + cost[:, s]
        live = (s < step_lengths)[:, None]
        best = np.where(live, step, best)
        moves[:, s] = np.where(live, move, 0)
    path = np.zeros((b, s_max), np.int32)
    for i in range(b):
        n = int(token_lengths[i]) - 1
        last = int(step_lengths[i]) - 1
        path[i, last + 1 :] = n
        for s in range(last, -1, -1):
            path[i, s] = max(n, 0)
            n -= int(moves[i, s, max(n, 0)])
    return path


def step_and_character_masks(alignments, mel_lengths, token_lengths, reduction_factor: int):
    """float32 masks of an alignment [B, S, N]'s real decoder steps [B, S] and characters [B, N],
    and the real steps of each utterance [B] (ceil(frames / r))."""
    steps_len = (mel_lengths + reduction_factor - 1) // reduction_factor
    s_mask = tf.sequence_mask(steps_len, tf.shape(alignments)[1], dtype=F32)  # [B, S]
    n_mask = tf.sequence_mask(token_lengths, tf.shape(alignments)[2], dtype=F32)  # [B, N]
    return s_mask, n_mask, steps_len


def guided_attention_loss(alignments, mel_lengths, token_lengths, reduction_factor: int, sigma: float):
    """Guided attention (Tachibana et al. 2017): penalty W[s, n] = 1 - exp(-(n/N - s/S)^2 / 2g^2) on
    the weights [B, S, N], summed over characters, averaged over real decoder steps (so it reads as
    "off-diagonal mass"). Padded steps and characters are excluded. float32 scalar."""
    align = tf.cast(alignments, F32)  # [B, S, N]
    s_mask, n_mask, steps_len = step_and_character_masks(align, mel_lengths, token_lengths, reduction_factor)
    s_pos = tf.range(tf.shape(align)[1], dtype=F32)[None, :] / tf.cast(steps_len, F32)[:, None]
    n_pos = tf.range(tf.shape(align)[2], dtype=F32)[None, :] / tf.cast(token_lengths, F32)[:, None]
    penalty = 1.0 - tf.exp(-tf.square(n_pos[:, None, :] - s_pos[:, :, None]) / (2 * sigma**2))
    return tf.reduce_sum(align * penalty * s_mask[:, :, None] * n_mask[:, None, :]) / (
        tf.maximum(tf.reduce_sum(s_mask), 1.0)
    )


def attention_monotonicity(alignments, token_lengths, decoder_lengths) -> float:
    """Share of decoder steps whose attention peak moves forward by 0, 1 or 2 encoder steps.

    alignments [B, S, N]; decoder_lengths [B] in decoder steps (ceil(frames / r)). 1.0 is a
    monotonic walk; a random or stuck-backwards alignment scores far lower. NaN if no step pairs.
    """
    a = np.asarray(alignments)
    peaks = [np.argmax(a[i, : int(s), : int(n)], -1) for i, (n, s) in enumerate(zip(token_lengths, decoder_lengths))]
    moves = np.concatenate([np.diff(p) for p in peaks] + [np.zeros([0], int)])
    return float(np.mean((moves >= 0) & (moves <= 2))) if moves.size else float("nan")


def attention_diagonality(alignments, token_lengths, decoder_lengths, band: float = 0.15) -> float:
    """Mean attention mass per decoder step within `band` (share of the text) of the straight diagonal."""
    total, count = 0.0, 0
    for i, (n, s) in enumerate(zip(np.asarray(token_lengths), np.asarray(decoder_lengths))):
        a = np.asarray(alignments)[i, : int(s), : int(n)]  # [s, n]
        near = np.abs(np.arange(n)[None, :] / n - np.arange(s)[:, None] / s) <= band
        total, count = total + float(np.sum(a * near)), count + int(s)
    return total / count if count else float("nan")
