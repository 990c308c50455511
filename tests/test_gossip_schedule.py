"""Gossip schedule (matchings, mixing matrices, theory), its simulator, and the speedup model."""

import numpy as np
import pytest

from benchmarks.speedup_theory import (
    allreduce_speedup_limit,
    plot_speedup,
    speedup_allreduce,
    speedup_gossip,
)
from models.distributed.gossip_schedule import (
    SCHEMES,
    expected_contraction,
    hierarchical_matching,
    hierarchical_pairs_needed,
    host_groups,
    matching,
    mixing_matrix,
    pairs_needed,
    partner,
)
from tests.gossip_sim import consensus_distance, fit_contraction, simulate_consensus

# ---- matchings -------------------------------------------------------------------------------


@pytest.mark.parametrize("scheme", SCHEMES)
def test_even_sizes_get_perfect_matchings_with_symmetric_partners(scheme):
    for size in range(2, 129, 2):
        for round_index in (0, 1, 2, 7):
            pairs = matching(size, round_index, scheme, seed=3)
            assert len(pairs) == size // 2
            assert sorted(r for pair in pairs for r in pair) == list(range(size))
            assert all(i < j for i, j in pairs)
            partners = [partner(r, size, round_index, scheme, seed=3) for r in range(size)]
            assert all(partners[p] == r and p != r for r, p in enumerate(partners))


@pytest.mark.parametrize("scheme", SCHEMES)
def test_odd_sizes_leave_exactly_one_rank_idle(scheme):
    for size in range(1, 128, 2):
        for round_index in (0, 1, 5):
            pairs = matching(size, round_index, scheme, seed=1)
            matched = [r for pair in pairs for r in pair]
            assert len(matched) == len(set(matched)) == size - 1
            (idle,) = set(range(size)) - set(matched)
            assert partner(idle, size, round_index, scheme, seed=1) == idle


@pytest.mark.parametrize("scheme", SCHEMES)
def test_every_rank_agrees_whatever_its_global_random_state(scheme):
    # Ranks seed numpy's global generator differently (data shuffling); the schedule must not care.
    size, round_index = 16, 5
    reference = matching(size, round_index, scheme, seed=7)
    for rank in range(size):
        np.random.seed(1000 + rank)
        assert matching(size, round_index, scheme, seed=7) == reference
        np.random.seed(2000 + rank)
        mine = partner(rank, size, round_index, scheme, seed=7)
        assert (min(rank, mine), max(rank, mine)) in reference


def test_fixed_ring_alternates_between_the_two_halves_of_the_ring():
    assert matching(8, 0, "fixed-ring") == [(0, 1), (2, 3), (4, 5), (6, 7)]
    assert matching(8, 1, "fixed-ring") == [(0, 7), (1, 2), (3, 4), (5, 6)]
    for r in range(2, 10):
        assert matching(8, r, "fixed-ring") == matching(8, r % 2, "fixed-ring")
    assert matching(8, 0, "fixed-ring", seed=5) == matching(8, 0, "fixed-ring", seed=0)
    for size in (2, 3, 7, 10, 31):
        for r in range(2 * size):
            assert all((j - i) % size in (1, size - 1) for i, j in matching(size, r, "fixed-ring"))


def test_fixed_ring_with_odd_size_rotates_the_idle_rank_over_all_ring_edges():
    size = 5
    idles = [next(q for q in range(size) if partner(q, size, r, "fixed-ring") == q) for r in range(size)]
    assert idles == [(r - 1) % size for r in range(size)]
    used = {pair for r in range(size) for pair in matching(size, r, "fixed-ring")}
    assert used == {(0, 1), (1, 2), (2, 3), (3, 4), (0, 4)}


def test_random_ring_changes_every_round_and_is_reproducible_from_the_seed():
    draws = [matching(16, r, "random-ring", seed=11) for r in range(20)]
    assert len({tuple(d) for d in draws}) == 20
    assert draws == [matching(16, r, "random-ring", seed=11) for r in range(20)]
    assert draws != [matching(16, r, "random-ring", seed=12) for r in range(20)]
    assert all(d != matching(16, r, "fixed-ring") for r, d in enumerate(draws))


