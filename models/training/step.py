"""One training step of the Trainer: computed, reduced across ranks and applied, with its times.

The step is compiled once per run: gradients computed, handed to the strategy (allreduce averages
them, gossip keeps them), then applied; or, with `strategy.fused_step`, one function in which
Horovod's `DistributedGradientTape` averages each gradient as the backward pass makes it. Each step
reports its seconds of computation and of communication; a straggler's extra work
(`--straggler-factor`, models/training/hooks.py) is computed here too.
"""

from __future__ import annotations

import time


class Stepper:
    """The Trainer's training step over the training state `s`, compiled once per run."""

    def __init__(self, state):
        self.s = state
        tf, task, model, optimizer = state.tf, state.task, state.model, state.optimizer
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
            grads = state.strategy.distributed_tape(tape).gradient(loss, hvd_compat.tf_variables(variables))
            optimizer.apply(grads, variables)
            return loss, aux, task.frames(batch)

        self._compute_fn, self._compute = compute, None
        self._apply = tf.function(apply, reduce_retracing=True, autograph=False)  # the gradients' shapes never change
        self._fused_fn, self._fused = fused, None

    def _traced(self, fn, batch):
        """`fn(batch, seed)` as one graph for every batch shape: every dimension unknown. Traced per
        shape (or by `reduce_retracing`, which relaxes only the dimensions seen to change), a batch of
        a new size or length class retraced the step mid-run, about half a minute each time with the
        LSTM gradient's loops."""
        tf = self.s.tf
        spec = tf.nest.map_structure(lambda t: tf.TensorSpec([None] * t.shape.rank, t.dtype), batch)
        return tf.function(fn, input_signature=[spec, tf.TensorSpec([2], tf.int64)], autograph=False)

    def _seed(self, step: int):
        """The stateless seed of this step's random input augmentation: another on every rank and step;
        its second element is the step (a task may start augmenting at a step: models/interfaces.py)."""
        return self.s.tf.constant([self.s.config.seed * 7919 + self.s.rank, step], self.s.tf.int64)

    def step(self, batch, step: int) -> tuple[float, dict, int, int, dict]:
        """One training step on `batch`: (loss, aux metrics, frames, utterances, seconds by kind)."""
        tf = self.s.tf
        times = {}
        seed = self._seed(step)
        with self.s.strategy.step_lock():  # gossip: its thread reads and writes the weights between steps only
            start = time.perf_counter()
            if self.s.strategy.fused_step:
                if self._fused is None:
                    # Horovod: one trace, the same graph on every rank. Traces that follow each
                    # rank's own batch shapes (reduce_retracing) name their allreduce ops differently
                    # on ranks that retraced at different steps, and the ranks then wait for each
                    # other's tensors forever.
                    self._fused = self._traced(self._fused_fn, batch)
                loss, aux, frames = self._fused(batch, seed)
                loss = float(loss)  # waits for the step
                times["compute"], times["communication"] = time.perf_counter() - start, 0.0
            else:
                if self._compute is None:
                    self._compute = self._traced(self._compute_fn, batch)
                loss, aux, frames, grads = self._compute(batch, seed)
                self._sync_accelerators()
                times["compute"] = time.perf_counter() - start
                start = time.perf_counter()
                grads = self.s.strategy.reduce(grads)
                self._sync_accelerators()
                times["communication"] = time.perf_counter() - start
                start = time.perf_counter()
                self._apply(grads)
                loss = float(loss)
                times["compute"] += time.perf_counter() - start
        utterances = int(tf.shape(batch["utt_id"])[0])
        return loss, {k: float(v) for k, v in aux.items()}, int(frames), utterances, times

    def slow_down(self, batch, step: int, extra: float, compute_seconds: float) -> float:
        """A straggler's step taking 1 + `extra` times as long (`--straggler-factor`): the step's
        forward and backward pass computed again, `extra` whole times, and the fraction slept.
        Computing, not sleeping, keeps its cores as busy as a slower or shared device keeps its
        own: a sleeping rank lends its cores (and whatever else the host's cores share) to the
        other ranks, which then run faster than undisturbed. Returns the seconds spent."""
        started = time.perf_counter()
        whole = int(extra)
        for _ in range(whole):
            float(self._compute(batch, self._seed(step))[0])  # waits for the computation
        once = (time.perf_counter() - started) / whole if whole else compute_seconds
        time.sleep((extra - whole) * once)
        return time.perf_counter() - started

    def _sync_accelerators(self) -> None:
        """Waits for this thread's work on the GPUs, so the step's times split right.

        Not `tf.test.experimental.sync_devices()`: it also waits for every pending op of the eager
        context, the gossip thread's exchange with a partner included, which would make a fast
        worker's training wait for its slow partner. CPU ops have finished when they return."""
        from tensorflow.python.ops import gen_sync_ops  # the op sync_devices runs, without its wait-for-all

        for device in self.s.gpus:
            with self.s.tf.device(device):
                gen_sync_ops.SyncDevice()
