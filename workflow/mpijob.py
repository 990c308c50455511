"""Submitting and following the training MPIJob: the DAG's cluster-mode client.

`run_mpijob` deletes an earlier attempt's job, submits the manifest from
`workflow.training_job.render_mpijob`, streams the launcher pod's log into the task log, and deletes the
job unless it succeeds (its GPUs go back to the cluster). The Kubernetes clients are handed in, so
the tests drive it with fakes; `kubernetes_apis` gets the real ones from Airflow's Kubernetes hook.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any, Literal

from workflow.cluster import JOB_NAME_LABEL, JOB_ROLE_LABEL, MPIJOB_GROUP, MPIJOB_PLURAL, MPIJOB_VERSION
from workflow.local import StageError

log = logging.getLogger(__name__)


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
    try:
        custom_api.delete_namespaced_custom_object(
            MPIJOB_GROUP,
            MPIJOB_VERSION,
            namespace,
            MPIJOB_PLURAL,
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
            custom_api.get_namespaced_custom_object(MPIJOB_GROUP, MPIJOB_VERSION, namespace, MPIJOB_PLURAL, name)
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
    streamed: set[str] = set()
    while True:
        job = custom_api.get_namespaced_custom_object(MPIJOB_GROUP, MPIJOB_VERSION, namespace, MPIJOB_PLURAL, name)
        status = job.get("status") or {}
        for pod in core_api.list_namespaced_pod(namespace, label_selector=launcher_pod_selector(name)).items:
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
        phase = mpijob_phase(status)
        if phase == "Succeeded":
            return status
        if phase == "Failed":
            raise StageError(
                f"MPIJob {namespace}/{name} failed: {mpijob_failure_message(status)}; see the launcher's log above"
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
    name, namespace = manifest["metadata"]["name"], manifest["metadata"]["namespace"]
    if delete_mpijob(custom_api, name, namespace, sleep=sleep):
        emit(f"deleted MPIJob {namespace}/{name} of an earlier attempt")
    custom_api.create_namespaced_custom_object(MPIJOB_GROUP, MPIJOB_VERSION, namespace, MPIJOB_PLURAL, manifest)
    emit(
        f"submitted MPIJob {namespace}/{name}: {manifest['spec']['mpiReplicaSpecs']['Worker']['replicas']} "
        f"workers x {manifest['spec']['slotsPerWorker']} slots"
    )
    try:
        return follow_mpijob(custom_api, core_api, name, namespace, emit, poll_s, sleep)
    except BaseException:  # failed, timed out or killed: free the GPUs
        delete_mpijob(custom_api, name, namespace, sleep=sleep)
        raise


def kubernetes_apis():
    from airflow.providers.cncf.kubernetes.hooks.kubernetes import KubernetesHook

    hook = KubernetesHook()  # the connection kubernetes_default, else the in-cluster configuration
    return hook.custom_object_client, hook.core_v1_client
