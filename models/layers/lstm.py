"""Bidirectional LSTMs over Keras' own LSTM layers, with a faster path on a CPU.

On a GPU Keras runs an LSTM as cuDNN's fused kernel. On a CPU it runs a `tf.while_loop` of small
ops whose gradient, built by autodiff, is a second loop of small ops (with transposed matmuls)
at every timestep. The CPU path here computes the same function from the same variables:

- the forward pass of each direction is TensorFlow's fused CPU kernel `BlockLSTM` (one op for all
  timesteps, which keeps every gate's activation for the gradient);
- its gradient is a loop that carries only the recurrence: per step TensorFlow's fused LSTM cell
  gradient (`LSTMBlockCellGrad`) and one matmul back through the recurrent kernel; the input's and
  the weights' gradients are one large matmul each after the loop. (`BlockLSTM`'s own gradient op
  does those as small matmuls at every step, and `BlockLSTMV2`, which has Keras' gate order, is
  registered with the gradient of the other gate order.)
- those two large matmuls may run in bfloat16 (`grad_matmuls`): inputs rounded to bfloat16, products
  summed in float32 by oneDNN, the result rounded to bfloat16 and cast back, as a mixed-precision
  step computes every gradient. On a CPU with native bfloat16 dot products (`avx512_bf16`,
  `amx_bf16`) oneDNN runs them about twice as fast as float32; everything else stays float32.

Nothing about the layers changes: the variables, their names and their initial values are Keras'
(a checkpoint trained on either path loads into the other), and with a GPU the layers are called
as they are, so they stay eligible for cuDNN.
"""

from __future__ import annotations

import keras
import tensorflow as tf

from common import runtime

# `lstm` settings of the model configs: which path runs the LSTMs.
KERNELS = ("auto", "keras", "fused")
# `lstm_grad_matmuls` settings: the dtype of the CPU path's two large gradient matmuls. "auto":
# bfloat16 where the CPU has native bfloat16 dot products (BF16_FLAGS), float32 elsewhere (oneDNN
# would emulate them, slower than float32).
GRAD_MATMULS = ("auto", "float32", "bfloat16")
BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})


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


def grad_matmul_dtype(setting: str) -> tf.DType:
    """The dtype of the CPU path's large gradient matmuls for a `lstm_grad_matmuls` setting."""
    if setting not in GRAD_MATMULS:
        raise ValueError(f"unknown lstm_grad_matmuls {setting!r}: choose one of {', '.join(GRAD_MATMULS)}")
    if setting == "auto":
        return tf.bfloat16 if runtime.cpu_info()[1] & BF16_FLAGS else tf.float32
    return tf.as_dtype(setting)


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


