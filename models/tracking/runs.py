"""MLflow runs and params for training, evaluation and the registry stage.

The tracking URI comes from `MLFLOW_TRACKING_URI`; without it, a SQLite store in `.runs/mlflow.db`
under the working directory (the same store the `make` targets use). With a SQLite store,
artifacts go to `mlartifacts/` beside the database file, so `mlflow server --backend-store-uri
sqlite:///...` finds them wherever it runs.

Experiments are created as model-training experiments (`mlflow.experimentKind`). Here: the store's
client, experiments and runs (started, resumed, nested under a DAG run's parent), params in
batches, the library versions and the shards' manifest as the run's input, and the run file that
tells later stages which run trained the model in a workdir. What training logs while it runs goes
through models/tracking/spool.py (`RunLog`, which outlasts an outage of the tracking server) and
models/training/system_metrics.py (each rank's CPU, memory and GPU).
"""

from __future__ import annotations

import os
import platform
import warnings
from pathlib import Path
from typing import Any

# MLflow's download progress bars flood task logs (it draws one per model it logs).
os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")

RUN_FILE = "mlflow_run.json"  # in a workdir: which run trained the model there
DEFAULT_STORE = Path(".runs") / "mlflow.db"  # under the working directory, without MLFLOW_TRACKING_URI
# MLflow 3 opens an experiment in its GenAI view (traces) unless the experiment says what it is.
# This tag, with this value, is what MLflow's own UI writes when a user marks an experiment as
# "model training"; the UI's own toggle (or `?workflowType=machine_learning` in a link) picks the view.
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
MODEL_TRAINING = "custom_model_development"
UI_QUERY = "workflowType=machine_learning"  # for links into the MLflow UI (see `ui_url`)


def tracking_uri() -> str:
    uri = os.environ.get("MLFLOW_TRACKING_URI")
    if uri:
        return uri
    store = Path.cwd() / DEFAULT_STORE
    store.parent.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{store}"


def _artifact_root(uri: str) -> str | None:
    if uri.startswith("sqlite:///"):
        return (Path(uri[len("sqlite:///") :]).resolve().parent / "mlartifacts").as_uri()
    return None  # a tracking server decides


def client():
    import mlflow

    mlflow.set_tracking_uri(tracking_uri())
    return mlflow.MlflowClient()


def ensure_experiment(name: str) -> str:
    """The id of experiment `name`, created if needed, marked as a model-training experiment."""
    import mlflow

    mlflow.set_tracking_uri(tracking_uri())
    found = mlflow.get_experiment_by_name(name)
    if found is not None:
        if EXPERIMENT_KIND_TAG not in found.tags:
            # An experiment made before the tag (or by hand); a kind someone chose in the UI stays.
            mlflow.MlflowClient().set_experiment_tag(found.experiment_id, EXPERIMENT_KIND_TAG, MODEL_TRAINING)
        return found.experiment_id
    root = _artifact_root(tracking_uri())
    try:
        return mlflow.create_experiment(
            name,
            artifact_location=f"{root}/{name}" if root else None,
            tags={EXPERIMENT_KIND_TAG: MODEL_TRAINING},
        )
    except mlflow.exceptions.MlflowException:
        # Another process (a parallel Airflow task) created it first.
        return mlflow.get_experiment_by_name(name).experiment_id


def ui_url(base: str, experiment_id: str, run_id: str | None = None) -> str:
    """A link into the MLflow UI at `base` (http://host:port) that opens on training runs, not traces."""
    path = f"#/experiments/{experiment_id}" + (f"/runs/{run_id}" if run_id else "")
    return f"{base.rstrip('/')}/{path}?{UI_QUERY}"


def start_run(
    experiment: str,
    run_name: str | None = None,
    parent_run_id: str | None = None,
    run_id: str | None = None,
    tags: dict | None = None,
):
    """Starts (or resumes, with `run_id`) a run; nested under `parent_run_id` when given."""
    import mlflow

    experiment_id = ensure_experiment(experiment)
    tags = dict(tags or {})
    if parent_run_id:
        tags["mlflow.parentRunId"] = parent_run_id
    if run_id:
        return mlflow.start_run(run_id=run_id)
    return mlflow.start_run(experiment_id=experiment_id, run_name=run_name, tags=tags)


def run_exists(run_id: str) -> bool:
    """Whether the tracking store has run `run_id` (a workdir's run file may name one of another store)."""
    from mlflow.exceptions import MlflowException

    try:
        client().get_run(run_id)
    except MlflowException as err:
        if err.error_code == "RESOURCE_DOES_NOT_EXIST":
            return False
        raise
    return True


def log_params(params: dict[str, Any]) -> None:
    """Logs params in batches (MLflow takes at most 100 per call); long values are cut to 6000 chars."""
    import mlflow

    items = [(k, str(v)[:6000]) for k, v in params.items()]
    for start in range(0, len(items), 100):
        mlflow.log_params(dict(items[start : start + 100]))


def versions() -> dict[str, str]:
    import horovod
    import keras
    import mlflow
    import numpy
    import tensorflow as tf

    return {
        "version.python": platform.python_version(),
        "version.tensorflow": tf.__version__,
        "version.keras": keras.__version__,
        "version.horovod": horovod.__version__,
        "version.mlflow": mlflow.__version__,
        "version.numpy": numpy.__version__,
    }


def log_shards_input(shards, context: str = "training") -> None:
    """Records the shards' manifest (of a pipeline/records.py `ShardSet`) as the run's input dataset
    (lineage: model <- shards <- Kaldi dirs)."""
    import mlflow
    from mlflow.data.dataset_source_registry import resolve_dataset_source
    from mlflow.data.meta_dataset import MetaDataset

    from common.fsutil import config_hash

    digest = shards.fingerprint
    with warnings.catch_warnings():
        # MLflow registers two equivalent local-file sources and warns that it picks one.
        warnings.simplefilter("ignore")
        source = resolve_dataset_source(str(shards.root.resolve() / "manifest.json"))
    dataset = MetaDataset(
        source=source,
        name=f"shards:{shards.root.name}",
        digest=config_hash(digest),
    )
    # The Kaldi directories go into run tags (one per split): an input tag holds at most 500 characters.
    mlflow.log_input(dataset, context=context)
    mlflow.set_tags({f"data.{name}.dir": split.data_dir for name, split in shards.splits.items()})
    mlflow.set_tags({f"data.{name}.utterances": split.utterances for name, split in shards.splits.items()})


def save_run_file(workdir: Path, run_id: str, experiment: str) -> None:
    from common.fsutil import atomic_write_json

    atomic_write_json(
        Path(workdir) / RUN_FILE, {"run_id": run_id, "experiment": experiment, "tracking_uri": tracking_uri()}
    )


def load_run_file(workdir: Path) -> dict | None:
    from common.fsutil import read_json

    return read_json(Path(workdir) / RUN_FILE)
