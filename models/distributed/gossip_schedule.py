"""Who averages with whom, round by round, in AD-PSGD gossip (pure Python and numpy).

Asynchronous decentralized parallel SGD (Lian et al. 2018, "Asynchronous Decentralized Parallel
Stochastic Gradient Descent"; Zhang, Cui et al., ICASSP 2019 and 2020) replaces the global
allreduce with pairwise averaging: each round the workers are paired by a perfect matching and
every pair averages its weights. Schemes:

- "fixed-ring": the ring 0-1-...-(n-1)-0, its edges taken in turns. Round r pairs
  ((r + 2k) mod n, (r + 2k + 1) mod n) for k < n // 2. For even n that is two alternating
  matchings, (0,1),(2,3),... on even rounds and (1,2),(3,4),...,(n-1,0) on odd rounds. For odd n
  worker (r - 1) mod n idles and the pattern repeats every n rounds, so every ring edge is used.
- "random-ring": a fresh uniformly random (near-)perfect matching every round, drawn from
  `np.random.default_rng([seed, round])`. Every rank computes the same matching from the shared
  seed, so nobody has to communicate to agree on partners.
- hierarchical: ranks on one host average with an allreduce, then one leader per host gossips
  with other hosts' leaders by either scheme above (`host_groups`, `hierarchical_matching`).

Nothing here depends on the caller's rank or on global random state, which is what lets every
rank compute the schedule on its own. The Horovod strategy imports this module and must stay
free of TensorFlow, so this module is too.
"""

from __future__ import annotations

from collections.abc import Sequence
from numbers import Integral

import numpy as np

SCHEMES = ("fixed-ring", "random-ring")


def _check_int(name: str, value, minimum: int) -> int:
    # numpy integers count (ranks often come out of arrays); bools do not.
    if isinstance(value, bool) or not isinstance(value, Integral) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def _check(size, round_index, scheme: str, seed) -> tuple[int, int, int]:
    if scheme not in SCHEMES:
        raise ValueError(f"unknown gossip scheme {scheme!r}; choose one of {', '.join(SCHEMES)}")
    return _check_int("size", size, 1), _check_int("round_index", round_index, 0), _check_int("seed", seed, 0)


def matching(size: int, round_index: int, scheme: str, seed: int = 0) -> list[tuple[int, int]]:
    """The pairs that average in round `round_index`: sorted `(i, j)` tuples with `i < j`.

    A perfect matching of ranks `0..size-1` for even `size`; for odd `size` exactly one rank is
    left out (it idles this round). Deterministic in (size, round_index, scheme, seed); `seed`
    only matters for "random-ring".
    """
    size, round_index, seed = _check(size, round_index, scheme, seed)
    if scheme == "fixed-ring":
        order = (round_index + np.arange(size)) % size
    else:
        # A uniform permutation read off in pairs is a uniform perfect matching (and, for odd
        # size, a uniform idle rank): every matching comes from the same number of permutations.
        order = np.random.default_rng([seed, round_index]).permutation(size)
    pairs = order[: size - size % 2].reshape(-1, 2)  # [size // 2, 2]
    return sorted((int(min(a, b)), int(max(a, b))) for a, b in pairs)


def partner(rank: int, size: int, round_index: int, scheme: str, seed: int = 0) -> int:
    """The rank that `rank` averages with in this round; `rank` itself when it idles."""
    rank = _check_int("rank", rank, 0)
    if rank >= _check_int("size", size, 1):
        raise ValueError(f"rank {rank} is out of range for size {size}")
    for i, j in matching(size, round_index, scheme, seed):
        if rank in (i, j):
            return j if rank == i else i
    return rank


def pairs_needed(size: int, scheme: str) -> list[tuple[int, int]]:
    """Every pair that can ever occur, sorted, so a Horovod strategy can register one process set
    per pair up front: the n ring edges for "fixed-ring" (one for n = 2), all n(n-1)/2 pairs for
    "random-ring".
    """
    size, _, _ = _check(size, 0, scheme, 0)
    if scheme == "fixed-ring":
        return sorted({(min(i, (i + 1) % size), max(i, (i + 1) % size)) for i in range(size) if size > 1})
    return [(i, j) for i in range(size) for j in range(i + 1, size)]


def mixing_matrix(size: int, round_index: int, scheme: str, seed: int = 0) -> np.ndarray:
    """The round's gossip matrix W [size, size] (float64): new weights = W @ old weights.

    W[i,i] = W[j,j] = W[i,j] = W[j,i] = 1/2 for each pair (i, j); an idle rank's row is the
    identity row. W is symmetric, doubly stochastic and a projection (W @ W = W).
    """
    pairs = matching(size, round_index, scheme, seed)
    w = np.eye(size)
    for i, j in pairs:
        w[[i, i, j, j], [i, j, i, j]] = 0.5
    return w


