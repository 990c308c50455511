"""Checkpoints: model weights, optimizer state and the training position, in one .npz file.

Why not `tf.train.Checkpoint`: with Keras 3 models it saves and "restores" without error while
leaving the LSTM cells' kernels out (their cell is not tracked by TensorFlow's object graph), so a
resumed run would silently start those layers from scratch. Keras' own `save_weights` has no
optimizer state. Variables saved under their Keras paths and restored by path, each checked for
its shape, is explicit and cannot skip anything or load two same-shaped layers swapped.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import numpy as np

PATTERN = re.compile(r"ckpt-(\d{8})\.npz$")


def variable_names(variables, owners: tuple[str, ...] = ()) -> list[str]:
    """Names that identify each variable across processes and rebuilds: the Keras path with the
    names of its owners (the model's, the optimizer's: Keras numbers them per process, `adam_1`)
    left out. `owners`: those names as this process has them."""
    names = []
    for variable in variables:
        path = getattr(variable, "path", None) or variable.name
        head, sep, rest = path.partition("/")
        if sep and head in owners:
            path = rest
            for owner in owners:  # optimizer slots embed the model's name: `acoustic_model_kernel_momentum`
                if path.startswith(owner + "_"):
                    path = path[len(owner) + 1 :]
        names.append(path)
    return names


def _arrays(prefix: str, variables) -> dict[str, np.ndarray]:
    return {f"{prefix}/{i:04d}": np.asarray(v.numpy()) for i, v in enumerate(variables)}


def save(
    directory: Path, step: int, model_vars, optimizer_vars, position: dict, keep: int = 3, owners: tuple[str, ...] = ()
) -> Path:
    """Writes `ckpt-{step}.npz` atomically and keeps the newest `keep`. `position`: JSON-able
    training position (epoch, batch within the epoch, ...). `owners`: see `variable_names`."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    meta = {
        "step": step,
        "position": position,
        "model_names": variable_names(model_vars, owners),
        "optimizer_names": variable_names(optimizer_vars, owners),
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


def restore_meta(path: Path) -> dict:
    """The metadata of a checkpoint (step, position, names) without its arrays."""
    with np.load(path) as data:
        return json.loads(bytes(data["__meta__"]).decode())


def restore(path: Path, model_vars, optimizer_vars=None, owners: tuple[str, ...] = ()) -> dict:
    """Assigns every variable the value saved under its name; returns the metadata (step, position).

    Raises ValueError naming the variable when one is missing from the file, has another shape, or
    when the file holds variables this model lacks (another architecture); nothing is assigned then.
    """
    with np.load(path) as data:
        meta = json.loads(bytes(data["__meta__"]).decode())
        groups = [("model", model_vars, meta["model_names"])]
        if optimizer_vars is not None:
            groups.append(("optimizer", optimizer_vars, meta["optimizer_names"]))
        assignments = []
        for prefix, variables, names in groups:
            saved = {name: f"{prefix}/{i:04d}" for i, name in enumerate(names)}
            if len(saved) != len(names):
                raise ValueError(f"{path}: two {prefix} variables share a name; it cannot be restored by name")
            wanted = dict(zip(variable_names(variables, owners), variables))
            missing, extra = sorted(set(wanted) - set(saved)), sorted(set(saved) - set(wanted))
            if missing or extra:
                raise ValueError(
                    f"{path}: {prefix} variables differ from this run's (another architecture?): "
                    f"not in the file: {missing[:3]}, only in the file: {extra[:3]}"
                )
            for name, variable in wanted.items():
                value = data[saved[name]]
                if tuple(value.shape) != tuple(variable.shape):
                    raise ValueError(
                        f"{path}: {prefix} variable {name} has shape {value.shape}, this run's {variable.shape}"
                    )
                assignments.append((variable, value))
        for variable, value in assignments:
            variable.assign(value)
    return meta
