"""A single-process numpy simulator of the gossip schedule, to check its theory before training.

Each of `size` workers holds a vector (a stand-in for its weights); every round the pairs of
`gossip_schedule.matching` average their vectors, optionally after each worker took a random
local step. The measure throughout is the mean squared consensus distance

    D_t = (1/n) * sum_i ||x_i(t) - mean_j x_j(t)||^2,

the quantity whose per-round contraction `gossip_schedule.expected_contraction` predicts.
"""

from __future__ import annotations

import numpy as np

from models.distributed.gossip_schedule import SCHEMES, matching


def consensus_distance(x: np.ndarray) -> float:
    """Mean squared distance of the rows of `x` [workers, dim] from their average."""
    return float(np.mean(np.sum((x - x.mean(axis=0)) ** 2, axis=1)))


def simulate_consensus(
    size: int, rounds: int, scheme: str, seed: int = 0, dim: int = 16, compute_noise: float = 0.0
) -> np.ndarray:
    """Runs `rounds` gossip rounds from random vectors; returns D_t [rounds + 1] (entry 0 is the
    start, entry t the distance after round t's averaging).

    Starting vectors are standard normal [size, dim]. `compute_noise` > 0 mimics training: in
    every round, before averaging, each worker adds its own `compute_noise * N(0, I)` step, so D
    settles at a floor instead of going to 0. The matchings come from `seed` exactly as the real
    strategy would draw them; vectors and steps come from a separate stream of the same seed.
    """
    if scheme not in SCHEMES:
        raise ValueError(f"unknown gossip scheme {scheme!r}; choose one of {', '.join(SCHEMES)}")
    if size < 1 or rounds < 0 or dim < 1 or seed < 0 or not compute_noise >= 0:
        raise ValueError(
            f"need size >= 1, rounds >= 0, dim >= 1, seed >= 0 and compute_noise >= 0; got size={size}, "
            f"rounds={rounds}, dim={dim}, seed={seed}, compute_noise={compute_noise}"
        )
    # spawn_key gives a stream independent of the schedule's default_rng([seed, round]) streams.
    rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(1,)))
    x = rng.standard_normal((size, dim))  # [workers, dim]
    distances = np.empty(rounds + 1)
    distances[0] = consensus_distance(x)
    for r in range(rounds):
        if compute_noise > 0:
            x += compute_noise * rng.standard_normal((size, dim))
        pairs = np.array(matching(size, r, scheme, seed), dtype=int).reshape(-1, 2)  # [pairs, 2]
        mean = 0.5 * (x[pairs[:, 0]] + x[pairs[:, 1]])  # [pairs, dim]
        x[pairs[:, 0]] = mean
        x[pairs[:, 1]] = mean
        distances[r + 1] = consensus_distance(x)
    return distances


def fit_contraction(distances: np.ndarray, skip_fraction: float = 0.5, floor: float = 1e-20) -> float:
    """The per-round contraction factor of a decaying distance curve [rounds + 1], by a
    least-squares line through log D_t: returns exp(slope).

    Only the rounds before D_t first drops to `floor * D_0` count: below that, float64 round-off
    (about 1e-32 relative, for squared distances) would flatten the curve. Of those, the first
    `skip_fraction` are dropped as transient, so a deterministic schedule (the fixed ring) is
    measured at its asymptotic rate; pass 0 when there is no transient to skip (the random
    matching contracts at the same expected rate from any start). Fit noise-free curves only: with
    `compute_noise` the curve levels off and the fit would mix decay with the floor.

    For the random matching a single run measures the typical rate exp(E[log(D_{t+1}/D_t)]),
    which by Jensen's inequality is below the expected rate `expected_contraction` predicts (by
    a few percent at n = 8, less for larger n); average D_t over seeds first to measure the
    expected rate.
    """
    distances = np.asarray(distances, dtype=float)
    if distances.ndim != 1 or distances.size == 0 or not distances[0] > 0:
        raise ValueError("distances must be a 1-D curve starting above 0")
    if not 0 <= skip_fraction < 1:
        raise ValueError(f"skip_fraction must be in [0, 1), got {skip_fraction!r}")
    below = np.flatnonzero(distances <= floor * distances[0])
    end = int(below[0]) if below.size else distances.size
    start = int(skip_fraction * end)
    if end - start < 3:
        raise ValueError(
            f"only {end - start} rounds to fit (of {distances.size}, the rest below the floor or "
            "skipped); simulate more rounds or raise the floor"
        )
    slope = np.polyfit(np.arange(start, end), np.log(distances[start:end]), 1)[0]
    return float(np.exp(slope))
