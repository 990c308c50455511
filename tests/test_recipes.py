"""Kaldi recipe data directories in: decoder commands read without a shell, segments to the end of
their recording, channels kept apart, read-only corpora, a new test set with a trained model's
vocabulary, failures that stay failures on retry, and the by-hand steps of the README and of
docs/data.md as written."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import kaldiio
import numpy as np
import pytest
import soundfile

from pipeline import audio_io, features, kaldi, records, shards, split_validation, text
from pipeline.audio_io import Source
from tests.conftest import ROOT, quiet_env, shard_set
from tests.kaldi_fixtures import make_feats_dir, make_recipe_dirs, make_wav_dir, tone, write_table
from workflow import commands
from workflow.plan import Plan, make_plan

CFG = features.FeatureConfig(jobs=1)


def feats_of(data_dir: Path) -> dict[str, np.ndarray]:
    return {utt: np.asarray(m) for utt, m in kaldiio.load_scp(str(Path(data_dir) / "feats.scp")).items()}


def snapshot(root: Path) -> dict[str, tuple[int, int]]:
    return {str(p): (p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(Path(root).rglob("*"))}


def decoys(tmp_path: Path, names=("flac", "sph2pipe", "sox", "ffmpeg")) -> tuple[dict[str, str], Path]:
    """Programs of the decoders' names that only leave a trace: (environment with them first on PATH, trace)."""
    bin_dir, trace = tmp_path / "decoys", tmp_path / "a-decoder-ran"
    bin_dir.mkdir()
    for name in names:
        (bin_dir / name).write_text(f"#!/bin/sh\necho {name} >> {trace}\nexit 1\n")
        (bin_dir / name).chmod(0o755)
    return quiet_env(PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}"), trace


def run_features(*args: str, env=None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pipeline.features", *args, "--no-progress"],
        cwd=ROOT,
        env=env or quiet_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )


def rejected(data_dir: Path) -> dict[str, kaldi.Rejection]:
    return {r.utt_id: r for _, r in kaldi.read_rejections(Path(data_dir) / features.REJECTED)}


# ---- the decoder commands ------------------------------------------------------------------------


def test_recipe_dirs_give_the_features_of_the_same_audio_as_plain_files(tmp_path):
    recipe, plain = make_recipe_dirs(tmp_path / "corpus")
    env, trace = decoys(tmp_path)
    before = snapshot(tmp_path / "corpus")
    out = tmp_path / "feats" / "recipe"
    proc = run_features("--data-dir", str(recipe), "--out-dir", str(out), env=env)
    assert proc.returncode == 0, proc.stderr
    assert "rejected=0" in proc.stdout
    assert not trace.exists(), f"a decoder ran: {trace.read_text()}"
    assert snapshot(tmp_path / "corpus") == before, "the corpus was written to"

    features.compute_features(plain, CFG, progress=False)
    got, want = feats_of(out), feats_of(plain)
    # flac x3, two SPHERE conversations (PCM and u-law) x 3 segments, sox to 16 kHz x2.
    assert sorted(got) == sorted(want) and len(want) == 11
    for utt in want:
        np.testing.assert_allclose(got[utt], want[utt], atol=1e-5, err_msg=utt)
    # Segments that end at -1 run to the end: 1.25 s to 3 s at a 10 ms shift with 25 ms windows.
    assert got["sw1-A-0001"].shape == (173, 80) and got["sw1-B-0000"].shape == (258, 80)
    # The two sides of a conversation are different signals, so keeping them apart is visible.
    assert np.abs(got["sw1-A-0001"][:100] - got["sw1-B-0000"][85:185]).mean() > 1.0  # the same 1.25-2.25 s
    # The output directory is a data directory of its own.
    for table in ("text", "utt2spk", "spk2utt", "wav.scp", "segments"):
        assert (out / table).read_text() == (recipe / table).read_text(), table
    lengths = {u: int(n) for u, n in kaldi.read_table(out / "utt2num_frames").values.items()}
    assert lengths == {u: len(m) for u, m in got.items()}


