"""The Kubernetes objects the pipeline submits, rendered from `ClusterSettings`.

Training runs as a Kubeflow `MPIJob` (kubeflow.org/v2beta1, MPI Operator v0.8): the operator starts
one worker pod per GPU node running sshd, writes an OpenMPI hostfile (`host slots=N` per worker) to
/etc/mpi/hostfile in the launcher, and the launcher runs `horovodrun -np N --hostfile ...`, which
Horovod reads directly and hands to `mpirun`. Every other stage (corpus, features, shards,
evaluation) is one pod, which the DAG starts with a KubernetesPodOperator.

With `min_workers`, the MPIJob runs Horovod elastic instead: the launcher's horovodrun finds its
hosts with scripts/discover_hosts.sh, which lists the job's ready worker pods through the API (the
launcher's ServiceAccount may only read pods: k8s/elastic/), so the job goes on when a worker pod is
lost and takes it back when it returns. `render_data_service` renders a tf.data service beside the
MPIJob: a dispatcher (Deployment of one, with its Service) and a Deployment of CPU input workers.

Everything here is a pure function from settings to the dicts `kubectl apply -f` takes (or to the
keyword arguments of a KubernetesPodOperator). No Kubernetes client and no TensorFlow: the Airflow
environment imports this module, and the tests validate its output against the MPIJob CRD schema.
`python -m workflow.manifests mpijob|data-service|stage-pod ...` prints the same YAML for
`kubectl create -f -`.

One file (about 600 lines) because every object here is rendered from the same `ClusterSettings`
and shares its labels, volumes and security context; `mpijob.py` holds the MPIJob client apart.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from workflow import cluster, commands
from workflow.cluster import ClusterSettings


def _launcher_network_flags(settings: ClusterSettings) -> list[str]:
    """horovodrun's flags for reaching the workers, the same for the plain and the elastic launcher."""
    return [
        "--network-interfaces",
        settings.network_interface,
        "--ssh-port",
        str(settings.ssh_port),
        "--start-timeout",
        str(settings.start_timeout_s),
    ]


def horovodrun_command(num_proc: int, train_args: Sequence[str], settings: ClusterSettings) -> list[str]:
    """The launcher's command: `horovodrun -np N --hostfile /etc/mpi/hostfile ... python -m models.train ARGS`.

    `--network-interfaces` skips Horovod's interface probe (NCCL_SOCKET_IFNAME follows it), `--ssh-port`
    matches the workers' unprivileged sshd, `--disable-cache` re-checks ssh on every run instead of
    trusting a cache of earlier checks.
    """
    return [
        "horovodrun",
        "-np",
        str(num_proc),
        "--hostfile",
        cluster.MPI_HOSTFILE,
        f"--{settings.mpi_controller}",
        *_launcher_network_flags(settings),
        "--disable-cache",
        "python",
        "-m",
        "models.train",
        *train_args,
    ]


def elastic_horovodrun_command(
    min_proc: int, max_proc: int, train_args: Sequence[str], settings: ClusterSettings
) -> list[str]:
    """The elastic launcher's command: `horovodrun -np MAX --min-np MIN --max-np MAX
    --host-discovery-script ... python -m models.train ARGS`.

    Horovod elastic runs on Gloo (it ignores --mpi) and replaces the hostfile by the discovery script,
    which it runs every second. It starts once MAX slots are found (the operator starts the launcher
    when every worker is ready), goes on with at least MIN after a loss, and grows back to MAX as hosts
    return. A host whose ranks failed sits out a random time within `elastic_cooldown_s` before it is
    tried again; without that range Horovod would never take back a worker restarted in place.
    """
    low, high = settings.elastic_cooldown_s
    return [
        "horovodrun",
        "-np",
        str(max_proc),
        "--min-np",
        str(min_proc),
        "--max-np",
        str(max_proc),
        "--host-discovery-script",
        cluster.DISCOVER_HOSTS_SCRIPT,
        "--gloo",
        *_launcher_network_flags(settings),
        "--elastic-timeout",
        str(settings.elastic_timeout_s),
        "--blacklist-cooldown-range",
        str(low),
        str(high),
        "--disable-cache",
        "python",
        "-m",
        "models.train",
        *train_args,
    ]


