"""Tacotron 2-style synthesis: characters -> normalized 80-bin log-mel frames (Keras 3, TF backend).

Encoder: embedding -> convolutions -> bidirectional LSTM. Decoder: pre-net -> LSTM(s) with
location-sensitive attention (Chorowski et al. 2015, as in Tacotron 2) -> `r` mel frames and `r`
stop logits per step -> convolutional post-net residual. Keras 3 runs no AutoGraph on `call`, so
both decoder loops are explicit `tf.while_loop`s in plain methods; whatever does not depend on
the recurrence (pre-net over all teacher frames, memory keys, output projections) runs outside.

Voices: with `config.speakers` (the training split's speakers, filled in by models/tasks.py) the
model has a speaker embedding table, one row per training voice, as multi-speaker Tacotron and
Deep Voice 2 (Arik et al. 2017) have: each utterance's embedding is projected into the encoder
output (so the attention memory knows the voice), into the decoder LSTM's input and onto the output
frames. Without it, a corpus of many voices is learned as their average: smeared spectra.

Compiled decoder: both loops are `tf.while_loop`s, so inside `tf.function` a decoder pass is one
graph op, not one Python step per frame; `config.xla` also compiles the loop with XLA (one fused
program per shape, what a GPU needs to be rid of per-op launches). `compiled_infer` is synthesis
as one such function.

Batch keys: tokens [B, N] int32 (0 = padding), token_lengths [B], mels [B, T, 80], mel_lengths [B],
stop_targets [B, T] (1.0 from the last real frame on), and speaker_ids [B] int32 (rows of the
speaker table) for a model with voices.

Use: `model = build_tts(config)`; training `outputs = model.teacher_forced(batch, training=True)`
and `model.compute_losses(batch, outputs)["total"]` inside `tf.function(reduce_retracing=True)`;
synthesis `model.infer(tokens, token_lengths, max_steps, speaker_ids=...)`. `encode`, `decode` and
`postnet` are the three stages of `teacher_forced`, callable on their own to time each one.

One file for the model (about 580 lines): its layers, both decoder loops and their XLA forms share
the step function and the weights' layout; split, each part would import the others' internals.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Literal

import keras
import numpy as np
import tensorflow as tf
from keras import layers

F32 = tf.float32


@dataclasses.dataclass(frozen=True)
class TtsConfig:
    vocab_size: int = 64  # token ids 1..vocab_size-1; id 0 is padding
    embedding_dim: int = 128  # character embedding width
    encoder_conv_layers: int = 3  # conv + layer norm + ReLU + dropout blocks before the BLSTM
    encoder_conv_filters: int = 128  # channels of each encoder convolution
    encoder_conv_kernel: int = 5  # width in characters of each encoder convolution
    encoder_lstm_units: int = 64  # per direction; the attention memory is twice as wide
    attention_dim: int = 64  # width of the tanh layer that scores each encoder step
    location_filters: int = 16  # channels of the convolution over previous + cumulative weights
    location_kernel: int = 15  # its width in encoder steps (odd, so it is centred)
    prenet_units: tuple[int, ...] = (128, 64)  # dense+ReLU+dropout layers over the previous frame
    prenet_dropout: float = 0.5  # high on purpose: the bottleneck stops the decoder copying frames
    prenet_dropout_at_inference: bool = True  # Tacotron 2 keeps it on; off only for exact repeats
    # Feed each decoder step the previous frame (through the pre-net), as Tacotron does. False: the
    # decoder sees only the attention context and its own state, so synthesis runs exactly the
    # computation training ran (no exposure bias: nothing learned from copying the teacher's frames
    # is missing when the model must read its own). See the README's synthesis section.
    decoder_feedback: bool = True
    decoder_lstm_units: int = 192  # units of every decoder LSTM layer; 256 trains ~20% slower on 2 cores
    decoder_lstm_layers: int = 1  # the first is the attention RNN; more are stacked above it
    n_mels: int = 80  # mel bins of the features
    reduction_factor: int = 3  # frames emitted per decoder step; fewer steps, faster, coarser
    postnet_layers: int = 3  # conv + layer norm + tanh blocks before the output convolution
    postnet_filters: int = 128  # channels of each post-net convolution
    postnet_kernel: int = 5  # width in frames of each post-net convolution
    dropout: float = 0.1  # dropout in the encoder convolutions and the post-net (training only)
    mel_loss: Literal["l1", "l2"] = "l1"  # L1: blurs less than L2 and is not dominated by outlier frames
    stop_pos_weight: float = 5.0  # weight of the one positive (last) frame in the stop loss
    guided_attention: bool = True  # add the guided-attention loss (Tachibana et al. 2017)
    guided_attention_sigma: float = 0.2  # width g of the tolerated band around the diagonal
    guided_attention_weight: float = 1.0  # weight of the guided-attention loss in the total
    # The training voices, one speaker-embedding row each, in this order (models/tasks.py fills them
    # in from the training split); empty: one voice, no speaker input.
    speakers: tuple[str, ...] = ()
    speaker_dim: int = 64  # width of the speaker embedding (0: no speaker input even with speakers)
    # Where each character is spoken. "attention": Tacotron's location-sensitive attention learns it.
    # "durations": monotonic alignment search (Glow-TTS, Kim et al. 2020) finds it in every training
    # batch, as the path through (decoder step, character) that best matches the frames the encoder
    # predicts for each character; a duration predictor learns it for synthesis (FastSpeech, Ren et
    # al. 2019), and a bidirectional LSTM decoder, fed no frames, runs over the characters repeated
    # by their durations. Nothing has to be learned by attention first; see the README's synthesis section.
    alignment: Literal["attention", "durations"] = "attention"
    duration_weight: float = 1.0  # "durations": weight of the duration loss (squared steps) in the total
    # "durations": the decoder over the characters repeated by their durations. "lstm": a bidirectional
    # LSTM of decoder_lstm_units per direction. "conv": residual blocks of dilated convolutions
    # (decoder_conv_layers of decoder_conv_filters channels, dilations 1, 2, 4, 8, ...): no step waits
    # for the one before, so a training step is not a chain of small matrix products.
    durations_decoder: Literal["lstm", "conv"] = "lstm"
    decoder_conv_layers: int = 4  # "conv": residual conv + layer norm + ReLU + dropout blocks
    decoder_conv_filters: int = 128  # "conv": channels of each block (256: slower than the LSTM on 2 CPU cores)
    decoder_conv_kernel: int = 5  # "conv": width in decoder steps of each convolution (odd)
    # Compile the decoder loops with XLA (jit_compile): one fused program per batch shape. Helps where
    # each op is a kernel launch (a GPU); on 2 CPU cores see benchmarks/throughput.py.
    xla: bool = False

    def __post_init__(self):
        if self.alignment not in ("attention", "durations"):
            raise ValueError(f"TtsConfig.alignment must be 'attention' or 'durations', got {self.alignment!r}")
        if self.durations_decoder not in ("lstm", "conv"):
            raise ValueError(f"TtsConfig.durations_decoder must be 'lstm' or 'conv', got {self.durations_decoder!r}")
        if self.mel_loss not in ("l1", "l2"):
            raise ValueError(f"TtsConfig.mel_loss must be 'l1' or 'l2', got {self.mel_loss!r}")
        if self.reduction_factor < 1 or self.decoder_lstm_layers < 1 or self.vocab_size < 2:
            raise ValueError(f"TtsConfig needs reduction_factor, decoder_lstm_layers >= 1 and vocab_size >= 2: {self}")
        kernels = (self.location_kernel, self.postnet_kernel, self.encoder_conv_kernel, self.decoder_conv_kernel)
        if any(k % 2 == 0 for k in kernels):
            raise ValueError("TtsConfig kernels must be odd so that 'same' convolutions stay centred")
        if len(set(self.speakers)) != len(self.speakers):
            raise ValueError("TtsConfig.speakers names a voice twice")

    @property
    def multi_speaker(self) -> bool:
        """Whether the model has a speaker table (and batches need `speaker_ids`)."""
        return bool(self.speakers) and self.speaker_dim > 0


def speaker_ids(config: TtsConfig, voices: Sequence[str | None]) -> np.ndarray:
    """Rows of the speaker table for voice names: int32 [len(voices)]. A missing voice (None or "")
    is the default voice, the first training voice. ValueError naming the model's voices for a name
    it does not have. What serving calls with a request's `voice` column."""
    known = {name: i for i, name in enumerate(config.speakers)}
    ids = []
    for voice in voices:
        if voice is None or voice == "":
            ids.append(0)
        elif voice in known:
            ids.append(known[voice])
        else:
            have = f"these voices: {', '.join(config.speakers)}" if config.speakers else "one voice, not named"
            raise ValueError(f"voice {voice!r} is not one this model was trained on; it has {have}")
    return np.asarray(ids, np.int32)


