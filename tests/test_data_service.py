"""Training through a tf.data service: a dispatcher and two workers on 127.0.0.1, two Horovod ranks."""

from __future__ import annotations

import contextlib
import json
import subprocess
import time

import pytest

from tests.conftest import CONFIGS, PYTHON, ROOT, horovodrun, quiet_env

pytestmark = pytest.mark.slow


@pytest.fixture
def service(tmp_path):
    """A dispatcher and two workers, as `python -m pipeline.data_service` runs them, each on a port it
    picks itself (--port 0) and writes to its port file: no other process can take it in between."""
    with contextlib.ExitStack() as stack:

        def start(name: str, args: list[str]):
            port_file, log_path = tmp_path / f"{name}.port", tmp_path / f"{name}.log"
            log = stack.enter_context(open(log_path, "w"))
            command = [PYTHON, "-m", "pipeline.data_service", *args, "--port", "0", "--port-file", str(port_file)]
            proc = subprocess.Popen(command, cwd=ROOT, env=quiet_env(), stdout=log, stderr=subprocess.STDOUT)
            stack.callback(proc.wait, timeout=30)
            stack.callback(proc.terminate)
            return name, proc, port_file, log_path

        dispatcher = listening(*start("dispatcher", ["dispatcher"]))
        workers = [
            start(f"worker{i}", ["worker", "--dispatcher", f"127.0.0.1:{dispatcher}", "--address", "127.0.0.1:%port%"])
            for i in range(2)
        ]
        for worker in workers:
            listening(*worker)
        yield f"grpc://127.0.0.1:{dispatcher}"


def listening(name: str, proc: subprocess.Popen, port_file, log_path, timeout: float = 120) -> int:
    """The port a server wrote to its port file once it listens; fails with its log if it exits or times out."""
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(FileNotFoundError):
            return int(port_file.read_text())
        assert proc.poll() is None, f"{name} exited {proc.returncode}:\n{log_path.read_text()}"
        assert time.monotonic() < deadline, f"{name} not listening after {timeout:.0f} s:\n{log_path.read_text()}"
        time.sleep(0.2)


def test_two_ranks_train_through_a_dispatcher_and_two_workers(service, tiny_shards, tmp_path, sqlite_store):
    import mlflow

    uri = sqlite_store
    workdir = tmp_path / "w"
    horovodrun(
        [
            "-m",
            "models.train",
            "--shards",
            str(tiny_shards),
            "--workdir",
            str(workdir),
            "--config",
            str(CONFIGS / "tiny_asr.yaml"),
            "--data-service",
            service,
            "--max-steps",
            "12",
            "--set",
            "log_every=1",
        ],
        np=2,
        env=quiet_env(MLFLOW_TRACKING_URI=uri),
        timeout=600,
    )
    summary = json.loads((workdir / "train_summary.json").read_text())
    assert summary["per_rank_steps"] == [12, 12]
    assert summary["ranks_agree"], "allreduce keeps the ranks' weights equal"
    run_id = json.loads((workdir / "mlflow_run.json").read_text())["run_id"]
    losses = [m.value for m in mlflow.MlflowClient(uri).get_metric_history(run_id, "loss")]
    assert len(losses) == 12 and sum(losses[-3:]) < sum(losses[:3]), losses
