"""Which batches a rank trains on, where its steps fall in the epochs, and the learning rate of each
step: functions of the set-up (models/training/setup.py) and of a `Plan`, which an elastic job's
reset replaces with a new one.

Allreduce steps in lockstep through exact epochs, each rank over its own shards (the epochs counted
from an origin, which an elastic job moves when its world size changes); asynchronous training
shares one job of the epochs' batches among the ranks (a budget counted in data). Both read either
this rank's own tf.data pipeline or a tf.data service.
"""

from __future__ import annotations

import dataclasses
import uuid

from common import catalog
from common.fsutil import read_json
from models.training.config import learning_rate


@dataclasses.dataclass(frozen=True)
class Plan:
    rank: int
    size: int  # the world size
    steps_per_epoch: int  # of one rank
    total_steps: int  # of the whole run
    last_epoch: int  # the epochs needed to reach total_steps
    # Lockstep epochs are counted from an origin: epoch origin[0] began after step origin[1] (an
    # elastic job that changed its world size restarts its epoch at the step it resized).
    origin: tuple = (0, 0)


def steps_per_epoch(setup, size: int) -> int:
    """Steps of one rank per epoch; asynchronous training: the epoch's batches divided by the
    ranks (on average: a faster rank takes more), which are allreduce's batches with the
    service in rank 0, and about as many with an outside one."""
    from pipeline import data_service
    from pipeline.dataset import batch_plan

    c = setup.config
    if c.data_service and not catalog.model(c.model).data_service and not setup.budget_in_data:
        raise ValueError(f"--data-service feeds models that read their batches from it; {c.model} reads its own input")
    if setup.budget_in_data or not c.data_service:
        return batch_plan(setup.shards.split(setup.train_split), size, c.input, training=True).batches
    return max(1, round(data_service.steps_per_epoch(setup.shards, setup.train_split, c.input, size)))


