"""The `speech_pipeline` DAG: it imports cleanly, its graph and params, the plans and command lines its
tasks build, the cluster mode (every task with pods and an MPIJob, against a fake cluster), and the
whole DAG under `airflow dags test` on a tiny corpus.

Airflow lives in .venv-airflow, so the tests that need it run scripts with that environment's python
or its `airflow` command; the `workflow` package imports no Airflow at module level and is tested here.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import yaml

from common.fsutil import slug
from tests.conftest import AIRFLOW_BIN, PYTHON, ROOT, quiet_env
from workflow import commands, form, local, mpijob, runner
from workflow.plan import Plan, make_plan

DAGS = ROOT / "dags"
needs_airflow = pytest.mark.skipif(
    not (AIRFLOW_BIN / "airflow").exists(), reason=".venv-airflow is missing (make setup builds it)"
)


# What the DAG's params hold when the trigger form is left as it is.
DEFAULTS = {
    "data_dir": "",
    "features_dir": "",
    "allow_pipes": False,
    "phonemes": "en-us",
    "demo_utterances": 2500,
    "demo_text": "open",
    "demo_engines": ["espeak-ng", "flite", "festival"],
    "demo_train_voices": [],
    "demo_test_voices": [],
    "demo_test_engine_voices": [],
    "num_shards": 8,
    "models": ["asr", "tts"],
    "strategy": "allreduce",
    "num_workers": 2,
    "data_service_workers": 0,
    "epochs": None,
    "max_steps": None,
    "asr_config": "configs/demo_asr.yaml",
    "tts_config": "configs/demo_tts.yaml",
    "train_overrides": [],
    "word_lm": True,
    "lm_text": "",
    "lexicon": "cmudict",
    "eval_utterances": 100,
    "experiment": "speechflow",
    "execution_mode": "local",
    "gpus_per_worker": None,
    "work_root": "",
}
# The CI run: a corpus of 40 utterances, the tiny models, 4 steps on 2 Horovod workers.
TINY = {
    "demo_utterances": 40,
    "num_shards": 2,
    "num_workers": 2,
    "max_steps": 4,
    "eval_utterances": 4,
    "asr_config": "tests/configs/tiny_asr.yaml",
    "tts_config": "tests/configs/tiny_tts_durations.yaml",
    "experiment": "ci",
}


def airflow_env(home: Path, **extra: str) -> dict[str, str]:
    """Environment of an Airflow command: its own AIRFLOW_HOME, this repository's DAGs, no examples."""
    env = dict(os.environ)
    env.update(
        PATH=f"{AIRFLOW_BIN}{os.pathsep}{env.get('PATH', '/usr/bin:/bin')}",
        AIRFLOW_HOME=str(home),
        AIRFLOW__CORE__DAGS_FOLDER=str(DAGS),
        AIRFLOW__CORE__LOAD_EXAMPLES="False",
        AIRFLOW__CORE__UNIT_TEST_MODE="False",
        PYTHONUNBUFFERED="1",
        TF_CPP_MIN_LOG_LEVEL="2",
        # the workflow package, also where the project is not installed in .venv-airflow
        PYTHONPATH=str(ROOT),
    )
    env.pop("VIRTUAL_ENV", None)
    env.update(extra)
    return env


