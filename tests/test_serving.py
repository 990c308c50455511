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
import subprocess
import types
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import soundfile

from common import config as configlib
from common.ports import reserve_port
from models import trained_model
from models.asr import network as asr
from models.asr.task import AsrTask
from models.serving import mlflow_serve, request_policy
from models.serving import pyfunc as serving
from models.serving.request_policy import RequestError, ServingConfig
from models.training import checkpoint
from models.training.config import TrainConfig
from models.tts import network as tts
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
    tiny_tts = configlib.load(TrainConfig, CONFIGS / "tiny_tts.yaml").settings
    tts_settings = dataclasses.replace(
        tiny_tts, vocab_size=len(VOCABULARY), n_mels=80, speakers=tuple(voices), **tts_fields
    )
    config = TrainConfig(
        model=model, settings=small_asr if model == "asr" else tts_settings, input=dataset.InputConfig(cmvn=cmvn)
    )
    built = asr.build_asr(config.settings) if model == "asr" else tts.build_tts(config.settings)
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


def served(path: Path, **settings) -> serving.SpeechModel:
    """The pyfunc model as MLflow loads it (its context holds the model directory), with the
    operator's `settings` (ServingConfig fields) in place of the environment's."""
    model = serving.SpeechModel()
    model.load_context(types.SimpleNamespace(artifacts={"model_dir": str(path)}))
    model.settings = ServingConfig(**settings)
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
    model, config, data = trained_model.load_model_dir(model_path)
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


def test_serving_builds_the_input_pipelines_batch_from_the_same_audio(wav_shards):
    """One function makes the acoustic batch (pipeline/frontend.py `acoustic_batch`): the training
    input pipeline's from the shards, the served model's from the WAVs the shards were made of
    (models/asr/inference.py `served_batch`). Same keys, same lengths and flags, and, normalized by
    the training step's own `AsrTask.features`, the same features."""
    from models.asr import inference

    root, wavs = wav_shards
    shard_set = records.open_shard_set(root / "shards")
    mean, std = dataset.mel_stats(shard_set)  # what training writes into data.json
    data = {"feature_dim": 80, "mel_mean": mean.tolist(), "mel_std": std.tolist()}
    settings, feature_cfg = ServingConfig(audio_dir=str(root)), features.FeatureConfig(jobs=1)
    labels = {"tokens", "token_lengths", "utt_id", "speaker"}  # training's alone: what the model learns from
    for cmvn in ("utterance", "global", "none"):
        checked = 0
        for batch in dataset.asr_dataset(shard_set, "train", dataset.InputConfig(cmvn=cmvn), training=False)[0]:
            ids = [u.decode() for u in batch["utt_id"].numpy()]
            audio = [request_policy.audio_features(wavs[u], None, feature_cfg, settings) for u in ids]
            served = inference.served_batch(audio, cmvn, data)
            assert set(served) == set(batch) - labels
            for key in ("feat_lengths", "utterance_cmvn"):
                np.testing.assert_array_equal(served[key], batch[key].numpy(), err_msg=f"{cmvn}: {key}")
            want, got = AsrTask.features(batch).numpy(), AsrTask.features(served).numpy()  # [B, T, 80]
            assert want[:, got.shape[1] :].max(initial=0) == 0  # the class's padding is zeros
            np.testing.assert_allclose(got, want[:, : got.shape[1]], atol=1e-4, err_msg=cmvn)
            checked += len(ids)
        assert checked == 6
    assert inference.served_batch(audio, "speaker", data)["utterance_cmvn"].all()  # no speaker statistics


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
    model = served(path, audio_dir=str(root))
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
    model, config, data = trained_model.load_model_dir(model_path)
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
    got = request_policy.audio_features(base64.b64encode(stereo.read_bytes()).decode(), None, cfg)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(
        request_policy.audio_features(str(stereo), None, cfg, ServingConfig(audio_dir=str(tmp_path))), want
    )


def _wav_base64(seconds: float, rate: int = 16000, subtype: str = "PCM_16", fmt: str = "WAV") -> str:
    buffer = io.BytesIO()
    soundfile.write(buffer, tone(seconds, rate, 300, seed=1), rate, subtype=subtype, format=fmt)
    return base64.b64encode(buffer.getvalue()).decode()


