"""What the DAG's tasks call: run a stage, run an MLflow step, train, read results.

Each runs a command line from workflow/commands.py either as a child process of the training
environment (local mode, workflow/local.py) or as a pod of the training image (cluster mode; training
as an MPIJob, workflow/mpijob.py). With `data_service_workers`, training reads its batches from a
tf.data service that lives as long as the training: child processes on 127.0.0.1 (local), or a
dispatcher and worker Deployments beside the MPIJob (cluster). Nothing here imports TensorFlow or
MLflow: MLflow work goes through `python -m models.registry` in the training environment, and Airflow
and Kubernetes are imported inside the functions that need them, so the tests load this module from
either environment.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from common.fsutil import atomic_write_json, read_json
from workflow import commands
from workflow.local import REPO, StageError, child_env, end_group, run_command
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

    from workflow import pods

    pod = pods.render_stage_pod(pod_name(plan, stage), module, args, settings or cluster_settings(), gpus=gpus)
    return KubernetesPodOperator(task_id=task_id, do_xcom_push=xcom, **pods.stage_pod_operator_kwargs(pod))


def training_job(plan: Plan, model: str, parent_run_id: str, settings=None, data_service: str | None = None) -> dict:
    """The MPIJob manifest that trains `model` for this run (reading from `data_service` when given)."""
    from workflow.cluster import safe_name
    from workflow.training_job import render_mpijob

    return render_mpijob(
        safe_name(f"train-{model}", plan.dag_run_id),
        commands.plan_train_args(plan, model, parent_run_id, data_service=data_service),
        plan.num_workers,
        plan.gpus_per_worker,
        settings or cluster_settings(),
    )


# ---- tf.data service for the duration of a training ----------------------------------------------


def data_service_dir(plan: Plan, model: str) -> str:
    """Where a training's tf.data service keeps its files: logs (local), the dispatcher's journals (cluster)."""
    return f"{plan.run_dir}/data-service/{model}"


@contextlib.contextmanager
def local_data_service(
    plan: Plan, model: str, emit: Callable[[str], None] = log.info, start_timeout_s: float = 180
) -> Iterator[str]:
    """A dispatcher and `plan.data_service_workers` workers on 127.0.0.1, child processes of the training
    environment (`python -m pipeline.data_service`), for the duration of the `with` block.

    Yields the dispatcher's grpc://127.0.0.1:PORT once every server listens. Each server binds a port
    of its own choosing and writes it to DIR/NAME.port, so no other process can take a port between
    its choice and its use. Each server's output goes to DIR/NAME.log (`data_service_dir`); each runs
    in a process group of its own, ended (SIGTERM, then SIGKILL) when the block ends, whether the
    training succeeded or not. Raises StageError, with the log's last lines, when a server exits or
    does not listen within `start_timeout_s`.
    """
    log_dir = Path(data_service_dir(plan, model))
    log_dir.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + start_timeout_s
    with contextlib.ExitStack() as stack:

        def start(name: str, args: list[str]) -> Callable[[], int]:
            port_file = log_dir / f"{name}.port"
            port_file.unlink(missing_ok=True)  # a port file of an earlier attempt names a port long gone
            out = stack.enter_context(open(log_dir / f"{name}.log", "wb"))
            proc = subprocess.Popen(
                commands.module_command(plan.python, commands.DATA_SERVICE, [*args, "--port-file", str(port_file)]),
                cwd=REPO,
                env=child_env(),
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            stack.callback(end_group, proc)  # runs before the log file closes (last in, first out)
            return lambda: _wait_for_port(name, proc, port_file, log_dir, deadline, start_timeout_s)

        dispatcher = start("dispatcher", commands.dispatcher_args(0))()
        workers = [
            start(f"worker-{i}", commands.worker_args(f"127.0.0.1:{dispatcher}", 0, "127.0.0.1:%port%"))
            for i in range(plan.data_service_workers)
        ]  # started together, then waited for
        for listening in workers:
            listening()
        address = f"grpc://127.0.0.1:{dispatcher}"
        emit(f"tf.data service: dispatcher {address}, {plan.data_service_workers} worker(s); logs in {log_dir}")
        yield address
        emit("stopping the tf.data service")


def _wait_for_port(
    name: str, proc: subprocess.Popen, port_file: Path, log_dir: Path, deadline: float, timeout_s: float
) -> int:
    """The port server `name` wrote to `port_file` once it listens (pipeline/data_service.py)."""
    while True:
        if proc.poll() is not None:
            tail = (log_dir / f"{name}.log").read_text(errors="replace").splitlines()[-20:]
            raise StageError(
                f"tf.data service {name} exited with {proc.returncode}; the end of {log_dir / name}.log:\n"
                + "\n".join(tail)
            )
        with contextlib.suppress(FileNotFoundError):
            return int(port_file.read_text())  # renamed into place whole: present means complete
        if time.monotonic() > deadline:
            raise StageError(f"tf.data service {name} not listening after {timeout_s:.0f} s; see {log_dir}/*.log")
        time.sleep(0.2)


def kubernetes_apps_api():
    """AppsV1Api of Airflow's Kubernetes connection (the data service's Deployments)."""
    from airflow.providers.cncf.kubernetes.hooks.kubernetes import KubernetesHook

    return KubernetesHook().apps_v1_client


def data_service_name(plan: Plan, model: str) -> str:
    """Base name of the data service objects beside `model`'s MPIJob (NAME-dispatcher, NAME-worker)."""
    from workflow.cluster import safe_name

    return safe_name(f"data-{model}", plan.dag_run_id)


