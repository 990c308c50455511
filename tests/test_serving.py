"""Serving without skew: the pyfunc models take audio (or text) and compute what training computed.

Fast: per-utterance CMVN in the training step; the served acoustic model's transcripts of WAV files
equal the model applied to the training input pipeline's features of the same files; audio as
paths, base64 and waveforms; the synthesis model's WAV. Slow: the README's stages on a tiny real
corpus, then `mlflow models serve` of the registered champion answers posted WAVs with the
transcripts `models.evaluate` wrote.
"""

from __future__ import annotations

import base64
import dataclasses
import io
import json
import os
import signal
import socket
import subprocess
import time
import types
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import soundfile

from common import config as configlib
from models import asr, checkpoint, serving, tts
from models.tasks import AsrTask
from models.train_config import TrainConfig
from pipeline import dataset, features, frontend, kaldi, records, shards, text
from tests.conftest import CONFIGS, PYTHON, ROOT, quiet_env
from tests.kaldi_fixtures import make_wav_dir, tone

VOCABULARY = text.build_vocabulary(["the quick brown fox jumps over a lazy dog's back"])


def model_dir(path: Path, model: str, cmvn: str = "utterance", mel_stats=(0.0, 1.0), voices=(), **tts_fields) -> Path:
    """An untrained model's directory as the trainer leaves it (random weights transcribe as
    non-empty garbage, which makes every character count in a comparison)."""
    import keras

    keras.utils.set_random_seed(7)
    small_asr = asr.AsrConfig(
        feature_dim=80, vocab_size=len(VOCABULARY), num_layers=1, units=16, projection=0, stack_frames=2, subsample=1
    )
    tiny_tts = configlib.load(TrainConfig, CONFIGS / "tiny_tts.yaml").tts
    config = TrainConfig(
        model=model,
        asr=small_asr,
        tts=dataclasses.replace(tiny_tts, vocab_size=len(VOCABULARY), n_mels=80, speakers=tuple(voices), **tts_fields),
        input=dataset.InputConfig(cmvn=cmvn),
    )
    built = asr.build_asr(config.asr) if model == "asr" else tts.build_tts(config.tts)
    checkpoint.save(path, 1, built.weights, [], {"final": True}, 1, (built.name,))
    configlib.save(config, path / "config.yaml")
    mean, std = mel_stats
    data = {
        "model": model,
        "vocabulary": VOCABULARY,
        "lowercase": True,
        "feature_dim": 80,
        "mel_mean": [mean] * 80,
        "mel_std": [std] * 80,
        "features": configlib.to_dict(features.FeatureConfig(jobs=1)),
        "voices": list(voices),
    }
    (path / "data.json").write_text(json.dumps(data))
    return path


def served(path: Path) -> serving.SpeechModel:
    """The pyfunc model as MLflow loads it (its context holds the model directory)."""
    model = serving.SpeechModel()
    model.load_context(types.SimpleNamespace(artifacts={"model_dir": str(path)}))
    return model


# ---- the normalization --------------------------------------------------------------------------


def test_utterance_cmvn_uses_each_utterances_own_real_frames_whatever_the_padding():
    rng = np.random.default_rng(0)
    lengths = np.asarray([7, 12, 3], np.int32)
    feats = (rng.normal(size=[3, 12, 5]) * np.asarray([1, 3, 10])[:, None, None] + 15).astype(
        np.float32
    )  # log-mel sits near 15
    scale = np.full([3, 5], 2.0, np.float32)
    offset = np.full([3, 5], -1.0, np.float32)
    flags = np.asarray([True, True, False])
    out = frontend.normalize(feats, scale, offset, lengths, flags).numpy()
    for i, n in enumerate(lengths):
        x = feats[i, :n] * 2.0 - 1.0
        want = (x - x.mean(0)) / x.std(0) if flags[i] else x
        np.testing.assert_allclose(out[i, :n], want, rtol=1e-4, atol=1e-4)
        assert not out[i, n:].any(), "padding stays zero"
    longer = np.pad(feats, [[0, 0], [0, 30], [0, 0]])  # more padding changes nothing
    np.testing.assert_allclose(
        frontend.normalize(longer, scale, offset, lengths, flags).numpy()[:, :12], out, atol=1e-5
    )
    unflagged = frontend.normalize(feats, scale, offset, lengths).numpy()  # the speaker-CMVN path as it was
    np.testing.assert_array_equal(unflagged[2], out[2])


