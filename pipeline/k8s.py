"""Cluster mode: the Kubernetes objects the pipeline submits, rendered from plain settings.

Training runs as a Kubeflow `MPIJob` (kubeflow.org/v2beta1, MPI Operator v0.8): the operator starts
one worker pod per GPU node running sshd, writes an OpenMPI hostfile (`host slots=N` per worker) to
/etc/mpi/hostfile in the launcher, and the launcher runs `horovodrun -np N --hostfile ...`, which
Horovod reads directly and hands to `mpirun`. Every other stage (corpus, features, shards,
evaluation) is one pod, which the DAG starts with a KubernetesPodOperator.

Everything here is a pure function from settings to the dicts `kubectl apply -f` takes (or to the
keyword arguments of a KubernetesPodOperator). No Kubernetes client and no TensorFlow: the Airflow
environment imports this module, and the tests validate its output against the MPIJob CRD schema.
`python -m pipeline.k8s mpijob ...` prints the same YAML for `kubectl create -f -`.
"""

from __future__ import annotations

import argparse
import hashlib
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml

from pipeline import config as config_lib

# The MPIJob resource, as the Kubernetes API names it (e.g. for CustomObjectsApi calls).
MPIJOB_GROUP = "kubeflow.org"
MPIJOB_VERSION = "v2beta1"
MPIJOB_PLURAL = "mpijobs"
MPIJOB_API_VERSION = f"{MPIJOB_GROUP}/{MPIJOB_VERSION}"
MPIJOB_KIND = "MPIJob"
# Where the MPI Operator mounts the hostfile it writes for the launcher.
MPI_HOSTFILE = "/etc/mpi/hostfile"
# KubernetesPodOperator follows the logs of the container with this name.
STAGE_CONTAINER = "base"
# Labels the kustomize base relies on (k8s/base/network-policies.yaml): pods named
# PIPELINE_POD_LABEL accept connections only from each other (ssh, MPI, NCCL between the ranks), and
# pods carrying OBJECT_STORE_CLIENT_LABEL may reach MinIO.
PART_OF_LABEL = ("app.kubernetes.io/part-of", "speechflow")
PIPELINE_POD_LABEL = ("app.kubernetes.io/name", "speechflow-pipeline")
COMPONENT_LABEL = "app.kubernetes.io/component"
OBJECT_STORE_CLIENT_LABEL = ("speechflow.io/object-store-client", "true")
# Labels the MPI Operator puts on the pods it creates (training.kubeflow.org/...).
JOB_NAME_LABEL = "training.kubeflow.org/job-name"
JOB_ROLE_LABEL = "training.kubeflow.org/job-role"
# Longest MPIJob name: the operator derives `<name>-launcher` and `<name>-worker-<i>` hostnames,
# which must stay DNS labels of at most 63 characters.
MAX_JOB_NAME = 48
_DNS_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


@dataclass(frozen=True)
class Toleration:
    """One pod toleration (the taint GPU nodes carry so that only GPU work lands on them)."""

    key: str = "nvidia.com/gpu"  # taint key; the NVIDIA GPU Operator's convention by default
    operator: Literal["Exists", "Equal"] = "Exists"  # Equal also compares `value`
    value: str = ""  # the taint's value, for operator Equal
    effect: str = "NoSchedule"  # NoSchedule, PreferNoSchedule, NoExecute; "" matches every effect


