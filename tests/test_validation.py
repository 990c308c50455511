"""Every rejection reason, each from a data directory that contains it; nothing silently dropped."""

from __future__ import annotations

import subprocess
import sys

import kaldiio
import numpy as np
import pytest
import soundfile

from pipeline import features, kaldi, records, shards
from tests.conftest import ROOT, quiet_env
from tests.kaldi_fixtures import make_feats_dir, make_wav_dir, tone, write_table


def shard_rejections(data_dir, tmp_path, cfg=None, **kwargs):
    cfg = cfg or shards.ShardConfig(max_rejected_fraction=1.0, jobs=1)
    shards.make_shards({"train": data_dir}, tmp_path / "out", cfg, progress=False, **kwargs)
    return {r.utt_id: r for _, r in kaldi.read_rejections(tmp_path / "out" / "rejected.tsv")}


def append_matrix(data_dir, utt, matrix, compression_method=None):
    """Adds `utt` with its own ark file to feats.scp/text/utt2spk."""
    ark = data_dir / f"{utt}.ark"
    with kaldiio.WriteHelper(f"ark,scp:{ark},{data_dir / 'extra.scp'}", compression_method=compression_method) as w:
        w(utt, matrix)
    with open(data_dir / "feats.scp", "a") as f:
        f.write((data_dir / "extra.scp").read_text())
    with open(data_dir / "text", "a") as f:
        f.write(f"{utt} hello there\n")
    with open(data_dir / "utt2spk", "a") as f:
        f.write(f"{utt} spk0\n")
    return ark


@pytest.fixture
def data_dir(tmp_path):
    return make_feats_dir(tmp_path / "data", num_utts=10, dim=13)[0]


def test_clean_directory_has_no_rejections(data_dir, tmp_path):
    assert shard_rejections(data_dir, tmp_path) == {}


def test_missing_features_and_transcript_and_speaker(data_dir, tmp_path):
    with open(data_dir / "text", "a") as f:
        f.write("ghost-1 text without features\n")
    lines = (data_dir / "text").read_text().splitlines()
    (data_dir / "text").write_text("\n".join(lines[1:]) + "\n")  # first utterance loses its transcript
    first = lines[0].split()[0]
    utt2spk = (data_dir / "utt2spk").read_text().splitlines()
    (data_dir / "utt2spk").write_text("\n".join(utt2spk[:-1] + ["ghost-1 spk9"]) + "\n")
    last = utt2spk[-1].split()[0]
    rejected = shard_rejections(data_dir, tmp_path)
    assert rejected["ghost-1"].reason == "missing_features"
    assert rejected[first].reason == "missing_transcript"
    assert rejected[last].reason == "missing_speaker"


def test_unreadable_truncated_and_missing_files(data_dir, tmp_path):
    garbage = data_dir / "garbage.ark"
    garbage.write_bytes(b"bad-1 \x00Bxyz not a matrix")
    cut = append_matrix(data_dir, "cut-1", np.ones((50, 13), np.float32))
    cut.write_bytes(cut.read_bytes()[:600])
    with open(data_dir / "feats.scp", "a") as f:
        f.write(f"bad-1 {garbage}:6\nlost-1 {data_dir / 'nowhere.ark'}:6\n")
    write_table(
        data_dir / "text",
        {
            **dict(line.split(" ", 1) for line in (data_dir / "text").read_text().splitlines()),
            "bad-1": "a",
            "lost-1": "b",
        },
    )
    with open(data_dir / "utt2spk", "a") as f:
        f.write("bad-1 spk0\nlost-1 spk0\n")
    rejected = shard_rejections(data_dir, tmp_path)
    assert rejected["bad-1"].reason == "unreadable"
    assert rejected["cut-1"].reason == "truncated"
    assert rejected["lost-1"].reason == "file_missing"
    assert "nowhere.ark" in rejected["lost-1"].detail


