"""A real `mlflow server` on 127.0.0.1 for tests: started, stopped and started again on the same port."""

from __future__ import annotations

import subprocess
import time
import urllib.request
from pathlib import Path

from common.ports import reserve_port
from models.serving.mlflow_serve import SERVER_ENV, stop_session
from tests.conftest import PYTHON, ROOT, quiet_env


class MlflowServer:
    """`mlflow server --backend-store-uri STORE --artifacts-destination DIR` (proxied artifacts) on a free port."""

    def __init__(self, store_uri: str, artifacts: Path, log: Path, port: int | None = None):
        self.store_uri, self.artifacts, self.log = store_uri, Path(artifacts), Path(log)
        self.port = port or reserve_port()
        self.uri = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 120) -> MlflowServer:
        address = ["--host", "127.0.0.1", "--port", str(self.port)]
        stores = ["--backend-store-uri", self.store_uri, "--artifacts-destination", str(self.artifacts)]
        cmd = [PYTHON, "-m", "mlflow", "server", *address, *stores, "--serve-artifacts", "--workers", "1"]
        with open(self.log, "a") as out:
            # A session of its own: stop() ends the server and the uvicorn worker it starts.
            self.proc = subprocess.Popen(
                cmd, cwd=ROOT, env=quiet_env(**SERVER_ENV), stdout=out, stderr=out, start_new_session=True
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"mlflow server exited {self.proc.returncode}:\n{self.log.read_text()[-4000:]}")
            try:
                with urllib.request.urlopen(f"{self.uri}/health", timeout=2) as answer:
                    if answer.status == 200:
                        return self
            except OSError:
                time.sleep(0.25)
        self.stop()
        raise TimeoutError(f"mlflow server on {self.uri} not ready in {timeout} s:\n{self.log.read_text()[-4000:]}")

    def stop(self) -> None:
        if self.proc is None:
            return
        # uvicorn would wait for idle keep-alive connections (a test's client holds some) to close.
        stop_session(self.proc, grace=3)
        self.proc = None

    def __enter__(self) -> MlflowServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
