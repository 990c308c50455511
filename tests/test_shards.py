"""Round trips through the feature and shard stages, atomic writes and safe re-runs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import kaldiio
import numpy as np
import pytest

from pipeline import features, kaldi, records, shards
from tests.conftest import ROOT, quiet_env
from tests.kaldi_fixtures import make_feats_dir, make_wav_dir

# float32 storage: the round trips below are exact (float16, the default, has its own test).
CFG = shards.ShardConfig(num_shards=3, jobs=1, feature_dtype="float32")


@pytest.mark.parametrize(
    "kind, method, atol",
    [("binary", None, 0.0), ("CM", 2, None), ("CM2", 3, None), ("CM3", 5, None), ("text", None, 1e-6)],
)
def test_round_trip_of_every_ark_format(tmp_path, kind, method, atol):
    data_dir, feats, texts = make_feats_dir(
        tmp_path / "d", num_utts=9, dim=13, compression_method=method, text_ark=kind == "text"
    )
    if method is not None:
        # Compressed matrices are lossy: the shards must hold exactly what kaldiio decodes.
        feats = {utt: kaldiio.load_mat(spec) for utt, spec in kaldi.read_table(data_dir / "feats.scp").values.items()}
    shards.make_shards({"train": data_dir}, tmp_path / "out", CFG, progress=False)
    got = {
        utt: (matrix, text)
        for utt, matrix, text in records.read_utterances(records.open_shard_set(tmp_path / "out"), "train")
    }
    assert sorted(got) == sorted(feats)
    for utt, (matrix, text) in got.items():
        assert matrix.dtype == np.float32 and matrix.shape == feats[utt].shape
        np.testing.assert_allclose(matrix, feats[utt], atol=atol or 0, rtol=0)
        assert text == texts[utt]


@pytest.mark.parametrize("dim", [13, 40, 80])
def test_any_feature_dimension_and_gzip(tmp_path, dim):
    data_dir, feats, _ = make_feats_dir(tmp_path / "d", num_utts=5, dim=dim)
    manifest = shards.make_shards(
        {"train": data_dir},
        tmp_path / "out",
        shards.ShardConfig(num_shards=2, compression="gzip", jobs=1, feature_dtype="float32"),
        progress=False,
    )
    assert manifest["feature_dim"] == dim
    assert all(s["file"].endswith(".tfrecord.gz") for s in manifest["splits"]["train"]["shards"])
    got = dict((u, m) for u, m, _ in records.read_utterances(records.open_shard_set(tmp_path / "out"), "train"))
    np.testing.assert_array_equal(got[sorted(feats)[0]], feats[sorted(feats)[0]])


def test_manifest_contents(tmp_path):
    train, train_feats, train_texts = make_feats_dir(tmp_path / "train", num_utts=12, seed=1)
    test, _, _ = make_feats_dir(tmp_path / "test", num_utts=4, seed=2)
    manifest = shards.make_shards({"train": train, "test": test}, tmp_path / "out", CFG, progress=False)
    split = manifest["splits"]["train"]
    assert [s["file"] for s in split["shards"]] == [f"train-{i:05d}-of-00003.tfrecord" for i in range(3)]
    assert split["utterances"] == 12 and sum(s["count"] for s in split["shards"]) == 12
    assert split["frames"] == sum(len(m) for m in train_feats.values())
    for shard in split["shards"]:
        assert shard["sha256"] == __import__("common.fsutil").fsutil.file_sha256(tmp_path / "out" / shard["file"])
        assert shard["lengths"] == [len(train_feats[u]) for u in shard["utt_ids"]]
    chars = {ch for t in train_texts.values() for ch in t}
    assert manifest["vocabulary"][:2] == ["<blank>", "<unk>"] and set(manifest["vocabulary"][2:]) == chars
    # CMVN: Kaldi's [2, D+1] layout, counts equal to the speaker's frames.
    stats = np.asarray(split["cmvn"]["spk0"])
    spk0 = np.concatenate([m for u, m in train_feats.items() if u.startswith("spk0")])
    assert stats.shape == (2, 14) and stats[0, -1] == len(spk0)
    np.testing.assert_allclose(stats[0, :-1], spk0.sum(0), rtol=1e-5)
    np.testing.assert_allclose(stats[1, :-1], (spk0.astype(np.float64) ** 2).sum(0), rtol=1e-5)
    assert set(manifest["fingerprint"]["inputs"]) == {"train", "test"}
    assert "code" in manifest["fingerprint"]


def test_uint8_and_float16_shards_hold_the_features_within_their_precision(tmp_path):
    data_dir, feats, texts = make_feats_dir(tmp_path / "d", num_utts=20, dim=80, frames=(20, 90))
    sizes = {}
    for dtype in ("uint8", "float16", "float32"):
        cfg = shards.ShardConfig(num_shards=2, jobs=1, feature_dtype=dtype)
        manifest = shards.make_shards({"train": data_dir}, tmp_path / dtype, cfg, progress=False)
        assert manifest["feature_dtype"] == dtype and manifest["version"] == records.FORMAT_VERSION
        sizes[dtype] = sum(s["bytes"] for s in manifest["splits"]["train"]["shards"])
        got = {
            utt: (matrix, text)
            for utt, matrix, text in records.read_utterances(records.open_shard_set(tmp_path / dtype), "train")
        }
        assert sorted(got) == sorted(feats)
        for utt, (matrix, text) in got.items():
            assert text == texts[utt] and matrix.shape == feats[utt].shape
            if dtype == "float16":
                np.testing.assert_array_equal(matrix, feats[utt].astype(np.float16).astype(np.float32))
            elif dtype == "uint8":
                # within half a code step: a chunk's range of a dimension over 255 (at most the split's)
                every = np.concatenate(list(feats.values()))
                half_step = (every.max(0) - every.min(0)) / 255 / 2
                assert (np.abs(matrix - feats[utt]) <= half_step + 1e-5).all()
    assert sizes["uint8"] < 0.35 * sizes["float32"] and sizes["float16"] < 0.6 * sizes["float32"]


@pytest.mark.parametrize("feature_dtype,targets,phonemes", [("uint8", True, False), ("float16", False, True)])
def test_the_writer_and_the_reader_follow_one_record_schema(feature_dtype, targets, phonemes):
    import tensorflow as tf

    rng = np.random.default_rng(0)
    utts = [
        {"utt_id": f"u{i}", "speaker": "s", "matrix": rng.normal(size=[n, 4]).astype(np.float32), "transcript": "ab"}
        | {"tokens": [1, 2], "targets": [0] * n if targets else None, "phonemes": [3, 4, 5] if phonemes else None}
        for i, n in enumerate([5, 3])
    ]
    serialized = records.serialize_chunk(utts, 1, slots=3, frames=5, feature_dtype=feature_dtype)
    written = tf.train.Example.FromString(serialized).features.feature
    present = {"", feature_dtype, "targets" if targets else "none", "phonemes" if phonemes else "none"}
    expected = {key for key, field in records.SCHEMA.items() if field.when in present}
    assert set(written) == expected == set(records.chunk_spec(feature_dtype, targets, phonemes))
    counts = {"chunk": 1, "slot": 3, "token": 4, "phoneme": 6, "frame": 8, "dim": 4}
    for key in expected:
        field = records.SCHEMA[key]
        values = getattr(
            written[key], {"int64": "int64_list", "bytes": "bytes_list", "float": "float_list"}[field.kind]
        )
        assert len(values.value) == counts[field.count], key
    assert int(records.parse_class(serialized)) == 1
    chunk = records.parse_chunks(
        tf.constant([serialized]), 5, 4, feature_dtype, with_targets=targets, with_phonemes=phonemes
    )
    assert chunk["lengths"].numpy().tolist() == [5, 3, 0]
    if phonemes:
        assert chunk["phonemes"].to_list() == [[3, 4, 5], [3, 4, 5], []]


def test_layout_gives_every_shard_the_same_classes_in_the_same_order():
    rng = np.random.default_rng(0)
    lengths = {f"u{i:03d}": int(n) for i, n in enumerate(rng.integers(20, 900, size=237))}
    layout = shards.plan_layout(lengths, num_shards=4, chunk_utterances=5, length_classes=6, seed=1)
    assert len(layout.classes) == 6 and len(layout.shards) == 4
    placed = [u for shard in layout.shards for _, chunk in shard for u in chunk]
    assert sorted(placed) == sorted(lengths), "every utterance exactly once"
    for shard in layout.shards:
        assert [c for c, _ in shard] == layout.class_sequence
        for c, chunk in shard:
            info = layout.classes[c]
            assert all(info["min_length"] <= lengths[u] <= info["max_length"] for u in chunk)
            assert len(chunk) == info["slots"] or c == len(layout.classes) - 1  # only the last class has empty slots
            assert 1 <= len(chunk) <= info["slots"] <= 5
    uppers = [c["max_length"] for c in layout.classes]
    assert uppers == sorted(uppers)
    # A split too small for a chunk of five per shard gets one class of smaller chunks.
    small = shards.plan_layout(dict(list(lengths.items())[:9]), 4, 5, 6, seed=1)
    assert len(small.classes) == 1 and sum(len(chunk) for s in small.shards for _, chunk in s) == 9


def test_shards_of_the_old_format_are_refused_with_the_command_that_rewrites_them(tmp_path):
    data_dir, _, _ = make_feats_dir(tmp_path / "d", num_utts=6)
    manifest = shards.make_shards({"train": data_dir}, tmp_path / "out", CFG, progress=False)
    old = {**manifest, "version": 1}
    old.pop("skipped")
    (tmp_path / "out" / records.MANIFEST).write_text(json.dumps(old))
    with pytest.raises(ValueError, match=r"format version 1 .*pipeline\.shards --split train=.* --out"):
        records.open_shard_set(tmp_path / "out")
    # The shard stage itself rewrites them (the manifest's fingerprint no longer matches).
    again = shards.make_shards({"train": data_dir}, tmp_path / "out", CFG, progress=False)
    assert not again["skipped"] and records.load_manifest(tmp_path / "out")["version"] == records.FORMAT_VERSION


def test_shards_balance_lengths(tmp_path):
    data_dir, _, _ = make_feats_dir(tmp_path / "d", num_utts=240, dim=4, frames=(10, 300))
    manifest = shards.make_shards(
        {"train": data_dir}, tmp_path / "out", shards.ShardConfig(num_shards=4, jobs=1), progress=False
    )
    frames = [s["frames"] for s in manifest["splits"]["train"]["shards"]]
    assert max(frames) - min(frames) < 0.05 * np.mean(frames), frames


def test_rerun_is_a_no_op_and_changed_inputs_rebuild(tmp_path):
    data_dir, _, _ = make_feats_dir(tmp_path / "d", num_utts=8)
    out = tmp_path / "out"
    first = shards.make_shards({"train": data_dir}, out, CFG, progress=False)
    mtimes = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
    again = shards.make_shards({"train": data_dir}, out, CFG, progress=False)
    assert again["skipped"] and {p.name: p.stat().st_mtime_ns for p in out.iterdir()} == mtimes
    # A changed transcript changes the shards.
    (data_dir / "text").write_text((data_dir / "text").read_text().replace("the", "a"))
    rebuilt = shards.make_shards({"train": data_dir}, out, CFG, progress=False)
    assert not rebuilt["skipped"] and rebuilt["fingerprint"] != first["fingerprint"]
    # Another layout removes the old shards.
    shards.make_shards({"train": data_dir}, out, shards.ShardConfig(num_shards=2, jobs=1), progress=False)
    assert sorted(p.name for p in out.glob("*.tfrecord")) == [
        "train-00000-of-00002.tfrecord",
        "train-00001-of-00002.tfrecord",
    ]


@pytest.mark.slow
def test_killed_writer_leaves_no_partial_shard_and_rerun_gives_same_manifest(tmp_path):
    data_dir, _, _ = make_feats_dir(tmp_path / "d", num_utts=400, dim=80, frames=(200, 400))
    cmd = [
        sys.executable,
        "-m",
        "pipeline.shards",
        "--split",
        f"train={data_dir}",
        "--num-shards",
        "8",
        "--no-progress",
        "--set",
        "jobs=2",
    ]
    out = tmp_path / "out"
    proc = subprocess.Popen(
        [*cmd, "--out", str(out)],
        cwd=ROOT,
        env=quiet_env(),
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.time() + 120
    while not list(out.glob(".*.tfrecord.tmp")) and time.time() < deadline and proc.poll() is None:
        time.sleep(0.02)
    assert proc.poll() is None, "the writer finished before it could be interrupted; make the corpus larger"
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not (out / "manifest.json").exists()
    finished = set(out.glob("train-*.tfrecord"))
    assert len(finished) < 8, "every shard was already complete when the writer was killed"

    clean = tmp_path / "clean"
    subprocess.run([*cmd, "--out", str(clean)], cwd=ROOT, env=quiet_env(), check=True, timeout=300, capture_output=True)
    expected = json.loads((clean / "manifest.json").read_text())
    digests = {s["file"]: s["sha256"] for s in expected["splits"]["train"]["shards"]}
    from common.fsutil import file_sha256

    for path in finished:  # what exists under a final name is complete: byte-identical to a clean run
        assert file_sha256(path) == digests[path.name]
    subprocess.run([*cmd, "--out", str(out)], cwd=ROOT, env=quiet_env(), check=True, timeout=300, capture_output=True)
    assert json.loads((out / "manifest.json").read_text()) == expected
    assert not list(out.glob(".*.tmp"))


def test_feature_stage_matches_kaldi_native_fbank_and_is_safe_to_rerun(tmp_path):
    import kaldi_native_fbank as knf
    import soundfile

    data_dir = make_wav_dir(tmp_path / "w", num_utts=4)
    summary = features.compute_features(data_dir, features.FeatureConfig(jobs=1), progress=False)
    assert summary == {
        "utterances": 4,
        "featurized": 4,
        "rejected": 0,
        "frames": 4 * 48,
        "speakers": 2,
        "dim": 80,
        "skipped": False,
    }
    feats = kaldiio.load_scp(str(data_dir / "feats.scp"))
    utt = sorted(feats)[0]
    wave, _ = soundfile.read(data_dir / "wav" / f"{utt}.wav", dtype="int16")
    opts = knf.FbankOptions()
    opts.frame_opts.dither = 0
    opts.mel_opts.num_bins = 80
    ref = knf.OnlineFbank(opts)
    ref.accept_waveform(16000, wave.astype(np.float32).tolist())
    ref.input_finished()
    np.testing.assert_allclose(feats[utt], np.stack([ref.get_frame(i) for i in range(ref.num_frames_ready)]), atol=1e-4)
    cmvn = kaldiio.load_scp(str(data_dir / "cmvn.scp"))
    assert sorted(cmvn) == ["spk0", "spk1"] and cmvn["spk0"].shape == (2, 81)
    assert cmvn["spk0"][0, 80] == sum(len(feats[u]) for u in feats if u.startswith("spk0"))
    mtime = (data_dir / "feats.ark").stat().st_mtime_ns
    assert features.compute_features(data_dir, features.FeatureConfig(jobs=1), progress=False)["skipped"]
    assert (data_dir / "feats.ark").stat().st_mtime_ns == mtime
    # Another configuration recomputes.
    assert (
        features.compute_features(data_dir, features.FeatureConfig(jobs=1, num_mel_bins=40), progress=False)["dim"]
        == 40
    )
    assert kaldiio.load_scp(str(data_dir / "feats.scp"))[utt].shape[1] == 40


def test_feature_stage_leaves_kaldi_features_alone(tmp_path):
    data_dir, feats, _ = make_feats_dir(tmp_path / "d", num_utts=6)
    before = (data_dir / "feats.scp").read_text()
    result = features.compute_features(data_dir, features.FeatureConfig(jobs=1), progress=False)
    assert result["existing_features"] and (data_dir / "feats.scp").read_text() == before
    assert (data_dir / "cmvn.scp").is_file()


def test_feature_cli_runs_in_parallel(tmp_path):
    data_dir = make_wav_dir(tmp_path / "w", num_utts=6)
    proc = subprocess.run(
        [sys.executable, "-m", "pipeline.features", "--data-dir", str(data_dir), "--set", "jobs=2"],
        cwd=ROOT,
        env=quiet_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "featurized=6" in proc.stdout and "fbank" in proc.stderr  # the progress bar
    assert len(kaldiio.load_scp(str(data_dir / "feats.scp"))) == 6
