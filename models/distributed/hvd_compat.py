"""The one place that bridges Horovod 0.28.1 and Keras 3.

Horovod 0.28.1 predates Keras 3. Its `DistributedGradientTape.gradient` and
`broadcast_variables` call `.ref()` on each variable, which Keras 3 variables (`keras.Variable`)
do not have. Under the TensorFlow backend every Keras 3 variable wraps a `tf.Variable`
(`variable.value`), so we hand Horovod those instead. Gradients computed for the wrapped
`tf.Variable`s apply unchanged to the Keras variables, since they are the same storage.
Everything in the project that gives variables to Horovod goes through this module.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import horovod.tensorflow as hvd
import tensorflow as tf


def tf_variables(variables: Iterable) -> list[tf.Variable]:
    """The underlying `tf.Variable` of each Keras 3 variable (plain `tf.Variable`s pass through)."""
    unwrapped = []
    for variable in variables:
        inner = variable if isinstance(variable, tf.Variable) else getattr(variable, "value", None)
        if not isinstance(inner, tf.Variable):
            raise TypeError(
                f"cannot give {getattr(variable, 'path', variable)!r} to Horovod: it wraps no tf.Variable "
                "(is the Keras backend TensorFlow, and are we outside an autocast scope?)"
            )
        unwrapped.append(inner)
    return unwrapped


def codec(compression: str):
    """Horovod's compression for our name of it: "none" (the tensors' dtype) or "fp16"."""
    return {"none": hvd.Compression.none, "fp16": hvd.Compression.fp16}[compression]


def distributed_tape(tape: tf.GradientTape, compression: str = "none", process_set=None) -> hvd.DistributedGradientTape:
    """Wraps `tape` so that `.gradient(loss, tf_variables(...))` averages across ranks.

    `compression`: "none" or "fp16" (gradients travel as float16, are summed, and come back in
    their own dtype).
    """
    kwargs = {"process_set": process_set} if process_set is not None else {}
    # Horovod: average gradients across ranks with ring-allreduce.
    return hvd.DistributedGradientTape(tape, compression=codec(compression), **kwargs)


def broadcast(variables: Sequence, root_rank: int = 0) -> None:
    """Sets every rank's `variables` (Keras or tf) to root_rank's values."""
    # Horovod: start every rank from rank 0's weights (and optimizer slots).
    hvd.broadcast_variables(tf_variables(variables), root_rank=root_rank)
