"""Cluster settings and the pieces every pod of the pipeline shares (names, labels, security, volumes,
the extensions the rendering process names and the mount of their code).

`ClusterSettings` says where and how pods run; workflow/training_job.py (the training MPIJob) and
workflow/pods.py (stage pods, the tf.data service) build whole objects from it, workflow/mpijob.py
submits and follows an MPIJob. Pure
functions over plain data: no Kubernetes client and no TensorFlow, so the Airflow image runs them.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from common import catalog
from common import config as configlib
from common.fsutil import slug

# The MPIJob resource, as the Kubernetes API names it (e.g. for CustomObjectsApi calls).
MPIJOB_GROUP = "kubeflow.org"
MPIJOB_VERSION = "v2beta1"
MPIJOB_PLURAL = "mpijobs"
MPIJOB_API_VERSION = f"{MPIJOB_GROUP}/{MPIJOB_VERSION}"
MPIJOB_KIND = "MPIJob"
# Where the MPI Operator mounts the hostfile it writes for the launcher.
MPI_HOSTFILE = "/etc/mpi/hostfile"
# Horovod elastic's host discovery in the training image (docker/train.Dockerfile copies
# scripts/discover_hosts.sh there): it lists the job's ready worker pods through the API.
DISCOVER_HOSTS_SCRIPT = "/opt/speechflow/scripts/discover_hosts.sh"
# Where the training image's processes import the modules SPEECHFLOW_EXTENSIONS names from (a third
# model or strategy, common/catalog.py): `ClusterSettings.extensions_dir` of the data claim, mounted
# read-only here and put on PYTHONPATH. The Airflow image has the same path on its PYTHONPATH, and
# k8s/airflow-values.yaml mounts the same directory there.
EXTENSIONS_MOUNT = "/opt/speechflow/extensions"
_MODULE_NAME = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")
# Ports of the tf.data service (pipeline/data_service.py): the dispatcher's, and each worker's.
DATA_SERVICE_DISPATCHER_PORT = 5050
DATA_SERVICE_WORKER_PORT = 5051
# KubernetesPodOperator follows the logs of the container with this name.
STAGE_CONTAINER = "base"
# Port of a model server (`render_serving`: `mlflow models serve` of a registered model).
SERVING_PORT = 8080
# Labels the kustomize base relies on (k8s/base/network-policies.yaml): pods named
# PIPELINE_POD_LABEL accept connections only from each other (ssh, MPI, NCCL between the ranks).
PART_OF_LABEL = ("app.kubernetes.io/part-of", "speechflow")
PIPELINE_POD_LABEL = ("app.kubernetes.io/name", "speechflow-pipeline")
# Model servers: asked by anyone on SERVING_PORT, they reach only MLflow (and DNS).
SERVING_POD_LABEL = ("app.kubernetes.io/name", "speechflow-serving")
COMPONENT_LABEL = "app.kubernetes.io/component"
INSTANCE_LABEL = "app.kubernetes.io/instance"  # tells one run's data service pods from another's
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
    # The elastic MPIJob's launcher: the one pipeline pod with an API token, allowed only to read
    # pods (k8s/elastic/), which its host discovery lists
    elastic_service_account: str = "speechflow-elastic-launcher"
    priority_class: str = ""  # PriorityClass of training and stage pods; "" for the cluster default
    data_claim: str = "speechflow-data"  # ReadWriteMany claim holding corpora, features, shards, runs
    data_mount: str = "/data"  # where that claim is mounted in every pipeline pod
    # Directory of the data claim (relative to its root) holding the code of the modules that
    # SPEECHFLOW_EXTENSIONS names, as an import root (module `a.b` is a/b.py under it); mounted
    # read-only at EXTENSIONS_MOUNT in every pod while the variable names a module
    extensions_dir: str = "extensions"
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
    stage_cpu: str = "2"  # each non-training stage pod (corpus, features, shards, the word LM, evaluation)
    stage_memory: str = "8Gi"
    scratch_gib: int = 10  # size limit of /tmp and of the home directory in every pod
    network_interface: str = "eth0"  # pod network interface for MPI's TCP transport and NCCL sockets
    ssh_port: int = 2222  # port of the workers' unprivileged sshd (docker/train.Dockerfile)
    mpi_controller: Literal["mpi", "gloo"] = "mpi"  # horovodrun --mpi (OpenMPI, as the operator) or --gloo
    start_timeout_s: int = 600  # horovodrun --start-timeout: ssh checks and rendezvous on all workers
    nccl_env: tuple[tuple[str, ...], ...] = (("NCCL_DEBUG", "WARN"),)  # more NCCL_*, e.g. NCCL_IB_DISABLE
    # The MLflow Service of k8s/base; it proxies artifacts too, so pods need no object-store credentials.
    mlflow_tracking_uri: str = "http://mlflow:5000"
    backoff_limit: int = 0  # launcher retries inside one MPIJob; 0 leaves retries to Airflow
    active_deadline_s: int = 0  # wall-clock limit of the launcher; 0 for none
    ttl_after_finished_s: int = 86400  # the finished MPIJob (and its launcher log) is deleted after this
    # Horovod elastic (an MPIJob rendered with min_workers): how long horovodrun waits for enough
    # hosts after a change, and the range of seconds a host whose ranks failed sits out before it is
    # tried again (a worker pod whose container restarted comes back under the same address)
    elastic_timeout_s: int = 600
    elastic_cooldown_s: tuple[int, int] = (30, 300)
    # tf.data service (DAG param data_service_workers, `python -m workflow.manifests data-service`):
    # CPU pods that make the acoustic model's batches for the GPU ranks
    data_service_worker_cpu: str = "8"  # each input worker: reading, parsing, decoding, batching
    data_service_worker_memory: str = "16Gi"
    data_service_dispatcher_cpu: str = "1"  # the dispatcher only hands out work and keeps its journal
    data_service_dispatcher_memory: str = "2Gi"
    # Node labels the data service pods require, e.g. [[node-pool, cpu]]; none: any node without taints
    data_service_node_selector: tuple[tuple[str, ...], ...] = ()
    # A model server (`python -m workflow.manifests serving`): each replica runs one `mlflow models
    # serve` worker, whose requests share TensorFlow's thread pools (docs/serving.md); scale by replicas
    serving_cpu: str = "2"
    serving_memory: str = "8Gi"

    def __post_init__(self) -> None:
        # (name, value) pairs are tuples of strings rather than a mapping so that the settings stay
        # hashable and load from YAML as lists of two-item lists.
        for field in ("gpu_node_selector", "nccl_env", "data_service_node_selector"):
            for pair in getattr(self, field):
                if len(pair) != 2:
                    raise ValueError(f"ClusterSettings.{field}: expected [name, value] pairs, got {list(pair)!r}")
        parts = Path(self.extensions_dir).parts
        if not parts or Path(self.extensions_dir).is_absolute() or ".." in parts:
            raise ValueError(
                f"ClusterSettings.extensions_dir: expected a directory relative to the data claim's root, such "
                f"as extensions, got {self.extensions_dir!r}"
            )
        low, high = self.elastic_cooldown_s
        if not 0 <= low <= high:
            raise ValueError(f"ClusterSettings.elastic_cooldown_s: expected [min, max] seconds, got {[low, high]}")


def load_settings(path: str | Path | None = None, assignments: Sequence[str] = ()) -> ClusterSettings:
    """ClusterSettings: the defaults, then a YAML file (e.g. k8s/overlays/gpu/cluster.yaml), then `key=value`s."""
    return configlib.load(ClusterSettings, path, assignments)


def safe_name(prefix: str, *parts: str, max_len: int = MAX_JOB_NAME) -> str:
    """A DNS-label name from `prefix` and free text (a run id): lower case, dashes, a hash when shortened.

    `safe_name("train-asr", "manual__2026-01-01T00:00:00+00:00")` ->
    `train-asr-manual-2026-01-01t00-00-00-00-28b5562b`; the hash keeps run ids that differ only in
    dropped characters apart.
    """
    return slug("-".join((prefix, *parts)), max_len, dns=True)


def check_name(name: str, max_len: int) -> None:
    if len(name) > max_len or not _DNS_LABEL.match(name):
        raise ValueError(
            f"invalid Kubernetes name {name!r}: use at most {max_len} lower-case letters, digits and '-', "
            f"starting with a letter (workflow.cluster.safe_name builds one from free text)"
        )


def labels(component: str, instance: str = "") -> dict[str, str]:
    """Labels of a pipeline pod: the NetworkPolicies' (pipeline pods reach each other), its role, its run."""
    out = {
        PIPELINE_POD_LABEL[0]: PIPELINE_POD_LABEL[1],
        PART_OF_LABEL[0]: PART_OF_LABEL[1],
        COMPONENT_LABEL: component,
    }
    if instance:
        out[INSTANCE_LABEL] = instance
    return out


