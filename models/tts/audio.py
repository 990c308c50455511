"""Audio utilities for evaluating synthesis: Griffin-Lim of Kaldi-compatible log-mel fbank, cepstral distance, plots.

The features everywhere in speechflow are kaldi-native-fbank's 80-bin log-mel fbank: 16 kHz,
25 ms frames every 10 ms (snip_edges), dither 0, DC removed per frame, pre-emphasis 0.97, Povey
window, 512-point FFT, power spectrum, triangular mel filters from 20 Hz to 8 kHz on Kaldi's mel
scale 1127 ln(1 + f / 700), natural log floored at float32 epsilon. Griffin-Lim inverts that with
the same mel filters (`kaldi_mel_matrix`) and window (`povey_window`); synthesized audio is analysed
again by the feature stage itself (pipeline/features.py `compute_fbank`, in `vocoded`). Log-mels here
are the raw fbank values, not the normalized ones the model sees: de-normalize model outputs before
calling these.
"""

from __future__ import annotations

import base64
import functools
import io
import os
from pathlib import Path

import numpy as np
import scipy.fft
import scipy.io.wavfile
import scipy.signal

SAMPLE_RATE = 16000
FRAME_LENGTH = 400  # 25 ms at 16 kHz
FRAME_SHIFT = 160  # 10 ms at 16 kHz
N_FFT = 512  # the frame length rounded up to a power of two, as Kaldi does
PREEMPHASIS = 0.97


def kaldi_mel_scale(freq):
    """Hz -> Kaldi mel: 1127 ln(1 + f / 700)."""
    return 1127.0 * np.log(1.0 + np.asarray(freq, np.float64) / 700.0)


