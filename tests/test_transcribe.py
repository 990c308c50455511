"""Batch inference from the command line: `models.transcribe` against `models.evaluate`, its CTM, and
`models.synthesize`."""

from __future__ import annotations

import base64
import csv
import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import soundfile

from models import evaluate, trained_model, transcribe
from models.asr import alignment
from models.asr import transcribe as asr_transcribe
from models.tts import synthesize as tts_synthesize
from pipeline import features, kaldi, shards
from tests.kaldi_fixtures import make_wav_dir
from tests.test_serving import model_dir


@pytest.fixture(scope="module")
def decoded(tmp_path_factory):
    """Six utterances of two speakers (22.05 kHz WAVs) through the feature and shard stages (float32),
    an untrained acoustic model with per-speaker CMVN, its evaluation, and the transcription of the
    same data directory."""
    root = tmp_path_factory.mktemp("transcribe")
    data = make_wav_dir(root / "test", num_utts=6, rate=22050, seconds=0.6)
    features.compute_features(data, features.FeatureConfig(jobs=1), progress=False)
    model = model_dir(root / "work" / "model", "asr", cmvn="speaker")
    cfg = shards.ShardConfig(num_shards=1, jobs=1, feature_dtype="float32", vocabulary_from=str(model))
    shards.make_shards({"test": data}, root / "shards", cfg, progress=False)
    evaluate.evaluate(
        root / "work", root / "shards", evaluate.eval_config("asr", assignments=["splits=[test]", "beam_width=4"])
    )
    with open(root / "work" / "eval" / "test_hypotheses.tsv") as f:
        rows = list(csv.DictReader(f, delimiter="\t"))
    evaluated = {r["utt_id"]: r["greedy"] for r in rows}
    assert (
        transcribe.main(
            [
                "--model",
                str(root / "work" / "model"),
                "--data-dir",
                str(data),
                "--out",
                str(root / "out"),
                "--no-progress",
            ]
        )
        == 0
    )
    return root, data, evaluated


def test_transcripts_of_a_data_dir_are_the_evaluations_hypotheses(decoded):
    root, _, evaluated = decoded
    text = dict(line.split(" ", 1) for line in (root / "out" / "text").read_text().splitlines())
    assert len(evaluated) == 6 and all(h.strip() for h in evaluated.values()), "untrained: non-empty garbage"
    assert text == evaluated


def test_the_evaluation_scores_each_speaker_of_the_data_dir_apart(decoded):
    from models.asr.scoring import error_rates

    root, data, _ = decoded
    utt2spk = kaldi.read_table(data / "utt2spk").values
    with open(root / "work" / "eval" / "test_hypotheses.tsv") as f:
        rows = list(csv.DictReader(f, delimiter="\t"))
    with open(root / "work" / "eval" / "test_speakers.tsv") as f:
        table = list(csv.DictReader(f, delimiter="\t"))
    assert sorted(r["speaker"] for r in table) == sorted(set(utt2spk.values())) and len(table) == 2
    for entry in table:  # each speaker's rates are those of its own utterances (the data dir's utt2spk)
        own = [r for r in rows if utt2spk[r["utt_id"]] == entry["speaker"]]
        rates = error_rates([r["reference"] for r in own], [r["greedy"] for r in own])
        assert int(entry["utterances"]) == len(own) and int(entry["chars"]) == rates["chars"]
        assert float(entry["cer"]) == pytest.approx(rates["cer"], abs=1e-4)
        assert float(entry["wer"]) == pytest.approx(rates["wer"], abs=1e-4)
    assert [float(e["cer"]) for e in table] == sorted((float(e["cer"]) for e in table), reverse=True)


def test_ctm_words_are_the_transcripts_in_order_within_each_utterance(decoded):
    root, data, _ = decoded
    text = dict(line.split(" ", 1) for line in (root / "out" / "text").read_text().splitlines())
    wavs = kaldi.read_table(data / "wav.scp").values
    ctm: dict[str, list] = {}
    for line in (root / "out" / "ctm").read_text().splitlines():
        utt, channel, start, duration, word = line.split(" ")
        assert channel == "1"
        ctm.setdefault(utt, []).append((float(start), float(duration), word))
    for utt, hypothesis in text.items():
        words = ctm.get(utt, [])
        assert [w for _, _, w in words] == hypothesis.split()
        seconds = soundfile.info(wavs[utt]).duration
        ends = 0.0
        for start, duration, _ in words:
            assert duration > 0 and start >= ends - 1e-6 and start + duration <= seconds + 0.05, (utt, words)
            ends = start + duration


