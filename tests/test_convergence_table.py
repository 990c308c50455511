"""The convergence benchmark's table: variants read from an earlier run only at the same budget."""

from __future__ import annotations

import argparse
import json

import pytest

from benchmarks import report_runs
from benchmarks.convergence import (
    aim_half_speed,
    compare_to_allreduce,
    dev_cer_plot,
    dev_curve,
    earlier_half_speed,
    earlier_seeds,
    first_below,
    reference,
    same_budget,
    time_to_accuracy,
)
from benchmarks.harness import ROOT
from common import config as configlib
from models.training.config import TrainConfig


def earlier_run(tmp_path, **overrides):
    results = {"tiny": False, "epochs": 15, "seeds": 1, "allreduce_cer": 0.20, "allreduce_cers": [0.20]}
    path = tmp_path / "earlier.json"
    path.write_text(json.dumps({**results, **overrides}))
    return path


def test_an_earlier_run_at_another_budget_is_refused(tmp_path, capsys):
    parser = argparse.ArgumentParser()
    assert reference(parser, earlier_run(tmp_path), 15)["allreduce_cers"] == [0.20]
    with pytest.raises(SystemExit):
        reference(parser, earlier_run(tmp_path), 10)
    assert "runs compare only at the same budget" in capsys.readouterr().err


def test_only_the_seeds_an_earlier_run_lacks_are_trained():
    one_seed = {"allreduce_cers": [0.20], "allreduce_wer": 0.5}
    assert earlier_seeds(one_seed, "allreduce", 2) == ([0.20], [0.5])  # seed 1 still to train
    assert earlier_seeds(one_seed, "fixed-ring", 2) == ([], [])
    two_seeds = {"allreduce_cers": [0.20, 0.22], "allreduce_wers": [0.5, 0.6], "allreduce_wer": 0.55}
    assert earlier_seeds(two_seeds, "allreduce", 1) == ([0.20], [0.5])


def test_each_variant_is_compared_with_allreduce_and_says_where_it_was_measured():
    results = {"allreduce_from": "seed 0 from earlier.json"}
    for name, cer in (("allreduce", 0.20), ("fixed-ring", 0.21), ("random-ring", 0.25)):
        results.update({f"{name}_cer": cer, f"{name}_cers": [cer], f"{name}_cer_spread": 0.0, f"{name}_wer": 0.5})
    compare_to_allreduce(results, ["allreduce", "fixed-ring", "random-ring"])
    rows = [
        line
        for line in report_runs.convergence({**results, "epochs": 15})
        if line.startswith("| ") and "---" not in line
    ][1:]
    assert [row.split(" | ")[0] for row in rows] == ["| allreduce", "| fixed-ring", "| random-ring"]
    assert [row.split(" | ")[6] for row in rows] == ["seed 0 from earlier.json", "this run", "this run"]
    assert results["fixed-ring_relative_to_allreduce"] == pytest.approx(0.05)
    assert results["random-ring_relative_to_allreduce"] == pytest.approx(0.25)
    assert results["all_within_10_percent"] is False  # the random ring is 25% worse


def test_minutes_to_a_dev_cer_count_the_final_evaluation_too():
    history = [
        {"dev_cer": 0.5, "dev_wall_s": 60.0},
        {"dev_cer": 0.108, "dev_wall_s": 600.0},
        {"dev_cer": 0.100, "dev_wall_s": 900.0},
    ]
    summary = {"dev_history": history, "last_dev_cer": 0.09, "last_dev_wall_s": 960.0}
    curve = dev_curve(summary)
    assert curve[-1] == [16.0, 0.09] and len(curve) == 4
    assert first_below(curve, 0.11) == 10.0  # the first evaluation at or below, not the best one
    assert first_below(curve, 0.095) == 16.0  # reached only by the final evaluation
    assert first_below(curve, 0.05) is None
    # a final evaluation that is the last of the history is not counted twice
    assert len(dev_curve({"dev_history": history, "last_dev_cer": 0.1, "last_dev_wall_s": 900.0})) == 3


