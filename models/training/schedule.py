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
    """Mixed into models.training.loop.Trainer: the methods that plan its input and its learning rate, and
    plan them again after an elastic reset."""

    def _steps_per_epoch(self) -> int:
        """Steps of one rank per epoch; asynchronous training: the epoch's batches divided by the
        ranks (on average: a faster rank takes more), which are allreduce's batches with the
        service in rank 0, and about as many with an outside one."""
        from pipeline import data_service
        from pipeline.dataset import batch_plan

        if self.config.data_service and not catalog.model(self.config.model).data_service and not self.budget_in_data:
            raise ValueError(
                f"--data-service feeds models that read their batches from it; {self.config.model} reads its own input"
            )
        if self.budget_in_data or not self.config.data_service:
            return batch_plan(self.shards.split("train"), self.size, self.config.input, training=True).batches
        return max(1, round(data_service.steps_per_epoch(self.shards, "train", self.config.input, self.size)))

    def _total_steps(self) -> int:
        """Steps of the whole run; also sets `last_epoch`, the epochs needed to reach them."""
        total = self.config.epochs * self.steps_per_epoch
        if self.config.max_steps:
            total = min(total, self.config.max_steps) if self.config.epochs else self.config.max_steps
        self.last_epoch = -(-total // max(1, self.steps_per_epoch))
        return total

    def _service_batches(self, first_epoch: int):
        """This rank's batches from the tf.data service (coordinated reads: one per rank per round)."""
        import uuid

        from pipeline import data_service

        # Horovod: every rank must read under the same job name; rank 0 makes a new one per run, so a
        # resumed run starts a new job instead of rejoining the rounds of a dead one.
        job = self.hvd.broadcast_object(f"speechflow-{uuid.uuid4().hex[:12]}", root_rank=0)
        pipeline = self.task.input_pipeline()
        served = data_service.service_dataset(pipeline, self.shards, "train", self.config.input, self.size, first_epoch)
        return data_service.distribute(served, self.config.data_service, job, self.rank, self.size)

    def _batches(self):
        """This rank's batches from its position on: lockstep epochs of its own shards, or
        asynchronous training's share of a job all ranks read (the tf.data service: an outside one,
        or a dispatcher in rank 0 and a worker in every rank)."""
        c = self.config
        if not self.budget_in_data:
            first_epoch, start = self._origin  # the epoch `first_epoch` began at step `start`
            skip = self.position["step"] - start
            first_epoch, skip = first_epoch + skip // self.steps_per_epoch, skip % self.steps_per_epoch
            if c.data_service:
                return iter(self._service_batches(first_epoch))
            from pipeline.dataset import chain_epochs

            dataset = chain_epochs(
                lambda e: self.task.dataset(self.shards, "train", c.input, self.rank, self.size, e, True)[0],
                first_epoch,
                self.last_epoch,
                skip,
                c.input.prefetch_batches,
            )
            return iter(dataset)
        import uuid

        from pipeline import data_service

        address = c.data_service
        if not address:
            self._local_service = data_service.LocalService(self.hvd)
            address = self._local_service.address
        # Horovod: every rank reads the same job; a new name per run (a resumed run starts afresh).
        job = self.hvd.broadcast_object(f"speechflow-{uuid.uuid4().hex[:12]}", root_rank=0)
        # A resumed run starts its interrupted epoch again: the ranks' shares of it are not known.
        first_epoch = self.position.get("epoch", 0)
        shared = data_service.shared_dataset(
            self.task.input_pipeline(),
            self.shards,
            "train",
            c.input,
            first_epoch,
            self.last_epoch,
            self.size,
            one_worker=not c.data_service,
        )
        if c.max_steps:  # max_steps per rank, counted for all ranks together (exact with one worker)
            shared = shared.take(max(0, c.max_steps * self.size - self._global_steps_done()))
        # Task-side additions (the synthesis model's speaker rows) are made here, after the service.
        return iter(self.task.prepare(data_service.distribute_shared(shared, address, job), self.shards, "train"))

    def _next_batch(self, iterator, step: int):
        """The next batch of `iterator`; None when asynchronous training has used up the epochs'
        batches (its budget is spent). A damaged shard is named; lockstep input ending early is an error."""
        try:
            return next(iterator)
        except self.tf.errors.DataLossError as err:
            # A record failed its checksum: name the shard (hashing them all costs only now).
            from pipeline import records

            records.check_shards(self.shards, "train", content=True)
            raise ValueError(f"rank {self.rank}: a shard of {self.shards.root} is damaged ({err.message})") from err
        except StopIteration:
            if self.budget_in_data:
                return None
            raise RuntimeError(f"rank {self.rank}: the input ended at step {step} of {self.total_steps}") from None

    def _global_steps_done(self) -> int:
        """Asynchronous training: the steps all ranks took before this run (their position files)."""
        done = 0
        for path in (self.workdir / "positions").glob("rank-*.json"):
            done += (read_json(path) or {}).get("step", 0)
        return done

    def _epoch_of(self, step: int, origin) -> int:
        """Lockstep: the epoch of `step` (1-based) when epoch origin[0] began after step origin[1]."""
        return origin[0] + max(0, step - 1 - origin[1]) // self.steps_per_epoch

    def _epoch(self, step: int) -> int:
        """The epoch this rank's `step` belongs to (asynchronous training: of all ranks' steps)."""
        if not self.budget_in_data:
            return self._epoch_of(step, self._origin)
        done = max(self.strategy.global_steps, step * self.size)
        return min(self.last_epoch - 1, done // (self.steps_per_epoch * self.size))

    def _sample_batch(self, epoch: int):
        """One fixed batch for the per-module profile (read once, outside the training pipeline)."""
        dataset, _ = self.task.dataset(self.shards, "train", self.config.input, self.rank, self.size, epoch, True)
        self._profile_sample = next(iter(dataset.take(1)))
        return self._profile_sample

    def _set_learning_rate(self, step: int) -> None:
        """Sets the rate that step `step` (1-based) will use; asynchronous training counts all ranks'
        steps together (as the gossip rounds last reported them), divided by the ranks."""
        if self.budget_in_data and self.strategy.global_steps:
            step = self.strategy.global_steps // self.size + 1
        workers = self.strategy.lr_workers(self.size)
        self.current_lr = learning_rate(step, self.config.optim, workers, self.total_steps)
        self.optimizer.learning_rate.assign(self.current_lr)

    def _on_reset(self, state, log) -> None:
        """Elastic: the world changed. The survivors (and new workers) go on from the last commit:
        the epoch it was in starts again for the new world size (no utterance is skipped, part of
        that epoch is seen twice), the learning rate follows the new size."""
        self.rank, self.size = self.hvd.rank(), self.hvd.size()
        step = state.step
        epoch = self._epoch_of(step, state.origin)
        self._progress.world_sizes.append([step, self.size])
        self.steps_per_epoch = self._steps_per_epoch()
        state.origin = [epoch, step]
        self._origin = (epoch, step)
        # Horovod: after this callback, sync() sets every attribute back to the last saved state
        # (rank 0's, broadcast); without a save here the old origin would return, and the input
        # would skip into the epoch by the old world size's steps while the count is of the new.
        state.save()  # the weights it saves are those just restored from the commit
        self.total_steps = step + (self.last_epoch - epoch) * self.steps_per_epoch
        if self.config.max_steps:
            self.total_steps = min(self.total_steps, max(step, self.config.max_steps))
        self._set_learning_rate(step + 1)
        print(f"rank {self.rank}: the job now has {self.size} workers; going on from step {step}", file=sys.stderr)
        if self.rank == 0:
            log.log_metric("world_size", self.size, step=step)
            try:
                tracking.client().set_tag(log.run_id, "speechflow.world_size_changes", repr(self._progress.world_sizes))
            except Exception as err:  # MLflow down: the metric above waits in the log's spool; the tag is lost
                print(f"rank {self.rank}: could not tag the MLflow run ({err})", file=sys.stderr)