def test_nan_inf_dimension_and_frame_limits(data_dir, tmp_path):
    bad = np.ones((30, 13), np.float32)
    bad[3, 4] = np.nan
    append_matrix(data_dir, "nan-1", bad)
    inf = np.ones((30, 13), np.float32)
    inf[0, 0] = np.inf
    append_matrix(data_dir, "inf-1", inf)
    append_matrix(data_dir, "dim-1", np.ones((30, 40), np.float32))
    append_matrix(data_dir, "empty-1", np.zeros((0, 13), np.float32))
    append_matrix(data_dir, "long-1", np.ones((500, 13), np.float32))
    rejected = shard_rejections(
        data_dir, tmp_path, shards.ShardConfig(max_frames=400, max_rejected_fraction=1.0, jobs=1)
    )
    assert rejected["nan-1"].reason == "nan_or_inf"
    assert rejected["inf-1"].reason == "nan_or_inf"
    assert rejected["dim-1"].reason == "wrong_dimension"
    assert rejected["empty-1"].reason == "zero_frames"
    assert rejected["long-1"].reason == "too_many_frames"


def test_transcript_problems_and_duplicates(data_dir, tmp_path):
    utts = sorted(kaldi.read_table(data_dir / "text").values)
    with open(data_dir / "text", "ab") as f:
        f.write(f"{utts[0]}\n".encode())  # same id again, now empty: different data
        f.write(f"{utts[1]} caf\xe9 \xff\xfe\n".encode("latin-1"))  # same id again: duplicate too
    text = kaldi.read_table(data_dir / "text")
    assert utts[0] in text.duplicates
    lines = [
        ln
        for ln in (data_dir / "text").read_bytes().split(b"\n")
        if ln and not ln.startswith(utts[0].encode()) and not ln.startswith(utts[1].encode())
    ]
    lines += [utts[0].encode(), f"{utts[1]} ".encode() + b"\xff\xfe"]  # empty and undecodable, once each
    (data_dir / "text").write_bytes(b"\n".join(lines) + b"\n")
    with open(data_dir / "utt2spk", "a") as f:
        f.write(f"{utts[2]} another-speaker\n")  # an id twice with different data
    with open(data_dir / "feats.scp", "a") as f:
        f.write(f"{utts[3]} {kaldi.read_table(data_dir / 'feats.scp').values[utts[3]]}\n")  # identical: harmless
    rejected = shard_rejections(data_dir, tmp_path)
    assert rejected[utts[0]].reason == "empty_transcript"
    assert rejected[utts[1]].reason == "undecodable_transcript"
    assert rejected[utts[2]].reason == "duplicate_id"
    assert utts[3] not in rejected


def test_pipe_entries_are_refused_and_never_run(data_dir, tmp_path):
    canary = tmp_path / "pipe-ran"
    with open(data_dir / "feats.scp", "a") as f:
        f.write(f"pipe-1 touch {canary}; cat {data_dir / 'feats.ark'} |\n")
    with open(data_dir / "text", "a") as f:
        f.write("pipe-1 hello\n")
    with open(data_dir / "utt2spk", "a") as f:
        f.write("pipe-1 spk0\n")
    rejected = shard_rejections(data_dir, tmp_path)
    assert rejected["pipe-1"].reason == "pipe_refused"
    assert not canary.exists(), "a refused pipe entry was executed"


def test_alignment_problems(data_dir, tmp_path):
    feats = kaldiio.load_scp(str(data_dir / "feats.scp"))
    utts = sorted(feats)
    ali = {utt: np.arange(len(feats[utt]), dtype=np.int32) % 5 for utt in utts[2:]}
    ali[utts[2]] = ali[utts[2]][:-1]
    with kaldiio.WriteHelper(f"ark,scp:{tmp_path / 'ali.ark'},{tmp_path / 'ali.scp'}") as w:
        for utt, vec in ali.items():
            w(utt, vec)
    rejected = shard_rejections(data_dir, tmp_path, alignments={"train": tmp_path / "ali.scp"})
    assert rejected[utts[0]].reason == "missing_alignment"
    assert rejected[utts[2]].reason == "alignment_length_mismatch"
    manifest = records.load_manifest(tmp_path / "out")
    assert manifest["num_targets"] == 5


