"""The pipeline's Kubernetes objects besides the training job: stage pods, the tf.data service, a model server.

Every stage other than training (corpus, features, shards, the word LM, evaluation) is one pod, which the DAG
starts with a KubernetesPodOperator (`render_stage_pod`, `stage_pod_operator_kwargs`).
`render_data_service` renders a tf.data service beside a training MPIJob: a dispatcher (Deployment
of one, with its Service) and a Deployment of CPU input workers. `render_serving` renders a server of
a registered model (`mlflow models serve`, a Deployment and its Service).

Pure functions from `ClusterSettings` to the dicts `kubectl apply -f` takes (or to the keyword
arguments of a KubernetesPodOperator): no Kubernetes client and no TensorFlow, so the Airflow
environment imports this module. workflow/training_job.py renders the MPIJob. Every container
gets the extensions the rendering process names (workflow/cluster.py `extension_mounts`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from workflow import cluster, commands
from workflow.cluster import ClusterSettings


def render_stage_pod(
    name: str,
    module: str,
    args: Sequence[str],
    settings: ClusterSettings | None = None,
    gpus: int = 0,
) -> dict[str, Any]:
    """A Pod running `python -m MODULE ARGS` with the training image and the data claim.

    For the non-training stages (`pipeline.corpus`, `pipeline.features`, `pipeline.shards`, `pipeline.lm`,
    `models.tune_lm`, `models.evaluate`). `gpus > 0` adds GPU limits and the GPU node selector. Returns the manifest.
    """
    settings = settings or ClusterSettings()
    cluster.check_name(name, 63)
    if not re.fullmatch(r"[A-Za-z_][\w.]*", module):
        raise ValueError(f"stage pod {name}: {module!r} is not a Python module name such as pipeline.features")
    scratch_volumes, scratch_mounts = cluster.scratch_volumes(settings)
    data_volume, data_mount = cluster.data_volume(settings)
    resources: dict[str, dict[str, Any]] = {
        "requests": {"cpu": settings.stage_cpu, "memory": settings.stage_memory},
        "limits": {"cpu": settings.stage_cpu, "memory": settings.stage_memory},
    }
    spec = cluster.common_pod_spec(settings)
    if gpus:
        resources["limits"]["nvidia.com/gpu"] = gpus
        spec["nodeSelector"] = dict(settings.gpu_node_selector)
        spec["tolerations"] = cluster.tolerations(settings)
    spec.update(
        restartPolicy="Never",
        containers=[
            {
                "name": cluster.STAGE_CONTAINER,
                "image": settings.image,
                "imagePullPolicy": settings.image_pull_policy,
                "command": ["python", "-m", module],
                "args": list(args),
                "env": cluster.pod_env(settings),
                "resources": resources,
                "securityContext": cluster.container_security(),
                "volumeMounts": [*scratch_mounts, data_mount, *cluster.extension_mounts(settings)],
            }
        ],
        volumes=[*scratch_volumes, data_volume],
    )
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": settings.namespace,
            "labels": cluster.labels("stage"),
            "annotations": cluster.skip_annotations(settings, cluster.SKIP_LIVENESS, cluster.SKIP_READINESS),
        },
        "spec": spec,
    }


def data_service_address(name: str) -> str:
    """grpc://HOST:PORT of the dispatcher `render_data_service(name, ...)` makes, as the training ranks
    reach it (`models.train --data-service`): its Service, in the same namespace."""
    return f"grpc://{name}-dispatcher:{cluster.DATA_SERVICE_DISPATCHER_PORT}"


def _server_probes(port: int) -> dict[str, Any]:
    # Ready once the gRPC server listens; restarted when it stops answering.
    return {
        "readinessProbe": {"tcpSocket": {"port": port}, "periodSeconds": 5},
        "livenessProbe": {
            "tcpSocket": {"port": port},
            "initialDelaySeconds": 30,
            "periodSeconds": 30,
            "failureThreshold": 4,
        },
    }


def _data_service_deployment(
    name: str, instance: str, component: str, replicas: int, container: dict, volumes: list, settings: ClusterSettings
) -> dict[str, Any]:
    pod_labels = cluster.labels(component, instance)
    spec = cluster.common_pod_spec(settings)
    if settings.data_service_node_selector:
        spec["nodeSelector"] = dict(settings.data_service_node_selector)
    spec.update(
        # The servers run as PID 1, which ignores SIGTERM; they hold nothing to flush (the
        # dispatcher's journal is written before it answers), so they are killed soon.
        terminationGracePeriodSeconds=5,
        containers=[container],
        volumes=volumes,
    )
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        # checkov reads a workload's skips from its own metadata (a Pod's from the Pod's).
        "metadata": {
            "name": name,
            "namespace": settings.namespace,
            "labels": pod_labels,
            "annotations": cluster.skip_annotations(settings),
        },
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {cluster.COMPONENT_LABEL: component, cluster.INSTANCE_LABEL: instance}},
            # Never two dispatchers on one journal; workers are interchangeable.
            "strategy": {"type": "Recreate" if replicas == 1 else "RollingUpdate"},
            "template": {"metadata": {"labels": pod_labels}, "spec": spec},
        },
    }


def render_data_service(
    name: str, num_workers: int, settings: ClusterSettings | None = None, work_dir: str | None = None
) -> list[dict[str, Any]]:
    """A tf.data service for one training job: [dispatcher Service, dispatcher Deployment, worker Deployment].

    The dispatcher (`python -m pipeline.data_service dispatcher`, one replica) is reached at
    `data_service_address(name)`; with `work_dir` (a directory on the data claim) it journals its state
    there and a restarted dispatcher (a new pod, on any node) picks up the running jobs. `num_workers`
    CPU workers mount the data claim read-only at the trainers' path (they read the shards), register
    with the dispatcher and advertise their pod IP, which the training ranks connect to. Every pod
    carries the pipeline label, so the NetworkPolicies let the ranks and the service reach each other.
    """
    settings = settings or ClusterSettings()
    _check_data_service(name, num_workers, work_dir, settings)
    dispatcher, worker = f"{name}-dispatcher", f"{name}-worker"
    port, worker_port = cluster.DATA_SERVICE_DISPATCHER_PORT, cluster.DATA_SERVICE_WORKER_PORT
    scratch_volumes, scratch_mounts = cluster.scratch_volumes(settings)
    data_volume, data_mount = cluster.data_volume(settings)
    # The journal is the dispatcher's only write to the claim; the workers only read shards.
    dispatcher_data = dict(data_mount) if work_dir else {**data_mount, "readOnly": True}
    extension_mounts = cluster.extension_mounts(settings)
    dispatcher_container = _data_service_container(
        "dispatcher",
        port,
        commands.dispatcher_args(port, work_dir),
        cluster.pod_env(settings),
        (settings.data_service_dispatcher_cpu, settings.data_service_dispatcher_memory),
        [*scratch_mounts, dispatcher_data, *extension_mounts],
        settings,
    )
    # Kubernetes expands $(POD_IP) in args from the container's env: each worker advertises its own
    # address without a shell.
    worker_env = [
        *cluster.pod_env(settings),
        {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
    ]
    worker_container = _data_service_container(
        "worker",
        worker_port,
        commands.worker_args(f"{dispatcher}:{port}", worker_port, f"$(POD_IP):{worker_port}"),
        worker_env,
        (settings.data_service_worker_cpu, settings.data_service_worker_memory),
        [*scratch_mounts, {**data_mount, "readOnly": True}, *extension_mounts],
        settings,
    )
    volumes = [*scratch_volumes, data_volume]
    return [
        _dispatcher_service(name, settings),
        _data_service_deployment(
            dispatcher, name, "data-service-dispatcher", 1, dispatcher_container, volumes, settings
        ),
        _data_service_deployment(worker, name, "data-service-worker", num_workers, worker_container, volumes, settings),
    ]


def _check_data_service(name: str, num_workers: int, work_dir: str | None, settings: ClusterSettings) -> None:
    """ValueError naming the data service and the argument that does not fit."""
    cluster.check_name(name, cluster.MAX_JOB_NAME)
    if num_workers < 1:
        raise ValueError(f"data service {name}: num_workers must be at least 1, got {num_workers}")
    root = settings.data_mount.rstrip("/") + "/"
    if work_dir is not None and not work_dir.startswith(root):
        raise ValueError(
            f"data service {name}: the dispatcher's work_dir {work_dir} must be on the data claim (under {root}) "
            f"to outlive its pod"
        )


def _data_service_container(
    role: str,
    port: int,
    args: list[str],
    env: list[dict],
    cpu_memory: tuple[str, str],
    mounts: list,
    settings: ClusterSettings,
) -> dict[str, Any]:
    """A server of the tf.data service (`role`: dispatcher or worker) answering gRPC on `port`."""
    cpu, memory = cpu_memory
    return {
        "name": role,
        "image": settings.image,
        "imagePullPolicy": settings.image_pull_policy,
        "command": ["python", "-m", commands.DATA_SERVICE],
        "args": args,
        "env": env,
        "ports": [{"name": "grpc", "containerPort": port}],
        **_server_probes(port),
        "resources": {"requests": {"cpu": cpu, "memory": memory}, "limits": {"cpu": cpu, "memory": memory}},
        "securityContext": cluster.container_security(),
        "volumeMounts": mounts,
    }


def _dispatcher_service(name: str, settings: ClusterSettings) -> dict[str, Any]:
    """The Service the training ranks and the workers reach the dispatcher of data service `name` by."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": f"{name}-dispatcher",
            "namespace": settings.namespace,
            "labels": cluster.labels("data-service-dispatcher", name),
        },
        "spec": {
            "selector": {cluster.COMPONENT_LABEL: "data-service-dispatcher", cluster.INSTANCE_LABEL: name},
            "ports": [
                {"name": "grpc", "port": cluster.DATA_SERVICE_DISPATCHER_PORT, "targetPort": "grpc", "protocol": "TCP"}
            ],
        },
    }


