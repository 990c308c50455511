"""The tf.data input: per-rank shares, equal batch counts, rank-synchronized classes, CMVN, epochs."""

from __future__ import annotations

import collections
import dataclasses
import json
import re
import time

import numpy as np
import pytest

from models.asr.config import AugmentConfig
from pipeline import dataset, frontend, records, shards
from tests.conftest import horovodrun
from tests.kaldi_fixtures import make_feats_dir

CFG = dataset.InputConfig(frames_per_batch=600, max_batch_size=16, shuffle_buffer=16)


@pytest.fixture(scope="module")
def sharded(tmp_path_factory):
    root = tmp_path_factory.mktemp("ds")
    train, feats, texts = make_feats_dir(root / "train", num_utts=53, dim=13, num_speakers=4, frames=(10, 200))
    test, _, _ = make_feats_dir(root / "test", num_utts=7, dim=13, num_speakers=2, seed=5)
    # float16: the tests compare values exactly (uint8 storage has its own round-trip tests)
    cfg = shards.ShardConfig(num_shards=4, chunk_utterances=3, length_classes=4, jobs=1, feature_dtype="float16")
    shards.make_shards({"train": train, "test": test}, root / "out", cfg, progress=False)
    return records.open_shard_set(root / "out"), feats, texts


def class_of_each_utterance(out: records.ShardSet, split: str = "train") -> dict[str, int]:
    """utt id -> its length class, from the manifest's record layout (as stored)."""
    manifest, classes = records.load_manifest(out.root), {}
    for shard in manifest["splits"][split]["shards"]:
        ids = iter(shard["utt_ids"])
        for length_class, size in zip(shard["chunk_classes"], shard["chunk_sizes"]):
            classes.update({next(ids): length_class for _ in range(size)})
    return classes


def epoch_ids(out, cfg, size, epoch=0):
    per_rank = []
    for rank in range(size):
        ds, steps = dataset.asr_dataset(out, "train", cfg, rank=rank, size=size, epoch=epoch)
        batches = [[u.decode() for u in b["utt_id"]] for b in ds.as_numpy_iterator()]
        assert len(batches) == steps
        per_rank.append(batches)
    return per_rank


@pytest.mark.parametrize("size", [1, 2, 4])
def test_every_rank_takes_the_same_steps_from_the_same_class_and_sees_each_utterance_once(sharded, size):
    out, feats, _ = sharded
    classes = class_of_each_utterance(out)
    assert len(set(classes.values())) == 4, "the fixture must exercise several classes"
    for epoch in (0, 1):
        per_rank = epoch_ids(out, CFG, size, epoch)
        assert len({len(b) for b in per_rank}) == 1, [len(b) for b in per_rank]
        for step in zip(*per_rank):
            # one class per batch, and the same class on every rank in this step
            assert len({classes[u] for batch in step for u in batch}) == 1, step
        seen = [u for batches in per_rank for batch in batches for u in batch]
        assert sorted(seen) == sorted(feats), "an utterance was dropped or repeated"


def test_shards_that_ranks_cannot_share_equally_are_refused_with_the_fix(sharded):
    with pytest.raises(ValueError, match="--num-shards 6"):
        dataset.asr_dataset(sharded[0], "train", CFG, rank=0, size=3)
    with pytest.raises(ValueError, match="--num-shards 5"):
        dataset.asr_dataset(sharded[0], "train", CFG, rank=0, size=5)


def test_ranks_read_disjoint_shards_that_change_each_epoch(sharded):
    paths = [str(f.path) for f in sharded[0].split("train").files]
    e0 = [dataset.rank_files(paths, r, 2, 0, 0) for r in range(2)]
    e1 = [dataset.rank_files(paths, r, 2, 1, 0) for r in range(2)]
    assert sorted(e0[0] + e0[1]) == sorted(paths) and not set(e0[0]) & set(e0[1])
    assert e0 != e1


