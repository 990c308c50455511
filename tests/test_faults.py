"""Faults injected into real runs: a worker killed with and without Horovod elastic, a corrupted shard.

Elastic on one machine: the hosts file names two hosts, `localhost` and `127.0.0.1` (both this
machine, so no ssh); Horovod stops using only the host whose worker was killed.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import CONFIGS, HOROVODRUN, PYTHON, ROOT, horovodrun, quiet_env

pytestmark = pytest.mark.slow


def train_args(shards: Path, workdir: Path, *extra: str) -> list[str]:
    return [
        "-m",
        "models.train",
        "--shards",
        str(shards),
        "--workdir",
        str(workdir),
        "--config",
        str(CONFIGS / "tiny_asr.yaml"),
        *extra,
    ]


def rank_pid(rank: int, workdir: Path, timeout: float = 120) -> int:
    """The pid of the training process of Horovod rank `rank` (its environment names it) training in
    `workdir`: other trainings on the machine (another test's) are left alone."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
                env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            except OSError:
                continue
            mine = b"models.train" in cmdline and str(workdir).encode() in cmdline and b"horovodrun" not in cmdline
            if mine and f"HOROVOD_RANK={rank}".encode() in env:
                return int(pid)
        time.sleep(0.2)
    raise AssertionError(f"no training process of rank {rank}")


def wait_for(directory: Path, pattern: str, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while not (directory.is_dir() and any(directory.glob(pattern))):
        assert time.monotonic() < deadline, f"no {pattern} in {directory}"
        time.sleep(0.2)


def test_elastic_job_survives_a_killed_worker_and_finishes_its_budget(tiny_shards, tmp_path):
    hosts = tmp_path / "hosts.txt"
    hosts.write_text("localhost:1\n127.0.0.1:1\n")
    workdir = tmp_path / "w"
    cmd = [
        HOROVODRUN,
        "-np",
        "2",
        "--min-np",
        "1",
        "--max-np",
        "2",
        "--host-discovery-script",
        str(ROOT / "scripts" / "discover_hosts.sh"),
        "--network-interface",
        "lo",
        "--gloo",
        PYTHON,
        *train_args(tiny_shards, workdir, "--elastic", "--epochs", "20", "--set", "commit_every=2"),
    ]
    env = quiet_env(MLFLOW_TRACKING_URI=f"sqlite:///{tmp_path / 'mlflow.db'}", SPEECHFLOW_HOSTS_FILE=str(hosts))
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_for(workdir, "mlflow_run.json")
        time.sleep(8)  # a few commits in
        os.kill(rank_pid(1, workdir), signal.SIGKILL)
        out, _ = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out[-5000:]
    summary = json.loads((workdir / "train_summary.json").read_text())
    assert summary["world_size"] == 1 and summary["world_size_changes"], summary.get("world_size_changes")
    assert (workdir / "model" / "config.yaml").is_file()
    assert "the job now has 1 workers" in out


def test_without_elastic_a_killed_rank_ends_the_job_quickly_and_a_rerun_resumes(tiny_shards, tmp_path):
    workdir = tmp_path / "w"
    args = train_args(tiny_shards, workdir, "--epochs", "8", "--set", "checkpoint_every=4")
    cmd = [HOROVODRUN, "-np", "2", "-H", "localhost:2", "--gloo", PYTHON, *args]
    env = quiet_env(MLFLOW_TRACKING_URI=f"sqlite:///{tmp_path / 'mlflow.db'}")
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_for(workdir / "checkpoints", "ckpt-*.npz")
        os.kill(rank_pid(1, workdir), signal.SIGKILL)
        killed = time.monotonic()
        out, _ = proc.communicate(timeout=120)
        detected = time.monotonic() - killed
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode != 0 and detected < 60, detected
    assert "Process name: 1" in out or "Process 1 exit" in out, out[-3000:]  # the launcher names the rank
    again = horovodrun(args, env=env, timeout=600)
    summary = json.loads((workdir / "train_summary.json").read_text())
    assert summary["resumed_from_step"] >= 4 and summary["ranks_agree"], again.stdout[-2000:]


def test_a_corrupted_shard_is_named_on_every_rank(tiny_shards, tmp_path):
    import shutil

    shards = tmp_path / "shards"
    shutil.copytree(tiny_shards, shards)
    victim = sorted(shards.glob("train-*.tfrecord"))[1]
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one flipped byte in the middle of a record
    victim.write_bytes(bytes(data))
    proc = horovodrun(
        train_args(shards, tmp_path / "w", "--max-steps", "6"),
        env=quiet_env(MLFLOW_TRACKING_URI=f"sqlite:///{tmp_path / 'mlflow.db'}"),
        check=False,
        timeout=300,
    )
    assert proc.returncode != 0
    assert victim.name in proc.stdout + proc.stderr and "sha256" in proc.stdout + proc.stderr


def test_elastic_reset_keeps_the_replanned_epoch_through_horovods_sync():
    """Horovod calls the reset callbacks, then `sync()`, which sets the state's attributes back to
    the last save: the epoch origin `_on_reset` re-plans must survive it (lost, a survivor skipped
    into its epoch by the old world size's steps and ran out of input before its new step count)."""
    from types import SimpleNamespace

    from horovod.common.elastic import ObjectState

    from models.loop import Trainer

    state = ObjectState(bcast_object=lambda obj: obj, get_rank=lambda: 0, step=20, origin=[0, 0])
    trainer = SimpleNamespace(
        hvd=SimpleNamespace(rank=lambda: 1, size=lambda: 1),  # rank 1: no MLflow logging
        steps_per_epoch=5,  # two workers' steps per epoch before the reset
        _steps_per_epoch=lambda: 6,  # one worker's after it
        last_epoch=20,
        config=SimpleNamespace(max_steps=0),
        _progress=SimpleNamespace(world_sizes=[]),
        _set_learning_rate=lambda step: None,
    )
    trainer._epoch_of = lambda step, origin: Trainer._epoch_of(trainer, step, origin)
    Trainer._on_reset(trainer, state, log=None)
    state.sync()  # what Horovod's elastic run does next
    assert state.origin == [3, 20] and trainer._origin == (3, 20)
    assert trainer.total_steps == 20 + 17 * 6