def test_too_many_rejections_fail_with_a_message_naming_the_file(data_dir, tmp_path):
    for i in range(3):
        bad = np.ones((20, 13), np.float32)
        bad[0, 0] = np.nan
        append_matrix(data_dir, f"nan-{i}", bad)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pipeline.shards",
            "--split",
            f"train={data_dir}",
            "--out",
            str(tmp_path / "out"),
            "--max-rejected-fraction",
            "0.1",
            "--no-progress",
        ],
        cwd=ROOT,
        env=quiet_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode != 0
    assert "rejected.tsv" in proc.stderr and "3 x nan_or_inf" in proc.stderr
    assert len(kaldi.read_rejections(tmp_path / "out" / "rejected.tsv")) == 3
    assert not list((tmp_path / "out").glob("*.tfrecord"))


# --- audio-level reasons, found by the feature stage and carried into the shard stage ----------


def test_audio_rejections_are_carried_to_the_shard_stage(tmp_path):
    data_dir = make_wav_dir(tmp_path / "wavs", num_utts=6)
    wav = kaldi.read_table(data_dir / "wav.scp").values
    utts = sorted(wav)
    cut = data_dir / "wav" / "cut.wav"
    soundfile.write(cut, tone(1.0), 16000, subtype="PCM_16")
    cut.write_bytes(cut.read_bytes()[:8000])
    junk = data_dir / "wav" / "junk.wav"
    junk.write_bytes(b"this is not audio at all " * 40)
    canary = tmp_path / "audio-pipe-ran"
    extra = {
        "cut-1": str(cut),
        "junk-1": str(junk),
        "gone-1": str(data_dir / "wav" / "gone.wav"),
        "pipe-1": f"touch {canary}; sox -n -t wav - synth 1 sine 300 |",
    }
    write_table(data_dir / "wav.scp", {**wav, **extra})
    with open(data_dir / "text", "a") as f:
        f.writelines(f"{u} hello\n" for u in extra)
    with open(data_dir / "utt2spk", "a") as f:
        f.writelines(f"{u} spk0\n" for u in extra)
    cfg = features.FeatureConfig(max_rejected_fraction=1.0, jobs=1)
    summary = features.compute_features(data_dir, cfg, progress=False)
    assert summary["rejected"] == 4 and summary["featurized"] == len(utts)
    assert not canary.exists()
    rejected = shard_rejections(data_dir, tmp_path)
    assert {u: r.reason for u, r in rejected.items()} == {
        "cut-1": "truncated",
        "junk-1": "unreadable",
        "gone-1": "file_missing",
        "pipe-1": "pipe_refused",
    }


def test_segments_outside_recording_and_bad_segments(tmp_path):
    data_dir = tmp_path / "seg"
    (data_dir / "wav").mkdir(parents=True)
    soundfile.write(data_dir / "wav" / "rec1.wav", tone(2.0), 16000, subtype="PCM_16")
    write_table(data_dir / "wav.scp", {"rec1": str(data_dir / "wav" / "rec1.wav")})
    write_table(
        data_dir / "segments",
        {
            "s-a": "rec1 0.00 0.80",
            "s-b": "rec1 0.80 1.95",
            "s-c": "rec1 1.50 3.50",
            "s-d": "rec1 1.2 0.4",
            "s-e": "rec9 0 1",
        },
    )
    write_table(data_dir / "utt2spk", {u: "s" for u in ("s-a", "s-b", "s-c", "s-d", "s-e")})
    summary = features.compute_features(
        data_dir, features.FeatureConfig(max_rejected_fraction=1.0, jobs=1), progress=False
    )
    rejected = {r.utt_id: r.reason for _, r in kaldi.read_rejections(data_dir / features.REJECTED)}
    assert rejected == {"s-c": "segment_outside_recording", "s-d": "bad_segment", "s-e": "missing_audio"}
    feats = kaldiio.load_scp(str(data_dir / "feats.scp"))
    assert sorted(feats) == ["s-a", "s-b"]
    # 0.8 s at a 10 ms shift with 25 ms windows: 78 frames; the segment really was cut.
    assert feats["s-a"].shape == (78, 80) and feats["s-b"].shape[0] == 113
    assert summary["featurized"] == 2


