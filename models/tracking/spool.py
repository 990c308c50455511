"""Metrics and params of a training run that survive an outage of the tracking server.

`RunLog` is used where the `mlflow` module would be. While the server does not answer, records go
to a JSONL file beside the checkpoints (`spool_path`), training goes on and says so once; when the
server answers again the file is sent in order, with the steps and times at which the values were
measured. Whatever is still in the file at the end is sent by the next `RunLog` over it (a resumed
training) or by `python -m models.tracking.spool replay FILE`, this module's command line.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from pathlib import Path
from typing import Any

from models.tracking.runs import load_run_file, tracking_uri

_LOG_BATCH = "/api/2.0/mlflow/runs/log-batch"
_MAX_METRICS, _MAX_PARAMS = 1000, 100  # MLflow's limits for one log-batch request


def spool_path(workdir: Path, rank: int = 0) -> Path:
    """Where a rank's records wait while MLflow is unreachable: beside the checkpoints in `workdir`."""
    return Path(workdir) / ("mlflow_offline.jsonl" if rank == 0 else f"mlflow_offline.rank{rank}.jsonl")


class Unreachable(Exception):
    """The tracking server did not answer (connection refused, timeout, a 5xx or 429 answer)."""


class RunLog:
    """Metrics and params of one MLflow run, kept in `spool` while the tracking server is unreachable.

    Use it where the `mlflow` module would be used: `log_metrics({...}, step=...)`, `log_metric`,
    `log_params`; it needs no active run, so any rank may hold one (for `SystemMetrics`). Thread-safe.
    Records are sent as they come while the server answers. When a send fails to reach a tracking
    server (http/https URIs), the record goes to `spool` and the failure is reported once on stderr;
    later records go straight to the spool until `retry_s` has passed, then the spool is sent in
    order and emptied. A request that reaches the server and is refused (4xx, e.g. a param logged
    again with another value) raises `MlflowException`, as `mlflow` would. With a store that is not
    a server (SQLite, a database URI) there is nothing to wait for: records are logged directly.
    """

    def __init__(self, run_id: str, spool: Path, uri: str | None = None, retry_s: float = 10.0, timeout_s: float = 5.0):
        self.run_id, self.spool = run_id, Path(spool)
        self.uri = uri or tracking_uri()
        self.retry_s, self.timeout_s = retry_s, timeout_s
        self._lock = threading.Lock()
        self._server = self.uri.startswith(("http://", "https://"))
        self._next_try = 0.0  # monotonic time before which no request is made while records wait
        self._in_outage = False
        self._client = None

    # what the loop calls -------------------------------------------------------------------------

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        record = {"metrics": {k: float(v) for k, v in metrics.items()}, "step": int(step or 0)}
        self._log(record)

    def log_metric(self, key: str, value: float, step: int | None = None) -> None:
        self.log_metrics({key: value}, step)

    def log_params(self, params: dict[str, Any]) -> None:
        """Params as `tracking.log_params` writes them: values as strings, cut to 6000 characters."""
        self._log({"params": {k: str(v)[:6000] for k, v in params.items()}})

    def waiting(self) -> int:
        """How many records wait in the spool."""
        with self._lock:
            return len(self._read_spool())

    def flush(self) -> bool:
        """Sends what waits in the spool now (whatever the retry delay); True when nothing is left."""
        with self._lock:
            try:
                self._drain()
            except Unreachable as err:
                self._outage(err)
                return False
            self._recovered()
            return True

    def close(self, wait_s: float = 60.0) -> None:
        """Sends what waits, trying every `retry_s` for up to `wait_s` seconds while the server is
        unreachable; then says where the records stay (they are not lost: see the module's docstring)."""
        deadline = time.monotonic() + wait_s
        while not self.flush():
            if time.monotonic() + self.retry_s > deadline:
                print(
                    f"[mlflow] {self.uri} is still unreachable: {self.waiting()} records stay in {self.spool}; "
                    f"a training resumed in this workdir sends them, or "
                    f"`python -m models.tracking.spool replay {self.spool}`",
                    file=sys.stderr,
                    flush=True,
                )
                return
            time.sleep(self.retry_s)

    def __enter__(self) -> RunLog:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # inside -------------------------------------------------------------------------------------

    def _log(self, record: dict) -> None:
        record = {"run_id": self.run_id, "timestamp": int(time.time() * 1000), **record}
        with self._lock:
            if not self._server:
                self._send([record])
                return
            waiting = self.spool.is_file() and self.spool.stat().st_size > 0
            if waiting and time.monotonic() < self._next_try:
                self._append(record)
                return
            try:
                if waiting:
                    self._drain()
                self._send([record])
            except Unreachable as err:
                self._append(record)
                self._outage(err)
                return
            self._recovered()

    def _outage(self, err: Exception) -> None:
        self._next_try = time.monotonic() + self.retry_s
        if not self._in_outage:
            self._in_outage = True
            print(
                f"[mlflow] {self.uri} is unreachable ({err}); training goes on, and what it logs waits in "
                f"{self.spool} until the server answers again",
                file=sys.stderr,
                flush=True,
            )

    def _recovered(self) -> None:
        if self._in_outage:
            self._in_outage = False
            print(
                f"[mlflow] {self.uri} answers again; the records kept meanwhile were sent", file=sys.stderr, flush=True
            )

    def _append(self, record: dict) -> None:
        self.spool.parent.mkdir(parents=True, exist_ok=True)
        with open(self.spool, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(record, allow_nan=True) + "\n")
            handle.flush()

    def _read_spool(self) -> list[dict]:
        if not self.spool.is_file():
            return []
        records = []
        for line in self.spool.read_text(encoding="utf-8").splitlines():
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                continue  # the last line of a process killed while writing it
        return records

    def _drain(self) -> None:
        """Sends the spool in order, rewriting it after every batch so that nothing is sent twice."""
        from common.fsutil import atomic_write_text

        records = self._read_spool()
        while records:
            batch, records = records[:50], records[50:]
            self._send(batch)
            if records:
                atomic_write_text(self.spool, "".join(json.dumps(r, allow_nan=True) + "\n" for r in records))
            else:
                self.spool.unlink(missing_ok=True)

    def _send(self, records: list[dict]) -> None:
        """One or more log-batch requests per run for `records`; raises Unreachable or MlflowException."""
        from mlflow.entities import Metric, Param

        by_run: dict[str, tuple[list, list]] = {}
        for r in records:
            metrics, params = by_run.setdefault(r["run_id"], ([], []))
            for key, value in (r.get("metrics") or {}).items():
                metrics.append(Metric(key, float(value), int(r["timestamp"]), int(r.get("step", 0))))
            params.extend(Param(key, value) for key, value in (r.get("params") or {}).items())
        for run_id, (metrics, params) in by_run.items():
            while metrics or params:
                chunk_p, params = params[:_MAX_PARAMS], params[_MAX_PARAMS:]
                room = _MAX_METRICS - len(chunk_p)  # at most 1000 entries in all per request
                chunk_m, metrics = metrics[:room], metrics[room:]
                if self._server:
                    self._post(run_id, chunk_m, chunk_p)
                else:
                    self._direct(run_id, chunk_m, chunk_p)

    def _direct(self, run_id: str, metrics: list, params: list) -> None:
        if self._client is None:
            from mlflow import MlflowClient

            self._client = MlflowClient(self.uri)
        self._client.log_batch(run_id, metrics=metrics, params=params)

    def _post(self, run_id: str, metrics: list, params: list) -> None:
        """MLflow's log-batch REST call, once, with a short timeout: MLflow's client would retry for
        minutes before failing, holding training (or the records) up all that time."""
        from mlflow.exceptions import MlflowException
        from mlflow.protos.service_pb2 import LogBatch
        from mlflow.utils.credentials import get_default_host_creds
        from mlflow.utils.proto_json_utils import message_to_json
        from mlflow.utils.rest_utils import http_request, verify_rest_response

        body = message_to_json(
            LogBatch(run_id=run_id, metrics=[m.to_proto() for m in metrics], params=[p.to_proto() for p in params])
        )
        try:
            response = http_request(
                get_default_host_creds(self.uri),
                _LOG_BATCH,
                "POST",
                max_retries=0,
                timeout=self.timeout_s,
                raise_on_status=False,
                json=json.loads(body),
            )
        except MlflowException as err:  # connection refused, reset, timed out
            raise Unreachable(str(err).splitlines()[0][:300]) from err
        if response.status_code >= 500 or response.status_code == 429:
            raise Unreachable(f"HTTP {response.status_code} from {_LOG_BATCH}")
        verify_rest_response(response, _LOG_BATCH)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m models.tracking.spool", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("replay", help="send the records a training kept while MLflow was unreachable")
    r.add_argument("spools", nargs="+", type=Path, help="mlflow_offline*.jsonl files (in a training workdir)")
    r.add_argument("--uri", help="tracking URI (default: the one in the workdir's mlflow_run.json, else the usual)")
    args = p.parse_args(argv)
    failed = 0
    for spool in args.spools:
        uri = args.uri or (load_run_file(spool.parent) or {}).get("tracking_uri") or tracking_uri()
        log = RunLog("", spool, uri, retry_s=0.0)
        count = log.waiting()
        if log.flush():
            print(f"{spool}: {count} records sent to {uri}")
        else:
            failed += 1
            print(f"{spool}: {uri} is unreachable; {log.waiting()} records still wait", file=sys.stderr)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