def data_service_objects(plan: Plan, model: str, attempt: int = 1, settings=None) -> list[dict]:
    """The tf.data service (Service, dispatcher and worker Deployments) beside `model`'s MPIJob; the
    dispatcher journals into a directory of this task attempt's own on the data claim."""
    from workflow import pods

    return pods.render_data_service(
        data_service_name(plan, model),
        plan.data_service_workers,
        settings or cluster_settings(),
        work_dir=f"{data_service_dir(plan, model)}/try-{attempt}",
    )


def _delete_object(obj: Mapping[str, Any], core_api, apps_api) -> bool:
    name, namespace = obj["metadata"]["name"], obj["metadata"]["namespace"]
    try:
        if obj["kind"] == "Service":
            core_api.delete_namespaced_service(name, namespace)
        else:
            # Background: the Deployment goes at once (a retry may create it again under its name),
            # its pods follow.
            apps_api.delete_namespaced_deployment(name, namespace, propagation_policy="Background")
    except Exception as err:
        if getattr(err, "status", None) == 404:
            return False
        raise
    return True


@contextlib.contextmanager
def cluster_data_service(
    objects: Sequence[Mapping[str, Any]], core_api, apps_api, emit: Callable[[str], None] = log.info
) -> Iterator[None]:
    """Creates the data service's objects (after deleting an earlier attempt's) for the duration of the
    `with` block, and deletes them when it ends, whether the training succeeded or not. The training
    ranks wait for the dispatcher to answer, so the MPIJob need not wait for its pods."""
    for obj in objects:
        if _delete_object(obj, core_api, apps_api):
            emit(f"deleted {obj['kind']} {obj['metadata']['name']} of an earlier attempt")
    try:
        for obj in objects:
            namespace = obj["metadata"]["namespace"]
            if obj["kind"] == "Service":
                core_api.create_namespaced_service(namespace, obj)
            else:
                apps_api.create_namespaced_deployment(namespace, obj)
            emit(f"created {obj['kind']} {namespace}/{obj['metadata']['name']}")
        yield
    finally:
        for obj in objects:
            _delete_object(obj, core_api, apps_api)
        emit(f"deleted the tf.data service ({', '.join(o['metadata']['name'] for o in objects)})")


def run_stage(
    plan: Plan, context: Mapping[str, Any], stage: str, module: str, args: Sequence[str], gpus: int = 0
) -> float:
    """Runs `python -m MODULE ARGS`: a child process (local) or a pod (kubernetes); returns its wall seconds."""
    started = time.monotonic()
    if plan.mode == "local":
        run_command(commands.module_command(plan.python, module, args))
    else:
        stage_operator(plan, stage, module, args, f"{context['ti'].task_id}-pod", gpus=gpus).execute(context)
    return round(time.monotonic() - started, 1)


# ---- the word LM and a phone model's decoding graph, with their figures for the run's summary -----


def _lm_text_figures(record: Mapping[str, Any]) -> dict:
    """pipeline/lm_text.py's lm_text.json: the text's size, what left it, each split's OOV rate and 3-gram share."""
    text, coverage = record.get("text", {}), record.get("coverage", {})
    return {
        **{k: text.get(k) for k in ("sentences", "words", "vocabulary_size")},
        "dropped": record.get("dropped", {}),
        "oov_rate": {split: row.get("oov_rate") for split, row in coverage.items()},
        "trigram_share": {split: row.get("trigram_share") for split, row in coverage.items()},
    }