def test_random_ring_partners_are_uniform():
    size, rounds = 8, 7000
    counts = np.bincount([partner(0, size, r, "random-ring", seed=2) for r in range(rounds)], minlength=size)
    assert counts[0] == 0
    expected = rounds / (size - 1)  # 1000, binomial sd about 30
    assert np.all(np.abs(counts[1:] - expected) < 150), counts


@pytest.mark.parametrize("scheme", SCHEMES)
def test_pairs_needed_covers_every_pair_that_occurs(scheme):
    for size in (1, 2, 3, 4, 7, 8, 16):
        needed = pairs_needed(size, scheme)
        assert len(needed) == len(set(needed))
        used = {pair for r in range(8 * size) for pair in matching(size, r, scheme, seed=4)}
        assert used <= set(needed)
        if scheme == "fixed-ring":
            # Nothing registered that is never used: every process set costs a communicator.
            assert used == set(needed)
            assert len(needed) == (size if size > 2 else size - 1)
        else:
            assert len(needed) == size * (size - 1) // 2


def test_bad_arguments_are_refused_with_a_clear_error():
    with pytest.raises(ValueError, match="unknown gossip scheme"):
        matching(8, 0, "ring")
    with pytest.raises(ValueError, match="size"):
        matching(0, 0, "fixed-ring")
    with pytest.raises(ValueError, match="round_index"):
        matching(8, -1, "random-ring")
    with pytest.raises(ValueError, match="out of range"):
        partner(8, 8, 0, "fixed-ring")


# ---- mixing matrices and theory --------------------------------------------------------------


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("size", [2, 5, 8, 33])
def test_mixing_matrices_are_symmetric_doubly_stochastic_projections(scheme, size):
    for r in range(4):
        w = mixing_matrix(size, r, scheme, seed=9)
        assert w.shape == (size, size)
        np.testing.assert_allclose(w, w.T)
        np.testing.assert_allclose(w.sum(axis=0), 1.0)
        np.testing.assert_allclose(w.sum(axis=1), 1.0)
        np.testing.assert_allclose(w @ w, w)
        for i, j in matching(size, r, scheme, seed=9):
            assert w[i, i] == w[j, j] == w[i, j] == w[j, i] == 0.5
        for idle in range(size):
            if partner(idle, size, r, scheme, seed=9) == idle:
                np.testing.assert_array_equal(w[idle], np.eye(size)[idle])


@pytest.mark.parametrize("size", [4, 8, 32, 128])
def test_fixed_ring_contraction_matches_the_circulant_closed_form(size):
    rho = expected_contraction(size, "fixed-ring")
    assert rho == pytest.approx(np.cos(2 * np.pi / size) ** 2, abs=1e-9)
    # ... which is sigma_2(W_odd W_even)^2: the square of the brief's per-round norm bound.
    product = mixing_matrix(size, 1, "fixed-ring") @ mixing_matrix(size, 0, "fixed-ring")
    sigma = np.linalg.svd(product, compute_uv=False)
    assert rho == pytest.approx(sigma[1] ** 2, abs=1e-9)


@pytest.mark.parametrize("size", [8, 9, 32])
def test_random_ring_closed_form_agrees_with_sampled_matchings(size):
    closed = expected_contraction(size, "random-ring")
    assert closed == pytest.approx((size - 2) / (2 * (size - 1)) if size % 2 == 0 else 0.5)
    sampled = expected_contraction(size, "random-ring", seed=5, rounds=4000)
    assert sampled == pytest.approx(closed, rel=0.05)