@pytest.mark.skipif(shutil.which("sox") is None, reason="sox is not installed")
def test_in_process_reading_agrees_with_a_real_decoder(tmp_path):
    """sox itself (run through a shell, as --allow-pipes does) decodes what we read in-process: the
    same samples of the channel sph2pipe -c names, and nearly the same features after resampling
    (sox's resampler is not ours)."""
    recipe, _ = make_recipe_dirs(tmp_path / "corpus")
    real = tmp_path / "real"
    shutil.copytree(recipe, real)
    wav = kaldi.read_table(recipe / "wav.scp").values
    # `vol 1.0` (no change) makes the commands ones we do not recognize, so a shell runs them; -b 16
    # -e signed-integer: sox would otherwise write the u-law bytes of sw2, which kaldiio reads as numbers.
    to_pcm = "-t wav -b 16 -e signed-integer"
    runs = {
        "sw1-A": f"sox -t sph {recipe.parent / 'audio' / 'sw1.sph'} {to_pcm} - remix 1 vol 1.0 |",
        "sw1-B": f"sox -t sph {recipe.parent / 'audio' / 'sw1.sph'} {to_pcm} - remix 2 vol 1.0 |",
        "sw2-B": f"sox -t sph {recipe.parent / 'audio' / 'sw2.sph'} {to_pcm} - remix 2 vol 1.0 |",
        "sx1-utt": wav["sx1-utt"].replace(" - |", " - vol 1.0 |"),
    }
    write_table(real / "wav.scp", {**wav, **runs})
    features.compute_features(recipe, CFG, progress=False)
    features.compute_features(real, dataclasses.replace(CFG, allow_pipes=True), progress=False)
    ours, theirs = feats_of(recipe), feats_of(real)
    for utt in ("sw1-A-0000", "sw1-A-0001", "sw1-B-0000", "sw2-B-0000"):
        np.testing.assert_array_equal(ours[utt], theirs[utt], err_msg=utt)
    assert np.median(np.abs(ours["sx1-utt"] - theirs["sx1-utt"])) < 0.05
    # Without -b 16, sox writes sw2's u-law codes, which must not pass for samples.
    write_table(real / "wav.scp", {**wav, "sw2-B": runs["sw2-B"].replace(f"{to_pcm} -", "-t wav -")})
    features.compute_features(real, dataclasses.replace(CFG, allow_pipes=True, max_rejected_fraction=1), progress=False)
    assert rejected(real)["sw2-B-0000"].reason == "unsupported_audio"


def test_channels_named_by_segments_or_reco2file_and_channel_are_kept_apart(tmp_path):
    conv = tmp_path / "conv.wav"
    stereo = np.stack([tone(1.5, 16000, 300, seed=1), tone(1.5, 16000, 2100, seed=2)], axis=1)
    soundfile.write(conv, stereo, 16000, subtype="PCM_16")
    decoded, _ = soundfile.read(conv, dtype="int16")
    sides = tmp_path / "sides"
    sides.mkdir()
    for k, side in enumerate("AB"):
        soundfile.write(sides / f"{side}.wav", decoded[:, k], 16000, subtype="PCM_16")
    write_table(sides / "wav.scp", {f"c-{s}": str(sides / f"{s}.wav") for s in "AB"})
    write_table(sides / "utt2spk", {"c-A": "c", "c-B": "c"})
    by_reco = tmp_path / "reco"  # one two-channel file, each side a recording
    by_reco.mkdir()
    write_table(by_reco / "wav.scp", {"c-A": str(conv), "c-B": str(conv)})
    write_table(by_reco / "reco2file_and_channel", {"c-A": "conv A", "c-B": "conv B"})
    write_table(by_reco / "utt2spk", {"c-A": "c", "c-B": "c"})
    by_segment = tmp_path / "seg"  # Kaldi's extract-segments: a fifth field names the channel
    by_segment.mkdir()
    write_table(by_segment / "wav.scp", {"conv": str(conv)})
    write_table(by_segment / "segments", {"c-A": "conv 0 -1 0", "c-B": "conv 0 -1 1", "c-C": "conv 0 -1 2"})
    write_table(by_segment / "utt2spk", {"c-A": "c", "c-B": "c", "c-C": "c"})
    strict = dataclasses.replace(CFG, downmix=False, max_rejected_fraction=1.0)
    for directory in (sides, by_reco, by_segment):
        features.compute_features(directory, strict, progress=False)
    want = feats_of(sides)
    assert feats_of(by_reco).keys() == want.keys() and feats_of(by_segment).keys() == want.keys()
    for utt in want:
        np.testing.assert_array_equal(feats_of(by_reco)[utt], want[utt])
        np.testing.assert_array_equal(feats_of(by_segment)[utt], want[utt])
    assert rejected(by_segment)["c-C"].reason == "unsupported_audio"


