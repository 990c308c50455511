"""The environment the README promises: imports, versions, Horovod under horovodrun, thread settings."""

import os
import re
import subprocess

import numpy as np
import pytest

from common import runtime
from tests.conftest import AIRFLOW_BIN, PYTHON, ROOT, horovodrun


def test_training_stack_imports_with_pinned_versions():
    import google.protobuf
    import horovod
    import horovod.tensorflow as hvd
    import kaldiio  # noqa: F401
    import mlflow
    import tensorflow as tf

    assert tf.__version__ == "2.17.1"
    assert horovod.__version__ == "0.28.1"
    assert mlflow.__version__ == "3.17.2"
    assert int(np.__version__.split(".")[0]) < 2
    assert int(google.protobuf.__version__.split(".")[0]) < 5
    assert hvd.gloo_built()


def test_pinned_versions_match_lock_file():
    lock = (ROOT / "requirements" / "train.lock").read_text()
    for pin in ("tensorflow-cpu==2.17.1", "mlflow==3.17.2"):
        assert pin in lock
    # Shards are local paths (pathlib everywhere): tensorflow-io's s3:// filesystem is not used.
    assert "tensorflow-io==" not in lock


def test_default_threads_share_cores_between_local_ranks():
    assert runtime.default_threads(local_size=2, cpu_count=2) == (1, 1)
    assert runtime.default_threads(local_size=8, cpu_count=16) == (2, 1)
    assert runtime.default_threads(local_size=1, cpu_count=2) == (2, 1)
    assert runtime.default_threads(local_size=4, cpu_count=2) == (1, 1)


def test_core_shares_are_disjoint_and_empty_when_ranks_outnumber_cores():
    assert [runtime.core_share(r, 2, [0, 1]) for r in range(2)] == [[0], [1]]
    assert [runtime.core_share(r, 2, [0, 1, 2, 3, 4]) for r in range(2)] == [[0, 1], [2, 3]]
    assert [runtime.core_share(r, 3, [4, 5]) for r in range(3)] == [[], [], []]


@pytest.mark.parametrize("extra_ranks", [0, 1], ids=["a share each", "more ranks than cores"])
def test_bind_cores_binds_every_thread_of_a_rank_to_its_share(extra_ranks):
    # A fresh interpreter as local rank 1 of 2: after configure_tensorflow every thread it has
    # (TensorFlow's included, and one started afterwards) is bound to the second half of the cores.
    # As local rank 1 of one more rank than there are cores it is not bound: its threads keep them all.
    # A thread may end between the listing of /proc/self/task and the question about it: that one is
    # passed over. The thread started afterwards reports its own mask before it ends.
    script = """
import os, threading
from common import runtime
applied = runtime.configure_tensorflow(bind_cores=True)
import tensorflow as tf
tf.reduce_sum(tf.ones([64, 64]))
masks = set()
late = threading.Thread(target=lambda: masks.add(tuple(sorted(os.sched_getaffinity(0)))))
late.start()
late.join()
for task in os.listdir("/proc/self/task"):
    try:
        masks.add(tuple(sorted(os.sched_getaffinity(int(task)))))
    except ProcessLookupError:
        pass
print(applied["cores"], sorted(masks))
"""
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        pytest.skip("needs two cores")
    size = len(cores) + 1 if extra_ranks else 2
    env = {**os.environ, "HOROVOD_LOCAL_RANK": "1", "HOROVOD_LOCAL_SIZE": str(size), "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run([PYTHON, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, f"the child exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
    out = proc.stdout
    mine = runtime.core_share(1, size, cores)
    assert bool(mine) != bool(extra_ranks)
    assert out.split() and out.strip() == f"{mine} {[tuple(mine or cores)]}"


def test_launcher_env_reads_horovodrun_variables(monkeypatch):
    for key, value in dict(HOROVOD_RANK="3", HOROVOD_SIZE="8", HOROVOD_LOCAL_RANK="1", HOROVOD_LOCAL_SIZE="2").items():
        monkeypatch.setenv(key, value)
    assert runtime.launcher_env() == {"rank": 3, "size": 8, "local_rank": 1, "local_size": 2}


@pytest.mark.slow
def test_horovodrun_two_processes_allreduce():
    proc = horovodrun(["tests/scripts/allreduce_check.py"], np=2, timeout=180)
    results = re.findall(r"RESULT rank=(\d) size=(\d) sum=\[(.*?)\] mean=\[(.*?)\] threads=(\d+),(\d+)", proc.stdout)
    assert sorted(r[0] for r in results) == ["0", "1"], proc.stdout
    for _rank, size, total, mean, intra, inter in results:
        assert size == "2"
        assert [float(v) for v in total.split(",")] == [3.0, 30.0]
        assert [float(v) for v in mean.split(",")] == [1.5, 15.0]
        # Two ranks on one host share its cores: 1 inter-op thread, cores // 2 intra-op threads.
        assert inter == "1" and int(intra) >= 1


@pytest.mark.airflow
def test_airflow_environment_is_separate_and_pinned():
    out = subprocess.run([AIRFLOW_BIN / "airflow", "version"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "3.3.2"
    tf_probe = subprocess.run(
        [AIRFLOW_BIN / "python", "-c", "import importlib.util as u; print(u.find_spec('tensorflow') is None)"],
        capture_output=True,
        text=True,
    )
    assert tf_probe.stdout.strip() == "True", "the Airflow environment must not carry TensorFlow"
