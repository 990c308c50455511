"""`python -m models.registry`: the MLflow side of the DAG (parent run, stage runs, registry, champion)."""

from __future__ import annotations

import json
import subprocess

import mlflow
import pytest

from models import registry
from models.tracking import runs as tracking
from tests.conftest import PYTHON, ROOT, quiet_env


def cli(capsys, *argv: str) -> dict:
    """Runs the entry point in-process; returns the JSON line it printed."""
    assert registry.main(list(argv)) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.strip()]
    return json.loads(lines[-1])


class Echo(mlflow.pyfunc.PythonModel):
    def predict(self, context, model_input, params=None):
        return model_input


def trained_workdir(path, metrics: dict, parent_run_id: str | None = None, experiment: str = "reg"):
    """A workdir as models.train and models.evaluate leave it: a run with a logged model, eval.json."""
    path.mkdir(parents=True)
    with tracking.start_run(experiment, f"train-{path.name}", parent_run_id) as run:
        mlflow.pyfunc.log_model(name="model", python_model=Echo(), pip_requirements=[])
        mlflow.log_metrics({k: v for k, v in metrics.items() if isinstance(v, float)})
    tracking.save_run_file(path, run.info.run_id, experiment)
    (path / "eval.json").write_text(json.dumps(metrics))
    return path


def children(parent_run_id: str) -> dict[str, object]:
    parent = tracking.client().get_run(parent_run_id)
    runs = tracking.client().search_runs([parent.info.experiment_id], f"tags.`mlflow.parentRunId` = '{parent_run_id}'")
    return {r.data.tags.get(registry.NAME_TAG, r.info.run_name): r for r in runs}


def test_start_parent_finds_the_same_run_again_and_reopens_it(mlflow_uri, capsys):
    first = cli(capsys, "start-parent", "--experiment", "reg", "--dag-id", "d", "--dag-run-id", "manual__1")
    again = cli(capsys, "start-parent", "--experiment", "reg", "--dag-id", "d", "--dag-run-id", "manual__1")
    other = cli(capsys, "start-parent", "--experiment", "reg", "--dag-id", "d", "--dag-run-id", "manual__2")
    assert not first["reused"] and again["reused"] and again["parent_run_id"] == first["parent_run_id"]
    assert other["parent_run_id"] != first["parent_run_id"]
    run = tracking.client().get_run(first["parent_run_id"])
    assert run.info.status == "RUNNING"
    assert run.data.tags[registry.DAG_ID_TAG] == "d" and run.data.tags[registry.DAG_RUN_TAG] == "manual__1"
    tracking.client().set_terminated(first["parent_run_id"], "FAILED")  # the DAG run failed; it is cleared
    cli(capsys, "start-parent", "--experiment", "reg", "--dag-id", "d", "--dag-run-id", "manual__1")
    assert tracking.client().get_run(first["parent_run_id"]).info.status == "RUNNING"


def stage_dirs(root):
    corpus = root / "corpus"
    (corpus / "train").mkdir(parents=True)
    (corpus / "corpus.json").write_text(
        json.dumps(
            {
                "config": {"num_utterances": 40, "seed": 0},
                "counts": {"train": 32, "test": 8},
                "speakers": {"train": ["a", "b"], "test": ["c"]},
                "vocabulary_size": 167,
            }
        )
    )
    train = corpus / "train"
    (train / ".features.done.json").write_text(
        json.dumps(
            {
                "fingerprint": {},
                "summary": {
                    "utterances": 32,
                    "featurized": 31,
                    "rejected": 1,
                    "frames": 9000,
                    "speakers": 2,
                    "dim": 80,
                },
            }
        )
    )
    (train / "feats_rejected.tsv").write_text("split\tutt_id\treason\ntrain\tu1\ttoo short\n")
    kaldi_made = root / "kaldi" / "test"
    kaldi_made.mkdir(parents=True)
    (kaldi_made / "feats.scp").write_text("u1 feats.ark:10\nu2 feats.ark:99\n")
    shards = root / "shards"
    shards.mkdir()
    (shards / "manifest.json").write_text(
        json.dumps(
            {
                "compression": "none",
                "feature_dim": 80,
                "vocabulary": list("abc "),
                "fingerprint": {},
                "splits": {
                    "train": {
                        "data_dir": str(train),
                        "utterances": 31,
                        "frames": 9000,
                        "rejected": 1,
                        "speakers": 2,
                        "shards": [{"file": "train-0.tfrecord"}, {"file": "train-1.tfrecord"}],
                    }
                },
            }
        )
    )
    (shards / "rejected.tsv").write_text("split\tutt_id\treason\n")
    return corpus, train, kaldi_made, shards