def plan(setup, origin: tuple) -> Plan:
    """The steps of the whole run of this world: per epoch, in all, and the epochs they need."""
    c, size = setup.config, setup.hvd.size()
    per_epoch = steps_per_epoch(setup, size)
    total = c.epochs * per_epoch
    if c.max_steps:
        total = min(total, c.max_steps) if c.epochs else c.max_steps
    return Plan(setup.hvd.rank(), size, per_epoch, total, -(-total // max(1, per_epoch)), tuple(origin))


def replan(setup, old: Plan, origin: tuple, per_epoch: int) -> Plan:
    """Elastic: the plan after a reset for the new world size, whose ranks take `per_epoch` steps an
    epoch: the epoch origin[0] the last commit (at step origin[1]) was in starts again (no utterance
    is skipped, part of that epoch is seen twice), and the run ends with the old plan's last epoch."""
    epoch, step = origin
    total = step + (old.last_epoch - epoch) * per_epoch
    if setup.config.max_steps:
        total = min(total, max(step, setup.config.max_steps))
    return Plan(setup.hvd.rank(), setup.hvd.size(), per_epoch, total, old.last_epoch, (epoch, step))


def _service_batches(setup, plan: Plan, first_epoch: int):
    """This rank's batches from the tf.data service (coordinated reads: one per rank per round)."""
    from pipeline import data_service

    # Horovod: every rank must read under the same job name; rank 0 makes a new one per run, so a
    # resumed run starts a new job instead of rejoining the rounds of a dead one.
    job = setup.hvd.broadcast_object(f"speechflow-{uuid.uuid4().hex[:12]}", root_rank=0)
    served = data_service.service_dataset(
        setup.task.input_pipeline(), setup.shards, setup.train_split, setup.config.input, plan.size, first_epoch
    )
    return data_service.distribute(served, setup.config.data_service, job, plan.rank, plan.size)


def batches(setup, plan: Plan, position: dict):
    """This rank's batches from `position` on, and the tf.data service it started (or None): lockstep
    epochs of its own shards, or asynchronous training's share of a job all ranks read (the tf.data
    service: an outside one, or a dispatcher in rank 0 and a worker in every rank)."""
    c = setup.config
    if setup.budget_in_data:
        return _shared_batches(setup, plan, position)
    first_epoch, start = plan.origin  # the epoch `first_epoch` began at step `start`
    skip = position["step"] - start
    first_epoch, skip = first_epoch + skip // plan.steps_per_epoch, skip % plan.steps_per_epoch
    if c.data_service:
        return iter(_service_batches(setup, plan, first_epoch)), None
    from pipeline.dataset import chain_epochs

    def epoch_batches(epoch):
        return setup.task.dataset(setup.shards, setup.train_split, c.input, plan.rank, plan.size, epoch, True)[0]

    dataset = chain_epochs(epoch_batches, first_epoch, plan.last_epoch, skip, c.input.prefetch_batches)
    return iter(dataset), None


def _shared_batches(setup, plan: Plan, position: dict):
    """Asynchronous training's share of one job of the epochs' batches that all ranks read."""
    from pipeline import data_service

    c = setup.config
    address, service = c.data_service, None
    if not address:
        service = data_service.LocalService(setup.hvd)
        address = service.address
    # Horovod: every rank reads the same job; a new name per run (a resumed run starts afresh).
    job = setup.hvd.broadcast_object(f"speechflow-{uuid.uuid4().hex[:12]}", root_rank=0)
    # A resumed run starts its interrupted epoch again: the ranks' shares of it are not known.
    first_epoch = position.get("epoch", 0)
    shared = data_service.shared_dataset(
        setup.task.input_pipeline(),
        setup.shards,
        setup.train_split,
        c.input,
        first_epoch,
        plan.last_epoch,
        plan.size,
        one_worker=not c.data_service,
    )
    if c.max_steps:  # max_steps per rank, counted for all ranks together (exact with one worker)
        shared = shared.take(max(0, c.max_steps * plan.size - _global_steps_done(setup.workdir)))
    # Task-side additions (the synthesis model's speaker rows) are made here, after the service.
    served = data_service.distribute_shared(shared, address, job)
    return iter(setup.task.prepare(served, setup.shards, setup.train_split)), service


def next_batch(setup, plan: Plan, iterator, step: int):
    """The next batch of `iterator`; None when asynchronous training has used up the epochs'
    batches (its budget is spent). A damaged shard is named; lockstep input ending early is an error."""
    try:
        return next(iterator)
    except setup.tf.errors.DataLossError as err:
        # A record failed its checksum: name the shard (hashing them all costs only now).
        from pipeline import records

        records.check_shards(setup.shards, setup.train_split, content=True)
        raise ValueError(f"rank {plan.rank}: a shard of {setup.shards.root} is damaged ({err.message})") from err
    except StopIteration:
        if setup.budget_in_data:
            return None
        raise RuntimeError(f"rank {plan.rank}: the input ended at step {step} of {plan.total_steps}") from None


def _global_steps_done(workdir) -> int:
    """Asynchronous training: the steps all ranks took before this run (their position files)."""
    return sum((read_json(path) or {}).get("step", 0) for path in (workdir / "positions").glob("rank-*.json"))


def epoch_of(step: int, origin, per_epoch: int) -> int:
    """Lockstep: the epoch of `step` (1-based) when epoch origin[0] began after step origin[1]."""
    return origin[0] + max(0, step - 1 - origin[1]) // per_epoch


def epoch(setup, plan: Plan, step: int) -> int:
    """The epoch this rank's `step` belongs to (asynchronous training: of all ranks' steps)."""
    if not setup.budget_in_data:
        return epoch_of(step, plan.origin, plan.steps_per_epoch)
    done = max(setup.strategy.global_steps, step * plan.size)
    return min(plan.last_epoch - 1, done // (plan.steps_per_epoch * plan.size))


def sample_batch(setup, plan: Plan, epoch: int):
    """One fixed batch for the per-module profile (read outside the training pipeline)."""
    c = setup.config
    dataset, _ = setup.task.dataset(setup.shards, setup.train_split, c.input, plan.rank, plan.size, epoch, True)
    return next(iter(dataset.take(1)))


def set_learning_rate(setup, plan: Plan, step: int) -> float:
    """Sets the rate that step `step` (1-based) will use and returns it; asynchronous training counts
    all ranks' steps together (as the gossip rounds last reported them), divided by the ranks."""
    if setup.budget_in_data and setup.strategy.global_steps:
        step = setup.strategy.global_steps // plan.size + 1
    workers = setup.strategy.lr_workers(plan.size)
    rate = learning_rate(step, setup.config.optim, workers, plan.total_steps)
    setup.optimizer.learning_rate.assign(rate)
    return rate