def worker_selector(name: str) -> str:
    """Label selector of an MPIJob's worker pods (the MPI Operator labels them so)."""
    return f"{cluster.JOB_NAME_LABEL}={name},{cluster.JOB_ROLE_LABEL}=worker"


def render_mpijob(
    name: str,
    train_args: Sequence[str],
    num_workers: int,
    gpus_per_worker: int | None = None,
    settings: ClusterSettings | None = None,
    min_workers: int | None = None,
) -> dict[str, Any]:
    """A kubeflow.org/v2beta1 MPIJob running `python -m models.train TRAIN_ARGS` on `num_workers` pods.

    Each worker pod gets `gpus_per_worker` GPUs (default: `settings.gpus_per_worker`) and as many MPI
    slots; the launcher runs `horovodrun -np num_workers*gpus_per_worker` once every worker's sshd is
    ready (`launcherCreationPolicy: WaitForWorkersReady`). Returns the manifest as a dict.

    `min_workers` (1..num_workers) makes it a Horovod elastic job (`models.train --elastic`,
    allreduce only) that keeps training while at least `min_workers` worker pods are ready: the
    launcher discovers the workers through the API under `settings.elastic_service_account`, the one
    pipeline pod with an API token, and a worker whose container fails is restarted in place.
    """
    settings = settings or ClusterSettings()
    gpus = settings.gpus_per_worker if gpus_per_worker is None else gpus_per_worker
    cluster.check_name(name, cluster.MAX_JOB_NAME)
    if num_workers < 1:
        raise ValueError(f"MPIJob {name}: num_workers must be at least 1, got {num_workers}")
    if gpus < 0:
        raise ValueError(f"MPIJob {name}: gpus_per_worker must be 0 (CPU) or more, got {gpus}")
    elastic = min_workers is not None
    if elastic and not 1 <= min_workers <= num_workers:
        raise ValueError(
            f"MPIJob {name}: min_workers must be between 1 and num_workers ({num_workers}), got {min_workers}"
        )
    train_args = list(train_args)
    if elastic:
        strategy = train_args[train_args.index("--strategy") + 1] if "--strategy" in train_args[:-1] else None
        if strategy not in (None, "allreduce"):
            raise ValueError(
                f"MPIJob {name}: Horovod elastic trains with --strategy allreduce only, got --strategy {strategy}"
            )
        if "--elastic" not in train_args:
            train_args.append("--elastic")
    slots = max(gpus, 1)
    num_proc = num_workers * slots
    ssh_dir = f"{settings.home}/.ssh"
    scratch_volumes, scratch_mounts = cluster.scratch_volumes(settings)
    data_volume, data_mount = cluster.data_volume(settings)

    launcher_spec = cluster.common_pod_spec(settings)
    launcher_env = cluster.train_env(settings)
    launcher_skips = [cluster.SKIP_LIVENESS, cluster.SKIP_READINESS]
    if elastic:
        command = elastic_horovodrun_command(min_workers * slots, num_proc, train_args, settings)
        # What scripts/discover_hosts.sh lists: this job's ready worker pods, each with its slots.
        launcher_env += [
            {"name": "SPEECHFLOW_WORKER_SELECTOR", "value": worker_selector(name)},
            {"name": "SPEECHFLOW_SLOTS", "value": str(slots)},
        ]
        # The discovery script reads pods with this account's token; no other pipeline pod has one.
        launcher_spec.update(serviceAccountName=settings.elastic_service_account, automountServiceAccountToken=True)
        launcher_skips.append(cluster.SKIP_TOKEN)
    else:
        command = horovodrun_command(num_proc, train_args, settings)
    launcher_spec.update(
        # Tolerated, not required: on a cluster of GPU nodes only, the launcher still finds a place.
        tolerations=cluster.tolerations(settings),
        containers=[
            {
                "name": "launcher",
                "image": settings.image,
                "imagePullPolicy": settings.image_pull_policy,
                "command": command,
                # horovodrun hands its whole environment to every rank (mpirun -x NAME, or the
                # ssh command line under Gloo), so the ranks' settings live here, on the launcher.
                "env": launcher_env,
                "resources": {
                    "requests": {"cpu": settings.launcher_cpu, "memory": settings.launcher_memory},
                    "limits": {"cpu": settings.launcher_cpu, "memory": settings.launcher_memory},
                },
                "securityContext": cluster.container_security(),
                "volumeMounts": scratch_mounts,
            }
        ],
        volumes=scratch_volumes,
    )

    worker_resources: dict[str, dict[str, Any]] = {
        "requests": {
            "cpu": str(settings.worker_cpu_per_gpu * slots),
            "memory": f"{settings.worker_memory_gib_per_gpu * slots}Gi",
        },
        "limits": {
            "cpu": str(settings.worker_cpu_per_gpu * slots),
            "memory": f"{settings.worker_memory_gib_per_gpu * slots}Gi",
        },
    }
    if gpus:
        worker_resources["limits"]["nvidia.com/gpu"] = gpus
    worker_spec = cluster.common_pod_spec(settings)
    if gpus:
        worker_spec["nodeSelector"] = dict(settings.gpu_node_selector)
        worker_spec["tolerations"] = cluster.tolerations(settings)
    worker_spec.update(
        containers=[
            {
                "name": "worker",
                "image": settings.image,
                "imagePullPolicy": settings.image_pull_policy,
                # Unprivileged sshd: the operator mounts this job's key pair into ~/.ssh, which
                # serves as host key and authorized key; mpirun starts the ranks through it.
                "command": ["/usr/sbin/sshd", "-De", "-f", "/etc/ssh/speechflow_sshd_config"],
                "env": cluster.train_env(settings),
                "ports": [{"name": "ssh", "containerPort": settings.ssh_port, "protocol": "TCP"}],
                # Ready means sshd accepts connections: the launcher starts only then.
                "readinessProbe": {"tcpSocket": {"port": settings.ssh_port}, "periodSeconds": 5},
                "livenessProbe": {
                    "tcpSocket": {"port": settings.ssh_port},
                    "initialDelaySeconds": 30,
                    "periodSeconds": 30,
                    "failureThreshold": 4,
                },
                "resources": worker_resources,
                "securityContext": cluster.container_security(),
                "volumeMounts": [*scratch_mounts, data_mount, {"name": "dshm", "mountPath": "/dev/shm"}],
            }
        ],
        volumes=[
            *scratch_volumes,
            data_volume,
            {
                "name": "dshm",
                "emptyDir": {"medium": "Memory", "sizeLimit": f"{settings.shm_gib_per_gpu * slots}Gi"},
            },
        ],
    )

    run_policy: dict[str, Any] = {
        "cleanPodPolicy": "Running",  # idle workers (and their GPUs) go as soon as the launcher ends
        "backoffLimit": settings.backoff_limit,
        "ttlSecondsAfterFinished": settings.ttl_after_finished_s,
    }
    if settings.active_deadline_s:
        run_policy["activeDeadlineSeconds"] = settings.active_deadline_s
    return {
        "apiVersion": cluster.MPIJOB_API_VERSION,
        "kind": cluster.MPIJOB_KIND,
        "metadata": {
            "name": name,
            "namespace": settings.namespace,
            "labels": {cluster.PART_OF_LABEL[0]: cluster.PART_OF_LABEL[1]},
        },
        "spec": {
            "slotsPerWorker": slots,
            "mpiImplementation": "OpenMPI",
            "launcherCreationPolicy": "WaitForWorkersReady",
            "sshAuthMountPath": ssh_dir,
            "runPolicy": run_policy,
            "mpiReplicaSpecs": {
                "Launcher": {
                    "replicas": 1,
                    "restartPolicy": "Never",
                    "template": {
                        "metadata": {
                            "labels": cluster.labels("train-launcher"),
                            "annotations": cluster.skip_annotations(settings, *launcher_skips),
                        },
                        "spec": launcher_spec,
                    },
                },
                "Worker": {
                    "replicas": num_workers,
                    # Elastic: a worker whose container died (sshd and the ranks it started, e.g.
                    # killed for memory) comes back in the same pod, and discovery lists it again.
                    "restartPolicy": "OnFailure" if elastic else "Never",
                    "template": {
                        "metadata": {
                            "labels": cluster.labels("train-worker"),
                            "annotations": cluster.skip_annotations(settings),
                        },
                        "spec": worker_spec,
                    },
                },
            },
        },
    }