def airflow(env: dict, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        [str(AIRFLOW_BIN / "airflow"), *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert proc.returncode == 0, (
        f"airflow {' '.join(args)} exited {proc.returncode}\n{proc.stdout[-5000:]}\n{proc.stderr[-5000:]}"
    )
    return proc


def airflow_python(script: str, env: dict, timeout: float = 300) -> dict:
    """Runs `script` with .venv-airflow's python; returns the JSON it prints on a line starting RESULT."""
    proc = subprocess.run(
        [str(AIRFLOW_BIN / "python"), "-c", textwrap.dedent(script)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert proc.returncode == 0, f"{proc.stdout[-5000:]}\n{proc.stderr[-8000:]}"
    line = next(line for line in proc.stdout.splitlines()[::-1] if line.startswith("RESULT "))
    return json.loads(line[len("RESULT ") :])


def dags_test(env: dict, conf: dict, timeout: float) -> subprocess.CompletedProcess:
    """One run of the DAG with `conf` under `airflow dags test` (no scheduler), whatever its outcome."""
    command = [str(AIRFLOW_BIN / "airflow"), "dags", "test", "speech_pipeline", "-c", json.dumps(conf)]
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


def last_json(stdout: str):
    """The JSON a CLI printed (`airflow ... -o json` may print warnings before it)."""
    return json.loads(next(line for line in stdout.splitlines()[::-1] if line.strip()[:1] in "[{"))


# ---- the DAG file -----------------------------------------------------------------------------------

EDGES = {
    "plan": set(),
    "start_mlflow_run": {"plan"},
    "prepare_corpus": {"start_mlflow_run"},
    **{
        f"features_{s}": {"prepare_corpus"} for s in ("train", "dev", "test", "test_noisy", "test_engine", "dev_engine")
    },
    "augment_train": {"prepare_corpus"},
    "features_train_aug": {"augment_train"},
    "lm_text": {"prepare_corpus"},
    "lexicon": {"lm_text"},
    "make_shards": {
        "features_train",
        "features_dev",
        "features_test",
        "features_test_noisy",
        "features_test_engine",
        "features_dev_engine",
        "features_train_aug",
        "lexicon",
    },
    "train_asr": {"make_shards"},
    "train_tts": {"make_shards"},
    "build_lm": {"make_shards", "lm_text"},
    "build_graph": {"build_lm"},
    "tune_lm_asr": {"train_asr", "build_lm", "build_graph"},
    "evaluate_asr": {"tune_lm_asr"},
    "evaluate_tts": {"train_tts", "tune_lm_asr"},
    "register_asr": {"evaluate_asr"},
    "register_tts": {"evaluate_tts"},
    "finish_mlflow_run": {"register_asr", "register_tts", "start_mlflow_run"},
}


@pytest.fixture(scope="module")
def dag_info(tmp_path_factory):
    """What the DAG folder holds, as the DAG processor parses it, and how its params validate."""
    if not (AIRFLOW_BIN / "python").exists():
        pytest.skip(".venv-airflow is missing (make setup builds it)")
    script = f"""
        import copy, json, sys
        from airflow.dag_processing.dagbag import BundleDagBag
        from airflow.sdk.definitions.param import ParamValidationError

        bag = BundleDagBag(dag_folder={str(DAGS)!r}, bundle_path={str(DAGS)!r}, bundle_name="dags-folder")
        dag = bag.dags["speech_pipeline"]
        rejected = {{}}
        for key, value in [("strategy", "sgd"), ("num_workers", 0), ("models", []),
                           ("models", ["asr", "wavenet"]), ("execution_mode", "cloud"), ("epochs", 0),
                           ("experiment", ""), ("demo_utterances", 5), ("max_steps", "ten"),
                           ("data_service_workers", -1), ("train_overrides", ["no equals sign"])]:
            params = copy.deepcopy(dag.params)
            try:
                params[key] = value
                rejected[f"{{key}}={{value!r}}"] = False
            except ParamValidationError:
                rejected[f"{{key}}={{value!r}}"] = True
        accepted = copy.deepcopy(dag.params)
        for key, value in {TINY!r}.items():
            accepted[key] = value
        accepted["epochs"] = 3
        accepted["models"] = ["tts"]
        print("RESULT " + json.dumps({{
            "errors": {{k: str(v)[-2000:] for k, v in bag.import_errors.items()}},
            "dag_ids": sorted(bag.dag_ids),
            "heavy_imports": sorted(m for m in ("tensorflow", "mlflow", "horovod", "keras") if m in sys.modules),
            "schedule": type(dag.timetable).__name__, "doc": bool(dag.doc_md),
            "tasks": {{t.task_id: {{"upstream": sorted(t.upstream_task_ids),
                                   "trigger_rule": getattr(t.trigger_rule, "value", t.trigger_rule),
                                   "setup": t.is_setup, "teardown": t.is_teardown, "retries": t.retries,
                                   "outlets": [o.name for o in t.outlets]}} for t in dag.tasks}},
            "params": {{k: {{"value": p.value, "description": p.description, "schema": p.schema}}
                        for k, p in dag.params.items()}},
            "rejected": rejected, "accepted": accepted.validate(),
        }}, default=str))
    """
    return airflow_python(script, airflow_env(tmp_path_factory.mktemp("airflow-home")))


@pytest.mark.airflow
def test_dag_folder_imports_without_errors_or_tensorflow(dag_info):
    assert dag_info["errors"] == {}
    assert dag_info["dag_ids"] == ["speech_pipeline"]
    assert dag_info["heavy_imports"] == []  # the DAG only wires: no TensorFlow, MLflow, Horovod
    assert dag_info["doc"] and dag_info["schedule"] == "NullTimetable"  # triggered, by hand or the API


@pytest.mark.airflow
def test_task_graph_is_as_described(dag_info):
    tasks = dag_info["tasks"]
    assert {t: set(v["upstream"]) for t, v in tasks.items()} == EDGES
    assert tasks["start_mlflow_run"]["setup"] and tasks["finish_mlflow_run"]["teardown"]
    # Stages after one that may be skipped (no demo corpus, one model only) still run.
    for task_id in (
        "augment_train",
        "features_train",
        "features_train_aug",
        "make_shards",
        "lm_text",
        "lexicon",
        "build_lm",
        "build_graph",
        "tune_lm_asr",
        "evaluate_asr",
        "evaluate_tts",
    ):
        assert tasks[task_id]["trigger_rule"] == "none_failed", task_id
    assert all(tasks[t]["retries"] >= 1 for t in tasks if t != "plan") and tasks["plan"]["retries"] == 0
    outlets = {t: v["outlets"] for t, v in tasks.items() if v["outlets"]}
    assert outlets == {
        "prepare_corpus": ["speechflow.corpus"],
        **{
            f"features_{s}": ["speechflow.features"]
            for s in ("train", "dev", "test", "test_noisy", "test_engine", "dev_engine", "train_aug")
        },
        "make_shards": ["speechflow.shards"],
        "train_asr": ["speechflow.model.asr"],
        "train_tts": ["speechflow.model.tts"],
        "register_asr": ["speechflow.registered.asr"],
        "register_tts": ["speechflow.registered.tts"],
    }


@pytest.mark.airflow
def test_params_describe_themselves_and_validate(dag_info):
    params = dag_info["params"]
    for name in (
        "data_dir",
        "models",
        "strategy",
        "num_workers",
        "epochs",
        "max_steps",
        "demo_utterances",
        "experiment",
        "execution_mode",
    ):
        assert name in params, name
    assert {k: p["value"] for k, p in params.items()} == DEFAULTS
    for name, p in params.items():
        assert len(p["description"] or "") > 20, f"{name} needs a description for the trigger form"
        assert p["schema"].get("title") and p["schema"].get("section"), name
    assert params["strategy"]["schema"]["enum"] == ["allreduce", "adpsgd"]
    assert params["execution_mode"]["schema"]["enum"] == ["local", "kubernetes"]
    assert dag_info["rejected"] == {k: True for k in dag_info["rejected"]}
    assert dag_info["accepted"]["epochs"] == 3 and dag_info["accepted"]["models"] == ["tts"]
    # The defaults make a valid local plan in this repository.
    plan = make_plan(DEFAULTS, "speech_pipeline", "manual__x")
    assert plan.models == ("asr", "tts") and plan.make_corpus


# ---- plans and command lines (no Airflow needed) -------------------------------------------------


def kaldi_root(root: Path, splits=("train", "test")) -> Path:
    for split in splits:
        (root / split).mkdir(parents=True)
        (root / split / "wav.scp").write_text("u1 /x.wav\n")
    return root


def test_plan_fixes_run_scoped_paths_and_the_splits(tmp_path, monkeypatch):
    monkeypatch.setenv("SPEECHFLOW_WORK_ROOT", str(tmp_path / "work"))
    plan = make_plan(DEFAULTS, "speech_pipeline", "manual__2026-01-01T00:00:00+00:00")
    run_dir = Path(plan.run_dir)
    assert run_dir.parent == tmp_path / "work" and ":" not in run_dir.name and len(run_dir.name) < 40
    assert plan.data_root == f"{run_dir}/corpus" and plan.splits == (
        "train",
        "dev",
        "test",
        "test_noisy",
        "test_engine",
        "dev_engine",
        "train_aug",  # the demo's acoustic config trains on speed-perturbed copies
    )
    assert plan.augment["speed_factors"] == [0.9, 1.1]
    assert plan.workdirs == {"asr": f"{run_dir}/asr", "tts": f"{run_dir}/tts"}
    assert plan.configs["asr"] == str(ROOT / "configs" / "demo_asr.yaml")
    assert Plan.from_xcom(json.loads(json.dumps(plan.to_xcom()))) == plan
    # Run ids that differ only in characters a directory name cannot hold stay apart.
    assert slug("manual__a:b", 37) != slug("manual__a+b", 37)
    given = make_plan(
        {**DEFAULTS, "data_dir": str(kaldi_root(tmp_path / "data", ("train", "test", "dev")))},
        "speech_pipeline",
        "r",
    )
    assert not given.make_corpus and given.splits == ("train", "dev", "test", "train_aug")
    assert given.data_root == str(tmp_path / "data")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"num_workers": 4, "num_shards": 2}, "num_shards"),
        ({"models": []}, "models"),
        ({"models": ["asr", "wavenet"]}, "models"),
        ({"execution_mode": "cloud"}, "execution_mode"),
        ({"asr_config": "configs/missing.yaml"}, "asr_config"),
        ({"data_dir": "MISSING"}, "test"),
        ({"data_service_workers": -1}, "data_service_workers"),
        ({"train_overrides": ["learning_rate"]}, "train_overrides"),
        ({"train_overrides": ["optim.learning_rte=0.002"]}, "did you mean 'optim.learning_rate'"),
        ({"train_overrides": ["epochs=many"]}, "train_overrides: config key 'epochs': expected an integer"),
        ({"train_overrides": ["strategy.gosip=random-ring"]}, "unknown config key 'strategy.gosip'"),
        ({"strategy": "adpsgd", "train_overrides": ["strategy.gossip=ring"]}, "fixed-ring, random-ring"),
        ({"strategy": "adpsgd", "train_overrides": ["strategy.gosip=random-ring"]}, "did you mean 'strategy.gossip'"),
        ({"strategy": "sgd"}, "strategy: 'sgd' is neither 'allreduce' nor 'adpsgd'"),
        # The form's rules (workflow/form.py), which the trigger form checks too.
        ({"num_workers": 0}, "num_workers must be at least 1, got 0"),
        ({"demo_utterances": 5}, "demo_utterances must be at least 20"),
        ({"epochs": 0}, "epochs must be at least 1"),
        ({"max_steps": "ten"}, "max_steps: expected an integer, got 'ten'"),
        ({"experiment": ""}, "experiment must have at least 1 character"),
        ({"models": ["asr", "asr"]}, "models: each item at most once"),
        ({"num_worker": 2}, r"unknown param 'num_worker' \(did you mean 'num_workers'\?\)"),
        ({"gossip": "random-ring"}, "unknown param 'gossip'"),
        (
            {"word_lm": False, "train_overrides": ["asr.targets=phones"]},
            "word_lm is off, but asr.targets: phones: a phone model spells words only through its decoding graph",
        ),
    ],
)
def test_plan_rejects_params_that_do_not_fit(change, message, tmp_path):
    params = {**DEFAULTS, **change}
    if params["data_dir"] == "MISSING":
        params["data_dir"] = str(kaldi_root(tmp_path / "data", ("train",)))
    with pytest.raises(ValueError, match=message):
        make_plan(params, "speech_pipeline", "r")


def test_command_lines_of_the_stages(tmp_path):
    plan = make_plan(
        {**DEFAULTS, **TINY, "strategy": "adpsgd", "train_overrides": ["strategy.gossip=random-ring"], "epochs": 3},
        "speech_pipeline",
        "r",
    )
    args = commands.plan_train_args(plan, "asr", "parent123")
    assert args[:4] == ["--model", "asr", "--strategy", "adpsgd"]
    assert args[args.index("--set") + 1] == "strategy.gossip=random-ring"
    assert args[args.index("--config") + 1] == str(ROOT / "tests" / "configs" / "tiny_asr.yaml")
    assert args[args.index("--epochs") + 1] == "3" and args[args.index("--max-steps") + 1] == "4"
    assert args[args.index("--mlflow-parent-run-id") + 1] == "parent123" and "--experiment" in args
    cmd = commands.horovodrun_local(plan.python, plan.num_workers, commands.TRAIN, args)
    assert cmd[:6] == [
        str(Path(plan.python).with_name("horovodrun")),
        "-np",
        "2",
        "-H",
        "localhost:2",
        "--gloo",
    ]
    assert cmd[6:9] == [plan.python, "-m", "models.train"]
    allreduce = make_plan({**DEFAULTS, **TINY}, "speech_pipeline", "r")
    assert "--epochs" not in commands.plan_train_args(allreduce, "tts", "p")
    # A strategy's option is a training override, passed on as it is written in the form.
    delayed = make_plan(
        {**DEFAULTS, **TINY, "strategy": "adpsgd", "train_overrides": ["strategy.gossip=delay-by-one"]}, "d", "r"
    )
    assert delayed.train_overrides == ("strategy.gossip=delay-by-one",)
    shards = commands.shards_args(allreduce)
    assert shards.count("--split") == 6 and f"test_noisy={allreduce.data_root}/test_noisy" in shards
    assert (
        f"test_engine={allreduce.data_root}/test_engine" in shards
        and f"dev_engine={allreduce.data_root}/dev_engine" in shards
    )
    # The word LM: of the training transcripts (or the form's text), in the shards' alphabet; chosen and
    # attached for the trained acoustic model; none when the form turns it off or no model decodes with one.
    assert commands.lm_args(allreduce) == [
        *("--data", f"{allreduce.data_root}/train", "--vocabulary-from", allreduce.shards_dir),
        *("--out", f"{allreduce.run_dir}/lm"),
    ]
    assert commands.tune_lm_args(allreduce, "asr") == [
        *("--model", allreduce.workdirs["asr"], "--shards", allreduce.shards_dir, "--lm", allreduce.lm_dir),
        *("--attach", "--no-progress"),
    ]
    text = tmp_path / "domain.txt"
    text.write_text("turn the lights on\n")
    domain = make_plan({**DEFAULTS, **TINY, "lm_text": str(text)}, "speech_pipeline", "r")
    assert commands.lm_args(domain)[:2] == ["--text-file", str(text)]
    assert make_plan({**DEFAULTS, **TINY, "word_lm": False}, "speech_pipeline", "r").lm_dir == ""
    assert make_plan({**DEFAULTS, **TINY, "models": ["tts"]}, "speech_pipeline", "r").lm_dir == ""
    with pytest.raises(ValueError, match=r"lm_text: .*nowhere.txt does not exist"):
        make_plan({**DEFAULTS, **TINY, "lm_text": str(tmp_path / "nowhere.txt")}, "speech_pipeline", "r")
    assert shards[shards.index("--num-shards") + 1] == "2"
    tts_eval = commands.evaluate_args(allreduce, "tts", "p", with_asr=True)
    assert tts_eval[tts_eval.index("--asr-model") + 1] == allreduce.workdirs["asr"]
    assert "--asr-model" not in commands.evaluate_args(allreduce, "tts", "p", with_asr=False)
    assert commands.corpus_args(allreduce) == [
        *("--out", allreduce.data_root, "--num-utterances", "40", "--text", "open"),
        *("--engines", "espeak-ng", "flite", "festival"),
    ]
    # A training setting from the trigger form reaches every model's trainer as it is written there.
    tuned = make_plan({**DEFAULTS, **TINY, "train_overrides": ["optim.learning_rate=0.002"]}, "speech_pipeline", "r")
    tuned = Plan.from_xcom(json.loads(json.dumps(tuned.to_xcom())))  # as the tasks receive it
    for model in ("asr", "tts"):
        args = commands.plan_train_args(tuned, model, "p")
        assert args[args.index("--set") + 1] == "optim.learning_rate=0.002"
    assert "--set" not in commands.plan_train_args(allreduce, "asr", "p")
    # The shards hold the phonemes in the form's accent (the demo's synthesis model reads them), or none.
    shards = commands.shards_args(allreduce)
    assert shards[shards.index("--phonemes") + 1] == "en-us"
    assert "--phonemes" not in commands.shards_args(make_plan({**DEFAULTS, **TINY, "phonemes": ""}, "d", "r"))


