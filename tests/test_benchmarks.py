"""Every benchmark runs on tiny inputs and writes its JSON (timings are never asserted)."""

from __future__ import annotations

import json
import math
import subprocess

import pytest

from tests.conftest import PYTHON, ROOT, quiet_env

pytestmark = pytest.mark.slow

EXPECTED = {
    "input_pipeline": [
        "baseline_frames_per_s",
        "tfdata_frames_per_s",
        "baseline_first_batch_s",
        "tfdata_first_batch_s",
        "tfdata_gpu_b256_utilization",
        "baseline_gpu_b256_utilization",
        "tfdata_gpu_b1024_utilization",
        "baseline_gpu_b1024_utilization",
        "tfdata_cpu_utilization",
        "frames_per_s_per_core",
        "demo_baseline_first_batch_s",
        "demo_tfdata_first_batch_s",
    ],
    "throughput": [
        "asr_np2_frames_per_s",
        "tts_np2_frames_per_s",
        "asr_np2_fraction_of_fp32_peak",
        "asr_np1_bf16_frames_per_s",
        "asr_np1_keras_frames_per_s",
        "asr_np1_bf16_fraction_of_fp32_peak",
        "matmul_peak_flops_float32",
        "asr_np2_share_input",
        "tts_np2_profile_decoder_ms",
        "tts_curve_xla_b4_frames_per_s",
    ],
    "straggler": [
        "fixed-ring_job_throughput_ratio_f2",
        "fixed-ring_fast_rank_ratio_f2",
        "fixed-ring_per_rank_batches_f2",
        "fixed-ring_ranks_agree_f2",
    ],
    "convergence": [
        "allreduce_cer",
        "fixed-ring_cer",
        "fixed-ring_cer_spread",
        "fixed-ring_relative_to_allreduce",
        "allreduce_final_dev_cer",
        "allreduce_minutes_to_common_level",
        "fixed-ring_seed0_dev_curve",
        "allreduce_half_speed_job_minutes",
        "best_gossip_variant",
    ],
    "faults": [
        "clean_cer",
        "kill_worker_exit",
        "kill_worker_detect_s",
        "kill_worker_steps_lost",
        "kill_worker_elastic_exit",
        "kill_job_steps_lost",
        "left_out",  # the tiny run's: the faults another test injects
        "corrupt_shard_named",
        "mlflow_down_none_lost",
    ],
    "calibrate": ["asr_step_s", "tts_step_s", "probe_s", "seconds", "machine"],
    "time_to_accuracy": ["arms", "targets", "meta"],
    "voice_levers": ["arms", "splits", "text", "meta"],
    "lm_decoding": ["conditions", "splits", "meta"],
    "targets": ["arms", "splits", "lm", "graph", "demo_lexicon", "meta"],
    "serving": ["rtf_1_client", "p99_s_4_clients", "failed_16_clients", "w1_c1", "w1_batch", "meta"],
    "speedup_model": [
        "tcalc_s",
        "ttransmit_s",
        "tmerge_s",
        "allreduce_predicted_speedup_n2",
        "adpsgd_measured_speedup_n2",
        "adpsgd_job_speedup_n2",
        "allreduce_predicted_speedup_n128",
        "adpsgd_predicted_speedup_n32",
        "gpu",  # the same model for a GPU cluster, from benchmarks/data/gpu_calibration.json
        "mlflow_run_id",
    ],
}