_SECOND = [0.0] * 16000
# (the request's rows, what the refusal says): every row names itself and its fault
MALFORMED = {
    "not base64": (
        [{"audio": "no/such/file.wav"}],
        r"row 0: `audio` is not base64 file bytes \(this server reads no file",
    ),
    "empty": ([{"audio": ""}], "row 0: `audio` is empty"),
    "not audio": ([{"audio": base64.b64encode(b"RIFF....WAVEjunk").decode()}], "row 0: unusable audio"),
    "a number": ([{"audio": 3.5}], "row 0: `audio` must be base64 file bytes, a file path or a waveform"),
    "no rate": ([{"audio": _SECOND}], "row 0: a waveform needs its `sample_rate`"),
    "text rate": ([{"audio": _SECOND, "sample_rate": "fast"}], "row 0: `sample_rate` must be a number of Hz"),
    "odd rate": (
        [{"audio": _SECOND, "sample_rate": 16000.5}],
        r"row 0: `sample_rate` must be a whole number of Hz in \[4000",
    ),
    "NaN": ([{"audio": [float("nan")] * 800, "sample_rate": 16000}], "row 0: a waveform's samples must be finite"),
    "loud": (
        [{"audio": [3.0] * 800, "sample_rate": 16000}],
        r"row 0: a waveform's samples must be finite numbers in \[-1, 1\]",
    ),
    "mixed": ([{"audio": [0.0, "x"] * 400, "sample_rate": 16000}], "row 0: a waveform is one list of numbers"),
    "nested": ([{"audio": [[0.0] * 800] * 2, "sample_rate": 16000}], "row 0: a waveform is one list of samples"),
    "short": ([{"audio": [0.0] * 160, "sample_rate": 16000}], "row 0: 0.010 s of audio give no frame"),
    "second row": ([{"audio": _SECOND, "sample_rate": 16000}, {"audio": "%%"}], "row 1: `audio` is not base64"),
    "list item": ([{"audio": [_wav_base64(0.5), "%%"]}], "row 0 item 1: `audio` is not base64"),
    "too long": (
        [{"audio": [0.0] * 16000 * 31, "sample_rate": 16000}],
        r"row 0: 31.0 s of audio, over this server's limit of 30 s",
    ),
    "too long file": (
        [{"audio": _wav_base64(31, rate=8000, fmt="FLAC", subtype="PCM_16")}],
        "row 0: 31.0 s of audio, over",
    ),
}


@pytest.mark.parametrize("rows, message", MALFORMED.values(), ids=MALFORMED.keys())
def test_malformed_rows_are_refused_with_the_row_and_the_fault(asr_model, rows, message):
    with pytest.raises(RequestError, match=message) as refused:
        asr_model.predict(None, pd.DataFrame(rows))
    assert refused.value.get_http_status_code() == 400  # what MLflow's scoring server answers


@pytest.fixture(scope="module")
def asr_model(tmp_path_factory):
    return served(model_dir(tmp_path_factory.mktemp("asr") / "model", "asr"))


def test_the_limits_on_a_request_are_the_operators(asr_model, tmp_path, monkeypatch):
    model = asr_model
    rows = pd.DataFrame([{"audio": _SECOND, "sample_rate": 16000}] * 3)
    assert len(model.predict(None, rows)) == 3
    model.settings = ServingConfig(max_rows=2)
    with pytest.raises(RequestError, match="3 rows, over this server's limit of 2 per request"):
        model.predict(None, rows)
    model.settings = ServingConfig(max_request_seconds=2.5)
    with pytest.raises(RequestError, match="row 2: the request holds over 2.5 s of audio"):
        model.predict(None, rows)
    model.settings = ServingConfig(max_audio_bytes=100)
    with pytest.raises(RequestError, match="row 0: `audio` is .* characters, over this server's limit of 100"):
        model.predict(None, pd.DataFrame([{"audio": _wav_base64(0.5)}]))
    model.settings = ServingConfig()
    with pytest.raises(RequestError, match=r"param `beam_width` must be a whole number in \[0, 256\]"):
        model.predict(None, rows, {"beam_width": -1})
    env = {"SPEECHFLOW_SERVE_MAX_ROWS": "4", "SPEECHFLOW_SERVE_MAX_SECONDS": "2.5", "OTHER": "x"}
    assert ServingConfig.from_env(env) == ServingConfig(max_rows=4, max_seconds=2.5)
    with pytest.raises(ValueError, match="SPEECHFLOW_SERVE_MAX_ROWS='many' is not a number"):
        ServingConfig.from_env({"SPEECHFLOW_SERVE_MAX_ROWS": "many"})
    with pytest.raises(ValueError, match="SPEECHFLOW_SERVE_MAX_SECONDS='0': a limit must be positive"):
        ServingConfig.from_env({"SPEECHFLOW_SERVE_MAX_SECONDS": "0"})
    with pytest.raises(ValueError, match="SPEECHFLOW_SERVE_AUDIO_DIR='/no/such/dir' is not a directory"):
        ServingConfig.from_env({"SPEECHFLOW_SERVE_AUDIO_DIR": "/no/such/dir"})
    monkeypatch.setenv("SPEECHFLOW_SERVE_MAX_ROWS", "1")  # what `mlflow models serve` passes on
    loaded = serving.SpeechModel()
    loaded.load_context(types.SimpleNamespace(artifacts={"model_dir": str(model_dir(tmp_path / "m", "asr"))}))
    assert loaded.settings == ServingConfig(max_rows=1)