@pytest.mark.parametrize(
    ("spec", "source"),
    [
        ("flac -c -d -s a.flac |", Source(Path("a.flac"), program="flac")),
        ("flac --decode --stdout --silent 'my file.flac' |", Source(Path("my file.flac"), program="flac")),
        ("sph2pipe -f wav -p -c 2 a.sph |", Source(Path("a.sph"), channel=1, program="sph2pipe")),
        ("/k/tools/sph2pipe_v2.5/sph2pipe -f wav -p a.sph |", Source(Path("a.sph"), program="sph2pipe")),
        ("sph2pipe -fwav -c1 a.sph|", Source(Path("a.sph"), channel=0, program="sph2pipe")),
        ("sox a.wav -t wav -r 16000 - |", Source(Path("a.wav"), rate=16000, program="sox")),
        ("sox -t wav a.wav -t wav -r 8k -c 1 -b 16 - |", Source(Path("a.wav"), mix=True, rate=8000, program="sox")),
        ("sox a.wav -t wav - rate -v 16000 remix 2 |", Source(Path("a.wav"), channel=1, rate=16000, program="sox")),
        ("sox -R -G a.flac -t wav - remix - |", Source(Path("a.flac"), mix=True, program="sox")),
    ],
)
def test_recognized_decoder_commands(spec, source):
    assert audio_io.parse_command(spec) == source
    assert kaldi.is_pipe(spec)


@pytest.mark.parametrize(
    ("spec", "why"),
    [
        ("ffmpeg -i a.wav -f wav - |", "'ffmpeg' is not one of the decoders"),
        ("flac -c -d -s a.flac | sox - -t wav - |", "shell syntax"),
        ("sph2pipe -f wav a.sph; rm -rf x |", "shell syntax"),
        ("sox $HOME/a.wav -t wav - |", "shell syntax"),
        ("sox a.wav -t wav - vol 2 |", "`vol 2`"),
        ("sox -r 8000 a.raw -t wav - |", "reinterpret the file"),
        ("sox a.wav out.wav |", "stdout"),
        ("sox a.wav -t mp3 - |", "must write a wav"),
        ("sox a.wav -t wav -e u-law - |", "companding"),
        ("flac -d a.flac |", "stdout (-c -d)"),
        ("flac -c -d --skip=100 a.flac |", "--skip=100"),
        ("sph2pipe -f wav -c 3 a.sph |", "1 or 2"),
        ("sph2pipe -u -f wav a.sph |", "'-u'"),
        ("sph2pipe -f wav a.sph b.wav |", "exactly one"),
        ("sph2pipe -f raw a.sph |", "-f wav"),
        ("| cat a.wav", "not a command of the form"),
    ],
)
def test_other_commands_are_not_recognized(spec, why):
    with pytest.raises(audio_io.UnsupportedCommand) as err:
        audio_io.parse_command(spec)
    assert why in str(err.value)


