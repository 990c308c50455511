"""Faults that tests and benchmarks inject into the training loop (a slow rank, a failure);
a user's run has none.

The loop calls `before_step` and `after_step` around every step. `models.train` builds them
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
class Faults:
    straggler_rank: int = -1  # this rank is made slower (a busy or throttled GPU); -1: none
    straggler_delay_ms: float = 0.0  # ... by this many milliseconds added to each of its steps
    straggler_factor: float = 1.0  # ... and/or by computing each step this many times (2: half speed)
    fail_at_step: int = 0  # raise InjectedFailure at this step (1-based) on fail_rank; 0: never
    fail_rank: int = 0

    def __post_init__(self):
        if self.straggler_factor < 1.0:
            raise ValueError(f"--straggler-factor must be at least 1 (a slower rank), got {self.straggler_factor}")
        if self.straggler_delay_ms < 0:
            raise ValueError(f"--straggler-delay-ms must not be negative, got {self.straggler_delay_ms}")

    def before_step(self, step: int, rank: int) -> None:
        if self.fail_at_step and step == self.fail_at_step and rank == self.fail_rank:
            raise InjectedFailure(f"fail_at_step={step} on rank {rank} (a test's injected failure)")

    def extra_work(self, rank: int) -> float:
        """How many more times this rank computes each step (the straggler: factor - 1; models/training/step.py
        `slow_down` does it)."""
        return self.straggler_factor - 1.0 if rank == self.straggler_rank else 0.0

    def after_step(self, step: int, rank: int) -> float:
        """Sleeps the straggler's fixed delay; returns the seconds slept (counted as compute)."""
        if rank != self.straggler_rank or self.straggler_delay_ms <= 0:
            return 0.0
        time.sleep(self.straggler_delay_ms / 1000)
        return self.straggler_delay_ms / 1000