def bidirectional(
    fw: keras.layers.LSTM,
    bw: keras.layers.LSTM,
    x,
    lengths,
    kernel: str = "auto",
    training=False,
    grad_matmuls="float32",
):
    """Both directions of a right-padded batch: x [B, T, in], lengths [B] -> [B, T, 2 * units].

    The backward LSTM reads each sequence reversed within its own length (`tf.reverse_sequence`),
    so padding is never read first and no mask is needed; the forward outputs past a length are
    garbage that later layers and losses ignore. Both paths compute the same function.
    `grad_matmuls` (GRAD_MATMULS): the CPU path's large gradient matmuls' dtype.
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
    # Keras orders the gates i, f, c, o; TensorFlow's LSTM kernels i, c, f, o. Split and concatenated,
    # not gathered: a gather's gradient is sparse, and Horovod would allgather it.
    icfo = lambda gates: tf.concat([gates[i] for i in (0, 2, 1, 3)], axis=-1)  # noqa: E731
    weights, biases = [], []
    for layer in (fw, bw):
        cell = layer.cell
        kernel = tf.concat([cell.kernel, cell.recurrent_kernel], axis=0)  # [in + u, 4u]
        weights.append(icfo(tf.split(tf.cast(kernel, x.dtype), 4, axis=1)))
        biases.append(icfo(tf.split(tf.cast(cell.bias, x.dtype), 4)))
    reverse_t = lambda t: tf.reverse_sequence(t, lengths, seq_axis=0, batch_axis=1)  # noqa: E731
    x_t = tf.transpose(x, [1, 0, 2])  # [T, B, in]
    recurrence = RECURRENCE[grad_matmul_dtype(grad_matmuls)]
    h_fw, h_bw = recurrence(x_t, reverse_t(x_t), *weights, *biases)  # [T, B, u] each
    return tf.transpose(tf.concat([h_fw, reverse_t(h_bw)], axis=-1), [1, 0, 2])  # [B, T, 2u]


def _forward(x, w, b):
    """One direction over a whole batch from zero states: TensorFlow's fused CPU kernel (`BlockLSTM`,
    one op for all timesteps; gates i, c, f, o). x [T, B, in], w [in + u, 4u], b [4u] -> what the
    gradient reads, a dict of [T, B, u]: i, ci (the cell input), f, o (activated), cs (the cell),
    co (its tanh), h."""
    units = w.shape[1] // 4
    zeros, no_peephole = tf.zeros([tf.shape(x)[1], units], x.dtype), tf.zeros([units], x.dtype)
    outputs = tf.raw_ops.BlockLSTM(
        seq_len_max=tf.cast(tf.shape(x)[0], tf.int64),
        x=x,
        cs_prev=zeros,
        h_prev=zeros,
        w=w,
        wci=no_peephole,
        wcf=no_peephole,
        wco=no_peephole,
        b=b,
        forget_bias=0.0,
        cell_clip=-1.0,
        use_peephole=False,
    )
    return dict(zip(("i", "cs", "f", "o", "ci", "co", "h"), outputs))


def _matmul(a, b, dtype: tf.DType | None, **kwargs):
    """a @ b computed in `dtype` (None: a's) and returned in a's dtype (bfloat16: oneDNN sums the
    products in float32)."""
    if dtype is None or dtype == a.dtype:
        return tf.matmul(a, b, **kwargs)
    return tf.cast(tf.matmul(tf.cast(a, dtype), tf.cast(b, dtype), **kwargs), a.dtype)


def _backward(x, w, saved, dh_out, matmul_dtype: tf.DType | None):
    """The gradients of one direction (see _forward) given dh_out [T, B, u], the loss' gradient with
    respect to every output h_t -> dx [T, B, in], dw [in + u, 4u], db [4u].

    The loop carries only the recurrence: per step TensorFlow's fused LSTM cell gradient
    (`LSTMBlockCellGrad`: the gates' and the previous cell's gradients in one op) and one matmul back
    through the recurrent kernel. The input's and the weights' gradients are one large matmul each
    after it (TensorFlow's whole-sequence gradient op does those as small matmuls at every step),
    computed in `matmul_dtype` (None: x's).
    """
    frames, batch = tf.shape(x)[0], tf.shape(x)[1]
    units = w.shape[1] // 4
    inputs = w.shape[0] - units  # from the kernel: x's last dimension may be unknown when traced
    zeros = tf.zeros([batch, units], x.dtype)  # [B, u]
    recurrent = w[inputs:]  # [u, 4u], sliced once, not at every step
    recurrent_t = tf.transpose(recurrent)  # [4u, u], transposed once
    no_input = tf.zeros([batch, 0], x.dtype)  # the cell op's input: its projection is outside the loop
    no_peephole, no_bias = tf.zeros([units], x.dtype), tf.zeros([4 * units], x.dtype)
    c_prev = tf.concat([zeros[None], saved["cs"][:-1]], 0)  # [T, B, u]
    h_prev = tf.concat([zeros[None], saved["h"][:-1]], 0)  # [T, B, u]

    def step(t, dh_next, dc_next, dzs):
        dc_prev, dz, _, _, _ = tf.raw_ops.LSTMBlockCellGrad(
            x=no_input,
            cs_prev=c_prev[t],
            h_prev=zeros,
            w=recurrent,
            wci=no_peephole,
            wcf=no_peephole,
            wco=no_peephole,
            b=no_bias,
            i=saved["i"][t],
            cs=saved["cs"][t],
            f=saved["f"][t],
            o=saved["o"][t],
            ci=saved["ci"][t],
            co=saved["co"][t],
            cs_grad=dc_next,
            h_grad=dh_out[t] + dh_next,
            use_peephole=False,
        )
        return t - 1, tf.matmul(dz, recurrent_t), dc_prev, dzs.write(t, dz)  # dz [B, 4u]

    dzs = tf.TensorArray(x.dtype, size=frames)
    _, _, _, dzs = tf.while_loop(lambda t, *_: t >= 0, step, [frames - 1, zeros, zeros, dzs])
    dz = tf.reshape(dzs.stack(), [-1, 4 * units])  # [T*B, 4u]
    xh = tf.concat([tf.reshape(x, [-1, inputs]), tf.reshape(h_prev, [-1, units])], axis=1)  # [T*B, in + u]
    dw = _matmul(xh, dz, matmul_dtype, transpose_a=True)  # [in + u, 4u]
    dx = tf.reshape(_matmul(dz, w[:inputs], matmul_dtype, transpose_b=True), [frames, batch, inputs])  # [T, B, in]
    return dx, dw, tf.reduce_sum(dz, axis=0)


def _recurrence(matmul_dtype: tf.DType | None):
    """`recurrence` whose gradient computes its large matmuls in `matmul_dtype` (None: the inputs'
    dtype). A traced custom_gradient function takes tensors only, so there is one per dtype."""

    @tf.custom_gradient
    def recurrence(x_fw, x_bw, w_fw, w_bw, b_fw, b_bw):
        """Two directions of an LSTM, each over its own time-major input from zero states, gates
        ordered i, c, f, o: x_* [T, B, in], w_* [in + u, 4u] (input kernel over recurrent kernel),
        b_* [4u] -> h_fw, h_bw [T, B, u]."""
        directions = ((x_fw, w_fw, b_fw), (x_bw, w_bw, b_bw))
        saved = [_forward(*d) for d in directions]

        def grad(dh_fw, dh_bw):
            (dx_fw, dw_fw, db_fw), (dx_bw, dw_bw, db_bw) = [
                _backward(x, w, part, dh, matmul_dtype)
                for (x, w, _), part, dh in zip(directions, saved, (dh_fw, dh_bw))
            ]
            return dx_fw, dx_bw, dw_fw, dw_bw, db_fw, db_bw

        return (saved[0]["h"], saved[1]["h"]), grad

    return recurrence


# grad_matmul_dtype's answer -> the recurrence (float32: every matmul in the inputs' dtype, float16 too).
RECURRENCE = {tf.float32: _recurrence(None), tf.bfloat16: _recurrence(tf.bfloat16)}
