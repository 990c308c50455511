"""The attention Tacotron (`alignment: attention`): Tacotron 2-style synthesis, characters ->
normalized 80-bin log-mel frames, the alignment learned by attention.

When to use it: it needs no alignment search and is the model most published work builds on, but
its attention must first learn to walk the text, which on the demo's corpus and budget it does not
do well enough to be intelligible: the demo trains the durations model (models/tts/durations.py).

Encoder (models/tts/base.py) -> decoder: pre-net -> LSTM(s) with location-sensitive attention
(Chorowski et al. 2015, as in Tacotron 2) -> `r` mel frames and `r` stop logits per step ->
convolutional post-net residual. Keras 3 runs no AutoGraph on `call`, so both decoder loops are
explicit `tf.while_loop`s in plain methods; whatever does not depend on the recurrence (pre-net
over all teacher frames, memory keys, output projections) runs outside.

Compiled decoder: inside `tf.function` a decoder pass is one graph op, not one Python step per
frame; `config.xla` also compiles the loop with XLA (one fused program per shape, what a GPU needs
to be rid of per-op launches). `compiled_infer` is synthesis as one such function.
"""

from __future__ import annotations

import tensorflow as tf
from keras import layers

from models.tts.base import F32, SynthesisModel, TtsConfig, dropout, mask, no_autograph


def _energy_mask(token_lengths, n):
    """[B, N] float32 added to attention energies: 0 on characters, -1e9 on padding."""
    return (1.0 - mask(token_lengths, n, F32)) * -1e9


def _forget_bias(shape, dtype=None):
    """LSTM bias for gates ordered [input, forget, output, candidate]: 1 on the forget gate
    (Jozefowicz et al. 2015), so that early in training the cell keeps its memory."""
    units = shape[0] // 4
    return tf.concat([tf.zeros([units]), tf.ones([units]), tf.zeros([2 * units])], 0)


def attention_decoder_layers(c: TtsConfig) -> dict:
    """The attention decoder's layers for TtsConfig `c`, by attribute name (a tuple: a stack), in the
    order their initializers draw seeds. Also what `DurationsTts` makes and drops (models/tts/durations.py)."""
    u, a = c.decoder_lstm_units, c.attention_dim
    n_dec = range(c.decoder_lstm_layers)
    return dict(
        memory_keys=layers.Dense(a, name="memory_keys"),  # its bias is the `b` of the energy tanh
        prenet=tuple(layers.Dense(n, activation="relu", name=f"prenet_{i}") for i, n in enumerate(c.prenet_units)),
        # Each decoder LSTM splits its kernel: `lstm_in` reads the layer below (the pre-net for
        # layer 0, precomputable over all teacher frames), `lstm_rec` reads [context, own h].
        lstm_in=tuple(layers.Dense(4 * u, bias_initializer=_forget_bias, name=f"lstm_in_{i}") for i in n_dec),
        lstm_rec=tuple(layers.Dense(4 * u, use_bias=False, name=f"lstm_rec_{i}") for i in n_dec),
        query=layers.Dense(a, use_bias=False, name="query"),
        location_conv=layers.Conv1D(
            c.location_filters, c.location_kernel, padding="same", use_bias=False, name="location_conv"
        ),
        location_dense=layers.Dense(a, use_bias=False, name="location_dense"),
        energy=layers.Dense(1, use_bias=False, name="energy"),
    )


def _recomputed(forward, backward, x0, memory, keys, pad_bias, w):
    """forward(x0, memory, keys, pad_bias, w) with backward(..., d_out, d_align) as its gradient.

    The gradient of a compiled while loop needs its per-step intermediates, which TensorFlow
    cannot hand from an XLA program to the graph around it (TensorLists do not cross that
    boundary); so the backward program runs the loop again and differentiates it inside XLA
    (recomputation: one more forward pass, no stored activations)."""
    flat = tf.nest.flatten(w)

    @tf.custom_gradient
    def run(x0, memory, keys, *flat_w):
        weights = tf.nest.pack_sequence_as(w, list(flat_w))
        outputs = forward(x0, memory, keys, pad_bias, weights)

        def grad(d_out, d_align):
            return backward(x0, memory, keys, pad_bias, weights, d_out, d_align)

        return outputs, grad

    return run(x0, memory, keys, *flat)