@pytest.fixture(scope="module")
def wav_shards(tmp_path_factory):
    """Real WAVs (22.05 kHz, so serving resamples as the feature stage does) through the feature and
    shard stages, stored as float32: the training input pipeline's view of the same audio."""
    root = tmp_path_factory.mktemp("serving")
    data = make_wav_dir(root / "train", num_utts=6, rate=22050, seconds=0.6)
    features.compute_features(data, features.FeatureConfig(jobs=1), progress=False)
    cfg = shards.ShardConfig(num_shards=1, jobs=1, feature_dtype="float32")
    shards.make_shards({"train": data}, root / "shards", cfg, progress=False)
    wavs = kaldi.read_table(data / "wav.scp").values
    return root, wavs


def pipeline_transcripts(model_path: Path, shard_dir: Path, cmvn: str) -> dict[str, str]:
    """What evaluation computes: the input pipeline's batches, `AsrTask.features`, greedy decoding."""
    model, config, data = serving.load_model_dir(model_path)
    cfg = dataclasses.replace(config.input, cmvn=cmvn)
    out = {}
    for batch in dataset.asr_dataset(records.open_shard_set(shard_dir), "train", cfg, training=False)[0]:
        hyps = asr.transcribe(model, AsrTask.features(batch), batch["feat_lengths"], data["vocabulary"])
        out.update({u.decode(): h for u, h in zip(batch["utt_id"].numpy(), hyps)})
    return out


def test_the_input_pipeline_flags_utterance_cmvn_and_the_step_applies_it(wav_shards):
    root, _ = wav_shards
    shard_set = records.open_shard_set(root / "shards")
    cfg = dataset.InputConfig(cmvn="utterance")
    stored = {utt: feats for utt, feats, _ in records.read_utterances(shard_set, "train")}
    seen = 0
    for batch in dataset.asr_dataset(shard_set, "train", cfg, training=False)[0]:
        assert batch["utterance_cmvn"].numpy().all()
        normalized = AsrTask.features(batch).numpy()
        for i, utt in enumerate(batch["utt_id"].numpy()):
            x = stored[utt.decode()]
            n = len(x)
            # float32 in the step: log-mel near 15 over a narrow band's small deviation loses a few digits
            np.testing.assert_allclose(normalized[i, :n], (x - x.mean(0)) / x.std(0), atol=1e-3)
            seen += 1
    assert seen == 6
    speaker = dataset.asr_dataset(shard_set, "train", dataclasses.replace(cfg, cmvn="speaker"), training=False)
    assert not next(iter(speaker[0]))["utterance_cmvn"].numpy().any()


