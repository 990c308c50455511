"""Process pools for the data stages."""

from __future__ import annotations

import multiprocessing
import sys


class _InProcess:
    """The Pool interface, run in this process (jobs=1: no start-up cost, easy to debug)."""

    def imap(self, fn, tasks):
        return map(fn, tasks)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def worker_pool(jobs: int):
    """A process pool, or this process for jobs=1.

    Forking a process that has initialized TensorFlow can deadlock its thread pools, so a parent
    that imported it (a test, a notebook) gets spawned workers; the CLI never imports it and forks.
    """
    if jobs <= 1:
        return _InProcess()
    method = "spawn" if "tensorflow" in sys.modules else "fork"
    return multiprocessing.get_context(method).Pool(jobs)
