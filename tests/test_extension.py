"""The seams hold: a third model and a third strategy, each one file under tests/extension/ that
registers itself (common/catalog.py) when SPEECHFLOW_EXTENSIONS names it, and nothing else of the
project changed for them. The DAG form lists them without TensorFlow; `models.train` trains them
under the real launcher; `models.evaluate` evaluates; MLflow records them; a served copy answers."""

from __future__ import annotations

import json
import subprocess
import textwrap

import mlflow
import pytest

from tests.conftest import CONFIGS, PYTHON, ROOT, horovodrun, quiet_env
from tests.test_dag import airflow_env, airflow_python, needs_airflow

MODEL, STRATEGY = "tests.extension.speaker_id", "tests.extension.local_sgd"
EXTENSIONS = f"{MODEL},{STRATEGY}"


def extension_env(uri: str) -> dict[str, str]:
    return quiet_env(MLFLOW_TRACKING_URI=uri, SPEECHFLOW_EXTENSIONS=EXTENSIONS)


def python(code: str, env: dict) -> str:
    proc = subprocess.run(
        [PYTHON, "-c", textwrap.dedent(code)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return proc.stdout


def train(shards, workdir, env: dict, *args: str) -> dict:
    horovodrun(
        ["-m", "models.train", "--shards", str(shards), "--workdir", str(workdir), *args], np=2, env=env, timeout=600
    )
    return json.loads((workdir / "train_summary.json").read_text())


def evaluate(shards, workdir, env: dict, *args: str) -> dict:
    python(
        f"""
        import sys
        from models import evaluate
        sys.exit(evaluate.main(["--model", {str(workdir)!r}, "--shards", {str(shards)!r}, *{list(args)!r}]))
        """,
        env,
    )
    return json.loads((workdir / "eval.json").read_text())


@pytest.fixture
def uri(sqlite_store):
    return sqlite_store


@pytest.fixture(scope="module")
def dev_shards(tmp_path_factory):
    """The tiny corpus with a dev split too (its speakers are the training ones), for dev selection."""
    from pipeline import shards
    from tests.kaldi_fixtures import make_feats_dir

    root = tmp_path_factory.mktemp("with-dev")
    splits = {
        name: make_feats_dir(root / name, num_utts=n, dim=13, frames=(30, 70), seed=seed)[0]
        for name, n, seed in (("train", 24, 3), ("dev", 8, 5), ("test", 8, 4))
    }
    shards.make_shards(splits, root / "shards", shards.ShardConfig(num_shards=2, jobs=1), progress=False)
    return root / "shards"


def test_the_plan_and_command_lines_know_the_extensions_without_tensorflow(tmp_path):
    out = python(
        """
        import json, sys
        from workflow import commands, plan
        from common import catalog
        # the plan loads the run's training config: the model's and the strategy's own settings
        plan.check_training_config("speaker_id", "local_sgd", "tests/configs/tiny_asr.yaml", ("strategy.every=3",))
        print(json.dumps({
            "models": list(plan.MODELS), "strategies": list(catalog.strategies()),
            "train": commands.train_args("S", "W", model="speaker_id", strategy="local_sgd"),
            "heavy": [m for m in ("tensorflow", "keras", "horovod", "mlflow", "numpy") if m in sys.modules],
        }))
        """,
        quiet_env(SPEECHFLOW_EXTENSIONS=EXTENSIONS),
    )
    seen = json.loads(out.splitlines()[-1])
    assert seen["models"] == ["asr", "tts", "speaker_id"] and seen["strategies"][-1] == "local_sgd"
    assert seen["train"][:4] == ["--model", "speaker_id", "--strategy", "local_sgd"]
    assert seen["heavy"] == []


def test_an_extensions_settings_are_typed_and_checked_without_tensorflow():
    """Its own dataclasses: a typo names the nearest key, a wrong type is refused, another strategy's
    options are ignored with a warning."""
    out = python(
        """
        import json, sys, warnings
        from common import config as configlib
        from models.training.config import TrainConfig
        from workflow import plan
        seen = {}
        for sets in (["speaker_id.hiden=8"], ["speaker_id.hidden=eight"],
                     ["strategy.name=local_sgd", "strategy.evry=2"]):
            try:
                configlib.load(TrainConfig, None, ["model=speaker_id", *sets])
            except ValueError as err:
                seen[sets[-1]] = str(err)
        own = configlib.load(TrainConfig, None, ["model=speaker_id", "speaker_id.hidden=8",
                                                 "strategy.name=local_sgd", "strategy.every=2"])
        seen["own"] = [own.settings.hidden, own.strategy.options.every]
        # a file written for local_sgd, run as allreduce
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            other = configlib.load(TrainConfig, None, ["strategy.name=local_sgd", "strategy.every=3"],
                                   flags={"strategy": {"name": "allreduce"}})
        seen["other"] = [other.strategy.name, other.strategy.options.compression]
        seen["warned"] = [str(w.message) for w in caught if w.category is UserWarning]
        seen["heavy"] = [m for m in ("tensorflow", "keras", "horovod", "mlflow", "numpy") if m in sys.modules]
        print(json.dumps(seen))
        """,
        quiet_env(SPEECHFLOW_EXTENSIONS=EXTENSIONS),
    )
    seen = json.loads(out.splitlines()[-1])
    assert "unknown config key 'speaker_id.hiden' (did you mean 'speaker_id.hidden'?)" in seen["speaker_id.hiden=8"]
    assert "expected an integer" in seen["speaker_id.hidden=eight"]
    assert "did you mean 'strategy.every'?" in seen["strategy.evry=2"]
    assert seen["own"] == [8, 2]
    assert seen["other"] == ["allreduce", "none"], "another strategy's options are ignored"
    assert seen["warned"] == [
        "config key 'strategy.every' is an option of strategy 'local_sgd', not of 'allreduce': ignored"
    ]
    assert seen["heavy"] == []


@pytest.mark.airflow
@needs_airflow
def test_the_dag_form_lists_the_extensions(tmp_path):
    env = airflow_env(tmp_path / "airflow-home", SPEECHFLOW_EXTENSIONS=EXTENSIONS)
    seen = airflow_python(
        f"""
        import json, sys
        from airflow.dag_processing.dagbag import BundleDagBag
        dags = {str(ROOT / "dags")!r}
        bag = BundleDagBag(dag_folder=dags, bundle_path=dags, bundle_name="dags-folder")
        dag = bag.dags["speech_pipeline"]
        print("RESULT " + json.dumps({{
            "errors": {{k: str(v)[-2000:] for k, v in bag.import_errors.items()}},
            "models": dag.params.get_param("models").schema["items"]["enum"],
            "strategies": dag.params.get_param("strategy").schema["enum"],
            "config": dag.params.get_param("speaker_id_config").value,
            "tasks": sorted(t.task_id for t in dag.tasks if "speaker_id" in t.task_id),
            "heavy": [m for m in ("tensorflow", "keras", "horovod", "mlflow", "numpy") if m in sys.modules],
        }}))
        """,
        env,
    )
    assert seen["errors"] == {} and seen["heavy"] == []
    assert "speaker_id" in seen["models"] and "local_sgd" in seen["strategies"]
    assert seen["config"] == "tests/configs/tiny_asr.yaml"
    assert seen["tasks"] == ["evaluate_speaker_id", "register_speaker_id", "train_speaker_id"]


@pytest.mark.slow
def test_third_model(dev_shards, tmp_path, uri):
    tiny_shards = dev_shards
    env = extension_env(uri)
    workdir = tmp_path / "speaker_id"
    config = ["--config", str(CONFIGS / "tiny_asr.yaml"), "--model", "speaker_id", "--max-steps", "6"]
    # Dev selection by the task's own metric (dev_error, which no built-in model has), every 2 steps.
    summary = train(tiny_shards, workdir, env, *config, "--set", "speaker_id.hidden=8", "--set", "eval_every=2")
    assert summary["world_size"] == 2 and summary["steps"] == 6 and summary["ranks_agree"]
    saved = (workdir / "model" / "config.yaml").read_text()
    assert "model: speaker_id" in saved and "hidden: 8" in saved and "spk0" in saved and "\nasr:" not in saved
    errors = {point["step"]: point["dev_error"] for point in summary["dev_history"]}
    assert sorted(errors) == [2, 4] and "dev_loss" in summary["dev_history"][0]
    errors[6] = summary["last_dev_error"]
    best = min(errors.values())
    assert summary["selected_dev_error"] == best and errors[summary["selected_step"]] == best
    assert "selected_dev_loss" not in summary  # the trainer chose by the task's metric, not the loss

    metrics = evaluate(tiny_shards, workdir, env)
    assert metrics["model"] == "speaker_id" and metrics["primary_metric"] == "dev_loss"
    assert 0.0 <= metrics["test_accuracy"] <= 1.0 and metrics["test_loss"] > 0

    client = mlflow.MlflowClient(uri)
    run = client.get_run(summary["run_id"])
    assert run.data.params["model"] == "speaker_id" and run.data.params["speaker_id.hidden"] == "8"
    assert "asr.units" not in run.data.params  # only its own model's settings
    assert run.data.metrics["test_loss"] == pytest.approx(metrics["test_loss"])

    # A served copy, in a process of its own, loaded from MLflow as a server loads it.
    out = python(
        f"""
        import json, mlflow, numpy as np, pandas as pd
        model = mlflow.pyfunc.load_model("runs:/{summary["run_id"]}/model")
        rows = pd.DataFrame({{"mels": [np.zeros([20, 13]).tolist(), np.ones([9, 13]).tolist()]}})
        print(json.dumps(list(model.predict(rows))))
        """,
        env,
    )
    answers = json.loads(out.splitlines()[-1])
    assert len(answers) == 2 and set(answers) <= {"spk0", "spk1", "spk2"}


@pytest.mark.slow
def test_third_strategy(tiny_shards, tmp_path, uri):
    env = extension_env(uri)
    workdir = tmp_path / "asr"
    every = ["--set", "strategy.every=2"]
    args = ["--config", str(CONFIGS / "tiny_asr.yaml"), "--strategy", "local_sgd", "--max-steps", "6", *every]
    summary = train(tiny_shards, workdir, env, *args)
    # Averaged at steps 2, 4 and 6 and once at the end: every rank ends with the same weights.
    assert summary["steps"] == 6 and summary["local_sgd_averages"] == 4 and summary["ranks_agree"]

    metrics = evaluate(tiny_shards, workdir, env, "--beam-width", "2")
    assert metrics["primary_metric"] == "test_cer" and metrics["test_cer"] >= 0.0

    run = mlflow.MlflowClient(uri).get_run(summary["run_id"])
    assert run.data.params["strategy.name"] == "local_sgd" and run.data.params["strategy.every"] == "2"
    assert run.data.tags["speechflow.strategy"] == "local_sgd"
    assert "test_cer" in run.data.metrics
