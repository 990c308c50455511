"""Shared fixtures: paths of the environments and a real `horovodrun` launcher."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PYTHON = sys.executable
HOROVODRUN = str(Path(sys.executable).with_name("horovodrun"))
AIRFLOW_BIN = ROOT / ".venv-airflow" / "bin"


def quiet_env(**extra: str) -> dict[str, str]:
    """Environment for child processes: quiet TensorFlow, the project importable."""
    env = dict(os.environ)
    env.update(TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1", PYTHONPATH=str(ROOT))
    env.update(extra)
    return env


def horovodrun(args: list[str], np: int = 2, timeout: float = 600, env: dict | None = None, check: bool = True):
    """Runs `horovodrun -np N -H localhost:N --gloo python ARGS` and returns the CompletedProcess."""
    cmd = [HOROVODRUN, "-np", str(np), "-H", f"localhost:{np}", "--gloo", PYTHON, *args]
    proc = subprocess.run(
        cmd, cwd=ROOT, env=env or quiet_env(), capture_output=True, text=True, timeout=timeout
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} exited {proc.returncode}\n{proc.stdout[-6000:]}\n{proc.stderr[-6000:]}")
    return proc


@pytest.fixture(scope="session")
def root() -> Path:
    return ROOT
