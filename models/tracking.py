"""MLflow helpers shared by training, evaluation and the registry stage.

The tracking URI comes from `MLFLOW_TRACKING_URI`; without it, a SQLite store in `.runs/mlflow.db`
under the working directory (the same store the `make` targets use). With a SQLite store,
artifacts go to `mlartifacts/` beside the database file, so `mlflow server --backend-store-uri
sqlite:///...` finds them wherever it runs.

Experiments are created as model-training experiments (`mlflow.experimentKind`), and training
logs through two objects of this module rather than the `mlflow` module itself:

- `RunLog`: metrics and params of one run that survive an outage of the tracking server. While
  the server does not answer, records go to a JSONL file beside the checkpoints (`spool_path`),
  training goes on and says so once; when the server answers again the file is sent in order,
  with the steps and times at which the values were measured. Whatever is still in the file at
  the end is sent by the next `RunLog` over it (a resumed training) or by
  `python -m models.tracking replay FILE`.
- `SystemMetrics`: each rank's CPU, memory and, when NVML sees a GPU, the utilization of that
  rank's GPU, sampled in a thread and logged to the training run as `system/rank{R}/...`.

One file (about 560 lines): the stages' MLflow calls, the outage-tolerant RunLog and the
system-metrics sampler share one run-handling convention; split, each would re-derive it.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import threading
import time
import warnings
from pathlib import Path
from typing import Any

# MLflow's download progress bars flood task logs (it draws one per model it logs).
os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")

RUN_FILE = "mlflow_run.json"  # in a workdir: which run trained the model there
DEFAULT_STORE = Path(".runs") / "mlflow.db"  # under the working directory, without MLFLOW_TRACKING_URI
# MLflow 3 opens an experiment in its GenAI view (traces) unless the experiment says what it is.
# This tag, with this value, is what MLflow's own UI writes when a user marks an experiment as
# "model training"; the UI's own toggle (or `?workflowType=machine_learning` in a link) picks the view.
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
MODEL_TRAINING = "custom_model_development"
UI_QUERY = "workflowType=machine_learning"  # for links into the MLflow UI (see `ui_url`)


def tracking_uri() -> str:
    uri = os.environ.get("MLFLOW_TRACKING_URI")
    if uri:
        return uri
    store = Path.cwd() / DEFAULT_STORE
    store.parent.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{store}"


def _artifact_root(uri: str) -> str | None:
    if uri.startswith("sqlite:///"):
        return (Path(uri[len("sqlite:///") :]).resolve().parent / "mlartifacts").as_uri()
    return None  # a tracking server decides


def client():
    import mlflow

    mlflow.set_tracking_uri(tracking_uri())
    return mlflow.MlflowClient()


def ensure_experiment(name: str) -> str:
    """The id of experiment `name`, created if needed, marked as a model-training experiment."""
    import mlflow

    mlflow.set_tracking_uri(tracking_uri())
    found = mlflow.get_experiment_by_name(name)
    if found is not None:
        if EXPERIMENT_KIND_TAG not in found.tags:
            # An experiment made before the tag (or by hand); a kind someone chose in the UI stays.
            mlflow.MlflowClient().set_experiment_tag(found.experiment_id, EXPERIMENT_KIND_TAG, MODEL_TRAINING)
        return found.experiment_id
    root = _artifact_root(tracking_uri())
    try:
        return mlflow.create_experiment(
            name,
            artifact_location=f"{root}/{name}" if root else None,
            tags={EXPERIMENT_KIND_TAG: MODEL_TRAINING},
        )
    except mlflow.exceptions.MlflowException:
        # Another process (a parallel Airflow task) created it first.
        return mlflow.get_experiment_by_name(name).experiment_id


def ui_url(base: str, experiment_id: str, run_id: str | None = None) -> str:
    """A link into the MLflow UI at `base` (http://host:port) that opens on training runs, not traces."""
    path = f"#/experiments/{experiment_id}" + (f"/runs/{run_id}" if run_id else "")
    return f"{base.rstrip('/')}/{path}?{UI_QUERY}"


def start_run(
    experiment: str,
    run_name: str | None = None,
    parent_run_id: str | None = None,
    run_id: str | None = None,
    tags: dict | None = None,
):
    """Starts (or resumes, with `run_id`) a run; nested under `parent_run_id` when given."""
    import mlflow

    experiment_id = ensure_experiment(experiment)
    tags = dict(tags or {})
    if parent_run_id:
        tags["mlflow.parentRunId"] = parent_run_id
    if run_id:
        return mlflow.start_run(run_id=run_id)
    return mlflow.start_run(experiment_id=experiment_id, run_name=run_name, tags=tags)


def log_params(params: dict[str, Any]) -> None:
    """Logs params in batches (MLflow takes at most 100 per call); long values are cut to 6000 chars."""
    import mlflow

    items = [(k, str(v)[:6000]) for k, v in params.items()]
    for start in range(0, len(items), 100):
        mlflow.log_params(dict(items[start : start + 100]))


def versions() -> dict[str, str]:
    import horovod
    import keras
    import mlflow
    import numpy
    import tensorflow as tf

    return {
        "version.python": platform.python_version(),
        "version.tensorflow": tf.__version__,
        "version.keras": keras.__version__,
        "version.horovod": horovod.__version__,
        "version.mlflow": mlflow.__version__,
        "version.numpy": numpy.__version__,
    }


def log_shards_input(shards, context: str = "training") -> None:
    """Records the shards' manifest (of a pipeline/records.py `ShardSet`) as the run's input dataset
    (lineage: model <- shards <- Kaldi dirs)."""
    import mlflow
    from mlflow.data.dataset_source_registry import resolve_dataset_source
    from mlflow.data.meta_dataset import MetaDataset

    from common.fsutil import config_hash

    digest = shards.fingerprint
    with warnings.catch_warnings():
        # MLflow registers two equivalent local-file sources and warns that it picks one.
        warnings.simplefilter("ignore")
        source = resolve_dataset_source(str(shards.root.resolve() / "manifest.json"))
    dataset = MetaDataset(
        source=source,
        name=f"shards:{shards.root.name}",
        digest=config_hash(digest),
    )
    # The Kaldi directories go into run tags (one per split): an input tag holds at most 500 characters.
    mlflow.log_input(dataset, context=context)
    mlflow.set_tags({f"data.{name}.dir": split.data_dir for name, split in shards.splits.items()})
    mlflow.set_tags({f"data.{name}.utterances": split.utterances for name, split in shards.splits.items()})


def save_run_file(workdir: Path, run_id: str, experiment: str) -> None:
    from common.fsutil import atomic_write_json

    atomic_write_json(
        Path(workdir) / RUN_FILE, {"run_id": run_id, "experiment": experiment, "tracking_uri": tracking_uri()}
    )


def load_run_file(workdir: Path) -> dict | None:
    from common.fsutil import read_json

    return read_json(Path(workdir) / RUN_FILE)


# -- logging that survives an outage of the tracking server ---------------------------------------

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
                    f"`python -m models.tracking replay {self.spool}`",
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


# -- system metrics of each rank ------------------------------------------------------------------


class _ProcessMonitor:
    """This process alone: CPU (100 = one core busy) and resident memory. Same interface as MLflow's monitors."""

    def __init__(self):
        import psutil

        self._process = psutil.Process()
        self._process.cpu_percent(None)  # the first call only starts the measurement
        self._samples: dict[str, list[float]] = {}

    def collect_metrics(self) -> None:
        self._samples.setdefault("process_cpu_utilization_percentage", []).append(self._process.cpu_percent(None))
        rss_mb = self._process.memory_info().rss / 1e6
        self._samples.setdefault("process_memory_rss_megabytes", []).append(rss_mb)

    def aggregate_metrics(self) -> dict[str, float]:
        return {k: round(sum(v) / len(v), 1) for k, v in self._samples.items() if v}

    def clear_metrics(self) -> None:
        self._samples.clear()


class _OneGpu:
    """MLflow's NVIDIA monitor (NVML, from the nvidia-ml-py package) reduced to one GPU, named `gpu_...`."""

    def __init__(self, monitor, index: int):
        self.monitor, self.prefix = monitor, f"gpu_{index}_"

    def collect_metrics(self) -> None:
        self.monitor.collect_metrics()

    def aggregate_metrics(self) -> dict[str, float]:
        found = self.monitor.aggregate_metrics()
        return {"gpu_" + k[len(self.prefix) :]: v for k, v in found.items() if k.startswith(self.prefix)}

    def clear_metrics(self) -> None:
        self.monitor.clear_metrics()


def nvml_index(local_rank: int, count: int, visible: str | None = None) -> int:
    """NVML's index of the GPU a rank uses: the `local_rank`-th CUDA device (common/runtime.py pins it),
    through CUDA_VISIBLE_DEVICES when that lists indices (NVML ignores that variable)."""
    ids = [v.strip() for v in (visible or "").split(",") if v.strip()]
    if ids and all(v.isdigit() for v in ids):
        return int(ids[local_rank % len(ids)])
    return local_rank % max(count, 1)


def rank_monitors(local_rank: int = 0) -> list:
    """Host CPU and memory (MLflow's CPU monitor), this process's CPU and memory, and this rank's GPU
    when NVML finds one (nvidia-ml-py installed, a driver present)."""
    from mlflow.system_metrics.metrics.cpu_monitor import CPUMonitor

    monitors: list = [CPUMonitor(), _ProcessMonitor()]
    try:
        from mlflow.system_metrics.metrics.gpu_monitor import GPUMonitor

        gpu = GPUMonitor()
    except (ImportError, RuntimeError):
        return monitors  # no nvidia-ml-py, or no NVIDIA driver/GPU: CPU figures only
    index = nvml_index(local_rank, gpu.num_gpus, os.environ.get("CUDA_VISIBLE_DEVICES"))
    return monitors + [_OneGpu(gpu, index)]


class SystemMetrics:
    """Samples one rank's system figures in a thread and logs them to the training run.

    Metrics are named `system/rank{R}/NAME` (the per-node form of MLflow's system metrics, so the
    run page's system-metrics charts group them by rank): `cpu_utilization_percentage` and
    `system_memory_usage_megabytes`/`_percentage` (the host), `process_cpu_utilization_percentage`
    and `process_memory_rss_megabytes` (this rank's process), and with a GPU
    `gpu_utilization_percentage`, `gpu_memory_usage_megabytes`/`_percentage` and power. One point every
    `interval_s` seconds (MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL, default 10), the mean of
    `samples` readings (MLFLOW_SYSTEM_METRICS_SAMPLES_BEFORE_LOGGING, default 1); steps count points.
    They go through `log` (a RunLog), so an outage of the server delays them and loses none.
    """

    def __init__(
        self,
        log: RunLog,
        rank: int,
        local_rank: int = 0,
        interval_s: float | None = None,
        samples: int | None = None,
        monitors: list | None = None,
    ):
        from mlflow.environment_variables import (
            MLFLOW_SYSTEM_METRICS_SAMPLES_BEFORE_LOGGING,
            MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL,
        )

        self.log, self.prefix = log, f"system/rank{rank}/"
        self.interval_s = interval_s or MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL.get() or 10.0
        self.samples = max(1, samples or MLFLOW_SYSTEM_METRICS_SAMPLES_BEFORE_LOGGING.get() or 1)
        self.monitors = rank_monitors(local_rank) if monitors is None else monitors
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self.points = 0

    def start(self) -> SystemMetrics:
        self._thread = threading.Thread(target=self._run, name=f"system-metrics-{self.prefix}", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Logs the readings since the last point, ends the thread; raises what the thread raised."""
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join()
        self._thread = None
        if self._error is not None:
            raise self._error

    def __enter__(self) -> SystemMetrics:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                for _ in range(self.samples):
                    for monitor in self.monitors:
                        monitor.collect_metrics()
                    if self._stop.wait(self.interval_s):
                        break
                values: dict[str, float] = {}
                for monitor in self.monitors:
                    values.update(monitor.aggregate_metrics())
                    monitor.clear_metrics()
                if values:
                    self.log.log_metrics({self.prefix + k: v for k, v in values.items()}, step=self.points)
                    self.points += 1
        except BaseException as err:  # handed to stop(), which re-raises it in the training's thread
            self._error = err


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m models.tracking", description=__doc__.split("\n")[0])
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
