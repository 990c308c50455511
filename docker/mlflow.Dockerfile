# syntax=docker/dockerfile:1
# MLflow tracking server of the cluster mode: the upstream image at the version the training stack
# logs with (requirements/train.lock), plus the PostgreSQL driver of its backend store (psycopg 3,
# named in the store URI as postgresql+psycopg://) and boto3 for its S3 (MinIO) artifact store,
# which the upstream image leaves out.
#
#   docker build -f docker/mlflow.Dockerfile -t REGISTRY/speechflow/mlflow:3.17.2 .
#
# checkov:skip=CKV_DOCKER_2: Kubernetes ignores HEALTHCHECK; the Deployment probes /health.
FROM ghcr.io/mlflow/mlflow:v3.17.2

RUN pip install --no-cache-dir "psycopg[binary]==3.3.9" boto3==1.44.5

# Any unprivileged uid works: the server keeps no local state (k8s/base/mlflow.yaml).
USER 10001:10001
EXPOSE 5000