def kaldi_mel_matrix(n_mels=80, n_fft=512, sample_rate=16000, low_freq=20.0, high_freq=8000.0) -> np.ndarray:
    """Kaldi's triangular mel filters as a [n_fft // 2 + 1, n_mels] float32 matrix (power -> mel).

    Filters are triangles equally spaced on the mel scale between low_freq and high_freq (Hz;
    high_freq <= 0 means Nyquist + high_freq, as in Kaldi). Like Kaldi, the Nyquist bin gets no
    weight and the filters are not area-normalized.
    """
    if high_freq <= 0:
        high_freq += sample_rate / 2
    if not 0 <= low_freq < high_freq <= sample_rate / 2:
        raise ValueError(f"mel range {low_freq}..{high_freq} Hz does not fit in 0..{sample_rate / 2} Hz")
    mel_low, mel_high = kaldi_mel_scale(low_freq), kaldi_mel_scale(high_freq)
    delta = (mel_high - mel_low) / (n_mels + 1)
    left = mel_low + delta * np.arange(n_mels)  # [n_mels]
    center, right = left + delta, left + 2 * delta
    mel = kaldi_mel_scale(np.arange(n_fft // 2) * sample_rate / n_fft)[:, None]  # [bins - 1, 1]
    up, down = (mel - left) / (center - left), (right - mel) / (right - center)
    weights = np.where((mel > left) & (mel < right), np.where(mel <= center, up, down), 0.0)
    return np.concatenate([weights, np.zeros([1, n_mels])], 0).astype(np.float32)  # [bins, n_mels]


def povey_window(length=FRAME_LENGTH) -> np.ndarray:
    """Kaldi's Povey window: a Hann window (periodic in N - 1) raised to the power 0.85."""
    return (0.5 - 0.5 * np.cos(2 * np.pi * np.arange(length) / (length - 1))) ** 0.85


def griffin_lim(log_mel, n_iter: int = 48, momentum: float = 0.99, seed: int = 0) -> np.ndarray:
    """Log-mel fbank [T, n_mels] -> waveform float32 [(T - 1) * 160 + 400] at 16 kHz, same scale as analysed
    (`griffin_lim_batch` of one sentence)."""
    log_mel = np.asarray(log_mel)
    if log_mel.ndim != 2:
        raise ValueError(f"griffin_lim expects one utterance's log-mel [frames, bins], got shape {log_mel.shape}")
    return griffin_lim_batch([log_mel], n_iter, momentum, seed)[0]


def griffin_lim_batch(log_mels, n_iter: int = 48, momentum: float = 0.99, seed: int = 0) -> list[np.ndarray]:
    """Log-mel fbanks [T_i, n_mels] -> waveforms float32 [(T_i - 1) * 160 + 400] at 16 kHz, same scale as
    analysed, all sentences at once (one padded batch: a Python loop of eager ops per sentence spends
    more time dispatching than computing). Each sentence comes out as it would alone: padding has zero
    magnitude, and its random start phase is drawn from `seed` for its own shape.

    Mel power -> linear power by the pseudo-inverse of the mel matrix clipped at zero, magnitude
    = its square root, then fast Griffin-Lim (Perraudin et al. 2013; `momentum` 0 gives the
    classic algorithm) with the exact STFT Kaldi uses, and finally the pre-emphasis undone.
    """
    import tensorflow as tf

    log_mels = [np.asarray(m, np.float64) for m in log_mels]
    if not log_mels:
        return []
    lengths = [len(m) for m in log_mels]
    inverse = np.linalg.pinv(kaldi_mel_matrix(log_mels[0].shape[1]).astype(np.float64))  # [n_mels, bins]
    magnitude = np.zeros([len(log_mels), max(lengths), inverse.shape[1]])  # [B, T, 257]
    phase = np.ones_like(magnitude, np.complex128)
    for i, m in enumerate(log_mels):
        magnitude[i, : len(m)] = np.sqrt(np.maximum(np.exp(m) @ inverse, 0.0))
        phase[i, : len(m)] = np.exp(2j * np.pi * np.random.default_rng(seed).random((len(m), inverse.shape[1])))
    waves = _griffin_lim_graph()(
        tf.constant(magnitude, tf.complex64),
        tf.constant(phase, tf.complex64),
        tf.constant(n_iter, tf.int32),
        tf.constant(momentum, tf.float32),
    )
    waves = waves.numpy().astype(np.float64)  # [B, samples]
    return [
        scipy.signal.lfilter([1.0], [1.0, -PREEMPHASIS], w[: (t - 1) * FRAME_SHIFT + FRAME_LENGTH]).astype(np.float32)
        for w, t in zip(waves, lengths)
    ]


@functools.cache
def _griffin_lim_graph():
    """Fast Griffin-Lim's iterations as one graph (a `tf.while_loop`, traced once per process for
    every batch, length and number of iterations): as eager ops, the STFT pair's two dozen small
    ops per iteration were dispatched one by one from Python.
    magnitude, start phase [B, T, 257] -> waveforms [B, samples]."""
    import tensorflow as tf

    window = tf.constant(povey_window(), tf.float32)

    def window_fn(length, dtype):
        return tf.cast(window, dtype)

    def stft(x):
        return tf.signal.stft(x, FRAME_LENGTH, FRAME_SHIFT, N_FFT, window_fn=window_fn)  # [B, T, 257]

    def istft(s):
        inverse_window = tf.signal.inverse_stft_window_fn(FRAME_SHIFT, forward_window_fn=window_fn)
        return tf.signal.inverse_stft(s, FRAME_LENGTH, FRAME_SHIFT, N_FFT, window_fn=inverse_window)

    spectra = tf.TensorSpec([None, None, N_FFT // 2 + 1], tf.complex64)  # [B, T, 257]

    @tf.function(
        autograph=False,
        input_signature=[spectra, spectra, tf.TensorSpec([], tf.int32), tf.TensorSpec([], tf.float32)],
    )
    def iterate(magnitude, phase, n_iter, momentum):
        def body(i, rebuilt, previous):
            spec = stft(istft(rebuilt))
            accelerated = spec + tf.cast(momentum, tf.complex64) * (spec - previous)
            # e^(i angle): the value over its modulus (0 where it is 0, as the padding's magnitude),
            # a quarter of the time of exp(i atan2(...)) on these shapes
            unit = accelerated * tf.cast(tf.math.divide_no_nan(1.0, tf.abs(accelerated)), tf.complex64)
            return i + 1, magnitude * unit, spec

        rebuilt = phase * magnitude
        _, rebuilt, _ = tf.while_loop(lambda i, *_: i < n_iter, body, (tf.constant(0), rebuilt, rebuilt))
        return istft(rebuilt)

    return iterate


def pcm16(wave, peak: float | None = 0.9) -> np.ndarray:
    """16-bit samples of `wave` [samples] float: scaled so |max| = `peak` of full scale when `peak`
    is set (Griffin-Lim output has the features' arbitrary scale), else taken as already in [-1, 1]
    and clipped."""
    wave = np.asarray(wave, np.float64)
    if peak is not None:
        wave = wave * (peak / max(float(np.max(np.abs(wave), initial=0.0)), 1e-9))
    return np.round(np.clip(wave, -1.0, 1.0) * 32767).astype(np.int16)


def wav_bytes(wave, sample_rate: int = SAMPLE_RATE, peak: float | None = 0.9) -> bytes:
    """`pcm16(wave, peak)` as the bytes of a 16-bit PCM WAV file."""
    buffer = io.BytesIO()
    scipy.io.wavfile.write(buffer, sample_rate, pcm16(wave, peak))
    return buffer.getvalue()


def wavs_base64(log_mels: list[np.ndarray], iterations: int) -> list[str]:
    """Griffin-Lim audio of each sentence's log-mel [T_i, D] (one batch, `iterations` iterations) as
    base64-encoded 16-bit WAV files: the served synthesis model's `audio` (models/tts/server.py)."""
    waves = griffin_lim_batch(log_mels, n_iter=iterations)
    return [base64.b64encode(wav_bytes(wave)).decode("ascii") for wave in waves]


def write_wav(path, wave, sample_rate: int = SAMPLE_RATE, peak: float | None = 0.9) -> None:
    """Writes `wav_bytes(wave, sample_rate, peak)` to `path` (atomically)."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(wav_bytes(wave, sample_rate, peak))
    os.replace(tmp, path)


def vocoded(log_mels, n_iter: int = 48, chunk: int = 16) -> list[np.ndarray]:
    """What a listener of the synthesis hears, analysed again: log-mels [T_i, 80] through Griffin-Lim
    (`n_iter` iterations, as served), as the 16-bit WAV a user gets, then through the feature stage
    (pipeline/features.py `compute_fbank`, the training features' own code): log-mels [T_i, 80]."""
    from pipeline import features

    if not len(log_mels):
        return []
    config = features.FeatureConfig(num_mel_bins=int(np.shape(log_mels[0])[1]))
    # Batches of alike lengths (each pads to its longest); every sentence comes out as it would alone.
    order = sorted(range(len(log_mels)), key=lambda i: len(log_mels[i]))
    heard: list = [None] * len(log_mels)
    for start in range(0, len(order), chunk):
        batch = order[start : start + chunk]
        for i, wave in zip(batch, griffin_lim_batch([log_mels[i] for i in batch], n_iter)):
            heard[i] = features.compute_fbank(pcm16(wave).astype(np.float32), config)
    return heard


def _cepstra(log_mel, n_coeffs):
    """Filterbank cepstra c1..c_n of each frame (c0, the level, is dropped).

    Our log-mels are natural logs of mel *power*; half of that is the log amplitude L. The cepstrum
    of a spectrum sampled at N mel bins is c_k = (1/N) sum_n L_n cos(pi k (n + 1/2) / N), which is
    the orthonormal DCT-II divided by sqrt(2N); at that scale, distances take the dB scale of
    mel-cepstral distortion (see `fbank_cepstral_distance` for why they are still not MCD).
    """
    log_mel = np.asarray(log_mel, np.float64)
    amplitude = 0.5 * log_mel  # [T, bins]
    dct = scipy.fft.dct(amplitude, type=2, norm="ortho", axis=-1)  # [T, bins]
    return dct[:, 1 : n_coeffs + 1] / np.sqrt(2 * log_mel.shape[-1])


def dtw_path(cost: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Minimum-cost monotonic alignment of a [Ta, Tb] non-negative cost matrix (steps (1,0), (0,1), (1,1)).

    Rows are filled vectorized: D[i, j] = S[j] + min_{k<=j}(E[k] - S[k]) with S the row's cumulative
    cost, which equals the sequential recursion when costs are >= 0. Returns index arrays (ia, ib).
    """
    ta, tb = cost.shape
    acc = np.empty_like(cost)
    acc[0] = np.cumsum(cost[0])
    for i in range(1, ta):
        entry = cost[i] + np.minimum(acc[i - 1], np.concatenate([[np.inf], acc[i - 1, :-1]]))
        running = np.cumsum(cost[i])
        acc[i] = running + np.minimum.accumulate(entry - running)
    i, j, path = ta - 1, tb - 1, [(ta - 1, tb - 1)]
    while i > 0 or j > 0:
        options = [
            (acc[i - 1, j - 1] if i and j else np.inf, i - 1, j - 1),
            (acc[i - 1, j] if i else np.inf, i - 1, j),
            (acc[i, j - 1] if j else np.inf, i, j - 1),
        ]
        _, i, j = min(options)
        path.append((i, j))
    ia, ib = np.array(path[::-1]).T
    return ia, ib


def fbank_cepstral_distance(log_mel_a, log_mel_b, n_coeffs: int = 13) -> float:
    """A cepstral distance in dB between two log-mel sequences [Ta, bins] and [Tb, bins] of different lengths.

    Cepstra c_1..c_13 are the DCT cepstra of each frame's log-amplitude mel filterbank (see
    `_cepstra`; c0, the loudness, is excluded); frames are paired by DTW on the per-frame distance,
    and the result is the mean over the DTW path of 10 / ln 10 * sqrt(2 * sum_d (c_d - c'_d)^2),
    the formula of mel-cepstral distortion (Kubichek 1993).

    It is *not* the mel-cepstral distortion (MCD) that synthesis papers report, and its values do not
    compare with theirs: MCD is computed on mel-cepstra from a waveform analysis (SPTK's mcep of a
    WORLD or STFT envelope, frequency-warped by an all-pass filter, alpha 0.42 at 16 kHz, typically
    24 or more coefficients), between a recording and the vocoded synthesis. Here both sides are
    80-bin Kaldi filterbanks, what the model predicts, with no vocoder in between: it measures the
    spectral envelope the model predicts, which is what this evaluation can compare.
    """
    ca, cb = _cepstra(log_mel_a, n_coeffs), _cepstra(log_mel_b, n_coeffs)  # [Ta, 13], [Tb, 13]
    distance = 10.0 / np.log(10.0) * np.sqrt(2.0 * np.sum((ca[:, None, :] - cb[None, :, :]) ** 2, -1))
    ia, ib = dtw_path(distance)
    return float(np.mean(distance[ia, ib]))


def mel_l1(a, b, lengths=None) -> float:
    """Mean |a - b| over real frames and bins. a, b [B, T, bins] with lengths [B], or [T, bins]."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if a.shape != b.shape:
        raise ValueError(f"mel_l1 needs equal shapes, got {a.shape} and {b.shape}; trim or pad first")
    if lengths is None:
        return float(np.mean(np.abs(a - b)))
    mask = np.arange(a.shape[1])[None, :] < np.asarray(lengths)[:, None]  # [B, T]
    return float(np.sum(np.abs(a - b) * mask[..., None]) / max(mask.sum() * a.shape[-1], 1))


def _figure():
    import matplotlib

    matplotlib.use("Agg")  # no display on training nodes
    import matplotlib.pyplot as plt

    return plt


def plot_alignment(alignment, path, title: str = "") -> None:
    """Writes a PNG of one attention alignment [decoder_steps, encoder_steps]."""
    plt = _figure()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    image = ax.imshow(np.asarray(alignment).T, aspect="auto", origin="lower", interpolation="none", vmin=0)
    fig.colorbar(image, ax=ax, label="attention weight")
    ax.set(xlabel="decoder step", ylabel="encoder step (character)", title=title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_mels(predicted, reference, path, title: str = "") -> None:
    """Writes a PNG with predicted and reference log-mels [frames, bins] on one colour scale."""
    plt = _figure()
    predicted, reference = np.asarray(predicted), np.asarray(reference)
    low = min(predicted.min(), reference.min())
    high = max(predicted.max(), reference.max())
    fig, axes = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
    for ax, mel, name in zip(axes, (predicted, reference), ("predicted", "reference")):
        image = ax.imshow(mel.T, aspect="auto", origin="lower", interpolation="none", vmin=low, vmax=high)
        fig.colorbar(image, ax=ax, label="log-mel")
        ax.set(ylabel="mel bin", title=f"{title} {name}".strip())
    axes[-1].set_xlabel("frame (10 ms)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
