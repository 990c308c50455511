"""The phone recipe end to end on the committed lexicons (tests/fixtures, written by hand): a Kaldi dict
dir (lexiconp.txt, a word with two pronunciations, `<UNK> SPN`) and a Kaldi lang dir (position-dependent
phones) go through the shard stage, training, the graph stage, tuning with --attach, and evaluation,
each by its real command line; the evaluation's words are the lexicon's."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import ROOT, quiet_env
from tests.kaldi_fixtures import make_feats_dir, write_table

FIXTURES = ROOT / "tests" / "fixtures"
SENTENCES = ["the cat sat on the mat", "a cat", "the mat sat on a cat", "on the mat", "a mat sat"]


def cli(*args: str, env: dict) -> str:
    proc = subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, (
        f"{' '.join(args)} exited {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    )
    return proc.stdout


def data_dir(root, name, seed):
    path, _, texts = make_feats_dir(root / name, num_utts=16, dim=13, seed=seed)
    write_table(path / "text", {utt: SENTENCES[i % len(SENTENCES)] for i, utt in enumerate(sorted(texts))})
    return path


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["dict", "lang"])
def test_a_committed_lexicon_goes_through_shards_training_graph_and_decoding(tmp_path, kind):
    env = quiet_env(MLFLOW_TRACKING_URI=f"sqlite:///{tmp_path / 'mlflow.db'}")
    source = FIXTURES / ("dict_tiny" if kind == "dict" else "lang_tiny")
    splits = [f"--split={s}={data_dir(tmp_path, s, i)}" for i, s in enumerate(("train", "dev", "dev_engine"))]
    shards, model, lang = tmp_path / "shards", tmp_path / "asr", tmp_path / "lang"
    cli(
        "-m",
        "pipeline.shards",
        *splits,
        "--out",
        str(shards),
        "--num-shards",
        "2",
        f"--phones-from={source}",
        "--no-progress",
        env=env,
    )
    cli(
        "-m",
        "models.train",
        "--config",
        str(ROOT / "tests/configs/tiny_asr.yaml"),
        "--shards",
        str(shards),
        "--workdir",
        str(model),
        "--max-steps",
        "4",
        "--set",
        "asr.targets=phones",
        "--set",
        "log_model=false",
        env=env,
    )
    data = json.loads((model / "model" / "data.json").read_text())
    manifest = json.loads((shards / "manifest.json").read_text())
    assert data["targets"] == "phones" and data["outputs"] == manifest["phone_vocabulary"]
    assert manifest["phones"]["kind"] == kind and data["outputs"][0] == "<blk>"
    flag = "--dict" if kind == "dict" else "--lang"
    cli("-m", "pipeline.lang", flag, str(source), "--arpa", str(FIXTURES / "lm_tiny.arpa"), "--out", str(lang), env=env)
    out = cli(
        "-m",
        "models.tune_lm",
        "--model",
        str(model),
        "--shards",
        str(shards),
        "--lm",
        str(lang),
        "--attach",
        "--acoustic-scales",
        "0.5,1",
        "--word-penalties",
        "0",
        "--no-progress",
        env=env,
    )
    assert "chosen on dev_engine" in out and (model / "model" / "lm" / "HLG.fst").is_file()
    cli(
        "-m",
        "models.evaluate",
        "--model",
        str(model),
        "--shards",
        str(shards),
        "--split",
        "dev",
        "--no-mlflow",
        env=env,
    )
    metrics = json.loads((model / "eval.json").read_text())
    metrics = metrics.get("metrics", metrics)
    said = [SENTENCES[i % len(SENTENCES)] for i in range(16)]
    assert metrics["primary_metric"] == "dev_wer_lm" and metrics["dev_words"] == sum(len(s.split()) for s in said)
    assert {"dev_per", "dev_per_beam", "dev_cer_lm", "dev_decode_rtf_lm"} <= set(metrics)
    rows = (model / "eval" / "dev_hypotheses.tsv").read_text().splitlines()
    header, words = rows[0].split("\t"), {w for s in SENTENCES for w in s.split()}
    decoded = [row.split("\t")[header.index("words")] for row in rows[1:]]
    assert len(decoded) == 16 and all(set(d.split()) <= words for d in decoded)
