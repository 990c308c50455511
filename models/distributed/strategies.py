"""How workers combine their work: the pluggable strategy interface, and Horovod ring-allreduce.

A strategy sees a model's variables and gradients, never the model itself, so every model
trains with every strategy. The trainer calls, per step:

    strategy.start()                    # before the first step: every rank takes rank 0's weights
    grads = strategy.reduce(grads)      # in the step: allreduce averages; gossip passes through
    strategy.after_step(step)           # between steps: gossip merges
    ...
    strategy.finish()                   # all ranks end with the same (consensus) weights

The interface is models/interfaces.py `Strategy`; the catalog of strategies (and what each
declares: budget in data, elastic) is common/catalog.py. The asynchronous gossip strategy (AD-PSGD)
lives in models/distributed/gossip.py.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any

from common import catalog
from common import config as configlib


def options_class(name: str) -> type | None:
    """The options dataclass of strategy `name` (its catalog entry's `options`), None for none."""
    target = catalog.strategy(name).options
    return catalog.resolve(target) if target else None


@dataclasses.dataclass(frozen=True)
class StrategyConfig:
    """The `strategy:` section of a training config: the strategy's name and, beside it, its own
    options (the dataclass its catalog entry names: `strategy.gossip`, `strategy.compression`, ...)."""

    name: str = "allreduce"  # common/catalog.py: "allreduce" (synchronous ring-allreduce), "adpsgd" (gossip), ...
    options: Any = configlib.registered_field(lambda c: options_class(c.name))  # the strategy's own settings

    def __post_init__(self):
        catalog.strategy(self.name)  # ValueError naming the registered strategies
        configlib.fill_registered(self)

    @classmethod
    def ignored_keys(cls, config) -> dict[str, str]:
        """Another strategy's options (a config file written for it, run with --strategy NAME) are
        ignored with a warning naming their strategy; `config` holds the final choice."""
        own = options_class(config.name)
        names = {f.name for f in dataclasses.fields(own)} if own else set()
        return {
            f.name: f"is an option of strategy {other!r}, not of {config.name!r}"
            for other in catalog.strategies()
            if other != config.name and options_class(other) is not None
            for f in dataclasses.fields(options_class(other))
            if f.name not in names
        }


@dataclasses.dataclass(frozen=True)
class AllreduceOptions:
    compression: str = "none"  # gradients travel as "none" (their dtype) or "fp16"
    # one compiled step with DistributedGradientTape (faster on GPUs, as it overlaps the allreduce with
    # the backward pass; the timings then cannot tell computation from communication)
    fused_step: bool = False

    def __post_init__(self):
        if self.compression not in ("none", "fp16"):
            raise ValueError(f"strategy.compression must be 'none' or 'fp16', got {self.compression!r}")


class Allreduce:
    """Synchronous data parallelism: every step, gradients are averaged over all ranks."""

    name = "allreduce"

    def __init__(self, config: StrategyConfig, model_vars: list, optimizer):
        self.config = config
        self.options: AllreduceOptions = config.options
        self.fused_step = self.options.fused_step
        self.model_vars = model_vars
        self.optimizer = optimizer
        import horovod.tensorflow as hvd
        import tensorflow as tf

        from models.distributed import hvd_compat

        codec = hvd_compat.codec(self.options.compression)

        @tf.function(reduce_retracing=True, autograph=False)
        def reduce(grads):
            # Horovod: average the gradients over all ranks (ring-allreduce; tensors fused in batches).
            return hvd.grouped_allreduce(list(grads), op=hvd.Average, compression=codec)

        self._reduce = reduce

    def reduce(self, grads):
        return self._reduce(grads)

    def step_lock(self):
        return contextlib.nullcontext()

    def distributed_tape(self, tape):
        """For the fused step: DistributedGradientTape averages inside `tape.gradient`."""
        from models.distributed import hvd_compat

        return hvd_compat.distributed_tape(tape, compression=self.options.compression)

    def start(self) -> None:
        from models.distributed import hvd_compat

        # Horovod: before the first step (the optimizer's slots exist: the trainer builds them), every
        # rank takes rank 0's weights and optimizer state (random initialization or a checkpoint alike).
        hvd_compat.broadcast(self.model_vars + list(self.optimizer.variables), root_rank=0)

    def after_step(self, step: int) -> float:
        """Seconds spent communicating outside the step: none, allreduce works inside it."""
        return 0.0

    def lr_workers(self, size: int) -> int:
        return size  # every step averages `size` batches' gradients

    def training_finished(self) -> None:
        pass

    def metrics(self) -> dict:
        return {}

    def finish(self) -> dict:
        return {}

    def close(self) -> None:
        pass


def init_horovod(config: StrategyConfig):
    """Initializes Horovod for `config`: a strategy may add process sets at run time (gossip: one per pair)."""
    import horovod.tensorflow as hvd

    # Horovod: start the collective runtime; dynamic process sets let gossip register its pairs.
    hvd.init(process_sets="dynamic" if catalog.strategy(config.name).dynamic_process_sets else None)
    return hvd


def make_strategy(config: StrategyConfig, model_vars: list, optimizer):
    """The registered strategy `config.name` (common/catalog.py) over these variables."""
    return catalog.strategy_class(config.name)(config, model_vars, optimizer)


def sum_over_ranks(hvd, values: list[float]) -> list[float]:
    """`values` summed element-wise over every rank, in float64 (counts stay exact).

    Horovod: a collective; every rank calls it at the same point of its run (a dev evaluation)."""
    import tensorflow as tf

    return hvd.allreduce(tf.constant(values, tf.float64), op=hvd.Sum, name="sum_over_ranks").numpy().tolist()
