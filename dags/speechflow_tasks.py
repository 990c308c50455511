"""What the tasks of `speech_pipeline` run, kept out of the DAG file so that the DAG only wires.

A `Plan` (built once per DAG run from its params) fixes every path; pure functions turn it into the
command line of each stage; `run_stage` runs one either as a child process of the training
environment (local mode) or as a pod of the training image (cluster mode), and `run_training` runs
`horovodrun` locally or submits an MPIJob. Nothing here imports TensorFlow or MLflow: MLflow work
goes through `python -m models.registry` in the training environment, and Airflow and Kubernetes
are imported inside the functions that need them, so the tests load this module from either
environment.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import re
import signal
import subprocess
import tempfile
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

REPO = Path(__file__).resolve().parents[1]
SPLITS = ("train", "dev", "test", "test_noisy")  # of the demo corpus; train and test are required
REQUIRED_SPLITS = ("train", "test")
MODELS = ("asr", "tts")
# Cluster mode: where the training image keeps the project's files (configs/ of relative paths)
# and the file the KubernetesPodOperator reads a pod's XCom from.
IMAGE_PROJECT_DIR = "/opt/speechflow"
POD_XCOM_FILE = "/airflow/xcom/return.json"


class StageError(RuntimeError):
    """A stage's command failed; the message names the command and ends with its last output lines."""


