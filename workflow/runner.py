"""What the DAG's tasks call: run a stage, run the registry, train, read results.

Each runs a command line from workflow/commands.py either as a child process of the training
environment (local mode, workflow/local.py) or as a pod of the training image (cluster mode; training
as an MPIJob, workflow/mpijob.py). Nothing here imports TensorFlow or MLflow: MLflow work goes
through `python -m models.registry` in the training environment, and Airflow and Kubernetes are
imported inside the functions that need them, so the tests load this module from either environment.
"""

from __future__ import annotations

import hashlib
import json
import logging
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from common.fsutil import atomic_write_json, read_json
from workflow import commands
from workflow.local import run_command
from workflow.plan import Plan, cluster_settings

log = logging.getLogger(__name__)


def pod_name(plan: Plan, stage: str) -> str:
    from workflow.cluster import safe_name

    # The operator appends a random suffix of 9 characters; pod names may have 63.
    return safe_name(stage, plan.dag_run_id, max_len=50)


def stage_operator(
    plan: Plan,
    stage: str,
    module: str,
    args: Sequence[str],
    task_id: str,
    xcom: bool = False,
    gpus: int = 0,
    settings=None,
):
    """The KubernetesPodOperator that runs `python -m MODULE ARGS` in a pod of the training image."""
    from airflow.providers.cncf.kubernetes.operators.pod import KubernetesPodOperator

    from workflow import manifests

    pod = manifests.render_stage_pod(pod_name(plan, stage), module, args, settings or cluster_settings(), gpus=gpus)
    return KubernetesPodOperator(task_id=task_id, do_xcom_push=xcom, **manifests.stage_pod_operator_kwargs(pod))


def training_job(plan: Plan, model: str, parent_run_id: str, settings=None) -> dict:
    """The MPIJob manifest that trains `model` for this run."""
    from workflow import manifests
    from workflow.cluster import safe_name

    return manifests.render_mpijob(
        safe_name(f"train-{model}", plan.dag_run_id),
        commands.plan_train_args(plan, model, parent_run_id),
        plan.num_workers,
        plan.gpus_per_worker,
        settings or cluster_settings(),
    )


def run_stage(
    plan: Plan, context: Mapping[str, Any], stage: str, module: str, args: Sequence[str], gpus: int = 0
) -> None:
    """Runs `python -m MODULE ARGS`: a child process (local) or a pod (kubernetes)."""
    if plan.mode == "local":
        run_command(commands.module_command(plan.python, module, args))
    else:
        stage_operator(plan, stage, module, args, f"{context['ti'].task_id}-pod", gpus=gpus).execute(context)


def registry(plan: Plan, context: Mapping[str, Any], stage: str, args: Sequence[str]) -> dict:
    """Runs `python -m models.registry ARGS` and returns the JSON it prints."""
    if plan.mode != "local":
        op = stage_operator(
            plan, stage, commands.REGISTRY, commands.with_json_file(args), f"{context['ti'].task_id}-pod", xcom=True
        )
        return op.execute(context)
    with tempfile.TemporaryDirectory(prefix="speechflow-registry-") as tmp:
        out = Path(tmp) / "result.json"
        run_command(commands.module_command(plan.python, commands.REGISTRY, commands.with_json_file(args, str(out))))
        return json.loads(out.read_text())


def run_training(plan: Plan, context: Mapping[str, Any], model: str, parent_run_id: str) -> dict:
    """Trains `model`: horovodrun here, or an MPIJob on the cluster. Returns what is known of the run."""
    args = commands.plan_train_args(plan, model, parent_run_id)
    workdir = Path(plan.workdirs[model])
    if plan.mode != "local":
        from workflow import mpijob

        manifest = training_job(plan, model, parent_run_id)
        custom_api, core_api = mpijob.kubernetes_apis()
        mpijob.run_mpijob(manifest, custom_api, core_api)
        return {"model": model, "workdir": str(workdir), "mpijob": manifest["metadata"]["name"]}
    # A finished training of the same command is not repeated (the trainer would resume at its
    # last step and log the model once more).
    marker = workdir / ".dag_train.done.json"
    key = hashlib.sha256(json.dumps(args).encode()).hexdigest()
    done = read_json(marker)
    if done is None or done.get("key") != key:
        run_command(commands.horovodrun_local(plan.python, plan.num_workers, commands.TRAIN, args))
        summary = read_json(workdir / "train_summary.json") or {}
        done = {"key": key, "summary": {k: v for k, v in summary.items() if not isinstance(v, (dict, list))}}
        atomic_write_json(marker, done)  # whole or absent, never half written
    else:
        log.info("%s already holds this training (%s); not repeating it", workdir, marker.name)
    summary = done["summary"]
    return {
        "model": model,
        "workdir": str(workdir),
        "run_id": summary.get("run_id"),
        "steps": summary.get("steps"),
        "final_loss": summary.get("final_loss"),
    }


def evaluation_gpus(plan: Plan) -> int:
    """One GPU for an evaluation pod when the training workers have GPUs; none locally."""
    if plan.mode == "local":
        return 0
    gpus = plan.gpus_per_worker if plan.gpus_per_worker is not None else cluster_settings().gpus_per_worker
    return min(gpus, 1)


def read_eval(plan: Plan, model: str) -> dict:
    """Local mode: the metrics models.evaluate wrote; cluster mode: {} (the Airflow pods lack the data)."""
    if plan.mode != "local":
        return {}
    return read_json(Path(plan.workdirs[model]) / "eval.json") or {}


def failed_tasks(task_states: Mapping[str, str | None]) -> list[str]:
    return sorted(t for t, s in task_states.items() if s in ("failed", "upstream_failed"))