def render_serving(
    name: str,
    model_uri: str,
    settings: ClusterSettings | None = None,
    replicas: int = 1,
    serve_settings: Mapping[str, str] | None = None,
) -> list[dict[str, Any]]:
    """A server of a registered model: [Service, Deployment] answering on port SERVING_PORT of `name`.

    Each of `replicas` pods runs `mlflow models serve -m MODEL_URI` (models/serving/mlflow_serve.py's
    command, one worker) in the training image, which fetches the model from the MLflow server of the
    settings, e.g. `models:/speechflow-asr@champion`. `serve_settings` are the model's SPEECHFLOW_SERVE_*
    variables (models/serving/request_policy.py, docs/serving.md). The pods carry no pipeline label, so
    the training pods do not accept them; the NetworkPolicy `serving` (k8s/base) lets anyone ask them on
    their port and them reach only MLflow.
    """
    settings = settings or ClusterSettings()
    cluster.check_name(name, 63)
    if replicas < 1:
        raise ValueError(f"model server {name}: replicas must be at least 1, got {replicas}")
    serve_settings = dict(serve_settings or {})
    for key in serve_settings:
        if not key.startswith("SPEECHFLOW_SERVE_"):
            raise ValueError(
                f"model server {name}: {key} is not a serving setting; those are SPEECHFLOW_SERVE_* (docs/serving.md)"
            )
    pod_labels = {
        cluster.SERVING_POD_LABEL[0]: cluster.SERVING_POD_LABEL[1],
        cluster.PART_OF_LABEL[0]: cluster.PART_OF_LABEL[1],
        cluster.COMPONENT_LABEL: "serving",
        cluster.INSTANCE_LABEL: name,
    }
    selector = {cluster.COMPONENT_LABEL: "serving", cluster.INSTANCE_LABEL: name}
    scratch_volumes, _ = cluster.scratch_volumes(settings)
    spec = cluster.common_pod_spec(settings)
    spec.update(
        containers=[_serving_container(model_uri, serve_settings, settings)],
        volumes=[*scratch_volumes, *cluster.extension_volumes(settings)],
    )
    metadata = {"name": name, "namespace": settings.namespace, "labels": pod_labels}
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": dict(metadata),
        "spec": {
            "selector": selector,
            "ports": [{"name": "http", "port": cluster.SERVING_PORT, "targetPort": "http", "protocol": "TCP"}],
        },
    }
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {**metadata, "annotations": cluster.skip_annotations(settings)},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": selector},
            "template": {"metadata": {"labels": pod_labels}, "spec": spec},
        },
    }
    return [service, deployment]


