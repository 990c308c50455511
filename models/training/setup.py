"""What a rank trains with, made once before its first step and never changed after: its threads
and GPU, Horovod, the shards (read and checked once), the task with its data-sized config, the
model, the optimizer and the strategy. The values that move while the run goes on (the position,
the plan of its steps, the learning rate) are the loop's own (models/training/loop.py).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from common import catalog, runtime
from models.training.config import check_workdir


@dataclasses.dataclass(frozen=True)
class Setup:
    config: Any  # models/training/config.py TrainConfig, with the task's data-sized settings in place
    workdir: Path
    hvd: Any  # horovod.tensorflow
    tf: Any  # tensorflow
    threads: dict  # common/runtime.py configure_tensorflow: this rank's intra- and inter-op threads
    gpus: list  # this rank's logical GPU devices (empty on a CPU)
    shards: Any  # pipeline/records.py ShardSet, the manifest read and checked once
    train_split: str  # the split of `shards` it trains on (TrainConfig.train_split: train, or train_aug)
    task: Any  # models/interfaces.py Task
    model: Any  # the Keras model
    optimizer: Any
    budget_in_data: bool  # common/catalog.py StrategyEntry: the ranks share the epochs' batches
    strategy: Any = None  # models/interfaces.py Strategy, made once the checkpoint is restored

    def owners(self) -> tuple[str, str]:
        """The names a checkpoint's weights and optimizer state are saved under."""
        return (self.model.name, self.optimizer.name)


def set_up(config, shard_dir: Path, workdir: Path) -> Setup:
    """This rank's set-up before its checkpoint is restored: its threads and GPU, Horovod, the
    shards (read and checked once), the task with its data-sized config, the model and optimizer."""
    import keras
    import tensorflow as tf

    from models.distributed.strategies import init_horovod
    from pipeline import records

    c = config
    threads = runtime.configure_tensorflow(c.intra_op_threads, c.inter_op_threads, c.bind_cores)
    gpus = [d.name for d in tf.config.list_logical_devices("GPU")]
    # Horovod: one process per worker; rank 0 is the one that writes and logs.
    hvd = init_horovod(c.strategy)
    keras.utils.set_random_seed(c.seed)
    if c.precision == "mixed_bfloat16":
        keras.mixed_precision.set_global_policy("mixed_bfloat16")
    shards = records.open_shard_set(shard_dir)  # the manifest read and checked once
    train_split = c.train_split
    if train_split not in shards.splits:
        raise ValueError(
            f"{c.model} trains on the split {train_split!r} (its settings ask for copies of the training audio), "
            f"which the shards in {shard_dir} do not hold (they have {sorted(shards.splits)}): make it with "
            f"`python -m pipeline.augment --data DATA/train --out DATA/{train_split}` with the same settings, "
            f"then its features and `pipeline.shards ... --split {train_split}=DATA/{train_split}`"
        )
    records.check_shards(shards, train_split)  # sizes: a truncated shard stops us here
    task = catalog.task_class(c.model).create(c, shards)
    c = task.resolved(c)
    if hvd.rank() == 0:
        workdir.mkdir(parents=True, exist_ok=True)
        check_workdir(workdir, c)
    model = task.build()
    optimizer = keras.optimizers.Adam(c.optim.learning_rate, global_clipnorm=c.optim.clip_norm)
    optimizer.build(model.trainable_variables)
    # Asynchronous training counts its budget in data: the ranks share the epochs' batches, a
    # faster rank takes more of them, and the run ends when they are used up. Allreduce steps in
    # lockstep through exact epochs, every rank its own shards.
    budget_in_data = catalog.strategy(c.strategy.name).budget_in_data
    return Setup(c, workdir, hvd, tf, threads, gpus, shards, train_split, task, model, optimizer, budget_in_data)