def test_a_phone_model_gets_an_lm_text_a_lexicon_and_a_decoding_graph(tmp_path):
    phones = make_plan({**DEFAULTS, **TINY, "train_overrides": ["asr.targets=phones"]}, "speech_pipeline", "r")
    phones = Plan.from_xcom(json.loads(json.dumps(phones.to_xcom())))  # as the tasks receive it
    run = phones.run_dir
    assert (phones.lm_text_dir, phones.lexicon_dir, phones.lang_dir) == (f"{run}/lm_text", f"{run}/dict", f"{run}/lang")
    assert commands.graph_skip_reason(phones) == ""
    assert commands.lm_text_args(phones) == ["--data", phones.data_root, "--out", f"{run}/lm_text"]
    text = f"{run}/lm_text/lm_text.txt"
    # CMUdict's lexicon by default, stress folded; the shards hold each word's pronunciation in it.
    assert commands.lexicon_module(phones) == "pipeline.cmudict_lexicon"
    assert commands.lexicon_args(phones) == [
        *("--text", text, "--out", f"{run}/dict", "--set", "voice=en-us", "--set", "fold_stress=true"),
    ]
    shards = commands.shards_args(phones)
    assert shards[shards.index("--phones-from") + 1 :][:4] == [f"{run}/dict", "--phone-source", "lexicon", "--g2p"]
    assert shards[shards.index("--phonemes") + 1] == "en-us"
    # espeak-ng's lexicon: the phones of each sentence in context, from espeak-ng's phonemes.
    espeak = make_plan({**DEFAULTS, **TINY, "lexicon": "espeak", "train_overrides": ["asr.targets=phones"]}, "d", "r")
    assert commands.lexicon_module(espeak) == "pipeline.text_lexicon"
    assert commands.lexicon_args(espeak)[-3:] == ["--set", "fold_stress=true", "--no-progress"]
    shards = commands.shards_args(espeak)
    assert shards[shards.index("--phones-from") + 1 :][:3] == [espeak.lexicon_dir, "--phone-source", "espeak"]
    # The word LM of the LM text; the graph of the lexicon and the LM; the graph tuned and attached.
    # its words spelled by the lexicon: no alphabet of the shards' characters is checked
    assert commands.lm_args(phones) == ["--text-file", text, "--lexicon", f"{run}/dict", "--out", f"{run}/lm"]
    assert commands.graph_args(phones) == [
        *("--dict", f"{run}/dict", "--arpa", f"{run}/lm/lm.arpa", "--out", f"{run}/lang"),
    ]
    tune = commands.tune_lm_args(phones, "asr")
    assert tune[tune.index("--lm") + 1] == f"{run}/lang" and tune[-2:] == ["--attach", "--no-progress"]
    # The form's phonemes empty: the shards still have espeak-ng's, the lexicon's accent; another accent reaches both.
    from pipeline import phonemes

    assert commands.DEFAULT_VOICE == phonemes.DEFAULT_VOICE
    # The form offers the lexicons the commands can build, no more and no fewer
    assert set(form.LEXICONS) == set(commands.LEXICON_MODULES)
    quiet = make_plan({**DEFAULTS, **TINY, "phonemes": "", "train_overrides": ["asr.targets=phones"]}, "d", "r")
    assert commands.shards_args(quiet).count("--phonemes") == 1 and "voice=en-us" in commands.lexicon_args(quiet)
    british = make_plan({**DEFAULTS, **TINY, "phonemes": "en-gb", "train_overrides": ["asr.targets=phones"]}, "d", "r")
    assert "voice=en-gb" in commands.lexicon_args(british) and "en-gb" in commands.shards_args(british)
    # The form's text takes the open-text source's place in the LM text, which keeps the held-out sentences out.
    domain = tmp_path / "domain.txt"
    domain.write_text("turn the lights on\n")
    given = make_plan({**DEFAULTS, **TINY, "lm_text": str(domain), "train_overrides": ["asr.targets=phones"]}, "d", "r")
    assert commands.lm_text_args(given)[-2:] == ["--set", f"text_file={json.dumps(str(domain))}"]
    assert commands.lm_args(given)[:2] == ["--text-file", f"{given.run_dir}/lm_text/lm_text.txt"]


def test_a_character_model_runs_as_before_and_skips_the_graph_stages_saying_why(tmp_path):
    chars = make_plan({**DEFAULTS, **TINY}, "speech_pipeline", "r")
    assert (chars.lm_text_dir, chars.lexicon_dir, chars.lang_dir) == ("", "", "")
    assert commands.graph_skip_reason(chars) == (
        "no model trains on phones (asr.targets: chars): it decodes with the word LM alone, through no lexicon or graph"
    )
    assert "--phones-from" not in commands.shards_args(chars) and "--phone-source" not in commands.shards_args(chars)
    assert commands.lm_args(chars)[:2] == ["--data", f"{chars.data_root}/train"]
    tune = commands.tune_lm_args(chars, "asr")
    assert tune[tune.index("--lm") + 1] == f"{chars.run_dir}/lm"
    assert "--phonemes" not in commands.shards_args(make_plan({**DEFAULTS, **TINY, "phonemes": ""}, "d", "r"))
    off = make_plan({**DEFAULTS, **TINY, "word_lm": False}, "d", "r")
    assert off.lang_dir == "" and commands.graph_skip_reason(off).startswith("no word LM in this run")
    # The synthesis model alone: the acoustic model's config is not read, and no graph is built for it.
    alone = make_plan({**DEFAULTS, **TINY, "models": ["tts"], "train_overrides": ["asr.targets=phones"]}, "d", "r")
    assert alone.lang_dir == "" and alone.lm_dir == ""


def test_the_summary_shows_each_graph_stages_seconds_and_its_records_figures(tmp_path, monkeypatch):
    monkeypatch.setenv("SPEECHFLOW_WORK_ROOT", str(tmp_path))
    plan = make_plan({**DEFAULTS, **TINY, "train_overrides": ["asr.targets=phones"]}, "speech_pipeline", "r")
    records = {
        "lm_text/lm_text.json": {
            "text": {"sentences": 40, "words": 300, "vocabulary_size": 120, "sha256": "x"},
            "dropped": {"held_out_substring": 2},
            "coverage": {"test": {"words": 50, "oov_rate": 0.04, "trigrams": 30, "trigram_share": 0.5}},
        },
        "dict/text_lexicon.json": {
            "words": 120,
            "entries": 150,
            "phones": 40,
            "unspelled": 0,
            "text": "t",
            "espeak": "v",
        },
        "lm/lm.json": {
            "order": 3,
            "text": {"sentences": 40, "words": 300, "vocabulary_size": 120},
            "arpa": {"ngrams": {"1": 122}},
        },
        "lang/lang.json": {
            "num_outputs": 41,
            "words": 124,
            "g2p_filled": 0,
            "lm_words_unspelled": 0,
            "build_seconds": 1.5,
            "hlg": {"states": 900, "arcs": 4000, "bytes": 70000, "sha256": "y"},
        },
    }
    for path, record in records.items():
        (Path(plan.run_dir) / path).parent.mkdir(parents=True)
        (Path(plan.run_dir) / path).write_text(json.dumps(record))
    (Path(plan.run_dir) / "summary.json").write_text(json.dumps({"models": {}}))
    ran: list[list[str]] = []
    monkeypatch.setattr(runner, "run_command", lambda command: ran.append(command))
    done = [runner.run_recorded_stage(plan, {}, stage) for stage in ("lm_text", "lexicon", "lm", "graph")]
    assert [c[2] for c in ran] == ["pipeline.lm_text", "pipeline.cmudict_lexicon", "pipeline.lm", "pipeline.lang"]
    assert ran[3][3:] == commands.graph_args(plan)
    stages = runner.add_stages_to_summary(plan, [*done, None])  # None: a stage that was skipped
    assert all(stages[s]["seconds"] >= 0 for s in ("lm_text", "lexicon", "lm", "graph"))
    assert stages["lm_text"]["figures"] == {
        "sentences": 40,
        "words": 300,
        "vocabulary_size": 120,
        "dropped": {"held_out_substring": 2},
        "oov_rate": {"test": 0.04},
        "trigram_share": {"test": 0.5},
    }
    assert stages["lexicon"]["figures"] == {"words": 120, "entries": 150, "phones": 40, "unspelled": 0}
    assert stages["graph"]["figures"] == {
        "states": 900,
        "arcs": 4000,
        "bytes": 70000,
        "num_outputs": 41,
        "words": 124,
        "g2p_filled": 0,
        "lm_words_unspelled": 0,
        "build_seconds": 1.5,
    }
    assert stages["lm"]["figures"]["ngrams"] == {"1": 122} and stages["graph"]["dir"] == plan.lang_dir
    assert json.loads((Path(plan.run_dir) / "summary.json").read_text()) == {"models": {}, "stages": stages}