def test_record_stage_logs_counts_and_small_files_once_per_stage(mlflow_uri, tmp_path, capsys):
    parent = cli(capsys, "start-parent", "--experiment", "reg", "--dag-id", "d", "--dag-run-id", "r")["parent_run_id"]
    corpus, train, kaldi_made, shards = stage_dirs(tmp_path)
    rec = cli(capsys, "record-stage", "--parent-run-id", parent, "--stage", "corpus", "--path", str(corpus))
    assert rec["metrics"]["utterances.train"] == 32 and rec["metrics"]["speakers.train"] == 2 and not rec["reused"]
    feats = cli(
        capsys,
        "record-stage",
        "--parent-run-id",
        parent,
        "--stage",
        "features",
        "--path",
        str(train),
        "--name",
        "features-train",
        "--param",
        "split=train",
    )
    assert feats["metrics"]["rejected"] == 1 and feats["metrics"]["frames"] == 9000
    kaldi = cli(
        capsys,
        "record-stage",
        "--parent-run-id",
        parent,
        "--stage",
        "features",
        "--path",
        str(kaldi_made),
        "--name",
        "features-test",
    )
    assert kaldi["metrics"] == {"featurized": 2}
    sh = cli(capsys, "record-stage", "--parent-run-id", parent, "--stage", "shards", "--path", str(shards))
    assert sh["metrics"]["train.shards"] == 2 and sh["metrics"]["vocabulary_size"] == 4
    # A retried task records nothing twice.
    again = cli(capsys, "record-stage", "--parent-run-id", parent, "--stage", "shards", "--path", str(shards))
    assert again["reused"] and again["run_id"] == sh["run_id"]

    runs = children(parent)
    assert set(runs) == {"corpus", "features-train", "features-test", "shards"}
    assert all(r.info.status == "FINISHED" for r in runs.values())
    assert runs["features-train"].data.params["split"] == "train"
    assert runs["shards"].data.params["data.train.dir"] == str(train)
    assert runs["shards"].data.tags[registry.DAG_RUN_TAG] == "r"
    files = {f.path for f in tracking.client().list_artifacts(sh["run_id"])}
    assert files == {"manifest.json", "rejected.tsv"}
    assert {f.path for f in tracking.client().list_artifacts(feats["run_id"])} == {"feats_rejected.tsv"}


