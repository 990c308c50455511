"""The training loop behind `models.train`: one Trainer per process (one per Horovod rank).

Here: the set-up, the run (rank 0's inside its MLflow run) and the step loop. What the run shares
is one declared object, `TrainingState` (models/training/state.py); the Trainer's collaborators
read it, each in a module of its own: the schedule (which batches a rank reads, the learning rate
of each step, the re-planning after an elastic job's reset: schedule.py), the stepper (one
training step: step.py), persistence (checkpoints, resumption and the final model:
persistence.py), the report (what the run sends to MLflow: reporting.py) and the dev selection
(dev_selection.py); the step-time breakdown is timing.py.

Every place Horovod touches a training run, listed from here so a reader finds them all:
- common/runtime.py `configure_tensorflow`: each rank's share of the cores and its local GPU.
- models/distributed/strategies.py `init_horovod`: `hvd.init` (dynamic process sets when gossip needs them).
- models/distributed/strategies.py `Allreduce`: gradients averaged by `grouped_allreduce` every step (or by
  `DistributedGradientTape` in the fused step); rank 0's weights and optimizer state broadcast to
  every rank after the first step.
- models/distributed/strategies.py `sum_over_ranks`: under allreduce, the counts of each rank's share
  of the dev split summed (models/training/dev_selection.py).
- models/distributed/gossip.py `GossipStrategy`: one process set per pair of a matching, pairwise averages by
  a communication thread, one global average at the end (the consensus model).
- models/distributed/hvd_compat.py: Keras 3 variables handed to Horovod as their `tf.Variable`s.
- models/distributed/elastic.py, with models/training/schedule.py `on_reset`: Horovod elastic's commits and resets.
- pipeline/dataset.py: each rank reads its own shards; every rank gets the same number of batches.
- models/training/reporting.py `shared_run_id`: rank 0's MLflow run id broadcast to every rank.
- models/training/reporting.py `gather`: `allgather_object` of each rank's throughput, memory and weight digest.
- Only rank 0 writes checkpoints and the model, logs to MLflow and draws the progress bar.
"""

from __future__ import annotations

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
from models.training.config import TrainConfig
from models.training.hooks import TrainHooks
from models.training.persistence import Persistence
from models.training.reporting import Reporting
from models.training.schedule import Schedule
from models.training.state import TrainingState, set_up
from models.training.step import Stepper
from models.training.system_metrics import SystemMetrics
from models.training.timing import StepTimes


@dataclasses.dataclass
class _Progress:
    """What a run accumulates across its steps (and across an elastic job's resets)."""

    start_step: int
    times: StepTimes = dataclasses.field(default_factory=StepTimes)
    history: list = dataclasses.field(default_factory=list)
    dev_history: list = dataclasses.field(default_factory=list)  # dev metrics every eval_every steps
    profile_sums: dict = dataclasses.field(default_factory=dict)
    profiles: int = 0
    loss: float = float("nan")
    counts: dict = dataclasses.field(default_factory=lambda: dict.fromkeys(("batches", "utterances", "frames"), 0))
    world_sizes: list = dataclasses.field(default_factory=list)  # (step, size) at every elastic reset

    def profile_ms(self) -> dict[str, float]:
        """The synthesis model's per-module profile: mean milliseconds of each module so far."""
        return {f"profile_{k[:-2]}_ms": 1000 * v / self.profiles for k, v in self.profile_sums.items()}


