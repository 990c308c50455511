"""What a training keeps in its workdir and picks up from there: checkpoints, the final model.

Rank 0 writes the checkpoints (weights and optimizer state, with the position in the run);
asynchronous training's ranks, whose step counts differ, each keep their own position file beside
them. A run restores the latest checkpoint before its first step, and a run that finished already
(its summary and model in place) is not trained again. The final model holds what evaluation and
serving need: weights, config, vocabulary and feature normalization.
"""

from __future__ import annotations

from common import config as configlib
from common.fsutil import atomic_write_json, read_json
from models.training import checkpoint


class Persistence:
    """The Trainer's checkpoints, resumption and final model, of the training state `s`."""

    def __init__(self, state):
        self.s = state

    def restore(self) -> dict:
        """Puts the latest checkpoint's weights and optimizer state (if any) into the model; returns
        the position to go on from: rank 0's epoch and step (asynchronous training: this rank's own
        step, and whether it was done)."""
        position = {"epoch": 0, "batch": 0, "step": 0}
        latest = checkpoint.latest(self.s.workdir / "checkpoints")
        if latest is None:
            return position
        # Every rank reads the file (a shared volume on a cluster); the broadcast before the first
        # step makes rank 0's copy authoritative all the same.
        meta = checkpoint.restore(latest, self.s.model.weights, self.s.optimizer.variables, self.s.owners())
        position = meta["position"]
        if self.s.budget_in_data:
            # Each rank goes on counting its own steps (its position file), from rank 0's epoch.
            own = read_json(self.s.workdir / "positions" / f"rank-{self.s.rank}.json") or {}
            position = {**position, "step": own.get("step", 0), "done": own.get("done", False)}
        return position

    def finished_summary(self) -> dict | None:
        """The summary of a training that already finished in this workdir (its budget spent, its
        model saved), else None."""
        finished = read_json(self.s.workdir / "train_summary.json")
        if (
            (self.s.position.get("done") or self.s.position["step"] >= self.s.total_steps)
            and finished
            and (self.s.workdir / "model" / "config.yaml").is_file()
        ):
            return finished
        return None

    def save_checkpoint(self, step: int) -> None:
        """Rank 0 writes the weights and optimizer state; asynchronous training's ranks, whose step
        counts differ, each write their own position beside them."""
        if self.s.budget_in_data:
            (self.s.workdir / "positions").mkdir(parents=True, exist_ok=True)
            atomic_write_json(self.s.workdir / "positions" / f"rank-{self.s.rank}.json", self.s.position)
        if self.s.rank != 0:
            return
        checkpoint.save(
            self.s.workdir / "checkpoints",
            step,
            self.s.model.weights,
            self.s.optimizer.variables,
            self.s.position,
            owners=self.s.owners(),
        )

    def save_model(self, summary: dict) -> None:
        """The final model for evaluation and serving: weights, config, vocabulary, normalization."""
        model_dir = self.s.workdir / "model"
        model_dir.mkdir(parents=True, exist_ok=True)
        checkpoint.save(model_dir, summary["steps"], self.s.model.weights, [], {"final": True}, 1, (self.s.model.name,))
        configlib.save(self.s.config, model_dir / "config.yaml")
        from pipeline import features
        from pipeline.dataset import mel_stats

        # The statistics of the split it trained on: a model with split-wide CMVN is served with them
        # (models/asr/inference.py), as its training batches were normalized by them.
        mean, std = mel_stats(self.s.shards, self.s.train_split)
        atomic_write_json(
            model_dir / "data.json",
            {
                "model": self.s.config.model,
                "vocabulary": list(self.s.shards.vocabulary),
                "lowercase": self.s.shards.lowercase,
                "feature_dim": self.s.shards.feature_dim,
                "mel_mean": mean.tolist(),
                "mel_std": std.tolist(),
                # the fbank settings serving computes features from audio with (null: Kaldi made them)
                "features": features.recorded_config(self.s.shards, self.s.train_split),
                # the words of its training transcripts: evaluation scores the words it never heard apart
                "words": list(self.s.shards.words.get(self.s.train_split, ())),
                **self.s.task.model_data(),  # e.g. the synthesis model's voices, asked for by name
            },
        )
        atomic_write_json(self.s.workdir / "train_summary.json", {k: v for k, v in summary.items() if k != "history"})