@pytest.mark.parametrize("cmvn", ["utterance", "global", "none"])
def test_served_transcripts_of_audio_are_the_models_on_the_training_features(wav_shards, tmp_path, cmvn):
    root, wavs = wav_shards
    # global: the training split's statistics, which data.json holds and serving uses
    mean, std = dataset.mel_stats(records.open_shard_set(root / "shards"))
    path = model_dir(tmp_path / "model", "asr", cmvn)
    data = json.loads((path / "data.json").read_text())
    (path / "data.json").write_text(json.dumps({**data, "mel_mean": mean.tolist(), "mel_std": std.tolist()}))
    want = pipeline_transcripts(path, root / "shards", cmvn)
    ids = sorted(wavs)
    assert all(want[u].strip() for u in ids), "an untrained model's transcripts are non-empty garbage"
    model = served(path)
    by_path = model.predict(None, pd.DataFrame({"audio": [wavs[u] for u in ids]}))
    assert by_path == [want[u] for u in ids]
    if cmvn != "utterance":
        return
    encoded = [base64.b64encode(Path(wavs[u]).read_bytes()).decode() for u in ids[:2]]
    wave, rate = soundfile.read(wavs[ids[2]], dtype="float32")
    mixed = pd.DataFrame(
        [
            {"audio": encoded[0]},
            {"audio": wave.tolist(), "sample_rate": rate},
            {"audio": f"data:audio/wav;base64,{encoded[1]}"},
        ]
    )
    assert model.predict(None, mixed) == [want[ids[0]], want[ids[2]], want[ids[1]]]
    assert model.predict(None, {"audio": [wavs[u] for u in ids[:3]]}) == [want[u] for u in ids[:3]]
    beam = model.predict(None, pd.DataFrame({"audio": [wavs[ids[0]]]}), params={"beam_width": 4})
    assert beam == asr_beam(path, root / "shards", ids[0])


def asr_beam(model_path: Path, shard_dir: Path, utt: str) -> list[str]:
    model, config, data = serving.load_model_dir(model_path)
    for batch in dataset.asr_dataset(records.open_shard_set(shard_dir), "train", config.input, training=False)[0]:
        ids = [u.decode() for u in batch["utt_id"].numpy()]
        if utt in ids:
            hyps = asr.transcribe(model, AsrTask.features(batch), batch["feat_lengths"], data["vocabulary"], 4)
            return [hyps[ids.index(utt)]]
    raise AssertionError(f"{utt} is not in the shards")


def test_stereo_and_other_rates_are_read_as_the_feature_stage_reads_them(tmp_path):
    stereo = tmp_path / "stereo.flac"
    soundfile.write(stereo, tone(0.7, 8000, 300, channels=2, seed=3), 8000, subtype="PCM_16")
    cfg = features.FeatureConfig(jobs=1)
    rate, samples = kaldi.read_audio(str(stereo), allow_pipes=False)
    want = features.compute_fbank(features.prepare_waveform(rate, samples, None, cfg), cfg)
    got = serving.audio_features(base64.b64encode(stereo.read_bytes()).decode(), None, cfg)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(serving.audio_features(str(stereo), None, cfg), want)


def test_unusable_requests_are_refused_with_the_reason(tmp_path):
    model = served(model_dir(tmp_path / "model", "asr"))
    with pytest.raises(ValueError, match="utterance 0: .*neither a file on the serving machine nor base64"):
        model.predict(None, pd.DataFrame({"audio": ["no/such/file.wav"]}))
    with pytest.raises(ValueError, match="utterance 0: a waveform needs its `sample_rate`"):
        model.predict(None, pd.DataFrame({"audio": [[0.0] * 800]}))
    with pytest.raises(ValueError, match="a waveform is one list of samples"):
        model.predict(None, {"audio": [[0.0] * 800, [0.0] * 800], "sample_rate": 16000})
    with pytest.raises(ValueError, match="utterance 0: 0.010 s of audio give no frame"):
        model.predict(None, pd.DataFrame({"audio": [[0.0] * 160], "sample_rate": [16000]}))
    with pytest.raises(ValueError, match="unusable audio"):
        model.predict(None, pd.DataFrame({"audio": [base64.b64encode(b"RIFF....WAVEjunk").decode()]}))
    data = json.loads((tmp_path / "model" / "data.json").read_text())
    (tmp_path / "model" / "data.json").write_text(json.dumps({**data, "features": None}))
    with pytest.raises(ValueError, match="training features were made by Kaldi"):
        served(tmp_path / "model").predict(None, pd.DataFrame({"audio": [[0.0] * 800], "sample_rate": [16000]}))


def test_a_speaker_cmvn_model_is_served_with_a_warning(tmp_path):
    with pytest.warns(UserWarning, match="per-speaker CMVN"):
        served(model_dir(tmp_path / "model", "asr", cmvn="speaker"))


