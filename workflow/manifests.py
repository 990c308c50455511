"""`python -m workflow.manifests mpijob|data-service|stage-pod|serving ...`: the pipeline's Kubernetes objects as YAML.

Prints what workflow/training_job.py (the training MPIJob) and workflow/pods.py (stage pods, the
tf.data service, a model server) render, for `kubectl create -f -`, with the same `ClusterSettings`
the DAG uses. The modules SPEECHFLOW_EXTENSIONS names in this shell reach every container
(workflow/cluster.py `extension_mounts`), as the DAG's reach its pods.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from workflow import cluster
from workflow.pods import data_service_address, render_data_service, render_serving, render_stage_pod
from workflow.training_job import render_mpijob


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
    parser = _parser()
    args = parser.parse_args(argv)
    settings = cluster.load_settings(args.settings, args.set)
    sys.stdout.write(_render(args, settings, parser))
    return 0


def _render(args: argparse.Namespace, settings: cluster.ClusterSettings, parser: argparse.ArgumentParser) -> str:
    """The YAML of what `args` ask for (a heading comment before several objects)."""
    if args.what == "mpijob":
        rest = args.train_args[1:] if args.train_args[:1] == ["--"] else args.train_args
        return to_yaml(
            render_mpijob(
                args.name, rest, args.num_workers, args.gpus_per_worker, settings, min_workers=args.min_workers
            )
        )
    if args.what == "serving":
        pairs = [item.partition("=") for item in args.serve_setting]
        if any(not sep for _, sep, _ in pairs):
            parser.error(f"--serve-setting takes NAME=VALUE, got {args.serve_setting}")
        objects = render_serving(args.name, args.model_uri, settings, args.replicas, {k: v for k, _, v in pairs})
        return f"# ask it at http://{args.name}:{cluster.SERVING_PORT}/invocations\n" + to_yaml_documents(objects)
    if args.what == "data-service":
        objects = render_data_service(args.name, args.num_workers, settings, args.work_dir)
        heading = f"# the ranks read from it: models.train ... --data-service {data_service_address(args.name)}\n"
        return heading + to_yaml_documents(objects)
    rest = args.stage_args[1:] if args.stage_args[:1] == ["--"] else args.stage_args
    return to_yaml(render_stage_pod(args.name, args.module, rest, settings, gpus=args.gpus))


def _parser() -> argparse.ArgumentParser:
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
    _add_mpijob(sub)
    _add_data_service(sub)
    _add_stage_pod(sub)
    _add_serving(sub)
    return parser


def _add_mpijob(sub) -> None:
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


def _add_data_service(sub) -> None:
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


def _add_stage_pod(sub) -> None:
    pod = sub.add_parser("stage-pod", help="a Pod running `python -m MODULE ARGS`")
    pod.add_argument("--name", required=True, help="Pod name (a DNS label)")
    pod.add_argument("--module", required=True, help="stage module, e.g. pipeline.features or models.evaluate")
    pod.add_argument("--gpus", type=int, default=0, help="GPUs for the pod (default 0)")
    pod.add_argument("stage_args", nargs=argparse.REMAINDER, help="-- then the stage's arguments")


def _add_serving(sub) -> None:
    server = sub.add_parser("serving", help="a model server (Service and Deployment running `mlflow models serve`)")
    server.add_argument("--name", required=True, help="name of its Service and Deployment (a DNS label)")
    server.add_argument("--model-uri", required=True, help="the model, e.g. models:/speechflow-asr@champion")
    server.add_argument("--replicas", type=int, default=1, help="server pods (default 1)")
    server.add_argument(
        "--serve-setting",
        action="append",
        default=[],
        metavar="SPEECHFLOW_SERVE_X=VALUE",
        help="a serving limit of docs/serving.md, e.g. SPEECHFLOW_SERVE_MAX_ROWS=16 (repeatable)",
    )


if __name__ == "__main__":
    sys.exit(main())
