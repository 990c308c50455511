"""Model selection on the dev split during training: the task's dev metrics every `eval_every`
steps, and the best weights by its `selection_metric` kept in `WORKDIR/best/`.

The task says what a dev batch counts (`dev_counts`: sums such as a loss' sum or error counts) and
what the summed counts mean (`dev_metrics`: the acoustic model's CER and WER, the synthesis
model's loss); the trainer only sums and keeps the step with the lowest `selection_metric`.

Under allreduce every rank holds the same weights, so the ranks share the work: each evaluates its
shards of dev and the counts behind the loss and the error rates are summed over the ranks (rank 0
alone would keep the others waiting at the next step). Otherwise (gossip, elastic) rank 0 evaluates
its own weights while the others go on. Rank 0 keeps the best weights. The saved model is the best
one on dev; the test split is only for reporting (models.evaluate).
"""

from __future__ import annotations

import dataclasses
import math
import time
from pathlib import Path

from models.training import checkpoint
from pipeline.records import ShardSet

DEV = "dev"


class DevSelection:
    def __init__(self, task, model, shards: ShardSet, config, workdir: Path, owners: tuple, share=None):
        """`share`: (rank, size, sum over ranks of a list of floats) when the ranks share the split."""
        self.task, self.model, self.owners = task, model, owners
        self.rank, size, self.combine = share or (0, 1, None)
        self.every = config.eval_every
        self.best_dir = workdir / "best"
        self.metric = task.selection_metric
        self.best, self.best_step = math.inf, 0
        self.enabled = self.every > 0 and DEV in shards.splits
        self.started = time.perf_counter()
        self.started_unix_s = time.time()  # the same moment by the wall clock: where dev_wall_s counts from
        if self.enabled:
            self._check_task()
            cfg = dataclasses.replace(config.input, frames_per_batch=40000, max_batch_size=64)
            self.dataset, _ = task.dataset(shards, DEV, cfg, self.rank, size, 0, False)  # this rank's shards
        saved = checkpoint.latest(self.best_dir) if self.rank == 0 else None
        if saved is not None:  # a resumed run keeps the best it had found
            meta = checkpoint.restore_meta(saved)
            self.best, self.best_step = meta["position"]["value"], meta["step"]

    def _check_task(self) -> None:
        """Before the first step: the task counts its dev batches and names its metrics, the one it
        selects by among them (ValueError with the fix otherwise, not after `eval_every` steps)."""
        name = getattr(self.task, "name", type(self.task).__name__)
        missing = [m for m in ("dev_count_names", "dev_counts", "dev_metrics") if not hasattr(self.task, m)]
        if missing:
            raise ValueError(
                f"the {name} task has no {', '.join(missing)}, which dev selection (eval_every) needs: inherit "
                f"models.interfaces.DevLoss (its loss on dev) or define them (models/interfaces.py Task)"
            )
        given = self.task.dev_metrics(dict.fromkeys(self.task.dev_count_names, 0.0))
        if self.metric not in given:
            raise ValueError(f"the {name} task selects by {self.metric!r}, but its dev_metrics give {sorted(given)}")

    def due(self, step: int, last: bool) -> bool:
        return self.enabled and (step % self.every == 0 or last)

    def evaluate(self, step: int) -> dict:
        """The dev metrics of the current weights; keeps them when they are the best so far."""
        names = self.task.dev_count_names
        totals = dict.fromkeys(names, 0.0)  # this rank's share of the split
        for batch in self.dataset:
            for key, value in self.task.dev_counts(self.model, batch).items():
                totals[key] += value
        if self.combine is not None:
            totals = dict(zip(names, self.combine([totals[k] for k in names])))
        metrics = {**self.task.dev_metrics(totals), "dev_wall_s": time.perf_counter() - self.started}
        if self.rank == 0 and metrics[self.metric] < self.best:
            self.best, self.best_step = metrics[self.metric], step
            position = {"metric": self.metric, "value": self.best}
            checkpoint.save(self.best_dir, step, self.model.weights, [], position, keep=1, owners=self.owners)
        return metrics

    def restore_best(self) -> dict:
        """Puts the best weights on dev into rank 0's model (the one it saves); returns what was selected."""
        saved = checkpoint.latest(self.best_dir) if self.rank == 0 else None
        if saved is None:
            return {}
        checkpoint.restore(saved, self.model.weights, owners=self.owners)
        return {"selected_step": self.best_step, f"selected_{self.metric}": self.best}
