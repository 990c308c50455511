# syntax=docker/dockerfile:1
# Airflow image of the cluster mode (official Helm chart, KubernetesExecutor): Apache Airflow 3.3.2,
# the providers of requirements/airflow.in, the DAGs, and the two TensorFlow-free packages the DAGs
# import: workflow (plan, command lines, pod and MPIJob rendering, the MPIJob client) and common,
# with the settings dataclasses of the models and strategies the plan checks.
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

# Only the TensorFlow-free packages: the stages run in the training image, as pods and an MPIJob.
COPY --chown=50000:0 common/ /opt/speechflow/common/
COPY --chown=50000:0 workflow/ /opt/speechflow/workflow/
# The settings types the plan checks each training config against before any pod starts: plain
# dataclasses declared in their models' and strategies' packages (tests/test_airflow_image.py runs
# the plan on exactly the files copied here).
COPY --chown=50000:0 models/__init__.py /opt/speechflow/models/
COPY --chown=50000:0 models/training/__init__.py models/training/config.py /opt/speechflow/models/training/
COPY --chown=50000:0 models/asr/__init__.py models/asr/config.py /opt/speechflow/models/asr/
COPY --chown=50000:0 models/tts/__init__.py models/tts/config.py /opt/speechflow/models/tts/
COPY --chown=50000:0 models/distributed/__init__.py models/distributed/strategies.py \
  models/distributed/gossip_config.py /opt/speechflow/models/distributed/
COPY --chown=50000:0 pipeline/__init__.py pipeline/augment_config.py pipeline/input_config.py /opt/speechflow/pipeline/
# /opt/speechflow/extensions: the extensions' code, mounted from the data claim (k8s/airflow-values.yaml).
ENV PYTHONPATH=/opt/speechflow:/opt/speechflow/extensions

COPY --chown=50000:0 k8s/overlays/${OVERLAY}/cluster.yaml /opt/speechflow/cluster.yaml
COPY --chown=50000:0 dags/ /opt/airflow/dags/
ENV SPEECHFLOW_CLUSTER_SETTINGS=/opt/speechflow/cluster.yaml
