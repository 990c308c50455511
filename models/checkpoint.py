"""Checkpoints: model weights, optimizer state and the training position, in one .npz file.

Why not `tf.train.Checkpoint`: with Keras 3 models it saves and "restores" without error while
leaving the LSTM cells' kernels out (their cell is not tracked by TensorFlow's object graph), so a
resumed run would silently start those layers from scratch. Keras' own `save_weights` has no
optimizer state. A list of variables in a fixed order, saved by name and shape-checked on
restore, is explicit and cannot skip anything.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import numpy as np

PATTERN = re.compile(r"ckpt-(\d{8})\.npz$")


def _arrays(prefix: str, variables) -> dict[str, np.ndarray]:
    return {f"{prefix}/{i:04d}": np.asarray(v.numpy()) for i, v in enumerate(variables)}


def save(directory: Path, step: int, model_vars, optimizer_vars, position: dict, keep: int = 3) -> Path:
    """Writes `ckpt-{step}.npz` atomically and keeps the newest `keep`. `position`: JSON-able
    training position (epoch, batch within the epoch, ...)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    meta = {
        "step": step,
        "position": position,
        "model_names": [getattr(v, "path", getattr(v, "name", "")) for v in model_vars],
        "optimizer_names": [getattr(v, "path", getattr(v, "name", "")) for v in optimizer_vars],
    }
    path = directory / f"ckpt-{step:08d}.npz"
    tmp = directory / f".ckpt-{step:08d}.{os.getpid()}.tmp.npz"
    np.savez(
        tmp,
        __meta__=np.frombuffer(json.dumps(meta).encode(), np.uint8),
        **_arrays("model", model_vars),
        **_arrays("optimizer", optimizer_vars),
    )
    tmp.replace(path)
    for old in sorted(p for p in directory.iterdir() if PATTERN.search(p.name))[:-keep]:
        old.unlink()
    return path


def latest(directory: Path) -> Path | None:
    directory = Path(directory)
    if not directory.is_dir():
        return None
    found = sorted(p for p in directory.iterdir() if PATTERN.search(p.name))
    return found[-1] if found else None


def restore(path: Path, model_vars, optimizer_vars=None) -> dict:
    """Assigns the saved values; returns the metadata (step, position). Raises ValueError when the
    variables do not match (another architecture), naming the first difference."""
    with np.load(path) as data:
        meta = json.loads(bytes(data["__meta__"]).decode())
        groups = [("model", model_vars, meta["model_names"])]
        if optimizer_vars is not None:
            groups.append(("optimizer", optimizer_vars, meta["optimizer_names"]))
        for prefix, variables, names in groups:
            if len(variables) != len(names):
                raise ValueError(f"{path}: holds {len(names)} {prefix} variables, this run has {len(variables)}")
            for i, variable in enumerate(variables):
                value = data[f"{prefix}/{i:04d}"]
                if tuple(value.shape) != tuple(variable.shape):
                    raise ValueError(f"{path}: {names[i]} has shape {value.shape}, this run's {variable.shape}")
            for i, variable in enumerate(variables):
                variable.assign(data[f"{prefix}/{i:04d}"])
    return meta
