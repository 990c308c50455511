"""A throwaway PostgreSQL cluster for tests (Debian's `postgresql` package, which scripts/setup.sh
installs as root): initdb into a temporary directory, pg_ctl start on 127.0.0.1 and a free port."""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import tempfile
from pathlib import Path

from common.ports import reserve_port


def postgres_bin() -> Path | None:
    """The directory of initdb and pg_ctl: on PATH, or where Debian puts them (newest version)."""
    found = shutil.which("initdb")
    if found:
        return Path(found).resolve().parent
    versions = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(Path(p).parts[-3]))
    return Path(versions[-1]).parent if versions else None


class Postgres:
    """A throwaway PostgreSQL cluster: initdb into a temporary directory, pg_ctl start on 127.0.0.1:PORT.

    PostgreSQL refuses to run as root; as root, the cluster runs as the `postgres` user that Debian's
    package creates (or `nobody`)."""

    def __init__(self, bindir: Path):
        self.bindir, self.port = bindir, reserve_port()
        self.data = Path(tempfile.mkdtemp(prefix="speechflow-pg-"))
        self.user = None
        if os.geteuid() == 0:
            try:
                self.user = pwd.getpwnam("postgres")
            except KeyError:
                self.user = pwd.getpwnam("nobody")
            os.chown(self.data, self.user.pw_uid, self.user.pw_gid)

    def run(self, tool: str, *args: str) -> None:
        ids = {"user": self.user.pw_uid, "group": self.user.pw_gid, "extra_groups": []} if self.user else {}
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C", "HOME": str(self.data)}
        proc = subprocess.run(
            [str(self.bindir / tool), *args], cwd=self.data, env=env, capture_output=True, text=True, timeout=120, **ids
        )
        if proc.returncode != 0:
            log = self.data / "cluster" / "server.log"
            raise RuntimeError(
                f"{tool} {' '.join(args)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
                + (f"\n{log.read_text()[-3000:]}" if log.exists() else "")
            )

    def start(self) -> str:
        """Starts the cluster with a database `mlflow` owned by user `mlflow`; returns the SQLAlchemy URI."""
        import psycopg

        cluster = self.data / "cluster"
        self.run("initdb", "-D", str(cluster), "-U", "mlflow", "-A", "trust", "-E", "UTF8", "--locale=C", "--no-sync")
        # -F: no fsync (a test's database need not survive a power cut); the socket stays in the cluster.
        options = f"-h 127.0.0.1 -p {self.port} -k {cluster} -F"
        self.run("pg_ctl", "-D", str(cluster), "-l", str(cluster / "server.log"), "-o", options, "-w", "start")
        with psycopg.connect(f"postgresql://mlflow@127.0.0.1:{self.port}/postgres", autocommit=True) as conn:
            conn.execute("CREATE DATABASE mlflow")
        return f"postgresql+psycopg://mlflow@127.0.0.1:{self.port}/mlflow"

    def stop(self) -> None:
        if (self.data / "cluster" / "postmaster.pid").exists():
            self.run("pg_ctl", "-D", str(self.data / "cluster"), "-m", "fast", "-w", "stop")
        shutil.rmtree(self.data, ignore_errors=True)

    def rows(self, sql: str) -> list[tuple]:
        import psycopg

        with psycopg.connect(f"postgresql://mlflow@127.0.0.1:{self.port}/mlflow") as conn:
            return conn.execute(sql).fetchall()
