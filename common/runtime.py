"""Per-process TensorFlow runtime settings: CPU threads per rank and GPU pinning.

Horovod starts one process per slot. Left alone, every TensorFlow process sizes its thread pools
to all cores of the host, so `-np 2` on two cores runs four busy threads that fight over two
cores. We give each rank its share of the cores instead, and pin each rank to the GPU of its
local rank, with memory growth so ranks do not each grab a whole card.

A CPU rank is also bound to its own share of the cores (`bind_cores`, the trainer's default), as
`mpirun --bind-to core` binds it: its threads (TensorFlow's, tf.data's, Horovod's) stay on its
cores and their caches, instead of being moved between cores and preempting the other ranks'
compute, and a rank that waits or sleeps leaves its cores idle instead of lending them to the
others, so each rank's cores behave as its own device would. On the demo's 2-core machine at
`-np 2` a step of either model took 10-13% less (docs/training.md). With more ranks than cores no
rank is bound (a fixed placement would give some ranks a core of their own and others half of one,
and allreduce waits for the slowest). horovodrun with Gloo has no binding option, hence the few
lines here.
"""

from __future__ import annotations

import contextlib
import functools
import os


def launcher_env() -> dict[str, int]:
    """Rank facts a launcher exported (horovodrun or mpirun), before Horovod is initialized.

    Returns `{"rank", "size", "local_rank", "local_size"}`; a plain process gets 0/1/0/1.
    """
    candidates = {
        "rank": ("HOROVOD_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK"),
        "size": ("HOROVOD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE"),
        "local_rank": ("HOROVOD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID"),
        "local_size": ("HOROVOD_LOCAL_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS"),
    }
    defaults = {"rank": 0, "size": 1, "local_rank": 0, "local_size": 1}
    facts = {}
    for key, names in candidates.items():
        value = next((os.environ[n] for n in names if os.environ.get(n)), None)
        facts[key] = int(value) if value is not None else defaults[key]
    return facts


@functools.cache
def cpu_info() -> tuple[str | None, frozenset[str]]:
    """This machine's CPU model name and the flags its first processor lists (/proc/cpuinfo; None and
    no flags where there is none): which kernels oneDNN can run, e.g. `avx512_bf16`."""
    model, flags = None, frozenset()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            lines = cpuinfo.read().splitlines()
        for line in lines:
            key, _, value = line.partition(":")
            if key.strip() == "model name" and model is None:
                model = value.strip()
            elif key.strip() == "flags" and not flags:
                flags = frozenset(value.split())
    except OSError:  # not Linux
        pass
    return model, flags


def default_threads(local_size: int, cpu_count: int | None = None) -> tuple[int, int]:
    """(intra_op, inter_op) threads for one of `local_size` ranks sharing this host's cores.

    One inter-op thread (our graphs are a chain of big ops) and an equal share of the cores for
    intra-op work: 1 and 1 for `-np 2` on a 2-core machine, 2 and 1 for `-np 8` on 16 cores.
    """
    cores = cpu_count or os.cpu_count() or 1
    return max(1, cores // max(1, local_size)), 1


def core_share(local_rank: int, local_size: int, cores: list[int]) -> list[int]:
    """The cores of `cores` (the host's, sorted) that local rank `local_rank` of `local_size` is bound
    to: an equal, disjoint share each (the rest left to no one); none (`[]`: not bound) when there
    are more ranks than cores."""
    share = len(cores) // max(1, local_size)
    return cores[local_rank * share : (local_rank + 1) * share] if share else []


def bind_to_cores(cores: list[int]) -> None:
    """Binds every thread of this process, and so the threads it starts later, to `cores`.
    (os.sched_setaffinity binds one thread on Linux; TensorFlow and Horovod have started theirs.)"""
    for tid in os.listdir("/proc/self/task"):
        with contextlib.suppress(ProcessLookupError):  # a thread that ended since the listing
            os.sched_setaffinity(int(tid), cores)


def configure_tensorflow(intra_op_threads: int = 0, inter_op_threads: int = 0, bind_cores: bool = False) -> dict:
    """Sets thread pools and GPU visibility for this rank. Call before any TensorFlow op runs.

    `0` means: the default share for this rank (see `default_threads`). `bind_cores`: bind a rank
    without a GPU to its share of the cores (`core_share`). Returns what was applied (`cores`: the
    ones this rank is bound to, empty when it is not).
    """
    import tensorflow as tf

    facts = launcher_env()
    auto_intra, auto_inter = default_threads(facts["local_size"])
    intra = intra_op_threads or auto_intra
    inter = inter_op_threads or auto_inter
    try:
        tf.config.threading.set_intra_op_parallelism_threads(intra)
        tf.config.threading.set_inter_op_parallelism_threads(inter)
    except RuntimeError:
        # TensorFlow already ran ops in this process (a notebook, a test): its pools are fixed now.
        intra = tf.config.threading.get_intra_op_parallelism_threads()
        inter = tf.config.threading.get_inter_op_parallelism_threads()
    # Horovod: pin this process to the GPU of its local rank, with memory growth on.
    gpus = tf.config.list_physical_devices("GPU")
    if gpus:
        mine = gpus[facts["local_rank"] % len(gpus)]
        try:
            tf.config.set_visible_devices(mine, "GPU")
            tf.config.experimental.set_memory_growth(mine, True)
        except RuntimeError as err:
            # TensorFlow already initialized its GPUs in this process. That is harmless when this
            # rank already sees only its own GPU (a second call); anything else would put several
            # ranks on one GPU, so it is an error.
            if tf.config.get_visible_devices("GPU") != [mine]:
                raise RuntimeError(
                    f"rank {facts['rank']}: TensorFlow initialized its GPUs before configure_tensorflow could pin "
                    f"{mine.name}; call configure_tensorflow before any TensorFlow op runs"
                ) from err
    cores = []
    if bind_cores and not gpus and hasattr(os, "sched_setaffinity"):
        cores = core_share(facts["local_rank"], facts["local_size"], sorted(os.sched_getaffinity(0)))
        if cores:
            bind_to_cores(cores)
    return {"intra_op_threads": intra, "inter_op_threads": inter, "gpus": len(gpus), "cores": cores, **facts}
