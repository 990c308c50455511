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
    if not (use_fused(kernel) and _fusable(fw) and _fusable(bw)):
        out_fw = fw(x, training=training)  # [B, T, units]
        out_bw = reverse(bw(reverse(x), training=training))  # [B, T, units]
        return tf.concat([out_fw, out_bw], axis=-1)
    for layer in (fw, bw):
        if not layer.built:  # Keras' build opens the layer's name scope: the variables get their usual paths
            layer.build(x.shape)
    dtype = x.dtype
    weights = lambda name: [tf.cast(getattr(layer.cell, name), dtype) for layer in (fw, bw)]  # noqa: E731
    kernels, recurrent, biases = weights("kernel"), weights("recurrent_kernel"), weights("bias")
    units = fw.cell.units
    batch, frames = tf.shape(x)[0], tf.shape(x)[1]
    # One matmul projects every frame for both directions: [B*T, in] x [in, 8u].
    proj = tf.matmul(tf.reshape(x, [-1, x.shape[-1]]), tf.concat(kernels, axis=1)) + tf.concat(biases, 0)
    proj = tf.reshape(proj, [batch, frames, 2, 4 * units])  # [B, T, 2, 4u]
    proj_fw, proj_bw = proj[:, :, 0], reverse(proj[:, :, 1])  # [B, T, 4u] each, bw reversed per sequence
    steps = tf.transpose(tf.stack([proj_fw, proj_bw]), [2, 0, 1, 3])  # [T, 2, B, 4u]
    h = recurrence(steps, tf.stack(recurrent))  # [T, 2, B, u]
    h = tf.transpose(h, [1, 2, 0, 3])  # [2, B, T, u]
    return tf.concat([h[0], reverse(h[1])], axis=-1)  # [B, T, 2u]


@tf.custom_gradient
def recurrence(steps, recurrent):
    """The LSTM recurrence of D directions at once, from zero states, Keras' gate order (i, f, c, o).

    steps [T, D, B, 4u]: x_t W + b of every timestep (the input projection, done outside);
    recurrent [D, u, 4u] -> h [T, D, B, u].
    """
    frames, directions, batch = tf.shape(steps)[0], tf.shape(steps)[1], tf.shape(steps)[2]
    units = recurrent.shape[1]
    zeros = tf.zeros([directions, batch, units], steps.dtype)  # [D, B, u]
    ta = lambda: tf.TensorArray(steps.dtype, size=frames)  # noqa: E731

    def step(t, h, c, hs, cs, gates):
        z = steps[t] + tf.matmul(h, recurrent)  # [D, B, 4u]
        i, f, g, o = tf.split(z, 4, axis=-1)
        i, f, g, o = tf.sigmoid(i), tf.sigmoid(f), tf.tanh(g), tf.sigmoid(o)
        c = f * c + i * g
        h = o * tf.tanh(c)
        return t + 1, h, c, hs.write(t, h), cs.write(t, c), gates.write(t, tf.concat([i, f, g, o], -1))

    _, _, _, hs, cs, gates = tf.while_loop(lambda t, *_: t < frames, step, [0, zeros, zeros, ta(), ta(), ta()])
    hs, cs, gates = hs.stack(), cs.stack(), gates.stack()  # [T, D, B, u], [T, D, B, u], [T, D, B, 4u]

    def grad(dh_out):
        # dh_out [T, D, B, u]: the loss' gradient with respect to every output h_t.
        i, f, g, o = tf.split(gates, 4, axis=-1)  # [T, D, B, u] each
        c_prev = tf.concat([zeros[None], cs[:-1]], 0)  # [T, D, B, u]
        tanh_c = tf.tanh(cs)
        # What needs no recurrence, for all timesteps at once: dc_t += dh_t * dc_of_h,
        # dz_t = [dc_t * dz_of_c (i, f, c gates), dh_t * dz_of_h (o gate)].
        dc_of_h = o * (1.0 - tanh_c * tanh_c)  # [T, D, B, u]
        dz_of_c = tf.concat([g * i * (1.0 - i), c_prev * f * (1.0 - f), i * (1.0 - g * g)], -1)  # [T, D, B, 3u]
        dz_of_h = tanh_c * o * (1.0 - o)  # [T, D, B, u]
        recurrent_t = tf.transpose(recurrent, [0, 2, 1])  # [D, 4u, u], transposed once

        def back(t, dh_next, dc_next, dzs):
            dh = dh_out[t] + dh_next  # [D, B, u]
            dc = dc_next + dh * dc_of_h[t]
            dz = tf.concat([tf.tile(dc, [1, 1, 3]) * dz_of_c[t], dh * dz_of_h[t]], -1)  # [D, B, 4u]
            return t - 1, tf.matmul(dz, recurrent_t), dc * f[t], dzs.write(t, dz)

        _, _, _, dzs = tf.while_loop(lambda t, *_: t >= 0, back, [frames - 1, zeros, zeros, ta()])
        dz = dzs.stack()  # [T, D, B, 4u]: the gradient of `steps`
        h_prev = tf.concat([zeros[None], hs[:-1]], 0)  # [T, D, B, u]
        flat = lambda t: tf.reshape(tf.transpose(t, [1, 0, 2, 3]), [directions, -1, t.shape[-1]])  # noqa: E731
        d_recurrent = tf.matmul(flat(h_prev), flat(dz), transpose_a=True)  # [D, u, 4u]
        return dz, d_recurrent

    return hs, grad
