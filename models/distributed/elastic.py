"""Elastic training (`models.train --elastic` under `horovodrun --min-np/--max-np --host-discovery-script`).

Horovod's elastic mode keeps a job alive when workers are lost or added: the training function
runs inside `run`, commits a state every few steps, and when a collective fails (a worker died) or
the host set changes, every survivor restores the last commit, Horovod re-forms the ring for the new
world size, the new rank 0's state is broadcast, and the function is called again.

Two bridges to Horovod 0.28.1, which predates Keras 3 (the same gap models/distributed/hvd_compat.py bridges):
- `KerasState`: Horovod's `TensorFlowKerasState` calls `optimizer.variables()`, a list in Keras 3,
  and `TensorFlowState` never re-broadcasts in TF2 eager mode; this state saves, restores and
  broadcasts the `tf.Variable` behind every Keras variable, plus plain attributes (step, epoch).
- `resets_on_failed_collectives`: Horovod's TensorFlow `elastic.run` turns a failed collective into a
  reset only when the error names HorovodAllreduce, HorovodAllgather or HorovodBroadcast; our allreduce
  of gradient groups fails as HorovodGroupedAllreduce, which it would swallow (the training function
  would just return None). Inside this context any failed Horovod op becomes a reset.
"""

from __future__ import annotations

import contextlib

import horovod.tensorflow as hvd
import tensorflow as tf
from horovod.common.elastic import ObjectState, run_fn
from horovod.common.exceptions import HorovodInternalError

from models.distributed import hvd_compat


class KerasState(ObjectState):
    """Weights and optimizer slots of a Keras 3 model, and `**attributes` (step, epoch, ...)."""

    def __init__(self, model, optimizer, **attributes):
        self.model, self.optimizer = model, optimizer
        self._save_variables()  # no collective here: a worker that joins builds its state too
        super().__init__(bcast_object=hvd.broadcast_object, get_rank=hvd.rank, **attributes)

    def _variables(self) -> list:
        return hvd_compat.tf_variables([*self.model.variables, *self.optimizer.variables])

    def _save_variables(self) -> None:
        self._saved = [v.numpy() for v in self._variables()]

    def save(self) -> None:
        self._save_variables()
        super().save()

    def restore(self) -> None:
        for variable, value in zip(self._variables(), self._saved):
            variable.assign(value)
        super().restore()

    def sync(self) -> None:
        # Horovod: every rank, a joining one included, takes rank 0's weights and optimizer state.
        hvd_compat.broadcast([*self.model.variables, *self.optimizer.variables], root_rank=0)
        self._save_variables()
        super().sync()


def _reset() -> None:
    # Horovod: leave the old ring and join the new one (the driver assigns new ranks and size).
    hvd.shutdown()
    hvd.init()


@contextlib.contextmanager
def resets_on_failed_collectives():
    """Around the training function's steps: any failed Horovod op becomes a reset (see the module docstring)."""
    try:
        yield
    except tf.errors.UnknownError as err:
        if "Horovod" in err.message:
            raise HorovodInternalError(err) from err
        raise


def run(func):
    """`hvd.elastic.run` of `func`, which holds its steps inside `resets_on_failed_collectives()`."""
    return run_fn(func, _reset)