def test_the_synthesis_model_returns_wav_audio_of_its_mels(tmp_path):
    from models import audio

    model = served(model_dir(tmp_path / "model", "tts", mel_stats=(12.0, 2.0)))
    out = model.predict(None, pd.DataFrame({"text": ["the dog", "a quick brown fox"]}), {"max_steps": 6})
    assert out["mels"].shape[0] == 2 and out["mels"].shape[2] == 80 and out["sample_rate"] == 16000
    for i, encoded in enumerate(out["audio"]):
        wave, rate = soundfile.read(io.BytesIO(base64.b64decode(encoded)), dtype="float32")
        n = int(out["lengths"][i])
        assert rate == audio.SAMPLE_RATE and len(wave) == (n - 1) * audio.FRAME_SHIFT + audio.FRAME_LENGTH
        assert np.abs(wave).max() > 0.5  # scaled to 0.9 of full scale
        assert not out["mels"][i, n:].any() and out["mels"][i, :n].mean() > 5  # de-normalized log-mel
    quiet = model.predict(None, {"text": ["the dog"]}, {"max_steps": 6, "griffin_lim_iters": 0})
    assert quiet["audio"] == [""]
    with pytest.raises(ValueError, match="voice 'alice' is not one this model was trained on; it has one voice"):
        model.predict(None, pd.DataFrame({"text": ["the dog"], "voice": ["alice"]}))
    assert (
        len(model.predict(None, pd.DataFrame({"text": ["the dog"], "voice": [None]}), {"max_steps": 2})["audio"]) == 1
    )


# the tiny config's attention model, and the demo's kind: durations with the convolutional decoder
@pytest.mark.parametrize(
    "alignment", [{}, {"alignment": "durations", "durations_decoder": "conv"}], ids=["attention", "durations"]
)
def test_the_synthesis_model_speaks_in_the_voice_asked_for(tmp_path, alignment):
    model = served(model_dir(tmp_path / "model", "tts", mel_stats=(12.0, 2.0), voices=("anna", "ben"), **alignment))
    request = pd.DataFrame({"text": ["the dog", ["a fox", "a cat"], "the dog"], "voice": ["anna", "ben", None]})
    out = model.predict(None, request, {"max_steps": 6, "griffin_lim_iters": 0})
    assert out["voices"] == ["anna", "ben", "ben", "anna"]  # a row's list of sentences shares its voice
    # The same sentence in two voices: the speaker embedding changes the spectrum (random weights).
    same = model.predict(None, pd.DataFrame({"text": ["the dog"] * 2, "voice": ["anna", "ben"]}), {"max_steps": 6})
    n = int(min(same["lengths"]))
    assert np.abs(same["mels"][0, :n] - same["mels"][1, :n]).mean() > 1e-3
    with pytest.raises(ValueError, match="it has these voices: anna, ben"):
        model.predict(None, pd.DataFrame({"text": ["the dog"], "voice": ["carl"]}))


# ---- the served champion over HTTP --------------------------------------------------------------