class Trainer:
    """One rank's training: the set-up of its `TrainingState` (models/training/state.py), then the
    step loop, with its collaborators around that state: the schedule (input and learning rate),
    the stepper (one training step), persistence (checkpoints, the final model), the report
    (MLflow), and the dev selection (the best weights on dev)."""

    def __init__(
        self,
        config: TrainConfig,
        shards: Path,
        workdir: Path,
        parent_run_id: str | None,
        run_name: str | None,
        hooks: TrainHooks | None = None,
    ):
        self.config, self.shard_dir, self.workdir = config, shards, workdir
        self.hooks = hooks or TrainHooks()
        self.parent_run_id, self.run_name = parent_run_id, run_name
        self.state: TrainingState | None = None  # set up by run()

    # -- set-up -----------------------------------------------------------------------------------

    def _setup(self) -> TrainingState:
        from models.distributed.strategies import make_strategy, sum_over_ranks

        s = self.state = set_up(self.config, self.shard_dir, self.workdir)
        c, declared = s.config, catalog.strategy(s.config.strategy.name)
        self.schedule, self.persistence, self.report = Schedule(s), Persistence(s), Reporting(s)
        s.position = self.persistence.restore()
        s.steps_per_epoch = self.schedule.steps_per_epoch()
        s.total_steps = self.schedule.total_steps()
        s.strategy = make_strategy(c.strategy, s.model.trainable_variables, s.optimizer)
        s.origin = tuple(s.position.get("origin", (0, 0)))
        if c.elastic and not declared.supports_elastic:
            elastic = " or ".join(n for n, e in catalog.strategies().items() if e.supports_elastic)
            raise ValueError(
                f"--elastic works with --strategy {elastic}: {c.strategy.name} does not survive lost workers "
                "(gossip keeps a process set per pair, and a survivor of a killed worker then aborts inside "
                "Horovod 0.28.1: horovod/horovod#4021)"
            )
        self.dev = None
        # Equal replicas share the dev split (each rank its shards, the counts summed); otherwise
        # rank 0 evaluates its own weights while the others go on. Elastic keeps rank 0 alone: the
        # shares would change with the world size.
        shared = declared.replicas_equal and not c.elastic and s.size > 1
        if s.rank == 0 or shared:
            from models.training.dev_selection import DevSelection

            share = (s.rank, s.size, functools.partial(sum_over_ranks, s.hvd)) if shared else None
            self.dev = DevSelection(s.task, s.model, s.shards, c, self.workdir, s.owners(), share)
        self.schedule.set_learning_rate(s.position["step"] + 1)
        self.stepper = Stepper(s)
        return s

    # -- the loop ---------------------------------------------------------------------------------

    def run(self) -> dict:
        s = self._setup()
        finished = self.persistence.finished_summary()
        if finished:
            # A re-run of a finished training (a retried task) changes nothing and logs nothing again.
            if s.rank == 0:
                print(
                    f"{self.workdir} already holds this training ({finished['steps']} steps); nothing to do",
                    file=sys.stderr,
                )
            return {**finished, "rank": s.rank, "skipped": True}
        try:
            if s.rank == 0:
                return self._run_rank0()
            # Every rank logs its system metrics (and, should it become rank 0 in an elastic job,
            # the training metrics) into rank 0's MLflow run, through a log that outlasts an outage.
            # MLflow is imported before waiting for the run's id, while rank 0 opens the run: after
            # it, every rank waited for this one's import (seconds) at the weights' broadcast.
            import mlflow  # noqa: F401

            log = RunLog(self.report.shared_run_id(None), spool_path(self.workdir, s.rank))
            with SystemMetrics(log, s.rank, s.hvd.local_rank()):
                summary = self._loop(log=log, bar=None)
            log.close()
            return summary
        finally:
            s.strategy.close()

    def _run_rank0(self) -> dict:
        import mlflow

        s = self.state
        c = s.config
        configlib.save(c, self.workdir / "config.yaml")
        atomic_write_json(self.workdir / "manifest_fingerprint.json", s.shards.fingerprint)
        previous = tracking.load_run_file(self.workdir)
        resume_id = previous["run_id"] if previous and s.position["step"] else None
        if resume_id is not None and not tracking.run_exists(resume_id):
            raise FileNotFoundError(
                f"{self.workdir / tracking.RUN_FILE} names MLflow run {resume_id}, which the tracking store "
                f"{tracking.tracking_uri()} does not have, so the checkpoint's run cannot be resumed: set "
                "MLFLOW_TRACKING_URI to the store it was tracked in, or delete that file to go on from the "
                "checkpoint in a new run"
            )
        tags = {"speechflow.stage": f"train_{c.model}", "speechflow.strategy": c.strategy.name}
        with tracking.start_run(
            c.experiment, self.run_name or f"train-{c.model}-{c.strategy.name}", self.parent_run_id, resume_id, tags
        ) as run:
            tracking.save_run_file(self.workdir, run.info.run_id, c.experiment)
            s.run_id = run.info.run_id
            self.report.shared_run_id(s.run_id)
            if resume_id is None:
                self.report.log_params()
            bar = progress_bar(
                total=s.total_steps,
                initial=s.position["step"],
                desc=f"train {c.model}",
                unit="step",
                dynamic_ncols=True,
            )
            # Metrics go through a log that keeps them beside the checkpoints while MLflow is down.
            log = RunLog(s.run_id, spool_path(self.workdir, 0))
            with SystemMetrics(log, 0, s.hvd.local_rank()):
                summary = self._loop(log=log, bar=bar)
            bar.close()
            self.report.log_final(mlflow, summary)
            log.close()
        return summary

    def _loop(self, log, bar) -> dict:
        s = self.state
        c = s.config
        run = _Progress(start_step=s.position["step"])
        if c.elastic:
            from models.distributed import elastic

            # Horovod: the state every survivor goes back to when a worker is lost, and that a new
            # worker receives; committed every commit_every steps (and checked for new hosts then).
            committed = elastic.KerasState(s.model, s.optimizer, step=s.position["step"], origin=s.origin)
            committed.register_reset_callbacks([lambda: self.schedule.on_reset(committed, log, run.world_sizes)])
            elastic.run(lambda st: self._train(run, log, bar, st))(committed)
        else:
            s.strategy.start()
            self._train(run, log, bar)
        step = s.position["step"]
        s.strategy.training_finished()
        # "done": asynchronous training has spent its budget (its ranks' step counts say nothing).
        s.position = {**s.position, "step": step, "done": s.budget_in_data}
        timing = run.times.summary()  # before finish(): a fast gossip worker may wait there for slower partners
        final = s.strategy.finish()
        summary = {
            "rank": s.rank,
            "world_size": s.size,
            "threads_per_rank": {k: s.threads[k] for k in ("intra_op_threads", "inter_op_threads")},
            "run_id": s.run_id,
            "steps": step,
            "resumed_from_step": run.start_step,
            "final_loss": run.loss,
            **{f"trained_{k}": v for k, v in run.counts.items()},
            **final,
            **timing,
            "world_size_changes": run.world_sizes,
            "history": run.history,
            "dev_history": run.dev_history,
        }
        if run.profiles:
            summary.update(run.profile_ms())
        summary.update(self.report.gather(summary))
        self.persistence.save_checkpoint(step)
        if self.dev is not None and self.dev.enabled:
            # The last weights (the consensus, under gossip) are evaluated too; the best on dev is saved.
            dev = self.dev.evaluate(step)
            if log is not None:
                log.log_metrics(dev, step=step)
            summary.update({f"last_{k}": v for k, v in dev.items()}, **self.dev.restore_best())
            summary["dev_clock_started_unix_s"] = self.dev.started_unix_s
        if s.rank == 0:
            summary.update(s.task.finish(s.model, s.shards, s.config))
            self.persistence.save_model(summary)
        return summary

    def _train(self, run: _Progress, log, bar, committed=None) -> None:
        """Steps from the state's position to the end of the budget. Elastic: `committed` (Horovod's
        elastic state) is committed every commit_every steps; after a reset this is called again
        from the restored position."""
        s, schedule = self.state, self.schedule
        c = s.config
        if committed is not None:
            s.position = {"step": committed.step, "epoch": schedule.epoch_of(committed.step, committed.origin)}
            s.origin = tuple(committed.origin)
        step = s.position["step"]
        more = not s.position.get("done") and (s.budget_in_data or step < s.total_steps)
        iterator = schedule.batches() if more else iter(())
        while s.budget_in_data or step < s.total_steps:
            started = time.perf_counter()
            batch = schedule.next_batch(iterator, step)
            if batch is None:
                break  # the epochs' batches are used up: the budget is spent
            input_seconds = time.perf_counter() - started
            step += 1
            self.hooks.before_step(step, s.rank)
            loss, aux, frames, utterances, step_times = self.stepper.step(batch, step)
            run.loss = loss
            step_times["input"] = input_seconds
            extra = self.hooks.extra_work(s.rank)
            if extra:
                step_times["compute"] += self.stepper.slow_down(batch, step, extra, step_times["compute"])
            step_times["compute"] += self.hooks.after_step(step, s.rank)
            step_times["communication"] += s.strategy.after_step(step)
            run.counts["batches"] += 1
            run.counts["utterances"] += utterances
            run.counts["frames"] += frames
            schedule.set_learning_rate(step + 1)
            run.times.add(step_times, frames, counted=step > run.start_step + c.warmup_exclude)
            epoch = schedule.epoch(step)
            if s.task.profile_every and c.profile_every and step % c.profile_every == 0 and step > c.warmup_exclude:
                started = time.perf_counter()
                sample = schedule.profile_sample or schedule.sample_batch(epoch)
                if not run.profiles:
                    s.task.profile(s.model, sample)  # compiles the per-module functions
                for key, value in s.task.profile(s.model, sample).items():
                    run.profile_sums[key] = run.profile_sums.get(key, 0.0) + value
                run.profiles += 1
                run.times.exclude(time.perf_counter() - started)  # not training time
            s.position = {"epoch": epoch, "step": step, "origin": list(s.origin)}
            if bar is not None:
                bar.update(1)
                bar.set_postfix(
                    loss=f"{loss:.3f}", frames_s=f"{run.times.summary().get('frames_per_s', 0):.0f}", refresh=False
                )
            if s.rank == 0 and (step % c.log_every == 0 or step == s.total_steps):
                record = {"loss": loss, "learning_rate": s.current_lr, "epoch": epoch, **aux}
                self.report.log_step(run, log, step, record)
            if self.dev is not None and self.dev.due(step, last=False) and step < s.total_steps:
                started = time.perf_counter()
                dev = self.dev.evaluate(step)
                run.times.exclude(time.perf_counter() - started)  # not training time
                if log is not None:
                    log.log_metrics(dev, step=step)
                run.dev_history.append({"step": step, **dev})
            if step % c.checkpoint_every == 0:
                self.persistence.save_checkpoint(step)
            if committed is not None and step % c.commit_every == 0:
                committed.step, committed.origin = step, list(s.origin)
                committed.commit()  # Horovod: a collective; raises to reset when hosts changed
