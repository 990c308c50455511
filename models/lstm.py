"""Bidirectional LSTMs over Keras' own LSTM layers, with a faster path on a CPU.

On a GPU Keras runs an LSTM as cuDNN's fused kernel. On a CPU it runs a `tf.while_loop` that
multiplies every timestep's input by the input kernel (two thirds of the layer's FLOPs, as
[batch, in] matrices) and whose gradient multiplies by transposed weights at every step (a
transposed small matmul runs at half the speed of a plain one here). The CPU path here computes
the same function from the same variables:

- the input projection of every timestep and both directions as one matmul before the loop
  ([batch * frames, in] x [in, 8 * units]), only h x U inside it;
- both directions in one loop (a batched matmul over [2, batch, units]);
- a hand-written gradient of the recurrence: the gate derivatives that need no recurrence are
  computed for all timesteps at once after the forward loop; the backward loop multiplies by the
  recurrent kernel transposed once outside it; the weight gradients are one matmul each after it.

TensorFlow's own fused CPU kernel (`BlockLSTM`) was no faster than Keras' loop on this model's
shapes, and `BlockLSTMV2` (Keras' gate order) registers the gradient of the other gate order.

Nothing about the layers changes: the variables, their names and their initial values are Keras'
(a checkpoint trained on either path loads into the other), and with a GPU the layers are called
as they are, so they stay eligible for cuDNN.
"""

from __future__ import annotations

import keras
import numpy as np
import tensorflow as tf

# `lstm` settings of the model configs: which path runs the LSTMs.
KERNELS = ("auto", "keras", "fused")


def has_gpu() -> bool:
    """Whether this process runs on a GPU. Reads the visible devices without initializing
    TensorFlow's runtime, which would fix them before a Horovod rank pins its local GPU."""
    return bool(tf.config.get_visible_devices("GPU"))


def use_fused(kernel: str) -> bool:
    """Whether `kernel` ("auto": the fused path without a GPU, Keras' (cuDNN) with one; "keras";
    "fused") runs the CPU path."""
    if kernel not in KERNELS:
        raise ValueError(f"unknown LSTM kernel {kernel!r}: choose one of {', '.join(KERNELS)}")
    return kernel == "fused" or (kernel == "auto" and not has_gpu())


def _fusable(layer: keras.layers.LSTM) -> bool:
    """The configurations the CPU path computes exactly (the ones that are cuDNN-eligible)."""
    cell = layer.cell
    return (
        cell.activation is keras.activations.tanh
        and cell.recurrent_activation is keras.activations.sigmoid
        and cell.use_bias
        and not cell.dropout
        and not cell.recurrent_dropout
        and layer.return_sequences
        and not (layer.go_backwards or layer.stateful or layer.unroll or layer.return_state)
    )


def bidirectional(fw: keras.layers.LSTM, bw: keras.layers.LSTM, x, lengths, kernel: str = "auto", training=False):
    """Both directions of a right-padded batch: x [B, T, in], lengths [B] -> [B, T, 2 * units].

    The backward LSTM reads each sequence reversed within its own length (`tf.reverse_sequence`),
    so padding is never read first and no mask is needed; the forward outputs past a length are
    garbage that later layers and losses ignore. Both paths compute the same function.
    """
    reverse = lambda t: tf.reverse_sequence(t, lengths, seq_axis=1, batch_axis=0)  # noqa: E731
    # TensorFlow's LSTM cell gradient has float32 and float16 kernels (bfloat16 runs Keras' path).
    if not (use_fused(kernel) and _fusable(fw) and _fusable(bw) and x.dtype in (tf.float32, tf.float16)):
        out_fw = fw(x, training=training)  # [B, T, units]
        out_bw = reverse(bw(reverse(x), training=training))  # [B, T, units]
        return tf.concat([out_fw, out_bw], axis=-1)
    for layer in (fw, bw):
        if not layer.built:  # Keras' build opens the layer's name scope: the variables get their usual paths
            layer.build(x.shape)
    units = fw.cell.units
    # Keras orders the gates i, f, c, o; TensorFlow's LSTM cell kernels (the gradient below) i, c, f, o.
    order = np.concatenate([np.arange(0, units), np.arange(2 * units, 3 * units), np.arange(units, 2 * units)])
    order = np.concatenate([order, np.arange(3 * units, 4 * units)])
    weights = lambda name: [tf.gather(tf.cast(getattr(l.cell, name), x.dtype), order, axis=-1) for l in (fw, bw)]  # noqa: E731,E741
    kernels, recurrent, biases = weights("kernel"), weights("recurrent_kernel"), weights("bias")
    batch, frames = tf.shape(x)[0], tf.shape(x)[1]
    # Every frame's input projection before the loop, time-major: [T*B, in] x [in, 4u] per direction
    # (two matmuls, not one of 8u and two slices: a slice's gradient is a padded copy of the whole).
    x_t = tf.reshape(tf.transpose(x, [1, 0, 2]), [-1, x.shape[-1]])  # [T*B, in]
    proj = [tf.reshape(tf.matmul(x_t, k) + b, [frames, batch, 4 * units]) for k, b in zip(kernels, biases)]
    reverse_t = lambda t: tf.reverse_sequence(t, lengths, seq_axis=0, batch_axis=1)  # noqa: E731
    h_fw, h_bw = recurrence(proj[0], reverse_t(proj[1]), *recurrent)  # [T, B, u] each
    return tf.transpose(tf.concat([h_fw, reverse_t(h_bw)], axis=-1), [1, 0, 2])  # [B, T, 2u]