def test_audio_files_and_beam_search_from_the_command_line(decoded, tmp_path):
    root, data, evaluated = decoded
    wavs = kaldi.read_table(data / "wav.scp").values
    first = sorted(wavs)[:2]
    files = [str(wavs[u]) for u in first]
    (tmp_path / "broken.wav").write_bytes(b"RIFF not audio")
    out = tmp_path / "out"
    args = ["--model", str(root / "work" / "model"), *files, str(tmp_path / "broken.wav"), "--out", str(out)]
    assert transcribe.main([*args, "--beam-width", "4", "--no-progress"]) == 0
    text = dict(line.split(" ", 1) for line in (out / "text").read_text().splitlines())
    assert sorted(text) == first  # each file its own speaker: per-speaker CMVN of its own frames
    rejected = (out / "rejected.tsv").read_text()
    assert "broken" in rejected, "the unreadable file is listed with its reason"


def test_every_command_names_a_model_in_the_same_three_forms(decoded, tmp_path):
    from models import registry

    root, data, evaluated = decoded
    work, model = root / "work", root / "work" / "model"
    assert trained_model.locate(work) == trained_model.ModelSource(str(work), model_dir=model, workdir=work)
    assert trained_model.locate(model) == trained_model.ModelSource(str(model), model_dir=model, workdir=work)
    assert trained_model.locate("models:/m@champion").uri == "models:/m@champion"
    with pytest.raises(FileNotFoundError, match="training workdir .* its model directory .* registry URI"):
        trained_model.locate(root / "shards")
    # transcribe: the workdir as the model/ it holds
    assert transcribe.main(["--model", str(work), "--data-dir", str(data), "--out", str(tmp_path / "t")]) == 0
    text = dict(line.split(" ", 1) for line in (tmp_path / "t" / "text").read_text().splitlines())
    assert text == evaluated
    # evaluate: the model/ form, its output elsewhere; the same figures as the workdir's evaluation
    args = ["--model", str(model), "--shards", str(root / "shards"), "--split", "test", "--no-mlflow"]
    assert evaluate.main([*args, "--beam-width", "4", "--out-dir", str(tmp_path / "e")]) == 0
    ours = json.loads((tmp_path / "e" / "eval.json").read_text())
    theirs = json.loads((work / "eval.json").read_text())
    assert ours["test_cer"] == theirs["test_cer"] and (tmp_path / "e" / "eval" / "test_hypotheses.tsv").is_file()
    assert evaluate.output_dir(model) == work
    with pytest.raises(ValueError, match="--out-dir"):
        evaluate.output_dir("models:/m@champion")
    # registry: registers a training, named by its workdir or its model/
    assert registry._training_workdir(model) == work and registry._training_workdir(work) == work
    with pytest.raises(ValueError, match="in the registry already"):
        registry._training_workdir("models:/m@champion")


def test_ctc_forced_alignment_is_the_best_path_of_the_labels():
    import itertools

    rng = np.random.default_rng(0)
    log_probs = np.log(rng.dirichlet(np.ones(5), size=7))  # [T=7, V=5]
    labels = [2, 2, 3]  # a repeat: a blank must stand between its two
    path = alignment.ctc_forced_alignment(log_probs, labels)
    tokens = [0 if i < 0 else labels[i] for i in path]

    def collapse(seq):
        return [t for k, t in enumerate(seq) if t != 0 and (k == 0 or seq[k - 1] != t)]

    def score(seq):
        return sum(log_probs[t, tok] for t, tok in enumerate(seq))

    assert collapse(tokens) == labels
    best = max(score(seq) for seq in itertools.product([0, 2, 3], repeat=7) if collapse(list(seq)) == labels)
    assert score(tokens) == pytest.approx(best)
    words = alignment.word_times("ab c", np.asarray([-1, 0, 0, 1, -1, -1, 2, 3, -1, -1, -1, -1]), 0.04)
    assert [w for w, _, _ in words] == ["ab", "c"]
    assert words[0][1] == pytest.approx(0.04) and words[0][2] == pytest.approx(0.12)


