"""MLflow tracking: the default store, the experiment's kind (models/tracking/runs.py), metrics that
survive an outage of a real `mlflow server` (models/tracking/spool.py), and per-rank system metrics
(models/training/system_metrics.py)."""

from __future__ import annotations

import time

import mlflow
import mlflow.tracking._tracking_service.utils as mlflow_uri_state
import pytest
from mlflow.exceptions import MlflowException

import models.tracking.spool
from common.ports import reserve_port
from models.tracking import runs as tracking
from models.tracking.spool import RunLog, spool_path
from models.training import system_metrics
from tests.conftest import copy_store
from tests.mlflow_server import MlflowServer


@pytest.fixture(scope="module")
def server(tmp_path_factory, mlflow_template):
    root = tmp_path_factory.mktemp("mlflow_server")
    with MlflowServer(copy_store(mlflow_template, root), root / "artifacts", root / "server.log") as running:
        yield running


def new_run(uri: str, name: str) -> str:
    client = mlflow.MlflowClient(uri)
    experiment = client.get_experiment_by_name(name) or client.get_experiment(client.create_experiment(name))
    return client.create_run(experiment.experiment_id).info.run_id


def history(uri: str, run_id: str, key: str) -> dict[int, float]:
    return {m.step: m.value for m in mlflow.MlflowClient(uri).get_metric_history(run_id, key)}


def test_default_store_is_under_runs_and_experiments_are_model_training(tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.chdir(tmp_path)
    # tracking.client() sets MLflow's process-wide URI: put it back for the tests that follow.
    monkeypatch.setattr(mlflow_uri_state, "_tracking_uri", mlflow_uri_state._tracking_uri)
    assert tracking.tracking_uri() == f"sqlite:///{tmp_path / '.runs' / 'mlflow.db'}"
    experiment_id = tracking.ensure_experiment("kinds")
    experiment = tracking.client().get_experiment(experiment_id)
    assert experiment.tags[tracking.EXPERIMENT_KIND_TAG] == tracking.MODEL_TRAINING
    assert (tmp_path / ".runs" / "mlflow.db").is_file() and not (tmp_path / "mlflow.db").exists()
    # An experiment made without the tag gets it; a kind chosen by someone else stays.
    plain = tracking.client().create_experiment("made-by-hand")
    other = tracking.client().create_experiment("genai", tags={tracking.EXPERIMENT_KIND_TAG: "genai_development"})
    tracking.ensure_experiment("made-by-hand"), tracking.ensure_experiment("genai")
    assert tracking.client().get_experiment(plain).tags[tracking.EXPERIMENT_KIND_TAG] == tracking.MODEL_TRAINING
    assert tracking.client().get_experiment(other).tags[tracking.EXPERIMENT_KIND_TAG] == "genai_development"
    assert tracking.ui_url("http://127.0.0.1:5000/", "3", "abc") == (
        "http://127.0.0.1:5000/#/experiments/3/runs/abc?workflowType=machine_learning"
    )


def test_metrics_survive_an_outage_of_the_tracking_server(server, tmp_path, capsys):
    run_id = new_run(server.uri, "outage")
    spool = spool_path(tmp_path, rank=0)
    # A generous timeout: a server that just started may take seconds over its first request.
    log = RunLog(run_id, spool, server.uri, retry_s=0.5, timeout_s=30.0)
    log.log_params({"lr": 0.1})
    for step in range(3):
        log.log_metrics({"loss": 10.0 - step, "lr": 0.1}, step=step)
    assert not spool.exists()

    server.stop()
    started = time.monotonic()
    for step in range(3, 8):
        log.log_metrics({"loss": 10.0 - step, "lr": 0.1}, step=step)
    log.log_metric("consensus_distance", 0.5, step=7)
    log.log_params({"note": "logged during the outage"})
    assert time.monotonic() - started < 5, "an unreachable server must not hold training up"
    assert log.waiting() == 7
    said = capsys.readouterr().err
    assert said.count("is unreachable") == 1 and str(spool) in said

    server.start()
    time.sleep(0.6)  # past retry_s: the next record sends what waited, in order, then itself
    log.log_metrics({"loss": 1.0}, step=8)
    assert not spool.exists() and log.waiting() == 0
    assert "answers again" in capsys.readouterr().err
    assert history(server.uri, run_id, "loss") == {s: 10.0 - s for s in range(8)} | {8: 1.0}
    run = mlflow.MlflowClient(server.uri).get_run(run_id)
    assert run.data.params == {"lr": "0.1", "note": "logged during the outage"}
    assert run.data.metrics["consensus_distance"] == 0.5
    # A request the server refuses is an error, not an outage (a param may not change its value).
    with pytest.raises(MlflowException, match="lr"):
        log.log_params({"lr": 0.2})


def test_records_left_by_a_dead_training_are_sent_by_replay(server, tmp_path, capsys):
    run_id = new_run(server.uri, "outage")
    spool = spool_path(tmp_path, rank=1)
    dead = RunLog(run_id, spool, f"http://127.0.0.1:{reserve_port()}")  # nothing listens there
    dead.log_metrics({"loss": 3.0}, step=1)
    dead.log_metrics({"loss": 2.0}, step=2)
    dead.close(wait_s=0)
    assert "records stay in" in capsys.readouterr().err and dead.waiting() == 2
    with pytest.raises(SystemExit) as exit_code:
        models.tracking.spool.main(["replay", str(spool), "--uri", server.uri])
    assert exit_code.value.code == 0 and not spool.exists()
    assert history(server.uri, run_id, "loss") == {1: 3.0, 2: 2.0}


def test_system_metrics_of_a_rank_reach_the_run(server, tmp_path):
    run_id = new_run(server.uri, "system")
    log = RunLog(run_id, spool_path(tmp_path, rank=1), server.uri)
    with system_metrics.SystemMetrics(log, rank=1, local_rank=1, interval_s=0.2) as sampler:
        sum(i * i for i in range(2_000_000))  # some CPU work to measure
        deadline = time.monotonic() + 60  # a loaded machine may delay the sampler's thread
        while sampler.points < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
    assert sampler.points >= 2
    metrics = mlflow.MlflowClient(server.uri).get_run(run_id).data.metrics
    for name in (
        "cpu_utilization_percentage",
        "system_memory_usage_megabytes",
        "process_cpu_utilization_percentage",
        "process_memory_rss_megabytes",
    ):
        assert f"system/rank1/{name}" in metrics, sorted(metrics)
    assert metrics["system/rank1/process_memory_rss_megabytes"] > 10
    assert len(history(server.uri, run_id, "system/rank1/cpu_utilization_percentage")) == sampler.points


def test_a_rank_reports_only_its_own_gpu():
    class FakeNvml:  # MLflow's GPU monitor reports every GPU NVML sees
        def collect_metrics(self):
            pass

        def aggregate_metrics(self):
            return {"gpu_0_utilization_percentage": 10.0, "gpu_1_utilization_percentage": 90.0}

        def clear_metrics(self):
            pass

    assert system_metrics._OneGpu(FakeNvml(), 1).aggregate_metrics() == {"gpu_utilization_percentage": 90.0}
    assert system_metrics.nvml_index(local_rank=1, count=4) == 1
    assert system_metrics.nvml_index(local_rank=1, count=4, visible="2,3") == 3
    assert system_metrics.nvml_index(local_rank=5, count=4, visible="GPU-0f1e,GPU-aa") == 1