def run_tiny(name: str, tmp_path, store: str, *extra: str, keys: list[str] | None = None) -> dict:
    """Runs `benchmarks/NAME.py --tiny EXTRA` tracked in MLflow `store`; checks its table and the keys of
    its JSON (`keys`, else EXPECTED[NAME]), and returns the JSON."""
    out = tmp_path / f"{name}.json"
    env = quiet_env(MLFLOW_TRACKING_URI=store)
    proc = subprocess.run(
        [PYTHON, f"benchmarks/{name}.py", "--tiny", *extra, "--json", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,  # the faults benchmark took 571 s in a CI run on a slower machine
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    results = json.loads(out.read_text())
    check_keys(name, results, keys)
    assert proc.stdout.strip(), "no table printed"
    return results


def check_keys(name: str, results: dict, keys: list[str] | None = None) -> None:
    """Benchmark NAME's JSON `results` has every key of `keys` (else EXPECTED[NAME]), its floats finite."""
    for key in EXPECTED[name] if keys is None else keys:
        assert key in results, key
        value = results[key]
        if isinstance(value, float):
            assert math.isfinite(value), (key, value)


# The faults benchmark's tiny run is also the test of the faults it injects: tests/test_faults.py. The
# serving and LM decoding benchmarks run in tests/test_dag.py, on the DAG's run (its trained acoustic model).
ON_THE_DAG_RUN = {"serving", "lm_decoding"}


@pytest.mark.parametrize("name", sorted(set(EXPECTED) - {"faults", "time_to_accuracy", "targets"} - ON_THE_DAG_RUN))
def test_benchmark_runs_on_tiny_inputs(name, tmp_path, sqlite_store):
    run_tiny(name, tmp_path, sqlite_store)


def test_time_to_accuracy_curves_run_from_launch(tmp_path, sqlite_store):
    """Both arms train under horovodrun and evaluate on dev; each curve's minutes start after the
    launch and grow, the job ends after its last point, and the plot is written."""
    results = run_tiny("time_to_accuracy", tmp_path, sqlite_store)
    assert set(results["arms"]) == {"before", "after"}
    for arm in results["arms"].values():
        for run in arm["runs"]:
            minutes = [m for m, _ in run["dev_curve"]]
            assert len(minutes) >= 2 and minutes == sorted(minutes), run["dev_curve"]
            assert 0 < run["startup_minutes"] < minutes[0] <= minutes[-1] <= run["job_minutes"]
            assert all(math.isfinite(cer) and cer >= 0 for _, cer in run["dev_curve"])  # an untrained model inserts
            assert run["test_cer"] is not None and run["steps"] == 8
            for target in results["targets"]:
                assert f"minutes_to_{target:g}" in run and f"minutes_to_{target:g}" in arm
    after = results["arms"]["after"]
    assert after["seeds"] == [0, 1] and results["arms"]["before"]["seeds"] == [0]
    # The after arm's figures are its seeds' means.
    assert after["test_cer"] == pytest.approx(sum(r["test_cer"] for r in after["runs"]) / 2)
    assert after["config"] == results["arms"]["before"]["config"]
    assert (tmp_path / "time_to_accuracy.png").stat().st_size > 0


def test_targets_scores_every_arm_on_the_same_audio_through_their_lms(tmp_path, sqlite_store):
    """Chars and the phones of two lexicons (the run's own espeak-ng lexicon, and CMUdict's, whose dict,
    shards, LM and graph the benchmark builds) are scored on the same utterances and words: chars greedy
    and with the n-gram, phones greedy (PER) and through the graph, each with the settings its own tune
    chose on dev; the arm's figure is its seeds' mean, and the page's section shows every split and lexicon."""
    from benchmarks.report_recognition import targets as render

    results = run_tiny("targets", tmp_path, sqlite_store)
    arms = results["arms"]
    assert sorted(arms) == ["chars", "phones-cmudict", "phones-espeak-stressed"]
    assert results["demo_lexicon"] == "phones-cmudict"  # the DAG's default lexicon's arm
    chars, phones = arms["chars"], [arms["phones-cmudict"], arms["phones-espeak-stressed"]]
    assert results["splits"] == ["dev", "test"] and all(arm["seeds"] == [0] for arm in arms.values())
    for split in results["splits"]:
        for key in ("utterances", "words"):
            assert {arm["mean"][split][key] for arm in arms.values()} == {chars["mean"][split][key]} != {0}
        for arm in arms.values():
            keys = ("cer", "wer", "cer_lm", "wer_lm") if arm is chars else ("per", "cer_lm", "wer_lm")
            run = arm["runs"]["0"]
            assert all(math.isfinite(run["splits"][split][k]) for k in keys), run["splits"][split]
            assert arm["mean"][split] == pytest.approx(run["splits"][split])
        assert "per" not in chars["mean"][split] and all("cer" not in arm["mean"][split] for arm in phones)
    # each lexicon's own phone set and graph; the built one's stages timed
    cmudict, espeak = (arm["lexicon"] for arm in phones)
    assert cmudict["source"] == "built here" and set(cmudict["seconds"]) == {"lexicon", "shards", "lm", "graph"}
    assert espeak["source"] == "the demo run" and cmudict["phones"] == 39 != espeak["phones"]
    assert cmudict["graph"]["arcs"] > 0 and espeak["graph"]["arcs"] > 0
    # each arm's own grid (benchmarks/targets.py TINY_GRID), chosen on dev
    assert chars["runs"]["0"]["tuned"]["weight"] in (0, 0.5) and chars["runs"]["0"]["tuned"]["on"] == "dev"
    for arm in phones:
        assert arm["runs"]["0"]["tuned"]["acoustic_scale"] in (0.5, 1.0) and arm["runs"]["0"]["tuned"]["on"] == "dev"
    assert {run["source"] for arm in arms.values() for run in arm["runs"].values()} == {"trained here"}
    page = "\n".join(render(results))
    assert "| `dev` |" in page and "| `test` |" in page and "acoustic scale" in page
    assert "| `cmudict` (the demo's) | 39 |" in page and "| `espeak-stressed` |" in page


def test_targets_reuses_the_demo_runs_phone_model_only_when_the_demo_config_trained_it(tmp_path):
    """The demo run's acoustic model stands for the phones arm at its seed only when configs/demo_asr.yaml
    as it is now, with asr.targets=phones, is what it saved; a char model, or one of other settings, is
    trained again."""
    from benchmarks import targets
    from common import config as configlib
    from models.training.config import TrainConfig

    config = ROOT / "configs/demo_asr.yaml"
    workdir = tmp_path / "asr"
    (workdir / "model").mkdir(parents=True)
    (workdir / "train_summary.json").write_text("{}")
    cases = [
        (["asr.targets=phones", "seed=3"], 3),
        (["asr.targets=chars", "seed=3"], None),
        (["asr.targets=phones", "asr.units=64"], None),  # a lever, or the file edited since
    ]
    for sets, reused in cases:
        configlib.save(configlib.load(TrainConfig, config, sets), workdir / "model" / "config.yaml")
        saved = targets.trained_with(workdir, config, ["asr.targets=phones"])
        assert (saved and saved.seed) == reused, sets
    (workdir / "train_summary.json").unlink()  # a training that did not finish
    assert targets.trained_with(workdir, config, ["asr.targets=phones"]) is None


def test_tts_seeds_reuses_the_demo_runs_model_only_for_what_it_was_trained_with(tmp_path):
    """A `--set` lever the demo run did not have retrains its seed too: seed 0 is never the
    unchanged model measured as if it had the lever."""
    from benchmarks import tts_seeds
    from common import config as configlib
    from models.training.config import TrainConfig

    config = ROOT / "configs/demo_tts.yaml"
    (tmp_path / "tts").mkdir()
    configlib.save(configlib.load(TrainConfig, config, ["max_steps=40", "seed=3"]), tmp_path / "tts" / "config.yaml")
    assert tts_seeds.seed_of_run(tmp_path, config, config, []) == 3
    assert tts_seeds.seed_of_run(tmp_path, config, config, ["max_steps=40"]) == 3  # the run's own override
    assert tts_seeds.seed_of_run(tmp_path, config, config, ["tts.reduction_factor=2"]) is None  # a lever
    # a run of the file before it was edited (here: without the duration refit it sets now)
    earlier = configlib.load(TrainConfig, config, ["seed=3", "tts.duration_refit_epochs=0"])
    configlib.save(earlier, tmp_path / "tts" / "config.yaml")
    assert tts_seeds.seed_of_run(tmp_path, config, config, []) is None
    other = ROOT / "tests/configs/tiny_tts.yaml"
    assert tts_seeds.seed_of_run(tmp_path, other, config, []) is None


def test_tts_durations_gives_the_mean_of_its_models_and_keeps_each_seeds():
    """Several synthesis models (one per training seed): each arm's figure is their mean, each seed's is
    kept and shown, and models that heard other sentences are refused."""
    from benchmarks import tts_durations
    from benchmarks.report_tts import tts_durations as render

    def run(seed: int, cer: float, error: float) -> dict:
        arms = {"searched": {"cer": cer / 2, "wer": cer}, "predicted": {"cer": cer, "wer": 2 * cer}}
        durations = {
            "mean_abs_error_steps": error,
            "searched_zero_step_share": 0.2,
            "predicted_below_half_share": 0.05,
            "length_ratio": 1.0,
            "last_character_searched_steps": 7.0,
            "last_character_predicted_steps": 8.0,
        }
        source = "the demo run" if seed == 0 else "--model"
        return {
            "split": "dev",
            "utterances": 4,
            "arms": arms,
            "durations": durations,
            "training_seed": seed,
            "source": source,
        }

    combined = tts_durations.combine([run(0, 0.30, 1.0), run(1, 0.40, 2.0)])
    assert combined["arms"]["predicted"]["cer"] == pytest.approx(0.35)
    assert combined["durations"]["mean_abs_error_steps"] == pytest.approx(1.5)
    assert combined["training_seeds"] == [0, 1] and len(combined["models"]) == 2
    page = "\n".join(render({**combined, "listener_test_cer": 0.2}))
    assert "35.0% (30.0% / 40.0%)" in page and "1.50 (1.00 / 2.00)" in page
    assert "seed 0 is the demo run's own model" in page
    with pytest.raises(ValueError, match="seed 1 spoke 5 dev sentences"):
        tts_durations.combine([run(0, 0.3, 1.0), {**run(1, 0.4, 2.0), "utterances": 5}])