def test_synthesize_writes_one_wav_per_sentence(tmp_path):
    path = model_dir(tmp_path / "tts", "tts", voices=("a", "b"))
    sentences = tmp_path / "sentences.txt"
    sentences.write_text("the cat sat\n\na dog\nhello there\n", encoding="utf-8")
    cfg = tts_synthesize.SynthesizeConfig(voice="b", max_steps=20, griffin_lim_iters=2, progress=False)
    rows = tts_synthesize.synthesize(str(path), sentences, tmp_path / "wavs", cfg)
    assert [r["line"] for r in rows] == [1, 3, 4] and all(r["voice"] == "b" for r in rows)
    for row in rows:
        info = soundfile.info(tmp_path / "wavs" / row["file"])
        assert info.samplerate == 16000 and info.frames > 0
    with open(tmp_path / "wavs" / "index.tsv") as f:
        listed = list(csv.DictReader(f, delimiter="\t"))
    assert [r["text"] for r in listed] == ["the cat sat", "a dog", "hello there"]
    with pytest.raises(ValueError, match="voice 'c'"):
        tts_synthesize.synthesize(str(path), sentences, tmp_path / "x", dataclasses.replace(cfg, voice="c"))


@pytest.mark.slow  # logging a pyfunc model into a registry: about 20 s
def test_a_registered_champion_is_opened_by_its_uri(decoded, tmp_path, sqlite_store, monkeypatch):
    import mlflow

    from models.serving import pyfunc as serving

    root, data, evaluated = decoded
    monkeypatch.setenv("MLFLOW_TRACKING_URI", sqlite_store)
    mlflow.set_tracking_uri(sqlite_store)
    try:
        _, config, info = trained_model.load_model_dir(root / "work" / "model")
        experiment = mlflow.create_experiment("transcribe", artifact_location=(tmp_path / "artifacts").as_uri())
        with mlflow.start_run(experiment_id=experiment):
            logged = serving.log_model(root / "work" / "model", config, info)
        version = mlflow.register_model(logged.model_uri, "tiny-asr")
        mlflow.MlflowClient().set_registered_model_alias("tiny-asr", "champion", version.version)
        cfg = asr_transcribe.TranscribeConfig(progress=False)
        asr_transcribe.transcribe("models:/tiny-asr@champion", tmp_path / "out", cfg, data_dir=data)
        uri_eval = evaluate.evaluate(
            "models:/tiny-asr@champion",
            root / "shards",
            evaluate.eval_config("asr", assignments=["splits=[test]", "beam_width=4"]),
            out_dir=tmp_path / "uri-eval",
        )
    finally:
        mlflow.set_tracking_uri(None)
    text = dict(line.split(" ", 1) for line in (tmp_path / "out" / "text").read_text().splitlines())
    assert text == evaluated
    assert uri_eval["test_cer"] == json.loads((root / "work" / "eval.json").read_text())["test_cer"]
    with pytest.raises(ValueError, match="models:/missing@champion"):
        trained_model.open_model("models:/missing@champion")


def test_evaluate_and_transcribe_decode_with_a_word_lm_of_the_transcripts(decoded, tmp_path):
    """`--lm DIR` (pipeline/lm.py's LM of the data's own transcripts): the evaluation reports beam
    search with it beside greedy and beam, with the LM's coverage of the split; transcription uses it."""
    from pipeline import lm as lmstage

    root, data, _ = decoded
    model = root / "work" / "model"
    assert lmstage.main(["--data", str(data), "--vocabulary-from", str(model), "--out", str(tmp_path / "lm")]) == 0
    args = ["--model", str(model), "--shards", str(root / "shards"), "--split", "test", "--no-mlflow"]
    assert evaluate.main([*args, "--lm", str(tmp_path / "lm"), "--out-dir", str(tmp_path / "e")]) == 0
    metrics = json.loads((tmp_path / "e" / "eval.json").read_text())
    assert {"test_cer_lm", "test_wer_lm", "test_word_sub_lm", "lm_weight", "lm_order"} <= set(metrics)
    assert metrics["test_lm_oov_rate"] == 0.0, "the LM's text is the split's transcripts"
    assert "beam_lm" in (tmp_path / "e" / "eval" / "test_hypotheses.tsv").read_text().splitlines()[0]
    assert "with the word LM" in (tmp_path / "e" / "eval" / "test_wer.txt").read_text()
    out = tmp_path / "t"
    assert (
        transcribe.main(
            ["--model", str(model), "--data-dir", str(data), "--out", str(out), "--lm", str(tmp_path / "lm")]
        )
        == 0
    )
    text = dict(line.split(" ", 1) for line in (out / "text").read_text().splitlines())
    ctm_words = [line.split()[4] for line in (out / "ctm").read_text().splitlines()]
    assert len(text) == 6 and ctm_words == [w for u in sorted(text) for w in text[u].split()]
    missing = ["--model", str(model), "--data-dir", str(data), "--out", str(out), "--lm", str(tmp_path / "x")]
    assert transcribe.main(missing) == 1, "a missing LM is an error, never a silent greedy decoding"


