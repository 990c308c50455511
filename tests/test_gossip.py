"""AD-PSGD under the real launcher: both models, every variant, a straggler, a failing rank."""

from __future__ import annotations

import json
import subprocess
import time

import mlflow
import pytest

from tests.conftest import CONFIGS, HOROVODRUN, PYTHON, ROOT, horovodrun, quiet_env

pytestmark = pytest.mark.slow


def train(tiny_shards, workdir, uri, model="asr", np_=2, hosts=None, extra=()):
    args = [
        "-m",
        "models.train",
        "--shards",
        str(tiny_shards),
        "--workdir",
        str(workdir),
        "--config",
        str(CONFIGS / f"tiny_{model}.yaml"),
        "--strategy",
        "adpsgd",
        "--set",
        "strategy.consensus_every=2",
        *extra,
    ]
    env = quiet_env(MLFLOW_TRACKING_URI=uri)
    if hosts:  # two "hosts" on this machine: Horovod groups ranks by host name
        cmd = [HOROVODRUN, "-np", str(np_), "-H", hosts, "--gloo", PYTHON, *args]
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr[-4000:]
    else:
        horovodrun(args, np=np_, env=env)
    return json.loads((workdir / "train_summary.json").read_text())


@pytest.fixture
def uri(tmp_path):
    return f"sqlite:///{tmp_path / 'mlflow.db'}"


@pytest.mark.parametrize(
    "variant",
    [
        ["--gossip", "fixed-ring", "--straggler-rank", "1", "--straggler-delay-ms", "150"],
        ["--gossip", "random-ring", "--gossip-compression", "fp16"],
    ],
)
def test_acoustic_model_gossip_ends_with_consensus(tiny_shards, tmp_path, uri, variant):
    summary = train(tiny_shards, tmp_path / "w", uri, extra=["--max-steps", "12", *variant])
    assert summary["ranks_agree"], summary["per_rank_weights_digest"]
    assert summary["gossip_rounds"] == 12 and summary["steps"] == 12
    run = mlflow.MlflowClient(uri).get_run(summary["run_id"])
    assert run.data.params["strategy.name"] == "adpsgd"
    history = mlflow.MlflowClient(uri).get_metric_history(run.info.run_id, "consensus_distance")
    assert history and all(m.value >= 0 for m in history)
    # Gossip scales the learning rate with the workers, like allreduce (tiny config: 0.003, 2 ranks).
    rates = mlflow.MlflowClient(uri).get_metric_history(run.info.run_id, "learning_rate")
    assert max(m.value for m in rates) > 1.5 * 0.003


def test_straggler_does_not_slow_the_fast_rank_to_its_pace(tiny_shards, tmp_path, uri):
    # The slow rank sleeps 300 ms per step, far longer than a tiny step: under allreduce both
    # ranks would run at its pace; with gossip the fast rank keeps its own.
    summary = train(
        tiny_shards,
        tmp_path / "w",
        uri,
        extra=["--max-steps", "16", "--straggler-rank", "1", "--straggler-delay-ms", "300"],
    )
    fast, slow = summary["per_rank_frames_per_s"]
    assert summary["ranks_agree"]
    assert fast > 1.5 * slow, summary["per_rank_frames_per_s"]


def test_synthesis_model_delay_by_one(tiny_shards, tmp_path, uri):
    summary = train(
        tiny_shards, tmp_path / "w", uri, model="tts", extra=["--max-steps", "8", "--gossip", "delay-by-one"]
    )
    assert summary["ranks_agree"] and summary["gossip_rounds"] == 8


def test_hierarchical_two_hosts_of_two(tiny_shards, tmp_path, uri):
    summary = train(
        tiny_shards,
        tmp_path / "w",
        uri,
        np_=4,
        hosts="localhost:2,127.0.0.1:2",
        extra=["--max-steps", "6", "--hierarchical-gossip"],
    )
    assert summary["gossip_hosts"] == 2 and summary["gossip_ranks_per_host"] == 2
    assert summary["ranks_agree"] and summary["world_size"] == 4


def test_a_failing_rank_stops_the_job_instead_of_hanging(tiny_shards, tmp_path, uri):
    start = time.time()
    proc = horovodrun(
        [
            "-m",
            "models.train",
            "--shards",
            str(tiny_shards),
            "--workdir",
            str(tmp_path / "w"),
            "--config",
            str(CONFIGS / "tiny_asr.yaml"),
            "--strategy",
            "adpsgd",
            "--max-steps",
            "40",
            "--fail-at-step",
            "4",
            "--fail-rank",
            "1",
        ],
        env=quiet_env(MLFLOW_TRACKING_URI=uri),
        check=False,
        timeout=300,
    )
    assert proc.returncode != 0
    assert "injected failure" in proc.stdout + proc.stderr
    assert time.time() - start < 120, "the surviving rank's gossip thread kept the job alive"