def test_record_stages_records_each_stage_in_one_process_as_record_stage_would(mlflow_uri, tmp_path, capsys):
    from workflow import commands

    parent = cli(capsys, "start-parent", "--experiment", "reg", "--dag-id", "d", "--dag-run-id", "r")["parent_run_id"]
    corpus, train, _, shards = stage_dirs(tmp_path)
    made = [
        commands.stage_record("corpus", str(corpus), "corpus"),
        commands.stage_record("features", str(train), "features-train", split="train"),
    ]
    first = cli(capsys, *commands.record_stages_args(parent, made))["records"]
    assert [r["name"] for r in first] == ["corpus", "features-train"] and not any(r["reused"] for r in first)
    assert first[1]["metrics"]["frames"] == 9000
    # The DAG's make_shards records them again with the shards: what is recorded is reused.
    again = cli(
        capsys, *commands.record_stages_args(parent, [*made, commands.stage_record("shards", str(shards), "shards")])
    )
    assert [r["reused"] for r in again["records"]] == [True, True, False]
    assert again["records"][0]["run_id"] == first[0]["run_id"]
    runs = children(parent)
    assert (
        set(runs) == {"corpus", "features-train", "shards"} and runs["features-train"].data.params["split"] == "train"
    )
    # A record without a path names the keys it needs; a missing output names the stage that makes it.
    assert registry.main(["record-stages", "--parent-run-id", parent, "--record", '{"stage": "corpus"}']) == 1
    assert "stage and path" in capsys.readouterr().err
    for bad in ("{stage: corpus}", '["corpus"]'):
        with pytest.raises(SystemExit):
            registry.main(["record-stages", "--parent-run-id", parent, "--record", bad])
        assert "--record" in capsys.readouterr().err
    missing = json.dumps(commands.stage_record("shards", str(tmp_path / "nothing"), "shards"))
    assert registry.main(["record-stages", "--parent-run-id", parent, "--record", missing]) == 1
    assert "python -m pipeline.shards" in capsys.readouterr().err


