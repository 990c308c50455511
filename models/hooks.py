"""Instruments that tests and benchmarks install in the training loop; a user's run has none.

The loop calls `before_step` and `after_step` around every step. `models.train` builds the hooks
from its testing flags (`--straggler-rank`, `--straggler-delay-ms`, `--straggler-factor`,
`--fail-at-step`, `--fail-rank`), so a benchmark slows a rank or a test injects a failure
through the real command line, while `TrainConfig` holds only what a user trains with.
"""

from __future__ import annotations

import dataclasses
import time


class InjectedFailure(RuntimeError):
    """The failure a test asked for with --fail-at-step."""


@dataclasses.dataclass(frozen=True)
class TrainHooks:
    straggler_rank: int = -1  # this rank is made slower (a busy or throttled GPU); -1: none
    straggler_delay_ms: float = 0.0  # ... by this many milliseconds added to each of its steps
    straggler_factor: float = 1.0  # ... and/or by taking this many times as long per step (2: half speed)
    fail_at_step: int = 0  # raise InjectedFailure at this step (1-based) on fail_rank; 0: never
    fail_rank: int = 0

    def __post_init__(self):
        if self.straggler_factor < 1.0:
            raise ValueError(f"--straggler-factor must be at least 1 (a slower rank), got {self.straggler_factor}")
        if self.straggler_delay_ms < 0:
            raise ValueError(f"--straggler-delay-ms must not be negative, got {self.straggler_delay_ms}")

    @property
    def active(self) -> bool:
        return self.fail_at_step > 0 or (
            self.straggler_rank >= 0 and (self.straggler_delay_ms > 0 or self.straggler_factor > 1)
        )

    def before_step(self, step: int, rank: int) -> None:
        if self.fail_at_step and step == self.fail_at_step and rank == self.fail_rank:
            raise InjectedFailure(f"fail_at_step={step} on rank {rank} (a test's injected failure)")

    def after_step(self, step: int, rank: int, compute_seconds: float) -> float:
        """Sleeps as the straggler would take longer; returns the seconds slept (counted as compute).
        `compute_seconds`: what the step computed, without tracing (the loop passes the last step
        that did not trace the step function, 0 before there is one): a slower GPU computes slower,
        it does not trace slower, and a traced step's seconds times the factor would add minutes of
        compilation a throttled device never pays."""
        if rank != self.straggler_rank:
            return 0.0
        delay = self.straggler_delay_ms / 1000 + (self.straggler_factor - 1.0) * compute_seconds
        if delay > 0:
            time.sleep(delay)
        return delay