@dataclass(frozen=True)
class ClusterSettings:
    """Where and how the pipeline's pods run. Defaults match k8s/base; overlays ship a YAML of overrides."""

    namespace: str = "speechflow"  # namespace of the kustomize base (k8s/base/namespace.yaml)
    image: str = "speechflow/train:0.1.0"  # training image (docker/train.Dockerfile), as the cluster pulls it
    # Always: every start re-checks the registry (and the pull secret); IfNotPresent for side-loaded images.
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = "Always"
    image_pull_secrets: tuple[str, ...] = ()  # Secrets for a private registry
    service_account: str = "speechflow-pipeline"  # pipeline pods' ServiceAccount (no API token is mounted)
    priority_class: str = ""  # PriorityClass of training and stage pods; "" for the cluster default
    data_claim: str = "speechflow-data"  # ReadWriteMany claim holding corpora, features, shards, runs
    data_mount: str = "/data"  # where that claim is mounted in every pipeline pod
    run_as_user: int = 10001  # uid (and gid) of the image's `mpiuser`; files on the claim belong to it
    home: str = "/home/mpiuser"  # its home: scratch, with the MPI Operator's SSH keys in .ssh
    gpus_per_worker: int = 1  # GPUs per worker pod = slotsPerWorker; 0: CPU-only workers, one slot each
    # Node labels a GPU pod requires (this one is set by the GPU Operator's GPU Feature Discovery).
    gpu_node_selector: tuple[tuple[str, ...], ...] = (("nvidia.com/gpu.present", "true"),)
    # Taints of GPU nodes that GPU pods and the launcher tolerate.
    gpu_tolerations: tuple[Toleration, ...] = (Toleration(key="nvidia.com/gpu"),)
    worker_cpu_per_gpu: int = 6  # CPU cores per GPU (input pipeline, Horovod background thread)
    worker_memory_gib_per_gpu: int = 40  # GiB of memory per GPU, shared memory included
    shm_gib_per_gpu: int = 2  # /dev/shm per GPU for NCCL and OpenMPI (counted against the memory limit)
    launcher_cpu: str = "1"  # the launcher only runs horovodrun/mpirun
    launcher_memory: str = "2Gi"
    stage_cpu: str = "2"  # each non-training stage pod (corpus, features, shards, evaluation)
    stage_memory: str = "8Gi"
    scratch_gib: int = 10  # size limit of /tmp and of the home directory in every pod
    network_interface: str = "eth0"  # pod network interface for MPI's TCP transport and NCCL sockets
    ssh_port: int = 2222  # port of the workers' unprivileged sshd (docker/train.Dockerfile)
    mpi_controller: Literal["mpi", "gloo"] = "mpi"  # horovodrun --mpi (OpenMPI, as the operator) or --gloo
    start_timeout_s: int = 600  # horovodrun --start-timeout: ssh checks and rendezvous on all workers
    nccl_env: tuple[tuple[str, ...], ...] = (("NCCL_DEBUG", "WARN"),)  # more NCCL_*, e.g. NCCL_IB_DISABLE
    mlflow_tracking_uri: str = "http://mlflow:5000"  # the MLflow Service of k8s/base
    s3_endpoint: str = "minio:9000"  # host:port of the S3 API (MinIO of k8s/base); "" when no S3 is used
    s3_use_https: bool = False  # in-cluster MinIO speaks plain HTTP
    s3_region: str = "us-east-1"  # MinIO ignores it; the AWS SDK wants one
    s3_secret: str = "s3-credentials"  # Secret with the pipeline's S3 access key (see k8s/README.md)
    s3_access_key_field: str = "access-key"  # key of the access key id in that Secret
    s3_secret_key_field: str = "secret-key"  # key of the secret access key in that Secret
    backoff_limit: int = 0  # launcher retries inside one MPIJob; 0 leaves retries to Airflow
    active_deadline_s: int = 0  # wall-clock limit of the launcher; 0 for none
    ttl_after_finished_s: int = 86400  # the finished MPIJob (and its launcher log) is deleted after this

    def __post_init__(self) -> None:
        # (name, value) pairs are tuples of strings rather than a mapping so that the settings stay
        # hashable and load from YAML as lists of two-item lists.
        for field in ("gpu_node_selector", "nccl_env"):
            for pair in getattr(self, field):
                if len(pair) != 2:
                    raise ValueError(f"ClusterSettings.{field}: expected [name, value] pairs, got {list(pair)!r}")


def load_settings(path: str | Path | None = None, assignments: Sequence[str] = ()) -> ClusterSettings:
    """ClusterSettings: the defaults, then a YAML file (e.g. k8s/overlays/gpu/cluster.yaml), then `key=value`s."""
    return config_lib.load(ClusterSettings, path, assignments)