def test_the_half_speed_curves_are_drawn(tmp_path):
    curves = {"random-ring": [[1.0, 0.9], [12.0, 0.105]], "allreduce": [[2.0, 1.0], [38.0, 0.11]]}
    path = dev_cer_plot(curves, 0.11, tmp_path / "part2.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 10_000


def test_time_to_accuracy_compares_the_strategies_at_the_level_every_run_reached():
    results = {"allreduce_cers": [0.2, 0.2], "random-ring_cers": [0.21]}
    runs = {
        ("allreduce", 0): [[2.0, 0.5], [10.0, 0.25], [16.0, 0.20]],
        ("allreduce", 1): [[2.0, 0.5], [12.0, 0.24], [16.0, 0.21]],
        ("random-ring", 0): [[2.0, 0.6], [8.0, 0.24], [15.0, 0.245]],  # ends above its best
    }
    for (name, seed), curve in runs.items():
        results[f"{name}_seed{seed}_dev_curve"] = curve
        results[f"{name}_seed{seed}_final_dev_cer"] = curve[-1][1]
        results[f"{name}_seed{seed}_job_wall_s"] = 1000.0
    time_to_accuracy(results, ["allreduce", "random-ring"], [0.22, 0.03])
    assert results["common_dev_level"] == 0.24  # the worst of the runs' best dev CERs
    assert results["allreduce_seed0_minutes_to_common_level"] == 16.0
    assert results["allreduce_minutes_to_common_level"] == 14.0  # the seeds' mean of 16 and 12
    assert results["random-ring_minutes_to_common_level"] == 8.0
    assert results["random-ring_minutes_to_common_level_vs_allreduce"] == pytest.approx(8 / 14)
    assert results["allreduce_minutes_to_0.22"] == 16.0 and results["random-ring_minutes_to_0.22"] is None
    assert results["allreduce_minutes_to_0.03"] is None  # a seed that never reached it: the strategy did not
    assert results["random-ring_final_dev_cer"] == 0.245


def test_an_earlier_runs_half_speed_part_is_kept_whole():
    earlier = {
        "allreduce_cers": [0.2],
        "allreduce_seed0_dev_curve": [[1.0, 0.3]],
        "best_gossip_variant": "random-ring",
        "half_speed_common_dev_cer": 0.21,
        "allreduce_half_speed_job_minutes": 30.0,
        "random-ring_half_speed_job_minutes": 20.0,
    }
    kept = earlier_half_speed(earlier)
    assert set(kept) == {
        "best_gossip_variant",
        "half_speed_common_dev_cer",
        "allreduce_half_speed_job_minutes",
        "random-ring_half_speed_job_minutes",
    }
    assert earlier_half_speed({"allreduce_cers": [0.2], "best_gossip_variant": "random-ring"}) == {}


def test_a_kept_half_speed_part_is_measured_against_the_target_of_todays_seeds():
    """Part 2 read from an earlier run beside a third seed of part 1: allreduce's final dev CER (the
    seeds' mean) moved, and the minutes to it are worked out again from the kept curves."""
    results = {
        "allreduce_final_dev_cer": 0.208,  # three seeds now; two gave 0.2055, which neither run reached
        "random-ring_half_speed_dev_curve": [[10.0, 0.25], [16.0, 0.218], [21.6, 0.2071]],
        "random-ring_half_speed_minutes_to_allreduce_dev_cer": None,
        "allreduce_half_speed_dev_curve": [[20.0, 0.22], [26.0, 0.2075], [29.0, 0.2063]],
        "allreduce_half_speed_minutes_to_allreduce_dev_cer": None,
        "half_speed_target_dev_cer": 0.2055,
    }
    aim_half_speed(results)
    assert results["half_speed_target_dev_cer"] == 0.208
    assert results["random-ring_half_speed_minutes_to_allreduce_dev_cer"] == 21.6
    assert results["allreduce_half_speed_minutes_to_allreduce_dev_cer"] == 26.0
    results["allreduce_final_dev_cer"] = 0.2
    aim_half_speed(results)
    assert results["random-ring_half_speed_minutes_to_allreduce_dev_cer"] is None


def test_four_ranks_train_the_samples_of_two_on_the_demo_schedule():
    # max_steps and eval_every count each rank's steps: four ranks take half of each
    assert same_budget(ROOT / "configs/demo_asr.yaml", 2) == []
    demo = configlib.load(TrainConfig, ROOT / "configs/demo_asr.yaml")
    halves = [f"max_steps={demo.max_steps // 2}", f"eval_every={demo.eval_every // 2}"]
    assert same_budget(ROOT / "configs/demo_asr.yaml", 4) == halves
    assert same_budget(ROOT / "tests/configs/tiny_asr.yaml", 4) == []  # no step limit: epochs are shared
