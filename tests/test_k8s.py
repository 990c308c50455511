"""Cluster mode without a cluster: what workflow/training_job.py and workflow/pods.py render, the kustomize tree,
and the validators.

The MPIJob checks use the MPI Operator's CRD shipped in k8s/schemas/. The end-to-end run of
scripts/validate_k8s.sh needs .venv-k8s.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import json
import re
import shutil
import subprocess
import sys
import textwrap

import pytest
import yaml

from common import catalog
from models.serving import mlflow_serve
from tests.conftest import AIRFLOW_BIN, ROOT
from workflow import cluster, manifests, mpijob, pods, training_job

CRD = ROOT / "k8s" / "schemas" / "mpijobs.kubeflow.org-v0.8.2.yaml"
VENV_K8S = ROOT / ".venv-k8s"
# The kubectl pinned in .venv-k8s (requirements/k8s.in), else the machine's.
KUBECTL = str(VENV_K8S / "bin" / "kubectl") if (VENV_K8S / "bin" / "kubectl").exists() else shutil.which("kubectl")
OVERLAYS = ("gpu", "single-node")
TRAIN_ARGS = [
    "--model",
    "asr",
    "--strategy",
    "allreduce",
    "--shards",
    "/data/shards",
    "--workdir",
    "/data/runs/r1",
]

# A third model and a third strategy (tests/test_extension.py trains them).
EXTENSIONS = "tests.extension.speaker_id,tests.extension.local_sgd"

needs_kubectl = pytest.mark.skipif(KUBECTL is None, reason="kubectl is not installed (it renders the kustomizations)")


@pytest.fixture(autouse=True)
def no_extensions(monkeypatch):
    """The renderers read SPEECHFLOW_EXTENSIONS from this process: none, unless a test names some."""
    monkeypatch.delenv(catalog.EXTENSIONS_ENV, raising=False)


def _load_validator():
    spec = importlib.util.spec_from_file_location("validate_mpijob", ROOT / "scripts" / "validate_mpijob.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


validate_mpijob = _load_validator()


@functools.cache
def crd_schema() -> dict:
    """The MPIJob CRD's v2beta1 schema, strict (parsing the CRD takes seconds: once per session)."""
    return validate_mpijob.strict(validate_mpijob.crd_schema(CRD))


def settings_of(overlay: str) -> cluster.ClusterSettings:
    return cluster.load_settings(ROOT / "k8s" / "overlays" / overlay / "cluster.yaml")


def replica(job: dict, role: str) -> dict:
    return job["spec"]["mpiReplicaSpecs"][role]


def container(job: dict, role: str) -> dict:
    return replica(job, role)["template"]["spec"]["containers"][0]


def env_of(c: dict) -> dict:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in c["env"]}


def base_docs() -> list[dict]:
    docs = []
    for path in sorted((ROOT / "k8s" / "base").glob("*.yaml")):
        if path.name != "kustomization.yaml":
            docs += [d for d in yaml.safe_load_all(path.read_text()) if d]
    return docs


def find(docs: list[dict], kind: str, name: str) -> dict:
    matches = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(matches) == 1, f"expected one {kind}/{name}, found {len(matches)}"
    return matches[0]


# ---- render_mpijob -----------------------------------------------------------------------------


def test_mpijob_launcher_runs_horovodrun_over_all_gpus_with_the_train_args():
    settings = dataclasses.replace(cluster.ClusterSettings(), image="registry.example/speechflow/train:1.2.3")
    job = training_job.render_mpijob("asr-run", TRAIN_ARGS, num_workers=2, gpus_per_worker=4, settings=settings)

    assert job["apiVersion"] == "kubeflow.org/v2beta1" and job["kind"] == "MPIJob"
    assert job["metadata"] == {
        "name": "asr-run",
        "namespace": "speechflow",
        "labels": {"app.kubernetes.io/part-of": "speechflow"},
    }
    launcher = container(job, "Launcher")
    assert launcher["image"] == "registry.example/speechflow/train:1.2.3"
    command = launcher["command"]
    assert command[:3] == ["horovodrun", "-np", "8"]
    # The operator's OpenMPI hostfile (`host slots=N` lines) is what horovodrun reads.
    assert command[command.index("--hostfile") + 1] == "/etc/mpi/hostfile"
    assert "--mpi" in command and command[command.index("--ssh-port") + 1] == "2222"
    assert command[command.index("--network-interfaces") + 1] == "eth0"
    tail = command[command.index("python") :]
    assert tail == ["python", "-m", "models.train", *TRAIN_ARGS]
    assert "nvidia.com/gpu" not in launcher["resources"]["limits"]
    assert replica(job, "Launcher")["replicas"] == 1