def test_trivial_sizes_reach_consensus_in_one_round():
    assert expected_contraction(1, "random-ring") == 0.0
    assert expected_contraction(2, "random-ring") == 0.0
    assert expected_contraction(2, "fixed-ring") == pytest.approx(0.0, abs=1e-12)
    assert expected_contraction(4, "fixed-ring") == pytest.approx(0.0, abs=1e-12)


# ---- simulator against theory ----------------------------------------------------------------


@pytest.mark.parametrize("size", [8, 9, 32, 128])
def test_simulated_fixed_ring_contracts_as_predicted(size):
    rho = expected_contraction(size, "fixed-ring")
    distances = simulate_consensus(size, int(20 / (1 - rho)), "fixed-ring", seed=1)
    measured = fit_contraction(distances)
    assert measured == pytest.approx(rho, rel=0.10)
    # Near 1 (0.998 at n=128) a 10% band says nothing; the gap 1 - rho is what the theory predicts.
    assert 1 - measured == pytest.approx(1 - rho, rel=0.10)


@pytest.mark.parametrize("size", [8, 9, 32, 128])
def test_simulated_random_ring_contracts_as_predicted(size):
    # The theory is for E[D_t]; one run measures exp(E[log ratio]), a few percent lower at n = 8
    # by Jensen, so average the curve over seeds (short, so no rare slow run dominates the mean).
    curves = [simulate_consensus(size, 12, "random-ring", seed=s) for s in range(64)]
    measured = fit_contraction(np.mean(curves, axis=0), skip_fraction=0.0)
    assert measured == pytest.approx(expected_contraction(size, "random-ring"), rel=0.10)


def test_random_matching_mixes_much_faster_than_the_fixed_ring_at_128():
    assert expected_contraction(128, "random-ring") < 0.5 < 0.99 < expected_contraction(128, "fixed-ring")
    random = simulate_consensus(128, 40, "random-ring", seed=3)
    fixed = simulate_consensus(128, 40, "fixed-ring", seed=3)
    assert random[0] == fixed[0]  # same start: only the schedule differs
    assert random[-1] < 1e-9 * random[0]
    # The ring's rough modes die fast too; its smooth ones (rate cos^2(2 pi / n)) hold it back.
    assert fixed[-1] > 1e-2 * fixed[0]


def test_local_steps_hold_the_distance_at_the_predicted_floor():
    # E[D_{t+1}] = rho (E[D_t] + s^2 dim (n-1)/n) for the random matching, whose floor is
    # rho s^2 dim (n-1)/n / (1 - rho).
    size, noise, dim = 32, 0.1, 16
    rho = expected_contraction(size, "random-ring")
    floor = rho * noise**2 * dim * (size - 1) / size / (1 - rho)
    distances = simulate_consensus(size, 600, "random-ring", seed=2, dim=dim, compute_noise=noise)
    assert np.mean(distances[100:]) == pytest.approx(floor, rel=0.10)
    assert simulate_consensus(size, 600, "random-ring", seed=2, dim=dim)[-1] < 1e-30


def test_simulator_starts_from_random_vectors_and_averages_within_pairs():
    d = simulate_consensus(2, 3, "fixed-ring", seed=0, dim=4)
    assert d.shape == (4,)
    assert d[0] > 0.1 and np.all(d[1:] < 1e-25)
    x = np.array([[0.0, 0.0], [2.0, 0.0], [4.0, 3.0]])
    assert consensus_distance(x) == pytest.approx((5 + 1 + 8) / 3)  # mean (2, 1)


def test_fit_contraction_recovers_a_known_rate_and_ignores_the_round_off_floor():
    curve = 3.0 * 0.7 ** np.arange(200.0)
    curve[120:] = 1e-31  # what round-off leaves once the true curve would go below it
    assert fit_contraction(curve) == pytest.approx(0.7, rel=1e-9)
    assert fit_contraction(curve, skip_fraction=0.0) == pytest.approx(0.7, rel=1e-9)
    transient = 0.7 ** np.arange(100.0) + 0.2 ** np.arange(100.0)
    assert fit_contraction(transient) == pytest.approx(0.7, rel=1e-6)
    with pytest.raises(ValueError, match="rounds to fit"):
        fit_contraction(np.array([1.0, 0.5, 1e-30]))