def expected_contraction(size: int, scheme: str, seed: int = 0, rounds: int | None = None) -> float:
    """Predicted per-round contraction of the mean squared consensus distance.

    The distance is D_t = (1/n) sum_i ||x_i - mean(x)||^2, as in `gossip_sim.simulate_consensus`.
    With e the disagreement (x minus its average, orthogonal to the all-ones vector 1), one round
    maps e to W e, so D shrinks by e^T W^T W e / e^T e. The rate is governed by the spectral gap
    of the gossip matrices (Boyd et al. 2006, "Randomized gossip algorithms"; Lian et al. 2018):

    - "random-ring": E[D_{t+1}] <= rho E[D_t] with rho the largest eigenvalue of E[W^T W] on the
      subspace orthogonal to 1. Pairwise averaging makes W a projection, so W^T W = W. A uniform
      matching pairs i with j with probability 1/(n-1) for even n, so
      E[W] = (1/2) I + (J - I) / (2 (n - 1)); for odd n the pair probability is 1/n and a rank
      idles with probability 1/n, so E[W] = (1/2) I + J / (2n). Either is a multiple of the
      identity on 1-perp, so the bound holds with equality for every e:
      rho = (n - 2) / (2 (n - 1)) for even n, and 1/2 for odd n. `rounds`: None for this closed
      form; an integer to estimate E[W] instead from that many sampled `mixing_matrix` rounds
      starting at 0 with `seed` (a check on the sampler).
    - "fixed-ring": deterministic and periodic with period p (2 for even n, n for odd n). With
      P = W_{p-1} ... W_0 the product over one period, the disagreement asymptotically shrinks by
      the spectral radius of P on 1-perp per period, so D shrinks by rho = radius(P)^(2/p) per
      round. For even n, eig(W_odd W_even) = eig(W_even W_odd W_even) = sigma(W_odd W_even)^2,
      and W_even W_odd W_even acts on the pair means y_k as y_k <- (y_{k-1} + 2 y_k + y_{k+1})/4,
      a circulant with eigenvalues cos^2(2 pi j / n); so rho = cos^2(2 pi / n) = sigma_2^2, where
      sigma_2 is the second-largest singular value of W_odd W_even. (sigma_2^(1/2) bounds the
      per-round shrinkage of the norm ||e|| from one period's worst case; the asymptotic norm
      rate is sigma_2 itself.) `seed` and `rounds` are ignored.

    Returns rho in [0, 1): 0 means consensus in one round (n <= 2 for "random-ring").
    """
    size, _, seed = _check(size, 0, scheme, seed)
    if size == 1:
        return 0.0
    centre = np.eye(size) - 1.0 / size  # projects onto 1-perp
    if scheme == "fixed-ring":
        period = 2 if size % 2 == 0 else size
        product = np.eye(size)
        for r in range(period):
            product = mixing_matrix(size, r, scheme) @ product
        radius = float(np.max(np.abs(np.linalg.eigvals(centre @ product))))
        return radius ** (2.0 / period)
    if rounds is None:
        return (size - 2) / (2 * (size - 1)) if size % 2 == 0 else 0.5
    rounds = _check_int("rounds", rounds, 1)
    mean_w = sum(mixing_matrix(size, r, scheme, seed) for r in range(rounds)) / rounds
    return float(np.max(np.linalg.eigvalsh(centre @ mean_w @ centre)))


def host_groups(hostnames_by_rank: Sequence[str]) -> list[list[int]]:
    """Ranks grouped by host: `["a", "a", "b", "b"]` gives `[[0, 1], [2, 3]]`.

    Groups are ordered by their lowest rank and hold ascending ranks, so `group[0]` is the host's
    leader. Every rank must pass the same list (e.g. from an allgather of hostnames).
    """
    if len(hostnames_by_rank) == 0:
        raise ValueError("hostnames_by_rank is empty: pass one hostname per rank")
    groups: dict[str, list[int]] = {}
    for rank, host in enumerate(hostnames_by_rank):
        if not isinstance(host, str) or not host:
            raise ValueError(f"rank {rank} has hostname {host!r}; every rank needs a non-empty name")
        groups.setdefault(host, []).append(rank)
    return list(groups.values())


def hierarchical_matching(
    hostnames_by_rank: Sequence[str], round_index: int, scheme: str, seed: int = 0
) -> list[tuple[int, int]]:
    """The leaders' pairs for this round, as global ranks: host k's leader is its lowest rank, and
    the hosts are paired by `matching(number of hosts, round_index, scheme, seed)`. Ranks that are
    not leaders only take part in their host's allreduce.
    """
    leaders = [group[0] for group in host_groups(hostnames_by_rank)]
    return [(leaders[a], leaders[b]) for a, b in matching(len(leaders), round_index, scheme, seed)]


def hierarchical_pairs_needed(hostnames_by_rank: Sequence[str], scheme: str) -> list[tuple[int, int]]:
    """Every leader pair (global ranks) that `hierarchical_matching` can return."""
    leaders = [group[0] for group in host_groups(hostnames_by_rank)]
    return [(leaders[a], leaders[b]) for a, b in pairs_needed(len(leaders), scheme)]
