"""The compiled pieces of one training step, which the loop (models/training/loop.py) runs:
the forward and backward pass, the application of the gradients, and the fused step in which
Horovod's `DistributedGradientTape` averages each gradient as the backward pass makes it.
Each is traced once per run, on the first batch, as one graph for every batch shape.
"""

from __future__ import annotations

import time


class CompiledStep:
    """The step's functions over `model`'s variables, traced on first use (only this object
    writes its traces)."""

    def __init__(self, tf, task, model, optimizer, strategy):
        self.tf = tf
        variables = model.trainable_variables

        def compute(batch, seed):
            with tf.GradientTape() as tape:
                loss, aux = task.loss(model, batch, training=True, seed=seed)
            grads = tape.gradient(loss, variables)
            return loss, aux, task.frames(batch), grads

        def apply(grads):
            optimizer.apply(grads, variables)

        def fused(batch, seed):
            from models.distributed import hvd_compat

            with tf.GradientTape() as tape:
                loss, aux = task.loss(model, batch, training=True, seed=seed)
            # Horovod: DistributedGradientTape averages each gradient as the backward pass makes it.
            grads = strategy.distributed_tape(tape).gradient(loss, hvd_compat.tf_variables(variables))
            optimizer.apply(grads, variables)
            return loss, aux, task.frames(batch)

        self._compute_fn, self._compute = compute, None
        self.apply = tf.function(apply, reduce_retracing=True, autograph=False)  # the gradients' shapes never change
        self._fused_fn, self._fused = fused, None

    def _traced(self, fn, batch):
        """`fn(batch, seed)` as one graph for every batch shape: every dimension unknown. Traced per
        shape (or by `reduce_retracing`, which relaxes only the dimensions seen to change), a batch of
        a new size or length class retraced the step mid-run, about half a minute each time with the
        LSTM gradient's loops."""
        tf = self.tf
        spec = tf.nest.map_structure(lambda t: tf.TensorSpec([None] * t.shape.rank, t.dtype), batch)
        return tf.function(fn, input_signature=[spec, tf.TensorSpec([2], tf.int64)], autograph=False)

    def traced_compute(self, batch):
        """The forward and backward pass, `(batch, seed) -> (loss, aux, frames, gradients)`, traced on
        the first `batch`."""
        if self._compute is None:
            self._compute = self._traced(self._compute_fn, batch)
        return self._compute

    def traced_fused(self, batch):
        """The fused step, `(batch, seed) -> (loss, aux, frames)`, the gradients averaged over the ranks
        and applied, traced on the first `batch`."""
        if self._fused is None:
            # Horovod: one trace, the same graph on every rank. Traces that follow each rank's own
            # batch shapes (reduce_retracing) name their allreduce ops differently on ranks that
            # retraced at different steps, and the ranks then wait for each other's tensors forever.
            self._fused = self._traced(self._fused_fn, batch)
        return self._fused


def seed(tf, config_seed: int, rank: int, step: int):
    """The stateless seed of this step's random input augmentation: another on every rank and step;
    its second element is the step (a task may start augmenting at a step: models/interfaces.py)."""
    return tf.constant([config_seed * 7919 + rank, step], tf.int64)


def sync_accelerators(tf, gpus: list) -> None:
    """Waits for this thread's work on the GPUs, so the step's times split right.

    Not `tf.test.experimental.sync_devices()`: it also waits for every pending op of the eager
    context, the gossip thread's exchange with a partner included, which would make a fast
    worker's training wait for its slow partner. CPU ops have finished when they return."""
    from tensorflow.python.ops import gen_sync_ops  # the op sync_devices runs, without its wait-for-all

    for device in gpus:
        with tf.device(device):
            gen_sync_ops.SyncDevice()


def slow_down(compute, batch, step_seed, extra: float, compute_seconds: float) -> float:
    """A straggler's step taking 1 + `extra` times as long (`--straggler-factor`): the step's
    forward and backward pass computed again, `extra` whole times, and the fraction slept.
    Computing, not sleeping, keeps its cores as busy as a slower or shared device keeps its
    own: a sleeping rank lends its cores (and whatever else the host's cores share) to the
    other ranks, which then run faster than undisturbed. Returns the seconds spent."""
    started = time.perf_counter()
    whole = int(extra)
    for _ in range(whole):
        float(compute(batch, step_seed)[0])  # waits for the computation
    once = (time.perf_counter() - started) / whole if whole else compute_seconds
    time.sleep((extra - whole) * once)
    return time.perf_counter() - started
