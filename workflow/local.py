"""Local mode: a stage's command as a child process, its output streamed into the task log.

The child runs in the training environment (its python first on PATH, the repository on
PYTHONPATH) in a process group of its own, which is ended with the task (a timeout, a kill from
the Airflow UI), horovodrun's ranks included.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import subprocess
import time
from collections import deque
from collections.abc import Callable, Sequence
from pathlib import Path

log = logging.getLogger(__name__)

REPO = Path(__file__).resolve().parents[1]


class StageError(RuntimeError):
    """A stage's command failed; the message names the command and ends with its last output lines."""


def training_python() -> str:
    """The training environment's python: SPEECHFLOW_PYTHON, else the repository's .venv."""
    return os.environ.get("SPEECHFLOW_PYTHON") or str(REPO / ".venv" / "bin" / "python")


def child_env() -> dict[str, str]:
    """The task's environment (MLFLOW_TRACKING_URI included) with the training environment first."""
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONHOME")}
    bin_dir = str(Path(training_python()).parent)
    env.update(
        PATH=f"{bin_dir}{os.pathsep}{env.get('PATH', '')}",
        PYTHONPATH=str(REPO),
        PYTHONUNBUFFERED="1",
        TF_CPP_MIN_LOG_LEVEL=env.get("TF_CPP_MIN_LOG_LEVEL", "2"),
        MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR="false",
    )
    return env


def run_command(
    argv: Sequence[str],
    emit: Callable[[str], None] = log.info,
    tail: int = 40,
    progress_every_s: float = 10.0,
) -> None:
    """Runs `argv` in the repository, sending each output line to `emit` as it comes.

    Progress bars redraw with carriage returns: one such line every `progress_every_s` reaches the
    log. The command runs in a process group of its own, which is ended with the task (a timeout, a
    kill from the UI). Raises StageError with the last `tail` lines when it exits non-zero.
    """
    last_lines: deque[str] = deque(maxlen=tail)
    emit(f"$ {' '.join(argv)}")
    proc = subprocess.Popen(
        list(argv),
        cwd=REPO,
        env=child_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    last_progress = float("-inf")
    try:
        pending = b""
        while chunk := os.read(proc.stdout.fileno(), 65536):
            pending += chunk
            # A trailing \r may be the first half of \r\n: it waits for the next chunk.
            cut = len(pending) - 1 if pending.endswith(b"\r") else len(pending)
            parts = re.split(rb"(\r\n|\n|\r)", pending[:cut])
            pending = parts.pop() + pending[cut:]
            for text, end in zip(parts[0::2], parts[1::2]):
                line = text.decode(errors="replace").rstrip()
                if not line:
                    continue
                if end == b"\r":  # a progress bar's redraw
                    if time.monotonic() - last_progress < progress_every_s:
                        continue
                    last_progress = time.monotonic()
                last_lines.append(line)
                emit(line)
        if pending.strip():
            last_lines.append(pending.decode(errors="replace").rstrip())
            emit(last_lines[-1])
        code = proc.wait()
    finally:
        if proc.poll() is None:
            end_group(proc)
        proc.stdout.close()
    if code != 0:
        output = "\n".join(last_lines)
        raise StageError(f"`{' '.join(argv)}` exited with {code}; its last lines:\n{output}")


def end_group(proc: subprocess.Popen) -> None:
    """SIGTERM to the command's process group (horovodrun and its ranks), SIGKILL after 20 s."""
    for sig, wait_s in ((signal.SIGTERM, 20), (signal.SIGKILL, 5)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(wait_s)
            return
        except subprocess.TimeoutExpired:
            continue
