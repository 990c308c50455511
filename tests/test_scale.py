"""The documented launch at the size a GPU node runs it: `horovodrun -np 8 python -m models.train`, as
the README gives it, for allreduce and for AD-PSGD, eight ranks sharing two cores (tiny model)."""

from __future__ import annotations

import json

import pytest

from tests.conftest import CONFIGS, horovodrun, quiet_env

pytestmark = pytest.mark.slow

NP = 8


@pytest.fixture(scope="module")
def eight_shards(tmp_path_factory):
    """A small random corpus in as many training shards as ranks: each rank reads its own."""
    from pipeline import shards
    from tests.kaldi_fixtures import make_feats_dir

    root = tmp_path_factory.mktemp("eight")
    train, _, _ = make_feats_dir(root / "train", num_utts=32, dim=13, frames=(30, 70), seed=5)
    config = shards.ShardConfig(num_shards=NP, jobs=1)
    shards.make_shards({"train": train}, root / "shards", config, progress=False)
    return root / "shards"


@pytest.mark.parametrize("strategy", ["allreduce", "adpsgd"])
def test_the_documented_command_at_eight_ranks(strategy, eight_shards, tmp_path, sqlite_store):
    workdir = tmp_path / "asr"
    # README: horovodrun -np N -H localhost:N --gloo python -m models.train --model asr --strategy S ...
    args = ["-m", "models.train", "--model", "asr", "--strategy", strategy, "--shards", str(eight_shards)]
    args += ["--workdir", str(workdir), "--config", str(CONFIGS / "tiny_asr.yaml"), "--max-steps", "3"]
    horovodrun(args, np=NP, timeout=900, env=quiet_env(MLFLOW_TRACKING_URI=sqlite_store))
    summary = json.loads((workdir / "train_summary.json").read_text())
    assert summary["world_size"] == NP and summary["ranks_agree"], summary.get("per_rank_weights_digest")
    assert len(summary["per_rank_steps"]) == NP and all(steps >= 1 for steps in summary["per_rank_steps"])
    if strategy == "adpsgd":
        assert summary["gossip_rounds"] >= 1
    assert (workdir / "model" / "config.yaml").is_file()
