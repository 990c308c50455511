"""The training loop behind `models.train`: one Trainer per process (one per Horovod rank).

Longer than our other modules (about 500 lines) because the step loop, an elastic job's reset and
rank 0's MLflow run share the Trainer's state; which batches a rank reads is models/schedule.py,
what a run reports at its end models/reporting.py, the step-time breakdown models/timing.py.

Every place Horovod touches a training run, listed from here so a reader finds them all:
- common/runtime.py `configure_tensorflow`: each rank's share of the cores and its local GPU.
- models/strategies.py `init_horovod`: `hvd.init` (dynamic process sets when gossip needs them).
- models/strategies.py `Allreduce`: gradients averaged by `grouped_allreduce` every step (or by
  `DistributedGradientTape` in the fused step); rank 0's weights and optimizer state broadcast to
  every rank after the first step.
- models/gossip.py `GossipStrategy`: one process set per pair of a matching, pairwise averages by
  a communication thread, one global average at the end (the consensus model).
- models/hvd_compat.py: Keras 3 variables handed to Horovod as their `tf.Variable`s.
- pipeline/dataset.py: each rank reads its own shards; every rank gets the same number of batches.
- `Trainer._gather` below: `allgather_object` of each rank's throughput, memory and weight digest.
- Only rank 0 writes checkpoints and the model, logs to MLflow and draws the progress bar.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from pathlib import Path

from common import config as configlib
from common import runtime
from common.fsutil import atomic_write_json, read_json
from common.progress import progress as progress_bar
from models import checkpoint, tracking
from models.hooks import TrainHooks
from models.reporting import Reporting
from models.schedule import Schedule
from models.timing import StepTimes
from models.train_config import TrainConfig, check_workdir, learning_rate


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


class Trainer(Schedule, Reporting):
    def __init__(
        self,
        config: TrainConfig,
        shards: Path,
        workdir: Path,
        parent_run_id: str | None,
        run_name: str | None,
        hooks: TrainHooks | None = None,
    ):
        self.config, self.shards, self.workdir = config, shards, workdir
        self.hooks = hooks or TrainHooks()
        self.run_id = None  # rank 0's MLflow run
        self._profile_sample = None
        self.parent_run_id, self.run_name = parent_run_id, run_name

    # -- set-up -----------------------------------------------------------------------------------

    def _setup(self):
        import keras
        import tensorflow as tf

        from models.strategies import init_horovod, make_strategy
        from models.tasks import make_task
        from pipeline import records

        c = self.config
        self.threads = runtime.configure_tensorflow(c.intra_op_threads, c.inter_op_threads, c.bind_cores)
        self._gpus = [d.name for d in tf.config.list_logical_devices("GPU")]
        # Horovod: one process per worker; rank 0 is the one that writes and logs.
        hvd = init_horovod(c.strategy)
        self.hvd, self.tf = hvd, tf
        self.rank, self.size = hvd.rank(), hvd.size()
        keras.utils.set_random_seed(c.seed)
        if c.precision == "mixed_bfloat16":
            keras.mixed_precision.set_global_policy("mixed_bfloat16")
        self.shards = records.open_shard_set(self.shards)  # the directory, its manifest read and checked once
        records.check_shards(self.shards, "train")  # sizes: a truncated shard stops us here
        self.task = make_task(c.model, c.asr, c.tts, self.shards, c.input)
        resolved = {
            "asr": dataclasses.replace(c, asr=self.task.config),
            "tts": dataclasses.replace(c, tts=self.task.config),
        }
        self.config = c = resolved[c.model]
        if self.rank == 0:
            self.workdir.mkdir(parents=True, exist_ok=True)
            check_workdir(self.workdir, c)
        self.model = self.task.build()
        self.optimizer = keras.optimizers.Adam(c.optim.learning_rate, global_clipnorm=c.optim.clip_norm)
        self.optimizer.build(self.model.trainable_variables)
        self.position = {"epoch": 0, "batch": 0, "step": 0}
        latest = checkpoint.latest(self.workdir / "checkpoints")
        if latest is not None:
            # Every rank reads the file (a shared volume on a cluster); the broadcast before the first
            # step makes rank 0's copy authoritative all the same.
            meta = checkpoint.restore(latest, self.model.weights, self.optimizer.variables, self._owners())
            self.position = meta["position"]
        # Asynchronous training counts its budget in data: the ranks share the epochs' batches, a
        # faster rank takes more of them, and the run ends when they are used up. Allreduce steps
        # in lockstep through exact epochs, every rank its own shards.
        self.budget_in_data = c.strategy.name == "adpsgd"
        if self.budget_in_data and latest is not None:
            # Each rank goes on counting its own steps (its position file), from rank 0's epoch.
            own = read_json(self.workdir / "positions" / f"rank-{self.rank}.json") or {}
            self.position = {**self.position, "step": own.get("step", 0), "done": own.get("done", False)}
        self.steps_per_epoch = self._steps_per_epoch()
        self.total_steps = self._total_steps()
        self.strategy = make_strategy(c.strategy, self.model.trainable_variables, self.optimizer)
        # Lockstep epochs are counted from an origin: epoch origin[0] began after step origin[1]
        # (an elastic job that changed its world size restarts its epoch at the step it resized).
        self._origin = tuple(self.position.get("origin", (0, 0)))
        if c.elastic and c.strategy.name != "allreduce":
            raise ValueError(
                "--elastic works with --strategy allreduce: gossip keeps a process set per pair, and a "
                "survivor of a killed worker then aborts inside Horovod 0.28.1 (horovod/horovod#4021)"
            )
        self.dev = None
        if self.rank == 0:
            from models.validation import DevSelection

            self.dev = DevSelection(self.task, self.model, self.shards, c, self.workdir, self._owners())
        self._set_learning_rate(self.position["step"] + 1)
        self._compile_steps()

    def _compile_steps(self):
        tf, task, model, optimizer = self.tf, self.task, self.model, self.optimizer
        variables = model.trainable_variables

        def compute(batch, seed):
            with tf.GradientTape() as tape:
                loss, aux = task.loss(model, batch, training=True, seed=seed)
            grads = tape.gradient(loss, variables)
            return loss, aux, task.frames(batch), grads

        def apply(grads):
            optimizer.apply(grads, variables)

        def fused(batch, seed):
            from models import hvd_compat

            with tf.GradientTape() as tape:
                loss, aux = task.loss(model, batch, training=True, seed=seed)
            # Horovod: DistributedGradientTape averages each gradient as the backward pass makes it.
            grads = self.strategy.distributed_tape(tape).gradient(loss, hvd_compat.tf_variables(variables))
            optimizer.apply(grads, variables)
            return loss, aux, task.frames(batch)

        self._compute = tf.function(compute, reduce_retracing=True)
        self._apply = tf.function(apply, reduce_retracing=True)
        self._fused_fn, self._fused = fused, None

    # -- one step ---------------------------------------------------------------------------------

    def _seed(self, step: int):
        """The stateless seed of this step's random input augmentation: another on every rank and step."""
        return self.tf.constant([self.config.seed * 7919 + self.rank, step], self.tf.int64)

    def _step(self, batch, step: int) -> tuple[float, dict, int, int, dict]:
        """One training step on `batch`: (loss, aux metrics, frames, utterances, seconds by kind)."""
        tf = self.tf
        times = {}
        seed = self._seed(step)
        with self.strategy.step_lock():  # gossip: its thread reads and writes the weights between steps only
            start = time.perf_counter()
            if self.config.strategy.name == "allreduce" and self.config.strategy.fused_step:
                if self._fused is None:
                    # Horovod: one trace with every dimension unknown, the same graph on every rank.
                    # Traces that follow each rank's own batch shapes (reduce_retracing) name their
                    # allreduce ops differently on ranks that retraced at different steps, and the
                    # ranks then wait for each other's tensors forever.
                    spec = tf.nest.map_structure(lambda t: tf.TensorSpec([None] * t.shape.rank, t.dtype), batch)
                    self._fused = tf.function(self._fused_fn, input_signature=[spec, tf.TensorSpec([2], tf.int64)])
                loss, aux, frames = self._fused(batch, seed)
                loss = float(loss)  # waits for the step
                times["compute"], times["communication"] = time.perf_counter() - start, 0.0
            else:
                loss, aux, frames, grads = self._compute(batch, seed)
                self._sync_accelerators()
                times["compute"] = time.perf_counter() - start
                start = time.perf_counter()
                grads = self.strategy.reduce(grads)
                self._sync_accelerators()
                times["communication"] = time.perf_counter() - start
                start = time.perf_counter()
                self._apply(grads)
                loss = float(loss)
                times["compute"] += time.perf_counter() - start
        utterances = int(tf.shape(batch["utt_id"])[0])
        return loss, {k: float(v) for k, v in aux.items()}, int(frames), utterances, times

    def _slow_down(self, batch, step: int, extra: float, compute_seconds: float) -> float:
        """A straggler's step taking 1 + `extra` times as long (`--straggler-factor`): the step's
        forward and backward pass computed again, `extra` whole times, and the fraction slept.
        Computing, not sleeping, keeps its cores as busy as a slower or shared device keeps its
        own: a sleeping rank lends its cores (and whatever else the host's cores share) to the
        other ranks, which then run faster than undisturbed. Returns the seconds spent."""
        started = time.perf_counter()
        whole = int(extra)
        for _ in range(whole):
            float(self._compute(batch, self._seed(step))[0])  # waits for the computation
        once = (time.perf_counter() - started) / whole if whole else compute_seconds
        time.sleep((extra - whole) * once)
        return time.perf_counter() - started

    def _sync_accelerators(self) -> None:
        """Waits for this thread's work on the GPUs, so the step's times split right.

        Not `tf.test.experimental.sync_devices()`: it also waits for every pending op of the eager
        context, the gossip thread's exchange with a partner included, which would make a fast
        worker's training wait for its slow partner. CPU ops have finished when they return."""
        from tensorflow.python.ops import gen_sync_ops  # the op sync_devices runs, without its wait-for-all

        for device in self._gpus:
            with self.tf.device(device):
                gen_sync_ops.SyncDevice()

    # -- the loop ---------------------------------------------------------------------------------

    def run(self) -> dict:
        self._setup()
        finished = read_json(self.workdir / "train_summary.json")
        if (
            (self.position.get("done") or self.position["step"] >= self.total_steps)
            and finished
            and (self.workdir / "model" / "config.yaml").is_file()
        ):
            # A re-run of a finished training (a retried task) changes nothing and logs nothing again.
            if self.rank == 0:
                print(
                    f"{self.workdir} already holds this training ({finished['steps']} steps); nothing to do",
                    file=sys.stderr,
                )
            return {**finished, "rank": self.rank, "skipped": True}
        try:
            if self.rank == 0:
                return self._run_rank0()
            # Every rank logs its system metrics (and, should it become rank 0 in an elastic job,
            # the training metrics) into rank 0's MLflow run, through a log that outlasts an outage.
            log = tracking.RunLog(self._shared_run_id(None), tracking.spool_path(self.workdir, self.rank))
            with tracking.SystemMetrics(log, self.rank, self.hvd.local_rank()):
                summary = self._loop(log=log, bar=None)
            log.close()
            return summary
        finally:
            self.strategy.close()

    def _shared_run_id(self, run_id: str | None) -> str:
        """Rank 0's MLflow run id on every rank. Horovod: a broadcast; in an elastic job (which a
        worker may join at any time, when no other rank would join a broadcast) from the run file."""
        if not self.config.elastic:
            return self.hvd.broadcast_object(run_id, root_rank=0)
        deadline = time.monotonic() + 300
        while run_id is None:
            run_id = (tracking.load_run_file(self.workdir) or {}).get("run_id")
            if run_id is None:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"rank {self.rank}: rank 0 wrote no {tracking.RUN_FILE} in {self.workdir}")
                time.sleep(0.5)
        return run_id

    def _run_rank0(self) -> dict:
        import mlflow

        c = self.config
        configlib.save(c, self.workdir / "config.yaml")
        atomic_write_json(self.workdir / "manifest_fingerprint.json", self.shards.fingerprint)
        previous = tracking.load_run_file(self.workdir)
        resume_id = previous["run_id"] if previous and self.position["step"] else None
        tags = {"speechflow.stage": f"train_{c.model}", "speechflow.strategy": c.strategy.name}
        with tracking.start_run(
            c.experiment, self.run_name or f"train-{c.model}-{c.strategy.name}", self.parent_run_id, resume_id, tags
        ) as run:
            tracking.save_run_file(self.workdir, run.info.run_id, c.experiment)
            self.run_id = run.info.run_id
            self._shared_run_id(self.run_id)
            if resume_id is None:
                params = configlib.flatten(configlib.to_dict(c))
                params = {k: v for k, v in params.items() if not k.startswith("asr." if c.model == "tts" else "tts.")}
                params.update(
                    world_size=self.size,
                    steps_per_epoch=self.steps_per_epoch,
                    total_steps=self.total_steps,
                    shards=str(self.shards.root.resolve()),
                    **{f"threads.{k}": v for k, v in self.threads.items()},
                    **tracking.versions(),
                )
                tracking.log_params(params)
                tracking.log_shards_input(self.shards)
            bar = progress_bar(
                total=self.total_steps,
                initial=self.position["step"],
                desc=f"train {c.model}",
                unit="step",
                dynamic_ncols=True,
            )
            # Metrics go through a log that keeps them beside the checkpoints while MLflow is down.
            log = tracking.RunLog(self.run_id, tracking.spool_path(self.workdir, 0))
            with tracking.SystemMetrics(log, 0, self.hvd.local_rank()):
                summary = self._loop(log=log, bar=bar)
            bar.close()
            self._log_final(mlflow, summary)
            log.close()
        return summary

    def _loop(self, log, bar) -> dict:
        c = self.config
        run = self._progress = _Progress(start_step=self.position["step"])
        if c.elastic:
            from models import elastic

            # Horovod: the state every survivor goes back to when a worker is lost, and that a new
            # worker receives; committed every commit_every steps (and checked for new hosts then).
            state = elastic.KerasState(self.model, self.optimizer, step=self.position["step"], origin=self._origin)
            state.register_reset_callbacks([lambda: self._on_reset(state, log)])
            elastic.run(lambda st: self._train(run, log, bar, st))(state)
        else:
            self.strategy.start()
            self._train(run, log, bar)
        step = self.position["step"]
        self.strategy.training_finished()
        # "done": asynchronous training has spent its budget (its ranks' step counts say nothing).
        self.position = {**self.position, "step": step, "done": self.budget_in_data}
        timing = run.times.summary()  # before finish(): a fast gossip worker may wait there for slower partners
        final = self.strategy.finish()
        summary = {
            "rank": self.rank,
            "world_size": self.size,
            "run_id": self.run_id,
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
            summary.update({f"profile_{k[:-2]}_ms": 1000 * v / run.profiles for k, v in run.profile_sums.items()})
        summary.update(self._gather(summary))
        self._save_checkpoint(step)
        if self.dev is not None and self.dev.enabled:
            # The last weights (the consensus, under gossip) are evaluated too; the best on dev is saved.
            dev = self.dev.evaluate(step)
            if log is not None:
                log.log_metrics(dev, step=step)
            summary.update({f"last_{k}": v for k, v in dev.items()}, **self.dev.restore_best())
        if self.rank == 0:
            self._save_model(summary)
        return summary

    def _train(self, run: _Progress, log, bar, state=None) -> None:
        """Steps from `self.position` to the end of the budget. Elastic: `state` is committed every
        commit_every steps; after a reset this is called again from the restored position."""
        c = self.config
        if state is not None:
            self.position = {"step": state.step, "epoch": self._epoch_of(state.step, state.origin)}
            self._origin = tuple(state.origin)
        step = self.position["step"]
        more = not self.position.get("done") and (self.budget_in_data or step < self.total_steps)
        iterator = self._batches() if more else iter(())
        while self.budget_in_data or step < self.total_steps:
            started = time.perf_counter()
            try:
                batch = next(iterator)
            except self.tf.errors.DataLossError as err:
                # A record failed its checksum: name the shard (hashing them all costs only now).
                from pipeline import records

                records.check_shards(self.shards, "train", content=True)
                raise ValueError(f"rank {self.rank}: a shard of {self.shards.root} is damaged ({err.message})") from err
            except StopIteration:
                if self.budget_in_data:
                    break  # the epochs' batches are used up: the budget is spent
                raise RuntimeError(f"rank {self.rank}: the input ended at step {step} of {self.total_steps}") from None
            input_seconds = time.perf_counter() - started
            step += 1
            self.hooks.before_step(step, self.rank)
            loss, aux, frames, utterances, step_times = self._step(batch, step)
            run.loss = loss
            step_times["input"] = input_seconds
            extra = self.hooks.extra_work(self.rank)
            if extra:
                step_times["compute"] += self._slow_down(batch, step, extra, step_times["compute"])
            step_times["compute"] += self.hooks.after_step(step, self.rank)
            step_times["communication"] += self.strategy.after_step(step)
            run.counts["batches"] += 1
            run.counts["utterances"] += utterances
            run.counts["frames"] += frames
            self._set_learning_rate(step + 1)
            run.times.add(step_times, frames, counted=step > run.start_step + c.warmup_exclude)
            epoch = self._epoch(step)
            if c.model == "tts" and c.profile_every and step % c.profile_every == 0 and step > c.warmup_exclude:
                started = time.perf_counter()
                sample = self._profile_sample or self._sample_batch(epoch)
                if not run.profiles:
                    self.task.profile(self.model, sample)  # compiles the per-module functions
                for key, value in self.task.profile(self.model, sample).items():
                    run.profile_sums[key] = run.profile_sums.get(key, 0.0) + value
                run.profiles += 1
                run.times.exclude(time.perf_counter() - started)  # not training time
            self.position = {"epoch": epoch, "step": step, "origin": list(self._origin)}
            if bar is not None:
                bar.update(1)
                bar.set_postfix(
                    loss=f"{loss:.3f}", frames_s=f"{run.times.summary().get('frames_per_s', 0):.0f}", refresh=False
                )
            if self.rank == 0 and (step % c.log_every == 0 or step == self.total_steps):
                record = {
                    "loss": loss,
                    "learning_rate": self.current_lr,
                    "epoch": epoch,
                    **aux,
                    **run.times.flush_window(),
                    **self.strategy.metrics(),
                }
                if run.profiles:
                    record.update(
                        {f"profile_{k[:-2]}_ms": 1000 * v / run.profiles for k, v in run.profile_sums.items()}
                    )
                log.log_metrics({k: float(v) for k, v in record.items()}, step=step)
                run.history.append({"step": step, **record})
            if self.dev is not None and self.dev.due(step, last=False) and step < self.total_steps:
                started = time.perf_counter()
                dev = self.dev.evaluate(step)
                run.times.exclude(time.perf_counter() - started)  # not training time
                if log is not None:
                    log.log_metrics(dev, step=step)
                run.dev_history.append({"step": step, **dev})
            if step % c.checkpoint_every == 0:
                self._save_checkpoint(step)
            if state is not None and step % c.commit_every == 0:
                state.step, state.origin = step, list(self._origin)
                state.commit()  # Horovod: a collective; raises to reset when hosts changed

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

    def _set_learning_rate(self, step: int) -> None:
        """Sets the rate that step `step` (1-based) will use; asynchronous training counts all ranks'
        steps together (as the gossip rounds last reported them), divided by the ranks."""
        if self.budget_in_data and self.strategy.global_steps:
            step = self.strategy.global_steps // self.size + 1
        strategy = self.config.strategy
        workers = self.size if strategy.name == "allreduce" or strategy.gossip_scale_lr else 1
        self.current_lr = learning_rate(step, self.config.optim, workers, self.total_steps)
        self.optimizer.learning_rate.assign(self.current_lr)

    def _save_checkpoint(self, step: int) -> None:
        """Rank 0 writes the weights and optimizer state; asynchronous training's ranks, whose step
        counts differ, each write their own position beside them."""
        if self.budget_in_data:
            (self.workdir / "positions").mkdir(parents=True, exist_ok=True)
            atomic_write_json(self.workdir / "positions" / f"rank-{self.rank}.json", self.position)
        if self.rank != 0:
            return
        checkpoint.save(
            self.workdir / "checkpoints",
            step,
            self.model.weights,
            self.optimizer.variables,
            self.position,
            owners=self._owners(),
        )

    def _owners(self) -> tuple[str, str]:
        return (self.model.name, self.optimizer.name)

    def _save_model(self, summary: dict) -> None:
        """The final model for evaluation and serving: weights, config, vocabulary, normalization."""
        model_dir = self.workdir / "model"
        model_dir.mkdir(parents=True, exist_ok=True)
        checkpoint.save(model_dir, summary["steps"], self.model.weights, [], {"final": True}, 1, (self.model.name,))
        configlib.save(self.config, model_dir / "config.yaml")
        from models.serving import recorded_feature_config
        from pipeline.dataset import mel_stats

        mean, std = mel_stats(self.shards)
        atomic_write_json(
            model_dir / "data.json",
            {
                "model": self.config.model,
                "vocabulary": list(self.shards.vocabulary),
                "lowercase": self.shards.lowercase,
                "feature_dim": self.shards.feature_dim,
                "mel_mean": mean.tolist(),
                "mel_std": std.tolist(),
                # the fbank settings serving computes features from audio with (null: Kaldi made them)
                "features": recorded_feature_config(self.shards),
                "voices": list(self.config.tts.speakers) if self.config.model == "tts" else [],  # synthesis: by name
            },
        )
        atomic_write_json(self.workdir / "train_summary.json", {k: v for k, v in summary.items() if k != "history"})