def test_the_augment_stage_runs_only_when_a_selected_models_config_asks_for_copies(tmp_path):
    plain = make_plan({**DEFAULTS, **TINY}, "speech_pipeline", "r")
    assert plain.augment == {} and "train_aug" not in plain.splits
    sets = ["asr.augment.copies.speed_factors=[0.9, 1.1]", "asr.augment.copies.noise_share=0.3"]
    asked = make_plan({**DEFAULTS, **TINY, "train_overrides": sets}, "speech_pipeline", "r")
    asked = Plan.from_xcom(json.loads(json.dumps(asked.to_xcom())))  # as the tasks receive it
    assert asked.splits[-1] == "train_aug" and asked.augment["speed_factors"] == [0.9, 1.1]
    args = commands.augment_args(asked)
    assert args[:4] == ["--data", f"{asked.data_root}/train", "--out", f"{asked.data_root}/train_aug"]
    assert "speed_factors=[0.9, 1.1]" in args and "noise_share=0.3" in args and "reverb_share=0.0" in args
    # What the stage is given is what the acoustic model's config asked for.
    from common import config as configlib
    from models.training.config import TrainConfig
    from pipeline.augment_config import CopiesConfig

    given = [args[i + 1] for i, a in enumerate(args) if a == "--set"]
    wanted = configlib.load(TrainConfig, assignments=sets).audio_copies
    assert configlib.load(CopiesConfig, assignments=given) == wanted
    shards = commands.shards_args(asked)
    assert f"train_aug={asked.data_root}/train_aug" in shards
    assert commands.features_args(asked, "train_aug")[:2] == ["--data-dir", f"{asked.data_root}/train_aug"]
    # The synthesis model alone: the acoustic model's section is not read, nothing to copy.
    assert make_plan({**DEFAULTS, **TINY, "models": ["tts"], "train_overrides": sets}, "d", "r").augment == {}
    # A read-only corpus: the copies go beside the features, where the feature stage reads them.
    data = kaldi_root(tmp_path / "data", ("train", "test"))
    beside = make_plan(
        {**DEFAULTS, "data_dir": str(data), "features_dir": str(tmp_path / "f"), "train_overrides": sets}, "d", "r"
    )
    assert beside.splits == ("train", "test", "train_aug")
    assert commands.augment_args(beside)[:4] == ["--data", f"{data}/train", "--out", f"{tmp_path / 'f'}/train_aug"]
    assert commands.features_args(beside, "train_aug")[:2] == ["--data-dir", f"{tmp_path / 'f'}/train_aug"]


def test_the_forms_engines_and_voices_reach_the_corpus_stage():
    chosen = {
        **DEFAULTS,
        **TINY,
        "demo_engines": ["espeak-ng"],
        "demo_train_voices": ["espeak-ng:en+m1", "espeak-ng:en-us+f2"],
    }
    plan = Plan.from_xcom(json.loads(json.dumps(make_plan(chosen, "speech_pipeline", "r").to_xcom())))
    assert plan.splits == ("train", "dev", "test", "test_noisy")  # no flite: the corpus makes no test_engine
    args = commands.corpus_args(plan)
    assert args[args.index("--engines") :] == [
        *("--engines", "espeak-ng", "--train-voices", "espeak-ng:en+m1", "espeak-ng:en-us+f2"),
    ]
    kal = make_plan({**DEFAULTS, "demo_test_engine_voices": ["flite:kal"]}, "speech_pipeline", "r")
    assert "test_engine" in kal.splits and commands.corpus_args(kal)[-2:] == ["--test-engine-voices", "flite:kal"]
    assert commands.corpus_args(plan)[4:6] == ["--text", "open"]
    grammar = make_plan({**DEFAULTS, "demo_text": "grammar"}, "speech_pipeline", "r")
    assert commands.corpus_args(grammar)[4:6] == ["--text", "grammar"]
    for change, message in (
        ({"demo_text": "poetry"}, "demo_text: 'poetry' is neither"),
        ({"demo_engines": ["mbrola"]}, "demo_engines: 'mbrola' is none of 'espeak-ng', 'flite', 'festival'"),
        ({"demo_engines": []}, "demo_engines: choose at least 1"),
        ({"demo_test_voices": ["en+m3"]}, r"demo_test_voices: 'en\+m3' does not match \^\(espeak-ng\|"),
        (
            {"demo_test_voices": ["flite:en+m3"]},
            r"demo_test_voices: voice 'flite:en\+m3': 'en\+m3' is not a flite voice",
        ),
    ):
        with pytest.raises(ValueError, match=message):
            make_plan({**DEFAULTS, **change}, "speech_pipeline", "r")


def test_command_lines_of_the_data_service():
    off = make_plan({**DEFAULTS, **TINY}, "speech_pipeline", "r")
    on = make_plan({**DEFAULTS, **TINY, "data_service_workers": 2}, "speech_pipeline", "r")
    gossip = make_plan({**DEFAULTS, **TINY, "data_service_workers": 2, "strategy": "adpsgd"}, "speech_pipeline", "r")
    # The service feeds the acoustic model; the synthesis model only the shared batches of adpsgd.
    assert [commands.uses_data_service(p, m) for p in (off, on, gossip) for m in ("asr", "tts")] == [
        False,
        False,
        True,
        False,
        True,
        True,
    ]
    args = commands.plan_train_args(on, "asr", "p", data_service="grpc://127.0.0.1:5050")
    assert args[args.index("--data-service") + 1] == "grpc://127.0.0.1:5050"
    assert "--data-service" not in commands.plan_train_args(on, "asr", "p")
    assert commands.dispatcher_args(5050) == ["dispatcher", "--port", "5050"]
    assert commands.dispatcher_args(5050, "/data/j")[-2:] == ["--work-dir", "/data/j"]
    assert commands.worker_args("d:5050", 5051, "10.0.0.7:5051") == [
        "worker",
        "--dispatcher",
        "d:5050",
        "--port",
        "5051",
        "--address",
        "10.0.0.7:5051",
    ]


# ---- running a command with its output in the log -------------------------------------------------


def test_run_command_streams_lines_thins_progress_bars_and_reports_failures():
    lines: list[str] = []
    script = (
        "import sys, time\n"
        "for i in range(5): sys.stderr.write(f'\\rbar {i}'); sys.stderr.flush()\n"
        "print('\\nhello'); print('world', flush=True)\n"
    )
    local.run_command([sys.executable, "-c", script], emit=lines.append, progress_every_s=3600)
    assert lines[0].startswith("$ ") and lines[1:] == ["bar 0", "bar 4", "hello", "world"]
    with pytest.raises(local.StageError, match=r"exited with 3(.|\n)*last words"):
        local.run_command([sys.executable, "-c", "print('last words'); raise SystemExit(3)"], emit=lines.append)


def test_run_command_ends_the_whole_process_group_when_interrupted(tmp_path):
    pid_file = tmp_path / "pid"
    script = (
        f"import os, subprocess, sys, time\n"
        f"child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        f"open({str(pid_file)!r}, 'w').write(str(child.pid))\n"
        f"print('started', flush=True)\n"
        f"time.sleep(60)\n"
    )

    def interrupt(line: str) -> None:
        if line == "started":
            raise KeyboardInterrupt  # what a task timeout or a kill from the UI does to the task

    with pytest.raises(KeyboardInterrupt):
        local.run_command([sys.executable, "-c", script], emit=interrupt)
    grandchild = int(pid_file.read_text())
    deadline = time.monotonic() + 30  # SIGTERM, then SIGKILL after the grace period (workflow/local.py)
    while alive(grandchild):
        if time.monotonic() > deadline:
            pytest.fail(f"process {grandchild} survived the task")
        time.sleep(0.1)


# ---- local mode: a tf.data service for the duration of the training ------------------------------