def test_files_are_read_only_inside_the_directory_the_operator_allowed(asr_model, tmp_path):
    allowed, outside = tmp_path / "allowed", tmp_path / "outside"
    (allowed / "sub").mkdir(parents=True)
    outside.mkdir()
    soundfile.write(allowed / "sub" / "a.wav", tone(0.5, 16000, 300, seed=1), 16000, subtype="PCM_16")
    soundfile.write(outside / "b.wav", tone(0.5, 16000, 300, seed=2), 16000, subtype="PCM_16")
    (allowed / "link.wav").symlink_to(outside / "b.wav")
    (allowed / "dirlink").symlink_to(outside)
    model = asr_model
    inside = allowed / "sub" / "a.wav"
    rows = lambda *names: pd.DataFrame({"audio": list(names)})  # noqa: E731

    model.settings = ServingConfig()  # the default: no file is read, not even one of the model's
    with pytest.raises(RequestError, match="row 0: `audio` is not base64 file bytes .this server reads no file"):
        model.predict(None, rows(str(inside)))

    model.settings = ServingConfig(audio_dir=str(allowed))
    want = model.predict(None, rows(_wav_base64(0.5)))  # the same samples as the file
    assert model.predict(None, rows(str(inside))) == want
    assert model.predict(None, rows("sub/a.wav")) == want  # relative to the directory
    assert model.predict(None, rows(str(allowed / "sub" / ".." / "sub" / "a.wav"))) == want
    for escape in [
        str(outside / "b.wav"),
        "../outside/b.wav",
        str(allowed / ".." / "outside" / "b.wav"),
        "link.wav",  # a symlink out of the directory
        "dirlink/b.wav",
        "/etc/passwd",
    ]:
        with pytest.raises(RequestError, match="row 0: `audio` names .*, which is outside the directory"):
            model.predict(None, rows(escape))
    with pytest.raises(RequestError, match=f"row 0: `audio` is not base64 file bytes nor a file in {allowed}"):
        model.predict(None, rows("sub/missing.wav"))
    model.settings = ServingConfig()


def test_a_model_of_kaldi_features_refuses_audio(tmp_path):
    served(model_dir(tmp_path / "model", "asr"))
    data = json.loads((tmp_path / "model" / "data.json").read_text())
    (tmp_path / "model" / "data.json").write_text(json.dumps({**data, "features": None}))
    with pytest.raises(ValueError, match="training features were made by Kaldi"):
        served(tmp_path / "model").predict(None, pd.DataFrame({"audio": [[0.0] * 800], "sample_rate": [16000]}))


def test_a_speaker_cmvn_model_is_served_with_a_warning(tmp_path):
    with pytest.warns(UserWarning, match="per-speaker CMVN"):
        served(model_dir(tmp_path / "model", "asr", cmvn="speaker"))


