"""The LSTM acoustic model: frame stacking/subsampling -> bidirectional LSTMs -> projection -> tokens.

As in the IBM LSTM acoustic models the research trained (Switchboard, 40-80 dim log-mel input),
neighbouring frames are stacked and the frame rate is reduced at the input, which shortens the
recurrence (the sequential, slow part on any device) by the subsampling factor. The default
loss is CTC over characters; when the shards carry frame-level pdf-id targets (a Kaldi
alignment), the model can be trained with frame cross-entropy instead.
"""

from __future__ import annotations

import weakref

import keras
import numpy as np
import tensorflow as tf

from models.asr.config import AsrConfig
from models.layers import lstm
from pipeline import text
from pipeline.frontend import cepstral_basis, stack_and_subsample


class BiLSTM(keras.layers.Layer):
    """A bidirectional LSTM for right-padded batches, without masks (models/layers/lstm.py: the backward
    LSTM reads each sequence reversed within its own length; Keras' masked path steps the padding
    too and is slower). `kernel`: which path computes it (models/layers/lstm.py's KERNELS); `grad_matmuls`: the
    dtype of that path's large gradient matmuls (its GRAD_MATMULS)."""

    def __init__(self, units: int, kernel: str = "auto", grad_matmuls: str = "float32", **kwargs):
        super().__init__(**kwargs)
        self.kernel, self.grad_matmuls = kernel, grad_matmuls
        self.forward = keras.layers.LSTM(units, return_sequences=True, name="fw")
        self.backward = keras.layers.LSTM(units, return_sequences=True, name="bw")

    def call(self, x, lengths):
        # x: [batch, frames, in]; lengths: [batch] -> [batch, frames, 2*units]
        return lstm.bidirectional(self.forward, self.backward, x, lengths, self.kernel, grad_matmuls=self.grad_matmuls)