def test_unknown_commands_are_refused_and_never_run(tmp_path):
    data_dir = make_wav_dir(tmp_path / "d", num_utts=4)
    wav = kaldi.read_table(data_dir / "wav.scp").values
    some = next(iter(wav.values()))
    shell_trace = tmp_path / "the-shell-ran"
    commands_ = {
        "ffm-1": f"ffmpeg -i {some} -f wav - |",
        "vol-1": f"sox {some} -t wav - vol 0.5 |",
        "seq-1": f"touch {shell_trace}; flac -c -d -s {some} |",
    }
    write_table(data_dir / "wav.scp", {**wav, **commands_})
    with open(data_dir / "utt2spk", "a") as f:
        f.writelines(f"{u} spk0\n" for u in commands_)
    env, trace = decoys(tmp_path)
    proc = run_features("--data-dir", str(data_dir), "--set", "max_rejected_fraction=1.0", env=env)
    assert proc.returncode == 0, proc.stderr
    assert not trace.exists() and not shell_trace.exists(), "a refused command ran"
    found = rejected(data_dir)
    assert {u: r.reason for u, r in found.items()} == dict.fromkeys(commands_, "pipe_refused")
    assert "'ffmpeg' is not one of the decoders" in found["ffm-1"].detail
    assert "`vol 0.5`" in found["vol-1"].detail and "shell syntax" in found["seq-1"].detail
    assert all("wav.scp" in r.detail and "--allow-pipes" in r.detail for r in found.values())
    # Over the limit, the stage's error says what pipe_refused means and how to allow them.
    proc = run_features("--data-dir", str(data_dir), env=env)
    assert proc.returncode == 1 and "3 x pipe_refused" in proc.stderr and "--allow-pipes" in proc.stderr
    assert not trace.exists() and not shell_trace.exists()


def test_allowed_pipes_run_in_a_shell(tmp_path):
    data_dir = make_wav_dir(tmp_path / "d", num_utts=2)
    features.compute_features(data_dir, CFG, progress=False)
    want = feats_of(data_dir)
    piped = tmp_path / "piped"
    shutil.copytree(data_dir, piped, ignore=shutil.ignore_patterns("feats*", "cmvn*", ".features*", "utt2num_frames"))
    wav = kaldi.read_table(data_dir / "wav.scp").values
    write_table(piped / "wav.scp", {u: f"cat {path} |" for u, path in wav.items()})
    refused = features.compute_features(piped, dataclasses.replace(CFG, max_rejected_fraction=1.0), progress=False)
    assert refused["rejected"] == 2
    assert features.compute_features(piped, dataclasses.replace(CFG, allow_pipes=True), progress=False)["rejected"] == 0
    for utt, matrix in feats_of(piped).items():
        np.testing.assert_array_equal(matrix, want[utt])


