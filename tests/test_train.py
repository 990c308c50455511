"""The trainer's real entry points on tiny configs: learning, resuming, Horovod runs, MLflow records."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess

import mlflow
import numpy as np
import pytest

from common import config as configlib
from common import runtime
from models import train
from models.training import config as train_config
from tests.conftest import CONFIGS, PYTHON, ROOT, horovodrun, quiet_env
from tests.test_trainer_path import check_ranks


def tiny(name: str, *overrides: str) -> train_config.TrainConfig:
    return configlib.load(train_config.TrainConfig, CONFIGS / f"tiny_{name}.yaml", list(overrides))


def test_learning_rate_warms_up_to_the_scaled_peak_then_decays():
    cfg = train_config.OptimConfig(learning_rate=1e-3, warmup_steps=10, decay="cosine", final_fraction=0.1)
    assert train_config.learning_rate(0, cfg, 4, 100) == pytest.approx(1e-3)
    assert train_config.learning_rate(10, cfg, 4, 100) == pytest.approx(4e-3)
    assert train_config.learning_rate(100, cfg, 4, 100) == pytest.approx(4e-4)
    assert train_config.learning_rate(55, cfg, 4, 100) == pytest.approx(4e-3 * (0.1 + 0.9 * 0.5))
    flat = dataclasses.replace(cfg, scale_with_workers=False, decay="none")
    assert train_config.learning_rate(50, flat, 4, 100) == pytest.approx(1e-3)


def test_tiny_acoustic_model_learns_and_records_everything(tiny_shards, tmp_path, mlflow_uri):
    config = tiny("asr", "max_steps=60", "asr.units=48", "optim.learning_rate=0.03", "log_every=5")
    summary = train.train(config, tiny_shards, tmp_path / "w")
    history = summary["history"]
    assert summary["steps"] == 60 and summary["world_size"] == 1
    first, last = np.mean([h["loss"] for h in history[:2]]), np.mean([h["loss"] for h in history[-2:]])
    assert last < first / 2, (first, last)
    for key in ("frames_per_s", "time_input_ms", "time_compute_ms", "time_communication_ms", "learning_rate"):
        assert key in history[-1]
    assert summary["frames_per_s"] > 0 and summary["per_rank_peak_memory_mb"][0] > 0
    work = tmp_path / "w"
    for path in (
        "config.yaml",
        "model/config.yaml",
        "model/data.json",
        "train_summary.json",
        "plots/loss.png",
        "plots/step_time_breakdown.png",
        "plots/ranks.png",
    ):
        assert (work / path).is_file(), path
    run = mlflow.MlflowClient(mlflow_uri).get_run(summary["run_id"])
    assert run.data.params["asr.units"] == "48" and run.data.params["world_size"] == "1"
    assert "version.tensorflow" in run.data.params and "tts.reduction_factor" not in run.data.params
    assert run.inputs.dataset_inputs[0].dataset.name.startswith("shards:")


def test_the_saved_model_is_the_best_on_dev(tmp_path, mlflow_uri):
    from models.training import checkpoint
    from pipeline import shards
    from tests.kaldi_fixtures import make_feats_dir

    splits = {
        name: make_feats_dir(tmp_path / name, num_utts=n, dim=13, frames=(30, 70), seed=seed)[0]
        for name, n, seed in (("train", 24, 3), ("dev", 8, 6))
    }
    shards.make_shards(splits, tmp_path / "shards", shards.ShardConfig(num_shards=2, jobs=1), progress=False)
    config = tiny("asr", "max_steps=12", "eval_every=4", "optim.learning_rate=0.03")
    summary = train.train(config, tmp_path / "shards", tmp_path / "w")
    dev = summary["dev_history"]
    assert [h["step"] for h in dev] == [4, 8], "every eval_every steps, and once more after the last"
    candidates = [*(h["dev_cer"] for h in dev), summary["last_dev_cer"]]
    assert summary["selected_dev_cer"] == min(candidates)
    assert summary["selected_step"] in (4, 8, 12)
    best = checkpoint.latest(tmp_path / "w" / "best")
    saved = checkpoint.latest(tmp_path / "w" / "model")
    with np.load(best) as a, np.load(saved) as b:
        assert all(np.array_equal(a[k], b[k]) for k in a.files if k != "__meta__"), "model/ holds the best weights"
    run = mlflow.MlflowClient(mlflow_uri).get_run(summary["run_id"])
    assert "dev_cer" in run.data.metrics and "dev_loss" in run.data.metrics


def test_refuses_a_workdir_with_another_architecture(tiny_shards, tmp_path, mlflow_uri):
    train.train(tiny("asr", "max_steps=2"), tiny_shards, tmp_path / "w")
    with pytest.raises(ValueError, match="asr.units: 16 -> 24"):
        train.train(tiny("asr", "max_steps=4", "asr.units=24"), tiny_shards, tmp_path / "w")
    # Other settings (the step budget, the learning rate) may change on resume.
    resumed = train.train(tiny("asr", "max_steps=4", "optim.learning_rate=0.001"), tiny_shards, tmp_path / "w")
    assert resumed["resumed_from_step"] == 2 and resumed["steps"] == 4
    # A finished workdir is left as it is (a retried Airflow task must not train or log again).
    mtime = (tmp_path / "w" / "train_summary.json").stat().st_mtime_ns
    again = train.train(tiny("asr", "max_steps=4"), tiny_shards, tmp_path / "w")
    assert again["skipped"] and again["steps"] == 4
    assert (tmp_path / "w" / "train_summary.json").stat().st_mtime_ns == mtime


def test_resuming_a_run_the_tracking_store_lacks_names_the_run_file_and_the_fix(
    tiny_shards, tmp_path, mlflow_uri, monkeypatch
):
    train.train(tiny("asr", "max_steps=2"), tiny_shards, tmp_path / "w")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'other.db'}")
    with pytest.raises(FileNotFoundError, match=r"w/mlflow_run.json names MLflow run \w+, which the tracking store"):
        train.train(tiny("asr", "max_steps=4"), tiny_shards, tmp_path / "w")


def test_unknown_config_keys_are_errors(tiny_shards, tmp_path):
    proc = subprocess.run(
        [PYTHON, "-m", "models.train", "--shards", str(tiny_shards), "--workdir", str(tmp_path), "--set", "asr.unit=3"],
        cwd=ROOT,
        env=quiet_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1 and "unknown config key 'asr.unit' (did you mean 'asr.units'?)" in proc.stderr


def test_a_models_settings_are_of_its_own_class():
    from models.asr.config import AsrConfig
    from models.tts.config import TtsConfig

    assert isinstance(train_config.TrainConfig(model="tts").settings, TtsConfig)  # unset: the model's defaults
    with pytest.raises(
        ValueError, match="TrainConfig.settings is a AsrConfig, but the config's other values choose TtsConfig"
    ):
        train_config.TrainConfig(model="tts", settings=AsrConfig())
    # A file for one model trained as another: the other's section is left aside, the chosen one's defaults hold.
    config = configlib.load(train_config.TrainConfig, CONFIGS / "tiny_asr.yaml", flags={"model": "tts"})
    assert config.settings == TtsConfig() and "asr" not in configlib.to_dict(config)


def _check_horovod_run(workdir, mlflow_uri, model: str):
    summary = json.loads((workdir / "train_summary.json").read_text())
    assert summary["world_size"] == 2 and summary["ranks_agree"], summary["per_rank_weights_digest"]
    assert len(summary["per_rank_frames_per_s"]) == 2 and min(summary["per_rank_peak_memory_mb"]) > 0
    # Each CPU rank bound to its own share of the cores by default (common/runtime.py).
    cores = sorted(os.sched_getaffinity(0))
    assert summary["per_rank_cores"] == [runtime.core_share(r, 2, cores) for r in range(2)], summary["per_rank_cores"]
    client = mlflow.MlflowClient(mlflow_uri)
    run = client.get_run(summary["run_id"])
    assert run.data.params["world_size"] == "2" and run.data.params["model"] == model
    assert len(client.get_metric_history(run.info.run_id, "loss")) >= 2
    for key in ("final_frames_per_s_total", "rank0_peak_memory_mb", "rank1_peak_memory_mb", "time_input_ms"):
        assert key in run.data.metrics, key
    loaded = mlflow.pyfunc.load_model(f"runs:/{run.info.run_id}/model")
    assert loaded.metadata.signature is not None
    return summary, run, loaded


@pytest.mark.slow
def test_horovodrun_acoustic_model_allreduce(tmp_path, mlflow_uri):
    from pipeline import shards
    from tests.kaldi_fixtures import make_feats_dir

    splits = {
        name: make_feats_dir(tmp_path / name, num_utts=n, dim=13, frames=(30, 70), seed=seed)[0]
        for name, n, seed in (("train", 24, 3), ("dev", 12, 6))
    }
    shard_dir = tmp_path / "shards"
    shards.make_shards(splits, shard_dir, shards.ShardConfig(num_shards=4, jobs=1), progress=False)
    workdir = tmp_path / "asr"
    horovodrun(
        [
            # models.train's main, each rank's frames down to the task's loss recorded (tests/test_trainer_path.py)
            *("-m", "tests.test_trainer_path", str(tmp_path / "frames")),
            *("--shards", str(shard_dir), "--workdir", str(workdir)),
            *("--config", str(CONFIGS / "tiny_asr.yaml"), "--max-steps", "6"),
            *("--set", "eval_every=3", "--set", "optim.learning_rate=0.03"),
        ],
        env=quiet_env(MLFLOW_TRACKING_URI=mlflow_uri),
    )
    summary, run, loaded = _check_horovod_run(workdir, mlflow_uri, "asr")
    check_ranks(tmp_path / "frames", 2)
    assert run.data.metrics["time_communication_ms"] > 0  # the allreduce is timed apart from compute
    # The two ranks shared the dev split (each its shards, the counts summed): the selected model's
    # dev CER is the one evaluation finds on the whole split.
    assert [h["step"] for h in summary["dev_history"]] == [3]
    assert summary["dev_history"][0]["dev_utterances"] == 12, "each dev utterance scored once, by one rank"
    subprocess.run(
        [PYTHON, "-m", "models.evaluate", "--model", str(workdir), "--shards", str(shard_dir), "--split", "dev"]
        + ["--no-mlflow"],
        cwd=ROOT,
        env=quiet_env(),
        check=True,
        capture_output=True,
    )
    evaluated = json.loads((workdir / "eval.json").read_text())
    assert summary["selected_dev_cer"] == pytest.approx(evaluated["dev_cer"], abs=1e-9)
    # The served model takes audio (tests/test_serving.py); these shards hold random matrices in
    # Kaldi's format, features no audio gives, and the model says so.
    with pytest.raises(ValueError, match="made by Kaldi"):
        loaded.predict({"audio": [np.zeros(8000).tolist()], "sample_rate": [16000]})


@pytest.mark.slow
def test_horovodrun_synthesis_model_fused_step_fp16(tiny_shards, tmp_path, mlflow_uri):
    workdir = tmp_path / "tts"
    horovodrun(
        [
            "-m",
            "tests.test_trainer_path",  # models.train's main, with each rank's frames to the loss recorded
            str(tmp_path / "frames"),
            "--shards",
            str(tiny_shards),
            "--workdir",
            str(workdir),
            "--config",
            str(CONFIGS / "tiny_tts.yaml"),
            "--max-steps",
            "6",
            "--set",
            "strategy.compression=fp16",
            "--set",
            "strategy.fused_step=true",
        ],
        env=quiet_env(MLFLOW_TRACKING_URI=mlflow_uri),
    )
    summary, run, loaded = _check_horovod_run(workdir, mlflow_uri, "tts")
    check_ranks(tmp_path / "frames", 2)
    for module in ("encoder", "decoder", "postnet"):
        assert run.data.metrics[f"final_profile_{module}_ms"] > 0
    out = loaded.predict({"text": ["turn on the lights"]}, params={"max_steps": 4})
    assert out["mels"].shape[0] == 1 and out["mels"].shape[2] == 13