def test_other_sample_rates_and_channels_are_converted_or_rejected(tmp_path):
    data_dir = tmp_path / "rates"
    (data_dir / "wav").mkdir(parents=True)
    soundfile.write(data_dir / "wav" / "a.wav", tone(1.0, 16000), 16000, subtype="PCM_16")
    soundfile.write(data_dir / "wav" / "b.wav", tone(1.0, 8000), 8000, subtype="PCM_16")
    soundfile.write(data_dir / "wav" / "c.wav", tone(1.0, 16000, channels=2), 16000, subtype="PCM_16")
    write_table(data_dir / "wav.scp", {u: str(data_dir / "wav" / f"{u}.wav") for u in "abc"})
    write_table(data_dir / "utt2spk", {u: "s" for u in "abc"})
    features.compute_features(data_dir, features.FeatureConfig(jobs=1, max_rejected_fraction=1.0), progress=False)
    feats = kaldiio.load_scp(str(data_dir / "feats.scp"))
    # Resampled and mixed down: the same one second of tone gives the same number of frames, and
    # the stereo copy of a's signal gives a's features.
    assert {u: feats[u].shape for u in "abc"} == {u: (98, 80) for u in "abc"}
    np.testing.assert_allclose(feats["c"], feats["a"], atol=1e-3)
    strict = tmp_path / "strict"
    strict.mkdir()
    for name in ("wav.scp", "utt2spk"):
        (strict / name).write_text((data_dir / name).read_text())
    features.compute_features(
        strict, features.FeatureConfig(jobs=1, resample=False, downmix=False, max_rejected_fraction=1.0), progress=False
    )
    rejected = {r.utt_id: r for _, r in kaldi.read_rejections(strict / features.REJECTED)}
    assert {u: r.reason for u, r in rejected.items()} == {"b": "unsupported_audio", "c": "unsupported_audio"}
    assert "8000" in rejected["b"].detail and "2 channels" in rejected["c"].detail


def test_truncated_sphere_and_malformed_segment_fields(tmp_path):
    data_dir = tmp_path / "sph"
    (data_dir / "wav").mkdir(parents=True)
    whole, cut = data_dir / "wav" / "whole.sph", data_dir / "wav" / "cut.sph"
    soundfile.write(whole, tone(2.0, 8000), 8000, format="NIST", subtype="PCM_16")
    cut.write_bytes(whole.read_bytes()[:20000])  # libsndfile would read the 9,488 samples that are left
    write_table(data_dir / "wav.scp", {"whole": str(whole), "cut": str(cut)})
    write_table(
        data_dir / "segments",
        {
            "s-end": "whole 0.5 -1",  # -1: to the end
            "s-neg": "whole 0.5 -2",
            "s-start": "whole -0.5 1.0",
            "s-chan": "whole 0 1 left",
            "s-cut": "cut 0 -1",
        },
    )
    write_table(data_dir / "utt2spk", {u: "s" for u in ("s-end", "s-neg", "s-start", "s-chan", "s-cut")})
    features.compute_features(data_dir, features.FeatureConfig(max_rejected_fraction=1.0, jobs=1), progress=False)
    rejected = {r.utt_id: r for _, r in kaldi.read_rejections(data_dir / features.REJECTED)}
    assert {u: r.reason for u, r in rejected.items()} == {
        "s-neg": "bad_segment",
        "s-start": "bad_segment",
        "s-chan": "bad_segment",
        "s-cut": "truncated",
    }
    assert "32000 sample bytes" in rejected["s-cut"].detail
    assert kaldiio.load_scp(str(data_dir / "feats.scp"))["s-end"].shape == (148, 80)  # 1.5 s
