"""benchmarks/reference_asr.py: the real pocketsphinx (in .venv-benchmarks, which has no TensorFlow)
on a split of three flite utterances, with our figures from an evaluation's hypotheses beside it;
and its errors, which name the file and the fix."""

from __future__ import annotations

import json
import math
import subprocess

import pytest

from benchmarks import reference_asr
from pipeline import corpus_plan, synthesizers
from pipeline.corpus_plan import PlannedUtterance
from tests.conftest import PYTHON, ROOT, quiet_env

BENCH_PYTHON = ROOT / ".venv-benchmarks" / "bin" / "python"
needs_pocketsphinx = pytest.mark.skipif(
    not BENCH_PYTHON.is_file(), reason=".venv-benchmarks is absent: `make setup` builds it (CI runs make setup)"
)
# Sentences of the demo grammar that pocketsphinx's own model gets (nearly) right in these voices.
SENTENCES = {
    "flite-kal16-00001": ("kal16", "remind me to feed the cat on thursday"),
    "flite-slt-00002": ("slt", "please remind me to pay the rent at noon"),
    "flite-slt-00003": ("slt", "how long does it take to drive from lisbon to denver"),
}
# Our model's hypotheses of them (eval/test_engine_hypotheses.tsv): one word wrong in the second.
OURS = {
    "flite-kal16-00001": "remind me to feed the cat on thursday",
    "flite-slt-00002": "please remind me to pay the rant at noon",
    "flite-slt-00003": "how long does it take to drive from lisbon to denver",
}


@pytest.fixture(scope="module")
def split(tmp_path_factory):
    """A Kaldi data split `test_engine` of the three sentences, synthesized as the demo corpus is."""
    root = tmp_path_factory.mktemp("reference") / "test_engine"
    (root / "wav").mkdir(parents=True)
    tools = {name: synthesizers.tool(name) for name in ("flite", "sox")}
    rows, voices = [], []
    for utt, (voice, sentence) in SENTENCES.items():
        planned = PlannedUtterance("test_engine", utt, f"flite-{voice}", "flite", voice, 100, 0, sentence)
        synthesizers.synthesize(planned, root / "wav" / f"{utt}.wav", 16000, 60, tools)
        rows.append((utt, planned.speaker, sentence, str(root / "wav" / f"{utt}.wav")))
        voices.append(f"{utt} {planned.spec}\n")
    for name, content in corpus_plan.kaldi_files(rows).items():
        (root / name).write_text(content)
    (root / "utt2voice").write_text("".join(voices))
    return root


@pytest.fixture
def ours(tmp_path):
    """A training workdir as models.evaluate leaves it: eval.json and eval/test_engine_hypotheses.tsv."""
    (tmp_path / "eval").mkdir()
    lines = ["utt_id\treference\tgreedy\tbeam"]
    lines += [f"{utt}\t{SENTENCES[utt][1]}\t{hyp}\t{hyp}" for utt, hyp in OURS.items()]
    (tmp_path / "eval" / "test_engine_hypotheses.tsv").write_text("\n".join(lines) + "\n")
    (tmp_path / "eval.json").write_text(json.dumps({"model": "asr", "test_engine_cer": 0.5, "test_engine_wer": 0.9}))
    return tmp_path


