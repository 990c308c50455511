# syntax=docker/dockerfile:1
# Training image of the cluster mode: every pipeline pod (stage pods, MPIJob launcher and workers) runs it.
#   CUDA 12.3 + TensorFlow 2.17.1 (the CUDA build of the version in requirements/train.lock),
#   Horovod 0.28.1 compiled with NCCL (GPU collectives), MPI (OpenMPI, what the MPI Operator drives)
#   and Gloo, an unprivileged sshd on port 2222 for mpirun, and the project.
#
#   docker build -f docker/train.Dockerfile -t REGISTRY/speechflow/train:0.1.0 .
#
# checkov:skip=CKV_DOCKER_2: Kubernetes ignores HEALTHCHECK; the pods' readiness probes live in the manifests.
ARG CUDA_VERSION=12.3.2
ARG UBUNTU=ubuntu22.04

# ---- build: Python environment with Horovod compiled against TensorFlow and CUDA -------------------
FROM nvidia/cuda:${CUDA_VERSION}-devel-${UBUNTU} AS build
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
ENV DEBIAN_FRONTEND=noninteractive
# Ubuntu 22.04's Python is 3.10; the deadsnakes archive has current 3.11 releases for it.
# Debian package versions follow the CUDA base image and are not pinned one by one.
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends software-properties-common gpg-agent \
 && add-apt-repository -y ppa:deadsnakes/ppa \
 && apt-get update \
 && apt-get install -y --no-install-recommends \
      python3.11 python3.11-dev python3.11-venv g++ make cmake git libopenmpi-dev openmpi-bin \
      libboost-program-options-dev libboost-system-dev libboost-thread-dev libboost-test-dev zlib1g-dev \
 && rm -rf /var/lib/apt/lists/*
RUN python3.11 -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
WORKDIR /src
COPY requirements/ requirements/
# requirements/train.in pins the CPU wheel of TensorFlow (laptops, CI); the cluster runs the same
# version's CUDA wheel, whose [and-cuda] extra brings cuDNN 8.9 and the CUDA 12.3 libraries.
# The test tools of train.in stay out of the image.
RUN sed -e 's/^tensorflow-cpu==/tensorflow[and-cuda]==/' -e '/^\(pytest\|pytest-timeout\|ruff\)==/d' \
      requirements/train.in > /tmp/train-gpu.in \
 && grep -v '^tensorflow-cpu==' requirements/train.lock > /tmp/train-gpu.lock \
 && pip install --no-cache-dir "pip==24.3.1" "setuptools==75.6.0" "wheel==0.45.1" \
 && pip install --no-cache-dir -r /tmp/train-gpu.in -c /tmp/train-gpu.lock
# Horovod: compiled against the TensorFlow above (no build isolation, which would hide it) with the
# system cmake (pip's cmake 4.x rejects the Gloo that Horovod bundles), NCCL from the CUDA image.
# There is no GPU driver at build time: the CUDA stub libraries stand in for it while Horovod is
# built and checked (as Horovod's own images do), then the linker cache is reset.
RUN ldconfig /usr/local/cuda/lib64/stubs \
 && HOROVOD_GPU_OPERATIONS=NCCL HOROVOD_NCCL_LINK=SHARED HOROVOD_CUDA_HOME=/usr/local/cuda \
    HOROVOD_BUILD_CUDA_CC_LIST=70,75,80,86,89,90 \
    HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_MPI=1 HOROVOD_WITH_GLOO=1 \
    HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1 MAKEFLAGS="-j$(nproc)" \
    pip install --no-cache-dir --no-build-isolation -r requirements/horovod.in -c /tmp/train-gpu.lock \
 && horovodrun --check-build \
 && python -c 'import horovod.tensorflow as h; assert h.nccl_built() and h.mpi_built() and h.gloo_built()' \
 && ldconfig
# KenLM's lmplz and build_binary, the word LM's estimator (pipeline/lm.py), from the sources in the sdist
# of the kenlm module train.lock pins (that module compiles KenLM's query code only), as make setup does.
RUN version=$(sed -n 's/^kenlm==//p' requirements/train.lock) \
 && pip download --no-cache-dir --no-deps --no-binary kenlm "kenlm==${version}" -d /tmp/kenlm \
 && tar xzf "/tmp/kenlm/kenlm-${version}.tar.gz" -C /tmp/kenlm \
 && cmake -S "/tmp/kenlm/kenlm-${version}" -B /tmp/kenlm/build -DCMAKE_BUILD_TYPE=Release \
 && make -C /tmp/kenlm/build -j"$(nproc)" lmplz build_binary \
 && cp /tmp/kenlm/build/bin/lmplz /tmp/kenlm/build/bin/build_binary /opt/venv/bin/ \
 && rm -rf /tmp/kenlm
COPY setup.cfg pyproject.toml README.md ./
COPY common/ common/
COPY pipeline/ pipeline/
COPY models/ models/
RUN pip install --no-cache-dir --no-deps . \
 && pip check

# ---- runtime: CUDA runtime (with NCCL), OpenMPI, sshd, the environment built above ----------------
FROM nvidia/cuda:${CUDA_VERSION}-runtime-${UBUNTU}
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
ENV DEBIAN_FRONTEND=noninteractive
# espeak-ng, flite, Festival with its voices, and sox: the synthetic corpus stage (pipeline.corpus) calls them;
# wordnet-base: WordNet's example sentences, the corpus' open English text.
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends software-properties-common gpg-agent \
 && add-apt-repository -y ppa:deadsnakes/ppa \
 && apt-get update \
 && apt-get install -y --no-install-recommends \
      python3.11 python3.11-venv openmpi-bin libopenmpi3 openssh-server openssh-client \
      espeak-ng flite festival festvox-kdlpc16k festvox-kallpc16k festvox-us-slt-hts sox wordnet-base libsndfile1 \
      libboost-program-options1.74.0 libboost-thread1.74.0 \
 && apt-get purge -y software-properties-common gpg-agent \
 && apt-get autoremove -y \
 && rm -rf /var/lib/apt/lists/*

# The MPI Operator's conventions for unprivileged pods (sshAuthMountPath: /home/mpiuser/.ssh): the
# job's key pair is mounted there and serves as the workers' host key and authorized key. sshd runs
# as this user on port 2222 with its own config (no PAM, pid file in /tmp: the root filesystem is
# read-only in the pods); the password field '*' keeps the account usable by key without a password.
RUN useradd --create-home --uid 10001 --user-group --shell /bin/bash mpiuser \
 && usermod -p '*' mpiuser \
 && printf '%s\n' \
      'Port 2222' \
      'PidFile /tmp/sshd.pid' \
      'HostKey /home/mpiuser/.ssh/id_rsa' \
      'AuthorizedKeysFile .ssh/authorized_keys' \
      'StrictModes no' \
      'PasswordAuthentication no' \
      'KbdInteractiveAuthentication no' \
      'PermitRootLogin no' \
      > /etc/ssh/speechflow_sshd_config \
 && printf '%s\n' \
      'Host *' \
      '    Port 2222' \
      '    StrictHostKeyChecking no' \
      '    UserKnownHostsFile /dev/null' \
      '    LogLevel ERROR' \
      > /etc/ssh/ssh_config.d/speechflow.conf

COPY --from=build /opt/venv /opt/venv
# Model configs: the DAG's cluster mode passes --config /opt/speechflow/configs/<file>.
COPY configs/ /opt/speechflow/configs/
# Horovod elastic's host discovery (workflow/cluster.py DISCOVER_HOSTS_SCRIPT).
COPY --chmod=0755 scripts/discover_hosts.sh /opt/speechflow/scripts/discover_hosts.sh
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
WORKDIR /home/mpiuser
USER 10001:10001
EXPOSE 2222
CMD ["python", "-m", "models.train", "--help"]
