"""How workers combine their work: the pluggable strategy interface, and Horovod ring-allreduce.

A strategy sees a model's variables and gradients, never the model itself, so every model
trains with every strategy. The trainer calls, per step:

    strategy.start()                    # before the first step: every rank takes rank 0's weights
    grads = strategy.reduce(grads)      # in the step: allreduce averages; gossip passes through
    strategy.after_step(step)           # between steps: gossip merges
    ...
    strategy.finish()                   # all ranks end with the same (consensus) weights

The interface is models/interfaces.py `Strategy`; the registry of strategies (and what each
declares: budget in data, elastic) is common/catalog.py. The asynchronous gossip strategy (AD-PSGD)
lives in models/distributed/gossip.py.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any

from common import catalog


@dataclasses.dataclass(frozen=True)
class StrategyConfig:
    name: str = "allreduce"  # common/catalog.py: "allreduce" (synchronous ring-allreduce), "adpsgd" (gossip), ...
    compression: str = "none"  # allreduce: gradients travel as "none" (their dtype) or "fp16"
    fused_step: bool = False  # allreduce: one compiled step with DistributedGradientTape (faster on GPUs, as
    #                           it overlaps the allreduce with the backward pass; the timings then cannot
    #                           tell computation from communication)
    gossip: str = "fixed-ring"  # adpsgd: "fixed-ring", "random-ring" or "delay-by-one"
    hierarchical: bool = False  # adpsgd: ranks on a host average by allreduce; one rank per host gossips
    gossip_compression: str = "none"  # adpsgd: exchanges travel as "none" (float32) or "fp16"
    consensus_every: int = 10  # adpsgd: gossip rounds between consensus-distance measurements
    seed: int = 0  # adpsgd random-ring: the seed every rank draws the matchings from
    # adpsgd: scale the learning rate with the number of workers, as allreduce does. Averaging n
    # workers' models, each stepped by its own gradient, moves the average by lr x the mean gradient
    # per n batches: the same as one allreduce step, so both need the same rate per sample.
    gossip_scale_lr: bool = True
    extension: dict[str, Any] = dataclasses.field(default_factory=dict)  # a strategy an extension adds: its settings

    def __post_init__(self):
        catalog.strategy(self.name)  # ValueError naming the registered strategies
        for field, value in (("compression", self.compression), ("gossip_compression", self.gossip_compression)):
            if value not in ("none", "fp16"):
                raise ValueError(f"strategy.{field} must be 'none' or 'fp16', got {value!r}")
        if self.gossip not in ("fixed-ring", "random-ring", "delay-by-one"):
            raise ValueError(f"strategy.gossip must be fixed-ring, random-ring or delay-by-one, got {self.gossip!r}")


class Allreduce:
    """Synchronous data parallelism: every step, gradients are averaged over all ranks."""

    name = "allreduce"

    def __init__(self, config: StrategyConfig, model_vars: list, optimizer):
        self.config = config
        self.fused_step = config.fused_step
        self.model_vars = model_vars
        self.optimizer = optimizer
        import horovod.tensorflow as hvd
        import tensorflow as tf

        from models.distributed import hvd_compat

        codec = hvd_compat.codec(config.compression)

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

        return hvd_compat.distributed_tape(tape, compression=self.config.compression)

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