@needs_pocketsphinx
def test_pocketsphinx_beside_ours_on_a_tiny_split(split, ours, tmp_path):
    out = tmp_path / "reference_asr.json"
    command = [str(BENCH_PYTHON), "benchmarks/reference_asr.py", "--data", str(split), "--ours", str(ours)]
    proc = subprocess.run(
        [*command, "--jobs", "2", "--json", str(out)],
        cwd=ROOT,
        env=quiet_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "CER pocketsphinx" in proc.stdout and "flite:slt" in proc.stdout, proc.stdout
    results = json.loads(out.read_text())
    assert results["recognizer"]["name"] == "pocketsphinx" and results["recognizer"]["version"] == "5.1.1"
    assert results["meta"]["machine"]["cores"] >= 1 and results["meta"]["commit"]
    r = results["splits"]["test_engine"]
    assert r["utterances"] == 3 and not r["limited"] and r["guard"] is None  # not the demo corpus
    theirs = r["pocketsphinx"]
    assert set(theirs["voices"]) == {"flite:kal16", "flite:slt"}
    assert [theirs["voices"][v]["utterances"] for v in ("flite:kal16", "flite:slt")] == [1, 2]
    for rates in (theirs["all"], *theirs["voices"].values()):
        assert all(math.isfinite(rates[k]) for k in ("cer", "wer"))
    # Clear speech of the grammar's words: a recognizer that hears it, not one that returns nothing.
    assert theirs["all"]["cer"] < 0.3 and theirs["all"]["chars"] == sum(len(s) for _, s in SENTENCES.values())
    assert r["real_time_factor"] > 0 and r["audio_s"] > 3
    # Ours from the evaluation's hypotheses of the same utterances, not eval.json's whole-split figures:
    # "rent" -> "rant" is one of the 129 characters and one of the 28 words.
    assert r["ours"]["from"] == "hypotheses"
    assert r["ours"]["all"]["cer"] == pytest.approx(1 / 129) and r["ours"]["all"]["wer"] == pytest.approx(1 / 28)
    assert r["ours"]["voices"]["flite:kal16"]["cer"] == 0


def test_a_limit_keeps_every_voice_and_ours_score_the_same_utterances(split, ours):
    limited = reference_asr.read_split(split, limit=2)
    assert [e.utt_id for e in limited.entries] == ["flite-kal16-00001", "flite-slt-00002"] and limited.total == 3
    figures = reference_asr.ours_on(limited, reference_asr.read_ours(ours, ["test_engine"]), ["flite-slt-00002"])
    assert figures["all"]["utterances"] == 1 and figures["all"]["wer"] == pytest.approx(1 / 9)


def test_ours_from_a_run_summary_or_metrics_alone(split, ours, tmp_path):
    summary = tmp_path / "run" / "summary.json"
    summary.parent.mkdir()
    tts = {"metrics": {"dev_intelligibility_cer": 0.3}, "workdir": str(tmp_path / "tts")}
    asr = {"metrics": {"test_engine_cer": 0.5, "test_engine_wer": 0.9}, "workdir": str(ours)}
    summary.write_text(json.dumps({"models": {"tts": tts, "asr": asr}}))
    found = reference_asr.read_ours(summary.parent, ["test_engine"])
    assert found.eval_dir == ours / "eval"
    (ours / "eval" / "test_engine_hypotheses.tsv").unlink()  # metrics only: the split's figures as evaluated
    figures = reference_asr.ours_on(reference_asr.read_split(split), found, sorted(SENTENCES))
    assert figures == {"from": "metrics", "all": {"cer": 0.5, "wer": 0.9, "utterances": None}, "voices": {}}
    with pytest.raises(ValueError, match="holds no CER of test"):
        reference_asr.read_ours(summary, ["test"])


def test_ours_of_another_corpus_is_refused(split, ours):
    table = ours / "eval" / "test_engine_hypotheses.tsv"
    table.write_text(table.read_text().replace("lisbon", "oslo", 1))
    with pytest.raises(ValueError, match="other references than .*text"):
        reference_asr.ours_on(
            reference_asr.read_split(split), reference_asr.read_ours(ours, ["test_engine"]), sorted(OURS)
        )


def test_errors_name_the_file_and_the_fix(split, tmp_path):
    broken = tmp_path / "test"
    broken.mkdir()
    for name in ("wav.scp", "utt2spk"):
        (broken / name).write_text((split / name).read_text())
    with pytest.raises(FileNotFoundError, match=r"test/text is missing: --data names a Kaldi data split"):
        reference_asr.read_split(broken)
    (broken / "text").write_text((split / "text").read_text())
    (broken / "wav.scp").write_text((split / "wav.scp").read_text().replace("00002.wav", "00002-gone.wav"))
    with pytest.raises(FileNotFoundError, match=r"audio of 1 utterance.*flite-slt-00002.*python -m pipeline.corpus"):
        reference_asr.read_split(broken)
    with pytest.raises(FileNotFoundError, match="neither eval.json .* nor summary.json"):
        reference_asr.read_ours(tmp_path, ["test"])


def test_without_pocketsphinx_it_says_which_environment_has_it(split):
    # .venv, the training environment, never has pocketsphinx
    proc = subprocess.run(
        [PYTHON, "benchmarks/reference_asr.py", "--data", str(split)],
        cwd=ROOT,
        env=quiet_env(),
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2 and "`make setup` builds .venv-benchmarks" in proc.stderr, proc.stderr


def test_the_reused_modules_get_the_versions_they_train_with():
    """requirements/benchmarks.in pins what the project's modules need at train.lock's versions, and
    both lock files agree on them."""
    pins = {}
    for name in ("benchmarks.in", "benchmarks.lock", "train.lock"):
        lines = (ROOT / "requirements" / name).read_text().splitlines()
        pins[name] = dict(line.split("#")[0].strip().lower().split("==") for line in lines if "==" in line)
    reused = {k: v for k, v in pins["benchmarks.in"].items() if k != "pocketsphinx"}
    assert reused and pins["benchmarks.in"]["pocketsphinx"] == "5.1.1"
    assert reused == {k: pins["train.lock"][k] for k in reused} == {k: pins["benchmarks.lock"][k] for k in reused}


@needs_pocketsphinx
def test_an_utterance_is_heard_alike_whatever_came_before_it(split):
    """pocketsphinx carries its cepstral mean from one utterance to the next; the benchmark resets
    it, so a pool's figures do not depend on which worker decoded what before."""
    script = f"""
import soundfile
from benchmarks import reference_asr
pcm = {{u: soundfile.read(f"{split}/wav/{{u}}.wav", dtype="int16")[0].tobytes() for u in {sorted(SENTENCES)}}}
def heard(u):
    h = reference_asr.recognize(pcm[u])
    return (h.hypstr, h.score)
first = {{u: heard(u) for u in pcm}}
again = {{u: heard(u) for u in reversed(pcm)}}
assert first == again, (first, again)
"""
    proc = subprocess.run([str(BENCH_PYTHON), "-c", script], cwd=ROOT, env=quiet_env(), capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-4000:]