def test_mpijob_workers_get_gpus_slots_gpu_nodes_shm_and_nccl_settings():
    settings = settings_of("gpu")
    job = training_job.render_mpijob("asr-run", TRAIN_ARGS, num_workers=3, settings=settings)
    spec = job["spec"]
    assert spec["slotsPerWorker"] == settings.gpus_per_worker == 4
    assert spec["launcherCreationPolicy"] == "WaitForWorkersReady"
    assert spec["mpiImplementation"] == "OpenMPI"
    assert spec["sshAuthMountPath"] == "/home/mpiuser/.ssh"
    assert spec["runPolicy"]["cleanPodPolicy"] == "Running"
    assert container(job, "Launcher")["command"][:3] == ["horovodrun", "-np", "12"]

    worker = replica(job, "Worker")
    assert worker["replicas"] == 3 and worker["restartPolicy"] == "Never"
    pod = worker["template"]["spec"]
    c = container(job, "Worker")
    assert c["resources"]["limits"]["nvidia.com/gpu"] == 4
    assert c["resources"]["limits"]["cpu"] == c["resources"]["requests"]["cpu"] == "32"
    assert c["command"][0] == "/usr/sbin/sshd" and c["readinessProbe"]["tcpSocket"]["port"] == 2222
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert pod["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]

    shm = next(v for v in pod["volumes"] if v["name"] == "dshm")
    assert shm["emptyDir"] == {"medium": "Memory", "sizeLimit": "16Gi"}
    assert {"name": "dshm", "mountPath": "/dev/shm"} in c["volumeMounts"]
    data = next(v for v in pod["volumes"] if v["name"] == "data")
    assert data["persistentVolumeClaim"]["claimName"] == "speechflow-data"

    # horovodrun forwards the launcher's environment to every rank: NCCL settings must be there.
    launcher_env = env_of(container(job, "Launcher"))
    assert launcher_env["NCCL_SOCKET_IFNAME"] == "eth0"
    assert launcher_env["NCCL_DEBUG"] == "WARN"
    assert launcher_env["OMPI_MCA_btl_vader_single_copy_mechanism"] == "none"
    assert launcher_env["MLFLOW_TRACKING_URI"] == "http://mlflow:5000"
    # MLflow proxies artifacts: no pod carries object-store credentials.
    assert not any(name.startswith(("AWS_", "S3_")) for name in launcher_env)


def test_mpijob_pods_are_unprivileged():
    job = training_job.render_mpijob("asr-run", TRAIN_ARGS, num_workers=2)
    for role in ("Launcher", "Worker"):
        pod = replica(job, role)["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["runAsUser"] == 10001
        assert pod["automountServiceAccountToken"] is False
        sc = container(job, role)["securityContext"]
        assert sc == {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
        }


def test_mpijob_without_gpus_runs_one_slot_per_worker_anywhere():
    job = training_job.render_mpijob("cpu-run", TRAIN_ARGS, num_workers=2, gpus_per_worker=0)
    assert job["spec"]["slotsPerWorker"] == 1
    assert container(job, "Launcher")["command"][:3] == ["horovodrun", "-np", "2"]
    assert "nvidia.com/gpu" not in container(job, "Worker")["resources"]["limits"]
    assert "nodeSelector" not in replica(job, "Worker")["template"]["spec"]


@pytest.mark.parametrize(
    ("name", "workers", "gpus", "message"),
    [
        ("Bad_Name", 2, 1, "invalid Kubernetes name"),
        ("x" * 49, 2, 1, "at most 48"),
        ("ok-name", 0, 1, "num_workers must be at least 1"),
        ("ok-name", 1, -1, "gpus_per_worker"),
    ],
)
def test_mpijob_rejects_bad_input(name, workers, gpus, message):
    with pytest.raises(ValueError, match=message):
        training_job.render_mpijob(name, TRAIN_ARGS, num_workers=workers, gpus_per_worker=gpus)


def test_safe_name_makes_distinct_valid_job_names_from_run_ids():
    a = cluster.safe_name("train-asr", "manual__2026-01-01T00:00:00+00:00")
    b = cluster.safe_name("train-asr", "manual__2026-01-01T00:00:01+00:00")
    long = cluster.safe_name("train-asr", "scheduled__" + "x" * 80)
    for name in (a, b, long):
        assert len(name) <= cluster.MAX_JOB_NAME and re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", name), name
        training_job.render_mpijob(name, TRAIN_ARGS, num_workers=1)  # accepted
    assert a != b and a == cluster.safe_name("train-asr", "manual__2026-01-01T00:00:00+00:00")
    assert cluster.safe_name("train-asr") == "train-asr"


# ---- CRD schema ------------------------------------------------------------------------------


@pytest.mark.parametrize("overlay", [None, *OVERLAYS])
@pytest.mark.parametrize("gpus", [None, 0])
def test_rendered_mpijob_meets_the_crd_schema_and_operator_rules(overlay, gpus):
    settings = settings_of(overlay) if overlay else cluster.ClusterSettings()
    job = training_job.render_mpijob("asr-run", TRAIN_ARGS, num_workers=2, gpus_per_worker=gpus, settings=settings)
    schema = crd_schema()
    # Through YAML, as kubectl would receive it.
    assert validate_mpijob.validate_mpijob(yaml.safe_load(manifests.to_yaml(job)), schema) == []


def test_crd_validation_catches_unknown_fields_and_bad_values():
    schema = crd_schema()
    job = training_job.render_mpijob("asr-run", TRAIN_ARGS, num_workers=2)
    job["spec"]["slotPerWorker"] = 4  # typo: the API server would reject it as an unknown field
    container(job, "Worker")["resources"]["limits"]["nvidia.com/gpu"] = "one"
    replica(job, "Launcher")["replicas"] = 2
    errors = validate_mpijob.validate_mpijob(job, schema)
    assert any("slotPerWorker" in e for e in errors), errors
    assert any("nvidia.com/gpu" in e for e in errors), errors
    assert any("Launcher.replicas: must be 1" in e for e in errors), errors


def test_committed_mpijob_template_is_the_renderer_output():
    path = ROOT / "k8s" / "mpijob" / "train-asr.yaml"
    committed = yaml.safe_load(path.read_text())
    rendered = training_job.render_mpijob(
        "speechflow-train-asr",
        ["--model", "asr", "--strategy", "allreduce", "--shards", "/data/shards"]
        + ["--workdir", "/data/runs/speechflow-train-asr"],
        num_workers=2,
        gpus_per_worker=4,
        settings=settings_of("gpu"),
    )
    assert committed == rendered, f"{path} is stale: regenerate it with the command in its header"
    schema = crd_schema()
    assert validate_mpijob.validate_mpijob(committed, schema) == []


# ---- Horovod elastic -----------------------------------------------------------------------------


def test_elastic_mpijob_discovers_its_workers_through_the_api():
    settings = settings_of("gpu")
    job = training_job.render_mpijob("asr-el", TRAIN_ARGS, num_workers=4, settings=settings, min_workers=2)
    command = container(job, "Launcher")["command"]
    # 4 pods x 4 slots at most, 2 pods x 4 slots at least; hosts come from the discovery script.
    assert command[:7] == ["horovodrun", "-np", "16", "--min-np", "8", "--max-np", "16"]
    assert command[command.index("--host-discovery-script") + 1] == cluster.DISCOVER_HOSTS_SCRIPT
    assert "--hostfile" not in command and "--mpi" not in command and "--gloo" in command
    assert command[command.index("--blacklist-cooldown-range") + 1 :][:2] == ["30", "300"]
    assert command[command.index("python") :] == ["python", "-m", "models.train", *TRAIN_ARGS, "--elastic"]

    env = env_of(container(job, "Launcher"))
    # What scripts/discover_hosts.sh reads: the operator's labels of this job's workers, their slots.
    assert env["SPEECHFLOW_WORKER_SELECTOR"] == (
        "training.kubeflow.org/job-name=asr-el,training.kubeflow.org/job-role=worker"
    )
    assert env["SPEECHFLOW_SLOTS"] == "4"
    script = (ROOT / "scripts" / "discover_hosts.sh").read_text()
    assert "SPEECHFLOW_WORKER_SELECTOR" in script and "SPEECHFLOW_SLOTS" in script

    # The launcher alone holds an API token, of the pod-reading account; workers hold none.
    launcher = replica(job, "Launcher")["template"]
    assert launcher["spec"]["serviceAccountName"] == settings.elastic_service_account
    assert launcher["spec"]["automountServiceAccountToken"] is True
    assert any(v.startswith("CKV_K8S_38=") for v in launcher["metadata"]["annotations"].values())
    worker = replica(job, "Worker")
    assert worker["template"]["spec"]["automountServiceAccountToken"] is False
    assert worker["template"]["spec"]["serviceAccountName"] == settings.service_account
    assert worker["restartPolicy"] == "OnFailure" and worker["replicas"] == 4
    assert validate_mpijob.validate_mpijob(yaml.safe_load(manifests.to_yaml(job)), crd_schema()) == []

    # A fixed-size job keeps the hostfile and mounts no token.
    fixed = training_job.render_mpijob("asr-fixed", TRAIN_ARGS, num_workers=4, settings=settings)
    assert "--hostfile" in container(fixed, "Launcher")["command"]
    assert replica(fixed, "Launcher")["template"]["spec"]["automountServiceAccountToken"] is False


@pytest.mark.parametrize(
    ("min_workers", "args", "message"),
    [
        (0, TRAIN_ARGS, "min_workers must be between 1 and num_workers"),
        (3, TRAIN_ARGS, "min_workers must be between 1 and num_workers"),
        (1, ["--strategy", "adpsgd", "--shards", "/data/s"], "allreduce only"),
    ],
)
def test_elastic_mpijob_rejects_what_horovod_elastic_cannot_run(min_workers, args, message):
    with pytest.raises(ValueError, match=message):
        training_job.render_mpijob("asr-el", args, num_workers=2, min_workers=min_workers)


def test_committed_elastic_mpijob_is_the_renderer_output():
    path = ROOT / "k8s" / "mpijob" / "train-asr-elastic.yaml"
    committed = yaml.safe_load(path.read_text())
    rendered = training_job.render_mpijob(
        "speechflow-train-asr-elastic",
        ["--model", "asr", "--strategy", "allreduce", "--shards", "/data/shards"]
        + ["--workdir", "/data/runs/speechflow-train-asr-elastic"],
        num_workers=4,
        gpus_per_worker=4,
        settings=settings_of("gpu"),
        min_workers=2,
    )
    assert committed == rendered, f"{path} is stale: regenerate it with the command in its header"


def test_elastic_rbac_lets_the_launcher_read_pods_and_nothing_else():
    docs = [d for d in yaml.safe_load_all((ROOT / "k8s" / "elastic" / "rbac.yaml").read_text()) if d]
    name = cluster.ClusterSettings().elastic_service_account
    account = find(docs, "ServiceAccount", name)
    assert account["automountServiceAccountToken"] is False  # mounted only where a pod asks (the launcher)
    binding = find(docs, "RoleBinding", "speechflow-elastic-discovery")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": name, "namespace": "speechflow"}]
    role = find(docs, "Role", binding["roleRef"]["name"])
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}]
    # No other binding reaches the launcher's account: the base binds MPIJob rights to Airflow's
    # task pods by name, not to every account of the namespace.
    for doc in base_docs():
        if doc["kind"] in ("RoleBinding", "ClusterRoleBinding"):
            for subject in doc["subjects"]:
                assert subject["kind"] != "Group" and subject["name"] != name, doc["metadata"]["name"]


