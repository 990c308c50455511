"""What a training keeps in its workdir and picks up from there: checkpoints, the final model.

Rank 0 writes the checkpoints (weights and optimizer state, with the position in the run);
asynchronous training's ranks, whose step counts differ, each keep their own position file beside
them. A run restores the latest checkpoint before its first step, and a run that finished already
(its summary and model in place) is not trained again. The final model holds what evaluation and
serving need: weights, config, vocabulary and feature normalization. Each function takes the
set-up (models/training/setup.py) and the values it needs.
"""

from __future__ import annotations

from common import config as configlib
from common.fsutil import atomic_write_json, read_json
from models.training import checkpoint


def restore(setup, rank: int) -> dict:
    """Puts the latest checkpoint's weights and optimizer state (if any) into the model; returns
    the position to go on from: rank 0's epoch and step (asynchronous training: this rank's own
    step, and whether it was done)."""
    position = {"epoch": 0, "batch": 0, "step": 0}
    latest = checkpoint.latest(setup.workdir / "checkpoints")
    if latest is None:
        return position
    # Every rank reads the file (a shared volume on a cluster); the broadcast before the first
    # step makes rank 0's copy authoritative all the same.
    meta = checkpoint.restore(latest, setup.model.weights, setup.optimizer.variables, setup.owners())
    position = meta["position"]
    if setup.budget_in_data:
        # Each rank goes on counting its own steps (its position file), from rank 0's epoch.
        own = read_json(setup.workdir / "positions" / f"rank-{rank}.json") or {}
        position = {**position, "step": own.get("step", 0), "done": own.get("done", False)}
    return position


def finished_summary(workdir, position: dict, total_steps: int) -> dict | None:
    """The summary of a training that already finished in `workdir` (its budget spent, its model
    saved), else None."""
    finished = read_json(workdir / "train_summary.json")
    spent = position.get("done") or position["step"] >= total_steps
    if spent and finished and (workdir / "model" / "config.yaml").is_file():
        return finished
    return None


def save_checkpoint(setup, rank: int, position: dict, step: int) -> None:
    """Rank 0 writes the weights and optimizer state; asynchronous training's ranks, whose step
    counts differ, each write their own position beside them."""
    if setup.budget_in_data:
        (setup.workdir / "positions").mkdir(parents=True, exist_ok=True)
        atomic_write_json(setup.workdir / "positions" / f"rank-{rank}.json", position)
    if rank != 0:
        return
    directory = setup.workdir / "checkpoints"
    checkpoint.save(directory, step, setup.model.weights, setup.optimizer.variables, position, owners=setup.owners())


def save_model(setup, summary: dict) -> None:
    """The final model for evaluation and serving: weights, config, vocabulary, normalization."""
    from pipeline import features
    from pipeline.dataset import mel_stats

    model_dir = setup.workdir / "model"
    model_dir.mkdir(parents=True, exist_ok=True)
    checkpoint.save(model_dir, summary["steps"], setup.model.weights, [], {"final": True}, 1, (setup.model.name,))
    configlib.save(setup.config, model_dir / "config.yaml")
    shards, split = setup.shards, setup.train_split
    # The statistics of the split it trained on: a model with split-wide CMVN is served with them
    # (models/asr/inference.py), as its training batches were normalized by them.
    mean, std = mel_stats(shards, split)
    atomic_write_json(
        model_dir / "data.json",
        {
            "model": setup.config.model,
            "vocabulary": list(shards.vocabulary),
            "lowercase": shards.lowercase,
            "feature_dim": shards.feature_dim,
            "mel_mean": mean.tolist(),
            "mel_std": std.tolist(),
            # the fbank settings serving computes features from audio with (null: Kaldi made them)
            "features": features.recorded_config(shards, split),
            # the words of its training transcripts: evaluation scores the words it never heard apart
            "words": list(shards.words.get(split, ())),
            **setup.task.model_data(),  # e.g. the synthesis model's voices, asked for by name
        },
    )
    atomic_write_json(setup.workdir / "train_summary.json", {k: v for k, v in summary.items() if k != "history"})