def test_shorten_sphere_is_refused_with_the_fix_or_decoded_by_its_own_command(tmp_path):
    data_dir = tmp_path / "swbd"
    data_dir.mkdir()
    reference = tmp_path / "side-a.wav"
    soundfile.write(reference, tone(1.0, 8000, 300), 8000, subtype="PCM_16")
    sph = tmp_path / "sw3.sph"
    soundfile.write(sph, np.stack([tone(1.0, 8000, 300), tone(1.0, 8000, 900)], 1), 8000, format="NIST")
    # LDC ships shorten-compressed SPHERE; libsndfile cannot decode those.
    sph.write_bytes(
        sph.read_bytes().replace(b"sample_coding -s3 pcm", b"sample_coding -s26 pcm,embedded-shorten-v2.00")
    )
    write_table(data_dir / "wav.scp", {"sw3-A": f"sph2pipe -f wav -p -c 1 {sph} |"})
    write_table(data_dir / "utt2spk", {"sw3-A": "sw3"})
    features.compute_features(data_dir, dataclasses.replace(CFG, max_rejected_fraction=1.0), progress=False)
    why = rejected(data_dir)["sw3-A"]
    assert why.reason == "unsupported_audio" and "shorten" in why.detail and "sph2pipe -f sph" in why.detail
    # With pipes allowed, the entry's own sph2pipe decodes it (here one that prints the wav of side A).
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "sph2pipe").write_text(f"#!/bin/sh\ncat {reference}\n")
    (bin_dir / "sph2pipe").chmod(0o755)
    proc = run_features(
        "--data-dir", str(data_dir), "--allow-pipes", env=quiet_env(PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    )
    assert proc.returncode == 0 and "featurized=1" in proc.stdout, proc.stderr
    plain = tmp_path / "plain"
    plain.mkdir()
    write_table(plain / "wav.scp", {"sw3-A": str(reference)})
    write_table(plain / "utt2spk", {"sw3-A": "sw3"})
    features.compute_features(plain, CFG, progress=False)
    np.testing.assert_array_equal(feats_of(data_dir)["sw3-A"], feats_of(plain)["sw3-A"])


# ---- outputs, retries, lengths --------------------------------------------------------------------


def test_kaldi_features_are_used_from_a_read_only_corpus(tmp_path):
    source, _, _ = make_feats_dir(tmp_path / "corpus" / "train", num_utts=8)
    before = snapshot(tmp_path / "corpus")
    out = tmp_path / "feats" / "train"
    result = features.compute_features(source, CFG, progress=False, out_dir=out)
    assert result["existing_features"] and snapshot(tmp_path / "corpus") == before
    assert (out / "feats.scp").read_text() == (source / "feats.scp").read_text() and (out / "cmvn.scp").is_file()
    manifest = shards.make_shards(
        {"train": out}, tmp_path / "shards", shards.ShardConfig(num_shards=2, jobs=1), progress=False
    )
    assert manifest["splits"]["train"]["utterances"] == 8


def test_a_failed_feature_stage_fails_again_on_retry(tmp_path):
    data_dir = make_wav_dir(tmp_path / "d", num_utts=6)
    assert run_features("--data-dir", str(data_dir)).returncode == 0
    wav = kaldi.read_table(data_dir / "wav.scp").values
    utt2spk = (data_dir / "utt2spk").read_text()
    junk = tmp_path / "junk.wav"
    junk.write_bytes(b"not audio " * 100)
    write_table(data_dir / "wav.scp", {**wav, "junk-1": str(junk), "junk-2": str(junk)})
    with open(data_dir / "utt2spk", "a") as f:
        f.write("junk-1 spk0\njunk-2 spk0\n")
    for attempt in range(2):  # the first run, then what an Airflow retry does
        proc = run_features("--data-dir", str(data_dir))
        assert proc.returncode == 1, (attempt, proc.stdout)
        assert "2 of 8 utterances" in proc.stderr and "2 x unreadable" in proc.stderr
        assert not (data_dir / "feats.scp").exists(), "features of a failed run (or an earlier one) are published"
    assert json.loads((data_dir / features.MARKER).read_text())["state"] == "failed"
    assert "unchanged since" in proc.stderr
    assert rejected(data_dir).keys() == {"junk-1", "junk-2"}
    write_table(data_dir / "wav.scp", wav)  # fixed: the next run computes
    (data_dir / "utt2spk").write_text(utt2spk)
    proc = run_features("--data-dir", str(data_dir))
    assert proc.returncode == 0 and "featurized=6" in proc.stdout, proc.stderr


def test_a_failed_shard_stage_fails_again_on_retry(tmp_path):
    data_dir, _, _ = make_feats_dir(tmp_path / "d", num_utts=10, dim=13)
    bad = np.ones((20, 13), np.float32)
    bad[0, 0] = np.nan
    with kaldiio.WriteHelper(f"ark,scp:{tmp_path / 'nan.ark'},{tmp_path / 'nan.scp'}") as writer:
        writer("nan-1", bad)
    with open(data_dir / "feats.scp", "a") as f:
        f.write((tmp_path / "nan.scp").read_text())
    with open(data_dir / "text", "a") as f:
        f.write("nan-1 hello\n")
    with open(data_dir / "utt2spk", "a") as f:
        f.write("nan-1 spk0\n")
    out = tmp_path / "shards"
    lenient = shards.ShardConfig(num_shards=2, jobs=1, max_rejected_fraction=0.2)
    shards.make_shards({"train": data_dir}, out, lenient, progress=False)  # 1 of 11 rejected: within 20%
    assert (out / records.MANIFEST).is_file()
    strict = shards.ShardConfig(num_shards=2, jobs=1, max_rejected_fraction=0.05)
    for _ in range(2):
        with pytest.raises(ValueError, match="1 of 11 utterances were rejected"):
            shards.make_shards({"train": data_dir}, out, strict, progress=False)
        assert not (out / records.MANIFEST).exists(), "the manifest of the earlier build still looks done"


def test_shard_stage_takes_lengths_from_the_feature_stage(tmp_path, monkeypatch):
    data_dir = make_wav_dir(tmp_path / "d", num_utts=8, seconds=0.5)
    features.compute_features(data_dir, CFG, progress=False)
    lengths, dim = features.vouched_lengths(data_dir)
    assert lengths == {u: len(m) for u, m in feats_of(data_dir).items()} and dim == 80
    cfg = shards.ShardConfig(num_shards=2, jobs=1, feature_dtype="float32")
    read_again = tmp_path / "kaldi-like"  # the same features without the stage's marker: read to be checked
    shutil.copytree(data_dir, read_again, ignore=shutil.ignore_patterns(features.MARKER))
    expected = shards.make_shards({"train": read_again}, tmp_path / "read", cfg, progress=False)

    def no_reading(task):
        raise AssertionError("pass 1 read a matrix the feature stage vouches for")

    monkeypatch.setattr(split_validation, "_validate_chunk", no_reading)
    vouched = shards.make_shards({"train": data_dir}, tmp_path / "vouched", cfg, progress=False)
    for key in ("utterances", "frames", "classes", "cmvn", "speakers"):
        assert vouched["splits"]["train"][key] == expected["splits"]["train"][key], key
    digests = [[s["sha256"] for s in m["splits"]["train"]["shards"]] for m in (vouched, expected)]
    assert digests[0] == digests[1]
    # A changed table voids the promise: the stage reads again (here: the patched reader objects).
    with open(data_dir / "utt2num_frames", "a") as f:
        f.write("extra-1 5\n")
    assert features.vouched_lengths(data_dir) is None
    with pytest.raises(AssertionError, match="vouches"):
        shards.make_shards({"train": data_dir}, tmp_path / "again", cfg, progress=False)


# ---- a new test set for a trained model -----------------------------------------------------------


def test_shards_of_a_new_test_set_take_a_models_vocabulary(tmp_path, capsys):
    workdir = tmp_path / "runs" / "asr"
    (workdir / "model").mkdir(parents=True)
    vocabulary = ["<blank>", "<unk>", " ", *sorted(set("turn on the lights seven oslo mond call anna please"))]
    assert "y" not in vocabulary
    (workdir / "model" / "data.json").write_text(json.dumps({"vocabulary": vocabulary, "lowercase": True}))
    test_dir, _, texts = make_feats_dir(tmp_path / "eval", num_utts=12, dim=13)
    with pytest.raises(ValueError, match="vocabulary comes from split 'train'"):
        shards.make_shards(
            {"eval": test_dir}, tmp_path / "no", shards.ShardConfig(num_shards=2, jobs=1), progress=False
        )
    for source in (workdir, workdir / "model", workdir / "model" / "data.json"):
        cfg = shards.ShardConfig(num_shards=2, jobs=1, vocabulary_from=str(source))
        manifest = shards.make_shards({"eval": test_dir}, tmp_path / "shards", cfg, progress=False)
        assert manifest["vocabulary"] == vocabulary
    assert text.load_vocabulary(tmp_path / "shards")["vocabulary"] == vocabulary  # other shards serve too
    assert any("monday" in t for t in texts.values())  # so the test set has a character the model lacks
    assert "'y' are not in the vocabulary" in capsys.readouterr().err
    with pytest.raises(FileNotFoundError, match="holds a vocabulary"):
        text.load_vocabulary(tmp_path / "eval")


def test_evaluation_refuses_shards_made_with_another_vocabulary(tmp_path):
    from models.evaluate import check_vocabulary

    model = {"vocabulary": ["<blank>", "<unk>", " ", "a", "b"], "lowercase": True}
    check_vocabulary(model, shard_set({}, model["vocabulary"]), tmp_path / "runs/asr")  # the same: no error
    other = shard_set({}, ["<blank>", "<unk>", " ", "a", "c", "d"])
    with pytest.raises(ValueError, match=r"token 4 is 'b' for the model and 'c' in the shards .*--vocabulary-from"):
        check_vocabulary(model, other, tmp_path / "runs/asr")
    with pytest.raises(ValueError, match="lower-cased, the shards are not"):
        check_vocabulary(model, shard_set({}, model["vocabulary"], lowercase=False), tmp_path / "runs/asr")


# ---- the DAG's parameters -------------------------------------------------------------------------


def test_dag_params_for_pipes_and_a_features_directory(tmp_path):
    from tests.test_dag import DEFAULTS, kaldi_root

    data = kaldi_root(tmp_path / "corpus")
    plan = make_plan({**DEFAULTS, "data_dir": str(data)}, "speech_pipeline", "r")
    assert commands.features_args(plan, "train") == ["--data-dir", f"{data}/train", "--no-progress"]
    assert f"train={data}/train" in commands.shards_args(plan) and "--allow-pipes" not in commands.shards_args(plan)
    given = {**DEFAULTS, "data_dir": str(data), "features_dir": str(tmp_path / "feats"), "allow_pipes": True}
    plan = make_plan(given, "speech_pipeline", "r")
    assert Plan.from_xcom(json.loads(json.dumps(plan.to_xcom()))) == plan
    assert commands.features_args(plan, "test") == [
        "--data-dir",
        f"{data}/test",
        "--out-dir",
        f"{tmp_path / 'feats'}/test",
        "--allow-pipes",
        "--no-progress",
    ]
    args = commands.shards_args(plan)
    assert f"train={tmp_path / 'feats'}/train" in args and "--allow-pipes" in args
    assert plan.features_dir("train") == f"{tmp_path / 'feats'}/train"


# ---- the documented steps ---------------------------------------------------------------------------


def doc_block(page: str, heading: str, index: int = 0) -> str:
    """The `index`-th bash block of the section under `heading` (e.g. "### The stages by hand") of
    `page` (README.md, docs/data.md), up to the next heading of the same level."""
    text = (ROOT / page).read_text()
    assert f"\n{heading}\n" in text, f"{page} has no section {heading!r}: update this test with it"
    level = heading.split(" ", 1)[0]
    section = text.split(f"\n{heading}\n", 1)[1].split(f"\n{level} ", 1)[0]
    return re.findall(r"```bash\n(.*?)```", section, re.S)[index]


def substitute(script: str, changes: dict[str, str]) -> str:
    for old, new in changes.items():
        assert old in script, f"the documented commands no longer have {old!r}: update this test with it"
        script = script.replace(old, new)
    return script


@pytest.mark.slow
def test_the_readme_steps_by_hand_run_as_written(tmp_path):
    """The README's by-hand block, run by bash in a fresh directory, on 24 utterances and a tiny model;
    then docs/data.md's new-test-set block against the model registered from that run. Only sizes are
    substituted: the commands' seconds are mostly their imports (TensorFlow, MLflow) and MLflow's store;
    the rest grows with the corpus and the decoders' grid."""
    work = tmp_path / "work"
    work.mkdir()
    (work / ".venv").symlink_to(ROOT / ".venv")
    env = quiet_env(MLFLOW_TRACKING_URI=f"sqlite:///{work / 'mlflow.db'}")
    from pipeline import open_text

    # the LM text's source: WordNet's first examples, where the demo takes all of them
    (work / "source.txt").write_text("".join(f"{line}\n" for line in open_text.wordnet_examples()[:300]))
    by_hand = substitute(
        doc_block("README.md", "### The stages by hand"),
        {
            # 2 utterances each of dev, test and dev_engine, 20 of train
            "--out data/ ": "--out data/ --num-utterances 24 ",
            "--out runs/lm_text": "--out runs/lm_text --set text_file=source.txt",
            "--config configs/demo_asr.yaml": f"--config {ROOT}/tests/configs/tiny_asr.yaml --max-steps 4 "
            "--set asr.targets=phones",
            # the graph's grid (models/asr/hlg.py tune) at 2 x 2 points instead of 4 x 3
            "--lm runs/lang --attach": "--lm runs/lang --attach --acoustic-scales 0.85,1.0 --word-penalties=-1,0",
        },
    )
    new_set = substitute(
        doc_block("docs/data.md", "## A new test set for a trained model"),
        {"/corpora/other/data/eval": "other/eval"},
    )
    register = ".venv/bin/python -m models.registry register --workdir runs/asr --name speechflow-asr\n"
    other = "mkdir -p other && cp -r data/test_noisy other/eval && rm -f other/eval/feats* other/eval/cmvn*"
    other += " other/eval/utt2num_frames other/eval/.features.done.json\n"
    for name, script in (("by_hand", by_hand), ("new_set", register + other + new_set)):
        proc = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", script], cwd=work, env=env, capture_output=True, text=True, timeout=600
        )
        assert proc.returncode == 0, f"{name}:\n{script}\n{proc.stdout[-4000:]}\n{proc.stderr[-6000:]}"
    manifest = records.load_manifest(work / "shards")
    assert set(manifest["splits"]) == {"train", "dev", "test", "test_noisy", "test_engine", "dev_engine", "train_aug"}
    assert manifest["phone_vocabulary"][0] == "<blk>" and manifest["phones"]["source"] == "lexicon"
    assert manifest["phones"]["g2p_source"] == "cmudict" and manifest["phones"]["g2p"], "CMUdict's lexicon, its G2P"
    metrics = json.loads((work / "runs" / "asr" / "eval.json").read_text())
    assert {"test_per", "test_noisy_per", "test_engine_per"} <= set(metrics)
    assert {"test_cer_lm", "test_wer_lm", "test_lm_oov_rate"} <= set(metrics), "the attached graph spells words"
    decoding = json.loads((work / "runs" / "asr" / "model" / "lm" / "decoding.json").read_text())
    assert decoding["chosen_on"]["split"] == "dev_engine", "decoding settings are chosen in held-out voices"
    # The registered model, named by its URI, evaluated on a data directory no shards had held.
    evaluated = json.loads((work / "eval-other" / "eval.json").read_text())  # --model models:/..., --out-dir
    assert evaluated["primary_metric"] == "eval_wer_lm" and evaluated["eval_words"] > 0
    assert "eval_per" in evaluated, "the registered model carries its graph"
    evaluated_shards = records.load_manifest(work / "shards-eval")
    assert evaluated_shards["vocabulary"] == manifest["vocabulary"]
    assert evaluated_shards["phone_vocabulary"] == manifest["phone_vocabulary"]
    assert not list((work / "other" / "eval").glob("feats*")), "features were written into the corpus"
