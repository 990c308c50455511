"""Faults injected into real runs, by the faults benchmark's tiny run (benchmarks/faults.py --tiny) in
two halves, which are the one launch of each: a worker killed with and without Horovod elastic and the
rerun that resumes; the whole job killed and rerun, a corrupted shard, MLflow down in the middle of
training. The shard writer killed and rerun is tests/test_shards.py's; the tiny run leaves it out and
says so.

Elastic on one machine: the hosts file names two hosts, `localhost` and `127.0.0.1` (both this
machine, so no ssh); Horovod stops using only the host whose worker was killed.
"""

from __future__ import annotations

import pytest

from tests.conftest import ROOT
from tests.test_benchmarks import EXPECTED, run_tiny

# The tiny run in two halves, one launch each, which pytest-xdist runs side by side: each half's faults,
# and its keys of the benchmark's JSON (tests/test_benchmarks.py EXPECTED).
WORKER_FAULTS = ("clean", "kill_worker", "kill_worker_elastic", "kill_shard_writer")
JOB_FAULTS = ("kill_job", "corrupt_shard", "mlflow_down")


def run_faults(faults: tuple[str, ...], tmp_path, store: str) -> dict:
    """benchmarks/faults.py --tiny of `faults`: the JSON, with every EXPECTED key of those faults."""
    # `left_out` only where the half holds the fault the tiny run leaves out (benchmarks/faults.py)
    shard_writer = "kill_shard_writer" in faults
    keys = [k for k in EXPECTED["faults"] if k.startswith(faults) or (k == "left_out" and shard_writer)]
    results = run_tiny("faults", tmp_path, store, "--faults", ",".join(faults), keys=keys)
    assert results["faults"] == [f for f in faults if f not in results.get("left_out", {})], results["faults"]
    return results


@pytest.mark.slow
def test_a_killed_worker_ends_as_it_should(tmp_path, sqlite_store):
    faults = run_faults(WORKER_FAULTS, tmp_path, sqlite_store)
    assert faults["clean_exit"] == 0
    # Rank 1 killed, not elastic: the launcher exits at once and names the rank; the rerun (the
    # Airflow retry) resumes from the last checkpoint (every 2 steps in the tiny run) and finishes.
    assert faults["kill_worker_exit"] != 0 and faults["kill_worker_detect_s"] < 60, faults
    assert faults["kill_worker_rank_named"], "the launcher's output names neither the rank nor its exit"
    assert faults["kill_worker_retry_exit"] == 0 and faults["kill_worker_retry_ranks_agree"]
    resumed = faults["kill_worker_resumed_from_step"]
    assert resumed >= 2 and resumed % 2 == 0, faults  # a checkpoint's step
    # Under elastic the survivor goes on alone, says so, and finishes the budget with a saved model.
    assert faults["kill_worker_elastic_exit"] == 0 and faults["kill_worker_elastic_reset_said"], faults
    assert faults["kill_worker_elastic_world_size"] == 1 and faults["kill_worker_elastic_world_size_changes"] >= 1
    assert faults["kill_worker_elastic_model_saved"]
    # The shard writer killed while writing is left out, naming the test that kills it the same way.
    covering = "test_killed_writer_leaves_no_partial_shard_and_rerun_gives_same_manifest"
    assert covering in faults["left_out"]["kill_shard_writer"], faults
    assert f"def {covering}(" in (ROOT / "tests" / "test_shards.py").read_text()  # still there, by that name
    assert not any(key.startswith("kill_shard_writer_") for key in faults), faults


@pytest.mark.slow
def test_a_killed_job_a_corrupt_shard_and_mlflow_down_end_as_they_should(tmp_path, sqlite_store):
    faults = run_faults(JOB_FAULTS, tmp_path, sqlite_store)
    # The whole job killed, then run again: it resumes from its last checkpoint, in the same MLflow run.
    assert faults["kill_job_retry_exit"] == 0 and faults["kill_job_same_mlflow_run"]
    assert faults["kill_job_resumed_from_step"] >= 2 and faults["kill_job_resumed_from_step"] % 2 == 0, faults
    # A flipped byte: the job fails, naming the shard and its checksum.
    assert faults["corrupt_shard_exit"] != 0 and faults["corrupt_shard_named"]
    assert faults["corrupt_shard_checksum_named"]
    # MLflow down for a while: every loss point arrives once it is back.
    assert faults["mlflow_down_exit"] == 0 and faults["mlflow_down_none_lost"], faults
    assert not any(key.startswith(("clean_", "kill_worker_")) for key in faults), "a fault not asked for ran"


def test_elastic_reset_keeps_the_replanned_epoch_through_horovods_sync(monkeypatch):
    """Horovod calls the reset callbacks, then `sync()`, which sets the state's attributes back to
    the last save: the epoch origin the reset re-plans must survive it (lost, a survivor skipped
    into its epoch by the old world size's steps and ran out of input before its new step count)."""
    from types import SimpleNamespace

    from horovod.common.elastic import ObjectState

    from models.training import loop, schedule

    # two workers' steps per epoch before the reset
    committed = ObjectState(bcast_object=lambda obj: obj, get_rank=lambda: 0, step=20, origin=[0, 0], per_epoch=5)
    setup = SimpleNamespace(
        hvd=SimpleNamespace(rank=lambda: 1, size=lambda: 1),  # rank 1: no MLflow logging
        config=SimpleNamespace(max_steps=0),
    )
    monkeypatch.setattr(schedule, "steps_per_epoch", lambda setup, size: 6)  # one worker's after it
    monkeypatch.setattr(schedule, "set_learning_rate", lambda setup, plan, step: 0.0)
    world_sizes = []
    loop._on_reset(setup, committed, log=None, world_sizes=world_sizes)
    committed.sync()  # what Horovod's elastic run does next
    assert committed.origin == [3, 20] and committed.per_epoch == 6 and world_sizes == [[20, 1]]
    before = schedule.Plan(rank=0, size=2, steps_per_epoch=5, total_steps=100, last_epoch=20)
    position, plan = loop._elastic_position(setup, before, committed, world_sizes)  # the loop, called again
    assert position == {"step": 20, "epoch": 3} and plan.origin == (3, 20)
    assert (plan.rank, plan.size, plan.steps_per_epoch, plan.total_steps) == (1, 1, 6, 20 + 17 * 6)