def _serving_container(model_uri: str, serve_settings: Mapping[str, str], settings: ClusterSettings) -> dict:
    """The model server's container: `mlflow models serve` of `model_uri` on SERVING_PORT, probed on /ping."""
    # Rendered from the repository (`python -m workflow.manifests serving`), never in the Airflow image,
    # which holds no models/.
    from models.serving import mlflow_serve

    port = cluster.SERVING_PORT
    scratch_volumes, scratch_mounts = cluster.scratch_volumes(settings)
    env = [
        *cluster.pod_env(settings),
        *({"name": k, "value": v} for k, v in {**mlflow_serve.SERVER_ENV, **serve_settings}.items()),
    ]
    ping = {"httpGet": {"path": "/ping", "port": "http"}}
    resources = {"cpu": settings.serving_cpu, "memory": settings.serving_memory}
    return {
        "name": "server",
        "image": settings.image,
        "imagePullPolicy": settings.image_pull_policy,
        "command": mlflow_serve.serve_command(model_uri, port, workers=1, host="0.0.0.0", mlflow="mlflow"),
        "env": env,
        "ports": [{"name": "http", "containerPort": port, "protocol": "TCP"}],
        # Loading fetches the model and traces its graph: up to 10 minutes before the first /ping.
        "startupProbe": {**ping, "periodSeconds": 10, "failureThreshold": 60},
        "readinessProbe": {**ping, "periodSeconds": 10},
        "livenessProbe": {**ping, "periodSeconds": 30, "timeoutSeconds": 5, "failureThreshold": 4},
        "resources": {"requests": dict(resources), "limits": dict(resources)},
        "securityContext": cluster.container_security(),
        "volumeMounts": [*scratch_mounts, *cluster.extension_mounts(settings)],
    }


def stage_pod_operator_kwargs(pod: Mapping[str, Any]) -> dict[str, Any]:
    """Keyword arguments for a KubernetesPodOperator that runs the Pod from `render_stage_pod`.

    The pod itself goes in as `pod_template_dict` (volumes, security context, secrets); image and
    command are repeated as the operator's own arguments so that its log lines and UI show them.
    Add `task_id` (and anything else) yourself.
    """
    container = pod["spec"]["containers"][0]
    return {
        "name": pod["metadata"]["name"],
        "namespace": pod["metadata"]["namespace"],
        "image": container["image"],
        "cmds": list(container["command"]),
        "arguments": list(container.get("args", [])),
        "labels": dict(pod["metadata"]["labels"]),
        "service_account_name": pod["spec"]["serviceAccountName"],
        "pod_template_dict": dict(pod),
        "base_container_name": cluster.STAGE_CONTAINER,
        "get_logs": True,
        # The training image is large: its first pull on a node takes minutes.
        "startup_timeout_seconds": 900,
        "on_finish_action": "delete_succeeded_pod",
    }
