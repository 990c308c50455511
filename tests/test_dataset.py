"""The tf.data input: per-rank shares, equal batch counts, CMVN in the graph, bucketing."""

from __future__ import annotations

import collections
import dataclasses
import json
import re

import numpy as np
import pytest

from pipeline import dataset, records, shards
from tests.conftest import horovodrun
from tests.kaldi_fixtures import make_feats_dir

CFG = dataset.InputConfig(frames_per_batch=600, max_batch_size=16, num_buckets=3, shuffle_buffer=16, deterministic=True)


@pytest.fixture(scope="module")
def sharded(tmp_path_factory):
    root = tmp_path_factory.mktemp("ds")
    train, feats, texts = make_feats_dir(root / "train", num_utts=53, dim=13, num_speakers=4, frames=(10, 200))
    test, _, _ = make_feats_dir(root / "test", num_utts=7, dim=13, num_speakers=2, seed=5)
    # 5 shards for 2 ranks: one rank reads three, the other two, so batch counts differ naturally.
    shards.make_shards(
        {"train": train, "test": test}, root / "out", shards.ShardConfig(num_shards=5, jobs=1), progress=False
    )
    return root / "out", feats, texts


def epoch_ids(out, cfg, size, epoch=0):
    per_rank = []
    for rank in range(size):
        ds, steps = dataset.asr_dataset(out, "train", cfg, rank=rank, size=size, epoch=epoch)
        batches = [b["utt_id"].tolist() for b in ds.as_numpy_iterator()]
        assert len(batches) == steps
        per_rank.append(batches)
    return per_rank


@pytest.mark.parametrize("size", [1, 2, 3, 5])
def test_every_rank_gets_the_same_number_of_batches_and_all_utterances_once(sharded, size):
    out, feats, _ = sharded
    for epoch in (0, 1):
        per_rank = epoch_ids(out, CFG, size, epoch)
        assert len({len(b) for b in per_rank}) == 1, [len(b) for b in per_rank]
        seen = [u.decode() for batches in per_rank for batch in batches for u in batch]
        assert sorted(seen) == sorted(feats), "an utterance was dropped or repeated"


def test_natural_counts_differ_so_equalization_is_exercised(sharded):
    out, _, _ = sharded
    manifest = records.load_manifest(out)
    _, _, counts, target = dataset.epoch_layout(manifest, "train", 2, 0, CFG)
    assert counts[0] != counts[1] and target == max(counts)


def test_ranks_read_disjoint_shards_that_change_each_epoch(sharded):
    manifest = records.load_manifest(sharded[0])
    e0 = [dataset.rank_files(manifest, "train", r, 2, 0, 0) for r in range(2)]
    e1 = [dataset.rank_files(manifest, "train", r, 2, 1, 0) for r in range(2)]
    assert sorted(e0[0] + e0[1]) == list(range(5)) and not set(e0[0]) & set(e0[1])
    assert e0 != e1
    with pytest.raises(ValueError, match="--num-shards 8"):
        dataset.rank_files(manifest, "train", 0, 8, 0, 0)


def test_batches_respect_the_frame_budget_and_buckets(sharded):
    out, feats, _ = sharded
    ds, _ = dataset.asr_dataset(out, "train", CFG)
    for batch in ds.as_numpy_iterator():
        b, t, d = batch["feats"].shape
        assert d == 13 and t == batch["feat_lengths"].max()
        assert b * t <= CFG.frames_per_batch * 1.5
        for i, utt in enumerate(batch["utt_id"]):
            assert batch["feat_lengths"][i] == len(feats[utt.decode()])
            assert batch["token_lengths"][i] == np.count_nonzero(batch["tokens"][i])


def test_speaker_cmvn_is_applied_in_the_graph(sharded):
    out, feats, _ = sharded
    ds, _ = dataset.asr_dataset(out, "train", CFG, training=False)
    by_speaker = collections.defaultdict(list)
    for batch in ds.as_numpy_iterator():
        for i, utt in enumerate(batch["utt_id"]):
            by_speaker[utt.decode().split("-")[0]].append(batch["feats"][i, : batch["feat_lengths"][i]])
    for frames in by_speaker.values():
        stacked = np.concatenate(frames)
        np.testing.assert_allclose(stacked.mean(0), 0, atol=1e-3)
        np.testing.assert_allclose(stacked.std(0), 1, atol=1e-3)
    raw = dataclasses.replace(CFG, cmvn="none")
    ds, _ = dataset.asr_dataset(out, "train", raw, training=False)
    batch = next(ds.as_numpy_iterator())
    utt = batch["utt_id"][0].decode()
    np.testing.assert_array_equal(batch["feats"][0, : len(feats[utt])], feats[utt])


