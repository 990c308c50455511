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
    """Mixed into models.training.loop.Trainer: its checkpoints, resumption and final model."""

    def _restore(self) -> dict:
        """Puts the latest checkpoint's weights and optimizer state (if any) into the model; returns
        the position to go on from: rank 0's epoch and step (asynchronous training: this rank's own
        step, and whether it was done)."""
        position = {"epoch": 0, "batch": 0, "step": 0}
        latest = checkpoint.latest(self.workdir / "checkpoints")
        if latest is None:
            return position
        # Every rank reads the file (a shared volume on a cluster); the broadcast before the first
        # step makes rank 0's copy authoritative all the same.
        meta = checkpoint.restore(latest, self.model.weights, self.optimizer.variables, self._owners())
        position = meta["position"]
        if self.budget_in_data:
            # Each rank goes on counting its own steps (its position file), from rank 0's epoch.
            own = read_json(self.workdir / "positions" / f"rank-{self.rank}.json") or {}
            position = {**position, "step": own.get("step", 0), "done": own.get("done", False)}
        return position

    def _finished_summary(self) -> dict | None:
        """The summary of a training that already finished in this workdir (its budget spent, its
        model saved), else None."""
        finished = read_json(self.workdir / "train_summary.json")
        if (
            (self.position.get("done") or self.position["step"] >= self.total_steps)
            and finished
            and (self.workdir / "model" / "config.yaml").is_file()
        ):
            return finished
        return None

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
        from models.serving.pyfunc import recorded_feature_config
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
                **self.task.model_data(),  # e.g. the synthesis model's voices, asked for by name
            },
        )
        atomic_write_json(self.workdir / "train_summary.json", {k: v for k, v in summary.items() if k != "history"})
