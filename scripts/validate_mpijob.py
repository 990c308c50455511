"""Validates MPIJob manifests as a cluster with the MPI Operator would, without a cluster.

Three checks per MPIJob document:
  1. the CRD's `spec.versions[v2beta1].schema.openAPIV3Schema`, made strict: an unknown field is an
     error, as it is for `kubectl apply` (field validation Strict) instead of being silently pruned;
  2. the rules the MPI Operator itself enforces (pkg/apis/kubeflow/validation/validation.go, v0.8):
     one Launcher, worker hostnames that are DNS labels, restart and clean-pod policies, ...;
  3. with kubernetes-validate installed (the .venv-k8s environment), each pod template against the
     Kubernetes schema of `--k8s-version`, wrapped as a core/v1 PodTemplate.

    python scripts/validate_mpijob.py --crd k8s/schemas/mpijobs.kubeflow.org-v0.8.2.yaml FILE...

Exits 1 and names file, document and field of every error; documents of other kinds are skipped.
`--pods-out FILE` also writes each replica's pod template as a Pod, so that scanners which know
only built-in kinds (checkov) can check what the operator will create.
"""

from __future__ import annotations

import argparse
import copy
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import yaml

MPIJOB_API_VERSION = "kubeflow.org/v2beta1"
# DNS-1035 label: what the operator requires of `<name>-worker-<i>` (pod hostname and Service name).
_DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


def crd_schema(crd_path: str | Path, version: str = "v2beta1") -> dict[str, Any]:
    """The openAPIV3Schema of `version` in a CustomResourceDefinition file."""
    crd = yaml.safe_load(Path(crd_path).read_text())
    for entry in crd["spec"]["versions"]:
        if entry["name"] == version:
            return entry["schema"]["openAPIV3Schema"]
    raise ValueError(f"{crd_path}: the CRD has no version {version!r}")


def strict(schema: dict[str, Any]) -> dict[str, Any]:
    """A copy of an OpenAPI v3 structural schema in which objects reject fields they do not declare.

    Objects that declare `properties` and neither `additionalProperties` nor
    `x-kubernetes-preserve-unknown-fields` get `additionalProperties: false`; that is what the API
    server's strict field validation does with such objects.
    """
    schema = copy.deepcopy(schema)

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if (
                "properties" in node
                and "additionalProperties" not in node
                and not node.get("x-kubernetes-preserve-unknown-fields")
            ):
                node["additionalProperties"] = False
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(schema)
    return schema


def operator_errors(job: dict[str, Any]) -> list[str]:
    """The MPI Operator's own validation of an MPIJob (what its controller rejects), as messages."""
    errors = []
    spec = job.get("spec") or {}
    replica_specs = spec.get("mpiReplicaSpecs") or {}
    name = (job.get("metadata") or {}).get("name", "")
    workers = replica_specs.get("Worker") or {}
    max_hostname = f"{name}-worker-{max(int(workers.get('replicas') or 1), 1) - 1}"
    if len(max_hostname) > 63 or not _DNS1035.match(max_hostname):
        errors.append(f"metadata.name: worker hostname {max_hostname!r} is not a DNS-1035 label (<= 63 chars)")
    if spec.get("slotsPerWorker") is None:
        errors.append("spec.slotsPerWorker: required")
    elif spec["slotsPerWorker"] < 0:
        errors.append("spec.slotsPerWorker: must be >= 0")
    if not spec.get("sshAuthMountPath"):
        errors.append("spec.sshAuthMountPath: required")
    if spec.get("mpiImplementation", "OpenMPI") not in ("OpenMPI", "Intel", "MPICH"):
        errors.append(f"spec.mpiImplementation: unsupported {spec.get('mpiImplementation')!r}")
    policy = spec.get("runPolicy") or {}
    if policy.get("cleanPodPolicy") not in ("None", "Running", "All"):
        errors.append(
            f"spec.runPolicy.cleanPodPolicy: must be None, Running or All, got {policy.get('cleanPodPolicy')!r}"
        )
    for key in ("ttlSecondsAfterFinished", "activeDeadlineSeconds", "backoffLimit"):
        if policy.get(key) is not None and policy[key] < 0:
            errors.append(f"spec.runPolicy.{key}: must be >= 0")
    unknown = set(replica_specs) - {"Launcher", "Worker"}
    if unknown:
        errors.append(f"spec.mpiReplicaSpecs: unknown replica types {sorted(unknown)} (Launcher, Worker)")
    if "Launcher" not in replica_specs:
        errors.append("spec.mpiReplicaSpecs.Launcher: required")
    for role, replica in replica_specs.items():
        path = f"spec.mpiReplicaSpecs.{role}"
        if replica.get("replicas") is None:
            errors.append(f"{path}.replicas: required")
        elif role == "Launcher" and replica["replicas"] != 1:
            errors.append(f"{path}.replicas: must be 1")
        elif role == "Worker" and replica["replicas"] < 1:
            errors.append(f"{path}.replicas: must be >= 1")
        if replica.get("restartPolicy") not in ("Never", "OnFailure"):
            errors.append(f"{path}.restartPolicy: must be Never or OnFailure, got {replica.get('restartPolicy')!r}")
        if not (((replica.get("template") or {}).get("spec") or {}).get("containers")):
            errors.append(f"{path}.template.spec.containers: at least one container")
    return errors