def render_stage_pod(
    name: str,
    module: str,
    args: Sequence[str],
    settings: ClusterSettings | None = None,
    gpus: int = 0,
) -> dict[str, Any]:
    """A Pod running `python -m MODULE ARGS` with the training image and the data claim.

    For the non-training stages (`pipeline.corpus`, `pipeline.features`, `pipeline.shards`,
    `models.evaluate`). `gpus > 0` adds GPU limits and the GPU node selector. Returns the manifest.
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
                "volumeMounts": [*scratch_mounts, data_mount],
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
    cluster.check_name(name, cluster.MAX_JOB_NAME)
    if num_workers < 1:
        raise ValueError(f"data service {name}: num_workers must be at least 1, got {num_workers}")
    root = settings.data_mount.rstrip("/") + "/"
    if work_dir is not None and not work_dir.startswith(root):
        raise ValueError(
            f"data service {name}: the dispatcher's work_dir {work_dir} must be on the data claim (under {root}) "
            f"to outlive its pod"
        )
    dispatcher, worker = f"{name}-dispatcher", f"{name}-worker"
    port, worker_port = cluster.DATA_SERVICE_DISPATCHER_PORT, cluster.DATA_SERVICE_WORKER_PORT
    scratch_volumes, scratch_mounts = cluster.scratch_volumes(settings)
    data_volume, data_mount = cluster.data_volume(settings)
    # The journal is the dispatcher's only write to the claim; the workers only read shards.
    dispatcher_data = dict(data_mount) if work_dir else {**data_mount, "readOnly": True}
    command = ["python", "-m", commands.DATA_SERVICE]

    def container(role: str, args: list[str], env: list[dict], cpu: str, memory: str, mounts: list) -> dict:
        return {
            "name": role,
            "image": settings.image,
            "imagePullPolicy": settings.image_pull_policy,
            "command": command,
            "args": args,
            "env": env,
            "ports": [{"name": "grpc", "containerPort": port if role == "dispatcher" else worker_port}],
            **_server_probes(port if role == "dispatcher" else worker_port),
            "resources": {"requests": {"cpu": cpu, "memory": memory}, "limits": {"cpu": cpu, "memory": memory}},
            "securityContext": cluster.container_security(),
            "volumeMounts": mounts,
        }

    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": dispatcher,
            "namespace": settings.namespace,
            "labels": cluster.labels("data-service-dispatcher", name),
        },
        "spec": {
            "selector": {cluster.COMPONENT_LABEL: "data-service-dispatcher", cluster.INSTANCE_LABEL: name},
            "ports": [{"name": "grpc", "port": port, "targetPort": "grpc", "protocol": "TCP"}],
        },
    }
    dispatcher_container = container(
        "dispatcher",
        commands.dispatcher_args(port, work_dir),
        cluster.pod_env(settings),
        settings.data_service_dispatcher_cpu,
        settings.data_service_dispatcher_memory,
        [*scratch_mounts, dispatcher_data],
    )
    # Kubernetes expands $(POD_IP) in args from the container's env: each worker advertises its own
    # address without a shell.
    worker_env = [
        *cluster.pod_env(settings),
        {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
    ]
    worker_container = container(
        "worker",
        commands.worker_args(f"{dispatcher}:{port}", worker_port, f"$(POD_IP):{worker_port}"),
        worker_env,
        settings.data_service_worker_cpu,
        settings.data_service_worker_memory,
        [*scratch_mounts, {**data_mount, "readOnly": True}],
    )
    volumes = [*scratch_volumes, data_volume]
    return [
        service,
        _data_service_deployment(
            dispatcher, name, "data-service-dispatcher", 1, dispatcher_container, volumes, settings
        ),
        _data_service_deployment(worker, name, "data-service-worker", num_workers, worker_container, volumes, settings),
    ]


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


class _NoAliasDumper(yaml.SafeDumper):
    """Writes repeated objects out in full: manifests are read by people, not only by parsers."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def to_yaml(manifest: Mapping[str, Any]) -> str:
    """The manifest as YAML, keys in the order they were built (the order `kubectl` users expect)."""
    return yaml.dump(dict(manifest), Dumper=_NoAliasDumper, sort_keys=False, default_flow_style=False, width=96)


