"""Run under horovodrun: every rank contributes rank+1; prints the allreduced sum and average."""

import horovod.tensorflow as hvd
import tensorflow as tf

from common.runtime import configure_tensorflow

applied = configure_tensorflow()
hvd.init()
x = tf.constant([float(hvd.rank() + 1), 10.0 * (hvd.rank() + 1)])
total = hvd.allreduce(x, op=hvd.Sum).numpy()
mean = hvd.allreduce(x, op=hvd.Average).numpy()
print(
    f"RESULT rank={hvd.rank()} size={hvd.size()} sum={total.tolist()} mean={mean.tolist()} "
    f"threads={applied['intra_op_threads']},{applied['inter_op_threads']}",
    flush=True,
)