# ---- hierarchical ----------------------------------------------------------------------------


def test_host_groups_and_the_leaders_matching():
    hosts = ["b", "a", "b", "a", "c", "c", "d"]
    assert host_groups(hosts) == [[0, 2], [1, 3], [4, 5], [6]]
    assert hierarchical_matching(hosts, 0, "fixed-ring") == [(0, 1), (4, 6)]
    assert hierarchical_matching(hosts, 1, "fixed-ring") == [(0, 6), (1, 4)]
    leaders = {0, 1, 4, 6}
    for r in range(10):
        pairs = hierarchical_matching(hosts, r, "random-ring", seed=3)
        flat = [x for pair in pairs for x in pair]
        assert len(flat) == len(set(flat)) == 4 and set(flat) <= leaders
        assert set(pairs) <= set(hierarchical_pairs_needed(hosts, "random-ring"))
    assert hierarchical_pairs_needed(hosts, "fixed-ring") == [(0, 1), (0, 6), (1, 4), (4, 6)]
    with pytest.raises(ValueError, match="rank 1"):
        host_groups(["a", ""])


# ---- speedup model ---------------------------------------------------------------------------


def test_free_communication_gives_linear_speedup():
    n = np.arange(1, 129)
    np.testing.assert_allclose(speedup_allreduce(n, 1.0, 0.0, 0.0), n)
    np.testing.assert_allclose(speedup_gossip(n, 1.0, 0.0, 0.0), n)
    assert speedup_allreduce(16, 1.0, 0.0, 0.0) == 16.0
    assert isinstance(speedup_gossip(16, 1.0, 0.0, 0.0), float)


def test_speedup_hand_computed_cases():
    # n=16, Tcalc=1, Ttransmit=0.1: Twait = 1.6 - 1 = 0.6, speedup = 16 / 1.6 = 10.
    assert speedup_allreduce(16, 1.0, 0.1, 0.0) == pytest.approx(10.0)
    assert speedup_allreduce(8, 1.0, 0.1, 0.0) == pytest.approx(8.0)  # 0.8 s hides behind 1 s
    # n=4, Tcalc=1, Ttransmit=0.5, Tmerge=0.25: Twait = 2 + 0.75 - 1 = 1.75, 4 * 1.25 / 3.
    assert speedup_allreduce(4, 1.0, 0.5, 0.25) == pytest.approx(5 / 3)
    assert speedup_gossip(4, 1.0, 0.5, 0.25) == pytest.approx(4.0)  # 0.75 s hides behind 1 s
    # Ttransmit=2 > Tcalc=1: gossip waits 1 s per 1 s step, half of linear at every n.
    np.testing.assert_allclose(speedup_gossip(np.array([2, 64]), 1.0, 2.0, 0.0), [1.0, 32.0])


def test_allreduce_saturates_while_gossip_keeps_scaling():
    tcalc, ttransmit, tmerge = 1.0, 0.5, 0.1
    limit = allreduce_speedup_limit(tcalc, ttransmit, tmerge)
    assert limit == pytest.approx(1.1 / 0.6)
    n = np.array([4, 16, 64, 1024])
    np.testing.assert_allclose(speedup_allreduce(n, tcalc, ttransmit, tmerge), limit)
    np.testing.assert_allclose(speedup_gossip(n, tcalc, ttransmit, tmerge), n)
    with pytest.raises(ValueError, match="times"):
        speedup_gossip(4, 0.0, 1.0, 0.0)