def safe_name(prefix: str, *parts: str, max_len: int = MAX_JOB_NAME) -> str:
    """A DNS-label name from `prefix` and free text (a run id): lower case, dashes, a hash when shortened.

    `safe_name("train-asr", "manual__2026-01-01T00:00:00+00:00")` ->
    `train-asr-manual-2026-01-01t00-00-00-00-28b5562b`; the hash keeps run ids that differ only in
    dropped characters apart.
    """
    raw = "-".join((prefix, *parts))
    name = re.sub(r"[^a-z0-9-]+", "-", raw.lower()).strip("-")
    name = re.sub(r"-{2,}", "-", name)
    if not name or not name[0].isalpha():
        name = f"x-{name}"
    if len(name) > max_len or name != raw:
        digest = hashlib.sha256(raw.encode()).hexdigest()[:8]
        name = f"{name[: max_len - 9].rstrip('-')}-{digest}"
    return name


def _check_name(name: str, max_len: int) -> None:
    if len(name) > max_len or not _DNS_LABEL.match(name):
        raise ValueError(
            f"invalid Kubernetes name {name!r}: use at most {max_len} lower-case letters, digits and '-', "
            f"starting with a letter (pipeline.k8s.safe_name builds one from free text)"
        )


def _labels(component: str) -> dict[str, str]:
    return {
        PIPELINE_POD_LABEL[0]: PIPELINE_POD_LABEL[1],
        PART_OF_LABEL[0]: PART_OF_LABEL[1],
        COMPONENT_LABEL: component,
        OBJECT_STORE_CLIENT_LABEL[0]: OBJECT_STORE_CLIENT_LABEL[1],
    }


# Checks of checkov (the manifest scanner CI runs) that do not fit a pipeline pod, with the reason;
# they travel as `checkov.io/skipN` annotations on the pod templates (checkov's suppression syntax).
_SKIP_ENV_SECRETS = (
    "CKV_K8S_35",
    "tensorflow-io's S3 filesystem (AWS C++ SDK) is given its keys as environment variables from the "
    "s3-credentials Secret; they never appear in a manifest",
)
_SKIP_DIGEST = (
    "CKV_K8S_43",
    "the image is pinned by its version tag; set ClusterSettings.image to name@sha256:... to pin a digest",
)
_SKIP_PULL_POLICY = (
    "CKV_K8S_15",
    "these settings pull IfNotPresent: images loaded straight into a single node's runtime are in no registry",
)
_SKIP_LIVENESS = ("CKV_K8S_8", "a run-to-completion process: a hang is bounded by the DAG's task timeout")
_SKIP_READINESS = ("CKV_K8S_9", "a run-to-completion process serves no traffic")


def _skip_annotations(settings: ClusterSettings, *skips: tuple[str, str]) -> dict[str, str]:
    skips = tuple(skips)
    if settings.s3_endpoint:
        skips += (_SKIP_ENV_SECRETS,)
    if "@sha256:" not in settings.image:
        skips += (_SKIP_DIGEST,)
    if settings.image_pull_policy != "Always":
        skips += (_SKIP_PULL_POLICY,)
    return {f"checkov.io/skip{i}": f"{check}={reason}" for i, (check, reason) in enumerate(skips, start=1)}


