"""Predicted throughput speedup of n data-parallel workers: ring allreduce against gossip.

All times are seconds per training step of one worker:
- `tcalc`: forward and backward pass on one minibatch;
- `ttransmit`: sending one copy of the model (or its gradient) over one link;
- `tmerge`: adding one received copy into the local one (averaging).

Both models assume communication overlaps with the next step's computation, so a worker only
waits for the part of its communication that computation cannot hide, and that links and
workers are homogeneous. They predict samples per second relative to one worker, not time to
a given accuracy: gossip's workers disagree a little (see `gossip_schedule`), which can cost
extra steps that these formulas do not count.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np


def _check(n, tcalc: float, ttransmit: float, tmerge: float) -> np.ndarray:
    n = np.asarray(n, dtype=float)
    if np.any(n < 1) or np.any(n != np.round(n)):
        raise ValueError(f"n must hold whole numbers of workers >= 1, got {n!r}")
    if min(tcalc, ttransmit, tmerge) < 0 or tcalc + tmerge <= 0:
        raise ValueError(
            f"times must be >= 0 with tcalc + tmerge > 0; got tcalc={tcalc}, ttransmit={ttransmit}, tmerge={tmerge}"
        )
    return n


def _speedup(n: np.ndarray, tcalc: float, tmerge: float, twait: np.ndarray):
    speedup = n * (tcalc + tmerge) / (tcalc + tmerge + twait)
    return float(speedup) if speedup.ndim == 0 else speedup


def speedup_allreduce(n, tcalc: float, ttransmit: float, tmerge: float):
    """Speedup(n) = n (Tcalc + Tmerge) / (Tcalc + Tmerge + Twait), with
    Twait = max(n Ttransmit + (n - 1) Tmerge - Tcalc, 0).

    The ring model: every worker's update travels the whole ring, so a step costs n transfers and
    n - 1 merges, of which Tcalc is hidden behind computation. Algebraically this is
    min(n, (Tcalc + Tmerge) / (Ttransmit + Tmerge)): linear until communication outgrows
    computation, then flat at `allreduce_speedup_limit`. `n`: an int or an array of them; returns
    a float or an array of the same shape. Read literally at n = 1 it still charges one transfer.
    """
    n = _check(n, tcalc, ttransmit, tmerge)
    twait = np.maximum(n * ttransmit + (n - 1) * tmerge - tcalc, 0.0)
    return _speedup(n, tcalc, tmerge, twait)


def speedup_gossip(n, tcalc: float, ttransmit: float, tmerge: float):
    """Speedup(n) = n (Tcalc + Tmerge) / (Tcalc + Tmerge + Twait), with
    Twait = max(Ttransmit + Tmerge - Tcalc, 0).

    Gossip (AD-PSGD): each round a worker exchanges with one partner, one transfer and one merge
    whatever n is, overlapped with its computation, so Twait does not grow with n and the
    speedup stays linear: n * min(1, (Tcalc + Tmerge) / (Ttransmit + 2 Tmerge)). Assumes the
    pairs of a round use disjoint links (no shared switch becomes the bottleneck). Shapes as in
    `speedup_allreduce`.
    """
    n = _check(n, tcalc, ttransmit, tmerge)
    twait = np.maximum(ttransmit + tmerge - tcalc, 0.0) + np.zeros_like(n)
    return _speedup(n, tcalc, tmerge, twait)


def allreduce_speedup_limit(tcalc: float, ttransmit: float, tmerge: float) -> float:
    """The ceiling of `speedup_allreduce` as n grows: (Tcalc + Tmerge) / (Ttransmit + Tmerge)."""
    _check(1, tcalc, ttransmit, tmerge)
    if ttransmit + tmerge == 0:
        return float("inf")
    return (tcalc + tmerge) / (ttransmit + tmerge)


def plot_speedup(tcalc: float, ttransmit: float, tmerge: float, path: str | os.PathLike, max_n: int = 128) -> Path:
    """Writes a PNG to `path` with both predicted speedups for n = 1..max_n on log-2 axes, the
    linear-speedup line and the allreduce ceiling; returns the path.

    Draws on the Agg canvas directly, without pyplot, so it neither needs a display nor changes
    the caller's matplotlib backend.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import FuncFormatter, LogLocator

    if max_n < 2:
        raise ValueError(f"max_n must be >= 2 to draw a curve, got {max_n}")
    n = np.arange(1, max_n + 1)
    fig = Figure(figsize=(7, 5), dpi=120)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    # Where the curves coincide (both linear), widths and drawing order keep all three visible:
    # the wide allreduce line under the narrow gossip line under the dashed ideal.
    ax.plot(n, speedup_allreduce(n, tcalc, ttransmit, tmerge), color="C0", linewidth=4, label="ring allreduce")
    ax.plot(n, speedup_gossip(n, tcalc, ttransmit, tmerge), color="C1", linewidth=1.8, label="gossip (AD-PSGD)")
    ax.plot(n, n, color="0.2", linestyle="--", linewidth=1, label="linear speedup (ideal)")
    limit = allreduce_speedup_limit(tcalc, ttransmit, tmerge)
    if limit < max_n:
        ax.axhline(limit, color="C0", linestyle=":", linewidth=1, label=f"allreduce ceiling {limit:.3g}")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log", base=2)
    # After set_*scale, which would reset them: plain 1, 2, 4, ... instead of 2^k labels.
    for axis in (ax.xaxis, ax.yaxis):
        axis.set_major_locator(LogLocator(base=2))
        axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.set_xlabel("workers n")
    ax.set_ylabel("speedup over one worker (samples/s)")
    ax.set_title(
        "Predicted speedup, ring allreduce vs gossip\n"
        f"Tcalc={tcalc:g} s, Ttransmit={ttransmit:g} s, Tmerge={tmerge:g} s per step"
    )
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(loc="upper left")
    fig.tight_layout()

    # Write under a temporary name and rename, so a reader never sees half a PNG.
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    fig.savefig(tmp, format="png")
    os.replace(tmp, path)
    return path
