"""The MLflow side of the Airflow DAG: `python -m models.registry SUBCOMMAND ...`, one JSON line out.

    start-parent  --experiment E --dag-id D --dag-run-id R    -> {"parent_run_id", "experiment_id", "reused"}
    record-stage  --parent-run-id P --stage features --path DIR [--name features-train] [--param k=v]
                                                             -> {"run_id", "stage", "name", "metrics", "reused"}
    record-stages --parent-run-id P --record '{"stage": "features", "path": DIR, "name": N, "params": {...}}' ...
                                                             -> {"records": [what record-stage returns, each]}
    register      --workdir W --name speechflow-asr [--parent-run-id P] [--alias champion]
                                                             -> {"name", "version", "metric", "value", "promoted", ...}
    finish        --parent-run-id P [--status FINISHED] [--workdir asr=W] [--summary FILE]
                                                             -> the run's summary

The DAG runs these with the training environment (locally, or as pods of the training image), so
the Airflow environment needs no MLflow. Airflow retries a task by running it again, so every
subcommand is idempotent: the parent run is found again by its (dag id, run id) tags, a stage's
child run by its parent and name, a model version by its training run. `--json-file PATH` also
writes the result to PATH (the KubernetesPodOperator reads /airflow/xcom/return.json).

Lineage: the parent run (one per DAG run) holds a child run per stage; the training run (a child,
made by models.train) records the shards' manifest as its input dataset and the Kaldi directories
as tags; the model version points at the training run and carries the evaluation metric.

One subcommand, `register` (the function of that name), writes to MLflow's model registry; the
others open, record and close the DAG run's runs in MLflow tracking (`start_parent_run`,
`record_stage`, `record_stages`, `finish_parent_run`).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

from common import cli
from common.fsutil import atomic_write_json, read_json
from models.tracking import runs as tracking

ALIAS = "champion"
DAG_ID_TAG, DAG_RUN_TAG = "airflow.dag_id", "airflow.run_id"
STAGE_TAG, NAME_TAG = "speechflow.stage", "speechflow.stage_name"
METRIC_TAG, VALUE_TAG = "speechflow.metric", "speechflow.metric_value"
REGISTERED_FILE = "registered.json"  # in a workdir: the version `register` made of its model
# Metrics where a smaller value is the better model: error rates, distances and distortions, losses.
LOWER_IS_BETTER = ("cer", "wer", "distance", "mcd", "l1", "loss")


def _mlflow_at_store():
    import mlflow

    mlflow.set_tracking_uri(tracking.tracking_uri())
    return mlflow


def _runs_tagged(experiment_id: str, tags: dict[str, str]) -> list:
    """Runs of the experiment (any status, newest first) carrying every one of `tags`."""
    quoted = " and ".join(f"tags.`{k}` = '{v}'" for k, v in tags.items())
    return tracking.client().search_runs([experiment_id], quoted, order_by=["attributes.start_time DESC"])


def start_parent_run(experiment: str, dag_id: str, dag_run_id: str) -> dict:
    """The DAG run's parent run: found by its tags (a retry, a cleared run) or created, and RUNNING."""
    client = tracking.client()
    experiment_id = tracking.ensure_experiment(experiment)
    tags = {DAG_ID_TAG: dag_id, DAG_RUN_TAG: dag_run_id}
    found = [r for r in _runs_tagged(experiment_id, tags) if not r.data.tags.get("mlflow.parentRunId")]
    if found:
        run = found[0]
        if run.info.status != "RUNNING":
            client.update_run(run.info.run_id, status="RUNNING")  # the DAG run was cleared and runs again
        return {"parent_run_id": run.info.run_id, "experiment_id": experiment_id, "reused": True}
    run = client.create_run(experiment_id, tags={**tags, STAGE_TAG: "pipeline"}, run_name=f"{dag_id}/{dag_run_id}")
    return {"parent_run_id": run.info.run_id, "experiment_id": experiment_id, "reused": False}


def _parent_run(parent_run_id: str):
    from mlflow.exceptions import MlflowException

    try:
        return tracking.client().get_run(parent_run_id)
    except MlflowException as err:
        if err.error_code != "RESOURCE_DOES_NOT_EXIST":
            raise
        raise ValueError(
            f"parent run {parent_run_id} is not in the MLflow store {tracking.tracking_uri()}; "
            f"is MLFLOW_TRACKING_URI the one `start-parent` used?"
        ) from err


