"""`mlflow models serve` of a logged or registered model: the command line, its environment, and a
process that is started, waited for until it answers /ping, and stopped (`make try`'s launcher,
models/serving/try_launcher.py; tests and benchmarks/serving.py)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Mapping
from pathlib import Path

# Environment of every model server: no GenAI job runner beside the model.
SERVER_ENV = {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}


def serve_command(
    model_uri: str, port: int, workers: int = 1, host: str = "127.0.0.1", mlflow: str | None = None
) -> list[str]:
    """`mlflow models serve` in this environment (`--env-manager local`: the model's requirements are
    this environment's); `mlflow` is the executable, by default the one beside this Python (the
    cluster's model server, workflow/pods.py, names the image's). Each worker is a process that loads
    the model; see the README's serving section for the worker count that suits a machine."""
    mlflow = mlflow or str(Path(sys.executable).with_name("mlflow"))
    serve = ["models", "serve", "-m", model_uri, "--env-manager", "local"]
    return [mlflow, *serve, "-h", host, "-p", str(port), "-w", str(workers)]


def serve_env(base: Mapping[str, str], **settings: str) -> dict[str, str]:
    """`base` with uvicorn (which `mlflow models serve` runs by name) on PATH and the model's
    SPEECHFLOW_SERVE_* `settings` (models/serving/request_policy.py)."""
    env = dict(base)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env.update(SERVER_ENV)
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
        if self.proc is not None:
            stop_session(self.proc, grace=20)
            self.proc = None


def stop_session(proc: subprocess.Popen, grace: float) -> None:
    """Ends a server started with `start_new_session` and every process of its session (uvicorn's
    workers): SIGTERM, SIGKILL after `grace` seconds, and SIGKILL again for any worker left, so the
    port is free for the next server."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    except ProcessLookupError:
        pass
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)


def log_to_new_store(model_dir: Path, work: Path) -> tuple[str, str]:
    """Logs a model directory (models/serving/pyfunc.py `log_model`) to a new MLflow store in `work` (SQLite,
    its artifacts beside it rather than in ./mlruns) and returns (model URI, tracking URI): what
    `serve_command` and the server's MLFLOW_TRACKING_URI need."""
    import json

    import mlflow

    from common import config as configlib
    from models.serving import pyfunc as serving
    from models.training.config import TrainConfig

    config = configlib.load(TrainConfig, Path(model_dir) / "config.yaml")
    data = json.loads((Path(model_dir) / "data.json").read_text())
    store, before = f"sqlite:///{work / 'mlflow.db'}", mlflow.get_tracking_uri()
    mlflow.set_tracking_uri(store)
    try:
        experiment = mlflow.create_experiment("served", artifact_location=(work / "artifacts").as_uri())
        with mlflow.start_run(experiment_id=experiment):
            return serving.log_model(model_dir, config, data).model_uri, store
    finally:
        mlflow.set_tracking_uri(before)