# Checks of checkov (the manifest scanner CI runs) that do not fit a pipeline pod, with the reason;
# they travel as `checkov.io/skipN` annotations on the pod templates (checkov's suppression syntax).
SKIP_DIGEST = (
    "CKV_K8S_43",
    "the image is pinned by its version tag; set ClusterSettings.image to name@sha256:... to pin a digest",
)
SKIP_PULL_POLICY = (
    "CKV_K8S_15",
    "these settings pull IfNotPresent: images loaded straight into a single node's runtime are in no registry",
)
SKIP_LIVENESS = ("CKV_K8S_8", "a run-to-completion process: a hang is bounded by the DAG's task timeout")
SKIP_READINESS = ("CKV_K8S_9", "a run-to-completion process serves no traffic")
SKIP_TOKEN = (
    "CKV_K8S_38",
    "Horovod elastic's host discovery lists this job's worker pods through the API; the account may "
    "only read pods (k8s/elastic/)",
)


def skip_annotations(settings: ClusterSettings, *skips: tuple[str, str]) -> dict[str, str]:
    skips = tuple(skips)
    if "@sha256:" not in settings.image:
        skips += (SKIP_DIGEST,)
    if settings.image_pull_policy != "Always":
        skips += (SKIP_PULL_POLICY,)
    return {f"checkov.io/skip{i}": f"{check}={reason}" for i, (check, reason) in enumerate(skips, start=1)}