def test_batches_respect_the_frame_budget_and_hold_the_stored_features(sharded):
    out, feats, _ = sharded
    part = out.split("train")
    ds, _ = dataset.asr_dataset(out, "train", CFG)
    for batch in ds.as_numpy_iterator():
        b, t, d = batch["feats"].shape
        assert d == 13 and batch["feats"].dtype == np.float16
        assert t in part.max_lengths and t >= batch["feat_lengths"].max()  # padded to its class
        slots = max(part.slots)
        assert b * t <= max(CFG.frames_per_batch, slots * t)  # one record is the smallest batch
        for i, utt in enumerate(batch["utt_id"]):
            n = batch["feat_lengths"][i]
            assert n == len(feats[utt.decode()])
            np.testing.assert_array_equal(batch["feats"][i, :n], feats[utt.decode()].astype(np.float16))
            assert not batch["feats"][i, n:].any(), "padding is zero"
            assert batch["token_lengths"][i] == np.count_nonzero(batch["tokens"][i])


def test_speaker_cmvn_travels_with_the_batch_and_the_front_end_applies_it(sharded):
    out, feats, _ = sharded
    ds, _ = dataset.asr_dataset(out, "train", CFG, training=False)
    by_speaker = collections.defaultdict(list)
    for batch in ds:
        normalized = frontend.normalize(
            batch["feats"], batch["feat_scale"], batch["feat_offset"], batch["feat_lengths"]
        ).numpy()
        for i, utt in enumerate(batch["utt_id"].numpy()):
            n = int(batch["feat_lengths"][i])
            by_speaker[utt.decode().split("-")[0]].append(normalized[i, :n])
            assert not normalized[i, n:].any(), "normalized padding stays zero"
    assert len(by_speaker) == 4
    for frames in by_speaker.values():
        stacked = np.concatenate(frames)
        # float16 storage: the statistics come from the float32 originals
        np.testing.assert_allclose(stacked.mean(0), 0, atol=2e-2)
        np.testing.assert_allclose(stacked.std(0), 1, atol=2e-2)


def test_frame_stacking_and_subsampling():
    import tensorflow as tf

    x = tf.reshape(tf.range(2 * 5 * 2, dtype=tf.float32), [2, 5, 2])
    stacked, lengths = frontend.stack_and_subsample(x, tf.constant([5, 3]), stack=3, subsample=2)
    assert stacked.shape == (2, 3, 6) and lengths.numpy().tolist() == [3, 2]
    np.testing.assert_array_equal(stacked[0, 1], np.concatenate([x[0, 2], x[0, 3], x[0, 4]]))
    np.testing.assert_array_equal(stacked[0, 2], np.concatenate([x[0, 4], [0, 0], [0, 0]]))


