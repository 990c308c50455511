# syntax=docker/dockerfile:1
# Airflow image of the cluster mode (official Helm chart, KubernetesExecutor): Apache Airflow 3.3.2,
# the providers of requirements/airflow.in, the DAGs, and the project's TensorFlow-free modules that
# the DAGs import (pipeline.k8s renders the pods and MPIJobs the DAG submits).
#
#   docker build -f docker/airflow.Dockerfile --build-arg OVERLAY=gpu -t REGISTRY/speechflow/airflow:0.1.0 .
#
# checkov:skip=CKV_DOCKER_2: Kubernetes ignores HEALTHCHECK; the Helm chart defines the probes.
FROM apache/airflow:3.3.2-python3.11

# Cluster settings of the overlay this image is deployed with (k8s/overlays/OVERLAY/cluster.yaml).
ARG OVERLAY=gpu

# The official image's user: airflow, uid 50000, group 0.
USER 50000:0
COPY --chown=50000:0 requirements/airflow.in /tmp/airflow.in
# Naming apache-airflow at its version keeps pip from moving it while adding the providers.
RUN pip install --no-cache-dir "apache-airflow==${AIRFLOW_VERSION}" -r /tmp/airflow.in

# --no-deps: the DAGs import only the modules without TensorFlow; the training stack lives in the
# training image. The copy in /tmp gives setuptools a source tree it may write its build files to.
COPY --chown=50000:0 setup.cfg pyproject.toml README.md /opt/speechflow/src/
COPY --chown=50000:0 pipeline/ /opt/speechflow/src/pipeline/
COPY --chown=50000:0 models/ /opt/speechflow/src/models/
RUN cp -r /opt/speechflow/src /tmp/speechflow-src \
 && pip install --no-cache-dir --no-deps /tmp/speechflow-src \
 && rm -rf /tmp/speechflow-src

COPY --chown=50000:0 k8s/overlays/${OVERLAY}/cluster.yaml /opt/speechflow/cluster.yaml
COPY --chown=50000:0 dags/ /opt/airflow/dags/
ENV SPEECHFLOW_CLUSTER_SETTINGS=/opt/speechflow/cluster.yaml