def pod_template_errors(job: dict[str, Any], k8s_version: str) -> list[str]:
    """Each replica's pod template against the Kubernetes schema (strict), via kubernetes-validate."""
    import kubernetes_validate

    errors = []
    for role, replica in ((job.get("spec") or {}).get("mpiReplicaSpecs") or {}).items():
        wrapped = {
            "apiVersion": "v1",
            "kind": "PodTemplate",
            "metadata": {"name": f"{job['metadata']['name']}-{role.lower()}"},
            "template": replica.get("template") or {},
        }
        try:
            kubernetes_validate.validate(wrapped, k8s_version, strict=True)
        except kubernetes_validate.ValidationError as err:
            where = ".".join(str(p) for p in err.path)
            errors.append(f"spec.mpiReplicaSpecs.{role}.{where}: {err.message} (Kubernetes {k8s_version})")
    return errors


def validate_mpijob(job: dict[str, Any], schema: dict[str, Any], k8s_version: str | None = None) -> list[str]:
    """All errors of one MPIJob document: strict CRD schema, operator rules, optionally pod templates."""
    errors = []
    if job.get("apiVersion") != MPIJOB_API_VERSION:
        errors.append(f"apiVersion: expected {MPIJOB_API_VERSION}, got {job.get('apiVersion')!r}")
    validator = jsonschema.Draft7Validator(schema)
    for err in sorted(validator.iter_errors(job), key=lambda e: list(e.path)):
        where = ".".join(str(p) for p in err.path) or "(document)"
        errors.append(f"{where}: {err.message}")
    errors += operator_errors(job)
    if k8s_version:
        errors += pod_template_errors(job, k8s_version)
    return errors


def mpijob_pods(job: dict[str, Any]) -> list[dict[str, Any]]:
    """The pods an MPIJob's replica templates describe, one per role, as core/v1 Pod manifests."""
    pods = []
    for role, replica in ((job.get("spec") or {}).get("mpiReplicaSpecs") or {}).items():
        template = replica.get("template") or {}
        metadata = dict(template.get("metadata") or {})
        metadata["name"] = f"{job['metadata']['name']}-{role.lower()}"
        metadata["namespace"] = job["metadata"].get("namespace", "default")
        pods.append({"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": template.get("spec") or {}})
    return pods


def mpijob_documents(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """(index, document) of every MPIJob in a (multi-document) YAML file."""
    for index, doc in enumerate(yaml.safe_load_all(path.read_text())):
        if isinstance(doc, dict) and doc.get("kind") == "MPIJob":
            yield index, doc


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--crd", required=True, type=Path, help="the MPIJob CustomResourceDefinition (YAML)")
    parser.add_argument("--version", default="v2beta1", help="CRD version whose schema applies (default v2beta1)")
    parser.add_argument(
        "--k8s-version",
        help="also validate pod templates against this Kubernetes version (needs kubernetes-validate)",
    )
    parser.add_argument("--pods-out", type=Path, help="write the replicas' pod templates as Pods to this file")
    parser.add_argument("files", nargs="+", type=Path, help="YAML files holding MPIJobs")
    args = parser.parse_args(argv)

    if not args.crd.is_file():
        print(f"CRD file {args.crd} does not exist (it ships in k8s/schemas/)", file=sys.stderr)
        return 2
    schema = strict(crd_schema(args.crd, args.version))
    failed = checked = 0
    pods: list[dict[str, Any]] = []
    for path in args.files:
        for index, job in mpijob_documents(path):
            checked += 1
            pods += mpijob_pods(job)
            errors = validate_mpijob(job, schema, args.k8s_version)
            name = (job.get("metadata") or {}).get("name", "?")
            if errors:
                failed += 1
                print(f"FAIL {path} document {index} (MPIJob {name}):")
                for error in errors:
                    print(f"  {error}")
            else:
                print(f"ok   {path} document {index} (MPIJob {name})")
    if args.pods_out:
        args.pods_out.write_text(yaml.safe_dump_all(pods, sort_keys=False))
    if checked == 0:
        print(f"no MPIJob found in {', '.join(map(str, args.files))}", file=sys.stderr)
        return 1
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