def extension_modules(environ: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """The modules SPEECHFLOW_EXTENSIONS names in the environment of the process that renders the
    manifests (`environ`, default os.environ): the Airflow pods' (k8s/airflow-values.yaml `env`), or
    the shell's for `python -m workflow.manifests`. It is the variable the DAG parser and the plan read
    the catalog with, so the pods know exactly the models and strategies the run was planned with.
    Raises ValueError for a name that is not a module path."""
    raw = (os.environ if environ is None else environ).get(catalog.EXTENSIONS_ENV, "")
    modules = tuple(name.strip() for name in raw.split(",") if name.strip())
    for name in modules:
        if not _MODULE_NAME.match(name):
            raise ValueError(
                f"{catalog.EXTENSIONS_ENV}: {name!r} is not a Python module name; list modules such as "
                f"my_models.speaker_id, separated by commas"
            )
    return modules


def extension_mounts(settings: ClusterSettings) -> list[dict[str, Any]]:
    """The read-only mount of the claim's `extensions_dir` at EXTENSIONS_MOUNT, where the pods import
    the extensions from; none while SPEECHFLOW_EXTENSIONS names no module (see `extension_modules`).

    Every pod that runs the training image carries it with `pod_env`'s variables. The code travels on
    the data claim, which every pipeline pod shares already: placing a module there takes no image
    rebuild, and the mount shows only that directory, read-only, also to the model server.
    """
    if not extension_modules():
        return []
    volume, _ = data_volume(settings)
    return [
        {"name": volume["name"], "mountPath": EXTENSIONS_MOUNT, "subPath": settings.extensions_dir, "readOnly": True}
    ]


def extension_volumes(settings: ClusterSettings) -> list[dict[str, Any]]:
    """The data claim, read-only, for `extension_mounts` in a pod that does not mount it otherwise (the
    MPIJob's launcher, a model server); none while SPEECHFLOW_EXTENSIONS names no module."""
    if not extension_modules():
        return []
    volume, _ = data_volume(settings)
    return [{**volume, "persistentVolumeClaim": {**volume["persistentVolumeClaim"], "readOnly": True}}]


def pod_env(settings: ClusterSettings) -> list[dict[str, Any]]:
    """Environment of every pipeline process: MLflow, caches off the read-only root, and the extensions
    (SPEECHFLOW_EXTENSIONS and PYTHONPATH at EXTENSIONS_MOUNT) when the rendering process names any."""
    env = [
        {"name": "MLFLOW_TRACKING_URI", "value": settings.mlflow_tracking_uri},
        {"name": "PYTHONUNBUFFERED", "value": "1"},  # log lines reach `kubectl logs` (and Airflow) at once
        {"name": "HOME", "value": settings.home},
        {"name": "TMPDIR", "value": "/tmp"},
        {"name": "XDG_CACHE_HOME", "value": "/tmp/.cache"},
        {"name": "MPLCONFIGDIR", "value": "/tmp/.matplotlib"},
        {"name": "KERAS_HOME", "value": "/tmp/.keras"},
        {"name": "CUDA_CACHE_PATH", "value": "/tmp/.nv"},
    ]
    modules = extension_modules()
    if modules:
        # The image sets no PYTHONPATH (the project is installed), so this one is the whole of it.
        env += [
            {"name": catalog.EXTENSIONS_ENV, "value": ",".join(modules)},
            {"name": "PYTHONPATH", "value": EXTENSIONS_MOUNT},
        ]
    return env


def train_env(settings: ClusterSettings) -> list[dict[str, Any]]:
    """`pod_env` plus what the Horovod ranks need: NCCL's interface and settings, OpenMPI's shared memory."""
    env = pod_env(settings)
    env.append({"name": "NCCL_SOCKET_IFNAME", "value": settings.network_interface})
    env += [{"name": k, "value": v} for k, v in settings.nccl_env if k != "NCCL_SOCKET_IFNAME"]
    # Ranks sharing a pod talk through /dev/shm; the cross-memory-attach fast path needs ptrace,
    # which an unprivileged container does not have.
    env.append({"name": "OMPI_MCA_btl_vader_single_copy_mechanism", "value": "none"})
    return env


def pod_security(settings: ClusterSettings) -> dict[str, Any]:
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


def container_security() -> dict[str, Any]:
    return {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }


def scratch_volumes(settings: ClusterSettings) -> tuple[list[dict], list[dict]]:
    """/tmp and the home directory as pod-local scratch (the root filesystem is read-only)."""
    size = f"{settings.scratch_gib}Gi"
    volumes = [
        {"name": "tmp", "emptyDir": {"sizeLimit": size}},
        {"name": "home", "emptyDir": {"sizeLimit": size}},
    ]
    mounts = [{"name": "tmp", "mountPath": "/tmp"}, {"name": "home", "mountPath": settings.home}]
    return volumes, mounts


def data_volume(settings: ClusterSettings) -> tuple[dict, dict]:
    volume = {"name": "data", "persistentVolumeClaim": {"claimName": settings.data_claim}}
    return volume, {"name": "data", "mountPath": settings.data_mount}


def common_pod_spec(settings: ClusterSettings) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "serviceAccountName": settings.service_account,
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "securityContext": pod_security(settings),
    }
    if settings.image_pull_secrets:
        spec["imagePullSecrets"] = [{"name": s} for s in settings.image_pull_secrets]
    if settings.priority_class:
        spec["priorityClassName"] = settings.priority_class
    return spec


def tolerations(settings: ClusterSettings) -> list[dict[str, str]]:
    out = []
    for t in settings.gpu_tolerations:
        item = {"key": t.key, "operator": t.operator}
        if t.operator == "Equal":
            item["value"] = t.value
        if t.effect:
            item["effect"] = t.effect
        out.append(item)
    return out
