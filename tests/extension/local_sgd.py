"""Local SGD, a strategy added in one file: every rank steps on its own gradients, and the ranks
average their weights every `strategy.every` steps (and once at the end).

Registered by naming this module in SPEECHFLOW_EXTENSIONS (common/catalog.py); trained with
`--strategy local_sgd --set strategy.every=4`; its options are its own dataclass, registered with it.
tests/test_extension.py runs it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time

from common import catalog

catalog.register_strategy(
    catalog.StrategyEntry(
        "local_sgd",
        f"{__name__}:LocalSgd",
        "local_sgd (average the weights every k steps)",
        options=f"{__name__}:LocalSgdOptions",
    )
)


@dataclasses.dataclass(frozen=True)
class LocalSgdOptions:
    every: int = 4  # steps between averagings of the weights

    def __post_init__(self):
        if self.every < 1:
            raise ValueError(f"strategy.every must be 1 or more, got {self.every}")


class LocalSgd:
    fused_step = False

    def __init__(self, config, model_vars: list, optimizer):
        import horovod.tensorflow as hvd
        import tensorflow as tf

        from models.distributed import hvd_compat

        self.every = config.options.every
        self.model_vars, self.optimizer, self.averages = model_vars, optimizer, 0
        self._tf_vars = hvd_compat.tf_variables(model_vars)

        @tf.function
        def average():
            # Horovod: every rank's weights replaced by the mean over the ranks (one fused allreduce).
            means = hvd.grouped_allreduce([tf.identity(v) for v in self._tf_vars], op=hvd.Average)
            for variable, mean in zip(self._tf_vars, means):
                variable.assign(mean)

        self._average = average

    def start(self) -> None:
        from models.distributed import hvd_compat

        hvd_compat.broadcast(self.model_vars + list(self.optimizer.variables), root_rank=0)

    def reduce(self, grads):
        return grads  # each rank steps on its own gradients

    def step_lock(self):
        return contextlib.nullcontext()

    def distributed_tape(self, tape):
        return tape

    def after_step(self, step: int) -> float:
        if step % self.every:
            return 0.0
        started = time.perf_counter()
        self._average()
        self.averages += 1
        return time.perf_counter() - started

    def lr_workers(self, size: int) -> int:
        return size  # n models each stepped by its own batch, then averaged: as one step of n batches

    def training_finished(self) -> None:
        pass

    def metrics(self) -> dict:
        return {"local_sgd_averages": self.averages}

    def finish(self) -> dict:
        self._average()  # every rank ends with the same weights
        return {"local_sgd_averages": self.averages + 1}

    def close(self) -> None:
        pass