def _start_child_run(parent_run_id: str, stage: str, name: str):
    """A started child run for (parent, name), or None when a finished one already exists (a retry)."""
    parent = _parent_run(parent_run_id)
    experiment_id = parent.info.experiment_id
    found = _runs_tagged(experiment_id, {"mlflow.parentRunId": parent_run_id, NAME_TAG: name})
    finished = [r for r in found if r.info.status == "FINISHED"]
    if finished:
        return None, finished[0].info.run_id
    for stale in found:  # an attempt that died while recording: start over
        tracking.client().delete_run(stale.info.run_id)
    experiment = tracking.client().get_experiment(experiment_id).name
    tags = {
        STAGE_TAG: stage,
        NAME_TAG: name,
        **{k: parent.data.tags[k] for k in (DAG_ID_TAG, DAG_RUN_TAG) if k in parent.data.tags},
    }
    return tracking.start_run(experiment, name, parent_run_id, tags=tags), None


def stage_outputs(stage: str, path: Path) -> tuple[dict, dict, list[Path]]:
    """(params, metrics, artifact files) of a data stage's output directory."""
    path = Path(path)
    if stage == "corpus":
        info = _required_json(path / "corpus.json", f"python -m pipeline.corpus --out {path}")
        metrics = {f"utterances.{s}": n for s, n in info["counts"].items()}
        metrics.update(
            {f"speakers.{s}": len(v) for s, v in info["speakers"].items()},
            vocabulary_size=info["vocabulary_size"],
        )
        params = {f"corpus.{k}": v for k, v in info["config"].items()}
        return {**params, "corpus.dir": str(path.resolve())}, metrics, [path / "corpus.json"]
    if stage == "features":
        marker = read_json(path / ".features.done.json") or {}
        summary = marker.get("summary")
        if summary is None:  # features made by Kaldi: the stage only added CMVN statistics
            scp = path / "feats.scp"
            if not scp.is_file():
                raise FileNotFoundError(
                    f"{scp} does not exist: run `python -m pipeline.features --data-dir {path}` first"
                )
            summary = {"featurized": sum(1 for line in scp.open() if line.strip())}
        artifacts = [p for p in [path / "feats_rejected.tsv"] if p.is_file() and p.stat().st_size]
        return {"data_dir": str(path.resolve())}, dict(summary), artifacts
    if stage == "shards":
        manifest = _required_json(path / "manifest.json", f"python -m pipeline.shards ... --out {path}")
        metrics: dict[str, Any] = {
            "vocabulary_size": len(manifest["vocabulary"]),
            "feature_dim": manifest["feature_dim"],
        }
        for split, info in manifest["splits"].items():
            metrics.update(
                {
                    f"{split}.{k}": info[k]
                    for k in ("utterances", "frames", "rejected", "speakers")
                    if isinstance(info.get(k), (int, float))
                }
            )
            metrics[f"{split}.shards"] = len(info["shards"])
        params = {f"data.{split}.dir": info["data_dir"] for split, info in manifest["splits"].items()}
        params.update(shards_dir=str(path.resolve()), compression=manifest["compression"])
        artifacts = [path / "manifest.json"] + [p for p in [path / "rejected.tsv"] if p.is_file()]
        return params, metrics, artifacts
    if stage == "augment":
        info = _required_json(path / "augment.json", f"python -m pipeline.augment --data DATA/train --out {path}")
        summary = info["summary"]
        metrics = {k: v for k, v in summary.items() if isinstance(v, (int, float))}
        metrics.update({f"copies.{kind}": n for kind, n in summary["kinds"].items()})
        params = {f"augment.{k}": v for k, v in info["fingerprint"]["config"].items()}
        return {**params, "data_dir": str(path.resolve())}, metrics, [path / "augment.json"]
    raise ValueError(f"unknown stage {stage!r}: corpus, augment, features or shards")


def _required_json(path: Path, how: str) -> dict:
    value = read_json(path)
    if value is None:
        raise FileNotFoundError(f"{path} does not exist or is incomplete: run `{how}` first")
    return value