@dataclasses.dataclass(frozen=True)
class Plan:
    """Everything a DAG run does, resolved from its params: paths, models and how to run them."""

    dag_id: str  # Airflow DAG id (MLflow tag of the parent run)
    dag_run_id: str  # Airflow run id (MLflow tag; the run directory is named after it)
    mode: str  # "local" (child processes) or "kubernetes" (pods and an MPIJob)
    run_dir: str  # run-scoped work directory: shards/, asr/, tts/, summary.json (corpus/ for the demo)
    make_corpus: bool  # no data_dir given: build the demo corpus into data_root first
    data_root: str  # the Kaldi data root: one directory per split
    demo_utterances: int  # size of the demo corpus
    splits: tuple[str, ...]  # the splits to featurize and shard
    shards_dir: str  # TFRecord shards and manifest.json
    num_shards: int  # shards per split (>= num_workers)
    models: tuple[str, ...]  # which models to train, of MODELS
    workdirs: dict[str, str]  # model -> its training workdir
    configs: dict[str, str]  # model -> its training config file
    strategy: str  # allreduce or adpsgd
    gossip: str  # adpsgd's gossip variant
    num_workers: int  # Horovod processes (local) or worker pods (cluster)
    gpus_per_worker: int | None  # cluster: GPUs per worker pod; None: the cluster settings' value
    epochs: int | None  # None: the config file's value
    max_steps: int | None  # None: the config file's value
    eval_utterances: int  # tts: utterances to synthesize in the evaluation
    experiment: str  # MLflow experiment; registered models are named EXPERIMENT-MODEL
    python: str  # local: the training environment's python

    def to_xcom(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_xcom(cls, value: Mapping[str, Any]) -> Plan:
        value = dict(value)
        value["splits"], value["models"] = tuple(value["splits"]), tuple(value["models"])
        return cls(**value)

    def model_name(self, model: str) -> str:
        return f"{self.experiment}-{model}"


def path_slug(text: str, max_len: int = 28) -> str:
    """A short directory name from a run id, with a hash of it when changed.

    `manual__2026-01-01T00:00:00.123456+00:00` -> `manual__2026-01-01T00_00_00-1a2b3c4d`. Short, because
    the paths under it end up in MLflow fields of limited length.
    """
    slug = (re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("._") or "run")[:max_len].rstrip("._")
    return slug if slug == text else f"{slug}-{hashlib.sha256(text.encode()).hexdigest()[:8]}"


def default_work_root(mode: str) -> str:
    """SPEECHFLOW_WORK_ROOT, else `.runs/pipeline` in the repository (local) or `/data/runs` (cluster)."""
    if os.environ.get("SPEECHFLOW_WORK_ROOT"):
        return os.environ["SPEECHFLOW_WORK_ROOT"]
    if mode == "local":
        return str(REPO / ".runs" / "pipeline")
    return f"{cluster_settings().data_mount}/runs"


def training_python() -> str:
    return os.environ.get("SPEECHFLOW_PYTHON") or str(REPO / ".venv" / "bin" / "python")


def _resolve(path: str, mode: str) -> str:
    """Relative paths are the repository's (local) or the training image's project files (cluster)."""
    if not path or Path(path).is_absolute() or "://" in path:
        return path
    return str(REPO / path) if mode == "local" else f"{IMAGE_PROJECT_DIR}/{path}"


def _has_data(split_dir: Path) -> bool:
    return (split_dir / "wav.scp").is_file() or (split_dir / "feats.scp").is_file()


def make_plan(params: Mapping[str, Any], dag_id: str, dag_run_id: str) -> Plan:
    """The run's Plan from the DAG params; ValueError naming the param when they do not fit together."""
    mode = params["execution_mode"]
    if mode not in ("local", "kubernetes"):
        raise ValueError(f"execution_mode must be 'local' or 'kubernetes', got {mode!r}")
    models = tuple(m for m in MODELS if m in params["models"])
    unknown = sorted(set(params["models"]) - set(MODELS))
    if unknown or not models:
        raise ValueError(f"models must be a non-empty selection of {list(MODELS)}, got {params['models']!r}")
    num_workers, num_shards = int(params["num_workers"]), int(params["num_shards"])
    if num_workers < 1:
        raise ValueError(f"num_workers must be at least 1, got {num_workers}")
    if num_shards < num_workers:
        raise ValueError(
            f"num_shards ({num_shards}) must be at least num_workers ({num_workers}): "
            f"every training worker reads its own shards"
        )
    # Short on purpose: the paths of the Kaldi directories under it end up in MLflow fields of limited length.
    run_dir = str(Path(params.get("work_root") or default_work_root(mode)) / path_slug(dag_run_id))
    if mode == "local":
        run_dir = str(Path(_resolve(run_dir, mode)).resolve())
    data_dir = (params.get("data_dir") or "").strip()
    if data_dir:
        data_root = _resolve(data_dir, mode)
        if mode == "local":
            root = Path(data_root)
            missing = [s for s in REQUIRED_SPLITS if not _has_data(root / s)]
            if missing:
                raise ValueError(
                    f"data_dir {root}: no Kaldi data directory (wav.scp or feats.scp) for split(s) "
                    f"{missing}; it needs {list(REQUIRED_SPLITS)} and may have dev and test_noisy"
                )
            splits = tuple(s for s in SPLITS if _has_data(root / s))
        else:
            splits = ("train", "dev", "test")  # the Airflow pods do not mount the data: the standard three
    else:
        data_root, splits = f"{run_dir}/corpus", SPLITS
    configs = {m: _resolve(params[f"{m}_config"], mode) for m in MODELS}
    if mode == "local":
        for model in models:
            if not Path(configs[model]).is_file():
                raise ValueError(f"{model}_config: {configs[model]} does not exist")
    return Plan(
        dag_id=dag_id,
        dag_run_id=dag_run_id,
        mode=mode,
        run_dir=run_dir,
        make_corpus=not data_dir,
        data_root=data_root,
        demo_utterances=int(params["demo_utterances"]),
        splits=splits,
        shards_dir=f"{run_dir}/shards",
        num_shards=num_shards,
        models=models,
        workdirs={m: f"{run_dir}/{m}" for m in MODELS},
        configs=configs,
        strategy=params["strategy"],
        gossip=params["gossip"],
        num_workers=num_workers,
        gpus_per_worker=params.get("gpus_per_worker"),
        epochs=params.get("epochs"),
        max_steps=params.get("max_steps"),
        eval_utterances=int(params["eval_utterances"]),
        experiment=params["experiment"],
        python=training_python(),
    )


# ---- command lines -------------------------------------------------------------------------------


def corpus_args(plan: Plan) -> list[str]:
    return ["--out", plan.data_root, "--num-utterances", str(plan.demo_utterances)]


def features_args(plan: Plan, split: str) -> list[str]:
    return ["--data-dir", f"{plan.data_root}/{split}", "--no-progress"]


def shards_args(plan: Plan) -> list[str]:
    args = [a for s in plan.splits for a in ("--split", f"{s}={plan.data_root}/{s}")]
    return [*args, "--out", plan.shards_dir, "--num-shards", str(plan.num_shards), "--no-progress"]


def train_args(plan: Plan, model: str, parent_run_id: str) -> list[str]:
    """Arguments of `python -m models.train` (after `horovodrun ... python -m models.train`)."""
    args = ["--model", model, "--strategy", plan.strategy]
    if plan.strategy == "adpsgd":
        args += ["--gossip", plan.gossip]
    args += ["--shards", plan.shards_dir, "--workdir", plan.workdirs[model], "--config", plan.configs[model]]
    if plan.epochs is not None:
        args += ["--epochs", str(plan.epochs)]
    if plan.max_steps is not None:
        args += ["--max-steps", str(plan.max_steps)]
    return args + [
        "--experiment",
        plan.experiment,
        "--mlflow-parent-run-id",
        parent_run_id,
        "--run-name",
        f"train-{model}",
    ]


def evaluate_args(plan: Plan, model: str, parent_run_id: str, with_asr: bool) -> list[str]:
    args = [
        "--model-dir",
        plan.workdirs[model],
        "--shards",
        plan.shards_dir,
        "--mlflow-parent-run-id",
        parent_run_id,
    ]
    if model == "tts":
        args += ["--max-utterances", str(plan.eval_utterances)]
        if with_asr:
            args += ["--asr-model-dir", plan.workdirs["asr"]]
    return args


def local_train_command(plan: Plan, args: Sequence[str]) -> list[str]:
    """`horovodrun -np N -H localhost:N --gloo PYTHON -m models.train ARGS` of the training environment."""
    horovodrun = str(Path(plan.python).with_name("horovodrun"))
    n = str(plan.num_workers)
    return [horovodrun, "-np", n, "-H", f"localhost:{n}", "--gloo", plan.python, "-m", "models.train", *args]


# ---- local mode: child processes with their output in the task log -------------------------------


def child_env() -> dict[str, str]:
    """The task's environment (MLFLOW_TRACKING_URI included) with the training environment first."""
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONHOME")}
    bin_dir = str(Path(training_python()).parent)
    env.update(
        PATH=f"{bin_dir}{os.pathsep}{env.get('PATH', '')}",
        PYTHONPATH=str(REPO),
        PYTHONUNBUFFERED="1",
        TF_CPP_MIN_LOG_LEVEL=env.get("TF_CPP_MIN_LOG_LEVEL", "2"),
        MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR="false",
    )
    return env


def run_command(
    argv: Sequence[str],
    emit: Callable[[str], None] = log.info,
    tail: int = 40,
    progress_every_s: float = 10.0,
) -> None:
    """Runs `argv` in the repository, sending each output line to `emit` as it comes.

    Progress bars redraw with carriage returns: one such line every `progress_every_s` reaches the
    log. The command runs in a process group of its own, which is ended with the task (a timeout, a
    kill from the UI). Raises StageError with the last `tail` lines when it exits non-zero.
    """
    last_lines: deque[str] = deque(maxlen=tail)
    emit(f"$ {' '.join(argv)}")
    proc = subprocess.Popen(
        list(argv),
        cwd=REPO,
        env=child_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    last_progress = float("-inf")
    try:
        pending = b""
        while chunk := os.read(proc.stdout.fileno(), 65536):
            pending += chunk
            # A trailing \r may be the first half of \r\n: it waits for the next chunk.
            cut = len(pending) - 1 if pending.endswith(b"\r") else len(pending)
            parts = re.split(rb"(\r\n|\n|\r)", pending[:cut])
            pending = parts.pop() + pending[cut:]
            for text, end in zip(parts[0::2], parts[1::2]):
                line = text.decode(errors="replace").rstrip()
                if not line:
                    continue
                if end == b"\r":  # a progress bar's redraw
                    if time.monotonic() - last_progress < progress_every_s:
                        continue
                    last_progress = time.monotonic()
                last_lines.append(line)
                emit(line)
        if pending.strip():
            last_lines.append(pending.decode(errors="replace").rstrip())
            emit(last_lines[-1])
        code = proc.wait()
    finally:
        if proc.poll() is None:
            _end_group(proc)
        proc.stdout.close()
    if code != 0:
        output = "\n".join(last_lines)
        raise StageError(f"`{' '.join(argv)}` exited with {code}; its last lines:\n{output}")


def _end_group(proc: subprocess.Popen) -> None:
    """SIGTERM to the command's process group (horovodrun and its ranks), SIGKILL after 20 s."""
    for sig, wait_s in ((signal.SIGTERM, 20), (signal.SIGKILL, 5)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(wait_s)
            return
        except subprocess.TimeoutExpired:
            continue


# ---- cluster mode: stage pods and the MPIJob -----------------------------------------------------


def cluster_settings():
    """ClusterSettings from the file named by SPEECHFLOW_CLUSTER_SETTINGS (the Airflow image sets it)."""
    from pipeline import k8s

    return k8s.load_settings(os.environ.get("SPEECHFLOW_CLUSTER_SETTINGS") or None)


def pod_name(plan: Plan, stage: str) -> str:
    from pipeline import k8s

    # The operator appends a random suffix of 9 characters; pod names may have 63.
    return k8s.safe_name(stage, plan.dag_run_id, max_len=50)


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

    from pipeline import k8s

    pod = k8s.render_stage_pod(pod_name(plan, stage), module, args, settings or cluster_settings(), gpus=gpus)
    return KubernetesPodOperator(task_id=task_id, do_xcom_push=xcom, **k8s.stage_pod_operator_kwargs(pod))


def training_job(plan: Plan, model: str, parent_run_id: str, settings=None) -> dict:
    """The MPIJob manifest that trains `model` for this run."""
    from pipeline import k8s

    name = k8s.safe_name(f"train-{model}", plan.dag_run_id)
    return k8s.render_mpijob(
        name,
        train_args(plan, model, parent_run_id),
        plan.num_workers,
        plan.gpus_per_worker,
        settings or cluster_settings(),
    )


def _is_not_found(err: Exception) -> bool:
    return getattr(err, "status", None) == 404


def delete_mpijob(
    custom_api,
    name: str,
    namespace: str,
    wait_s: float = 120,
    poll_s: float = 2,
    sleep: Callable[[float], None] = time.sleep,
) -> bool:
    """Deletes the MPIJob (its pods go with it) and waits until it is gone. False when there was none."""
    from pipeline import k8s

    try:
        custom_api.delete_namespaced_custom_object(
            k8s.MPIJOB_GROUP,
            k8s.MPIJOB_VERSION,
            namespace,
            k8s.MPIJOB_PLURAL,
            name,
            propagation_policy="Foreground",
        )
    except Exception as err:
        if _is_not_found(err):
            return False
        raise
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        try:
            custom_api.get_namespaced_custom_object(
                k8s.MPIJOB_GROUP, k8s.MPIJOB_VERSION, namespace, k8s.MPIJOB_PLURAL, name
            )
        except Exception as err:
            if _is_not_found(err):
                return True
            raise
        sleep(poll_s)
    raise StageError(
        f"MPIJob {namespace}/{name} was not deleted within {wait_s:.0f} s; delete it by hand: "
        f"kubectl -n {namespace} delete mpijob {name}"
    )


def follow_mpijob(
    custom_api,
    core_api,
    name: str,
    namespace: str,
    emit: Callable[[str], None] = log.info,
    poll_s: float = 15,
    sleep: Callable[[float], None] = time.sleep,
) -> dict:
    """Waits for the MPIJob to succeed, streaming each launcher pod's log into `emit` as it runs.

    Returns the job's final status; raises StageError with the failure reason when it fails.
    """
    from pipeline import k8s

    streamed: set[str] = set()
    while True:
        job = custom_api.get_namespaced_custom_object(
            k8s.MPIJOB_GROUP, k8s.MPIJOB_VERSION, namespace, k8s.MPIJOB_PLURAL, name
        )
        status = job.get("status") or {}
        for pod in core_api.list_namespaced_pod(namespace, label_selector=k8s.launcher_pod_selector(name)).items:
            pod_id = pod.metadata.name
            if pod_id in streamed or pod.status.phase not in ("Running", "Succeeded", "Failed"):
                continue
            streamed.add(pod_id)
            emit(f"--- log of launcher pod {pod_id} ---")
            try:
                stream = core_api.read_namespaced_pod_log(pod_id, namespace, follow=True, _preload_content=False)
                for raw in stream.stream():
                    for line in raw.decode(errors="replace").splitlines():
                        emit(line)
            except Exception as err:  # the job's status decides, not its log: a broken stream costs lines only
                emit(f"--- the log of {pod_id} broke off ({err}); following the MPIJob's status ---")
        phase = k8s.mpijob_phase(status)
        if phase == "Succeeded":
            return status
        if phase == "Failed":
            raise StageError(
                f"MPIJob {namespace}/{name} failed: {k8s.mpijob_failure_message(status)}; see the launcher's log above"
            )
        sleep(poll_s)


def run_mpijob(
    manifest: dict,
    custom_api,
    core_api,
    emit: Callable[[str], None] = log.info,
    poll_s: float = 15,
    sleep: Callable[[float], None] = time.sleep,
) -> dict:
    """Submits the MPIJob (after deleting a previous attempt's) and follows it; deletes it unless it succeeds."""
    from pipeline import k8s

    name, namespace = manifest["metadata"]["name"], manifest["metadata"]["namespace"]
    if delete_mpijob(custom_api, name, namespace, sleep=sleep):
        emit(f"deleted MPIJob {namespace}/{name} of an earlier attempt")
    custom_api.create_namespaced_custom_object(
        k8s.MPIJOB_GROUP, k8s.MPIJOB_VERSION, namespace, k8s.MPIJOB_PLURAL, manifest
    )
    emit(
        f"submitted MPIJob {namespace}/{name}: {manifest['spec']['mpiReplicaSpecs']['Worker']['replicas']} "
        f"workers x {manifest['spec']['slotsPerWorker']} slots"
    )
    try:
        return follow_mpijob(custom_api, core_api, name, namespace, emit, poll_s, sleep)
    except BaseException:  # failed, timed out or killed: free the GPUs
        delete_mpijob(custom_api, name, namespace, sleep=sleep)
        raise


def _kubernetes_apis():
    from airflow.providers.cncf.kubernetes.hooks.kubernetes import KubernetesHook

    hook = KubernetesHook()  # the connection kubernetes_default, else the in-cluster configuration
    return hook.custom_object_client, hook.core_v1_client


# ---- what the tasks call -------------------------------------------------------------------------


def run_stage(
    plan: Plan, context: Mapping[str, Any], stage: str, module: str, args: Sequence[str], gpus: int = 0
) -> None:
    """Runs `python -m MODULE ARGS`: a child process (local) or a pod (kubernetes)."""
    if plan.mode == "local":
        run_command([plan.python, "-m", module, *args])
    else:
        stage_operator(plan, stage, module, args, f"{context['ti'].task_id}-pod", gpus=gpus).execute(context)


def registry(plan: Plan, context: Mapping[str, Any], stage: str, args: Sequence[str]) -> dict:
    """Runs `python -m models.registry ARGS` and returns the JSON it prints."""
    if plan.mode != "local":
        op = stage_operator(
            plan,
            stage,
            "models.registry",
            ["--json-file", POD_XCOM_FILE, *args],
            f"{context['ti'].task_id}-pod",
            xcom=True,
        )
        return op.execute(context)
    with tempfile.TemporaryDirectory(prefix="speechflow-registry-") as tmp:
        out = Path(tmp) / "result.json"
        run_command([plan.python, "-m", "models.registry", "--json-file", str(out), *args])
        return json.loads(out.read_text())


def run_training(plan: Plan, context: Mapping[str, Any], model: str, parent_run_id: str) -> dict:
    """Trains `model`: horovodrun here, or an MPIJob on the cluster. Returns what is known of the run."""
    args = train_args(plan, model, parent_run_id)
    workdir = Path(plan.workdirs[model])
    if plan.mode != "local":
        manifest = training_job(plan, model, parent_run_id)
        custom_api, core_api = _kubernetes_apis()
        run_mpijob(manifest, custom_api, core_api)
        return {"model": model, "workdir": str(workdir), "mpijob": manifest["metadata"]["name"]}
    # A finished training of the same command is not repeated (the trainer would resume at its
    # last step and log the model once more).
    marker = workdir / ".dag_train.done.json"
    key = hashlib.sha256(json.dumps(args).encode()).hexdigest()
    done = _read_json(marker)
    if done is None or done.get("key") != key:
        run_command(local_train_command(plan, args))
        summary = _read_json(workdir / "train_summary.json") or {}
        done = {"key": key, "summary": {k: v for k, v in summary.items() if not isinstance(v, (dict, list))}}
        tmp = marker.with_name(f".{marker.name}.tmp")
        tmp.write_text(json.dumps(done, indent=1, sort_keys=True))
        tmp.replace(marker)  # whole or absent, never half written
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
    return _read_json(Path(plan.workdirs[model]) / "eval.json") or {}


def failed_tasks(task_states: Mapping[str, str | None]) -> list[str]:
    return sorted(t for t, s in task_states.items() if s in ("failed", "upstream_failed"))


def _read_json(path: Path) -> Any | None:
    try:
        return json.loads(Path(path).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None
