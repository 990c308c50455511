"""The step-time breakdown a training run reports: input wait, compute and communication per step."""

from __future__ import annotations

import time


class StepTimes:
    """Accumulates the step-time breakdown (seconds) after the warm-up steps."""

    KEYS = ("input", "compute", "communication")

    def __init__(self):
        self.total = dict.fromkeys(self.KEYS, 0.0)
        self.window = dict.fromkeys(self.KEYS, 0.0)
        self.frames = self.window_frames = 0
        self.steps = self.window_steps = 0
        self.started = self.window_started = None

    def add(self, times: dict, frames: int, counted: bool) -> None:
        if not counted:
            return
        now = time.perf_counter()
        if self.started is None:
            self.started = self.window_started = now - sum(times.values())
        for key in self.KEYS:
            self.total[key] += times[key]
            self.window[key] += times[key]
        self.frames += frames
        self.window_frames += frames
        self.steps += 1
        self.window_steps += 1

    def exclude(self, seconds: float) -> None:
        """Leaves `seconds` of wall time (measurements, not training) out of frames/s."""
        if self.started is not None:
            self.started += seconds
            self.window_started += seconds

    def flush_window(self) -> dict:
        """Averages since the last flush: per-step milliseconds, shares of the step, frames/s."""
        if not self.window_steps:
            return {}
        now = time.perf_counter()
        wall = now - self.window_started
        step_total = sum(self.window.values())
        out = {f"time_{k}_ms": 1000 * v / self.window_steps for k, v in self.window.items()}
        out.update({f"share_{k}": v / step_total for k, v in self.window.items() if step_total})
        out["frames_per_s"] = self.window_frames / wall if wall > 0 else 0.0
        self.window = dict.fromkeys(self.KEYS, 0.0)
        self.window_frames = self.window_steps = 0
        self.window_started = now
        return out

    def summary(self) -> dict:
        if not self.steps:
            return {}
        wall = time.perf_counter() - self.started
        step_total = sum(self.total.values())
        out = {f"time_{k}_ms": 1000 * v / self.steps for k, v in self.total.items()}
        out.update({f"share_{k}": v / step_total for k, v in self.total.items() if step_total})
        out.update(
            frames_per_s=self.frames / wall,
            steps_per_s=self.steps / wall,
            measured_steps=self.steps,
            measured_seconds=wall,
        )
        return out
