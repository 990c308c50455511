"""`mlflow models serve` of a logged or registered model: the command line, and a process that is
started, waited for until it answers /ping, and stopped (tests and benchmarks/serving.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Mapping
from pathlib import Path


def serve_command(model_uri: str, port: int, workers: int = 1, host: str = "127.0.0.1") -> list[str]:
    """`mlflow models serve` in this environment (`--env-manager local`: the model's requirements are
    this environment's). Each worker is a process that loads the model; see the README's serving
    section for the worker count that suits a machine."""
    mlflow = str(Path(sys.executable).with_name("mlflow"))
    return [mlflow, "models", "serve", "-m", model_uri, "--env-manager", "local",
            "-h", host, "-p", str(port), "-w", str(workers)]  # fmt: skip


def serve_env(base: Mapping[str, str], **settings: str) -> dict[str, str]:
    """`base` with uvicorn (which `mlflow models serve` runs by name) on PATH and the model's
    SPEECHFLOW_SERVE_* `settings` (models/serving_policy.py)."""
    env = dict(base)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["MLFLOW_SERVER_ENABLE_JOB_EXECUTION"] = "false"  # no GenAI job runner beside the model
    env.update(settings)
    return env


class ModelServer:
    """The served model as a context manager: `with ModelServer(cmd, env, cwd, log) as server:` posts
    go to `server.url + "/invocations"`; leaving ends the server and its uvicorn workers."""

    def __init__(self, command: list[str], env: Mapping[str, str], cwd: Path, log: Path, timeout: float = 180):
        self.command, self.env, self.cwd, self.log, self.timeout = command, dict(env), cwd, Path(log), timeout
        self.port = int(command[command.index("-p") + 1])
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> ModelServer:
        with open(self.log, "a") as out:
            # A session of its own, so that stopping reaches the uvicorn workers too.
            self.proc = subprocess.Popen(
                self.command, cwd=self.cwd, env=self.env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        deadline = time.monotonic() + self.timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the model server exited {self.proc.returncode}:\n{self.tail()}")
            try:
                with urllib.request.urlopen(f"{self.url}/ping", timeout=5) as answer:
                    if answer.status == 200:
                        return self
            except OSError:
                pass
            if time.monotonic() > deadline:
                self.__exit__()
                raise TimeoutError(f"the model server on {self.url} did not answer in {self.timeout} s:\n{self.tail()}")
            time.sleep(0.5)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def tail(self, chars: int = 5000) -> str:
        return self.log.read_text(errors="replace")[-chars:] if self.log.exists() else ""

    def __exit__(self, *exc) -> None:
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        except ProcessLookupError:
            pass
        self.proc = None
