"""MLflow as the cluster runs it: a tracking server on PostgreSQL with proxied artifacts, and the
pipeline against it: the DAG under `airflow dags test`, whose training is a two-rank `horovodrun`.

The test starts its own PostgreSQL cluster (Debian's `postgresql` package, which scripts/setup.sh
installs as root) on 127.0.0.1 and a free port, in a temporary directory, and one `mlflow server`
for the whole run: `--backend-store-uri postgresql+psycopg://...` (the URI form of
k8s/base/mlflow.yaml) and `--artifacts-destination DIR --serve-artifacts`, so that clients only
ever talk HTTP to the server, as pods do on the cluster.
"""

from __future__ import annotations

import glob
import json
import os
import pwd
import shutil
import subprocess
import tempfile
from pathlib import Path

import mlflow
import pytest

from models import tracking
from tests.conftest import AIRFLOW_BIN
from tests.mlflow_server import MlflowServer, free_port

pytestmark = pytest.mark.slow


def postgres_bin() -> Path | None:
    """The directory of initdb and pg_ctl: on PATH, or where Debian puts them (newest version)."""
    found = shutil.which("initdb")
    if found:
        return Path(found).resolve().parent
    versions = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(Path(p).parts[-3]))
    return Path(versions[-1]).parent if versions else None


class Postgres:
    """A throwaway PostgreSQL cluster: initdb into a temporary directory, pg_ctl start on 127.0.0.1:PORT.

    PostgreSQL refuses to run as root; as root, the cluster runs as the `postgres` user that Debian's
    package creates (or `nobody`)."""

    def __init__(self, bindir: Path):
        self.bindir, self.port = bindir, free_port()
        self.data = Path(tempfile.mkdtemp(prefix="speechflow-pg-"))
        self.user = None
        if os.geteuid() == 0:
            try:
                self.user = pwd.getpwnam("postgres")
            except KeyError:
                self.user = pwd.getpwnam("nobody")
            os.chown(self.data, self.user.pw_uid, self.user.pw_gid)

    def run(self, tool: str, *args: str) -> None:
        ids = {"user": self.user.pw_uid, "group": self.user.pw_gid, "extra_groups": []} if self.user else {}
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C", "HOME": str(self.data)}
        proc = subprocess.run(
            [str(self.bindir / tool), *args], cwd=self.data, env=env, capture_output=True, text=True, timeout=120, **ids
        )
        if proc.returncode != 0:
            log = self.data / "cluster" / "server.log"
            raise RuntimeError(
                f"{tool} {' '.join(args)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
                + (f"\n{log.read_text()[-3000:]}" if log.exists() else "")
            )

    def start(self) -> str:
        """Starts the cluster with a database `mlflow` owned by user `mlflow`; returns the SQLAlchemy URI."""
        import psycopg

        cluster = self.data / "cluster"
        self.run("initdb", "-D", str(cluster), "-U", "mlflow", "-A", "trust", "-E", "UTF8", "--locale=C", "--no-sync")
        # -F: no fsync (a test's database need not survive a power cut); the socket stays in the cluster.
        options = f"-h 127.0.0.1 -p {self.port} -k {cluster} -F"
        self.run("pg_ctl", "-D", str(cluster), "-l", str(cluster / "server.log"), "-o", options, "-w", "start")
        with psycopg.connect(f"postgresql://mlflow@127.0.0.1:{self.port}/postgres", autocommit=True) as conn:
            conn.execute("CREATE DATABASE mlflow")
        return f"postgresql+psycopg://mlflow@127.0.0.1:{self.port}/mlflow"

    def stop(self) -> None:
        if (self.data / "cluster" / "postmaster.pid").exists():
            self.run("pg_ctl", "-D", str(self.data / "cluster"), "-m", "fast", "-w", "stop")
        shutil.rmtree(self.data, ignore_errors=True)

    def rows(self, sql: str) -> list[tuple]:
        import psycopg

        with psycopg.connect(f"postgresql://mlflow@127.0.0.1:{self.port}/mlflow") as conn:
            return conn.execute(sql).fetchall()


