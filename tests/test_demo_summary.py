"""scripts/demo_summary.py, the summary `make demo` ends with, on a run directory written here."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def write_run(tmp_path: Path) -> Path:
    """A DAG run's summary.json with a phone acoustic model (graph attached) and a synthesis model."""
    run = tmp_path / "run"
    asr, tts = run / "asr", run / "tts"
    lm = asr / "model" / "lm"
    lm.mkdir(parents=True)
    (tts / "eval").mkdir(parents=True)
    (asr / "train_summary.json").write_text(json.dumps({"steps": 600, "measured_seconds": 330.0}))
    (lm / "decoding.json").write_text(
        json.dumps({"settings": {"acoustic_scale": 0.7, "word_penalty": -1}, "chosen_on": {"split": "dev_engine"}})
    )
    (lm / "lang.json").write_text(
        json.dumps({"words": 31731, "hlg": {"states": 1860000, "arcs": 6840000, "bytes": 132e6}})
    )
    asr_metrics = {"test_per": 0.119, "test_per_beam": 0.117, "test_wer_lm": 0.143, "test_cer_lm": 0.058}
    asr_metrics |= {"test_decode_rtf_lm": 0.004, "test_lm_oov_rate": 0.046, "test_oov_rate": 0.28}
    registered = {"name": "speechflow-asr", "version": 3, "promoted": True, "reason": "first model"}
    summary = {
        "parent_run_id": "abc",
        "status": "FINISHED",
        "tracking_uri": "sqlite:///mlflow.db",
        "models": {
            "asr": {"metrics": asr_metrics, "workdir": str(asr), "registered": registered},
            "tts": {"metrics": {"dev_intelligibility_cer": 0.3}, "workdir": str(tts)},
        },
    }
    (run / "summary.json").write_text(json.dumps(summary))
    return run / "summary.json"


def test_the_demo_summary_prints_phones_through_the_graph(tmp_path):
    summary = write_run(tmp_path)
    env = {"AIRFLOW_HOME": str(tmp_path / "airflow"), "PYTHONPATH": str(ROOT)}
    args = [sys.executable, "scripts/demo_summary.py", str(summary), "754", "0", str(tmp_path), "demo.log"]
    out = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, check=True).stdout
    assert "speech_pipeline succeeded in 12 min 34 s (MLflow parent run abc, FINISHED)" in out
    assert "acoustic model   phones, trained 600 steps in 5.5 min" in out
    row = next(line.split() for line in out.splitlines() if line.split()[:1] == ["test"])
    assert row == ["test", "11.9%", "11.7%", "14.3%", "5.8%", "0.004"]
    assert "HLG graph: 31,731 words, 1,860,000 states, 6,840,000 arcs (132 MB), acoustic scale 0.7" in out
    assert "registered speechflow-asr version 3, now the champion (first model)" in out
    assert "intelligibility CER 30.0% in training voices (dev)" in out
    assert "training time n/a (no train_summary.json)" in out  # the synthesis model wrote none
    assert "run directory    run/" in out