FAKE_SERVER = """
import json, os, socket, sys, time
args = sys.argv[1:]
assert args[:2] == ["-m", "pipeline.data_service"], args
with open(os.environ["FAKE_RECORD"], "a") as f:
    f.write(json.dumps({"pid": os.getpid(), "args": args[2:]}) + "\\n")
if args[2] == os.environ.get("FAKE_CRASH"):
    print("cannot start: the port is taken", flush=True)
    sys.exit(3)
server = socket.socket()
server.bind(("127.0.0.1", int(args[args.index("--port") + 1])))
server.listen()
port_file = args[args.index("--port-file") + 1]
with open(port_file + ".tmp", "w") as f:
    f.write(str(server.getsockname()[1]))
os.replace(port_file + ".tmp", port_file)
while True:
    time.sleep(1)
"""
# horovodrun: checks that the dispatcher it is given answers, records its command, exits as told.
FAKE_HOROVODRUN = """
import json, os, socket, sys
args = sys.argv[1:]
answered = None
if "--data-service" in args:
    host, port = args[args.index("--data-service") + 1].removeprefix("grpc://").split(":")
    socket.create_connection((host, int(port)), timeout=5).close()
    answered = True
json.dump({"args": args, "answered": answered}, open(os.environ["FAKE_TRAIN"], "w"))
os.makedirs(args[args.index("--workdir") + 1], exist_ok=True)  # as the trainer makes it
sys.exit(int(os.environ.get("FAKE_EXIT", "0")))
"""


