"""The Kubernetes objects the pipeline submits, rendered from `ClusterSettings`.

Training runs as a Kubeflow `MPIJob` (kubeflow.org/v2beta1, MPI Operator v0.8): the operator starts
one worker pod per GPU node running sshd, writes an OpenMPI hostfile (`host slots=N` per worker) to
/etc/mpi/hostfile in the launcher, and the launcher runs `horovodrun -np N --hostfile ...`, which
Horovod reads directly and hands to `mpirun`. Every other stage (corpus, features, shards,
evaluation) is one pod, which the DAG starts with a KubernetesPodOperator.

Everything here is a pure function from settings to the dicts `kubectl apply -f` takes (or to the
keyword arguments of a KubernetesPodOperator). No Kubernetes client and no TensorFlow: the Airflow
environment imports this module, and the tests validate its output against the MPIJob CRD schema.
`python -m workflow.manifests mpijob ...` prints the same YAML for `kubectl create -f -`.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from workflow import cluster
from workflow.cluster import ClusterSettings


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
        "--network-interfaces",
        settings.network_interface,
        "--ssh-port",
        str(settings.ssh_port),
        "--start-timeout",
        str(settings.start_timeout_s),
        "--disable-cache",
        "python",
        "-m",
        "models.train",
        *train_args,
    ]


def render_mpijob(
    name: str,
    train_args: Sequence[str],
    num_workers: int,
    gpus_per_worker: int | None = None,
    settings: ClusterSettings | None = None,
) -> dict[str, Any]:
    """A kubeflow.org/v2beta1 MPIJob running `python -m models.train TRAIN_ARGS` on `num_workers` pods.

    Each worker pod gets `gpus_per_worker` GPUs (default: `settings.gpus_per_worker`) and as many MPI
    slots; the launcher runs `horovodrun -np num_workers*gpus_per_worker` once every worker's sshd is
    ready (`launcherCreationPolicy: WaitForWorkersReady`). Returns the manifest as a dict.
    """
    settings = settings or ClusterSettings()
    gpus = settings.gpus_per_worker if gpus_per_worker is None else gpus_per_worker
    cluster.check_name(name, cluster.MAX_JOB_NAME)
    if num_workers < 1:
        raise ValueError(f"MPIJob {name}: num_workers must be at least 1, got {num_workers}")
    if gpus < 0:
        raise ValueError(f"MPIJob {name}: gpus_per_worker must be 0 (CPU) or more, got {gpus}")
    slots = max(gpus, 1)
    num_proc = num_workers * slots
    ssh_dir = f"{settings.home}/.ssh"
    scratch_volumes, scratch_mounts = cluster.scratch_volumes(settings)
    data_volume, data_mount = cluster.data_volume(settings)

    launcher_spec = cluster.common_pod_spec(settings)
    launcher_spec.update(
        # Tolerated, not required: on a cluster of GPU nodes only, the launcher still finds a place.
        tolerations=cluster.tolerations(settings),
        containers=[
            {
                "name": "launcher",
                "image": settings.image,
                "imagePullPolicy": settings.image_pull_policy,
                "command": horovodrun_command(num_proc, train_args, settings),
                # horovodrun hands its whole environment to every rank (mpirun -x NAME), so
                # the ranks' settings live here, on the launcher.
                "env": cluster.train_env(settings),
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
                            "annotations": cluster.skip_annotations(
                                settings, cluster.SKIP_LIVENESS, cluster.SKIP_READINESS
                            ),
                        },
                        "spec": launcher_spec,
                    },
                },
                "Worker": {
                    "replicas": num_workers,
                    "restartPolicy": "Never",
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


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m workflow.manifests",
        description="Print the Kubernetes manifest of a training job or a stage pod (pipe it into `kubectl create -f -`).",
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
    job.add_argument("train_args", nargs=argparse.REMAINDER, help="-- then the arguments of models.train")
    pod = sub.add_parser("stage-pod", help="a Pod running `python -m MODULE ARGS`")
    pod.add_argument("--name", required=True, help="Pod name (a DNS label)")
    pod.add_argument("--module", required=True, help="stage module, e.g. pipeline.features or models.evaluate")
    pod.add_argument("--gpus", type=int, default=0, help="GPUs for the pod (default 0)")
    pod.add_argument("stage_args", nargs=argparse.REMAINDER, help="-- then the stage's arguments")
    args = parser.parse_args(argv)

    settings = cluster.load_settings(args.settings, args.set)
    if args.what == "mpijob":
        rest = args.train_args[1:] if args.train_args[:1] == ["--"] else args.train_args
        manifest = render_mpijob(args.name, rest, args.num_workers, args.gpus_per_worker, settings)
    else:
        rest = args.stage_args[1:] if args.stage_args[:1] == ["--"] else args.stage_args
        manifest = render_stage_pod(args.name, args.module, rest, settings, gpus=args.gpus)
    sys.stdout.write(to_yaml(manifest))
    return 0


if __name__ == "__main__":
    sys.exit(main())
