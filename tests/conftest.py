"""Shared fixtures: paths of the environments and a real `horovodrun` launcher."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PYTHON = sys.executable
HOROVODRUN = str(Path(sys.executable).with_name("horovodrun"))
AIRFLOW_BIN = ROOT / ".venv-airflow" / "bin"


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's own hook, which reads the marks
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The tests that share a module-scoped fixture run in one xdist process (`--dist loadgroup`), which
    builds the fixture once: each gets its module's `xdist_group`, unless it has one already."""
    for item in items:
        info = getattr(item, "_fixtureinfo", None)
        if info is None or any(item.iter_markers("xdist_group")):
            continue
        if any(defs[-1].scope == "module" for defs in info.name2fixturedefs.values() if defs):
            item.add_marker(pytest.mark.xdist_group(item.module.__name__))


def quiet_env(**extra: str) -> dict[str, str]:
    """Environment for child processes: quiet TensorFlow, the project importable."""
    env = dict(os.environ)
    env.update(TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1", PYTHONPATH=str(ROOT))
    env.update(extra)
    return env


def horovodrun(args: list[str], np: int = 2, timeout: float = 600, env: dict | None = None, check: bool = True):
    """Runs `horovodrun -np N -H localhost:N --gloo python ARGS` and returns the CompletedProcess."""
    cmd = [HOROVODRUN, "-np", str(np), "-H", f"localhost:{np}", "--gloo", PYTHON, *args]
    proc = subprocess.run(cmd, cwd=ROOT, env=env or quiet_env(), capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} exited {proc.returncode}\n{proc.stdout[-6000:]}\n{proc.stderr[-6000:]}")
    return proc


def shard_set(splits: dict, vocabulary=("<blank>", "<unk>", " ", "a"), feature_dim: int = 2, lowercase: bool = True):
    """A pipeline/records.py `ShardSet` with no files: `splits` name -> the manifest fields a test
    gives (`speakers`, `cmvn`); the rest of the manifest is filled with an empty layout."""
    from pipeline import records

    empty = {"data_dir": "DATA", "utterances": 0, "frames": 0, "speakers": [], "cmvn": {}}
    layout = {"classes": [], "class_sequence": [], "shards": []}
    manifest = {
        "feature_dim": feature_dim,
        "feature_dtype": "float16",
        "compression": "none",
        "vocabulary": list(vocabulary),
        "lowercase": lowercase,
        "splits": {name: {**empty, **fields, **layout} for name, fields in splits.items()},
    }
    return records.ShardSet.from_manifest(Path("shards"), manifest)


@pytest.fixture(scope="session")
def mlflow_template(tmp_path_factory) -> Path:
    """A new MLflow SQLite store, made once per test process. A new store runs MLflow's migrations
    (seconds; a copy takes a fraction of one); a test that copies this one (`sqlite_store`) starts from the
    same tables without them."""
    import mlflow

    path = tmp_path_factory.mktemp("mlflow-template") / "mlflow.db"
    mlflow.MlflowClient(f"sqlite:///{path}").search_experiments()  # creates the tables
    return path


def copy_store(template: Path, directory: Path) -> str:
    """The URI of a new MLflow SQLite store `directory/mlflow.db`, a copy of `template`."""
    directory.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(template, directory / "mlflow.db")
    return f"sqlite:///{directory / 'mlflow.db'}"


@pytest.fixture
def sqlite_store(tmp_path, mlflow_template) -> str:
    """The URI of this test's own MLflow SQLite store (`tmp_path/mlflow.db`), its tables made."""
    return copy_store(mlflow_template, tmp_path)


@pytest.fixture
def mlflow_uri(sqlite_store, monkeypatch) -> str:
    """`sqlite_store`, the tracking URI of this test's process and of the processes it starts."""
    import mlflow

    monkeypatch.setenv("MLFLOW_TRACKING_URI", sqlite_store)
    mlflow.set_tracking_uri(sqlite_store)  # `runs:/` URIs resolve against the process-wide setting
    return sqlite_store


@pytest.fixture(scope="session")
def root() -> Path:
    return ROOT


@pytest.fixture(scope="session")
def tiny_shards(tmp_path_factory) -> Path:
    """Shards of a small random corpus: train (24 utterances, 4 shards) and test (8, 2 shards)."""
    from pipeline import shards
    from tests.kaldi_fixtures import make_feats_dir

    root = tmp_path_factory.mktemp("tiny")
    train, _, _ = make_feats_dir(root / "train", num_utts=24, dim=13, frames=(30, 70), seed=3)
    test, _, _ = make_feats_dir(root / "test", num_utts=8, dim=13, frames=(30, 70), seed=4)
    shards.make_shards(
        {"train": train, "test": test}, root / "shards", shards.ShardConfig(num_shards=4, jobs=1), progress=False
    )
    return root / "shards"


CONFIGS = ROOT / "tests" / "configs"
