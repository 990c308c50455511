"""Model selection on the dev split during training: its loss (and CER for the acoustic model)
every `eval_every` steps, and the best weights kept in `WORKDIR/best/`.

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
            cfg = dataclasses.replace(config.input, frames_per_batch=40000, max_batch_size=64)
            self.dataset, _ = task.dataset(shards, DEV, cfg, self.rank, size, 0, False)  # this rank's shards
            self.vocabulary = shards.vocabulary
        saved = checkpoint.latest(self.best_dir) if self.rank == 0 else None
        if saved is not None:  # a resumed run keeps the best it had found
            meta = checkpoint.restore_meta(saved)
            self.best, self.best_step = meta["position"]["value"], meta["step"]

    def due(self, step: int, last: bool) -> bool:
        return self.enabled and (step % self.every == 0 or last)

    def evaluate(self, step: int) -> dict:
        """The dev metrics of the current weights; keeps them when they are the best so far."""
        from models.asr.evaluation import COUNTS, error_rates, rates_of

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
        totals = [sum(losses), len(losses)]
        if self.metric == "dev_cer":
            rates = error_rates(refs, hyps)
            totals += [rates[k] for k in COUNTS]  # this rank's share of the split
        if self.combine is not None:
            totals = self.combine(totals)
        metrics = {"dev_loss": totals[0] / max(1, totals[1]), "dev_wall_s": time.perf_counter() - self.started}
        if self.metric == "dev_cer":
            counts = dict(zip(COUNTS, totals[2:]))
            rates = rates_of(counts)
            metrics.update(dev_cer=rates["cer"], dev_wer=rates["wer"], dev_utterances=int(counts["utterances"]))
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