def to_yaml_documents(manifests: Sequence[Mapping[str, Any]]) -> str:
    """Several manifests as one multi-document YAML stream."""
    return "---\n".join(to_yaml(m) for m in manifests)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m workflow.manifests",
        description="Print the Kubernetes manifests of a training job, a tf.data service or a stage pod "
        "(pipe them into `kubectl create -f -`).",
    )
    parser.add_argument(
        "--settings",
        type=Path,
        help="YAML file of ClusterSettings fields, e.g. k8s/overlays/gpu/cluster.yaml",
    )
    parser.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="override a ClusterSettings field (repeatable)"
    )
    sub = parser.add_subparsers(dest="what", required=True)
    job = sub.add_parser("mpijob", help="an MPIJob running `horovodrun ... python -m models.train ARGS`")
    job.add_argument(
        "--name", required=True, help=f"MPIJob name (a DNS label, at most {cluster.MAX_JOB_NAME} characters)"
    )
    job.add_argument("--num-workers", type=int, required=True, help="worker pods (one per GPU node)")
    job.add_argument("--gpus-per-worker", type=int, help="GPUs (= MPI slots) per worker; default from the settings")
    job.add_argument(
        "--min-workers",
        type=int,
        help="Horovod elastic: keep training while at least this many worker pods are ready "
        "(needs k8s/elastic/; adds --elastic to the training arguments)",
    )
    job.add_argument("train_args", nargs=argparse.REMAINDER, help="-- then the arguments of models.train")
    service = sub.add_parser(
        "data-service", help="a tf.data service (dispatcher Service and Deployment, worker Deployment)"
    )
    service.add_argument(
        "--name",
        required=True,
        help=f"base name of its objects (a DNS label, at most {cluster.MAX_JOB_NAME} characters)",
    )
    service.add_argument("--num-workers", type=int, required=True, help="input worker pods")
    service.add_argument(
        "--work-dir", help="dispatcher journal on the data claim, e.g. /data/runs/r1/data-service (fault tolerance)"
    )
    pod = sub.add_parser("stage-pod", help="a Pod running `python -m MODULE ARGS`")
    pod.add_argument("--name", required=True, help="Pod name (a DNS label)")
    pod.add_argument("--module", required=True, help="stage module, e.g. pipeline.features or models.evaluate")
    pod.add_argument("--gpus", type=int, default=0, help="GPUs for the pod (default 0)")
    pod.add_argument("stage_args", nargs=argparse.REMAINDER, help="-- then the stage's arguments")
    args = parser.parse_args(argv)

    settings = cluster.load_settings(args.settings, args.set)
    if args.what == "mpijob":
        rest = args.train_args[1:] if args.train_args[:1] == ["--"] else args.train_args
        manifest = render_mpijob(
            args.name, rest, args.num_workers, args.gpus_per_worker, settings, min_workers=args.min_workers
        )
    elif args.what == "data-service":
        objects = render_data_service(args.name, args.num_workers, settings, args.work_dir)
        sys.stdout.write(
            f"# the ranks read from it: models.train ... --data-service {data_service_address(args.name)}\n"
        )
        sys.stdout.write(to_yaml_documents(objects))
        return 0
    else:
        rest = args.stage_args[1:] if args.stage_args[:1] == ["--"] else args.stage_args
        manifest = render_stage_pod(args.name, args.module, rest, settings, gpus=args.gpus)
    sys.stdout.write(to_yaml(manifest))
    return 0


if __name__ == "__main__":
    sys.exit(main())