@tf.custom_gradient
def recurrence(steps_fw, steps_bw, recurrent_fw, recurrent_bw):
    """The LSTM recurrence of two directions in one loop, from zero states, gates ordered i, c, f, o.

    steps_* [T, B, 4u]: x_t W + b of every timestep (the input projection, done outside);
    recurrent_* [u, 4u] -> h_fw, h_bw [T, B, u].
    """
    steps, recurrent = (steps_fw, steps_bw), (recurrent_fw, recurrent_bw)
    frames, batch = tf.shape(steps_fw)[0], tf.shape(steps_fw)[1]
    units = recurrent_fw.shape[0]
    dtype = steps_fw.dtype
    zeros = tf.zeros([batch, units], dtype)  # [B, u]
    # Per direction, what the gradient reads: i, c~, f, o (activated), c and tanh(c), h; [T, B, u] each.
    names = ("i", "ci", "f", "o", "cs", "co", "h")
    arrays = lambda: {n: tf.TensorArray(dtype, size=frames) for n in names}  # noqa: E731

    def step(t, states, saved):
        new_states, new_saved = [], []
        for d in range(2):
            h, c = states[d]
            z = steps[d][t] + tf.matmul(h, recurrent[d])  # [B, 4u]
            i, ci, f, o = tf.split(z, 4, axis=-1)
            i, ci, f, o = tf.sigmoid(i), tf.tanh(ci), tf.sigmoid(f), tf.sigmoid(o)
            c = f * c + i * ci
            co = tf.tanh(c)
            h = o * co
            new_states.append((h, c))
            values = dict(i=i, ci=ci, f=f, o=o, cs=c, co=co, h=h)
            new_saved.append({n: saved[d][n].write(t, values[n]) for n in names})
        return t + 1, new_states, new_saved

    start = [(zeros, zeros), (zeros, zeros)]
    _, _, saved = tf.while_loop(lambda t, *_: t < frames, step, [0, start, [arrays(), arrays()]])
    saved = [{n: ta.stack() for n, ta in part.items()} for part in saved]  # [T, B, u] each

    def grad(dh_fw, dh_bw):
        # dh_* [T, B, u]: the loss' gradient with respect to every output h_t. Per step and direction
        # TensorFlow's fused LSTM cell gradient (LSTMBlockCellGrad: the gates' and the previous
        # cell's gradients in one op), then one matmul back through the recurrent kernel.
        dh_out = (dh_fw, dh_bw)
        no_input = tf.zeros([batch, 0], dtype)  # the cell op's x: the input projection is outside
        no_peephole, no_bias = tf.zeros([units], dtype), tf.zeros([4 * units], dtype)
        recurrent_t = [tf.transpose(r) for r in recurrent]  # [4u, u], transposed once
        c_prev = [tf.concat([zeros[None], part["cs"][:-1]], 0) for part in saved]  # [T, B, u]

        def back(t, carry, dzs):
            new_carry, new_dzs = [], []
            for d in range(2):
                dh_next, dc_next = carry[d]
                part = saved[d]
                dc_prev, dz, _, _, _ = tf.raw_ops.LSTMBlockCellGrad(
                    x=no_input, cs_prev=c_prev[d][t], h_prev=zeros, w=recurrent[d], wci=no_peephole,
                    wcf=no_peephole, wco=no_peephole, b=no_bias, i=part["i"][t], cs=part["cs"][t],
                    f=part["f"][t], o=part["o"][t], ci=part["ci"][t], co=part["co"][t], cs_grad=dc_next,
                    h_grad=dh_out[d][t] + dh_next, use_peephole=False,
                )  # fmt: skip
                new_carry.append((tf.matmul(dz, recurrent_t[d]), dc_prev))  # [B, u] each
                new_dzs.append(dzs[d].write(t, dz))  # dz [B, 4u]
            return t - 1, new_carry, new_dzs

        init = [(zeros, zeros), (zeros, zeros)]
        dzs = [tf.TensorArray(dtype, size=frames) for _ in range(2)]
        _, _, dzs = tf.while_loop(lambda t, *_: t >= 0, back, [frames - 1, init, dzs])
        d_steps = [ta.stack() for ta in dzs]  # [T, B, 4u] each: the gradient of `steps`
        d_recurrent = []
        for d in range(2):
            h_prev = tf.concat([zeros[None], saved[d]["h"][:-1]], 0)  # [T, B, u]
            flat = lambda t: tf.reshape(t, [-1, t.shape[-1]])  # noqa: E731
            d_recurrent.append(tf.matmul(flat(h_prev), flat(d_steps[d]), transpose_a=True))  # [u, 4u]
        return (*d_steps, *d_recurrent)

    return (saved[0]["h"], saved[1]["h"]), grad
