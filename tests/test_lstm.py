"""models/layers/lstm.py's CPU path computes what Keras' LSTM path computes, from the same variables: the
outputs, the CTC loss and every gradient agree within float tolerance, and a checkpoint trained on
one path loads into a model that runs the other (the cuDNN-eligible layers, unchanged)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import tensorflow as tf

from models.asr import network as asr
from models.layers import lstm
from models.training import checkpoint
from models.tts import network as tts
from models.tts.task import TtsTask
from tests.test_tts import TINY, synthetic_batch

CONFIG = asr.AsrConfig(feature_dim=13, vocab_size=12, num_layers=2, units=16, projection=8, dropout=0.0)


def batch(seed: int = 0, size: int = 5, frames: int = 40, tokens: int = 6):
    rng = np.random.default_rng(seed)
    lengths = np.array([frames] + list(rng.integers(frames // 2, frames, size - 1)), np.int32)
    feats = rng.normal(size=[size, frames, CONFIG.feature_dim]).astype(np.float32)
    labels = rng.integers(1, CONFIG.vocab_size, [size, tokens]).astype(np.int32)
    labels[1, 1] = labels[1, 0]  # a repeat: needs a blank between
    label_lengths = np.array([tokens] + list(rng.integers(1, tokens + 1, size - 1)), np.int32)
    return tf.constant(feats), tf.constant(lengths), tf.constant(labels), tf.constant(label_lengths)


def twin(config: asr.AsrConfig, kernel: str, source=None) -> asr.AcousticModel:
    model = asr.build_asr(dataclasses.replace(config, lstm=kernel))
    if source is not None:
        model.set_weights(source.get_weights())
    return model


def loss_and_grads(model, ctc, feats, lengths, labels, label_lengths):
    """The CTC loss of `ctc` (asr's dense or sparse labels) and its gradients, as one graph."""

    @tf.function
    def run():
        with tf.GradientTape() as tape:
            logits, out_lengths = model(feats, lengths, training=True)
            per_utt = ctc(logits, out_lengths, labels, label_lengths)
            loss = tf.reduce_mean(per_utt)
        return loss, tape.gradient(loss, model.trainable_variables)

    return run()


def test_every_kernel_setting_is_checked():
    assert lstm.use_fused("fused") and not lstm.use_fused("keras")
    assert lstm.use_fused("auto") == (not tf.config.list_physical_devices("GPU"))
    with pytest.raises(ValueError, match="unknown LSTM kernel 'cudnn'"):
        lstm.use_fused("cudnn")


def test_both_paths_build_the_same_variables():
    keras_model, fused_model = twin(CONFIG, "keras"), twin(CONFIG, "fused")
    names = lambda m: checkpoint.variable_names(m.weights, owners=(m.name,))  # noqa: E731
    assert names(keras_model) == names(fused_model)
    assert names(keras_model)[0] == "blstm0/fw/lstm_cell/kernel"
    assert [v.shape for v in keras_model.weights] == [v.shape for v in fused_model.weights]


def test_loss_and_gradients_equal_the_keras_path():
    # Keras' LSTM loop with the dense-label CTC graph (the GPU's path) against the fused recurrence
    # with the C++ CTC kernel (the CPU's path): one model's weights, one batch.
    keras_model = twin(CONFIG, "keras")
    fused_model = twin(CONFIG, "fused", keras_model)
    data = batch()
    want_loss, want_grads = loss_and_grads(keras_model, asr._ctc_dense, *data)
    got_loss, got_grads = loss_and_grads(fused_model, asr._ctc_sparse, *data)
    np.testing.assert_allclose(got_loss.numpy(), want_loss.numpy(), rtol=1e-5)
    assert len(got_grads) == len(want_grads) == len(keras_model.trainable_variables)
    for variable, got, want in zip(keras_model.trainable_variables, got_grads, want_grads):
        scale = float(tf.reduce_max(tf.abs(want)))
        assert scale > 0, variable.path
        np.testing.assert_allclose(got.numpy() / scale, want.numpy() / scale, atol=1e-5, err_msg=variable.path)


def test_bfloat16_gradient_matmuls_keep_the_loss_and_round_the_gradients():
    # The CPU path with its two large gradient matmuls per direction in bfloat16 (8 bits of
    # mantissa, float32 sums) against the same path in float32: one model's weights, one batch.
    base = twin(CONFIG, "fused")
    bf16 = twin(dataclasses.replace(CONFIG, lstm_grad_matmuls="bfloat16"), "fused", base)
    data = batch(seed=1)
    want_loss, want_grads = loss_and_grads(base, asr._ctc_sparse, *data)
    got_loss, got_grads = loss_and_grads(bf16, asr._ctc_sparse, *data)
    np.testing.assert_allclose(got_loss.numpy(), want_loss.numpy(), rtol=1e-6)  # the forward pass is float32
    rounded = 0
    for variable, got, want in zip(base.trainable_variables, got_grads, want_grads):
        assert got.dtype == tf.float32, variable.path
        error = float(tf.norm(got - want) / tf.norm(want))
        assert error < 2e-2, (variable.path, error)  # bfloat16 rounds to 2^-9 relative
        rounded += error > 1e-5
    assert rounded, "no gradient was computed in bfloat16"


def test_the_gradient_matmul_setting_follows_the_cpu(monkeypatch):
    from common import runtime

    assert lstm.grad_matmul_dtype("float32") == tf.float32 and lstm.grad_matmul_dtype("bfloat16") == tf.bfloat16
    for flags, want in (({"avx2", "avx512f"}, tf.float32), ({"avx512f", "avx512_bf16"}, tf.bfloat16)):
        monkeypatch.setattr(runtime, "cpu_info", lambda flags=flags: ("a CPU", frozenset(flags)))
        assert lstm.grad_matmul_dtype("auto") == want
    with pytest.raises(ValueError, match="unknown lstm_grad_matmuls 'fp8'"):
        asr.build_asr(dataclasses.replace(CONFIG, lstm_grad_matmuls="fp8"))


def test_padding_does_not_reach_the_valid_outputs():
    model = twin(CONFIG, "fused")
    feats, lengths, _, _ = batch()
    lengths = lengths // CONFIG.subsample * CONFIG.subsample  # a stacked frame then holds no padding
    padded = tf.concat([feats, tf.fill([5, 9, CONFIG.feature_dim], 7.0)], axis=1)
    logits, out_lengths = model(feats, lengths)
    logits_padded, _ = model(padded, lengths)
    for row, n in enumerate(out_lengths.numpy()):
        np.testing.assert_allclose(logits_padded[row, :n], logits[row, :n], atol=1e-5)


def test_ctc_kernels_agree_and_skip_what_cannot_be_aligned():
    logits = tf.random.stateless_normal([3, 6, 5], seed=[1, 2])
    tokens = tf.constant([[1, 2, 3, 0], [2, 2, 2, 2], [1, 1, 0, 0]], tf.int32)
    token_lengths = tf.constant([3, 4, 2])
    lengths = tf.constant([6, 6, 3])  # the second needs 4 tokens + 3 blanks > 6 frames: left out
    np.testing.assert_allclose(
        asr._ctc_sparse(logits, lengths, tokens, token_lengths).numpy()[[0, 2]],
        asr._ctc_dense(logits, lengths, tokens, token_lengths).numpy()[[0, 2]],
        rtol=1e-5,
    )
    loss, infeasible = asr.ctc_loss(logits, lengths, tokens, token_lengths)
    assert int(infeasible) == 1 and np.isfinite(float(loss))


def test_a_checkpoint_of_the_cpu_path_loads_into_the_keras_layers(tmp_path):
    fused_model = twin(CONFIG, "fused")
    feats, lengths, labels, label_lengths = batch(seed=3)
    optimizer = tf.keras.optimizers.SGD(0.5)
    for _ in range(2):  # a trained model, not the initial weights a rebuild would also draw
        _, grads = loss_and_grads(fused_model, asr._ctc_sparse, feats, lengths, labels, label_lengths)
        optimizer.apply(grads, fused_model.trainable_variables)
    path = checkpoint.save(tmp_path, 2, fused_model.weights, [], {"epoch": 0}, owners=(fused_model.name,))
    keras_model = twin(CONFIG, "keras")
    checkpoint.restore(path, keras_model.weights, owners=(keras_model.name,))
    for layer in keras_model.lstms:
        assert not lstm.use_fused(layer.kernel)  # these run Keras' LSTM: cuDNN's kernel on a GPU
    np.testing.assert_allclose(keras_model(feats, lengths)[0], fused_model(feats, lengths)[0], atol=1e-5)


@pytest.mark.parametrize("decoder", ["conv", "lstm"])
def test_synthesis_loss_and_gradients_equal_the_keras_path(decoder):
    # The encoder's LSTMs, and the decoder's with durations_decoder "lstm", take the CPU path.
    config = dataclasses.replace(
        TINY, alignment="durations", durations_decoder=decoder, decoder_lstm_units=16, dropout=0.0
    )
    keras_model = tts.build_tts(dataclasses.replace(config, lstm="keras"))
    fused_model = tts.build_tts(dataclasses.replace(config, lstm="fused"))
    fused_model.set_weights(keras_model.get_weights())
    data = synthetic_batch(config)

    def loss_and_grads(model):
        task = TtsTask(model.config)
        with tf.GradientTape() as tape:
            loss, _ = task.loss(model, data, training=True)
        return loss, tape.gradient(loss, model.trainable_variables)

    want_loss, want_grads = loss_and_grads(keras_model)
    got_loss, got_grads = loss_and_grads(fused_model)
    np.testing.assert_allclose(got_loss.numpy(), want_loss.numpy(), rtol=1e-5)
    for variable, got, want in zip(keras_model.trainable_variables, got_grads, want_grads):
        if want is None:  # layers a durations model builds and never uses
            assert got is None, variable.path
            continue
        got, want = tf.convert_to_tensor(got), tf.convert_to_tensor(want)  # the embedding's: IndexedSlices
        scale = float(tf.reduce_max(tf.abs(want))) or 1.0
        np.testing.assert_allclose(got.numpy() / scale, want.numpy() / scale, atol=1e-4, err_msg=variable.path)


def test_the_cpu_path_is_the_one_that_runs_without_a_gpu():
    model = twin(CONFIG, "auto")
    feats, lengths, _, _ = batch()
    graph = tf.function(lambda f, n: model(f, n)).get_concrete_function(feats, lengths).graph
    ops = {op.type for op in graph.get_operations()}
    if tf.config.list_physical_devices("GPU"):
        assert "BlockLSTM" not in ops  # Keras' layers: cuDNN's kernel
    else:
        assert "BlockLSTM" in ops, sorted(ops)
