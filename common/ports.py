"""A TCP port for a server this process is about to start, that no other process can be handed first.

Binding port 0 and closing the socket (the usual `free_port()`) leaves a window: until the server
binds the number, the kernel may give it to any other `bind(0)` or outgoing connection, and a second
test or stage may pick it too. A server that can bind port 0 itself and report its port closes the
window (pipeline/data_service.py does). For the others (`mlflow server`, `mlflow models serve`,
PostgreSQL, Airflow's API server) `reserve_port` picks a port

- below the kernel's ephemeral range, so no `bind(0)` and no outgoing connection is given it, and
- held by an exclusive lock file for as long as this process lives, so no other caller of
  `reserve_port` on this machine picks it, whichever process it is in;

and checks that nothing listens there now. Hand-written rather than `portpicker`, whose race-free mode
needs a port server process running beside the tests.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import random
import socket
import tempfile
from pathlib import Path

__all__ = ["reserve_port"]

_HELD: dict[int, int] = {}  # port -> the lock file's descriptor, open until the process exits
_SPAN = 8000  # how many ports below the ephemeral range are candidates


def _candidates() -> list[int]:
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768  # Linux's default; other systems may differ, the bind check still guards
    first = max(1024, low - _SPAN)
    ports = list(range(first, low))
    random.shuffle(ports)  # two machines' processes sharing no lock directory rarely collide
    return ports


def _bindable(port: int, host: str) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind((host, port))  # no SO_REUSEADDR: a port still in TIME_WAIT is passed over too
        except OSError:
            return False
    return True


def reserve_port(host: str = "127.0.0.1") -> int:
    """A port of `host` that nothing listens on and that no other `reserve_port` caller on this
    machine will be given while this process lives (see the module's docstring). RuntimeError when
    every candidate is taken."""
    locks = Path(tempfile.gettempdir()) / "speechflow-ports"
    locks.mkdir(exist_ok=True)
    for port in _candidates():
        if port in _HELD:
            continue
        fd = os.open(locks / f"{port}.lock", os.O_CREAT | os.O_RDWR, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        if _bindable(port, host):
            _HELD[port] = fd
            return port
        with contextlib.suppress(OSError):
            fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)
    raise RuntimeError(f"no free port below the ephemeral range on {host}: close some servers and try again")