@pytest.mark.slow  # logging a pyfunc model twice into a registry: about 40 s
def test_an_attached_lm_travels_with_the_registered_model_and_decodes_everywhere(
    decoded, tmp_path, sqlite_store, monkeypatch
):
    """An LM attached to a trained model (models/asr/lm.py `attach`) is logged again with it at
    registration, tagged on the version; the registered model decodes with it when opened by its URI
    (evaluation, transcription, the served model) unless told not to."""
    import shutil

    import mlflow

    from models import registry
    from models.asr import lm
    from models.serving import pyfunc as serving
    from models.tracking import runs as tracking
    from pipeline import lm as lmstage

    root, data, evaluated = decoded
    work = tmp_path / "work"
    shutil.copytree(root / "work", work)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", sqlite_store)
    mlflow.set_tracking_uri(sqlite_store)
    try:
        _, config, info = trained_model.load_model_dir(work / "model")
        experiment = mlflow.create_experiment("lm", artifact_location=(tmp_path / "artifacts").as_uri())
        with mlflow.start_run(experiment_id=experiment) as run:  # what training logs at its end
            serving.log_model(work / "model", config, info)
        tracking.save_run_file(work, run.info.run_id, "lm")
        assert lmstage.main(["--data", str(data), "--vocabulary-from", str(work), "--out", str(tmp_path / "lm")]) == 0
        lm.write_decoding(tmp_path / "lm", lm.LmDecoding(weight=0.5, word_bonus=1.0), {"split": "dev"})
        lm.attach(tmp_path / "lm", work / "model")
        registered = registry.register(work, "tiny-asr-lm")
        again = registry.register(work, "tiny-asr-lm")
        version = mlflow.MlflowClient().get_model_version("tiny-asr-lm", str(registered["version"]))
        uri = "models:/tiny-asr-lm@champion"
        _, _, served = trained_model.open_model(uri)
        server = mlflow.pyfunc.load_model(uri).unwrap_python_model().server
        wav = Path(kaldi.read_table(data / "wav.scp").values[sorted(evaluated)[0]])
        request = [{"audio": base64.b64encode(wav.read_bytes()).decode()}]
        calls = []
        decode = server.lm.decode
        server.lm.decode = lambda log_probs: calls.append(len(log_probs)) or decode(log_probs)
        with_lm = server.predict(request, {}, server_settings())
        without = server.predict(request, {"lm": False}, server_settings())
        greedy = server.predict(request, {"lm": False, "beam_width": 0}, server_settings())
        uri_eval = evaluate.evaluate(
            uri, root / "shards", evaluate.eval_config("asr", assignments=["splits=[test]"]), out_dir=tmp_path / "e"
        )
        out = tmp_path / "t"
        assert transcribe.main(["--model", uri, "--data-dir", str(data), "--out", str(out), "--no-lm"]) == 0
    finally:
        mlflow.set_tracking_uri(None)
    assert again["version"] == registered["version"], "registering again logs and registers nothing new"
    assert version.tags["speechflow.lm.order"] == "3" and version.tags["speechflow.lm.weight"] == "0.5"
    assert (
        version.tags["speechflow.lm.text_sha256"]
        == json.loads((tmp_path / "lm" / "lm.json").read_text())["text"]["sha256"]
    )
    assert served.get(lm.DATA_KEY) and server.lm is not None
    assert calls == [1] and len(with_lm) == 1, "the served model decodes with its LM unless the request says lm: false"
    assert without == greedy
    assert "test_wer_lm" in uri_eval and uri_eval["lm_weight"] == 0.5
    text = dict(line.split(" ", 1) for line in (out / "text").read_text().splitlines())
    assert text == evaluated, "--no-lm: the model decodes as without one"


def server_settings():
    from models.serving.request_policy import ServingConfig

    return ServingConfig()