class AcousticModel(keras.Model):
    def __init__(self, config: AsrConfig, **kwargs):
        super().__init__(**kwargs)
        self.config = config
        outputs = config.vocab_size if config.loss == "ctc" else config.num_targets
        if outputs <= 1:
            raise ValueError(
                f"the model needs its output size: vocab_size={config.vocab_size}, num_targets={config.num_targets}"
            )
        if not 0 <= config.cepstra <= config.feature_dim:
            raise ValueError(f"asr.cepstra must be 0 (off) to feature_dim={config.feature_dim}, got {config.cepstra}")
        # [feature_dim, cepstra], a constant of the graph; None: the spectrum as it is
        self.cepstral = cepstral_basis(config.feature_dim, config.cepstra) if config.cepstra else None
        if config.frontend not in ("stack", "conv"):
            raise ValueError(f"asr.frontend must be 'stack' or 'conv', got {config.frontend!r}")
        if config.frontend == "conv" and (config.subsample < 2 or config.subsample % 2):
            raise ValueError(
                f"asr.frontend=conv subsamples by strides 2 and subsample/2: asr.subsample must be even, got "
                f"{config.subsample} (e.g. 4 for one LSTM step per 40 ms)"
            )
        self.convs = []
        if config.frontend == "conv":
            strides = (2, config.subsample // 2)
            self.convs = [
                keras.layers.Conv1D(config.conv_channels, 3, strides=s, activation="relu", name=f"conv{i}")
                for i, s in enumerate(strides)
            ]
        lstm.grad_matmul_dtype(config.lstm_grad_matmuls)  # ValueError naming the choices
        self.lstms = [
            BiLSTM(config.units, config.lstm, config.lstm_grad_matmuls, name=f"blstm{i}")
            for i in range(config.num_layers)
        ]
        self.drop = keras.layers.Dropout(config.dropout)
        self.bottleneck = keras.layers.Dense(config.projection, name="projection") if config.projection else None
        self.classifier = keras.layers.Dense(outputs, name="output")

    def call(self, feats, lengths, training=False):
        """feats [batch, frames, feature_dim], lengths [batch] -> (logits [batch, frames', outputs] float32,
        lengths' [batch]) with frames' = ceil(frames / subsample)."""
        c = self.config
        if self.cepstral is not None:
            feats = tf.einsum("btd,dc->btc", feats, self.cepstral)  # [B, T, cepstra]
        if self.convs:
            x = feats
            for conv in self.convs:
                # A batch's padding is zeroed, and one zero frame is added at each end ("same" padding
                # would place the windows by the padded length), so frame i sees frames si-1..si+1.
                x = x * tf.sequence_mask(lengths, tf.shape(x)[1], x.dtype)[..., None]  # [B, T, C]
                x = conv(tf.pad(x, [[0, 0], [1, 1], [0, 0]]))  # [B, ceil(T/stride), channels]
                lengths = (lengths + conv.strides[0] - 1) // conv.strides[0]
        else:
            x, lengths = stack_and_subsample(feats, lengths, c.stack_frames, c.subsample)  # [B, T', D*stack]
        for layer in self.lstms:
            x = self.drop(layer(x, lengths), training=training)  # [B, T', 2*units]
        if self.bottleneck is not None:
            x = self.bottleneck(x)  # [B, T', projection]
        logits = self.classifier(x)  # [B, T', outputs]
        return tf.cast(logits, tf.float32), lengths


def build_asr(config: AsrConfig) -> AcousticModel:
    """The model with every variable created (so checkpoints restore into it)."""
    model = AcousticModel(config)
    model(tf.zeros([1, config.subsample * 2, config.feature_dim]), tf.constant([config.subsample * 2]))
    return model


def compiled(model: AcousticModel, feature_dim: int | None = None):
    """The model's inference pass as one graph for every batch shape: feats float32 [B, T, D]
    (normalized), lengths int32 [B] -> (logits [B, T', V], lengths' [B]).

    Called eagerly, Keras steps each LSTM through time in Python (about 1 s per second of audio on
    two cores); a tf.function without a fixed signature builds a new graph for each new length.
    Made once per model (`feature_dim`: D, default the model's config) and kept beside it.
    """
    fn = _COMPILED.get(model)
    if fn is None:
        dim = feature_dim or model.config.feature_dim
        signature = [tf.TensorSpec([None, None, dim], tf.float32), tf.TensorSpec([None], tf.int32)]
        held = weakref.ref(model)  # the cache must not keep the model alive
        fn = _COMPILED[model] = tf.function(
            lambda feats, lengths: held()(feats, lengths), input_signature=signature, autograph=False
        )
    return fn


_COMPILED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def ctc_loss(logits, logit_lengths, tokens, token_lengths, labels: str = "auto"):
    """Mean CTC loss per utterance (blank = token 0). logits [B, T', V], tokens [B, L] -> scalar.
    `labels`: AsrConfig.ctc_labels, which of TensorFlow's two CTC implementations computes it.

    A transcript needs one frame per token plus one blank between equal neighbours; an utterance
    with fewer frames cannot be aligned. Such utterances are left out of the mean and counted, so
    one cannot dominate the gradient.
    """
    inside = tf.sequence_mask(token_lengths - 1, tf.shape(tokens)[1] - 1)  # [B, L-1]
    repeats = tf.reduce_sum(tf.cast((tokens[:, 1:] == tokens[:, :-1]) & inside, tf.int32), axis=1)  # [B]
    feasible = logit_lengths >= token_lengths + repeats
    if labels not in ("auto", "dense", "sparse"):
        raise ValueError(f"unknown CTC labels {labels!r}: choose auto, dense or sparse")
    dense = labels == "dense" or (labels == "auto" and lstm.has_gpu())
    per_utt = (_ctc_dense if dense else _ctc_sparse)(logits, logit_lengths, tokens, token_lengths)  # [B]
    weights = tf.cast(feasible, tf.float32)
    loss = tf.reduce_sum(tf.where(feasible, per_utt, 0.0)) / tf.maximum(tf.reduce_sum(weights), 1.0)
    return loss, tf.reduce_sum(tf.cast(~feasible, tf.int32))


def _ctc_dense(logits, logit_lengths, tokens, token_lengths):
    """Per-utterance CTC loss [B] from dense labels: TensorFlow's graph of ops (the GPU's path; for
    an utterance that cannot be aligned it returns a huge finite loss)."""
    return tf.nn.ctc_loss(
        labels=tokens,
        logits=logits,
        label_length=token_lengths,
        logit_length=logit_lengths,
        logits_time_major=False,
        blank_index=0,
    )


def _ctc_sparse(logits, logit_lengths, tokens, token_lengths):
    """Per-utterance CTC loss [B] from sparse labels: TensorFlow's C++ `CTCLoss` kernel, O(B x L)
    per frame where the dense labels' graph is O(B x L^2); a CPU's path (about 15x faster at the
    demo's shapes). The kernel's blank is the last class, ours is 0: the blank column moves to the
    end and the ids shift down. An utterance that cannot be aligned gets 0 (the kernel's
    `ignore_longer_outputs_than_inputs`) instead of an error."""
    where = tf.where(tf.sequence_mask(token_lengths, tf.shape(tokens)[1]))  # [N, 2]
    labels = tf.SparseTensor(where, tf.gather_nd(tokens, where) - 1, tf.cast(tf.shape(tokens), tf.int64))
    rolled = tf.concat([logits[..., 1:], logits[..., :1]], axis=-1)  # [B, T', V], blank last
    return tf.compat.v1.nn.ctc_loss(
        labels,
        rolled,
        logit_lengths,
        time_major=False,
        ignore_longer_outputs_than_inputs=True,
    )


def frame_ce_loss(logits, logit_lengths, targets, subsample: int):
    """Mean cross-entropy over real frames. targets [B, T] (-1 padded) are subsampled like the input."""
    targets = targets[:, ::subsample][:, : tf.shape(logits)[1]]  # [B, T']
    mask = tf.logical_and(targets >= 0, tf.sequence_mask(logit_lengths, tf.shape(logits)[1]))
    per_frame = tf.nn.sparse_softmax_cross_entropy_with_logits(tf.maximum(targets, 0), logits)  # [B, T']
    weights = tf.cast(mask, tf.float32)
    return tf.reduce_sum(per_frame * weights) / tf.maximum(tf.reduce_sum(weights), 1.0)


def greedy_decode(logits: np.ndarray, lengths: np.ndarray) -> list[list[int]]:
    """Best path: argmax per frame, merge repeats, drop blanks (0)."""
    best = np.argmax(logits, axis=-1)
    hyps = []
    for path, length in zip(best, lengths):
        path = path[:length]
        keep = np.concatenate([[True], path[1:] != path[:-1]]) & (path != 0)
        hyps.append(path[keep].tolist())
    return hyps


def beam_decode(logits, lengths, beam_width: int = 16) -> list[list[int]]:
    """CTC beam search (`tf.nn.ctc_beam_search_decoder`). That decoder takes the last class as the
    blank, ours is 0, so the blank column moves to the end and ids shift back afterwards."""
    log_probs = tf.nn.log_softmax(logits)  # [B, T', V]
    rolled = tf.concat([log_probs[..., 1:], log_probs[..., :1]], axis=-1)
    decoded, _ = tf.nn.ctc_beam_search_decoder(
        tf.transpose(rolled, [1, 0, 2]), tf.cast(lengths, tf.int32), beam_width=beam_width, top_paths=1
    )
    dense = tf.sparse.to_dense(decoded[0], default_value=-1).numpy()
    return [[int(t) + 1 for t in row if t >= 0] for row in dense]


def transcribe(model, feats, lengths, vocabulary: list[str], beam_width: int = 0) -> list[str]:
    """Texts of a batch: feats float32 [B, T, D] normalized as in training, lengths [B] in frames;
    greedy decoding, or CTC beam search with `beam_width` > 0."""
    return transcriptions(model, feats, lengths, vocabulary, (beam_width,))[0]


def forward(model, feats, lengths):
    """(logits [B, T', V], output lengths [B]) of a batch: feats float32 [B, T, D], lengths [B] in frames."""
    return compiled(model, feats.shape[-1])(feats, tf.cast(lengths, tf.int32))


def transcriptions(model, feats, lengths, vocabulary: list[str], beam_widths=(0,)) -> list[list[str]]:
    """`transcribe` with each of `beam_widths` (0: greedy) from one forward pass of the batch: one
    list of texts per width. The forward pass is most of a transcription's time, so an evaluation
    that reports greedy and beam search runs it once."""
    logits, out_lengths = forward(model, feats, lengths)
    return decode_logits(logits, out_lengths, vocabulary, beam_widths)


def decode_logits(logits, out_lengths, vocabulary: list[str], beam_widths=(0,)) -> list[list[str]]:
    """Texts of the model's output logits [B, T', V] with real lengths [B], for each of `beam_widths`."""
    decoded = []
    for width in beam_widths:
        ids = beam_decode(logits, out_lengths, width) if width else greedy_decode(logits.numpy(), out_lengths.numpy())
        decoded.append([text.decode(h, vocabulary) for h in ids])
    return decoded


def flops_per_frame(config: AsrConfig) -> float:
    """Training FLOPs per input frame (forward x 3 for forward + backward), for the FLOP/s report.

    An LSTM step costs 2 * 4 * units * (inputs + units) FLOPs per direction; the recurrence runs at
    the subsampled rate, so each input frame accounts for 1/subsample of a step.
    """
    dim = config.cepstra or config.feature_dim  # what the front-end reads per frame
    inputs = dim * config.stack_frames
    forward = 2.0 * config.feature_dim * config.cepstra * config.subsample  # the DCT, per LSTM step
    if config.frontend == "conv":  # kernel 3: the first at half the input rate, the second at the LSTM's
        first = 2 * 3 * dim * config.conv_channels * (config.subsample // 2)
        forward, inputs = first + 2 * 3 * config.conv_channels**2, config.conv_channels
    for _ in range(config.num_layers):
        forward += 2 * 2 * 4 * config.units * (inputs + config.units)
        inputs = 2 * config.units
    outputs = config.vocab_size if config.loss == "ctc" else config.num_targets
    if config.projection:
        forward += 2 * inputs * config.projection
        inputs = config.projection
    forward += 2 * inputs * outputs
    return 3.0 * forward / config.subsample