# ---- stage pods ------------------------------------------------------------------------------


def test_stage_pod_runs_the_module_with_the_data_claim():
    pod = pods.render_stage_pod("features", "pipeline.features", ["--data-dir", "/data/corpus/train"])
    assert pod["kind"] == "Pod" and pod["metadata"]["namespace"] == "speechflow"
    spec = pod["spec"]
    c = spec["containers"][0]
    assert c["name"] == "base"  # the container KubernetesPodOperator follows
    assert c["command"] == ["python", "-m", "pipeline.features"]
    assert c["args"] == ["--data-dir", "/data/corpus/train"]
    assert spec["restartPolicy"] == "Never"
    assert {"name": "data", "mountPath": "/data"} in c["volumeMounts"]
    env = env_of(c)
    assert env["MLFLOW_TRACKING_URI"] == "http://mlflow:5000"
    assert not [e for e in c["env"] if e["name"].startswith(("AWS_", "S3_")) or "valueFrom" in e]  # no credentials
    assert "nvidia.com/gpu" not in c["resources"]["limits"] and "nodeSelector" not in spec

    gpu_pod = pods.render_stage_pod("evaluate", "models.evaluate", ["--model", "/data/runs/r1"], gpus=1)
    assert gpu_pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert gpu_pod["spec"]["nodeSelector"] == {"nvidia.com/gpu.present": "true"}

    with pytest.raises(ValueError, match="not a Python module"):
        pods.render_stage_pod("x", "pipeline/features.py", [])