# The model's methods hold no Python control flow on tensors (the loops are explicit
# tf.while_loops), so AutoGraph has nothing to convert in them; tracing them as they are also
# avoids a TF 2.17 AutoGraph failure seen once in a test run, where a converted `postnet` was
# called without its `self` ("tf__postnet() missing 1 required positional argument").
_no_autograph = tf.autograph.experimental.do_not_convert


def _dropout(x, rate: float, on: bool):
    return tf.nn.dropout(x, rate) if on and rate > 0 else x


def _mask(lengths, maxlen, dtype):
    return tf.sequence_mask(lengths, maxlen, dtype=dtype)  # [B, maxlen]


def _energy_mask(token_lengths, n):
    """[B, N] float32 added to attention energies: 0 on characters, -1e9 on padding."""
    return (1.0 - _mask(token_lengths, n, F32)) * -1e9


def _forget_bias(shape, dtype=None):
    """LSTM bias for gates ordered [input, forget, output, candidate]: 1 on the forget gate
    (Jozefowicz et al. 2015), so that early in training the cell keeps its memory."""
    units = shape[0] // 4
    return tf.concat([tf.zeros([units]), tf.ones([units]), tf.zeros([2 * units])], 0)


class Tacotron(keras.Model):
    """Holds the layers; `teacher_forced`, `compute_losses` and `infer` are what trainers call."""

    def __init__(self, config: TtsConfig):
        super().__init__(name="tacotron")
        c = self.config = config
        # Every layer is named: checkpoints restore variables by these names (Keras would number
        # unnamed layers per process, and a second model in one process would get other names).
        self.embedding = layers.Embedding(c.vocab_size, c.embedding_dim, name="embedding")
        n_conv = range(c.encoder_conv_layers)
        self.enc_convs = self._stack(
            "enc_conv",
            (
                layers.Conv1D(c.encoder_conv_filters, c.encoder_conv_kernel, padding="same", name=f"enc_conv_{i}")
                for i in n_conv
            ),
        )
        # Layer norm, not batch norm: its statistics are per position, so padding cannot leak in.
        self.enc_norms = self._stack("enc_norm", (layers.LayerNormalization(name=f"enc_norm_{i}") for i in n_conv))
        self.enc_fw = layers.LSTM(c.encoder_lstm_units, return_sequences=True, name="enc_fw")
        self.enc_bw = layers.LSTM(c.encoder_lstm_units, return_sequences=True, name="enc_bw")
        self.memory_keys = layers.Dense(c.attention_dim, name="memory_keys")  # its bias is the `b` of the energy tanh
        self.prenet = self._stack(
            "prenet", (layers.Dense(n, activation="relu", name=f"prenet_{i}") for i, n in enumerate(c.prenet_units))
        )
        u, m, a = c.decoder_lstm_units, 2 * c.encoder_lstm_units, c.attention_dim
        # Each decoder LSTM splits its kernel: `lstm_in` reads the layer below (the pre-net for
        # layer 0, precomputable over all teacher frames), `lstm_rec` reads [context, own h].
        n_dec = range(c.decoder_lstm_layers)
        self.lstm_in = self._stack(
            "lstm_in", (layers.Dense(4 * u, bias_initializer=_forget_bias, name=f"lstm_in_{i}") for i in n_dec)
        )
        self.lstm_rec = self._stack(
            "lstm_rec", (layers.Dense(4 * u, use_bias=False, name=f"lstm_rec_{i}") for i in n_dec)
        )
        self.query = layers.Dense(a, use_bias=False, name="query")
        self.location_conv = layers.Conv1D(
            c.location_filters, c.location_kernel, padding="same", use_bias=False, name="location_conv"
        )
        self.location_dense = layers.Dense(a, use_bias=False, name="location_dense")
        self.energy = layers.Dense(1, use_bias=False, name="energy")
        self.frame_proj = layers.Dense(c.reduction_factor * c.n_mels, name="frame_proj")
        self.stop_proj = layers.Dense(c.reduction_factor, name="stop_proj")
        n_post = range(c.postnet_layers)
        self.post_convs = self._stack(
            "post_conv",
            (layers.Conv1D(c.postnet_filters, c.postnet_kernel, padding="same", name=f"post_conv_{i}") for i in n_post),
        )
        self.post_norms = self._stack("post_norm", (layers.LayerNormalization(name=f"post_norm_{i}") for i in n_post))
        self.post_out = layers.Conv1D(c.n_mels, c.postnet_kernel, padding="same", name="post_out")
        if c.multi_speaker:
            # One row per training voice, projected to where the voice matters: the attention memory
            # (softsign keeps the added term in the LSTM outputs' range), the decoder LSTM's gates
            # (every step), and the output frames (the voice's spectral envelope).
            # The table as a bias-free Dense over one-hot rows: its gradient is dense, and Horovod
            # 0.28.1's grouped allreduce mismatches tensors when a step has two sparse gradients.
            self.speaker_embedding = layers.Dense(
                c.speaker_dim, use_bias=False, kernel_initializer="random_normal", name="speaker_embedding"
            )
            self.speaker_memory = layers.Dense(m, activation="softsign", name="speaker_memory")
            self.speaker_decoder = layers.Dense(4 * u, name="speaker_decoder")
            self.speaker_frames = layers.Dense(c.reduction_factor * c.n_mels, name="speaker_frames")
        if c.alignment == "durations":
            self.char_frames = layers.Dense(c.reduction_factor * c.n_mels, name="char_frames")
            # FastSpeech's duration predictor: two conv + layer norm + dropout blocks, one output.
            self.duration_convs = self._stack(
                "duration_conv",
                (layers.Conv1D(c.encoder_conv_filters, 3, padding="same", name=f"duration_conv_{i}") for i in range(2)),
            )
            self.duration_norms = self._stack(
                "duration_norm", (layers.LayerNormalization(name=f"duration_norm_{i}") for i in range(2))
            )
            self.duration_out = layers.Dense(1, name="duration_out")  # decoder steps per character
            if c.durations_decoder == "lstm":
                self.dec_fw = layers.LSTM(u, return_sequences=True, name="dec_fw")
                self.dec_bw = layers.LSTM(u, return_sequences=True, name="dec_bw")
            else:
                n_dec_conv = range(c.decoder_conv_layers)
                self.dec_in = layers.Dense(c.decoder_conv_filters, name="dec_in")
                self.dec_convs = self._stack(
                    "dec_conv",
                    (
                        layers.Conv1D(
                            c.decoder_conv_filters,
                            c.decoder_conv_kernel,
                            padding="same",
                            dilation_rate=2 ** (i % 4),
                            name=f"dec_conv_{i}",
                        )
                        for i in n_dec_conv
                    ),
                )
                self.dec_norms = self._stack(
                    "dec_norm", (layers.LayerNormalization(name=f"dec_norm_{i}") for i in n_dec_conv)
                )
        # XLA: the decoder loops as compiled functions (built once: a tf.function per instance).
        self._loop = self._loop_teacher_xla if c.xla else self._loop_teacher
        self._free_loop = tf.function(self._loop_free, jit_compile=True) if c.xla else self._loop_free
        self._xla_forward = tf.function(self._loop_teacher, jit_compile=True)
        self._xla_backward = tf.function(self._loop_teacher_gradients, jit_compile=True)
        self._compiled_infer = None
        # Layers used only inside the loops are built here: variables cannot be made in a loop.
        builds = [
            (self.query, (None, u)),
            (self.location_conv, (None, None, 2)),
            (self.energy, (None, None, a)),
            (self.location_dense, (None, None, c.location_filters)),
        ]
        builds += [(d, (None, u)) for d in self.lstm_in[1:]] + [(d, (None, m + u)) for d in self.lstm_rec]
        for layer, shape in builds if c.alignment == "attention" else ():  # the durations' decoder has no attention
            layer.build(shape)

    def _stack(self, name, new_layers):
        """The layers as a tuple, each also set as attribute `name_i`: tf.train.Checkpoint does not
        follow Keras 3's tracked lists, and would silently skip their variables."""
        stack = tuple(new_layers)
        for i, layer in enumerate(stack):
            setattr(self, f"{name}_{i}", layer)
        return stack

    def call(self, batch, training=False):
        return self.teacher_forced(batch, training)

    def voice(self, speaker_ids, batch_size):
        """Speaker embeddings [B, speaker_dim] of `speaker_ids` [B] int32 (None: the default voice,
        row 0); None for a model without voices."""
        if not self.config.multi_speaker:
            return None
        if speaker_ids is None:
            speaker_ids = tf.zeros([batch_size], tf.int32)
        return self.speaker_embedding(
            tf.one_hot(speaker_ids, len(self.config.speakers), dtype=self.compute_dtype)
        )  # [B, E]

    @_no_autograph
    def encode(self, tokens, token_lengths, training=False, speaker_ids=None):
        """tokens [B, N] int32, token_lengths [B], speaker_ids [B] (a model with voices; None: the
        default voice) -> memory [B, N, 2 * encoder_lstm_units], 0 at padding."""
        maskf = _mask(token_lengths, tf.shape(tokens)[1], self.compute_dtype)[..., None]  # [B, N, 1]
        x = self.embedding(tokens) * maskf  # [B, N, embedding_dim]
        x = self._conv_blocks(x, self.enc_convs, self.enc_norms, maskf, training)
        # Backward direction = forward LSTM over each sequence reversed within its own length, so
        # the padding is never read first; outputs past the length are masked off.
        fw = self.enc_fw(x, training=training)  # [B, N, units]
        bw = tf.reverse_sequence(x, token_lengths, seq_axis=1, batch_axis=0)
        bw = tf.reverse_sequence(self.enc_bw(bw, training=training), token_lengths, seq_axis=1, batch_axis=0)
        memory = tf.concat([fw, bw], -1)  # [B, N, 2 * units]
        voice = self.voice(speaker_ids, tf.shape(tokens)[0])
        if voice is not None:
            memory += self.speaker_memory(voice)[:, None, :]
        return memory * maskf

    def _conv_blocks(self, x, convs, norms, maskf, training):
        """conv + layer norm + ReLU + dropout blocks over characters [B, N, C] (the encoder's and the
        duration predictor's). Re-masking after each block keeps padded characters out of the real
        ones' receptive field."""
        for conv, norm in zip(convs, norms):
            x = _dropout(tf.nn.relu(norm(conv(x))), self.config.dropout, training) * maskf
        return x

    def _prenet(self, x, on):
        for dense in self.prenet:
            x = _dropout(dense(x), self.config.prenet_dropout, on)
        return x

    def _no_feedback(self, frames):
        """What the decoder LSTM reads instead of the pre-net without `decoder_feedback`: zeros of the
        pre-net's width (so its input term is its bias and the weights keep one layout)."""
        width = self.config.prenet_units[-1] if self.config.prenet_units else self.config.n_mels
        return tf.zeros(tf.concat([tf.shape(frames)[:-1], [width]], 0), frames.dtype)

    def _loop_weights(self):
        """Variables read once, outside the loops (one read + cast instead of one per step)."""
        dt = self.compute_dtype
        loc = tf.einsum("kcf,fa->kca", self.location_conv.kernel.value, self.location_dense.kernel.value)
        return dict(
            rec=[tf.cast(r.kernel.value, dt) for r in self.lstm_rec],
            inp=[(tf.cast(d.kernel.value, dt), tf.cast(d.bias.value, dt)) for d in self.lstm_in],
            query=tf.cast(self.query.kernel.value, dt),
            loc=tf.cast(loc, dt),  # [K, 2, A]
            v=tf.reshape(self.energy.kernel.value, [-1]),
        )  # [A], float32

    def _initial_state(self, memory):
        b, n = tf.shape(memory)[0], tf.shape(memory)[1]
        zeros = tf.zeros([b, self.config.decoder_lstm_units], F32)
        hs = [tf.cast(zeros, self.compute_dtype)] * self.config.decoder_lstm_layers
        cs = [zeros] * self.config.decoder_lstm_layers
        context = tf.zeros([b, memory.shape[-1]], self.compute_dtype)
        return context, hs, cs, tf.zeros([b, n], F32), tf.zeros([b, n], F32)

    def _step(self, w, x0, state, memory, keys, pad_bias):
        """One decoder step. x0 [B, 4U]: layer 0's input term. Returns (state, [B, U + M] output)."""
        context, hs, cs, prev, cum = state
        dt = self.compute_dtype
        new_h, new_c, below = [], [], None
        for i in range(self.config.decoder_lstm_layers):
            z = x0 if i == 0 else tf.matmul(below, w["inp"][i][0]) + w["inp"][i][1]
            z = tf.cast(z + tf.matmul(tf.concat([context, hs[i]], -1), w["rec"][i]), F32)  # [B, 4U]
            gates, candidate = tf.split(z, [3 * self.config.decoder_lstm_units, -1], axis=-1)
            gi, gf, go = tf.split(tf.sigmoid(gates), 3, axis=-1)  # one sigmoid for all three gates
            c = gf * cs[i] + gi * tf.tanh(candidate)  # cell kept in float32
            below = tf.cast(go * tf.tanh(c), dt)  # [B, U]
            new_h.append(below)
            new_c.append(c)
            if i == 0:  # the attention RNN's output is the query
                location = tf.nn.conv1d(tf.cast(tf.stack([prev, cum], -1), dt), w["loc"], 1, "SAME")  # [B, N, A]
                hidden = tf.tanh(keys + tf.matmul(below, w["query"])[:, None, :] + location)  # [B, N, A]
                energies = tf.reduce_sum(tf.cast(hidden, F32) * w["v"], -1)  # [B, N]
                prev = tf.nn.softmax(energies + pad_bias, axis=-1)  # float32 softmax
                cum = cum + prev
                context = tf.matmul(tf.cast(prev, dt)[:, None, :], memory)[:, 0, :]  # [B, M]
        return (context, new_h, new_c, prev, cum), tf.concat([below, context], -1)

    @_no_autograph
    def decode(self, memory, token_lengths, mels, training=False, speaker_ids=None, mel_lengths=None):
        """Teacher-forced decoder. memory [B, N, M], mels [B, T, 80] (T need not divide by r),
        speaker_ids [B] (a model with voices; None: the default voice).

        Returns mel_before [B, T, 80], stop_logits [B, T] and alignments [B, ceil(T / r), N] (float32).
        """
        c, r = self.config, self.config.reduction_factor
        b, t = tf.shape(mels)[0], tf.shape(mels)[1]
        steps = (t + r - 1) // r
        grouped = tf.pad(tf.cast(mels, self.compute_dtype), [[0, 0], [0, steps * r - t], [0, 0]])
        grouped = tf.reshape(grouped, [b, steps, r * c.n_mels])  # [B, S, r * 80]
        if c.alignment == "durations":
            if mel_lengths is None:
                mel_lengths = tf.fill([b], t)
            return self._decode_aligned(
                memory, token_lengths, grouped, (mel_lengths + r - 1) // r, t, training, speaker_ids
            )
        # Step s reads the last frame of group s - 1 (a zero "go" frame for s = 0).
        inputs = tf.concat([tf.zeros_like(grouped[:, :1, -c.n_mels :]), grouped[:, :-1, -c.n_mels :]], 1)  # [B, S, 80]
        on = training or c.prenet_dropout_at_inference
        x0 = self.lstm_in[0](
            self._prenet(inputs, on) if c.decoder_feedback else self._no_feedback(inputs)
        )  # [B, S, 4U]
        voice = self.voice(speaker_ids, b)
        if voice is not None:
            x0 += self.speaker_decoder(voice)[:, None, :]
        pad_bias = _energy_mask(token_lengths, tf.shape(memory)[1])  # [B, N]
        keys = self.memory_keys(memory)  # [B, N, A]
        out, alignments = self._loop(tf.transpose(x0, [1, 0, 2]), memory, keys, pad_bias, self._loop_weights())
        frames, stops = self.frame_proj(out), self.stop_proj(out)  # [B, S, r * 80], [B, S, r]
        if voice is not None:
            frames += self.speaker_frames(voice)[:, None, :]
        return dict(
            mel_before=tf.reshape(frames, [b, steps * r, c.n_mels])[:, :t],  # [B, T, 80]
            stop_logits=tf.reshape(stops, [b, steps * r])[:, :t],  # [B, T]
            alignments=alignments,
        )  # [B, S, N]

    def _decode_aligned(self, memory, token_lengths, grouped, step_lengths, t, training, speaker_ids):
        """Teacher-forced decoding with `alignment="durations"`: the alignment is searched, not attended.
        grouped [B, S, r * 80] the target frames in decoder steps, step_lengths [B] real steps."""
        c, r = self.config, self.config.reduction_factor
        b, steps = tf.shape(grouped)[0], tf.shape(grouped)[1]
        means = self.char_frames(memory)  # [B, N, r * 80]: the frames each character is expected to make
        # Squared distance of every decoder step's frames to every character's: [B, S, N]
        target = tf.cast(grouped, F32)
        cost = (
            tf.reduce_sum(tf.square(target), -1)[:, :, None]
            - 2.0 * tf.einsum("bsd,bnd->bsn", target, tf.cast(means, F32))
            + tf.reduce_sum(tf.square(tf.cast(means, F32)), -1)[:, None, :]
        ) / float(r * c.n_mels)
        path = tf.numpy_function(
            monotonic_alignment, [tf.stop_gradient(cost), step_lengths, token_lengths], tf.int32, stateful=False
        )
        path = tf.reshape(path, [b, steps])  # [B, S] the character of each decoder step
        align = tf.one_hot(path, tf.shape(memory)[1], dtype=F32) * _mask(step_lengths, steps, F32)[..., None]
        frames, stops = self._aligned_frames(memory, align, step_lengths, speaker_ids, training)
        return dict(
            mel_before=tf.reshape(frames, [b, steps * r, c.n_mels])[:, :t],  # [B, T, 80]
            stop_logits=tf.reshape(stops, [b, steps * r])[:, :t],  # [B, T]
            alignments=align,  # [B, S, N] one-hot
            aligned_means=tf.einsum("bsn,bnd->bsd", align, tf.cast(means, F32)),  # [B, S, r * 80]
            grouped_targets=target,  # [B, S, r * 80]
            durations=tf.reduce_sum(align, 1),  # [B, N] decoder steps per character, searched
            predicted_durations=self._durations(memory, token_lengths, training),  # [B, N]
        )

    def _durations(self, memory, token_lengths, training=False):
        """Predicted decoder steps of each character [B, N] (float32, 0 at padding), from the encoder's
        output without moving it (the durations follow the text; the text is not bent to them).
        Steps, not their logarithm: the mean of a log-domain fit is the geometric mean, short of the
        arithmetic one (sentences came out 0.86 of the recordings' length; see the README)."""
        maskf = _mask(token_lengths, tf.shape(memory)[1], self.compute_dtype)[..., None]  # [B, N, 1]
        x = self._conv_blocks(tf.stop_gradient(memory), self.duration_convs, self.duration_norms, maskf, training)
        return tf.cast(self.duration_out(x)[..., 0] * maskf[..., 0], F32)

    def _aligned_frames(self, memory, align, step_lengths, speaker_ids, training):
        """The decoder of `alignment="durations"`: the characters repeated by `align` [B, S, N] float32
        one-hot (memory already carries the voice) -> frames [B, S, r * 80] and stop logits [B, S, r]."""
        expanded = tf.matmul(tf.cast(align, self.compute_dtype), memory)  # [B, S, M]
        # Where each step lies within its character: (k - 1/2) / d for its k-th of d steps, and d itself
        # (in tens of steps), so that the decoder need not count to shape a character's start and end.
        d = tf.reduce_sum(align * tf.reduce_sum(align, 1, keepdims=True), -1)  # [B, S] steps of the step's character
        k = tf.reduce_sum(align * tf.cumsum(align, axis=1), -1)  # [B, S] 1..d
        position = tf.stack([(k - 0.5) / tf.maximum(d, 1.0), d / 10.0], -1)  # [B, S, 2]
        expanded = tf.concat([expanded, tf.cast(position, self.compute_dtype)], -1)  # [B, S, M + 2]
        mask = _mask(step_lengths, tf.shape(align)[1], self.compute_dtype)[..., None]  # [B, S, 1]
        if self.config.durations_decoder == "lstm":
            fw = self.dec_fw(expanded, training=training)
            bw = tf.reverse_sequence(expanded, step_lengths, seq_axis=1, batch_axis=0)
            bw = tf.reverse_sequence(self.dec_bw(bw, training=training), step_lengths, seq_axis=1, batch_axis=0)
            hidden = [fw, bw]  # [B, S, U] each
        else:
            x = self.dec_in(expanded) * mask  # [B, S, C]
            for conv, norm in zip(self.dec_convs, self.dec_norms):
                # residual; padding re-masked so that no block reads past a sentence's end
                x = x + _dropout(tf.nn.relu(norm(conv(x))), self.config.dropout, training) * mask
            hidden = [x]  # [B, S, C]
        out = tf.concat(hidden + [expanded], -1) * mask  # [B, S, hidden + M + 2]
        frames = self.frame_proj(out)
        voice = self.voice(speaker_ids, tf.shape(memory)[0])
        if voice is not None:
            frames += self.speaker_frames(voice)[:, None, :]
        return frames, self.stop_proj(out)

    def _infer_durations(self, memory, token_lengths, max_steps, speaker_ids):
        """Synthesis with `alignment="durations"`: each character held for its predicted steps."""
        c, r = self.config, self.config.reduction_factor
        b, n = tf.shape(memory)[0], tf.shape(memory)[1]
        durations = tf.maximum(self._durations(memory, token_lengths), 0.0)  # [B, N]
        # Where each character ends, rounded from the running sum: rounding each duration on its own
        # would lose up to half a step per character (a sentence of 1.4-step characters a third short).
        ends = tf.cast(tf.round(tf.cumsum(durations, axis=1)), tf.int32)  # [B, N]
        lengths = tf.maximum(tf.minimum(ends[:, -1], max_steps), 1)  # [B] decoder steps
        steps = tf.reduce_max(lengths)
        # the character of step s: how many characters end at or before s
        path = tf.minimum(tf.searchsorted(ends, tf.tile(tf.range(steps)[None], [b, 1]), side="right"), n - 1)
        align = tf.one_hot(path, n, dtype=F32) * _mask(lengths, steps, F32)[..., None]  # [B, S, N]
        frames, _ = self._aligned_frames(memory, align, lengths, speaker_ids, False)
        before = tf.reshape(frames, [b, steps * r, c.n_mels]) * _mask(lengths * r, steps * r, frames.dtype)[..., None]
        return dict(
            mels=tf.cast(self.postnet(before, lengths * r), F32),
            mels_before=tf.cast(before, F32),
            lengths=lengths * r,
            alignments=align,
        )

    def _loop_teacher_xla(self, x0, memory, keys, pad_bias, w):
        """`_loop_teacher` compiled by XLA, forward and backward each one program.

        The gradient of a compiled while loop needs its per-step intermediates, which TensorFlow
        cannot hand from an XLA program to the graph around it (TensorLists do not cross that
        boundary); so the backward program runs the loop again and differentiates it inside XLA
        (recomputation: one more forward pass, no stored activations)."""
        flat = tf.nest.flatten(w)

        @tf.custom_gradient
        def run(x0, memory, keys, *flat_w):
            weights = tf.nest.pack_sequence_as(w, list(flat_w))
            outputs = self._xla_forward(x0, memory, keys, pad_bias, weights)

            def grad(d_out, d_align):
                return self._xla_backward(x0, memory, keys, pad_bias, weights, d_out, d_align)

            return outputs, grad

        return run(x0, memory, keys, *flat)

    def _loop_teacher_gradients(self, x0, memory, keys, pad_bias, w, d_out, d_align):
        """Gradients of `_loop_teacher`'s outputs with respect to x0, memory, keys and every loop
        weight (flattened), given the outputs' gradients: the loop run again under a tape."""
        inputs = [x0, memory, keys, *tf.nest.flatten(w)]
        with tf.GradientTape() as tape:
            tape.watch(inputs)
            out, align = self._loop_teacher(x0, memory, keys, pad_bias, w)
        grads = tape.gradient([out, align], inputs, output_gradients=[d_out, d_align])
        return [tf.zeros_like(x) if g is None else g for x, g in zip(inputs, grads)]

    def _loop_teacher(self, x0, memory, keys, pad_bias, w):
        """The teacher-forced recurrence: x0 [S, B, 4U] (layer 0's input term of every step) ->
        (outputs [B, S, U + M], alignments [B, S, N] float32). One while loop: with XLA one program."""
        steps = tf.shape(x0)[0]
        x_ta = tf.TensorArray(x0.dtype, size=steps).unstack(x0)
        out_ta = tf.TensorArray(self.compute_dtype, size=steps)
        align_ta = tf.TensorArray(F32, size=steps)

        def body(s, state, out_ta, align_ta):
            state, out = self._step(w, x_ta.read(s), state, memory, keys, pad_bias)
            return s + 1, state, out_ta.write(s, out), align_ta.write(s, state[3])

        # maximum_iterations: the backward pass's accumulators need a fixed size under XLA.
        _, _, out_ta, align_ta = tf.while_loop(
            lambda s, *_: s < steps, body, (0, self._initial_state(memory), out_ta, align_ta), maximum_iterations=steps
        )
        return tf.transpose(out_ta.stack(), [1, 0, 2]), tf.transpose(align_ta.stack(), [1, 0, 2])

    @_no_autograph
    def postnet(self, mel_before, mel_lengths, training=False):
        """mel_before [B, T, 80] -> mel_after [B, T, 80] = mel_before + residual, 0 past mel_lengths."""
        maskf = _mask(mel_lengths, tf.shape(mel_before)[1], self.compute_dtype)[..., None]  # [B, T, 1]
        x = mel_before = mel_before * maskf
        for conv, norm in zip(self.post_convs, self.post_norms):
            x = _dropout(tf.tanh(norm(conv(x))), self.config.dropout, training) * maskf
        return (mel_before + self.post_out(x)) * maskf  # [B, T, 80]

    @_no_autograph
    def teacher_forced(self, batch, training=False):
        """Training/validation forward pass; see `decode` for the shapes. Adds mel_after [B, T, 80]."""
        ids = self.batch_speakers(batch)
        memory = self.encode(batch["tokens"], batch["token_lengths"], training, ids)
        outputs = self.decode(memory, batch["token_lengths"], batch["mels"], training, ids, batch["mel_lengths"])
        outputs["mel_after"] = self.postnet(outputs["mel_before"], batch["mel_lengths"], training)
        return outputs

    def batch_speakers(self, batch):
        """The batch's `speaker_ids` [B] (a model with voices: required), else None."""
        if not self.config.multi_speaker:
            return None
        if "speaker_ids" not in batch:
            raise ValueError(
                "this synthesis model has voices, and the batch has no `speaker_ids`: read batches with "
                "models.tasks.TtsTask.dataset, which adds them"
            )
        return batch["speaker_ids"]

    @_no_autograph
    def compute_losses(self, batch, outputs):
        """Masked losses (float32 scalars): total, mel, postnet, stop, guided_attention.

        (Not named `loss`: keras.Model's constructor sets a `loss` attribute that would shadow it.)

        Padded frames, decoder steps and characters are excluded, so padding values cannot move
        any loss. guided_attention is always reported, and added to `total` only when enabled.
        """
        c = self.config
        mels = tf.cast(batch["mels"], F32)
        t = tf.shape(mels)[1]
        maskf = _mask(batch["mel_lengths"], t, F32)  # [B, T]
        frames = tf.maximum(tf.reduce_sum(maskf), 1.0)
        err = tf.abs if c.mel_loss == "l1" else tf.square

        def mel_loss(pred):
            return tf.reduce_sum(err(tf.cast(pred, F32) - mels) * maskf[..., None]) / (frames * c.n_mels)

        bce = tf.nn.weighted_cross_entropy_with_logits(
            tf.cast(batch["stop_targets"], F32), tf.cast(outputs["stop_logits"], F32), c.stop_pos_weight
        )
        losses = dict(
            mel=mel_loss(outputs["mel_before"]),
            postnet=mel_loss(outputs["mel_after"]),
            stop=tf.reduce_sum(bce * maskf) / frames,
        )
        # Guided attention: penalty W[s, n] = 1 - exp(-(n/N - s/S)^2 / 2g^2) on the weights, summed
        # over characters, averaged over real decoder steps (so it reads as "off-diagonal mass").
        align = tf.cast(outputs["alignments"], F32)  # [B, S, N]
        steps_len = (batch["mel_lengths"] + c.reduction_factor - 1) // c.reduction_factor
        s_mask = _mask(steps_len, tf.shape(align)[1], F32)  # [B, S]
        n_mask = _mask(batch["token_lengths"], tf.shape(align)[2], F32)  # [B, N]
        s_pos = tf.range(tf.shape(align)[1], dtype=F32)[None, :] / tf.cast(steps_len, F32)[:, None]
        n_pos = tf.range(tf.shape(align)[2], dtype=F32)[None, :] / tf.cast(batch["token_lengths"], F32)[:, None]
        penalty = 1.0 - tf.exp(-tf.square(n_pos[:, None, :] - s_pos[:, :, None]) / (2 * c.guided_attention_sigma**2))
        losses["guided_attention"] = tf.reduce_sum(align * penalty * s_mask[:, :, None] * n_mask[:, None, :]) / (
            tf.maximum(tf.reduce_sum(s_mask), 1.0)
        )
        total = losses["mel"] + losses["postnet"] + losses["stop"]
        if c.alignment == "durations":
            # The encoder's frames per character toward the frames the search gave it (what makes the
            # next search better), and the predicted durations toward the searched ones (in steps).
            step_mask = s_mask[..., None]
            losses["alignment"] = tf.reduce_sum(
                tf.square(outputs["aligned_means"] - outputs["grouped_targets"]) * step_mask
            ) / (tf.maximum(tf.reduce_sum(s_mask), 1.0) * c.reduction_factor * c.n_mels)
            losses["duration"] = tf.reduce_sum(
                tf.square(outputs["predicted_durations"] - outputs["durations"]) * n_mask
            ) / tf.maximum(tf.reduce_sum(n_mask), 1.0)
            return dict(total=total + losses["alignment"] + c.duration_weight * losses["duration"], **losses)
        if c.guided_attention:
            total += c.guided_attention_weight * losses["guided_attention"]
        return dict(total=total, **losses)

    @_no_autograph
    def infer(self, tokens, token_lengths, max_steps, stop_threshold=0.5, speaker_ids=None):
        """Autoregressive synthesis. tokens [B, N] int32, token_lengths [B]; max_steps decoder steps;
        speaker_ids [B] int32: the voice of each sentence (a model with voices; None: the default voice).

        A sequence ends at the first frame whose stop probability exceeds `stop_threshold`; the loop
        ends when all have, or after `max_steps` steps (`max_steps * r` frames). Returns float32 mels
        [B, T, 80] (post-net output, 0 past each length), mels_before [B, T, 80], lengths [B] int32 and
        alignments [B, steps, N]. Runs eagerly or inside `tf.function(..., reduce_retracing=True)`
        (`compiled_infer` is that function).
        """
        c, r = self.config, self.config.reduction_factor
        memory = self.encode(tokens, token_lengths, training=False, speaker_ids=speaker_ids)  # [B, N, M]
        if c.alignment == "durations":
            return self._infer_durations(memory, token_lengths, tf.convert_to_tensor(max_steps, tf.int32), speaker_ids)
        b = tf.shape(memory)[0]
        pad_bias = _energy_mask(token_lengths, tf.shape(memory)[1])
        keys = self.memory_keys(memory)
        voice = self.voice(speaker_ids, b)
        zeros = tf.zeros([b, 1], self.compute_dtype)
        # Per-voice terms of every step (zero without voices): decoder input [B, 4U], frames [B, r * 80].
        voice_in = self.speaker_decoder(voice) if voice is not None else zeros
        voice_out = self.speaker_frames(voice) if voice is not None else zeros
        steps, lengths, finished, frames, alignments = self._free_loop(
            memory, keys, pad_bias, self._loop_weights(), voice_in, voice_out,
            tf.convert_to_tensor(max_steps, tf.int32), tf.convert_to_tensor(stop_threshold, F32),
        )  # fmt: skip
        frames, alignments = frames[:steps], alignments[:steps]
        lengths = tf.where(finished, lengths, steps * r)
        before = tf.reshape(tf.transpose(frames, [1, 0, 2]), [b, steps * r, c.n_mels])  # [B, T, 80]
        before = before * _mask(lengths, steps * r, before.dtype)[..., None]
        return dict(
            mels=tf.cast(self.postnet(before, lengths), F32),
            mels_before=tf.cast(before, F32),
            lengths=lengths,
            alignments=tf.transpose(alignments, [1, 0, 2]),
        )  # [B, steps, N]

    def compiled_infer(self):
        """`infer` as one tf.function (the decoder loop a graph op; with `config.xla`, XLA-compiled),
        traced once for any batch and sentence length."""
        if self._compiled_infer is None:
            self._compiled_infer = tf.function(
                self.infer,
                input_signature=[
                    tf.TensorSpec([None, None], tf.int32),
                    tf.TensorSpec([None], tf.int32),
                    tf.TensorSpec([], tf.int32),
                    tf.TensorSpec([], F32),
                    tf.TensorSpec([None], tf.int32),
                ],
            )
        return self._compiled_infer

    def _loop_free(self, memory, keys, pad_bias, w, voice_in, voice_out, max_steps, stop_threshold):
        """The free-running recurrence, each step fed its own last frame. Returns (steps, lengths [B],
        finished [B], frames [steps, B, r * 80], alignments [steps, B, N])."""
        c, r = self.config, self.config.reduction_factor
        b = tf.shape(memory)[0]
        # XLA needs a TensorArray's size when it compiles: max_steps (a compile-time constant there).
        xla = c.xla
        tas = [tf.TensorArray(d, size=max_steps if xla else 0, dynamic_size=not xla) for d in (self.compute_dtype, F32)]

        def body(s, frame, state, finished, lengths, frame_ta, align_ta):
            fed = self._prenet(frame, c.prenet_dropout_at_inference) if c.decoder_feedback else self._no_feedback(frame)
            x0 = self.lstm_in[0](fed) + voice_in  # [B, 4U]
            state, out = self._step(w, x0, state, memory, keys, pad_bias)
            frames = self.frame_proj(out) + voice_out  # [B, r * 80]
            stops = self.stop_proj(out)  # [B, r]
            hit = tf.sigmoid(tf.cast(stops, F32)) > stop_threshold  # [B, r]
            first = tf.argmax(tf.cast(hit, tf.int32), axis=-1, output_type=tf.int32)
            stop_now = tf.reduce_any(hit, -1) & ~finished
            lengths = tf.where(stop_now, s * r + first + 1, lengths)
            return (
                s + 1,
                frames[:, -c.n_mels :],
                state,
                finished | stop_now,
                lengths,
                frame_ta.write(s, frames),
                align_ta.write(s, state[3]),
            )

        init = (
            0,
            tf.zeros([b, c.n_mels], self.compute_dtype),
            self._initial_state(memory),
            tf.zeros([b], tf.bool),
            tf.zeros([b], tf.int32),
            *tas,
        )
        steps, _, _, finished, lengths, frame_ta, align_ta = tf.while_loop(
            lambda s, _f, _st, finished, *_: (s < max_steps) & ~tf.reduce_all(finished), body, init
        )
        # [steps or, under XLA, max_steps, B, ...]: the caller keeps the first `steps`
        return steps, lengths, finished, frame_ta.stack(), align_ta.stack()


