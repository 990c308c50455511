# syntax=docker/dockerfile:1
# MLflow tracking server of the cluster mode: the upstream image at the version the training stack
# logs with (requirements/train.lock), plus the PostgreSQL driver of its backend store (psycopg 3,
# named in the store URI as postgresql+psycopg://), which the upstream image leaves out. Artifacts
# are served from a volume (k8s/base/mlflow.yaml), so no object-store client is needed.
#
#   docker build -f docker/mlflow.Dockerfile -t REGISTRY/speechflow/mlflow:3.17.2 .
#
# checkov:skip=CKV_DOCKER_2: Kubernetes ignores HEALTHCHECK; the Deployment probes /health.
FROM ghcr.io/mlflow/mlflow:v3.17.2

RUN pip install --no-cache-dir "psycopg[binary]==3.3.9"

# Any unprivileged uid works: its only state is the artifact volume, made writable by fsGroup
# (k8s/base/mlflow.yaml).
USER 10001:10001
EXPOSE 5000
