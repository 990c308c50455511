"""tf.data service: input workers on other machines, for when a GPU host's own cores cannot keep up.

    python -m pipeline.data_service dispatcher --port 5050 [--work-dir DIR]
    python -m pipeline.data_service worker --dispatcher HOST:5050 --port 5051 [--address HOST:5051]
    (--port 0 --port-file FILE: the server picks a free port and writes it to FILE)
    horovodrun -np N ... python -m models.train ... --data-service grpc://HOST:5050

TensorFlow's own distributed input engine: the dispatcher hands out work, CPU workers run the input
pipeline (reading, parsing, decoding, batching), and each training rank receives finished batches
over gRPC. Workers need the shards at the same paths as the trainers (a shared volume).

How the ranks stay in lockstep: the trainers read with *coordinated reads* (`num_consumers` =
ranks, `consumer_index` = rank): each round, one worker hands N consecutive elements of its stream
to ranks 0..N-1. The stream (`service_dataset`) is built for that: chunks of one length class are
grouped N x k at a time (k chunks per rank's batch, pipeline/dataset.py's plan), and each group is
split into N sub-batches of the same padded length. So every rank gets one batch per step, all of
one class, and the ranks' steps cost the same. Groups are never flushed short (the stream is
infinite, as coordinated reads require): a class's last chunks of an epoch wait for the next
epoch's, so an epoch's boundary moves by at most one group per class, and every utterance is still
read once per pass over the shards. With several workers (`distributed_epoch`), the dispatcher hands
each shard of each epoch to one worker, so no utterance is read twice.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from common import cli, fsutil
from pipeline import dataset, records

PROCESSING_MODE = "distributed_epoch"  # every shard of an epoch goes to exactly one worker


def service_dataset(
    pipeline: dataset.Pipeline,
    shards: records.ShardSet,
    split: str,
    cfg: dataset.InputConfig,
    num_consumers: int,
    first_epoch: int,
):
    """The infinite stream of sub-batches the workers serve: rounds of `num_consumers` batches of one
    class (made by `pipeline`, the model's: pipeline/dataset.py), pass after pass over the shards
    (the trainers stop the stream)."""
    import tensorflow as tf

    part = shards.split(split)
    plan = dataset.batch_plan(part, 1, cfg, training=True)
    # ONE source of files, repeated forever and reshuffled every pass: under distributed_epoch the
    # dispatcher hands its files, one by one, to whichever worker asks; a worker whose source ends
    # leaves the round-robin stream of the coordinated reads.
    chunks = dataset.unordered_chunks(part, shards.compression_type, cfg, first_epoch, passes=None)
    grouped = dataset.group_by_class(chunks, [num_consumers * c for c in plan.chunks_per_batch])
    assemble = pipeline.assembler(shards, part, cfg)

    def split_group(index, serialized, keys):
        batch = assemble(index, serialized, keys)
        rows = tf.shape(batch["feat_lengths"])[0]
        cuts = tf.range(num_consumers + 1) * rows // num_consumers
        return tf.data.Dataset.range(num_consumers).map(
            lambda i: {key: value[cuts[i] : cuts[i + 1]] for key, value in batch.items()}
        )

    return grouped.enumerate().flat_map(lambda i, group: split_group(i, *group))


def steps_per_epoch(shards: records.ShardSet, split: str, cfg: dataset.InputConfig, num_consumers: int) -> float:
    """Rounds (steps of every rank) per pass over the split: a fraction, as groups span epochs."""
    part = shards.split(split)
    plan = dataset.batch_plan(part, 1, cfg, training=True)
    chunks = np.bincount(part.class_sequence, minlength=len(plan.chunks_per_batch)) * plan.files_per_rank
    return float(sum(n / (num_consumers * k) for n, k in zip(chunks, plan.chunks_per_batch)))


def shared_dataset(
    pipeline: dataset.Pipeline,
    shards: records.ShardSet,
    split: str,
    cfg: dataset.InputConfig,
    first_epoch: int,
    last_epoch: int,
    num_ranks: int,
    one_worker: bool,
):
    """Batches (made by `pipeline`, the model's) of epochs first_epoch..last_epoch-1 for ranks that
    SHARE one job (asynchronous training): whichever rank asks next gets the next batch, so a faster
    rank takes more of them, and the stream ends when the epochs are used up: a budget counted in data.

    `one_worker` (the service inside rank 0): the stream is exactly the batches that allreduce's
    `num_ranks` ranks would take in those epochs (their pipelines, round robin), so both strategies
    train on the same batches and differ only in who takes which. Several workers (an outside
    service): the dispatcher hands out each shard `last_epoch - first_epoch` times, one at a time,
    to whichever worker asks, and each worker groups its chunks into batches; every utterance is
    still in exactly one batch per pass over the shards."""
    import tensorflow as tf

    part = shards.split(split)
    assemble = pipeline.assembler(shards, part, cfg)
    if one_worker:
        epochs = []
        for epoch in range(first_epoch, last_epoch):
            ranks = [pipeline.batches(shards, split, cfg, r, num_ranks, epoch, True) for r in range(num_ranks)]
            turns = tf.data.Dataset.range(num_ranks).repeat(ranks[0][1])  # every rank's pipeline has as many
            epochs.append(tf.data.Dataset.choose_from_datasets([d for d, _ in ranks], turns))
        chained = epochs[0]
        for more in epochs[1:]:
            chained = chained.concatenate(more)
        return chained
    plan = dataset.batch_plan(part, 1, cfg, training=True)
    chunks = dataset.unordered_chunks(part, shards.compression_type, cfg, first_epoch, passes=last_epoch - first_epoch)
    grouped = dataset.group_by_class(chunks, plan.chunks_per_batch)
    return grouped.enumerate().map(lambda i, group: assemble(i, *group), num_parallel_calls=dataset.AUTOTUNE)


def distribute_shared(batches, address: str, job_name: str):
    """This rank's share of a job that several ranks read together (see `shared_dataset`).

    Each rank has one request in flight: its client still holds a few batches ahead (measured: up
    to about four), which a slow rank trains on at its own pace while the others have run out; more
    requests in flight would make the others wait longer for it at the end of the data."""
    import tensorflow as tf

    return batches.apply(
        tf.data.experimental.service.distribute(
            processing_mode=PROCESSING_MODE, service=address, job_name=job_name, max_outstanding_requests=1
        )
    )


class LocalService:
    """A dispatcher and one input worker inside rank 0's process: the tf.data service without a
    separate deployment, for asynchronous training's shared batches. One worker makes one stream,
    so a budget of batches (`take`) is exact; the other ranks fetch their batches from it over gRPC.
    (An outside service with several workers, `--data-service`, splits each epoch's shards between
    them: the budget is then exact in epochs.)

    Horovod: rank 0 tells every rank where its dispatcher listens (a broadcast)."""

    def __init__(self, hvd):
        import socket

        import tensorflow as tf

        service = tf.data.experimental.service
        self.dispatcher = self.worker = None
        target = None
        if hvd.rank() == 0:
            # Port 0: each server binds a port of its own choosing, so none can be taken in between.
            host = socket.getfqdn()
            self.dispatcher = service.DispatchServer(service.DispatcherConfig(port=0))
            port = bound_port(self.dispatcher)
            self.worker = service.WorkerServer(
                service.WorkerConfig(dispatcher_address=f"localhost:{port}", worker_address=f"{host}:%port%", port=0)
            )
            target = f"grpc://{host}:{port}"
        self.address = hvd.broadcast_object(target, root_rank=0)


def bound_port(server) -> int:
    """The port a DispatchServer or WorkerServer listens on (the one it chose when given port 0)."""
    address = server.target if hasattr(server, "target") else server._address  # WorkerServer has no public one
    return int(address.rsplit(":", 1)[1])


def distribute(served, address: str, job_name: str, rank: int, size: int):
    """This rank's batches from the service at `address` (grpc://HOST:PORT)."""
    import tensorflow as tf

    return served.apply(
        tf.data.experimental.service.distribute(
            processing_mode=PROCESSING_MODE,
            service=address,
            job_name=job_name,
            consumer_index=rank,
            num_consumers=size,
        )
    )


def serve_dispatcher(port: int, work_dir: Path | None, port_file: Path | None = None) -> None:
    """Runs a dispatcher until killed. With `work_dir`, it survives a restart (fault-tolerant mode).
    Port 0 lets it choose a free port; `port_file` then tells it to whoever started it."""
    import tensorflow as tf

    config = tf.data.experimental.service.DispatcherConfig(
        port=port, work_dir=str(work_dir) if work_dir else None, fault_tolerant_mode=work_dir is not None
    )
    server = tf.data.experimental.service.DispatchServer(config)
    _announce(server, port_file)
    print(f"tf.data dispatcher serving on {server.target}", flush=True)
    server.join()


def serve_worker(dispatcher: str, port: int, address: str | None, port_file: Path | None = None) -> None:
    """Runs a worker until killed; `address` is how the trainers reach it (default localhost:PORT;
    `%port%` in it stands for the port, the one the worker chose when `port` is 0)."""
    import tensorflow as tf

    config = tf.data.experimental.service.WorkerConfig(
        dispatcher_address=dispatcher.removeprefix("grpc://"), worker_address=address or "localhost:%port%", port=port
    )
    server = tf.data.experimental.service.WorkerServer(config)
    _announce(server, port_file)
    print(f"tf.data worker on port {bound_port(server)}, dispatcher {dispatcher}", flush=True)
    server.join()


def _announce(server, port_file: Path | None) -> None:
    """Writes the port `server` listens on to `port_file` (renamed into place: a reader never sees half)."""
    if port_file is not None:
        fsutil.atomic_write_text(port_file, f"{bound_port(server)}\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipeline.data_service", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="role", required=True)
    d = sub.add_parser("dispatcher", help="run the dispatcher")
    d.add_argument("--port", type=int, default=5050, help="gRPC port (default 5050)")
    d.add_argument("--work-dir", type=Path, help="journal directory: the dispatcher then survives a restart")
    w = sub.add_parser("worker", help="run an input worker")
    w.add_argument("--dispatcher", required=True, help="HOST:PORT of the dispatcher")
    w.add_argument("--port", type=int, default=5051, help="this worker's gRPC port (default 5051)")
    w.add_argument(
        "--address",
        help="HOST:PORT the trainers use to reach this worker, %%port%% for its port (default localhost:PORT)",
    )
    for role in (d, w):
        role.add_argument(
            "--port-file", type=Path, help="write the port listened on here (with --port 0: the chosen one)"
        )
    args = parser.parse_args(argv)
    from common.runtime import configure_tensorflow

    configure_tensorflow()
    if args.role == "dispatcher":
        return cli.run(lambda: serve_dispatcher(args.port, args.work_dir, args.port_file))
    return cli.run(lambda: serve_worker(args.dispatcher, args.port, args.address, args.port_file))


if __name__ == "__main__":
    sys.exit(main())
