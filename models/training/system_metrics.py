"""Each rank's system metrics, sampled in a thread and logged to the training run.

`SystemMetrics` logs one rank's CPU and memory (the host's and its own process's) and, when NVML
sees a GPU, the utilization of that rank's GPU, as `system/rank{R}/...`. The monitors follow
MLflow's interface (`collect_metrics`, `aggregate_metrics`, `clear_metrics`) and reuse its CPU and
NVIDIA monitors; the points go through a `RunLog` (models/tracking/spool.py), so an outage of the tracking
server delays them and loses none.
"""

from __future__ import annotations

import os
import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from models.tracking.spool import RunLog


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
