"""The demo's estimate: a measured run's task minutes scaled by this machine's calibration
(benchmarks/calibrate.py); the recipe a last run's time is kept under."""

from __future__ import annotations

import shutil

import pytest

from benchmarks import calibrate
from tests.conftest import ROOT

THERE = {"asr_step_s": 0.6, "tts_step_s": 0.5, "probe_s": 0.2, "seconds": 80.0}
RECORD = {
    "params": {},
    "demo_wall_s": 61 * 60,
    "task_minutes": {"prepare_corpus": 4.0, "train_asr": 30.0, "train_tts": 20.0, "tune_lm_asr": 6.0},
    "calibration": THERE,
    "meta": {"machine": {"cores": 2, "cpu_model": "Some CPU"}},
}


def test_each_training_scales_by_its_models_step_and_the_rest_by_the_probe():
    here = {"asr_step_s": 0.2, "tts_step_s": 0.25, "probe_s": 0.1, "seconds": 25.0}
    predicted = calibrate.estimate(RECORD, here)
    assert predicted["calibrated"]
    assert predicted["tasks"]["train_asr"] == pytest.approx(10.0)  # a third of the step: a third of the minutes
    assert predicted["tasks"]["train_tts"] == pytest.approx(10.0)
    assert predicted["tasks"]["prepare_corpus"] == pytest.approx(2.0)
    assert predicted["tasks"]["tune_lm_asr"] == pytest.approx(3.0)
    # The minute between the tasks (Airflow's own) scales with the probe too.
    assert predicted["minutes"] == pytest.approx(10 + 10 + 2 + 3 + 0.5)
    line = calibrate.estimate_line(RECORD, here, "demo.json")
    assert line.startswith("this takes about 26 minutes on this machine (calibrated in 25 s; demo.json: 61 minutes")


def test_a_record_without_a_calibration_is_given_as_it_is_and_says_so():
    record = {key: value for key, value in RECORD.items() if key != "calibration"}
    predicted = calibrate.estimate(record, THERE)
    assert not predicted["calibrated"] and predicted["minutes"] == pytest.approx(61)
    assert "not calibrated" in calibrate.estimate_line(record, THERE, "demo.json")


def test_the_recipe_changes_with_a_config_and_with_code_and_not_with_results(tmp_path):
    for top in calibrate.RECIPE:
        shutil.copytree(ROOT / top, tmp_path / top, ignore=shutil.ignore_patterns("__pycache__"))
    before = calibrate.recipe(tmp_path)
    assert calibrate.recipe(tmp_path) == before
    (tmp_path / "benchmarks" / "results").mkdir(parents=True)
    (tmp_path / "benchmarks" / "results" / "demo.json").write_text("{}")
    assert calibrate.recipe(tmp_path) == before
    config = tmp_path / "configs" / "demo_asr.yaml"
    config.write_text(config.read_text().replace("max_steps: 1254", "max_steps: 1000"))
    changed = calibrate.recipe(tmp_path)
    assert changed != before
    (tmp_path / "models" / "train.py").write_text("# another trainer\n")
    assert calibrate.recipe(tmp_path) not in (before, changed)