@pytest.fixture
def fake_training_env(tmp_path, monkeypatch):
    """A training environment whose python runs fake tf.data servers and whose horovodrun records."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, body in (("python", FAKE_SERVER), ("horovodrun", FAKE_HOROVODRUN)):
        (bin_dir / name).write_text(f"#!{sys.executable}\n{body}")
        (bin_dir / name).chmod(0o755)
    monkeypatch.setenv("SPEECHFLOW_PYTHON", str(bin_dir / "python"))
    monkeypatch.setenv("SPEECHFLOW_WORK_ROOT", str(tmp_path / "work"))
    monkeypatch.setenv("FAKE_RECORD", str(tmp_path / "servers.jsonl"))
    monkeypatch.setenv("FAKE_TRAIN", str(tmp_path / "train.json"))
    return tmp_path


def servers_started(tmp_path: Path) -> list[dict]:
    path = tmp_path / "servers.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def alive(pid: int) -> bool:
    try:
        return "Z" not in Path(f"/proc/{pid}/stat").read_text().split()[2]
    except FileNotFoundError:  # it has ended and been reaped
        return False


def test_local_training_reads_from_a_data_service_that_lives_as_long_as_it(fake_training_env):
    from workflow import runner

    plan = make_plan({**DEFAULTS, **TINY, "data_service_workers": 2}, "speech_pipeline", "r")
    runner.run_training(plan, {}, "asr", "parent")
    servers = sorted(servers_started(fake_training_env), key=lambda s: s["args"][0])  # they start at once
    assert [s["args"][0] for s in servers] == ["dispatcher", "worker", "worker"]
    # Each server picks its own port (--port 0) and writes it to its port file.
    assert all(s["args"][s["args"].index("--port") + 1] == "0" for s in servers)
    dispatcher_port = int((Path(runner.data_service_dir(plan, "asr")) / "dispatcher.port").read_text())
    for worker in servers[1:]:
        args = worker["args"]
        assert args[args.index("--dispatcher") + 1] == f"127.0.0.1:{dispatcher_port}"
        assert args[args.index("--address") + 1] == "127.0.0.1:%port%"
    train = json.loads((fake_training_env / "train.json").read_text())
    assert train["args"][train["args"].index("--data-service") + 1] == f"grpc://127.0.0.1:{dispatcher_port}"
    assert train["answered"] and train["args"][:2] == ["-np", "2"]  # the service answered during training
    assert not any(alive(s["pid"]) for s in servers)  # and is gone after it
    assert (Path(runner.data_service_dir(plan, "asr")) / "worker-1.log").exists()

    # A finished training is not repeated, and starts no service; the synthesis model (allreduce) has none.
    runner.run_training(plan, {}, "asr", "parent")
    runner.run_training(plan, {}, "tts", "parent")
    assert len(servers_started(fake_training_env)) == 3
    assert "--data-service" not in json.loads((fake_training_env / "train.json").read_text())["args"]


def test_local_data_service_is_stopped_when_training_fails(fake_training_env, monkeypatch):
    from workflow import runner

    monkeypatch.setenv("FAKE_EXIT", "1")
    plan = make_plan({**DEFAULTS, **TINY, "data_service_workers": 1}, "speech_pipeline", "r")
    with pytest.raises(local.StageError, match="exited with 1"):
        runner.run_training(plan, {}, "asr", "parent")
    servers = servers_started(fake_training_env)
    assert len(servers) == 2 and not any(alive(s["pid"]) for s in servers)


def test_local_data_service_that_does_not_start_fails_the_task_with_its_log(fake_training_env, monkeypatch):
    from workflow import runner

    monkeypatch.setenv("FAKE_CRASH", "worker")
    plan = make_plan({**DEFAULTS, **TINY, "data_service_workers": 2}, "speech_pipeline", "r")
    with pytest.raises(local.StageError, match=r"worker-\d exited with 3(.|\n)*the port is taken"):
        runner.run_training(plan, {}, "asr", "parent")
    assert not (fake_training_env / "train.json").exists()  # training never started
    assert not any(alive(s["pid"]) for s in servers_started(fake_training_env))


# ---- the MPIJob life cycle against a fake cluster ------------------------------------------------


class NotFound(Exception):
    status = 404


class FakeCluster:
    """The two Kubernetes APIs the MPIJob follower uses, with a scripted sequence of job conditions."""

    def __init__(self, phases: list[str], existing: bool = False, log: bytes = b"step 1\nstep 2\n"):
        self.phases, self.jobs, self.calls, self.log = list(phases), {}, [], log
        if existing:
            self.jobs["job"] = {"status": {}}

    # CustomObjectsApi
    def create_namespaced_custom_object(self, group, version, namespace, plural, body):
        self.calls.append(("create", body["metadata"]["name"]))
        self.jobs[body["metadata"]["name"]] = body

    def get_namespaced_custom_object(self, group, version, namespace, plural, name):
        if name not in self.jobs:
            raise NotFound(name)
        phase = self.phases.pop(0) if len(self.phases) > 1 else self.phases[0]
        conditions = {
            "Pending": [],
            "Running": [{"type": "Running", "status": "True"}],
            "Succeeded": [{"type": "Succeeded", "status": "True"}],
            "Failed": [{"type": "Failed", "status": "True", "reason": "MPIJobFailed", "message": "rank 1 died"}],
        }
        self.current = phase
        return {"status": {"conditions": conditions[phase]}}

    def delete_namespaced_custom_object(self, group, version, namespace, plural, name, **kwargs):
        self.calls.append(("delete", name))
        if self.jobs.pop(name, None) is None:
            raise NotFound(name)

    # CoreV1Api
    def list_namespaced_pod(self, namespace, label_selector):
        from types import SimpleNamespace as NS

        phase = {"Pending": "Pending", "Running": "Running"}.get(getattr(self, "current", "Pending"), "Succeeded")
        return NS(items=[NS(metadata=NS(name="job-launcher"), status=NS(phase=phase))])

    def read_namespaced_pod_log(self, name, namespace, follow, _preload_content):
        from types import SimpleNamespace as NS

        self.calls.append(("log", name))
        return NS(stream=lambda: iter([self.log]))


def job_manifest():
    from workflow import training_job

    return training_job.render_mpijob("job", ["--model", "asr"], 2, 1)


def test_mpijob_is_followed_with_the_launcher_log_until_it_succeeds():
    cluster, lines = FakeCluster(["Pending", "Running", "Running", "Succeeded"]), []
    status = mpijob.run_mpijob(job_manifest(), cluster, cluster, emit=lines.append, sleep=lambda s: None)
    assert status["conditions"][0]["type"] == "Succeeded"
    assert cluster.calls == [("delete", "job"), ("create", "job"), ("log", "job-launcher")]
    assert "step 2" in lines and "job" in cluster.jobs  # a finished job stays (its TTL removes it)


def test_a_broken_log_stream_does_not_fail_a_running_job():
    cluster, lines = FakeCluster(["Running", "Running", "Succeeded"]), []

    def broken(*args, **kwargs):
        raise ConnectionResetError("connection reset by peer")

    cluster.read_namespaced_pod_log = broken
    mpijob.run_mpijob(job_manifest(), cluster, cluster, emit=lines.append, sleep=lambda s: None)
    assert any("broke off" in line for line in lines) and "job" in cluster.jobs


def test_failed_mpijob_is_deleted_and_its_reason_raised():
    cluster, lines = FakeCluster(["Running", "Failed"], existing=True), []
    with pytest.raises(local.StageError, match="MPIJobFailed: rank 1 died"):
        mpijob.run_mpijob(job_manifest(), cluster, cluster, emit=lines.append, sleep=lambda s: None)
    # The earlier attempt's job went first (a retry), and the failed one after.
    assert cluster.calls[0] == ("delete", "job") and cluster.calls[-1] == ("delete", "job")
    assert "job" not in cluster.jobs and any("earlier attempt" in line for line in lines)


# ---- cluster mode: every task, with pods and MPIJobs, against a fake cluster ----------------------


CLUSTER_PARAMS = {
    **DEFAULTS,
    "execution_mode": "kubernetes",
    "num_workers": 3,
    "gpus_per_worker": 2,
    "max_steps": 500,
    "experiment": "prod",
    "data_service_workers": 2,
    # The acoustic model trains on speed-perturbed copies: the augment stage is a pod of its own too; and
    # on phones: the LM text, the lexicon and the decoding graph are pods too.
    "train_overrides": ["asr.augment.copies.speed_factors=[0.9, 1.1]", "asr.targets=phones"],
}


@needs_airflow
@pytest.mark.airflow
def test_cluster_mode_runs_each_stage_as_a_pod_and_training_as_an_mpijob(tmp_path):
    """The DAG with execution_mode=kubernetes, end to end under dag.test(); the pod operator and the
    Kubernetes APIs are replaced by recorders, so what it would submit is checked, not run. The
    acoustic model trains through a tf.data service of 2 workers, created before its MPIJob and
    deleted after it."""
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": "none",
                "clusters": [{"name": "none", "cluster": {"server": "https://127.0.0.1:1"}}],
                "users": [{"name": "none", "user": {"token": "none"}}],
                "contexts": [{"name": "none", "context": {"cluster": "none", "user": "none"}}],
            }
        )
    )
    env = airflow_env(
        tmp_path / "home",
        KUBECONFIG=str(kubeconfig),
        SPEECHFLOW_CLUSTER_SETTINGS=str(ROOT / "k8s" / "overlays" / "gpu" / "cluster.yaml"),
    )
    airflow(env, "db", "migrate")
    script = f"""
        import json, sys
        import workflow.mpijob
        import workflow.runner
        from airflow.dag_processing.dagbag import BundleDagBag
        from airflow.providers.cncf.kubernetes.operators.pod import KubernetesPodOperator
        from kubernetes.client import ApiClient

        pods, jobs, objects, events = [], [], [], []
        NotFound = type("NotFound", (Exception,), {{"status": 404}})

        def fake_execute(self, context):
            pod = ApiClient().sanitize_for_serialization(self.build_pod_request_obj(context))
            c = pod["spec"]["containers"][0]
            pods.append({{"task": context["ti"].task_id, "command": c["command"], "args": c["args"],
                          "image": c["image"], "limits": c["resources"].get("limits", {{}}),
                          "mounts": [m["mountPath"] for m in c["volumeMounts"]], "xcom": self.do_xcom_push}})
            if not self.do_xcom_push:
                return None
            sub = next(a for a in c["args"] if a in ("start-parent", "record-stages", "register", "finish"))
            records = [json.loads(v) for k, v in zip(c["args"], c["args"][1:]) if k == "--record"]
            return {{"start-parent": {{"parent_run_id": "p" * 32}},
                    "record-stages": {{"records": [{{"name": r["name"], "run_id": "c", "metrics": {{}}}}
                                                    for r in records]}},
                    "register": {{"name": "n", "version": 1, "promoted": True, "champion_version": 1,
                                  "metric": "test_cer", "value": 0.1}},
                    "finish": {{"models": {{}}}}}}[sub]

        class Cluster:
            def delete_namespaced_custom_object(self, *a, **k):
                raise NotFound()
            def create_namespaced_custom_object(self, group, version, namespace, plural, body):
                jobs.append(body)
                events.append(("create", "MPIJob", body["metadata"]["name"]))
            def create_namespaced_service(self, namespace, body):
                objects.append(body)
                events.append(("create", "Service", body["metadata"]["name"]))
            def delete_namespaced_service(self, name, namespace):
                events.append(("delete", "Service", name))
                if not any(o["metadata"]["name"] == name and o["kind"] == "Service" for o in objects):
                    raise NotFound()
            def get_namespaced_custom_object(self, *a):
                return {{"status": {{"conditions": [{{"type": "Succeeded", "status": "True"}}]}}}}
            def list_namespaced_pod(self, namespace, label_selector):
                return type("L", (), {{"items": []}})()

        class Apps:
            def create_namespaced_deployment(self, namespace, body):
                objects.append(body)
                events.append(("create", "Deployment", body["metadata"]["name"]))
            def delete_namespaced_deployment(self, name, namespace, propagation_policy):
                events.append(("delete", "Deployment", name))
                if not any(o["metadata"]["name"] == name and o["kind"] == "Deployment" for o in objects):
                    raise NotFound()

        KubernetesPodOperator.execute = fake_execute
        workflow.mpijob.kubernetes_apis = lambda: (Cluster(), Cluster())
        workflow.runner.kubernetes_apps_api = lambda: Apps()
        bag = BundleDagBag(dag_folder={str(DAGS)!r}, bundle_path={str(DAGS)!r}, bundle_name="dags-folder")
        dag = bag.dags["speech_pipeline"]
        for task in dag.tasks:
            task.retries = 0  # a failure shows at once instead of after the retry delays
        run = dag.test(run_conf={CLUSTER_PARAMS!r})
        states = {{ti.task_id: str(ti.state) for ti in run.get_task_instances()}}
        print("RESULT " + json.dumps({{"state": str(run.state), "states": states, "pods": pods, "jobs": jobs,
                                       "objects": objects, "events": events}}))
    """
    result = airflow_python(script, env, timeout=600)
    assert result["state"] == "success", result["states"]
    assert set(result["states"].values()) == {"success"}, result["states"]
    settings = yaml.safe_load((ROOT / "k8s" / "overlays" / "gpu" / "cluster.yaml").read_text())
    image = settings.get("image", "speechflow/train:0.1.0")

    stages = [p for p in result["pods"] if p["command"][-1] != "models.registry"]
    assert {p["task"]: p["command"][-1] for p in stages} == {
        "prepare_corpus": "pipeline.corpus",
        "features_train": "pipeline.features",
        "features_dev": "pipeline.features",
        "features_test": "pipeline.features",
        "features_test_noisy": "pipeline.features",
        "features_test_engine": "pipeline.features",
        "features_dev_engine": "pipeline.features",
        "augment_train": "pipeline.augment",
        "features_train_aug": "pipeline.features",
        "lm_text": "pipeline.lm_text",
        "lexicon": "pipeline.cmudict_lexicon",
        "make_shards": "pipeline.shards",
        "build_lm": "pipeline.lm",
        "build_graph": "pipeline.lang",
        "tune_lm_asr": "models.tune_lm",
        "evaluate_asr": "models.evaluate",
        "evaluate_tts": "models.evaluate",
    }
    for pod in result["pods"]:
        assert pod["image"] == image and pod["command"][:2] == ["python", "-m"] and "/data" in pod["mounts"]
    run_dir = next(p["args"][1] for p in stages if p["task"] == "prepare_corpus").rsplit("/corpus", 1)[0]
    assert run_dir.startswith("/data/runs/manual__")
    evaluation = {p["task"]: p for p in stages if p["command"][-1] == "models.evaluate"}
    assert str(evaluation["evaluate_tts"]["limits"].get("nvidia.com/gpu")) == "1"
    assert (
        evaluation["evaluate_tts"]["args"][evaluation["evaluate_tts"]["args"].index("--asr-model") + 1]
        == f"{run_dir}/asr"
    )
    registry = [p for p in result["pods"] if p["command"][-1] == "models.registry"]
    assert all(p["xcom"] and p["args"][:2] == ["--json-file", "/airflow/xcom/return.json"] for p in registry)
    assert sorted(p["task"] for p in registry if "register" in p["args"]) == ["register_asr", "register_tts"]
    # The data stages are recorded in one pod, where the shards are made.
    (recording,) = [p for p in registry if "record-stages" in p["args"]]
    recorded = [json.loads(v) for k, v in zip(recording["args"], recording["args"][1:]) if k == "--record"]
    assert recording["task"] == "make_shards" and [r["name"] for r in recorded] == [
        "corpus",
        "augment",
        *(f"features-{s}" for s in ("train", "dev", "test", "test_noisy", "test_engine", "dev_engine", "train_aug")),
        "shards",
    ]
    augmenting = next(p for p in stages if p["task"] == "augment_train")["args"]
    assert augmenting[:4] == ["--data", f"{run_dir}/corpus/train", "--out", f"{run_dir}/corpus/train_aug"]
    assert recorded[2]["params"] == {"split": "train"} and recorded[-1]["path"] == f"{run_dir}/shards"
    # A phone model: the LM text of the corpus, its lexicon before the shards (which store its phones), the LM
    # of that text, then the graph of both, which tune_lm attaches.
    args = {p["task"]: p["args"] for p in stages}
    order = [p["task"] for p in stages]
    assert args["lm_text"] == ["--data", f"{run_dir}/corpus", "--out", f"{run_dir}/lm_text"]
    assert args["lexicon"][:4] == ["--text", f"{run_dir}/lm_text/lm_text.txt", "--out", f"{run_dir}/dict"]
    assert order.index("lexicon") < order.index("make_shards")
    shard_args = args["make_shards"]
    assert shard_args[shard_args.index("--phones-from") + 1] == f"{run_dir}/dict"
    assert args["build_lm"][:2] == ["--text-file", f"{run_dir}/lm_text/lm_text.txt"]
    assert args["build_graph"] == [
        *("--dict", f"{run_dir}/dict", "--arpa", f"{run_dir}/lm/lm.arpa", "--out", f"{run_dir}/lang"),
    ]
    assert order.index("build_graph") < order.index("tune_lm_asr")
    assert args["tune_lm_asr"][args["tune_lm_asr"].index("--lm") + 1] == f"{run_dir}/lang"

    jobs = {j["metadata"]["name"].split("-")[1]: j for j in result["jobs"]}
    assert sorted(jobs) == ["asr", "tts"] and len(result["jobs"]) == 2
    for model, job in jobs.items():
        spec = job["spec"]
        assert spec["mpiReplicaSpecs"]["Worker"]["replicas"] == 3 and spec["slotsPerWorker"] == 2
        worker = spec["mpiReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]
        assert worker["resources"]["limits"]["nvidia.com/gpu"] == 2 and worker["image"] == image
        command = spec["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]["command"]
        assert command[:3] == ["horovodrun", "-np", "6"]
        train = command[command.index("models.train") + 1 :]
        assert train[:4] == ["--model", model, "--strategy", "allreduce"]
        assert train[train.index("--config") + 1] == f"/opt/speechflow/configs/demo_{model}.yaml"
        assert train[train.index("--workdir") + 1] == f"{run_dir}/{model}"
        assert train[train.index("--max-steps") + 1] == "500"
        assert train[train.index("--mlflow-parent-run-id") + 1] == "p" * 32
    # The acoustic model's tf.data service: created before its MPIJob, deleted after it, and named
    # in its training arguments; the synthesis model (allreduce) reads its own input.
    service, dispatcher, workers = result["objects"]
    assert [o["kind"] for o in result["objects"]] == ["Service", "Deployment", "Deployment"]
    address = f"grpc://{service['metadata']['name']}:5050"
    for model, job in jobs.items():
        command = job["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]["command"]
        served = command[command.index("--data-service") + 1] if "--data-service" in command else None
        assert served == (address if model == "asr" else None), model
    assert workers["spec"]["replicas"] == 2 and workers["spec"]["template"]["spec"]["containers"][0]["image"] == image
    journal = dispatcher["spec"]["template"]["spec"]["containers"][0]["args"]
    assert journal[journal.index("--work-dir") + 1] == f"{run_dir}/data-service/asr/try-1"
    events = [tuple(e) for e in result["events"]]
    submitted = events.index(("create", "MPIJob", jobs["asr"]["metadata"]["name"]))
    for obj in result["objects"]:
        name = (obj["kind"], obj["metadata"]["name"])
        assert events.index(("create", *name)) < submitted < len(events) - events[::-1].index(("delete", *name)) - 1
    assert not any(e[1] != "MPIJob" and "tts" in e[2] for e in events)
    # What the DAG would submit meets the MPIJob CRD's schema and the operator's own rules.
    from tests.test_k8s import crd_schema, validate_mpijob

    for job in jobs.values():
        assert validate_mpijob.validate_mpijob(job, crd_schema()) == [], job["metadata"]["name"]


# ---- the whole DAG on a tiny corpus ---------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.airflow
def test_a_typo_in_the_forms_overrides_fails_plan_before_any_other_task(tmp_path):
    """`optim.learning_rte=0.002` in the form: the run fails at `plan`, naming the key and the nearest
    valid one, and no other task runs (no corpus, no features, no MLflow run)."""
    if not (AIRFLOW_BIN / "airflow").exists():
        pytest.skip(".venv-airflow is missing (make setup builds it)")
    work = tmp_path / "work"
    env = airflow_env(
        tmp_path / "home", MLFLOW_TRACKING_URI=f"sqlite:///{tmp_path / 'mlflow.db'}", SPEECHFLOW_WORK_ROOT=str(work)
    )
    airflow(env, "db", "migrate")
    conf = {**TINY, "train_overrides": ["optim.learning_rte=0.002"]}
    proc = dags_test(env, conf, timeout=600)
    said = proc.stdout + proc.stderr
    assert "unknown config key 'optim.learning_rte' (did you mean 'optim.learning_rate'?)" in said, said[-5000:]
    (run,) = last_json(airflow(env, "dags", "list-runs", "speech_pipeline", "-o", "json").stdout)
    states = last_json(
        airflow(env, "tasks", "states-for-dag-run", "speech_pipeline", run["run_id"], "-o", "json").stdout
    )
    states = {s["task_id"]: s["state"] for s in states}
    assert run["state"] == "failed" and states.pop("plan") == "failed"
    assert not [task for task, state in states.items() if state in ("success", "failed", "running")], states
    assert not work.exists() or not any(work.iterdir()), "a stage wrote to the work root"
    assert not (tmp_path / "mlflow.db").exists(), "an MLflow run was started"


@pytest.fixture(scope="module")
def dag_run(tmp_path_factory):
    """One `airflow dags test` of the whole DAG on a tiny corpus (both models, two Horovod ranks each),
    tracked as the cluster tracks it: an `mlflow server` on PostgreSQL with proxied artifacts, which
    every task talks HTTP to (on SQLite where PostgreSQL is not installed: the test then skips its
    PostgreSQL checks and says so). One run for the module: the DAG's checks, then the benchmarks that read it."""
    if not (AIRFLOW_BIN / "airflow").exists():
        pytest.skip(".venv-airflow is missing (make setup builds it)")
    from tests.mlflow_server import MlflowServer
    from tests.postgres import Postgres, postgres_bin

    tmp = tmp_path_factory.mktemp("dag-run")
    bindir = postgres_bin()
    postgres = Postgres(bindir) if bindir else None
    # A short work root: the trainer logs the Kaldi directories' paths in an MLflow field of 500 characters.
    work = Path(tempfile.mkdtemp(prefix="sf-"))
    try:
        store = postgres.start() if postgres else f"sqlite:///{tmp / 'mlflow.db'}"
        with MlflowServer(store, tmp / "artifacts", tmp / "mlflow-server.log") as server:
            env = airflow_env(tmp / "home", MLFLOW_TRACKING_URI=server.uri, SPEECHFLOW_WORK_ROOT=str(work))
            airflow(env, "db", "migrate")
            proc = dags_test(env, TINY, timeout=900)
            assert proc.returncode == 0, f"{proc.stdout[-8000:]}\n{proc.stderr[-8000:]}"
            (summary_file,) = work.glob("*/summary.json")
            (run,) = last_json(airflow(env, "dags", "list-runs", "speech_pipeline", "-o", "json").stdout)
            states = last_json(
                airflow(env, "tasks", "states-for-dag-run", "speech_pipeline", run["run_id"], "-o", "json").stdout
            )
            yield SimpleNamespace(
                uri=server.uri,
                run=run,
                states={s["task_id"]: s["state"] for s in states},
                summary=json.loads(summary_file.read_text()),
                trained={
                    m: json.loads(next(work.glob(f"*/{m}/train_summary.json")).read_text()) for m in ("asr", "tts")
                },
                postgres=postgres,
                artifacts=tmp / "artifacts",
                env=env,
                run_dir=summary_file.parent,
            )
    finally:
        shutil.rmtree(work, ignore_errors=True)
        if postgres:
            postgres.stop()