def test_the_synthesis_model_returns_wav_audio_of_its_mels(tmp_path):
    from models.tts import audio

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
def test_mlflow_serves_the_champion_with_the_transcripts_of_evaluation(tmp_path, sqlite_store):
    """Corpus (espeak-ng voices), fbank, float32 shards, a tiny model trained with per-utterance
    CMVN, evaluation, registration; then `mlflow models serve -m models:/NAME@champion` answers
    WAV files posted as paths and as base64, and waveforms, with evaluation's hypotheses."""
    env = quiet_env(MLFLOW_TRACKING_URI=sqlite_store)
    data, shard_dir, workdir = tmp_path / "data", tmp_path / "shards", tmp_path / "asr"
    _run([PYTHON, "-m", "pipeline.corpus", "--out", str(data), "--num-utterances", "60", "--jobs", "2"], env, ROOT)
    for split in ("train", "test"):
        _run([PYTHON, "-m", "pipeline.features", "--data-dir", str(data / split), "--no-progress"], env, ROOT)
    split_args = ["--split", f"train={data / 'train'}", "--split", f"test={data / 'test'}"]
    # float32 storage: evaluation reads exactly the fbank that serving computes from the audio
    _run(
        [
            PYTHON,
            "-m",
            "pipeline.shards",
            *split_args,
            "--out",
            str(shard_dir),
            "--set",
            "feature_dtype=float32",
            "--no-progress",
        ],
        env,
        ROOT,
    )
    # A dozen steps: the tiny model still writes letters (by 60 it writes only spaces), so that
    # every character of a transcript tells whether serving computed what evaluation did.
    train = ["--config", str(CONFIGS / "tiny_asr.yaml"), "--max-steps", "12", "--set", "input.cmvn=utterance"]
    _run([PYTHON, "-m", "models.train", "--shards", str(shard_dir), "--workdir", str(workdir), *train], env, ROOT)
    _run(
        [PYTHON, "-m", "models.evaluate", "--model", str(workdir), "--shards", str(shard_dir), "--split", "test"],
        env,
        ROOT,
    )
    _run([PYTHON, "-m", "models.registry", "register", "--workdir", str(workdir), "--name", "served-asr"], env, ROOT)
    rows = (workdir / "eval" / "test_hypotheses.tsv").read_text(encoding="utf-8").splitlines()[1:]
    hypotheses = {r.split("\t")[0]: r.split("\t") for r in rows}
    wavs = kaldi.read_table(data / "test" / "wav.scp").values
    ids = sorted(hypotheses)
    assert len(ids) >= 4 and set(ids) <= set(wavs)
    assert sum(any(c.isalpha() for c in hypotheses[u][2]) for u in ids) >= 3, "too few letters to compare"

    command = mlflow_serve.serve_command("models:/served-asr@champion", reserve_port())
    settings = {"SPEECHFLOW_SERVE_AUDIO_DIR": str(data)}  # the corpus's WAVs may be named by path
    with mlflow_serve.ModelServer(
        command, mlflow_serve.serve_env(env, **settings), tmp_path, tmp_path / "serve.log"
    ) as server:
        url = f"{server.url}/invocations"
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


@pytest.fixture(scope="module")
def http_model(tmp_path_factory):
    """A tiny acoustic model logged to MLflow and served by `mlflow models serve`, with a directory
    of one WAV allowed and a 4-s limit per utterance (so random requests stay cheap)."""
    root = tmp_path_factory.mktemp("http")
    (root / "allowed").mkdir()
    soundfile.write(root / "allowed" / "a.wav", tone(0.5, 16000, 300, seed=1), 16000, subtype="PCM_16")
    uri, store = mlflow_serve.log_to_new_store(model_dir(root / "model", "asr"), root)
    settings = {"SPEECHFLOW_SERVE_AUDIO_DIR": str(root / "allowed"), "SPEECHFLOW_SERVE_MAX_SECONDS": "4"}
    env = mlflow_serve.serve_env(quiet_env(MLFLOW_TRACKING_URI=store), **settings)
    with mlflow_serve.ModelServer(
        mlflow_serve.serve_command(uri, reserve_port()), env, root, root / "serve.log"
    ) as server:
        yield server, root