def _env(settings: ClusterSettings) -> list[dict[str, Any]]:
    """Environment of every pipeline process: MLflow, S3 for tensorflow-io, caches off the read-only root."""
    env: list[dict[str, Any]] = [
        {"name": "MLFLOW_TRACKING_URI", "value": settings.mlflow_tracking_uri},
        {"name": "PYTHONUNBUFFERED", "value": "1"},  # log lines reach `kubectl logs` (and Airflow) at once
        {"name": "HOME", "value": settings.home},
        {"name": "TMPDIR", "value": "/tmp"},
        {"name": "XDG_CACHE_HOME", "value": "/tmp/.cache"},
        {"name": "MPLCONFIGDIR", "value": "/tmp/.matplotlib"},
        {"name": "KERAS_HOME", "value": "/tmp/.keras"},
        {"name": "CUDA_CACHE_PATH", "value": "/tmp/.nv"},
    ]
    if settings.s3_endpoint:
        # tensorflow-io's s3:// filesystem reads these. Its AWS SDK takes the keys from the environment
        # (or an INI credentials file, which the Secret's two keys are not): from the Secret.
        env += [
            {"name": "S3_ENDPOINT", "value": settings.s3_endpoint},
            {"name": "S3_USE_HTTPS", "value": "1" if settings.s3_use_https else "0"},
            {"name": "S3_VERIFY_SSL", "value": "1" if settings.s3_use_https else "0"},
            {"name": "AWS_REGION", "value": settings.s3_region},
            {
                "name": "AWS_ACCESS_KEY_ID",
                "valueFrom": {"secretKeyRef": {"name": settings.s3_secret, "key": settings.s3_access_key_field}},
            },
            {
                "name": "AWS_SECRET_ACCESS_KEY",
                "valueFrom": {"secretKeyRef": {"name": settings.s3_secret, "key": settings.s3_secret_key_field}},
            },
        ]
    return env


def _train_env(settings: ClusterSettings) -> list[dict[str, Any]]:
    """`_env` plus what the Horovod ranks need: NCCL's interface and settings, OpenMPI's shared memory."""
    env = _env(settings)
    env.append({"name": "NCCL_SOCKET_IFNAME", "value": settings.network_interface})
    env += [{"name": k, "value": v} for k, v in settings.nccl_env if k != "NCCL_SOCKET_IFNAME"]
    # Ranks sharing a pod talk through /dev/shm; the cross-memory-attach fast path needs ptrace,
    # which an unprivileged container does not have.
    env.append({"name": "OMPI_MCA_btl_vader_single_copy_mechanism", "value": "none"})
    return env


def _pod_security(settings: ClusterSettings) -> dict[str, Any]:
    uid = settings.run_as_user
    return {
        "runAsNonRoot": True,
        "runAsUser": uid,
        "runAsGroup": uid,
        "fsGroup": uid,
        # A data volume of millions of files would otherwise be chown-ed on every pod start.
        "fsGroupChangePolicy": "OnRootMismatch",
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def _container_security() -> dict[str, Any]:
    return {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }


def _scratch_volumes(settings: ClusterSettings) -> tuple[list[dict], list[dict]]:
    """/tmp and the home directory as pod-local scratch (the root filesystem is read-only)."""
    size = f"{settings.scratch_gib}Gi"
    volumes = [
        {"name": "tmp", "emptyDir": {"sizeLimit": size}},
        {"name": "home", "emptyDir": {"sizeLimit": size}},
    ]
    mounts = [{"name": "tmp", "mountPath": "/tmp"}, {"name": "home", "mountPath": settings.home}]
    return volumes, mounts


def _data_volume(settings: ClusterSettings) -> tuple[dict, dict]:
    volume = {"name": "data", "persistentVolumeClaim": {"claimName": settings.data_claim}}
    return volume, {"name": "data", "mountPath": settings.data_mount}


def _common_pod_spec(settings: ClusterSettings) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "serviceAccountName": settings.service_account,
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "securityContext": _pod_security(settings),
    }
    if settings.image_pull_secrets:
        spec["imagePullSecrets"] = [{"name": s} for s in settings.image_pull_secrets]
    if settings.priority_class:
        spec["priorityClassName"] = settings.priority_class
    return spec