def _lexicon_figures(record: Mapping[str, Any]) -> dict:
    """text_lexicon.json (pipeline/cmudict_lexicon.py's or text_lexicon.py's): its counts (words, phones, ...)."""
    return {k: v for k, v in record.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


def _lm_figures(record: Mapping[str, Any]) -> dict:
    """pipeline/lm.py's lm.json: the order, the text's size and the n-gram counts."""
    text = record.get("text", {})
    return {
        "order": record.get("order"),
        **{k: text.get(k) for k in ("sentences", "words", "vocabulary_size")},
        "ngrams": record.get("arpa", {}).get("ngrams"),
    }


def _graph_figures(record: Mapping[str, Any]) -> dict:
    """pipeline/lang.py's lang.json: HLG's states, arcs and bytes, its build seconds, the tables' sizes,
    and the LM words G2P spelled or none could."""
    hlg = record.get("hlg", {})
    keys = ("num_outputs", "words", "g2p_filled", "lm_words_unspelled", "build_seconds")
    return {**{k: hlg.get(k) for k in ("states", "arcs", "bytes")}, **{k: record.get(k) for k in keys}}


# stage -> (its module, or a function of the plan giving it; its command line; the plan's field of its directory;
# its done marker there; its figures)
RECORDED_STAGES = {
    "lm_text": (commands.LM_TEXT, commands.lm_text_args, "lm_text_dir", "lm_text.json", _lm_text_figures),
    "lexicon": (commands.lexicon_module, commands.lexicon_args, "lexicon_dir", "text_lexicon.json", _lexicon_figures),
    "lm": (commands.LM, commands.lm_args, "lm_dir", "lm.json", _lm_figures),
    "graph": (commands.LANG, commands.graph_args, "lang_dir", "lang.json", _graph_figures),
}


def run_recorded_stage(plan: Plan, context: Mapping[str, Any], stage: str) -> dict:
    """Runs `stage` of RECORDED_STAGES; returns {"stage", "dir", "seconds" (its wall time, a stage found
    up to date included), "figures" (of its done marker; {} in cluster mode: the Airflow pods lack the data)}."""
    module, args, field, _, _ = RECORDED_STAGES[stage]
    module = module(plan) if callable(module) else module  # the lexicon's: the form's `lexicon` chooses it
    seconds = run_stage(plan, context, stage.replace("_", "-"), module, args(plan))
    return {"stage": stage, "dir": getattr(plan, field), "seconds": seconds, "figures": stage_figures(plan, stage)}


def stage_figures(plan: Plan, stage: str) -> dict:
    """The figures of `stage`'s done marker (RECORDED_STAGES); {} in cluster mode or when it is missing."""
    _, _, field, marker, figures = RECORDED_STAGES[stage]
    record = read_json(Path(getattr(plan, field)) / marker) if plan.mode == "local" else None
    return figures(record) if isinstance(record, dict) else {}


def add_stages_to_summary(plan: Plan, done: Sequence[Mapping[str, Any] | None]) -> dict[str, dict]:
    """{stage: {"dir", "seconds", "figures"}} of `done` (what `run_recorded_stage` returned; None: a stage
    skipped); in local mode also RUN_DIR/summary.json's `stages` (models.registry finish writes the file)."""
    stages = {d["stage"]: {k: v for k, v in d.items() if k != "stage"} for d in done if d}
    summary = Path(plan.run_dir) / "summary.json"
    written = read_json(summary) if plan.mode == "local" else None
    if stages and isinstance(written, dict):
        atomic_write_json(summary, {**written, "stages": stages})
    return stages


def run_mlflow_step(plan: Plan, context: Mapping[str, Any], stage: str, args: Sequence[str]) -> dict:
    """Runs an MLflow step of the run, `python -m models.registry ARGS` (start or finish the parent run,
    record the data stages, register a model), and returns the JSON it prints."""
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
    """Trains `model`: horovodrun here, or an MPIJob on the cluster, each with its tf.data service when
    `commands.uses_data_service`. Returns what is known of the run."""
    args = commands.plan_train_args(plan, model, parent_run_id)
    workdir = Path(plan.workdirs[model])
    with_service = commands.uses_data_service(plan, model)
    if plan.mode != "local":
        from workflow import mpijob, pods

        settings = cluster_settings()
        custom_api, core_api = mpijob.kubernetes_apis()
        result = {"model": model, "workdir": str(workdir)}
        service, address = contextlib.nullcontext(), None
        if with_service:
            objects = data_service_objects(plan, model, context["ti"].try_number, settings)
            address = pods.data_service_address(data_service_name(plan, model))
            service = cluster_data_service(objects, core_api, kubernetes_apps_api())
            result["data_service"] = address
        with service:
            manifest = training_job(plan, model, parent_run_id, settings, data_service=address)
            mpijob.run_mpijob(manifest, custom_api, core_api)
        return {**result, "mpijob": manifest["metadata"]["name"]}
    # A finished training of the same command is not repeated (the trainer would resume at its
    # last step and log the model once more). The data service's address changes from run to run
    # and is not part of the key.
    marker = workdir / ".dag_train.done.json"
    key = hashlib.sha256(json.dumps(args).encode()).hexdigest()
    done = read_json(marker)
    if done is None or done.get("key") != key:
        with local_data_service(plan, model) if with_service else contextlib.nullcontext() as address:
            if address:
                args = commands.plan_train_args(plan, model, parent_run_id, data_service=address)
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