def test_record_stage_names_the_missing_output(mlflow_uri, tmp_path, capsys):
    parent = cli(capsys, "start-parent", "--experiment", "reg", "--dag-id", "d", "--dag-run-id", "r")["parent_run_id"]
    assert registry.main(["record-stage", "--parent-run-id", parent, "--stage", "shards", "--path", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "manifest.json" in err and "python -m pipeline.shards" in err
    assert (
        registry.main(["record-stage", "--parent-run-id", "0" * 32, "--stage", "corpus", "--path", str(tmp_path)]) == 1
    )
    assert "MLFLOW_TRACKING_URI" in capsys.readouterr().err


def test_register_moves_the_champion_only_to_a_better_model(mlflow_uri, tmp_path, capsys):
    parent = cli(capsys, "start-parent", "--experiment", "reg", "--dag-id", "d", "--dag-run-id", "r")["parent_run_id"]

    def register(name: str, cer: float) -> dict:
        work = trained_workdir(tmp_path / name, {"model": "asr", "primary_metric": "test_cer", "test_cer": cer}, parent)
        return cli(capsys, "register", "--workdir", str(work), "--name", "reg-asr", "--parent-run-id", parent)

    first = register("first", 0.5)
    assert first["version"] == 1 and first["promoted"] and first["champion_version"] == 1
    worse = register("worse", 0.7)
    assert worse["version"] == 2 and not worse["promoted"] and worse["champion_version"] == 1
    assert "does not beat" in worse["reason"]
    tie = register("tie", 0.5)
    assert not tie["promoted"]
    better = register("better", 0.3)
    assert better["version"] == 4 and better["promoted"] and better["previous_champion_version"] == 1
    # A retry registers nothing new and leaves the alias where it is.
    retry = cli(capsys, "register", "--workdir", str(tmp_path / "worse"), "--name", "reg-asr")
    assert retry["version"] == 2 and not retry["promoted"] and retry["champion_version"] == 4

    client = tracking.client()
    champion = client.get_model_version_by_alias("reg-asr", "champion")
    assert int(champion.version) == 4 and champion.run_id == tracking.load_run_file(tmp_path / "better")["run_id"]
    assert champion.tags[registry.METRIC_TAG] == "test_cer" and float(champion.tags[registry.VALUE_TAG]) == 0.3
    assert len(client.search_model_versions("name = 'reg-asr'")) == 4
    assert json.loads((tmp_path / "better" / registry.REGISTERED_FILE).read_text())["version"] == 4
    decision = children(parent)["register-reg-asr"]
    assert decision.data.params["metric"] == "test_cer"


def test_a_champion_without_the_metric_keeps_its_alias(mlflow_uri, tmp_path, capsys):
    # The champion was evaluated without an acoustic model: it has no intelligibility CER to compare.
    old = trained_workdir(
        tmp_path / "old",
        {"model": "tts", "primary_metric": "test_fbank_cepstral_distance_db", "test_fbank_cepstral_distance_db": 9.0},
    )
    cli(capsys, "register", "--workdir", str(old), "--name", "reg-tts")
    new = trained_workdir(
        tmp_path / "new",
        {
            "model": "tts",
            "primary_metric": "test_intelligibility_cer",
            "test_intelligibility_cer": 0.2,
            "test_fbank_cepstral_distance_db": 8.0,
        },
    )
    result = cli(capsys, "register", "--workdir", str(new), "--name", "reg-tts")
    assert not result["promoted"] and "no test_intelligibility_cer" in result["reason"]
    assert int(tracking.client().get_model_version_by_alias("reg-tts", "champion").version) == 1


def test_register_errors_name_the_fix(mlflow_uri, tmp_path, capsys):
    assert registry.main(["register", "--workdir", str(tmp_path), "--name", "x"]) == 1
    assert "mlflow_run.json" in capsys.readouterr().err
    work = trained_workdir(tmp_path / "w", {"model": "asr", "primary_metric": "test_cer", "test_cer": 0.5})
    (work / "eval.json").unlink()
    assert registry.main(["register", "--workdir", str(work), "--name", "x"]) == 1
    assert "python -m models.evaluate" in capsys.readouterr().err
    with pytest.raises(ValueError, match="lower or higher"):
        registry.lower_is_better("test_accuracy")
    assert registry.lower_is_better("test_intelligibility_cer") and registry.lower_is_better("test_mel_l1")


def test_finish_ends_the_parent_and_writes_the_summary(mlflow_uri, tmp_path, capsys):
    parent = cli(capsys, "start-parent", "--experiment", "reg", "--dag-id", "d", "--dag-run-id", "r")["parent_run_id"]
    work = trained_workdir(tmp_path / "asr", {"model": "asr", "primary_metric": "test_cer", "test_cer": 0.25}, parent)
    cli(capsys, "register", "--workdir", str(work), "--name", "reg-asr")
    summary = cli(
        capsys,
        "finish",
        "--parent-run-id",
        parent,
        "--status",
        "FAILED",
        "--workdir",
        f"asr={work}",
        "--workdir",
        f"tts={tmp_path / 'never-trained'}",
        "--summary",
        str(tmp_path / "summary.json"),
    )
    assert summary["status"] == "FAILED" and summary["dag_run_id"] == "r"
    assert summary["models"]["asr"]["metrics"]["test_cer"] == 0.25
    assert summary["models"]["asr"]["registered"]["version"] == 1
    assert summary["models"]["tts"]["registered"] is None
    assert json.loads((tmp_path / "summary.json").read_text()) == summary
    run = tracking.client().get_run(parent)
    assert run.info.status == "FAILED" and run.data.metrics["asr.test_cer"] == 0.25
    assert {f.path for f in tracking.client().list_artifacts(parent)} == {"summary.json"}
    with pytest.raises(SystemExit):  # argparse names the valid choices
        registry.main(["finish", "--parent-run-id", parent, "--status", "DONE"])


def test_cli_prints_one_json_line_and_writes_the_json_file(tmp_path, sqlite_store):
    out = tmp_path / "xcom" / "return.json"
    env = quiet_env(MLFLOW_TRACKING_URI=sqlite_store)
    proc = subprocess.run(
        [
            PYTHON,
            "-m",
            "models.registry",
            "--json-file",
            str(out),
            "start-parent",
            "--experiment",
            "cli",
            "--dag-id",
            "d",
            "--dag-run-id",
            "r",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    (line,) = [line for line in proc.stdout.splitlines() if line.strip()]
    assert json.loads(line) == json.loads(out.read_text()) and len(json.loads(line)["parent_run_id"]) == 32