class AttentionTacotron(SynthesisModel):
    """`teacher_forced`, `compute_losses` and `infer` are what trainers call."""

    def __init__(self, config: TtsConfig):
        super().__init__(config)
        c = config
        u, m = c.decoder_lstm_units, 2 * c.encoder_lstm_units
        # XLA: the decoder loops as compiled functions (built once: a tf.function per instance).
        self._loop = self._loop_teacher_xla if c.xla else self._loop_teacher
        self._free_loop = tf.function(self._loop_free, jit_compile=True) if c.xla else self._loop_free
        self._xla_forward = tf.function(self._loop_teacher, jit_compile=True)
        self._xla_backward = tf.function(self._loop_teacher_gradients, jit_compile=True)
        # Layers used only inside the loops are built here: variables cannot be made in a loop.
        builds = [
            (self.query, (None, u)),
            (self.location_conv, (None, None, 2)),
            (self.energy, (None, None, c.attention_dim)),
            (self.location_dense, (None, None, c.location_filters)),
        ]
        builds += [(d, (None, u)) for d in self.lstm_in[1:]] + [(d, (None, m + u)) for d in self.lstm_rec]
        for layer, shape in builds:
            layer.build(shape)

    def _decoder_layers(self):
        for name, made in attention_decoder_layers(self.config).items():
            setattr(self, name, self._stack(name, made) if isinstance(made, tuple) else made)

    def _prenet(self, x, on):
        for dense in self.prenet:
            x = dropout(dense(x), self.config.prenet_dropout, on)
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

    @no_autograph
    def decode(self, memory, token_lengths, mels, training=False, speaker_ids=None, mel_lengths=None):
        """Teacher-forced decoder. memory [B, N, M], mels [B, T, 80] (T need not divide by r),
        speaker_ids [B] (a model with voices; None: the default voice).

        Returns mel_before [B, T, 80], stop_logits [B, T] and alignments [B, ceil(T / r), N] (float32).
        """
        c, r = self.config, self.config.reduction_factor
        b, t = tf.shape(mels)[0], tf.shape(mels)[1]
        grouped = self.group_frames(mels)  # [B, S, r * 80]
        steps = tf.shape(grouped)[1]
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

    def _loop_teacher_xla(self, x0, memory, keys, pad_bias, w):
        """`_loop_teacher` compiled by XLA, forward and backward each one program."""
        return _recomputed(self._xla_forward, self._xla_backward, x0, memory, keys, pad_bias, w)

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

    @no_autograph
    def compute_losses(self, batch, outputs):
        """Masked losses (float32 scalars): total, mel, postnet, stop, guided_attention.

        (Not named `loss`: keras.Model's constructor sets a `loss` attribute that would shadow it.)
        guided_attention is always reported, and added to `total` only when enabled.
        """
        c = self.config
        losses = self.shared_losses(batch, outputs)
        total = losses["mel"] + losses["postnet"] + losses["stop"]
        if c.guided_attention:
            total += c.guided_attention_weight * losses["guided_attention"]
        return dict(total=total, **losses)

    @no_autograph
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
        b = tf.shape(memory)[0]
        pad_bias = _energy_mask(token_lengths, tf.shape(memory)[1])
        keys = self.memory_keys(memory)
        voice = self.voice(speaker_ids, b)
        zeros = tf.zeros([b, 1], self.compute_dtype)
        # Per-voice terms of every step (zero without voices): decoder input [B, 4U], frames [B, r * 80].
        voice_in = self.speaker_decoder(voice) if voice is not None else zeros
        voice_out = self.speaker_frames(voice) if voice is not None else zeros
        steps, lengths, finished, frames, alignments = self._free_loop(
            memory,
            keys,
            pad_bias,
            self._loop_weights(),
            voice_in,
            voice_out,
            tf.convert_to_tensor(max_steps, tf.int32),
            tf.convert_to_tensor(stop_threshold, F32),
        )
        frames, alignments = frames[:steps], alignments[:steps]
        lengths = tf.where(finished, lengths, steps * r)
        before = tf.reshape(tf.transpose(frames, [1, 0, 2]), [b, steps * r, c.n_mels])  # [B, T, 80]
        before = before * mask(lengths, steps * r, before.dtype)[..., None]
        return dict(
            mels=tf.cast(self.postnet(before, lengths), F32),
            mels_before=tf.cast(before, F32),
            lengths=lengths,
            alignments=tf.transpose(alignments, [1, 0, 2]),
        )  # [B, steps, N]

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