def test_the_gpu_projection_reads_the_copied_calibration_and_names_its_assumptions():
    import json

    from benchmarks import report_speed, speedup_model

    calibration = json.loads(speedup_model.CALIBRATION.read_text())
    assert calibration["provenance"]["device"].startswith("one NVIDIA H100")
    gpu = speedup_model.gpu_projection(2_541_332)
    assert gpu["tcalc_s"] == pytest.approx(0.0237)  # the demo model's smallest calibrated step, fp32
    assert gpu["ttransmit_s"] == pytest.approx(2_541_332 * 4 / 25e9) and gpu["assumptions"]["link_bytes_per_s"] == 25e9
    assert gpu["allreduce_predicted_speedup_n8"] == pytest.approx(8)  # computation hides the ring at 8
    assert gpu["allreduce_predicted_speedup_n128"] < gpu["adpsgd_predicted_speedup_n128"] == pytest.approx(128)
    rows = report_speed.gpu_rows(gpu)
    assert [r[0] for r in rows] == ["allreduce", "adpsgd"] and rows[1][-1] == pytest.approx(84)


def test_plot_speedup_writes_a_png(tmp_path):
    path = plot_speedup(1.0, 0.1, 0.01, tmp_path / "speedup.png", max_n=64)
    assert path == tmp_path / "speedup.png"
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert path.stat().st_size > 10_000
    assert [p.name for p in tmp_path.iterdir()] == ["speedup.png"]


# ---- delay-by-one's double buffer ----------------------------------------------------------------


def _delayed_ranks(starts):
    """Two ranks' models (plain vectors) and their DelayedMerge buffers."""
    from models.distributed.gossip import DelayedMerge

    models = [np.array(start, np.float64) for start in starts]

    def assign(i):
        def assign_delta(delta):
            models[i] += delta

        return assign_delta

    merges = [DelayedMerge(m.copy()) for m in models]
    return models, merges, [assign(i) for i in range(2)]


@pytest.mark.parametrize("overlap", [False, True])
def test_delay_by_one_moves_each_rank_halfway_once(overlap):
    # Two ranks that do not train (no local progress): gossip alone must bring them to their
    # average and keep them there. With `overlap`, each round's exchange ends only after the next
    # step boundary, so the next round starts before that round's pull is merged (a rank waiting
    # for a slower partner): its snapshot must still hold the pull, or both ranks move the whole
    # distance and swap places for ever.
    for rounds in range(1, 6):
        models = _delayed_rounds(rounds, overlap)
        np.testing.assert_allclose(models[0], [1.0, 2.0], err_msg=f"after {rounds} rounds")
        np.testing.assert_allclose(models[1], [1.0, 2.0], err_msg=f"after {rounds} rounds")


def _delayed_rounds(rounds: int, overlap: bool) -> list:
    models, merges, assigns = _delayed_ranks([[0.0, 4.0], [2.0, 0.0]])
    for _ in range(rounds):
        snapshots = [m.snapshot() for m in merges]
        if overlap:  # a step ends while the exchange is in flight
            for i in range(2):
                merges[i].merge_and_publish(assigns[i], models[i].copy)
        average = (snapshots[0] + snapshots[1]) / 2  # the pair's allreduce
        for i in range(2):
            merges[i].add(average, snapshots[i])
        if not overlap:  # the result arrives during the step, merged at its end
            for i in range(2):
                merges[i].merge_and_publish(assigns[i], models[i].copy)
    for i in range(2):  # finish(): the last pulls
        merges[i].merge_and_publish(assigns[i], models[i].copy)
    return models


def test_delay_by_one_keeps_the_progress_made_during_the_exchange():
    models, merges, assigns = _delayed_ranks([[0.0], [2.0]])
    snapshots = [m.snapshot() for m in merges]
    models[0] += 10.0  # rank 0 trains on while the round is in flight
    average = (snapshots[0] + snapshots[1]) / 2
    for i in range(2):
        merges[i].add(average, snapshots[i])
        merges[i].merge_and_publish(assigns[i], models[i].copy)
    np.testing.assert_allclose([models[0][0], models[1][0]], [11.0, 1.0])  # the average plus its own progress
    np.testing.assert_allclose(merges[0].snapshot(), [11.0])  # published after the merge
