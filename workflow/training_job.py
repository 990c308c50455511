"""The training job's Kubernetes object: a Kubeflow `MPIJob` and its launcher's `horovodrun` command.

Training runs as a Kubeflow `MPIJob` (kubeflow.org/v2beta1, MPI Operator v0.8): the operator starts
one worker pod per GPU node running sshd, writes an OpenMPI hostfile (`host slots=N` per worker) to
/etc/mpi/hostfile in the launcher, and the launcher runs `horovodrun -np N --hostfile ...`, which
Horovod reads directly and hands to `mpirun`.

With `min_workers`, the MPIJob runs Horovod elastic instead: the launcher's horovodrun finds its
hosts with scripts/discover_hosts.sh, which lists the job's ready worker pods through the API (the
launcher's ServiceAccount may only read pods: k8s/elastic/), so the job goes on when a worker pod is
lost and takes it back when it returns.

Pure functions from `ClusterSettings` to the dict `kubectl apply -f` takes: no Kubernetes client and
no TensorFlow, so the Airflow environment imports this module, and the tests validate its output
against the MPIJob CRD schema. workflow/mpijob.py submits and follows the job.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from common import catalog
from workflow import cluster
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
    _check_job(name, num_workers, gpus, min_workers)
    train_args = _elastic_train_args(name, train_args) if min_workers is not None else list(train_args)
    return {
        "apiVersion": cluster.MPIJOB_API_VERSION,
        "kind": cluster.MPIJOB_KIND,
        "metadata": {
            "name": name,
            "namespace": settings.namespace,
            "labels": {cluster.PART_OF_LABEL[0]: cluster.PART_OF_LABEL[1]},
        },
        "spec": {
            "slotsPerWorker": max(gpus, 1),
            "mpiImplementation": "OpenMPI",
            "launcherCreationPolicy": "WaitForWorkersReady",
            "sshAuthMountPath": f"{settings.home}/.ssh",
            "runPolicy": _run_policy(settings),
            "mpiReplicaSpecs": _replica_specs(name, train_args, num_workers, gpus, settings, min_workers),
        },
    }


def _replica_specs(
    name: str,
    train_args: list[str],
    num_workers: int,
    gpus: int,
    settings: ClusterSettings,
    min_workers: int | None,
) -> dict[str, Any]:
    """The MPIJob's launcher (one) and its `num_workers` workers."""
    slots = max(gpus, 1)
    launcher_spec, launcher_skips = _launcher_spec(name, train_args, num_workers, slots, settings, min_workers)
    return {
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
            "restartPolicy": "OnFailure" if min_workers is not None else "Never",
            "template": {
                "metadata": {
                    "labels": cluster.labels("train-worker"),
                    "annotations": cluster.skip_annotations(settings),
                },
                "spec": _worker_spec(slots, gpus, settings),
            },
        },
    }


def _check_job(name: str, num_workers: int, gpus: int, min_workers: int | None) -> None:
    """ValueError naming the MPIJob and the argument that does not fit."""
    cluster.check_name(name, cluster.MAX_JOB_NAME)
    if num_workers < 1:
        raise ValueError(f"MPIJob {name}: num_workers must be at least 1, got {num_workers}")
    if gpus < 0:
        raise ValueError(f"MPIJob {name}: gpus_per_worker must be 0 (CPU) or more, got {gpus}")
    if min_workers is not None and not 1 <= min_workers <= num_workers:
        raise ValueError(
            f"MPIJob {name}: min_workers must be between 1 and num_workers ({num_workers}), got {min_workers}"
        )


def _elastic_train_args(name: str, train_args: Sequence[str]) -> list[str]:
    """`train_args` with `--elastic`; ValueError when their `--strategy` does not survive lost workers."""
    train_args = list(train_args)
    strategy = train_args[train_args.index("--strategy") + 1] if "--strategy" in train_args[:-1] else None
    if strategy is not None and not catalog.strategy(strategy).supports_elastic:
        elastic_ones = " or ".join(n for n, e in catalog.strategies().items() if e.supports_elastic)
        raise ValueError(
            f"MPIJob {name}: Horovod elastic trains with --strategy {elastic_ones} only, got --strategy {strategy}"
        )
    if "--elastic" not in train_args:
        train_args.append("--elastic")
    return train_args


def _launcher_spec(
    name: str,
    train_args: list[str],
    num_workers: int,
    slots: int,
    settings: ClusterSettings,
    min_workers: int | None,
) -> tuple[dict[str, Any], list[str]]:
    """(the launcher's pod spec, the checks its pod skips): horovodrun over the workers' slots, elastic
    with `min_workers`."""
    scratch_volumes, scratch_mounts = cluster.scratch_volumes(settings)
    launcher_spec = cluster.common_pod_spec(settings)
    launcher_env = cluster.train_env(settings)
    launcher_skips = [cluster.SKIP_LIVENESS, cluster.SKIP_READINESS]
    num_proc = num_workers * slots
    if min_workers is not None:
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
                # The extensions' code, where the ranks import it (their environment is the launcher's). The
                # launcher mounts it too: its PYTHONPATH names the path, and a `python` there finds what the ranks do.
                "volumeMounts": [*scratch_mounts, *cluster.extension_mounts(settings)],
            }
        ],
        volumes=[*scratch_volumes, *cluster.extension_volumes(settings)],
    )
    return launcher_spec, launcher_skips


def _worker_resources(slots: int, gpus: int, settings: ClusterSettings) -> dict[str, dict[str, Any]]:
    """A worker pod's requests and limits: CPU and memory per slot, and its GPUs."""
    cpu, memory = str(settings.worker_cpu_per_gpu * slots), f"{settings.worker_memory_gib_per_gpu * slots}Gi"
    resources: dict[str, dict[str, Any]] = {
        "requests": {"cpu": cpu, "memory": memory},
        "limits": {"cpu": cpu, "memory": memory},
    }
    if gpus:
        resources["limits"]["nvidia.com/gpu"] = gpus
    return resources


def _worker_spec(slots: int, gpus: int, settings: ClusterSettings) -> dict[str, Any]:
    """A worker's pod spec: an unprivileged sshd the launcher starts the ranks through, on a GPU node when
    it has GPUs, with the data claim and a shared-memory /dev/shm."""
    scratch_volumes, scratch_mounts = cluster.scratch_volumes(settings)
    data_volume, data_mount = cluster.data_volume(settings)
    worker_spec = cluster.common_pod_spec(settings)
    if gpus:
        worker_spec["nodeSelector"] = dict(settings.gpu_node_selector)
        worker_spec["tolerations"] = cluster.tolerations(settings)
    shm = {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": f"{settings.shm_gib_per_gpu * slots}Gi"}}
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
                "resources": _worker_resources(slots, gpus, settings),
                "securityContext": cluster.container_security(),
                "volumeMounts": [
                    *scratch_mounts,
                    data_mount,
                    {"name": "dshm", "mountPath": "/dev/shm"},
                    *cluster.extension_mounts(settings),
                ],
            }
        ],
        volumes=[*scratch_volumes, data_volume, shm],
    )
    return worker_spec


def _run_policy(settings: ClusterSettings) -> dict[str, Any]:
    run_policy: dict[str, Any] = {
        "cleanPodPolicy": "Running",  # idle workers (and their GPUs) go as soon as the launcher ends
        "backoffLimit": settings.backoff_limit,
        "ttlSecondsAfterFinished": settings.ttl_after_finished_s,
    }
    if settings.active_deadline_s:
        run_policy["activeDeadlineSeconds"] = settings.active_deadline_s
    return run_policy