def record_stage(
    parent_run_id: str, stage: str, path: Path, name: str | None = None, extra_params: dict | None = None
) -> dict:
    """A child run of the parent for one data stage: its params, counts and small output files."""
    name = name or stage
    _parent_run(parent_run_id)  # a wrong store or id first: it would make every stage fail
    params, metrics, artifacts = stage_outputs(stage, path)
    run, existing = _start_child_run(parent_run_id, stage, name)
    numbers = {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    if run is None:
        return {"run_id": existing, "stage": stage, "name": name, "metrics": numbers, "reused": True}
    mlflow = _mlflow_at_store()
    with run:
        tracking.log_params({**params, **(extra_params or {})})
        mlflow.log_metrics(numbers)
        for artifact in artifacts:
            mlflow.log_artifact(str(artifact))
        return {"run_id": run.info.run_id, "stage": stage, "name": name, "metrics": numbers, "reused": False}


def record_stages(parent_run_id: str, records: list[dict]) -> dict:
    """`record_stage` of each of `records` ({"stage", "path", "name", "params"}) in this one process:
    the DAG records its data stages together, because a process that imports MLflow takes seconds
    to start and a stage of a small split takes less than one."""
    unknown = [r for r in records if not {"stage", "path"} <= set(r) or set(r) - {"stage", "path", "name", "params"}]
    if unknown:
        raise ValueError(f"--record needs the keys stage and path (name and params are optional), got {unknown[0]}")
    return {
        "records": [
            record_stage(parent_run_id, r["stage"], Path(r["path"]), r.get("name"), r.get("params")) for r in records
        ]
    }


def _stage_record_arg(text: str) -> dict:
    """One `--record` of record-stages: a JSON object."""
    try:
        record = json.loads(text)
    except json.JSONDecodeError as err:
        raise argparse.ArgumentTypeError(f"not JSON ({err}): {text}") from err
    if not isinstance(record, dict):
        raise argparse.ArgumentTypeError(f'a JSON object {{"stage": ..., "path": ...}} is needed, got {text}')
    return record


def lower_is_better(metric: str) -> bool:
    if any(part in metric.split("_") for part in LOWER_IS_BETTER):
        return True
    raise ValueError(
        f"metric {metric!r}: no rule says whether lower or higher is better "
        f"(known: names containing {', '.join(LOWER_IS_BETTER)}); add one to models/registry.py"
    )


def _trained_model_uri(run_id: str, experiment_id: str) -> str:
    """URI of the run's logged model "model"; the newest when a resumed trainer logged it twice."""
    mlflow = _mlflow_at_store()
    models = mlflow.search_logged_models(
        experiment_ids=[experiment_id],
        output_format="list",
        filter_string=f"source_run_id = '{run_id}' and name = 'model'",
    )
    if not models:
        raise FileNotFoundError(f"MLflow run {run_id} has no logged model named 'model': the training did not finish")
    return f"models:/{max(models, key=lambda m: m.creation_timestamp).model_id}"


LM_TAG = "speechflow.lm"  # on a logged model: the attached LM it carries (its text or graph, and settings)


def _attached_lm_tags(model_dir: Path) -> dict[str, str]:
    """The model version's tags of its attached LM: its text's sha256, order, vocabulary size and the
    settings chosen for it; a phone model's graph's (`_attached_graph_tags`); none without an LM."""
    from models.asr import lm

    attached = lm.attached(model_dir)
    if attached is None:
        return {}
    if lm.is_graph(attached):
        return _attached_graph_tags(attached)
    record, settings = lm.record_of(attached), lm.settings_of(attached)
    chosen = (read_json(attached / lm.DECODING) or {}).get("chosen_on", {})
    return {
        "speechflow.lm.text_sha256": record["text"]["sha256"],
        "speechflow.lm.order": str(record["order"]),
        "speechflow.lm.vocabulary_size": str(record["text"]["vocabulary_size"]),
        "speechflow.lm.weight": repr(settings.weight),
        "speechflow.lm.word_bonus": repr(settings.word_bonus),
        "speechflow.lm.chosen_on": str(chosen.get("split", "")),
    }


def _attached_graph_tags(attached: Path) -> dict[str, str]:
    """The tags of a phone model's attached decoding graph (models/asr/hlg.py): its kind, checksum,
    size and words, and the acoustic scale and word penalty chosen for it."""
    from models.asr import hlg, lm

    record, settings = hlg.graph_record(attached), lm.settings_of(attached)
    chosen = (read_json(attached / lm.DECODING) or {}).get("chosen_on", {})
    return {
        "speechflow.lm.kind": "hlg",
        "speechflow.lm.graph_sha256": record["hlg"]["sha256"],
        "speechflow.lm.graph_bytes": str(record["hlg"]["bytes"]),
        "speechflow.lm.words": str(record["words"]),
        "speechflow.lm.acoustic_scale": repr(settings.acoustic_scale),
        "speechflow.lm.word_penalty": repr(settings.word_penalty),
        "speechflow.lm.chosen_on": str(chosen.get("split", "")),
    }


def _logged_model_with_lm(run, model_dir: Path) -> str:
    """The URI of the run's logged model that carries the model directory as it is now: the one
    training logged, or, when a word LM was attached since (models.tune_lm --attach), the model logged
    again into the same run with it (once per LM: the newest logged model carries it after that)."""
    from common import catalog
    from common import config as configlib
    from models.training.config import TrainConfig

    uri = _trained_model_uri(run.info.run_id, run.info.experiment_id)
    tags = _attached_lm_tags(model_dir)
    if not tags:
        return uri
    stamp = json.dumps(tags, sort_keys=True)  # the LM's text, order and settings: the same ARPA
    mlflow = _mlflow_at_store()
    if mlflow.get_logged_model(uri.removeprefix("models:/")).tags.get(LM_TAG) == stamp:
        return uri
    config = configlib.load(TrainConfig, model_dir / "config.yaml")
    data = json.loads((model_dir / "data.json").read_text())
    with tracking.start_run(config.experiment, run_id=run.info.run_id):
        info = catalog.resolve(catalog.PYFUNC_LOGGER)(model_dir, config, data)
    mlflow.set_logged_model_tags(info.model_id, {LM_TAG: stamp})
    return f"models:/{info.model_id}"


def _current_champion(name: str, alias: str, metric: str):
    """(version, its metric value or None) of the model's current champion, or (None, None)."""
    from mlflow.exceptions import MlflowException

    client = tracking.client()
    try:
        current = client.get_model_version_by_alias(name, alias)
    except MlflowException as err:
        # No such model yet, or no version holds the alias yet; anything else is a real error.
        if err.error_code in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE") and "not found" in str(err):
            return None, None
        raise
    value = None
    if current.tags.get(METRIC_TAG) == metric and VALUE_TAG in current.tags:
        value = float(current.tags[VALUE_TAG])
    elif current.run_id:
        value = client.get_run(current.run_id).data.metrics.get(metric)
    return current, value


def _training_workdir(spec: str | Path) -> Path:
    """The training workdir of a model named as every command names one (models/trained_model.py)."""
    if str(spec).startswith(("models:/", "runs:/")):
        raise ValueError(f"{spec} is in the registry already: register takes a training workdir or its model/")
    path = Path(spec)
    if path.name == "model" and (path / "config.yaml").is_file():
        return path.parent
    return path


def register(workdir: Path, name: str, parent_run_id: str | None = None, alias: str = ALIAS) -> dict:
    """Registers the model trained in `workdir` as a version of `name`; moves `alias` to it only when
    its primary metric (eval.json) beats the current holder's (lower is better). `workdir` may
    also name its model/ (models/trained_model.py); a registry URI is refused: it is registered already.
    Writes the result to `workdir`/registered.json and, with a parent run, to a child run of it."""
    workdir = _training_workdir(workdir)
    trained = tracking.load_run_file(workdir)
    if trained is None:
        raise FileNotFoundError(f"{workdir / tracking.RUN_FILE} does not exist: train into {workdir} first")
    metric, value = _primary_metric(workdir)
    client = tracking.client()
    run = client.get_run(trained["run_id"])
    version = _model_version(name, run, _logged_model_with_lm(run, workdir / "model"))
    tags = {METRIC_TAG: metric, VALUE_TAG: repr(value), "speechflow.workdir": str(workdir.resolve())}
    tags.update(_attached_lm_tags(workdir / "model"))
    if parent_run_id:
        tags["speechflow.parent_run_id"] = parent_run_id
    for key, val in tags.items():
        client.set_model_version_tag(name, version.version, key, val)
    current, current_value = _current_champion(name, alias, metric)
    promoted, reason = _promotion(name, alias, version.version, metric, value, current, current_value)
    if promoted:
        client.set_registered_model_alias(name, alias, version.version)
    result = {
        "name": name,
        "version": int(version.version),
        "run_id": run.info.run_id,
        "metric": metric,
        "value": value,
        "alias": alias,
        "promoted": promoted,
        "reason": reason,
        "champion_version": int(version.version) if promoted else (int(current.version) if current else None),
        "previous_champion_version": int(current.version) if current is not None else None,
        "previous_champion_value": current_value,
        "model_uri": f"models:/{name}/{version.version}",
    }
    atomic_write_json(workdir / REGISTERED_FILE, result)
    if parent_run_id:
        _log_registration(parent_run_id, result)
    return result


def _primary_metric(workdir: Path) -> tuple[str, float]:
    """(name, value) of the primary metric the evaluation in `workdir`/eval.json names."""
    evaluation = _required_json(workdir / "eval.json", f"python -m models.evaluate --model {workdir} ...")
    metric = evaluation.get("primary_metric")
    if metric not in evaluation:
        raise ValueError(
            f"{workdir / 'eval.json'} names primary metric {metric!r} but holds no value for it; "
            f"evaluate again with python -m models.evaluate --model {workdir}"
        )
    value = float(evaluation[metric])
    lower_is_better(metric)
    return metric, value


def _model_version(name: str, run, logged: str):
    """The version of `name` that holds the logged model `logged` of the training `run`: found again
    (a retry registers nothing twice) or registered now."""
    existing = [
        v
        for v in tracking.client().search_model_versions(f"name = '{name}' and run_id = '{run.info.run_id}'")
        if v.source == logged or getattr(v, "model_id", None) == logged.removeprefix("models:/")
    ]
    if existing:
        return max(existing, key=lambda v: int(v.version))
    return _mlflow_at_store().register_model(logged, name)


def _promotion(name: str, alias: str, version: str, metric: str, value: float, current, current_value):
    """(whether `version` takes `alias` from `current`, the holder whose `metric` is `current_value`; why)."""
    if current is not None and current.version == version:
        return False, f"version {version} already holds '{alias}'"
    if math.isnan(value):
        return False, f"{metric} is NaN"
    if current is None:
        return True, f"{name} had no '{alias}'"
    if current_value is None or math.isnan(current_value):
        return False, f"'{alias}' (version {current.version}) has no {metric} to compare with"
    if value < current_value:
        return True, f"{metric} {value:.4g} < {current_value:.4g} of version {current.version}"
    return False, f"{metric} {value:.4g} does not beat {current_value:.4g} of version {current.version}"


def _log_registration(parent_run_id: str, result: dict) -> None:
    """The registration `result` as a child run of the DAG run's parent (once: a retry finds it)."""
    child, _ = _start_child_run(parent_run_id, "register", f"register-{result['name']}")
    if child is None:
        return
    mlflow = _mlflow_at_store()
    with child:
        tracking.log_params({k: result[k] for k in ("name", "version", "run_id", "metric", "alias")})
        mlflow.log_metric(result["metric"], result["value"])
        mlflow.set_tags({"speechflow.promoted": str(result["promoted"]), "speechflow.reason": result["reason"]})


def finish_parent_run(parent_run_id: str, status: str, workdirs: dict[str, Path], summary_file: Path | None) -> dict:
    """Ends the parent run with `status` and writes (and logs) a summary of the models' outcomes."""
    if status not in ("FINISHED", "FAILED", "KILLED"):
        raise ValueError(f"--status must be FINISHED, FAILED or KILLED, got {status!r}")
    parent = _parent_run(parent_run_id)
    models = {}
    for model, workdir in workdirs.items():
        evaluation = read_json(Path(workdir) / "eval.json") or {}
        models[model] = {
            "workdir": str(Path(workdir).resolve()),
            "metrics": {k: v for k, v in evaluation.items() if isinstance(v, (int, float)) and not isinstance(v, bool)},
            "primary_metric": evaluation.get("primary_metric"),
            "registered": read_json(Path(workdir) / REGISTERED_FILE),
            "training_run_id": (tracking.load_run_file(Path(workdir)) or {}).get("run_id"),
        }
    summary = {
        "parent_run_id": parent_run_id,
        "experiment_id": parent.info.experiment_id,
        "status": status,
        "tracking_uri": tracking.tracking_uri(),
        "dag_id": parent.data.tags.get(DAG_ID_TAG),
        "dag_run_id": parent.data.tags.get(DAG_RUN_TAG),
        "models": models,
    }
    client = tracking.client()
    if summary_file is not None:
        atomic_write_json(Path(summary_file), summary)
        client.log_artifact(parent_run_id, str(summary_file))
    for model, info in models.items():
        if info["primary_metric"] in info["metrics"]:
            client.log_metric(
                parent_run_id, f"{model}.{info['primary_metric']}", info["metrics"][info["primary_metric"]]
            )
    client.set_terminated(parent_run_id, status)
    return summary


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m models.registry", description=__doc__.split("\n\n")[0])
    p.add_argument("--json-file", type=Path, help="also write the JSON result to this file")
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("start-parent", help="find or create the DAG run's parent run")
    s.add_argument("--experiment", required=True, help="MLflow experiment name")
    s.add_argument("--dag-id", required=True, help="Airflow DAG id")
    s.add_argument("--dag-run-id", required=True, help="Airflow DAG run id")
    s = sub.add_parser("record-stage", help="a child run with a data stage's params, counts and small files")
    s.add_argument("--parent-run-id", required=True, help="the DAG run's parent run")
    s.add_argument("--stage", required=True, choices=["corpus", "features", "shards"], help="which stage made --path")
    s.add_argument("--path", required=True, type=Path, help="the stage's output directory")
    s.add_argument("--name", help="child run name (default: the stage), e.g. features-train")
    s.add_argument("--param", action="append", default=[], metavar="KEY=VALUE", help="an extra param to log")
    s = sub.add_parser("record-stages", help="record-stage for several stages in one process")
    s.add_argument("--parent-run-id", required=True, help="the DAG run's parent run")
    s.add_argument(
        "--record",
        required=True,
        action="append",
        type=_stage_record_arg,
        metavar="JSON",
        help='one stage: {"stage": "features", "path": DIR, "name": "features-train", "params": {"split": "train"}}',
    )
    s = sub.add_parser("register", help="register a workdir's model; move the alias if it is better")
    s.add_argument(
        "--workdir", required=True, type=Path, help="training workdir (mlflow_run.json, eval.json) or its model/"
    )
    s.add_argument("--name", required=True, help="registered model name, e.g. speechflow-asr")
    s.add_argument("--parent-run-id", help="record the decision in a child run of this run")
    s.add_argument("--alias", default=ALIAS, help=f"the alias of the best version (default {ALIAS})")
    s = sub.add_parser("finish", help="end the parent run and write a summary")
    s.add_argument("--parent-run-id", required=True, help="the DAG run's parent run")
    s.add_argument(
        "--status", default="FINISHED", choices=["FINISHED", "FAILED", "KILLED"], help="the parent run's end state"
    )
    s.add_argument("--workdir", action="append", default=[], metavar="MODEL=DIR", help="a trained model's workdir")
    s.add_argument("--summary", type=Path, help="write the summary JSON here (and log it to the parent run)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        if args.command == "start-parent":
            result = start_parent_run(args.experiment, args.dag_id, args.dag_run_id)
        elif args.command == "record-stage":
            result = record_stage(
                args.parent_run_id, args.stage, args.path, args.name, cli.parse_pairs(args.param, "--param")
            )
        elif args.command == "record-stages":
            result = record_stages(args.parent_run_id, args.record)
        elif args.command == "register":
            result = register(args.workdir, args.name, args.parent_run_id, args.alias)
        else:
            workdirs = {k: Path(v) for k, v in cli.parse_pairs(args.workdir, "--workdir").items()}
            result = finish_parent_run(args.parent_run_id, args.status, workdirs, args.summary)
    except (ValueError, FileNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    if args.json_file:
        args.json_file.parent.mkdir(parents=True, exist_ok=True)
        args.json_file.write_text(json.dumps(result, sort_keys=True) + "\n", encoding="utf-8")
    print(json.dumps(result, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