def _run(args: list[str], env: dict, cwd: Path, timeout: float = 300) -> str:
    proc = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{' '.join(args)}\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    return proc.stdout


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _post(url: str, body: dict) -> dict:
    request = urllib.request.Request(
        url, json.dumps(body).encode(), headers={"Content-Type": "application/json"}, method="POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as err:
        raise AssertionError(f"{url}: HTTP {err.code}: {err.read()[:3000]!r}") from err


@pytest.mark.slow
def test_mlflow_serves_the_champion_with_the_transcripts_of_evaluation(tmp_path):
    """Corpus (espeak-ng voices), fbank, float32 shards, a tiny model trained with per-utterance
    CMVN, evaluation, registration; then `mlflow models serve -m models:/NAME@champion` answers
    WAV files posted as paths and as base64, and waveforms, with evaluation's hypotheses."""
    env = quiet_env(MLFLOW_TRACKING_URI=f"sqlite:///{tmp_path / 'mlflow.db'}")
    env["PATH"] = f"{Path(PYTHON).parent}{os.pathsep}{env['PATH']}"  # uvicorn, which mlflow serve runs
    data, shard_dir, workdir = tmp_path / "data", tmp_path / "shards", tmp_path / "asr"
    _run([PYTHON, "-m", "pipeline.corpus", "--out", str(data), "--num-utterances", "60", "--jobs", "2"], env, ROOT)
    for split in ("train", "test"):
        _run([PYTHON, "-m", "pipeline.features", "--data-dir", str(data / split), "--no-progress"], env, ROOT)
    split_args = ["--split", f"train={data / 'train'}", "--split", f"test={data / 'test'}"]
    # float32 storage: evaluation reads exactly the fbank that serving computes from the audio
    _run([PYTHON, "-m", "pipeline.shards", *split_args, "--out", str(shard_dir), "--set", "feature_dtype=float32",
          "--no-progress"], env, ROOT)  # fmt: skip
    # A dozen steps: the tiny model still writes letters (by 60 it writes only spaces), so that
    # every character of a transcript tells whether serving computed what evaluation did.
    train = ["--config", str(CONFIGS / "tiny_asr.yaml"), "--max-steps", "12", "--set", "input.cmvn=utterance"]
    _run([PYTHON, "-m", "models.train", "--shards", str(shard_dir), "--workdir", str(workdir), *train], env, ROOT)
    _run([PYTHON, "-m", "models.evaluate", "--model-dir", str(workdir), "--shards", str(shard_dir), "--split", "test"],
         env, ROOT)  # fmt: skip
    _run([PYTHON, "-m", "models.registry", "register", "--workdir", str(workdir), "--name", "served-asr"], env, ROOT)
    rows = (workdir / "eval" / "test_hypotheses.tsv").read_text(encoding="utf-8").splitlines()[1:]
    hypotheses = {r.split("\t")[0]: r.split("\t") for r in rows}
    wavs = kaldi.read_table(data / "test" / "wav.scp").values
    ids = sorted(hypotheses)
    assert len(ids) >= 4 and set(ids) <= set(wavs)
    assert sum(any(c.isalpha() for c in hypotheses[u][2]) for u in ids) >= 3, "too few letters to compare"

    port = _free_port()
    serve = [str(Path(PYTHON).with_name("mlflow")), "models", "serve", "-m", "models:/served-asr@champion",
             "--env-manager", "local", "-h", "127.0.0.1", "-p", str(port), "-w", "1"]  # fmt: skip
    log = (tmp_path / "serve.log").open("w")
    server = subprocess.Popen(
        serve, cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    try:
        deadline = time.time() + 120
        while True:
            assert server.poll() is None, (tmp_path / "serve.log").read_text()[-5000:]
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/ping", timeout=5) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            assert time.time() < deadline, (tmp_path / "serve.log").read_text()[-5000:]
            time.sleep(0.5)
        url = f"http://127.0.0.1:{port}/invocations"
        greedy = [hypotheses[u][2] for u in ids]
        by_path = _post(url, {"dataframe_records": [{"audio": wavs[u]} for u in ids]})["predictions"]
        assert by_path == greedy
        encoded = [base64.b64encode(Path(wavs[u]).read_bytes()).decode() for u in ids]
        split = {"columns": ["audio"], "data": [[e] for e in encoded]}
        assert _post(url, {"dataframe_split": split})["predictions"] == greedy
        wave, rate = soundfile.read(wavs[ids[0]], dtype="float32")
        mixed = [{"audio": wave.tolist(), "sample_rate": rate}, {"audio": encoded[1]}]
        assert _post(url, {"dataframe_records": mixed})["predictions"] == greedy[:2]
        beam = _post(url, {"dataframe_records": [{"audio": e} for e in encoded], "params": {"beam_width": 16}})
        assert beam["predictions"] == [hypotheses[u][3] for u in ids]
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()
        log.close()