def test_frame_stacking_and_subsampling():
    import tensorflow as tf

    x = tf.reshape(tf.range(2 * 5 * 2, dtype=tf.float32), [2, 5, 2])
    stacked, lengths = dataset.stack_and_subsample(x, tf.constant([5, 3]), stack=3, subsample=2)
    assert stacked.shape == (2, 3, 6) and lengths.numpy().tolist() == [3, 2]
    np.testing.assert_array_equal(stacked[0, 1], np.concatenate([x[0, 2], x[0, 3], x[0, 4]]))
    np.testing.assert_array_equal(stacked[0, 2], np.concatenate([x[0, 4], [0, 0], [0, 0]]))


def test_synthesis_batches(sharded):
    out, feats, texts = sharded
    ds, steps = dataset.tts_dataset(out, "train", CFG)
    count = 0
    for batch in ds.as_numpy_iterator():
        count += 1
        for i, utt in enumerate(batch["utt_id"]):
            n = batch["mel_lengths"][i]
            assert n == len(feats[utt.decode()])
            stops = batch["stop_targets"][i]
            assert stops[: n - 1].sum() == 0 and stops[n - 1 :].min() == 1
            assert batch["token_lengths"][i] == len(texts[utt.decode()])
    assert count == steps
    mean, std = dataset.mel_stats(records.load_manifest(out))
    everything = np.concatenate(list(feats.values()))
    np.testing.assert_allclose(mean, everything.mean(0), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(std, everything.std(0), rtol=1e-3)


@pytest.mark.slow
def test_under_horovodrun_both_ranks_get_equal_batches_covering_the_epoch(sharded):
    out, feats, _ = sharded
    proc = horovodrun(["tests/scripts/epoch_ids.py", str(out)], np=2, timeout=300)
    per_rank = {}
    for rank, payload in re.findall(r"EPOCH rank=(\d) (.*)", proc.stdout):
        per_rank[int(rank)] = json.loads(payload)
    assert sorted(per_rank) == [0, 1], proc.stdout
    for epoch in ("0", "1"):
        assert len(per_rank[0][epoch]) == len(per_rank[1][epoch])
        seen = [u for r in (0, 1) for batch in per_rank[r][epoch] for u in batch]
        assert sorted(seen) == sorted(feats)


def test_spec_augment_masks_bands_and_runs_in_training_only(sharded):
    import tensorflow as tf

    x = tf.ones([200, 80])
    cfg = dataset.InputConfig(freq_masks=2, freq_mask_width=10, time_masks=2, time_mask_fraction=0.05)
    masked = dataset.spec_augment(x, cfg, tf.constant([3, 4], tf.int64)).numpy()
    zero_bins, zero_frames = (masked == 0).all(0).sum(), (masked == 0).all(1).sum()
    assert 0 < zero_bins <= 20 and 0 < zero_frames <= 20
    again = dataset.spec_augment(x, cfg, tf.constant([3, 4], tf.int64)).numpy()
    np.testing.assert_array_equal(masked, again)  # stateless: reproducible from the seed
    out, feats, _ = sharded
    augmented = dataclasses.replace(CFG, spec_augment=True, cmvn="none")
    train_ds, _ = dataset.asr_dataset(out, "train", augmented)
    masked_utts = 0
    for batch in train_ds.as_numpy_iterator():
        for i, utt in enumerate(batch["utt_id"]):
            n = batch["feat_lengths"][i]
            masked_utts += not np.array_equal(batch["feats"][i, :n], feats[utt.decode()])
    assert masked_utts > len(feats) // 2
    eval_ds, _ = dataset.asr_dataset(out, "train", augmented, training=False)
    for batch in eval_ds.as_numpy_iterator():
        utt = batch["utt_id"][0].decode()
        np.testing.assert_array_equal(batch["feats"][0, : batch["feat_lengths"][0]], feats[utt])


def test_epoch_stream_keeps_order_and_starts_the_next_epoch_early():
    import time

    import tensorflow as tf

    produced = []

    def make_epoch(epoch):
        def record(x):
            produced.append(int(x))
            return x

        items = tf.data.Dataset.range(epoch * 10, epoch * 10 + 4)
        return items.map(lambda x: tf.py_function(record, [x], tf.int64)), 4

    stream, counts = dataset.chain_epochs(make_epoch, 0, 3, skip=1, prefetch=1)
    assert counts == [4, 4, 4]
    iterator = iter(stream)
    assert int(next(iterator)) == 1  # epoch 0 resumed after one batch
    deadline = time.monotonic() + 10
    while 10 not in produced and time.monotonic() < deadline:
        time.sleep(0.01)
    assert 10 in produced, produced  # epoch 1's first batch exists while epoch 0 is still being consumed
    assert [int(x) for x in iterator] == [2, 3, 10, 11, 12, 13, 20, 21, 22, 23]