def monotonic_alignment(cost: np.ndarray, step_lengths: np.ndarray, token_lengths: np.ndarray) -> np.ndarray:
    """Monotonic alignment search: for each utterance, the path of least total `cost` [B, S, N]
    through (decoder step, character) that starts at character 0, ends at the last character, and
    from one step to the next stays or moves on by one or two characters (a silent letter or a space
    may take no step of its own). Returns int32 [B, S]: each step's character (the last one past
    the utterance's steps). Dynamic programming over steps, every utterance at once: a Python loop
    of S numpy operations (Glow-TTS ships it in Cython; a few milliseconds per batch here)."""
    cost = np.asarray(cost, np.float64)
    b, s_max, n_max = cost.shape
    best = np.full((b, n_max), np.inf)
    best[:, 0] = cost[:, 0, 0]
    moves = np.zeros((b, s_max, n_max), np.int8)  # 0, 1 or 2 characters moved to reach (s, n)
    padded = np.full((b, n_max + 2), np.inf)
    for s in range(1, s_max):
        padded[:, 2:] = best
        options = np.stack([padded[:, 2:], padded[:, 1:-1], padded[:, :-2]])  # stay, +1, +2: [3, B, N]
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


def build_tts(config: TtsConfig) -> Tacotron:
    """A Tacotron with every variable created (so models/checkpoint.py can restore into it)."""
    model = Tacotron(config)
    r = config.reduction_factor
    dummy = dict(
        tokens=tf.ones([1, 3], tf.int32),
        token_lengths=tf.constant([3]),
        mels=tf.zeros([1, r + 1, config.n_mels]),
        mel_lengths=tf.constant([r + 1]),
        speaker_ids=tf.zeros([1], tf.int32),
    )
    model.teacher_forced(dummy, training=False)
    model.built = True  # every variable exists now; lets Keras count and summarize them
    return model


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
