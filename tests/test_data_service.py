"""Training through a tf.data service: a dispatcher and two workers on 127.0.0.1, two Horovod ranks."""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import time

import pytest

from tests.conftest import CONFIGS, PYTHON, ROOT, horovodrun, quiet_env

pytestmark = pytest.mark.slow


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def service(tmp_path):
    """A dispatcher and two workers, as `python -m pipeline.data_service` runs them."""
    port = free_port()
    commands = {"dispatcher": ["dispatcher", "--port", str(port)]}
    for i in range(2):
        worker = free_port()
        commands[f"worker{i}"] = [
            "worker",
            "--dispatcher",
            f"127.0.0.1:{port}",
            "--port",
            str(worker),
            "--address",
            f"127.0.0.1:{worker}",
        ]
    with contextlib.ExitStack() as stack:
        procs = []
        for name, args in commands.items():
            log = stack.enter_context(open(tmp_path / f"{name}.log", "w"))
            procs.append(
                subprocess.Popen(
                    [PYTHON, "-m", "pipeline.data_service", *args],
                    cwd=ROOT,
                    env=quiet_env(),
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            )
            stack.callback(procs[-1].wait, timeout=30)
            stack.callback(procs[-1].terminate)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            logs = [(tmp_path / f"{name}.log").read_text() for name in commands]
            if all("serving" in log or "worker on port" in log for log in logs):
                break
            assert all(p.poll() is None for p in procs), logs
            time.sleep(0.5)
        yield f"grpc://127.0.0.1:{port}"


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