@pytest.mark.slow
@pytest.mark.airflow
def test_dag_runs_end_to_end_on_a_tiny_corpus_tracked_on_postgresql(dag_run):
    import mlflow

    from models import registry
    from models.tracking import runs as tracking

    run, summary = dag_run.run, dag_run.summary
    assert run["state"] == "success"
    # No model's config asks for copies of the training audio here: no augmented split; the acoustic model
    # trains on characters: no LM text, lexicon or decoding graph.
    skipped = ("augment_train", "features_train_aug", "lm_text", "lexicon", "build_graph")
    assert dag_run.states == {t: "skipped" if t in skipped else "success" for t in EDGES}

    assert summary["status"] == "FINISHED" and summary["dag_run_id"] == run["run_id"]
    assert (
        summary["models"]["asr"]["metrics"]["test_cer"] >= 0
        and "test_fbank_cepstral_distance_db" in summary["models"]["tts"]["metrics"]
    )
    # The champions are chosen on dev; test is reported (intelligibility by the new acoustic model).
    assert summary["models"]["asr"]["primary_metric"] == "dev_cer"
    assert summary["models"]["tts"]["primary_metric"] == "dev_mel_l1"
    tts_metrics = summary["models"]["tts"]["metrics"]
    assert "test_intelligibility_cer" in tts_metrics
    # the listener also hears the teacher-forced frames and the recordings (where what it misses is lost)
    assert {"test_intelligibility_cer_teacher_forced", "test_intelligibility_cer_recordings"} <= set(tts_metrics)
    # The acoustic model is evaluated with the word LM built beside its training (the training transcripts),
    # its weights chosen on dev_engine, and greedy, beam and LM figures sit side by side.
    asr_metrics = summary["models"]["asr"]["metrics"]
    for split in ("dev", "test", "test_engine"):
        assert {f"{split}_cer", f"{split}_cer_beam", f"{split}_cer_lm", f"{split}_lm_oov_rate"} <= set(asr_metrics)
    decoding = json.loads((dag_run.run_dir / "asr" / "model" / "lm" / "decoding.json").read_text())
    assert decoding["chosen_on"]["split"] == "dev_engine" and len(decoding["chosen_on"]["grid"]) == 20
    assert json.loads((dag_run.run_dir / "lm" / "lm.json").read_text())["text"]["sentences"] == 32  # the 40's train
    # The summary gives the LM stage's seconds and its record's figures; the graph's stages did not run.
    assert list(summary["stages"]) == ["lm"] and summary["stages"]["lm"]["figures"]["sentences"] == 32
    # A retried tune_lm_asr finds its choice made for the same weights, LM and grid: it only attaches again.
    run_dir = dag_run.run_dir
    tune = ["--model", str(run_dir / "asr"), "--shards", str(run_dir / "shards"), "--lm", str(run_dir / "lm")]
    retried = subprocess.run(
        [PYTHON, "-m", "models.tune_lm", *tune, "--attach", "--no-progress"],
        cwd=ROOT,
        env=quiet_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert retried.returncode == 0 and retried.stdout.startswith("up to date"), (
        retried.stdout[-2000:] + retried.stderr[-3000:]
    )

    # What benchmarks/demo.py reports of a run: every task's minutes from Airflow, both models' figures.
    from benchmarks import demo

    minutes = demo.task_minutes(dag_run.env, run["run_id"])
    assert set(minutes) == set(EDGES) and all(m >= 0 for m in minutes.values())
    collected = demo.collect(dag_run.run_dir)
    assert collected["asr"]["test_cer"] == summary["models"]["asr"]["metrics"]["test_cer"]
    assert collected["tts_training"]["steps"] == dag_run.trained["tts"]["steps"]

    # Each training is two ranks that agree, logged to the server.
    client = mlflow.MlflowClient(dag_run.uri)
    for model, trained in dag_run.trained.items():
        assert trained["world_size"] == 2 and trained["ranks_agree"], model
        training = client.get_run(trained["run_id"])
        assert training.data.params["world_size"] == "2" and client.get_metric_history(training.info.run_id, "loss")

    experiment = client.get_experiment_by_name("ci")
    (parent,) = client.search_runs(
        [experiment.experiment_id],
        f"tags.`{registry.DAG_RUN_TAG}` = '{run['run_id']}' and tags.`{registry.STAGE_TAG}` = 'pipeline'",
    )
    assert parent.info.status == "FINISHED" and parent.data.tags[registry.DAG_ID_TAG] == "speech_pipeline"
    kids = client.search_runs([experiment.experiment_id], f"tags.`mlflow.parentRunId` = '{parent.info.run_id}'")
    names = {r.info.run_name for r in kids}
    assert {
        "corpus",
        "features-train",
        "features-dev",
        "features-test",
        "features-test_noisy",
        "features-test_engine",
        "shards",
        "train-asr",
        "train-tts",
        "evaluate-asr",
        "evaluate-tts",
        "register-ci-asr",
        "register-ci-tts",
    } <= names
    assert all(r.info.status == "FINISHED" for r in kids)
    for model in ("asr", "tts"):
        champion = client.get_model_version_by_alias(f"ci-{model}", "champion")
        trained = client.get_run(champion.run_id)
        assert champion.run_id == dag_run.trained[model]["run_id"]
        assert trained.data.tags["mlflow.parentRunId"] == parent.info.run_id
        # Lineage: the training run's input is the shards' manifest, which names the Kaldi directories.
        assert trained.inputs.dataset_inputs and "data.train.dir" in trained.data.tags
    # The registered acoustic model carries its LM: the version says which text, order and weights.
    asr_champion = client.get_model_version_by_alias("ci-asr", "champion")
    assert (
        asr_champion.tags["speechflow.lm.chosen_on"] == "dev_engine" and asr_champion.tags["speechflow.lm.order"] == "3"
    )

    # MLflow as the cluster runs it (k8s/base/mlflow.yaml): runs and registered models in PostgreSQL,
    # artifacts through the server into its directory, the champion loadable by its `models:/` URI.
    # (One DAG run checks both: a test each would run the DAG twice.)
    if dag_run.postgres is None:
        pytest.skip(
            "the DAG ran end to end (tracked on SQLite); its PostgreSQL checks need PostgreSQL's server "
            "(initdb, pg_ctl): apt-get install postgresql (make setup does as root)"
        )
    postgres = dag_run.postgres
    training = client.get_run(dag_run.trained["asr"]["run_id"])
    kind = client.get_experiment(training.info.experiment_id).tags[tracking.EXPERIMENT_KIND_TAG]
    assert kind == tracking.MODEL_TRAINING
    assert (training.info.run_id,) in postgres.rows("SELECT run_uuid FROM runs")
    assert training.info.artifact_uri.startswith("mlflow-artifacts:")
    assert {a.path for a in client.list_artifacts(training.info.run_id)} >= {"config.yaml", "plots"}
    assert list(dag_run.artifacts.rglob("config.yaml")), "no artifact reached the server's artifact directory"
    champion = client.get_model_version_by_alias("ci-asr", "champion")
    assert (champion.name, champion.version) in postgres.rows("SELECT name, CAST(version AS TEXT) FROM model_versions")
    previous = mlflow.get_tracking_uri()
    mlflow.set_tracking_uri(dag_run.uri)  # `models:/` URIs resolve against the process-wide setting
    try:
        assert mlflow.pyfunc.load_model("models:/ci-asr@champion").metadata.signature is not None
    finally:
        mlflow.set_tracking_uri(previous)


def dag_benchmark(dag_run: SimpleNamespace, name: str, *args: str) -> tuple[dict, str]:
    """benchmarks/NAME.py on the DAG test's run (tiny): its JSON and its printed table."""
    out = dag_run.run_dir / f"{name}.json"
    command = [PYTHON, f"benchmarks/{name}.py", "--demo-run", str(dag_run.run_dir)]
    proc = subprocess.run(
        [*command, *args, "--json", str(out)], cwd=ROOT, env=quiet_env(), capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(out.read_text()), proc.stdout


@pytest.mark.slow
@pytest.mark.airflow
def test_the_benchmarks_that_read_a_demo_run_read_the_dags(dag_run):
    """The benchmarks that take `--demo-run` on the DAG's run: its models are what they measure (a test of
    its own, so neither this nor the DAG's checks holds the DAG run and every benchmark under one timeout)."""
    summary, tts_metrics = dag_run.summary, dag_run.summary["models"]["tts"]["metrics"]
    few = ("--max-utterances", "4")  # of the run's utterances, what the benchmarks that take some use
    # benchmarks/tts_seeds.py on the run: its synthesis model as seed 0, seed 1 trained and evaluated.
    tiny = [*few, "--config", TINY["tts_config"], "--run-config", TINY["tts_config"], "--set", "max_steps=4"]
    levers = dag_run.run_dir / "levers.json"
    seeds, _ = dag_benchmark(
        dag_run, "tts_seeds", "--seeds", "0,1", *tiny, "--lever", "four steps", "--levers-json", str(levers)
    )
    assert [s["source"] for s in seeds["seeds"].values()] == ["the demo run", "trained here"]
    assert seeds["seeds"]["0"]["dev_intelligibility_cer"] == tts_metrics["dev_intelligibility_cer"]
    assert seeds["mean"]["dev_intelligibility_cer"] == pytest.approx(
        np.mean([s["dev_intelligibility_cer"] for s in seeds["seeds"].values()])
    )
    assert seeds["seeds"]["1"]["dev_intelligibility_cer_vocoded"] is not None  # what a person hears
    kept = json.loads(levers.read_text())["levers"]["four steps"]
    assert kept["mean"] == seeds["mean"] and kept["overrides"] == ["max_steps=4"]

    # benchmarks/tts_durations.py on the run's synthesis model: the searched durations through synthesis
    # are the teacher-forced frames, so the listener hears the same.
    durations, table = dag_benchmark(dag_run, "tts_durations", *few)
    assert durations["utterances"] == 4 and set(durations["arms"]) >= {"searched", "predicted", "predicted_vocoded"}
    assert durations["arms"]["searched"]["cer"] == pytest.approx(durations["arms"]["teacher_forced"]["cer"], abs=0.05)
    assert durations["durations"]["characters"] > 0 and "searched" in table

    # benchmarks/voice_warp.py on the run's acoustic model: unwarped, each split's CER is the evaluation's.
    warped, table = dag_benchmark(dag_run, "voice_warp", "--warps", "0.9,1.1", "--max-utterances", "0")
    assert warped["warps"] == [0.9, 1.0, 1.1] and set(warped["splits"]) == {"test", "test_engine"}
    for split, heard in warped["splits"].items():
        assert heard["all"][1] == pytest.approx(summary["models"]["asr"]["metrics"][f"{split}_cer"]), split
        assert all(len(v["cer"]) == 3 for v in heard["voices"].values())
    assert {"flite:kal16", "flite:slt"} <= set(warped["splits"]["test_engine"]["voices"]) and "test_engine" in table

    # benchmarks/serving.py on the run: its acoustic model served with its word LM, posted its held-out voices,
    # as served and with the request param lm: false.
    from tests.test_benchmarks import check_keys

    served, table = dag_benchmark(dag_run, "serving", *few, "--tiny")
    check_keys("serving", served)
    assert served["with_lm"] and "test_engine" in served["posted"] and "beam search + LM" in table
    assert served["w1_c1"]["failed"] == served["w1_c1_greedy"]["failed"] == served["failed_16_clients"] == 0

    # benchmarks/lm_decoding.py on the run's acoustic model: an LM of each text, tuned on dev_engine, every split.
    decoded, table = dag_benchmark(dag_run, "lm_decoding", "--tiny", "--work", str(dag_run.run_dir / "lm-decoding"))
    check_keys("lm_decoding", decoded)
    assert set(decoded["conditions"]) == {"corpus_o3", "general_o3"} and "test_engine" in decoded["splits"]
    assert all(c["chosen"]["on"] == "dev_engine" for c in decoded["conditions"].values()) and table.strip()