@pytest.fixture
def stack(tmp_path):
    """PostgreSQL, then `mlflow server` on it; both stopped at the end."""
    bindir = postgres_bin()
    if bindir is None:
        pytest.skip(
            "PostgreSQL's server (initdb, pg_ctl) is not installed: apt-get install postgresql (make setup does as root)"
        )
    postgres = Postgres(bindir)
    try:
        store = postgres.start()
        with MlflowServer(store, tmp_path / "artifacts", tmp_path / "mlflow-server.log") as server:
            yield postgres, server, tmp_path / "artifacts"
    finally:
        postgres.stop()


@pytest.mark.skipif(not (AIRFLOW_BIN / "airflow").exists(), reason=".venv-airflow is missing (make setup builds it)")
def test_dag_and_two_rank_training_against_mlflow_on_postgres(stack, tmp_path):
    """The DAG on a tiny corpus, acoustic model only: its `train_asr` task is the two-rank training,
    `horovodrun -np 2` as a user would type it (one run of both, to keep CI short)."""
    from tests.test_dag import TINY, airflow, airflow_env, last_json

    postgres, server, artifacts = stack
    # A short work root: the trainer logs the Kaldi directories' paths in an MLflow field of 500 characters.
    work = Path(tempfile.mkdtemp(prefix="sf-"))
    env = airflow_env(tmp_path / "home", MLFLOW_TRACKING_URI=server.uri, SPEECHFLOW_WORK_ROOT=str(work))
    conf = {**TINY, "models": ["asr"], "num_workers": 2, "experiment": "pg"}
    try:
        airflow(env, "db", "migrate")
        airflow(env, "dags", "test", "speech_pipeline", "-c", json.dumps(conf), timeout=900)
        (summary_file,) = work.glob("*/summary.json")
        summary = json.loads(summary_file.read_text())
        (train_summary_file,) = work.glob("*/asr/train_summary.json")
        trained = json.loads(train_summary_file.read_text())
    finally:
        shutil.rmtree(work, ignore_errors=True)
    (dag_run,) = last_json(airflow(env, "dags", "list-runs", "speech_pipeline", "-o", "json").stdout)
    assert dag_run["state"] == "success" and summary["status"] == "FINISHED"
    assert summary["models"]["asr"]["metrics"]["test_cer"] >= 0

    # The training: two ranks that agree, logged to the server.
    assert trained["world_size"] == 2 and trained["ranks_agree"]
    client = mlflow.MlflowClient(server.uri)
    run = client.get_run(trained["run_id"])
    assert run.data.params["world_size"] == "2" and len(client.get_metric_history(run.info.run_id, "loss")) >= 2
    assert client.get_experiment(run.info.experiment_id).tags[tracking.EXPERIMENT_KIND_TAG] == tracking.MODEL_TRAINING
    # Runs and registered models live in PostgreSQL; artifacts went through the server into its directory.
    assert (run.info.run_id,) in postgres.rows("SELECT run_uuid FROM runs")
    assert run.info.artifact_uri.startswith("mlflow-artifacts:")
    assert {a.path for a in client.list_artifacts(run.info.run_id)} >= {"config.yaml", "plots"}
    assert list(artifacts.rglob("config.yaml")), "no artifact reached the server's artifact directory"

    # The DAG's lineage: one parent run, a child run per stage, the champion in the registry.
    parents = client.search_runs([run.info.experiment_id], "tags.`speechflow.stage` = 'pipeline'")
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    kids = client.search_runs([run.info.experiment_id], f"tags.`mlflow.parentRunId` = '{parents[0].info.run_id}'")
    assert {"corpus", "shards", "train-asr", "evaluate-asr", "register-pg-asr"} <= {r.info.run_name for r in kids}
    champion = client.get_model_version_by_alias("pg-asr", "champion")
    assert champion.run_id == run.info.run_id
    assert (champion.name, champion.version) in postgres.rows("SELECT name, CAST(version AS TEXT) FROM model_versions")
    previous = mlflow.get_tracking_uri()
    mlflow.set_tracking_uri(server.uri)  # `models:/` URIs resolve against the process-wide setting
    try:
        assert mlflow.pyfunc.load_model("models:/pg-asr@champion").metadata.signature is not None
    finally:
        mlflow.set_tracking_uri(previous)
