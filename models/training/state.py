"""What the Trainer's parts share: one declared object, set up once per run by the Trainer
(models/training/loop.py) and read by its collaborators, the schedule (schedule.py), the step
(step.py), the checkpoints (persistence.py) and the report (reporting.py).

Who changes what while the run goes on: the loop moves `position` and `origin` as it steps; the
schedule sets `steps_per_epoch`, `total_steps`, `last_epoch` and `current_lr`, and after an elastic
job's reset `rank`, `size` and `origin` again; rank 0's report sets `run_id`.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any


@dataclasses.dataclass
class TrainingState:
    config: Any  # models/training/config.py TrainConfig, with the task's data-sized settings in place
    workdir: Path
    hvd: Any  # horovod.tensorflow
    tf: Any  # tensorflow
    rank: int
    size: int
    threads: dict  # common/runtime.py configure_tensorflow: this rank's intra- and inter-op threads
    gpus: list  # this rank's logical GPU devices (empty on a CPU)
    shards: Any  # pipeline/records.py ShardSet, the manifest read and checked once
    task: Any  # models/interfaces.py Task
    model: Any  # the Keras model
    optimizer: Any
    budget_in_data: bool  # common/catalog.py StrategyEntry: the ranks share the epochs' batches
    strategy: Any = None  # models/interfaces.py Strategy, made once the position is restored
    # Where the run is: `step` (1-based, of this rank), `epoch`, and for asynchronous training
    # whether the budget was spent (`done`); a checkpoint holds it.
    position: dict = dataclasses.field(default_factory=lambda: {"epoch": 0, "batch": 0, "step": 0})
    # Lockstep epochs are counted from an origin: epoch origin[0] began after step origin[1] (an
    # elastic job that changed its world size restarts its epoch at the step it resized).
    origin: tuple = (0, 0)
    steps_per_epoch: int = 0
    total_steps: int = 0
    last_epoch: int = 0  # the epochs needed to reach total_steps
    current_lr: float = 0.0
    run_id: str | None = None  # rank 0's MLflow run

    def owners(self) -> tuple[str, str]:
        """The names a checkpoint's weights and optimizer state are saved under."""
        return (self.model.name, self.optimizer.name)
