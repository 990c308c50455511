"""The training loop behind `models.train`, one process per Horovod rank, read top to bottom:

    train()       set-up, the restored position and the plan of the steps; rank 0 opens its MLflow run
    _loop()       the steps: a batch, the step (gradients, reduced and applied), bookkeeping, checkpoints
    _wrap_up()    the summary, the last checkpoint, the last dev evaluation and the final model

What the loop calls are libraries that take values and return values: models/training/setup.py
(what a rank trains with, made once), schedule.py (the plan of the steps, the batches, the learning
rate), step.py (the compiled step), persistence.py (checkpoints, the final model), reporting.py
(MLflow), dev_selection.py (the best weights on dev), timing.py (the step-time breakdown),
system_metrics.py and plots.py; the strategies are models/distributed/. The values that move while
the run goes on (the position, the plan, the counts) are this file's locals.

Every place Horovod touches a training run is marked `# Horovod:` where it happens; outside this file:
- common/runtime.py `configure_tensorflow`: each rank's share of the cores and its local GPU.
- models/distributed/strategies.py `init_horovod` (`hvd.init`), `Allreduce` (the gradients' grouped
  allreduce, rank 0's weights broadcast) and `sum_over_ranks` (the dev split's counts summed).
- models/distributed/gossip.py `GossipStrategy`: pairwise averages by a communication thread.
- models/distributed/hvd_compat.py: Keras 3 variables handed to Horovod as their `tf.Variable`s.
- models/distributed/elastic.py: Horovod elastic's state, commits and resets.
- pipeline/dataset.py: each rank reads its own shards; every rank gets the same number of batches.
- models/training/reporting.py `shared_run_id` and `gather`: rank 0's MLflow run id broadcast, every
  rank's figures gathered.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import sys
import time
from pathlib import Path

from common import catalog
from common import config as configlib
from common.fsutil import atomic_write_json
from common.progress import progress as progress_bar
from models.tracking import runs as tracking
from models.tracking.spool import RunLog, spool_path
from models.training import persistence, reporting, schedule
from models.training.config import TrainConfig
from models.training.faults import Faults
from models.training.setup import Setup, set_up
from models.training.step import CompiledStep, seed, slow_down, sync_accelerators
from models.training.system_metrics import SystemMetrics
from models.training.timing import StepTimes


@dataclasses.dataclass
class Progress:
    """What a run accumulates across its steps (and across an elastic job's resets); the loop alone writes it."""

    start_step: int
    times: StepTimes = dataclasses.field(default_factory=StepTimes)
    history: list = dataclasses.field(default_factory=list)
    dev_history: list = dataclasses.field(default_factory=list)  # dev metrics every eval_every steps
    profile_sums: dict = dataclasses.field(default_factory=dict)
    profiles: int = 0
    profile_sample: object = None  # the per-module profile's fixed batch, read once
    loss: float = float("nan")
    counts: dict = dataclasses.field(default_factory=lambda: dict.fromkeys(("batches", "utterances", "frames"), 0))

    def profile_ms(self) -> dict[str, float]:
        """The synthesis model's per-module profile: mean milliseconds of each module so far."""
        return {f"profile_{k[:-2]}_ms": 1000 * v / self.profiles for k, v in self.profile_sums.items()}


def train(
    config: TrainConfig,
    shards: Path,
    workdir: Path,
    parent_run_id: str | None = None,
    run_name: str | None = None,
    faults: Faults | None = None,
) -> dict:
    """Trains on `shards` into `workdir` (resuming if it holds a checkpoint). Returns a summary dict."""
    from models.distributed.strategies import make_strategy

    faults, workdir = faults or Faults(), Path(workdir)
    setup = set_up(config, Path(shards), workdir)
    c, hvd = setup.config, setup.hvd
    position = persistence.restore(setup, hvd.rank())
    plan = schedule.plan(setup, tuple(position.get("origin", (0, 0))))
    setup = dataclasses.replace(
        setup, strategy=make_strategy(c.strategy, setup.model.trainable_variables, setup.optimizer)
    )
    _check_elastic(c)
    dev = _dev_selection(setup, plan)
    schedule.set_learning_rate(setup, plan, position["step"] + 1)
    compiled = CompiledStep(setup.tf, setup.task, setup.model, setup.optimizer, setup.strategy)
    finished = persistence.finished_summary(workdir, position, plan.total_steps)
    if finished:
        # A re-run of a finished training (a retried task) changes nothing and logs nothing again.
        if plan.rank == 0:
            print(f"{workdir} already holds this training ({finished['steps']} steps); nothing to do", file=sys.stderr)
        return {**finished, "rank": plan.rank, "skipped": True}
    progress, world_sizes = Progress(start_step=position["step"]), []  # world_sizes: (step, size) at every reset
    with contextlib.ExitStack() as stack:
        stack.callback(setup.strategy.close)
        log, bar, run_id = _open_run(stack, setup, plan, position, parent_run_id, run_name)
        with SystemMetrics(log, plan.rank, hvd.local_rank()):
            parts = {"setup": setup, "compiled": compiled, "dev": dev, "progress": progress, "log": log, "bar": bar}
            if c.elastic:
                from models.distributed import elastic

                # Horovod: elastic; the loop runs again from the last commit after every reset.
                committed = _elastic_state(setup, plan, position, log, world_sizes)
                position, plan, service = elastic.run(_loop)(committed, plan, position, world_sizes, faults, **parts)
            else:
                # Horovod: every rank takes rank 0's weights and optimizer state before the first step.
                setup.strategy.start()
                position, plan, service = _loop(None, plan, position, world_sizes, faults, **parts)
            summary = _wrap_up(setup, plan, position, progress, dev, log, run_id, world_sizes)
        if bar is not None:
            import mlflow

            bar.close()
            reporting.log_final(setup, mlflow, summary)
        log.close()
    del service  # asynchronous training's tf.data service in rank 0, kept up until every rank is done
    return summary


def _loop(committed, plan, position, world_sizes, faults, *, setup, compiled, dev, progress, log, bar):
    """Steps from `position` to the end of the budget; returns the last position, the plan and the
    tf.data service this rank started (asynchronous training's rank 0; else None). Elastic:
    `committed` (Horovod's elastic state) is committed every commit_every steps; after a reset Horovod
    calls this again, and the run goes on from the last commit."""
    c, strategy, tf = setup.config, setup.strategy, setup.tf
    guard = contextlib.nullcontext()
    if committed is not None:  # Horovod: elastic; a failed collective resets the job to the last commit
        from models.distributed import elastic

        position, plan = _elastic_position(setup, plan, committed, world_sizes)
        guard = elastic.resets_on_failed_collectives()
    step = position["step"]
    more = not position.get("done") and (setup.budget_in_data or step < plan.total_steps)
    with guard:
        # This rank's own input pipeline, or with --data-service the tf.data service's batches (schedule.py).
        iterator, service = schedule.batches(setup, plan, position) if more else (iter(()), None)
        while setup.budget_in_data or step < plan.total_steps:
            started = time.perf_counter()
            batch = schedule.next_batch(setup, plan, iterator, step)
            if batch is None:
                break  # the epochs' batches are used up: the budget is spent
            times = {"input": time.perf_counter() - started}
            step += 1
            faults.before_step(step, plan.rank)
            step_seed = seed(tf, c.seed, plan.rank, step)
            with strategy.step_lock():  # gossip: its thread reads and writes the weights between steps only
                started = time.perf_counter()
                if strategy.fused_step:
                    # Horovod: the gradients averaged inside the step (DistributedGradientTape).
                    loss, aux, frames = compiled.traced_fused(batch)(batch, step_seed)
                    loss = float(loss)  # waits for the step
                    times["compute"], times["communication"] = time.perf_counter() - started, 0.0
                else:
                    loss, aux, frames, grads = compiled.traced_compute(batch)(batch, step_seed)
                    sync_accelerators(tf, setup.gpus)
                    times["compute"] = time.perf_counter() - started
                    started = time.perf_counter()
                    grads = strategy.reduce(grads)  # Horovod: allreduce averages the gradients (gossip keeps them)
                    sync_accelerators(tf, setup.gpus)
                    times["communication"] = time.perf_counter() - started
                    started = time.perf_counter()
                    compiled.apply(grads)
                    loss = float(loss)
                    times["compute"] += time.perf_counter() - started
            extra = faults.extra_work(plan.rank)
            if extra:
                times["compute"] += slow_down(compiled.traced_compute(batch), batch, step_seed, extra, times["compute"])
            times["compute"] += faults.after_step(step, plan.rank)
            times["communication"] += strategy.after_step(step)  # Horovod: gossip merges a partner's weights
            utterances, aux = int(tf.shape(batch["utt_id"])[0]), {k: float(v) for k, v in aux.items()}
            position = _after_step(
                setup, plan, progress, dev, log, bar, step, loss, aux, times, int(frames), utterances
            )
            if committed is not None and step % c.commit_every == 0:
                committed.step, committed.origin = step, list(plan.origin)
                committed.commit()  # Horovod: a collective; raises to reset when hosts changed
    return {**position, "step": step}, plan, service


def _after_step(setup, plan, progress, dev, log, bar, step, loss, aux, times, frames, utterances) -> dict:
    """The bookkeeping of step `step`: counts, learning rate, profile, progress bar, metrics, dev
    evaluation and checkpoint. Returns the position after it."""
    c, run = setup.config, progress
    run.loss = loss
    run.counts["batches"] += 1
    run.counts["utterances"] += utterances
    run.counts["frames"] += frames
    lr = schedule.set_learning_rate(setup, plan, step + 1)
    run.times.add(times, frames, counted=step > run.start_step + c.warmup_exclude)
    epoch = schedule.epoch(setup, plan, step)
    if setup.task.profile_every and c.profile_every and step % c.profile_every == 0 and step > c.warmup_exclude:
        _profile(setup, plan, run, epoch)
    position = {"epoch": epoch, "step": step, "origin": list(plan.origin)}
    if bar is not None:
        bar.update(1)
        bar.set_postfix(loss=f"{loss:.3f}", frames_s=f"{run.times.summary().get('frames_per_s', 0):.0f}", refresh=False)
    if plan.rank == 0 and (step % c.log_every == 0 or step == plan.total_steps):
        record = {"loss": loss, "learning_rate": lr, "epoch": epoch, **aux}
        run.history.append(reporting.log_step(setup, run, log, step, record))
    if dev is not None and dev.due(step, last=False) and step < plan.total_steps:
        started = time.perf_counter()
        metrics = dev.evaluate(step)
        run.times.exclude(time.perf_counter() - started)  # not training time
        log.log_metrics(metrics, step=step)
        run.dev_history.append({"step": step, **metrics})
    if step % c.checkpoint_every == 0:
        # Horovod: rank 0 writes the checkpoint (asynchronous training: every rank its position).
        persistence.save_checkpoint(setup, plan.rank, position, step)
    return position


def _profile(setup, plan, run: Progress, epoch: int) -> None:
    """The synthesis model's per-module timings on one fixed batch, added to the run's sums."""
    started = time.perf_counter()
    if run.profile_sample is None:
        run.profile_sample = schedule.sample_batch(setup, plan, epoch)
    if not run.profiles:
        setup.task.profile(setup.model, run.profile_sample)  # compiles the per-module functions
    for key, value in setup.task.profile(setup.model, run.profile_sample).items():
        run.profile_sums[key] = run.profile_sums.get(key, 0.0) + value
    run.profiles += 1
    run.times.exclude(time.perf_counter() - started)  # not training time


def _wrap_up(setup, plan, position, progress, dev, log, run_id, world_sizes) -> dict:
    """After the last step: the strategy's end (gossip's consensus), every rank's figures gathered,
    the last checkpoint, the last weights evaluated on dev, and rank 0's final model. Returns the summary."""
    strategy, run, step = setup.strategy, progress, position["step"]
    # Horovod: this rank has taken its last step; gossip's thread goes on with rounds until every rank has.
    strategy.training_finished()
    # "done": asynchronous training has spent its budget (its ranks' step counts say nothing).
    position = {**position, "done": setup.budget_in_data}
    timing = run.times.summary()  # before finish(): a fast gossip worker may wait there for slower partners
    final = strategy.finish()  # Horovod: the ranks join; gossip averages them once (the consensus model)
    summary = {
        "rank": plan.rank,
        "world_size": plan.size,
        "threads_per_rank": {k: setup.threads[k] for k in ("intra_op_threads", "inter_op_threads")},
        "run_id": run_id,
        "steps": step,
        "resumed_from_step": run.start_step,
        "final_loss": run.loss,
        **{f"trained_{k}": v for k, v in run.counts.items()},
        **final,
        **timing,
        "world_size_changes": world_sizes,
        "history": run.history,
        "dev_history": run.dev_history,
    }
    if run.profiles:
        summary.update(run.profile_ms())
    summary.update(reporting.gather(setup, summary))  # Horovod: every rank's figures on every rank
    # Horovod: rank 0 writes the last checkpoint.
    persistence.save_checkpoint(setup, plan.rank, position, step)
    if dev is not None and dev.enabled:
        # The last weights (the consensus, under gossip) are evaluated too; the best on dev is saved.
        metrics = dev.evaluate(step)
        log.log_metrics(metrics, step=step)
        summary.update({f"last_{k}": v for k, v in metrics.items()}, **dev.restore_best())
        summary["dev_clock_started_unix_s"] = dev.started_unix_s
    if plan.rank == 0:
        summary.update(setup.task.finish(setup.model, setup.shards, setup.config))
        persistence.save_model(setup, summary)
    return summary


def _open_run(stack, setup: Setup, plan, position, parent_run_id, run_name):
    """The run's metrics log (through a spool that keeps them beside the checkpoints while MLflow is
    down), rank 0's progress bar (None elsewhere) and MLflow run id. Rank 0 opens (or resumes) the
    MLflow run on `stack` and logs a new run's params; every other rank logs into that run."""
    c, workdir, rank = setup.config, setup.workdir, plan.rank
    if rank != 0:
        # MLflow is imported before waiting for the run's id, while rank 0 opens the run: after it,
        # every rank waited for this one's import (seconds) at the weights' broadcast.
        import mlflow  # noqa: F401

        run_id = reporting.shared_run_id(setup, rank, None)  # Horovod: rank 0's run id, broadcast
        return RunLog(run_id, spool_path(workdir, rank)), None, run_id
    configlib.save(c, workdir / "config.yaml")
    atomic_write_json(workdir / "manifest_fingerprint.json", setup.shards.fingerprint)
    previous = tracking.load_run_file(workdir)
    resume_id = previous["run_id"] if previous and position["step"] else None
    if resume_id is not None and not tracking.run_exists(resume_id):
        raise FileNotFoundError(
            f"{workdir / tracking.RUN_FILE} names MLflow run {resume_id}, which the tracking store "
            f"{tracking.tracking_uri()} does not have, so the checkpoint's run cannot be resumed: set "
            "MLFLOW_TRACKING_URI to the store it was tracked in, or delete that file to go on from the "
            "checkpoint in a new run"
        )
    tags = {"speechflow.stage": f"train_{c.model}", "speechflow.strategy": c.strategy.name}
    name = run_name or f"train-{c.model}-{c.strategy.name}"
    run = stack.enter_context(tracking.start_run(c.experiment, name, parent_run_id, resume_id, tags))
    run_id = run.info.run_id
    tracking.save_run_file(workdir, run_id, c.experiment)
    reporting.shared_run_id(setup, rank, run_id)  # Horovod: rank 0's run id to every rank
    if resume_id is None:
        reporting.log_params(setup, plan)
    desc = f"train {c.model}"
    bar = progress_bar(total=plan.total_steps, initial=position["step"], desc=desc, unit="step", dynamic_ncols=True)
    return RunLog(run_id, spool_path(workdir, 0)), bar, run_id


def _dev_selection(setup: Setup, plan):
    """The dev evaluation of this rank, or None. Equal replicas share the dev split (each rank its
    shards, the counts summed); otherwise rank 0 evaluates its own weights while the others go on.
    Elastic keeps rank 0 alone: the shares would change with the world size."""
    from models.distributed.strategies import sum_over_ranks

    c, declared = setup.config, catalog.strategy(setup.config.strategy.name)
    shared = declared.replicas_equal and not c.elastic and plan.size > 1
    if plan.rank != 0 and not shared:
        return None
    from models.training.dev_selection import DevSelection

    # Horovod: the ranks' dev counts summed by an allreduce.
    share = (plan.rank, plan.size, functools.partial(sum_over_ranks, setup.hvd)) if shared else None
    return DevSelection(setup.task, setup.model, setup.shards, c, setup.workdir, setup.owners(), share)


def _check_elastic(c: TrainConfig) -> None:
    """Refuses --elastic with a strategy that does not survive lost workers."""
    if c.elastic and not catalog.strategy(c.strategy.name).supports_elastic:
        elastic = " or ".join(n for n, e in catalog.strategies().items() if e.supports_elastic)
        raise ValueError(
            f"--elastic works with --strategy {elastic}: {c.strategy.name} does not survive lost workers "
            "(gossip keeps a process set per pair, and a survivor of a killed worker then aborts inside "
            "Horovod 0.28.1: horovod/horovod#4021)"
        )


def _elastic_state(setup, plan, position, log, world_sizes):
    """Horovod elastic: the state every survivor goes back to when a worker is lost, and that a new
    worker receives; committed every commit_every steps (and checked for new hosts then)."""
    from models.distributed import elastic

    per_epoch = plan.steps_per_epoch
    committed = elastic.KerasState(
        setup.model, setup.optimizer, step=position["step"], origin=plan.origin, per_epoch=per_epoch
    )
    committed.register_reset_callbacks([functools.partial(_on_reset, setup, committed, log, world_sizes)])
    return committed


def _elastic_position(setup, plan, committed, world_sizes):
    """Horovod elastic: where the run goes on from, and its plan, on entering the loop: the last
    commit's step and epoch origin; after a reset (`world_sizes` not empty), the plan of the new world."""
    origin = tuple(committed.origin)
    if world_sizes:
        plan = schedule.replan(setup, plan, origin, committed.per_epoch)
        schedule.set_learning_rate(setup, plan, committed.step + 1)
    else:
        plan = dataclasses.replace(plan, origin=origin)
    step = committed.step
    return {"step": step, "epoch": schedule.epoch_of(step, origin, plan.steps_per_epoch)}, plan


def _on_reset(setup, committed, log, world_sizes: list) -> None:
    """Horovod elastic: the world changed. The survivors (and new workers) go on from the last commit:
    the epoch it was in starts again for the new world size (no utterance is skipped, part of that
    epoch is seen twice), the learning rate follows the new size (models/training/schedule.py `replan`).
    `committed`: Horovod's elastic state (models/distributed/elastic.py); `world_sizes`: the run's
    (step, size) list."""
    rank, size = setup.hvd.rank(), setup.hvd.size()
    step = committed.step
    epoch = schedule.epoch_of(step, committed.origin, committed.per_epoch)
    world_sizes.append([step, size])
    committed.origin, committed.per_epoch = [epoch, step], schedule.steps_per_epoch(setup, size)
    # Horovod: after this callback, sync() sets every attribute back to the last saved state
    # (rank 0's, broadcast); without a save here the old origin would return, and the input
    # would skip into the epoch by the old world size's steps while the count is of the new.
    committed.save()  # the weights it saves are those just restored from the commit
    print(f"rank {rank}: the job now has {size} workers; going on from step {step}", file=sys.stderr)
    if rank == 0:
        log.log_metric("world_size", size, step=step)
        try:
            tracking.client().set_tag(log.run_id, "speechflow.world_size_changes", repr(world_sizes))
        except Exception as err:  # MLflow down: the metric above waits in the log's spool; the tag is lost
            print(f"rank {rank}: could not tag the MLflow run ({err})", file=sys.stderr)