def test_stage_pod_operator_kwargs_carry_image_command_and_template():
    pod = pods.render_stage_pod("shards", "pipeline.shards", ["--split", "train=/data/c/train", "--out", "/data/s"])
    kwargs = pods.stage_pod_operator_kwargs(pod)
    assert kwargs["image"] == "speechflow/train:0.1.0"
    assert kwargs["cmds"] == ["python", "-m", "pipeline.shards"]
    assert kwargs["arguments"] == ["--split", "train=/data/c/train", "--out", "/data/s"]
    assert kwargs["namespace"] == "speechflow" and kwargs["base_container_name"] == "base"
    assert kwargs["pod_template_dict"] == pod
    assert kwargs["service_account_name"] == "speechflow-pipeline"


@pytest.mark.airflow
def test_kubernetes_pod_operator_builds_the_rendered_pod(tmp_path):
    python = AIRFLOW_BIN / "python"
    if not python.exists():
        pytest.skip(".venv-airflow is missing (make setup builds it)")
    # No cluster: a kubeconfig that names an unreachable server is enough to build the request.
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "none", "cluster": {"server": "https://127.0.0.1:1"}}],
                "users": [{"name": "none", "user": {"token": "none"}}],
                "contexts": [{"name": "none", "context": {"cluster": "none", "user": "none"}}],
                "current-context": "none",
            }
        )
    )
    script = textwrap.dedent(
        """
        import json
        from airflow.providers.cncf.kubernetes.operators.pod import KubernetesPodOperator
        from kubernetes.client import ApiClient
        from workflow.pods import render_stage_pod, stage_pod_operator_kwargs

        pod = render_stage_pod("evaluate", "models.evaluate", ["--model", "/data/runs/r1"], gpus=1)
        op = KubernetesPodOperator(task_id="evaluate", **stage_pod_operator_kwargs(pod))
        print("POD " + json.dumps(ApiClient().sanitize_for_serialization(op.build_pod_request_obj())))
        """
    )
    proc = subprocess.run(
        [str(python), "-c", script],
        cwd=ROOT,
        env={
            "PATH": "/usr/bin:/bin",
            "PYTHONPATH": str(ROOT),
            "KUBECONFIG": str(kubeconfig),
            "HOME": str(tmp_path),
            catalog.EXTENSIONS_ENV: EXTENSIONS,  # the operator keeps what the template adds for them
        },
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    built = json.loads(next(line for line in proc.stdout.splitlines() if line.startswith("POD "))[4:])
    spec = built["spec"]
    (c,) = spec["containers"]
    assert c["image"] == "speechflow/train:0.1.0"
    assert c["command"] == ["python", "-m", "models.evaluate"] and c["args"] == [
        "--model",
        "/data/runs/r1",
    ]
    assert c["resources"]["limits"]["nvidia.com/gpu"] in (1, "1")
    assert {"name": "data", "mountPath": "/data"} in c["volumeMounts"]
    assert any(e["name"] == "MLFLOW_TRACKING_URI" and e["value"] == "http://mlflow:5000" for e in c["env"])
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert {v["name"] for v in spec["volumes"]} == {"tmp", "home", "data"}
    assert {"name": catalog.EXTENSIONS_ENV, "value": EXTENSIONS} in c["env"]
    assert {"name": "data", "mountPath": cluster.EXTENSIONS_MOUNT, "subPath": "extensions", "readOnly": True} in (
        c["volumeMounts"]
    )


# ---- tf.data service -------------------------------------------------------------------------


def test_data_service_renders_a_dispatcher_service_and_workers_on_the_data_claim():
    settings = dataclasses.replace(
        settings_of("gpu"), data_service_worker_cpu="6", data_service_node_selector=(("pool", "cpu"),)
    )
    service, dispatcher, workers = pods.render_data_service(
        "data-asr", 3, settings, work_dir="/data/runs/r1/data-service/asr/try-1"
    )
    assert pods.data_service_address("data-asr") == "grpc://data-asr-dispatcher:5050"
    assert service["kind"] == "Service" and service["metadata"]["name"] == "data-asr-dispatcher"
    assert service["spec"]["ports"] == [{"name": "grpc", "port": 5050, "targetPort": "grpc", "protocol": "TCP"}]
    # The Service selects the dispatcher's pods, and only this run's.
    assert service["spec"]["selector"].items() <= dispatcher["spec"]["template"]["metadata"]["labels"].items()
    assert not service["spec"]["selector"].items() <= workers["spec"]["template"]["metadata"]["labels"].items()

    assert dispatcher["spec"]["replicas"] == 1 and dispatcher["spec"]["strategy"] == {"type": "Recreate"}
    d = dispatcher["spec"]["template"]["spec"]["containers"][0]
    assert d["command"] == ["python", "-m", "pipeline.data_service"]
    assert d["args"] == ["dispatcher", "--port", "5050", "--work-dir", "/data/runs/r1/data-service/asr/try-1"]
    assert {"name": "data", "mountPath": "/data"} in d["volumeMounts"]  # its journal: read-write

    assert workers["spec"]["replicas"] == 3
    pod = workers["spec"]["template"]["spec"]
    w = pod["containers"][0]
    # Each worker advertises its own pod IP, expanded by Kubernetes from the downward API.
    assert w["args"] == [
        "worker",
        "--dispatcher",
        "data-asr-dispatcher:5050",
        "--port",
        "5051",
        "--address",
        "$(POD_IP):5051",
    ]
    assert env_of(w)["POD_IP"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    # The shards, read-only, where the trainers see them.
    assert {"name": "data", "mountPath": "/data", "readOnly": True} in w["volumeMounts"]
    assert w["resources"]["limits"] == {"cpu": "6", "memory": settings.data_service_worker_memory}
    assert pod["nodeSelector"] == {"pool": "cpu"} and "nvidia.com/gpu" not in w["resources"]["limits"]
    for deployment in (dispatcher, workers):
        spec = deployment["spec"]
        assert spec["selector"]["matchLabels"].items() <= spec["template"]["metadata"]["labels"].items()
        assert spec["template"]["spec"]["automountServiceAccountToken"] is False
        c = spec["template"]["spec"]["containers"][0]
        assert c["readinessProbe"]["tcpSocket"]["port"] == c["ports"][0]["containerPort"]
        assert c["securityContext"]["readOnlyRootFilesystem"] is True

    # Without a journal the dispatcher only reads the claim.
    _, plain, _ = pods.render_data_service("data-asr", 1, settings)
    assert "--work-dir" not in plain["spec"]["template"]["spec"]["containers"][0]["args"]
    assert {"name": "data", "mountPath": "/data", "readOnly": True} in plain["spec"]["template"]["spec"]["containers"][
        0
    ]["volumeMounts"]


@pytest.mark.parametrize(
    ("workers", "work_dir", "message"),
    [(0, None, "num_workers must be at least 1"), (1, "/tmp/journal", "must be on the data claim")],
)
def test_data_service_rejects_bad_input(workers, work_dir, message):
    with pytest.raises(ValueError, match=message):
        pods.render_data_service("data-asr", workers, work_dir=work_dir)


def test_cli_prints_the_data_service(capsys):
    settings = ROOT / "k8s" / "overlays" / "gpu" / "cluster.yaml"
    assert manifests.main(["--settings", str(settings), "data-service", "--name", "d", "--num-workers", "2"]) == 0
    out = capsys.readouterr().out
    assert "--data-service grpc://d-dispatcher:5050" in out.splitlines()[0]
    assert list(yaml.safe_load_all(out)) == pods.render_data_service("d", 2, settings_of("gpu"))


# ---- extensions and the model server -----------------------------------------------------------


def every_container(settings: cluster.ClusterSettings) -> dict[str, tuple[dict, dict]]:
    """(pod spec, container) of every kind of pod the pipeline renders, by role."""
    args = ["--model", "speaker_id", "--strategy", "local_sgd", "--shards", "/data/shards", "--workdir", "/data/r"]
    job = training_job.render_mpijob("j", args, 2, settings=settings)
    # Elastic without --strategy: naming one would load the extensions into this process's registry.
    elastic = training_job.render_mpijob("e", args[:2] + args[4:], 2, settings=settings, min_workers=1)
    stage = pods.stage_pod_operator_kwargs(pods.render_stage_pod("s", "models.evaluate", [], settings, gpus=1))
    _, dispatcher, workers = pods.render_data_service("d", 2, settings, work_dir="/data/r/data-service")
    _, server = pods.render_serving("asr", "models:/speechflow-asr@champion", settings)
    specs = {
        "stage pod": stage["pod_template_dict"]["spec"],
        "MPIJob launcher": replica(job, "Launcher")["template"]["spec"],
        "MPIJob worker": replica(job, "Worker")["template"]["spec"],
        "elastic launcher": replica(elastic, "Launcher")["template"]["spec"],
        "elastic worker": replica(elastic, "Worker")["template"]["spec"],
        "data-service dispatcher": dispatcher["spec"]["template"]["spec"],
        "data-service worker": workers["spec"]["template"]["spec"],
        "model server": server["spec"]["template"]["spec"],
    }
    assert all(len(spec["containers"]) == 1 for spec in specs.values())
    return {role: (spec, spec["containers"][0]) for role, spec in specs.items()}


def test_extensions_reach_every_container(monkeypatch):
    """A third model registered where the manifests are rendered is known in every pod: the variable,
    and its code where PYTHONPATH points (the claim's extensions directory, read-only)."""
    settings = dataclasses.replace(settings_of("gpu"), extensions_dir="code/extensions")
    monkeypatch.setenv(catalog.EXTENSIONS_ENV, f" {EXTENSIONS.replace(',', ' , ')} ")
    for role, (spec, c) in every_container(settings).items():
        env = env_of(c)
        assert env.get(catalog.EXTENSIONS_ENV) == EXTENSIONS, role
        assert cluster.EXTENSIONS_MOUNT in env.get("PYTHONPATH", "").split(":"), role
        (mount,) = [m for m in c["volumeMounts"] if m["mountPath"] == cluster.EXTENSIONS_MOUNT]
        assert mount["subPath"] == "code/extensions" and mount["readOnly"] is True, role
        (volume,) = [v for v in spec["volumes"] if v["name"] == mount["name"]]
        assert volume["persistentVolumeClaim"]["claimName"] == settings.data_claim, role
    # horovodrun hands the launcher's environment to the ranks; the manifests stay valid.
    job = training_job.render_mpijob("j", TRAIN_ARGS, 2, settings=settings)
    assert validate_mpijob.validate_mpijob(yaml.safe_load(manifests.to_yaml(job)), crd_schema()) == []
    # Pods that otherwise do without the data claim see it read-only.
    launcher = replica(job, "Launcher")["template"]["spec"]
    assert [v["persistentVolumeClaim"]["readOnly"] for v in launcher["volumes"] if "persistentVolumeClaim" in v] == [
        True
    ]

    # No extension named: no variable, no PYTHONPATH, no mount (the committed templates are of this kind).
    monkeypatch.delenv(catalog.EXTENSIONS_ENV)
    for role, (spec, c) in every_container(settings).items():
        assert not {catalog.EXTENSIONS_ENV, "PYTHONPATH"} & env_of(c).keys(), role
        assert cluster.EXTENSIONS_MOUNT not in [m["mountPath"] for m in c["volumeMounts"]], role
        if "launcher" in role or role == "model server":
            assert "data" not in [v["name"] for v in spec["volumes"]], role

    monkeypatch.setenv(catalog.EXTENSIONS_ENV, "tests/extension/speaker_id.py")
    with pytest.raises(ValueError, match="not a Python module name"):
        pods.render_stage_pod("s", "pipeline.corpus", [], settings)
    for bad in ("/data/extensions", "../extensions", ""):
        with pytest.raises(ValueError, match="extensions_dir"):
            dataclasses.replace(settings, extensions_dir=bad)


def test_airflow_imports_extensions_from_the_directory_the_pods_do():
    """The DAG parser reads the registry too: its image looks where the pods look, and the chart's
    values mount that directory of the data claim there and carry the one SPEECHFLOW_EXTENSIONS."""
    settings = cluster.ClusterSettings()
    dockerfile = (ROOT / "docker" / "airflow.Dockerfile").read_text()
    pythonpath = re.search(r"^ENV PYTHONPATH=(\S+)", dockerfile, re.M).group(1).split(":")
    assert cluster.EXTENSIONS_MOUNT in pythonpath
    values = yaml.safe_load((ROOT / "k8s" / "airflow-values.yaml").read_text())
    (mount,) = [m for m in values["volumeMounts"] if m["mountPath"] == cluster.EXTENSIONS_MOUNT]
    assert mount["subPath"] == settings.extensions_dir and mount["readOnly"] is True
    (volume,) = [v for v in values["volumes"] if v["name"] == mount["name"]]
    assert volume["persistentVolumeClaim"] == {"claimName": settings.data_claim, "readOnly": True}
    assert [e["name"] for e in values["env"]].count(catalog.EXTENSIONS_ENV) == 1


def test_model_server_runs_mlflow_serve_outside_the_pipeline_pods():
    service, deployment = pods.render_serving(
        "asr", "models:/speechflow-asr@champion", replicas=2, serve_settings={"SPEECHFLOW_SERVE_MAX_ROWS": "8"}
    )
    pod = deployment["spec"]["template"]
    (c,) = pod["spec"]["containers"]
    port = cluster.SERVING_PORT
    assert c["command"] == mlflow_serve.serve_command("models:/speechflow-asr@champion", port, 1, "0.0.0.0", "mlflow")
    env = env_of(c)
    assert env["SPEECHFLOW_SERVE_MAX_ROWS"] == "8" and env["MLFLOW_TRACKING_URI"] == "http://mlflow:5000"
    assert env.items() >= mlflow_serve.SERVER_ENV.items()
    assert (
        c["readinessProbe"]["httpGet"] == {"path": "/ping", "port": "http"} and c["ports"][0]["containerPort"] == port
    )
    assert deployment["spec"]["replicas"] == 2 and c["securityContext"]["readOnlyRootFilesystem"] is True
    assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    assert service["spec"]["ports"][0]["port"] == port
    # The training pods do not accept it; its own policy lets clients in on its port, and it out to MLflow.
    labels = pod["metadata"]["labels"].items()
    pipeline = find(base_docs(), "NetworkPolicy", "pipeline")["spec"]["podSelector"]["matchLabels"]
    assert not pipeline.items() <= labels
    policy = find(base_docs(), "NetworkPolicy", "serving")["spec"]
    assert policy["podSelector"]["matchLabels"].items() <= labels
    assert policy["ingress"] == [{"ports": [{"protocol": "TCP", "port": port}]}]
    assert [rule["to"] for rule in policy["egress"] if "to" in rule] == [
        [{"podSelector": {"matchLabels": {"app.kubernetes.io/name": "mlflow"}}}]
    ]
    assert {v["name"] for v in pod["spec"]["volumes"]} == {"tmp", "home"}  # no data without extensions

    with pytest.raises(ValueError, match="not a serving setting"):
        pods.render_serving("asr", "models:/m@champion", serve_settings={"MLFLOW_TRACKING_URI": "x"})
    with pytest.raises(ValueError, match="replicas must be at least 1"):
        pods.render_serving("asr", "models:/m@champion", replicas=0)


def test_cli_prints_the_model_server(capsys, monkeypatch):
    monkeypatch.setenv(catalog.EXTENSIONS_ENV, EXTENSIONS)
    argv = ["serving", "--name", "tts", "--model-uri", "models:/speechflow-tts@champion"]
    assert manifests.main([*argv, "--serve-setting", "SPEECHFLOW_SERVE_MAX_TEXT_CHARS=200"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0] == f"# ask it at http://tts:{cluster.SERVING_PORT}/invocations"
    expected = pods.render_serving("tts", argv[-1], serve_settings={"SPEECHFLOW_SERVE_MAX_TEXT_CHARS": "200"})
    assert list(yaml.safe_load_all(out)) == expected
    assert env_of(expected[1]["spec"]["template"]["spec"]["containers"][0])[catalog.EXTENSIONS_ENV] == EXTENSIONS


# ---- MPIJob status ---------------------------------------------------------------------------


def cond(kind: str, status: str = "True", **extra) -> dict:
    return {"type": kind, "status": status, **extra}


@pytest.mark.parametrize(
    ("status", "phase"),
    [
        (None, "Pending"),
        ({}, "Pending"),
        ({"conditions": [cond("Created")]}, "Pending"),
        ({"conditions": [cond("Created"), cond("Suspended")]}, "Pending"),
        ({"conditions": [cond("Created"), cond("Running")]}, "Running"),
        ({"conditions": [cond("Running", "False"), cond("Restarting")]}, "Running"),
        ({"conditions": [cond("Created"), cond("Running", "False"), cond("Succeeded")]}, "Succeeded"),
        ({"conditions": [cond("Running"), cond("Failed", reason="MPIJobFailed")]}, "Failed"),
        ({"conditions": [cond("Running"), cond("Failed", "False")]}, "Running"),
    ],
)
def test_mpijob_phase_collapses_conditions(status, phase):
    assert mpijob.mpijob_phase(status) == phase


def test_mpijob_failure_message_and_launcher_selector():
    failed = {
        "conditions": [
            cond("Running", "False"),
            cond("Failed", reason="MPIJobFailed", message="launcher exit 1"),
        ]
    }
    assert mpijob.mpijob_failure_message(failed) == "MPIJobFailed: launcher exit 1"
    assert mpijob.mpijob_failure_message({"conditions": [cond("Running")]}) == ""
    assert mpijob.launcher_pod_selector("asr-run") == (
        "training.kubeflow.org/job-name=asr-run,training.kubeflow.org/job-role=launcher"
    )


# ---- settings, CLI, consistency with k8s/ and docker/ -----------------------------------------


def test_overlay_settings_load_and_unknown_keys_fail():
    assert settings_of("gpu").gpus_per_worker == 4
    assert settings_of("single-node").image_pull_policy == "IfNotPresent"
    with pytest.raises(ValueError, match="unknown config key 'gpus'"):
        cluster.load_settings(None, ["gpus=4"])
    with pytest.raises(ValueError, match="name, value"):
        cluster.load_settings(None, ["nccl_env=[[NCCL_DEBUG]]"])


def test_cli_prints_the_rendered_mpijob(capsys):
    settings = ROOT / "k8s" / "overlays" / "gpu" / "cluster.yaml"
    argv = [
        "--settings",
        str(settings),
        "mpijob",
        "--name",
        "asr-run",
        "--num-workers",
        "2",
        "--",
        *TRAIN_ARGS,
    ]
    assert manifests.main(argv) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed == training_job.render_mpijob("asr-run", TRAIN_ARGS, 2, settings=settings_of("gpu"))


def test_workflow_package_imports_without_tensorflow_or_mlflow():
    """What the Airflow image ships (workflow/, common/) must not need the training stack, nor the
    packages the image leaves out (models/, pipeline/)."""
    modules = sorted(f"workflow.{p.stem}" for p in (ROOT / "workflow").glob("*.py") if p.stem != "__init__")
    assert {
        "workflow.plan",
        "workflow.commands",
        "workflow.runner",
        "workflow.manifests",
        "workflow.pods",
        "workflow.training_job",
    } <= set(modules)
    probe = (
        f"import sys, importlib; [importlib.import_module(m) for m in {modules!r}]; "
        "heavy = [m for m in ('tensorflow', 'mlflow', 'keras', 'horovod') if m in sys.modules]; "
        "heavy += sorted(m for m in sys.modules if m.split('.')[0] in ('models', 'pipeline')); "
        "print(heavy); sys.exit(bool(heavy))"
    )
    proc = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, timeout=120, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_renderer_defaults_match_the_kustomize_base():
    docs = base_docs()
    settings = cluster.ClusterSettings()
    assert find(docs, "Namespace", settings.namespace)
    claim = find(docs, "PersistentVolumeClaim", settings.data_claim)
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]
    account = find(docs, "ServiceAccount", settings.service_account)
    assert account["automountServiceAccountToken"] is False
    assert find(docs, "Service", "mlflow")["spec"]["ports"][0]["port"] == 5000
    assert settings.mlflow_tracking_uri == "http://mlflow:5000"

    # The NetworkPolicies select the labels the renderer puts on pipeline pods: stage pods, MPIJob
    # pods and the tf.data service's, so the ranks reach the dispatcher and the workers.
    pipeline_policy = find(docs, "NetworkPolicy", "pipeline")["spec"]
    job = training_job.render_mpijob("j", TRAIN_ARGS, 1)
    templates = [
        {"metadata": pods.render_stage_pod("x", "pipeline.corpus", [])["metadata"]},
        replica(job, "Launcher")["template"],
        replica(job, "Worker")["template"],
        *(d["spec"]["template"] for d in pods.render_data_service("d", 1)[1:]),
    ]
    for template in templates:
        assert pipeline_policy["podSelector"]["matchLabels"].items() <= template["metadata"]["labels"].items()
        assert pipeline_policy["ingress"][0]["from"][0]["podSelector"]["matchLabels"].items() <= (
            template["metadata"]["labels"].items()
        )

    # MLflow serves its artifacts from its own volume (proxied artifacts) and reaches only DNS and
    # PostgreSQL: there is no object store to reach, and no pod needs object-store credentials.
    mlflow_pod = find(docs, "Deployment", "mlflow")["spec"]["template"]["spec"]
    (server,) = mlflow_pod["containers"]
    script = server["args"][0]
    destination = re.search(r"--artifacts-destination (\S+)", script).group(1)
    assert "--serve-artifacts" in script and destination.startswith("/")
    mount = next(m for m in server["volumeMounts"] if m["mountPath"] == destination)
    claim = next(v for v in mlflow_pod["volumes"] if v["name"] == mount["name"])["persistentVolumeClaim"]
    assert find(docs, "PersistentVolumeClaim", claim["claimName"])
    assert find(docs, "Deployment", "mlflow")["spec"]["strategy"]["type"] == "Recreate"  # a ReadWriteOnce volume
    egress = find(docs, "NetworkPolicy", "mlflow")["spec"]["egress"]
    assert [rule["to"][0]["podSelector"]["matchLabels"] for rule in egress if "to" in rule] == [
        {"app.kubernetes.io/name": "postgres"}
    ]
    assert not [d for d in docs if "minio" in d["metadata"]["name"] or "s3" in d["metadata"]["name"]]

    # Airflow keeps its task logs on a claim of the base (the chart mounts it in every Airflow pod).
    values = yaml.safe_load((ROOT / "k8s" / "airflow-values.yaml").read_text())
    assert values["logs"]["persistence"] == {"enabled": True, "existingClaim": "airflow-logs"}
    assert find(docs, "PersistentVolumeClaim", "airflow-logs")["spec"]["accessModes"] == ["ReadWriteMany"]
    assert "remote_logging" not in values["config"].get("logging", {})

    # The RoleBinding lets Airflow's task pods, whose account airflow-values.yaml names, manage
    # MPIJobs and the tf.data service's Deployments and Services.
    role = find(docs, "Role", "mpijob-submitter")
    for resource in ("mpijobs", "deployments", "services"):
        assert any(resource in r["resources"] and {"create", "delete"} <= set(r["verbs"]) for r in role["rules"]), (
            resource
        )
    binding = find(docs, "RoleBinding", "mpijob-submitter")
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": values["workers"]["serviceAccount"]["name"], "namespace": settings.namespace}
    ]


def test_renderer_defaults_match_the_training_image():
    dockerfile = (ROOT / "docker" / "train.Dockerfile").read_text()
    # The elastic launcher's discovery script is in the image where the renderer says.
    assert f"scripts/discover_hosts.sh {cluster.DISCOVER_HOSTS_SCRIPT}" in dockerfile
    assert "!scripts/discover_hosts.sh" in (ROOT / ".dockerignore").read_text().splitlines()
    settings = cluster.ClusterSettings()
    assert f"--uid {settings.run_as_user} " in dockerfile
    assert f"USER {settings.run_as_user}:{settings.run_as_user}" in dockerfile
    assert f"'Port {settings.ssh_port}'" in dockerfile
    assert f"'HostKey {settings.home}/.ssh/id_rsa'" in dockerfile
    worker = container(training_job.render_mpijob("j", TRAIN_ARGS, 1), "Worker")
    assert f"> {worker['command'][-1]}" in dockerfile  # the sshd config the worker starts with


@pytest.mark.parametrize("manifest", ["postgres.yaml"])
def test_embedded_shell_scripts_parse(manifest, tmp_path):
    for doc in yaml.safe_load_all((ROOT / "k8s" / "base" / manifest).read_text()):
        if doc and doc["kind"] == "ConfigMap":
            for key, text in doc["data"].items():
                if key.endswith(".sh"):
                    path = tmp_path / key
                    path.write_text(text)
                    shell = "bash" if text.startswith("#!/bin/bash") else "sh"
                    proc = subprocess.run([shell, "-n", str(path)], capture_output=True, text=True)
                    assert proc.returncode == 0, f"{manifest} {key}: {proc.stderr}"


# ---- kustomize -------------------------------------------------------------------------------


def kustomize(path: str) -> list[dict]:
    proc = subprocess.run([KUBECTL, "kustomize", str(ROOT / path)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


@needs_kubectl
@pytest.mark.parametrize("path", ["k8s/base", *(f"k8s/overlays/{o}" for o in OVERLAYS)])
def test_kustomize_renders_namespaced_limited_unprivileged_objects(path):
    docs = kustomize(path)
    kinds = {d["kind"] for d in docs}
    assert {
        "Namespace",
        "PersistentVolumeClaim",
        "StatefulSet",
        "Deployment",
        "Service",
        "NetworkPolicy",
    } <= kinds
    for doc in docs:
        if doc["kind"] != "Namespace":
            assert doc["metadata"]["namespace"] == "speechflow", doc["metadata"]["name"]
        template = (doc.get("spec") or {}).get("template")
        if doc["kind"] in ("Deployment", "StatefulSet", "Job"):
            pod = template["spec"]
            assert pod["securityContext"]["runAsNonRoot"] is True, doc["metadata"]["name"]
            for c in pod["containers"]:
                assert c["securityContext"]["allowPrivilegeEscalation"] is False
                assert c["securityContext"]["capabilities"]["drop"] == ["ALL"]
                assert {"cpu", "memory"} <= c["resources"]["requests"].keys() & c["resources"]["limits"].keys()
                assert not c["image"].endswith(":latest") and ":" in c["image"]
    secrets = [d for d in docs if d["kind"] == "Secret"]
    assert secrets == [], "no Secret (and no secret value) is committed"
    if "overlays" in path:  # with the elastic component: the launcher's account and its binding
        account = cluster.ClusterSettings().elastic_service_account
        assert find(docs, "ServiceAccount", account) and find(docs, "RoleBinding", "speechflow-elastic-discovery")


@needs_kubectl
@pytest.mark.parametrize("name", ["speechflow-data", "airflow-logs"])
def test_overlays_choose_the_shared_claims_access_mode(name):
    def claim(path: str) -> dict:
        return find(kustomize(path), "PersistentVolumeClaim", name)["spec"]

    gpu = claim("k8s/overlays/gpu")
    assert gpu["accessModes"] == ["ReadWriteMany"] and gpu["storageClassName"]
    # One node: a ReadWriteOnce volume serves every pod, on the default storage class.
    single = claim("k8s/overlays/single-node")
    assert single["accessModes"] == ["ReadWriteOnce"] and "storageClassName" not in single


# ---- the validators, end to end ----------------------------------------------------------------


@pytest.mark.slow
@needs_kubectl
@pytest.mark.skipif(
    not (VENV_K8S / "bin" / "python").exists(),
    reason=".venv-k8s is missing: python3.11 -m venv .venv-k8s && "
    ".venv-k8s/bin/pip install -r requirements/k8s.in -c requirements/k8s.lock",
)
def test_validate_k8s_script_passes():
    proc = subprocess.run(
        ["bash", str(ROOT / "scripts" / "validate_k8s.sh")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-8000:] + proc.stderr[-4000:]
    assert "all checks passed" in proc.stdout
    # The validators looked at what matters: both rendered MPIJobs and the committed template.
    assert proc.stdout.count("ok   ") >= 3 and "Failed checks: 0" in proc.stdout
