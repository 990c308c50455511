"""Horovod 0.28.1 with Keras 3 variables: the compatibility module is what makes them work."""

import horovod.tensorflow as hvd
import keras
import numpy as np
import pytest
import tensorflow as tf

from models.distributed import hvd_compat


@pytest.fixture(scope="module", autouse=True)
def horovod_single_process():
    hvd.init()


def _model():
    keras.utils.set_random_seed(0)
    return keras.Sequential([keras.layers.Input((3,)), keras.layers.Dense(2)])


def test_plain_horovod_rejects_keras3_variables():
    # Why hvd_compat exists: if a Horovod upgrade fixes this, the module can go.
    model = _model()
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(model(np.ones((4, 3), "float32")))
    with pytest.raises(AttributeError, match="ref"):
        hvd.DistributedGradientTape(tape).gradient(loss, model.trainable_variables)


def test_distributed_tape_gives_the_plain_gradients():
    model = _model()
    x = np.random.default_rng(0).normal(size=(4, 3)).astype("float32")
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(model(x) ** 2)
    expected = tape.gradient(loss, model.trainable_variables)
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(model(x) ** 2)
    grads = hvd_compat.distributed_tape(tape).gradient(loss, hvd_compat.tf_variables(model.trainable_variables))
    for got, want in zip(grads, expected):
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-6)


def test_tf_variables_are_the_keras_storage():
    model = _model()
    inner = hvd_compat.tf_variables(model.trainable_variables)
    assert all(isinstance(v, tf.Variable) for v in inner)
    inner[0].assign(tf.zeros_like(inner[0]))
    assert np.all(model.trainable_variables[0].numpy() == 0)


def test_broadcast_accepts_keras_variables():
    model = _model()
    before = [v.numpy().copy() for v in model.trainable_variables]
    hvd_compat.broadcast(model.trainable_variables)  # one rank: a no-op that must not raise
    for got, want in zip(model.trainable_variables, before):
        np.testing.assert_array_equal(got.numpy(), want)


def test_tf_variables_rejects_non_variables():
    with pytest.raises(TypeError, match="tf.Variable"):
        hvd_compat.tf_variables([np.zeros(3)])