def test_synthesis_batches(sharded):
    out, feats, texts = sharded
    ds, steps = dataset.tts_dataset(out, "train", CFG)
    count = 0
    mean, std = dataset.mel_stats(out)
    for batch in ds.as_numpy_iterator():
        count += 1
        for i, utt in enumerate(batch["utt_id"]):
            n = batch["mel_lengths"][i]
            assert n == len(feats[utt.decode()])
            expected = (feats[utt.decode()].astype(np.float16).astype(np.float32) - mean) / std
            np.testing.assert_allclose(batch["mels"][i, :n], expected, rtol=1e-5, atol=1e-5)
            stops = batch["stop_targets"][i]
            assert stops[: n - 1].sum() == 0 and stops[n - 1 :].min() == 1
            assert batch["token_lengths"][i] == len(texts[utt.decode()])
    assert count == steps
    everything = np.concatenate(list(feats.values()))
    np.testing.assert_allclose(mean, everything.mean(0), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(std, everything.std(0), rtol=1e-3)


@pytest.mark.slow
def test_under_horovodrun_both_ranks_get_equal_batches_of_one_class_covering_the_epoch(sharded):
    out, feats, _ = sharded
    classes = class_of_each_utterance(out)
    proc = horovodrun(["tests/scripts/epoch_ids.py", str(out.root)], np=2, timeout=300)
    per_rank = {}
    for rank, payload in re.findall(r"EPOCH rank=(\d) (.*)", proc.stdout):
        per_rank[int(rank)] = json.loads(payload)
    assert sorted(per_rank) == [0, 1], proc.stdout
    for epoch in ("0", "1"):
        assert len(per_rank[0][epoch]) == len(per_rank[1][epoch])
        for a, b in zip(per_rank[0][epoch], per_rank[1][epoch]):
            assert len({classes[u] for u in a + b}) == 1
        seen = [u for r in (0, 1) for batch in per_rank[r][epoch] for u in batch]
        assert sorted(seen) == sorted(feats)


def test_spec_augment_masks_each_utterance_within_its_length_reproducibly():
    import tensorflow as tf

    x = tf.ones([3, 200, 80])
    lengths = tf.constant([200, 120, 60])
    cfg = AugmentConfig(freq_masks=2, freq_mask_width=10, time_masks=2, time_mask_fraction=0.05)
    masked = frontend.spec_augment(x, lengths, cfg, tf.constant([3, 4], tf.int64)).numpy()
    for i, n in enumerate(lengths.numpy()):
        utt = masked[i, :n]
        zero_bins, zero_frames = (utt == 0).all(0).sum(), (utt == 0).all(1).sum()
        assert 0 < zero_bins <= 20 and 0 < zero_frames <= 2 * max(1, int(0.05 * n))
    assert not np.array_equal(masked[0, :60], masked[2, :60]), "each utterance draws its own masks"
    again = frontend.spec_augment(x, lengths, cfg, tf.constant([3, 4], tf.int64)).numpy()
    np.testing.assert_array_equal(masked, again)  # stateless: reproducible from the seed
    other = frontend.spec_augment(x, lengths, cfg, tf.constant([3, 5], tf.int64)).numpy()
    assert not np.array_equal(masked, other)


def test_vtlp_moves_a_formant_by_its_warp_and_keeps_padding():
    import tensorflow as tf

    dim = 80
    peak = np.zeros([3, 4, dim], np.float32)
    peak[:, :3, 30] = 1.0  # one band sounding in 3 of 4 frames; the 4th frame is padding
    x = tf.constant(peak)
    same = frontend.vtlp(x, (1.0, 1.0), tf.constant([1, 2], tf.int64)).numpy()
    np.testing.assert_allclose(same, peak, atol=1e-5)
    up = frontend.vtlp(x, (1.3, 1.3), tf.constant([1, 2], tf.int64)).numpy()
    down = frontend.vtlp(x, (0.8, 0.8), tf.constant([1, 2], tf.int64)).numpy()

    def centre(batch):  # the band's centre of gravity, in bins
        return (batch[0, 0] * np.arange(dim)).sum() / batch[0, 0].sum()

    assert centre(up) > 31.5 and centre(down) < 28.5
    assert (up[:, 3] == 0).all() and (down[:, 3] == 0).all(), "padding frames stay zero"
    drawn = frontend.vtlp(x, (0.9, 1.2), tf.constant([5, 6], tf.int64)).numpy()
    again = frontend.vtlp(x, (0.9, 1.2), tf.constant([5, 6], tf.int64)).numpy()
    np.testing.assert_array_equal(drawn, again)  # stateless: reproducible from the seed
    assert not np.array_equal(drawn[0], drawn[1]), "each utterance draws its own warp"
    traced = tf.function(  # as the training step is traced: every dimension unknown
        lambda f, seed: frontend.vtlp(f, (0.9, 1.2), seed),
        input_signature=[tf.TensorSpec([None, None, None], tf.float32), tf.TensorSpec([2], tf.int64)],
    )
    np.testing.assert_allclose(traced(x, tf.constant([5, 6], tf.int64)).numpy(), drawn, atol=1e-4)


def test_the_acoustic_task_augments_in_training_steps_only(sharded):
    from models.asr import network as asr
    from models.asr.task import AsrTask

    out, _, _ = sharded
    batch = next(iter(dataset.asr_dataset(out, "train", CFG)[0]))
    augment = AugmentConfig(spec_augment=True, freq_masks=2, freq_mask_width=6)
    config = asr.AsrConfig(feature_dim=13, vocab_size=40, num_layers=1, units=4, projection=0)
    task = AsrTask(dataclasses.replace(config, augment=augment))
    seen = []

    class Recorder:
        def __call__(self, feats, lengths, training=False):
            seen.append(feats.numpy())
            raise StopIteration

    for training in (True, False):
        with pytest.raises(StopIteration):
            task.loss(Recorder(), batch, training=training, seed=np.asarray([1, 2], np.int64))
    clean = AsrTask.features(batch).numpy()
    assert not np.array_equal(seen[0], clean) and np.array_equal(seen[1], clean)
    assert AsrTask(config).augment is None  # spec_augment off: nothing to apply
    warped = AsrTask(dataclasses.replace(config, augment=AugmentConfig(vtlp_range=(1.1, 1.2))))
    with pytest.raises(StopIteration):
        warped.loss(Recorder(), batch, training=True, seed=np.asarray([1, 2], np.int64))
    assert not np.array_equal(seen[2], clean), "VTLP alone augments too"
    with pytest.raises(ValueError, match="vtlp_range"):
        AugmentConfig(vtlp_range=(1.2, 1.1))


def test_augmentation_starts_at_its_step_in_one_traced_graph(sharded):
    """`augment_from_step`: the training step's features as they are before that step, and from it
    on what the task augmenting from the first step gives for the same seed; the step comes in the
    seed, so one trace serves every step."""
    import tensorflow as tf

    from models.asr import network as asr
    from models.asr.task import AsrTask

    out, _, _ = sharded
    batch = next(iter(dataset.asr_dataset(out, "train", CFG)[0]))
    augment = AugmentConfig(spec_augment=True, freq_masks=2, freq_mask_width=6, vtlp_range=(0.9, 1.1))
    config = asr.AsrConfig(feature_dim=13, vocab_size=40, num_layers=1, units=4, projection=0)
    always = AsrTask(dataclasses.replace(config, augment=augment))
    later = AsrTask(dataclasses.replace(config, augment=dataclasses.replace(augment, augment_from_step=3)))
    spec = tf.nest.map_structure(lambda t: tf.TensorSpec([None] * t.shape.rank, t.dtype), batch)

    def features_of(task):
        def fn(b, seed):
            return task._augmented(task.features(b), b, seed)

        return tf.function(fn, input_signature=[spec, tf.TensorSpec([2], tf.int64)], autograph=False)

    traced_always, traced_later = features_of(always), features_of(later)
    clean = AsrTask.features(batch).numpy()
    for step in (1, 2, 3, 7):
        seed = tf.constant([5, step], tf.int64)
        got, augmented = traced_later(batch, seed).numpy(), traced_always(batch, seed).numpy()
        assert not np.array_equal(augmented, clean)
        np.testing.assert_array_equal(got, clean if step < 3 else augmented, err_msg=f"step {step}")
    with pytest.raises(ValueError, match="augment_from_step"):
        AugmentConfig(augment_from_step=-1)


def test_epochs_chain_with_the_next_one_produced_before_the_current_one_is_consumed():
    """No bubble at epoch boundaries: the next epoch's first batch exists (was produced into the
    prefetch buffer) while the current epoch's last batch has not been taken yet."""
    import tensorflow as tf

    produced = []

    def make_epoch(epoch):
        def record(x):
            produced.append(int(x))
            return x

        items = tf.data.Dataset.range(epoch * 10, epoch * 10 + 4)
        return items.map(lambda x: tf.py_function(record, [x], tf.int64))

    iterator = iter(dataset.chain_epochs(make_epoch, 0, 3, skip=1, prefetch=2))
    taken = [int(next(iterator))]
    assert taken == [1]  # epoch 0 resumed after one batch
    taken += [int(next(iterator))]  # 2: the last batch of epoch 0 (3) is still in the buffer
    deadline = time.monotonic() + 10
    while 10 not in produced and time.monotonic() < deadline:
        time.sleep(0.01)
    assert 10 in produced and 3 not in taken, (produced, taken)
    assert taken + [int(x) for x in iterator] == [1, 2, 3, 10, 11, 12, 13, 20, 21, 22, 23]


def test_the_batches_run_without_tf_datas_autotuning_thread(sharded):
    """tf.data's tuning thread made a rank's iterator take 5-55 s to be destroyed after its last
    training step (the other ranks waiting in the next collective): every dataset the trainer and
    the evaluation iterate, and the chain of epochs over them, has autotuning off."""
    out, _, _ = sharded
    training, _ = dataset.asr_dataset(out, "train", CFG, rank=0, size=2, epoch=0)
    evaluation, _ = dataset.asr_dataset(out, "test", CFG, training=False)
    chained = dataset.chain_epochs(
        lambda e: dataset.asr_dataset(out, "train", CFG, rank=1, size=2, epoch=e)[0], 0, 2, prefetch=2
    )
    for ds in (training, evaluation, chained):
        assert ds.options().autotune.enabled is False
    assert sum(1 for _ in chained) > 0
