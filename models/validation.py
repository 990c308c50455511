"""Model selection on the dev split during training: its loss (and CER for the acoustic model)
every `eval_every` steps, and the best weights kept in `WORKDIR/best/`.

Rank 0 evaluates its own weights (under gossip, its own copy of the model) while the others go on
(allreduce: they wait for it at the next step). The saved model is the best one on dev; the test
split is only for reporting (models.evaluate).
"""

from __future__ import annotations

import dataclasses
import math
import time
from pathlib import Path

from models import checkpoint
from pipeline.records import ShardSet

DEV = "dev"


class DevSelection:
    def __init__(self, task, model, shards: ShardSet, config, workdir: Path, owners: tuple):
        self.task, self.model, self.owners = task, model, owners
        self.every = config.eval_every
        self.best_dir = workdir / "best"
        self.metric = task.selection_metric
        self.best, self.best_step = math.inf, 0
        self.enabled = self.every > 0 and DEV in shards.splits
        self.started = time.perf_counter()
        self.started_unix_s = time.time()  # the same moment by the wall clock: where dev_wall_s counts from
        if self.enabled:
            cfg = dataclasses.replace(config.input, frames_per_batch=40000, max_batch_size=64)
            self.dataset, _ = task.dataset(shards, DEV, cfg, 0, 1, 0, False)
            self.vocabulary = shards.vocabulary
        saved = checkpoint.latest(self.best_dir)
        if saved is not None:  # a resumed run keeps the best it had found
            meta = checkpoint.restore_meta(saved)
            self.best, self.best_step = meta["position"]["value"], meta["step"]

    def due(self, step: int, last: bool) -> bool:
        return self.enabled and (step % self.every == 0 or last)

    def evaluate(self, step: int) -> dict:
        """The dev metrics of the current weights; keeps them when they are the best so far."""
        from models.evaluate_asr import error_rates

        losses, refs, hyps = [], [], []
        for batch in self.dataset:
            if self.metric != "dev_cer":
                loss, _ = self.task.loss(self.model, batch, training=False)
                losses.append(float(loss))
                continue
            loss, batch_hyps = self.task.dev_pass(self.model, batch, self.vocabulary)
            losses.append(loss)
            hyps += batch_hyps
            tokens, lengths = batch["tokens"].numpy(), batch["token_lengths"].numpy()
            refs += ["".join(self.vocabulary[t] for t in row[:n]) for row, n in zip(tokens, lengths)]
        metrics = {"dev_loss": sum(losses) / max(1, len(losses)), "dev_wall_s": time.perf_counter() - self.started}
        if refs:
            rates = error_rates(refs, hyps)
            metrics.update(dev_cer=rates["cer"], dev_wer=rates["wer"])
        if metrics[self.metric] < self.best:
            self.best, self.best_step = metrics[self.metric], step
            position = {"metric": self.metric, "value": self.best}
            checkpoint.save(self.best_dir, step, self.model.weights, [], position, keep=1, owners=self.owners)
        return metrics

    def restore_best(self) -> dict:
        """Puts the best weights on dev into the model; returns what was selected."""
        saved = checkpoint.latest(self.best_dir)
        if saved is None:
            return {}
        checkpoint.restore(saved, self.model.weights, owners=self.owners)
        return {"selected_step": self.best_step, f"selected_{self.metric}": self.best}