def _tolerations(settings: ClusterSettings) -> list[dict[str, str]]:
    out = []
    for t in settings.gpu_tolerations:
        item = {"key": t.key, "operator": t.operator}
        if t.operator == "Equal":
            item["value"] = t.value
        if t.effect:
            item["effect"] = t.effect
        out.append(item)
    return out


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
        MPI_HOSTFILE,
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
    _check_name(name, MAX_JOB_NAME)
    if num_workers < 1:
        raise ValueError(f"MPIJob {name}: num_workers must be at least 1, got {num_workers}")
    if gpus < 0:
        raise ValueError(f"MPIJob {name}: gpus_per_worker must be 0 (CPU) or more, got {gpus}")
    slots = max(gpus, 1)
    num_proc = num_workers * slots
    ssh_dir = f"{settings.home}/.ssh"
    scratch_volumes, scratch_mounts = _scratch_volumes(settings)
    data_volume, data_mount = _data_volume(settings)

    launcher_spec = _common_pod_spec(settings)
    launcher_spec.update(
        # Tolerated, not required: on a cluster of GPU nodes only, the launcher still finds a place.
        tolerations=_tolerations(settings),
        containers=[
            {
                "name": "launcher",
                "image": settings.image,
                "imagePullPolicy": settings.image_pull_policy,
                "command": horovodrun_command(num_proc, train_args, settings),
                # horovodrun hands its whole environment to every rank (mpirun -x NAME), so
                # the ranks' settings live here, on the launcher.
                "env": _train_env(settings),
                "resources": {
                    "requests": {"cpu": settings.launcher_cpu, "memory": settings.launcher_memory},
                    "limits": {"cpu": settings.launcher_cpu, "memory": settings.launcher_memory},
                },
                "securityContext": _container_security(),
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
    worker_spec = _common_pod_spec(settings)
    if gpus:
        worker_spec["nodeSelector"] = dict(settings.gpu_node_selector)
        worker_spec["tolerations"] = _tolerations(settings)
    worker_spec.update(
        containers=[
            {
                "name": "worker",
                "image": settings.image,
                "imagePullPolicy": settings.image_pull_policy,
                # Unprivileged sshd: the operator mounts this job's key pair into ~/.ssh, which
                # serves as host key and authorized key; mpirun starts the ranks through it.
                "command": ["/usr/sbin/sshd", "-De", "-f", "/etc/ssh/speechflow_sshd_config"],
                "env": _train_env(settings),
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
                "securityContext": _container_security(),
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
        "apiVersion": MPIJOB_API_VERSION,
        "kind": MPIJOB_KIND,
        "metadata": {
            "name": name,
            "namespace": settings.namespace,
            "labels": {PART_OF_LABEL[0]: PART_OF_LABEL[1]},
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
                            "labels": _labels("train-launcher"),
                            "annotations": _skip_annotations(settings, _SKIP_LIVENESS, _SKIP_READINESS),
                        },
                        "spec": launcher_spec,
                    },
                },
                "Worker": {
                    "replicas": num_workers,
                    "restartPolicy": "Never",
                    "template": {
                        "metadata": {
                            "labels": _labels("train-worker"),
                            "annotations": _skip_annotations(settings),
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
    """A Pod running `python -m MODULE ARGS` with the training image, the data claim and the S3 secret.

    For the non-training stages (`pipeline.corpus`, `pipeline.features`, `pipeline.shards`,
    `models.evaluate`). `gpus > 0` adds GPU limits and the GPU node selector. Returns the manifest.
    """
    settings = settings or ClusterSettings()
    _check_name(name, 63)
    if not re.fullmatch(r"[A-Za-z_][\w.]*", module):
        raise ValueError(f"stage pod {name}: {module!r} is not a Python module name such as pipeline.features")
    scratch_volumes, scratch_mounts = _scratch_volumes(settings)
    data_volume, data_mount = _data_volume(settings)
    resources: dict[str, dict[str, Any]] = {
        "requests": {"cpu": settings.stage_cpu, "memory": settings.stage_memory},
        "limits": {"cpu": settings.stage_cpu, "memory": settings.stage_memory},
    }
    spec = _common_pod_spec(settings)
    if gpus:
        resources["limits"]["nvidia.com/gpu"] = gpus
        spec["nodeSelector"] = dict(settings.gpu_node_selector)
        spec["tolerations"] = _tolerations(settings)
    spec.update(
        restartPolicy="Never",
        containers=[
            {
                "name": STAGE_CONTAINER,
                "image": settings.image,
                "imagePullPolicy": settings.image_pull_policy,
                "command": ["python", "-m", module],
                "args": list(args),
                "env": _env(settings),
                "resources": resources,
                "securityContext": _container_security(),
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
            "labels": _labels("stage"),
            "annotations": _skip_annotations(settings, _SKIP_LIVENESS, _SKIP_READINESS),
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
        "base_container_name": STAGE_CONTAINER,
        "get_logs": True,
        # The training image is large: its first pull on a node takes minutes.
        "startup_timeout_seconds": 900,
        "on_finish_action": "delete_succeeded_pod",
    }


def launcher_pod_selector(job_name: str) -> str:
    """Label selector of an MPIJob's launcher pod (for `kubectl logs -l` or the DAG's log follower)."""
    return f"{JOB_NAME_LABEL}={job_name},{JOB_ROLE_LABEL}=launcher"


def mpijob_phase(status: Mapping[str, Any] | None) -> Literal["Pending", "Running", "Succeeded", "Failed"]:
    """Collapses an MPIJob's `.status` (conditions Created/Running/Restarting/Suspended/Succeeded/Failed).

    Terminal conditions win over Running; a job with no true condition yet (just submitted, or
    suspended) is Pending.
    """
    true_types = {c.get("type") for c in (status or {}).get("conditions") or [] if str(c.get("status")) == "True"}
    if "Failed" in true_types:
        return "Failed"
    if "Succeeded" in true_types:
        return "Succeeded"
    if true_types & {"Running", "Restarting"}:
        return "Running"
    return "Pending"


def mpijob_failure_message(status: Mapping[str, Any] | None) -> str:
    """`reason: message` of the MPIJob's true Failed condition, or "" when it has not failed."""
    for c in (status or {}).get("conditions") or []:
        if c.get("type") == "Failed" and str(c.get("status")) == "True":
            return f"{c.get('reason', 'Failed')}: {c.get('message', '')}".strip()
    return ""


class _NoAliasDumper(yaml.SafeDumper):
    """Writes repeated objects out in full: manifests are read by people, not only by parsers."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def to_yaml(manifest: Mapping[str, Any]) -> str:
    """The manifest as YAML, keys in the order they were built (the order `kubectl` users expect)."""
    return yaml.dump(dict(manifest), Dumper=_NoAliasDumper, sort_keys=False, default_flow_style=False, width=96)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m pipeline.k8s",
        description="Print the Kubernetes manifest of a training job or a stage pod (pipe it into `kubectl create -f -`).",
    )
    parser.add_argument(
        "--settings",
        type=Path,
        help="YAML file of ClusterSettings fields, e.g. k8s/overlays/gpu/cluster.yaml",
    )
    parser.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="override a ClusterSettings field"
    )
    sub = parser.add_subparsers(dest="what", required=True)
    job = sub.add_parser("mpijob", help="an MPIJob running `horovodrun ... python -m models.train ARGS`")
    job.add_argument("--name", required=True, help=f"MPIJob name (a DNS label, at most {MAX_JOB_NAME} characters)")
    job.add_argument("--num-workers", type=int, required=True, help="worker pods (one per GPU node)")
    job.add_argument("--gpus-per-worker", type=int, help="GPUs (= MPI slots) per worker; default from the settings")
    job.add_argument("train_args", nargs=argparse.REMAINDER, help="-- then the arguments of models.train")
    pod = sub.add_parser("stage-pod", help="a Pod running `python -m MODULE ARGS`")
    pod.add_argument("--name", required=True, help="Pod name (a DNS label)")
    pod.add_argument("--module", required=True, help="stage module, e.g. pipeline.features or models.evaluate")
    pod.add_argument("--gpus", type=int, default=0, help="GPUs for the pod (default 0)")
    pod.add_argument("stage_args", nargs=argparse.REMAINDER, help="-- then the stage's arguments")
    args = parser.parse_args(argv)

    settings = load_settings(args.settings, args.set)
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
