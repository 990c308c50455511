"""Which batches a rank trains on, where its steps fall in the epochs, and the learning rate of each
step: the Trainer's schedule, planned again when an elastic job's world size changes.

Allreduce steps in lockstep through exact epochs, each rank over its own shards (the epochs counted
from an origin, which an elastic job moves when its world size changes); asynchronous training
shares one job of the epochs' batches among the ranks (a budget counted in data). Both read either
this rank's own tf.data pipeline or a tf.data service.
"""

from __future__ import annotations

import sys

from common import catalog
from common.fsutil import read_json
from models.tracking import runs as tracking
from models.training.config import learning_rate


class Schedule:
    """The Trainer's input and learning rate, planned from the training state `s` (and planned again
    after an elastic reset)."""

    def __init__(self, state):
        self.s = state
        self.profile_sample = None  # the per-module profile's fixed batch, read once
        self.local_service = None  # asynchronous training's dispatcher and worker inside rank 0

    def steps_per_epoch(self) -> int:
        """Steps of one rank per epoch; asynchronous training: the epoch's batches divided by the
        ranks (on average: a faster rank takes more), which are allreduce's batches with the
        service in rank 0, and about as many with an outside one."""
        from pipeline import data_service
        from pipeline.dataset import batch_plan

        if (
            self.s.config.data_service
            and not catalog.model(self.s.config.model).data_service
            and not self.s.budget_in_data
        ):
            raise ValueError(
                f"--data-service feeds models that read their batches from it; {self.s.config.model} reads its own input"
            )
        if self.s.budget_in_data or not self.s.config.data_service:
            return batch_plan(
                self.s.shards.split(self.s.train_split), self.s.size, self.s.config.input, training=True
            ).batches
        return max(
            1, round(data_service.steps_per_epoch(self.s.shards, self.s.train_split, self.s.config.input, self.s.size))
        )

    def total_steps(self) -> int:
        """Steps of the whole run; also sets `last_epoch`, the epochs needed to reach them."""
        total = self.s.config.epochs * self.s.steps_per_epoch
        if self.s.config.max_steps:
            total = min(total, self.s.config.max_steps) if self.s.config.epochs else self.s.config.max_steps
        self.s.last_epoch = -(-total // max(1, self.s.steps_per_epoch))
        return total

    def _service_batches(self, first_epoch: int):
        """This rank's batches from the tf.data service (coordinated reads: one per rank per round)."""
        import uuid

        from pipeline import data_service

        # Horovod: every rank must read under the same job name; rank 0 makes a new one per run, so a
        # resumed run starts a new job instead of rejoining the rounds of a dead one.
        job = self.s.hvd.broadcast_object(f"speechflow-{uuid.uuid4().hex[:12]}", root_rank=0)
        pipeline = self.s.task.input_pipeline()
        served = data_service.service_dataset(
            pipeline, self.s.shards, self.s.train_split, self.s.config.input, self.s.size, first_epoch
        )
        return data_service.distribute(served, self.s.config.data_service, job, self.s.rank, self.s.size)

    def batches(self):
        """This rank's batches from its position on: lockstep epochs of its own shards, or
        asynchronous training's share of a job all ranks read (the tf.data service: an outside one,
        or a dispatcher in rank 0 and a worker in every rank)."""
        c = self.s.config
        if not self.s.budget_in_data:
            first_epoch, start = self.s.origin  # the epoch `first_epoch` began at step `start`
            skip = self.s.position["step"] - start
            first_epoch, skip = first_epoch + skip // self.s.steps_per_epoch, skip % self.s.steps_per_epoch
            if c.data_service:
                return iter(self._service_batches(first_epoch))
            from pipeline.dataset import chain_epochs

            dataset = chain_epochs(
                lambda e: self.s.task.dataset(
                    self.s.shards, self.s.train_split, c.input, self.s.rank, self.s.size, e, True
                )[0],
                first_epoch,
                self.s.last_epoch,
                skip,
                c.input.prefetch_batches,
            )
            return iter(dataset)
        import uuid

        from pipeline import data_service

        address = c.data_service
        if not address:
            self.local_service = data_service.LocalService(self.s.hvd)
            address = self.local_service.address
        # Horovod: every rank reads the same job; a new name per run (a resumed run starts afresh).
        job = self.s.hvd.broadcast_object(f"speechflow-{uuid.uuid4().hex[:12]}", root_rank=0)
        # A resumed run starts its interrupted epoch again: the ranks' shares of it are not known.
        first_epoch = self.s.position.get("epoch", 0)
        shared = data_service.shared_dataset(
            self.s.task.input_pipeline(),
            self.s.shards,
            self.s.train_split,
            c.input,
            first_epoch,
            self.s.last_epoch,
            self.s.size,
            one_worker=not c.data_service,
        )
        if c.max_steps:  # max_steps per rank, counted for all ranks together (exact with one worker)
            shared = shared.take(max(0, c.max_steps * self.s.size - self._global_steps_done()))
        # Task-side additions (the synthesis model's speaker rows) are made here, after the service.
        return iter(
            self.s.task.prepare(data_service.distribute_shared(shared, address, job), self.s.shards, self.s.train_split)
        )

    def next_batch(self, iterator, step: int):
        """The next batch of `iterator`; None when asynchronous training has used up the epochs'
        batches (its budget is spent). A damaged shard is named; lockstep input ending early is an error."""
        try:
            return next(iterator)
        except self.s.tf.errors.DataLossError as err:
            # A record failed its checksum: name the shard (hashing them all costs only now).
            from pipeline import records

            records.check_shards(self.s.shards, self.s.train_split, content=True)
            raise ValueError(f"rank {self.s.rank}: a shard of {self.s.shards.root} is damaged ({err.message})") from err
        except StopIteration:
            if self.s.budget_in_data:
                return None
            raise RuntimeError(f"rank {self.s.rank}: the input ended at step {step} of {self.s.total_steps}") from None

    def _global_steps_done(self) -> int:
        """Asynchronous training: the steps all ranks took before this run (their position files)."""
        done = 0
        for path in (self.s.workdir / "positions").glob("rank-*.json"):
            done += (read_json(path) or {}).get("step", 0)
        return done

    def epoch_of(self, step: int, origin) -> int:
        """Lockstep: the epoch of `step` (1-based) when epoch origin[0] began after step origin[1]."""
        return origin[0] + max(0, step - 1 - origin[1]) // self.s.steps_per_epoch

    def epoch(self, step: int) -> int:
        """The epoch this rank's `step` belongs to (asynchronous training: of all ranks' steps)."""
        if not self.s.budget_in_data:
            return self.epoch_of(step, self.s.origin)
        done = max(self.s.strategy.global_steps, step * self.s.size)
        return min(self.s.last_epoch - 1, done // (self.s.steps_per_epoch * self.s.size))

    def sample_batch(self, epoch: int):
        """One fixed batch for the per-module profile (read once, outside the training pipeline)."""
        dataset, _ = self.s.task.dataset(
            self.s.shards, self.s.train_split, self.s.config.input, self.s.rank, self.s.size, epoch, True
        )
        self.profile_sample = next(iter(dataset.take(1)))
        return self.profile_sample

    def set_learning_rate(self, step: int) -> None:
        """Sets the rate that step `step` (1-based) will use; asynchronous training counts all ranks'
        steps together (as the gossip rounds last reported them), divided by the ranks."""
        if self.s.budget_in_data and self.s.strategy.global_steps:
            step = self.s.strategy.global_steps // self.s.size + 1
        workers = self.s.strategy.lr_workers(self.s.size)
        self.s.current_lr = learning_rate(step, self.s.config.optim, workers, self.s.total_steps)
        self.s.optimizer.learning_rate.assign(self.s.current_lr)

    def on_reset(self, committed, log, world_sizes: list) -> None:
        """Elastic: the world changed. The survivors (and new workers) go on from the last commit:
        the epoch it was in starts again for the new world size (no utterance is skipped, part of
        that epoch is seen twice), the learning rate follows the new size. `committed`: Horovod's
        elastic state (models/distributed/elastic.py); `world_sizes`: the run's (step, size) list."""
        self.s.rank, self.s.size = self.s.hvd.rank(), self.s.hvd.size()
        step = committed.step
        epoch = self.epoch_of(step, committed.origin)
        world_sizes.append([step, self.s.size])
        self.s.steps_per_epoch = self.steps_per_epoch()
        committed.origin = [epoch, step]
        self.s.origin = (epoch, step)
        # Horovod: after this callback, sync() sets every attribute back to the last saved state
        # (rank 0's, broadcast); without a save here the old origin would return, and the input
        # would skip into the epoch by the old world size's steps while the count is of the new.
        committed.save()  # the weights it saves are those just restored from the commit
        self.s.total_steps = step + (self.s.last_epoch - epoch) * self.s.steps_per_epoch
        if self.s.config.max_steps:
            self.s.total_steps = min(self.s.total_steps, max(step, self.s.config.max_steps))
        self.set_learning_rate(step + 1)
        print(f"rank {self.s.rank}: the job now has {self.s.size} workers; going on from step {step}", file=sys.stderr)
        if self.s.rank == 0:
            log.log_metric("world_size", self.s.size, step=step)
            try:
                tracking.client().set_tag(log.run_id, "speechflow.world_size_changes", repr(world_sizes))
            except Exception as err:  # MLflow down: the metric above waits in the log's spool; the tag is lost
                print(f"rank {self.s.rank}: could not tag the MLflow run ({err})", file=sys.stderr)