def _post_raw(url: str, body: bytes) -> tuple[int, str]:
    request = urllib.request.Request(url, body, headers={"Content-Type": "application/json"}, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode(errors="replace")


@pytest.mark.slow
def test_the_served_model_refuses_bad_rows_with_400_and_reads_no_file_outside(http_model):
    server, root = http_model
    url = f"{server.url}/invocations"
    ok = _post(url, {"dataframe_records": [{"audio": "a.wav"}, {"audio": _wav_base64(0.5)}]})["predictions"]
    assert ok[0] == ok[1] and ok[0].strip()
    for audio, message in [
        ("/etc/passwd", "row 0: `audio` names '/etc/passwd', which is outside the directory"),
        ("../model/data.json", "outside the directory"),
        ("", "row 0: `audio` is empty"),
        ("%%", "row 0: `audio` is not base64"),
    ]:
        status, body = _post_raw(url, json.dumps({"dataframe_records": [{"audio": audio}]}).encode())
        assert status == 400 and message in json.loads(body)["message"], body
    nan = json.dumps({"dataframe_records": [{"audio": [float("nan")] * 800, "sample_rate": 16000}]})
    status, body = _post_raw(url, nan.encode())
    assert status == 400 and "samples must be finite" in body, body
    status, body = _post_raw(
        url, json.dumps({"dataframe_records": [{"audio": [0.0] * 16000 * 120, "sample_rate": 16000}]}).encode()
    )
    assert status == 400 and "120.0 s of audio, over this server's limit of 4 s" in body, body[:2000]


@pytest.mark.slow
def test_random_requests_get_no_server_error_and_the_server_keeps_serving(http_model):
    """Property: whatever rows a client posts, the answer is 200 or a 400 that names the fault, never a
    5xx or MLflow's generic message, and the server stays up."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    server, _ = http_model
    url = f"{server.url}/invocations"
    wav = base64.b64decode(_wav_base64(0.3))
    audio = st.one_of(
        st.text(max_size=40),
        st.sampled_from(["a.wav", "/etc/passwd", "../model/data.json", "data:audio/wav;base64,", "/", "."]),
        st.binary(max_size=200).map(lambda b: base64.b64encode(b).decode()),
        st.integers(0, len(wav)).map(lambda n: base64.b64encode(wav[:n]).decode()),  # truncated WAVs
        st.tuples(st.integers(0, len(wav) - 1), st.integers(0, 255)).map(  # a WAV with one byte changed
            lambda c: base64.b64encode(wav[: c[0]] + bytes([c[1]]) + wav[c[0] + 1 :]).decode()
        ),
        st.lists(st.floats(width=32), max_size=6000),
        st.lists(st.one_of(st.floats(-1, 1), st.integers(), st.text(max_size=2), st.none()), max_size=50),
        st.lists(st.text(max_size=10), min_size=1, max_size=3),
        st.integers(),
        st.floats(),
        st.booleans(),
        st.none(),
        st.dictionaries(st.text(max_size=5), st.integers(), max_size=2),
    )
    rate = st.one_of(st.none(), st.sampled_from([8000, 16000, 22050]), st.integers(), st.floats(), st.text(max_size=5))
    row = st.fixed_dictionaries({"audio": audio}, optional={"sample_rate": rate})
    params = st.one_of(st.none(), st.fixed_dictionaries({"beam_width": st.one_of(st.integers(), st.text(max_size=3))}))

    @settings(max_examples=80, deadline=None, database=None, derandomize=True, suppress_health_check=list(HealthCheck))
    @given(rows=st.lists(row, min_size=1, max_size=3), params=params)
    def property(rows, params):
        request = {"dataframe_records": rows, **({"params": params} if params else {})}
        status, body = _post_raw(url, json.dumps(request).encode())
        seen.add(status)
        assert status in (200, 400), f"HTTP {status} for {json.dumps(request)[:500]}: {body[:1000]}"
        assert "unexpected error" not in body, f"{json.dumps(request)[:500]}: {body[:1000]}"

    good = {"dataframe_records": [{"audio": "a.wav"}]}
    before = _post(url, good)["predictions"]
    seen = set()
    property()
    assert 400 in seen, f"no example was refused: {seen}"
    assert server.alive() and _post(url, good)["predictions"] == before  # and it still transcribes


def test_registered_models_find_the_pyfunc_class_by_its_import_path():
    """MLflow pickles a logged model's python_model by its class's import path: every registered model
    names `models.serving.pyfunc.SpeechModel`, so the class must stay at that path."""
    import pickle

    from models.serving import pyfunc

    assert pickle.loads(b"cmodels.serving.pyfunc\nSpeechModel\n.") is pyfunc.SpeechModel
    assert b"models.serving.pyfunc" in pickle.dumps(pyfunc.SpeechModel())
