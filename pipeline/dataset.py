"""The tf.data input pipeline: shards -> normalized, length-bucketed, prefetched batches.

Built so the accelerator never waits for data. The shards hold *chunks* of a few utterances of one
length class (pipeline/records.py), and every shard the same sequence of classes. Each Horovod rank
reads its own, equally many shards, interleaved record by record, so every rank sees the same
sequence of classes; the chunks are shuffled with a seed every rank shares (a shuffle's order
depends only on its seed and the number of elements), grouped by class into batches of a frame
budget, and only then parsed, a whole batch of chunks at once: one `parse_example`, one decode of
the concatenated float16 frames, normalization and padding as whole-batch operations. Nothing is
sorted globally, so the first batch arrives after one shuffle buffer, however large the corpus.

What this gives a synchronous (allreduce) job: every rank takes the same number of steps per
epoch, and in every step all ranks' batches come from the same length class, so their steps cost
the same and no rank waits for a longer batch. Every utterance is seen exactly once per epoch. The
epochs of a run form one dataset with one prefetch buffer around them all, so the next epoch's
first batches are ready while the current one ends.
"""

from __future__ import annotations

import dataclasses
import math
import random
import weakref
from collections.abc import Callable

import numpy as np

from pipeline import frontend, records
from pipeline.augment_config import CLEAN_SPLIT
from pipeline.input_config import InputConfig

AUTOTUNE = -1


# ----------------------------------------------------------------------------------------------
# The batch plan: known in advance from the split's layout, identical on every rank.


@dataclasses.dataclass(frozen=True)
class BatchPlan:
    chunks_per_batch: tuple[int, ...]  # per length class: chunks grouped into one batch
    batches: int  # batches of one epoch for one rank
    files_per_rank: int  # shards each rank reads per epoch


def batch_plan(part: records.SplitShards, size: int, cfg: InputConfig, training: bool, files: int = 0) -> BatchPlan:
    """How the chunks of a split (`ShardSet.split`) become batches for `size` ranks. Training needs
    the same number of shards on every rank (that keeps the ranks' class sequences equal):
    ValueError with the fix otherwise. `files`: evaluation only, the number of shards this rank
    reads (evaluation batch counts are for progress bars only)."""
    count = len(part.files)
    if training and count < size:
        raise ValueError(
            f"split {part.name!r} has {count} shards for {size} ranks: every rank needs at least one; "
            f"re-run `python -m pipeline.shards ... --num-shards {size}` (or more)"
        )
    if training and count % size:
        multiple = size * math.ceil(count / size)
        raise ValueError(
            f"split {part.name!r} has {count} shards for {size} ranks: every rank must read the same number of "
            f"shards so that their batches line up; re-shard with `python -m pipeline.shards ... "
            f"--num-shards {multiple}` (a multiple of the number of ranks)"
        )
    per_rank = count // size if training else files
    k = tuple(
        max(1, min(cfg.max_batch_size // slots, cfg.frames_per_batch // (slots * max(1, longest))))
        for longest, slots in zip(part.max_lengths, part.slots)
    )
    chunks_per_class = np.bincount(part.class_sequence, minlength=len(k)) * per_rank
    batches = sum(math.ceil(n / kc) for n, kc in zip(chunks_per_class, k))
    return BatchPlan(k, int(batches), per_rank)


def file_seed(seed: int, epoch: int) -> int:
    """The seed of an epoch's order of shard files (every reader of the shards uses it)."""
    return seed * 100003 + epoch


def chunk_seed(seed: int, epoch: int) -> int:
    """The seed of an epoch's shuffle of chunks (every reader of the shards uses it)."""
    return seed * 1009 + epoch


def rank_files(paths: list[str], rank: int, size: int, epoch: int, seed: int) -> list[str]:
    """The shards `rank` reads in `epoch`: a permutation all ranks agree on, dealt out.

    The permutation changes each epoch, so a rank does not see the same partition forever (that
    matters for gossip training, where a worker's data shapes its model between averagings).
    """
    order = list(range(len(paths)))
    random.Random(file_seed(seed, epoch)).shuffle(order)
    return [paths[i] for i in order[rank::size]]


# ----------------------------------------------------------------------------------------------
# Normalization


def cmvn_tables(part: records.SplitShards, mode: str):
    """(speaker names, means [S+1, D], inverse stds [S+1, D]) of a split; the last row is the
    split-wide fallback."""
    names = list(part.cmvn_speakers)
    matrices = part.cmvn_stats  # [S, 2, D+1]
    dim = matrices.shape[2] - 1
    total = matrices.sum(axis=0)  # [2, D+1]; zeros when the split has no speakers
    rows = [*matrices, total] if mode == "speaker" else [total] * (len(names) + 1)
    means, inv_stds = [], []
    for m in rows:
        count = max(m[0, dim], 1.0)
        mean = m[0, :dim] / count
        var = np.maximum(m[1, :dim] / count - mean * mean, 1e-8)
        if mode == "none":
            mean, var = np.zeros(dim), np.ones(dim)
        means.append(mean)
        inv_stds.append(1.0 / np.sqrt(var))
    return names, np.asarray(means, np.float32), np.asarray(inv_stds, np.float32)


def mel_stats(shards: records.ShardSet, split: str = "train") -> tuple[np.ndarray, np.ndarray]:
    """Global (mean, std) [D] of a split's features: the synthesis model's target normalization."""
    _, means, inv_stds = cmvn_tables(shards.split(split), "global")
    return means[-1], 1.0 / inv_stds[-1]


def _speaker_stats(part: records.SplitShards, mode: str):
    """`stats(speakers [N]) -> (mean [N, D], inverse std [N, D])`: each utterance's CMVN statistics."""
    import tensorflow as tf

    if mode not in ("speaker", "global", "utterance", "none"):
        raise ValueError(f"cmvn must be 'speaker', 'global', 'utterance' or 'none', got {mode!r}")
    # "utterance": the batch's affine map only dequantizes; the training step normalizes each
    # utterance by its own statistics (pipeline/frontend.py, flagged by `utterance_cmvn`).
    names, means, inv_stds = cmvn_tables(part, "none" if mode == "utterance" else mode)
    table = tf.lookup.StaticHashTable(
        tf.lookup.KeyValueTensorInitializer(
            tf.constant(names or [""], tf.string), tf.range(max(1, len(names)), dtype=tf.int64)
        ),
        default_value=len(names),
    )
    means, inv_stds = tf.constant(means), tf.constant(inv_stds)

    def stats(speakers):
        rows = table.lookup(speakers)  # [N]; unknown speakers get the split-wide row
        return tf.gather(means, rows), tf.gather(inv_stds, rows)

    return stats


# ----------------------------------------------------------------------------------------------
# Reading


def group_by_class(stream, chunks_per_batch):
    """(serialized chunk, its class) elements -> batches (serialized [k], classes [k]) of one class
    each, `k = chunks_per_batch[class]`; a class's last batch of a finite stream may be short."""
    import tensorflow as tf

    k = tf.constant(chunks_per_batch, tf.int64)
    largest = int(max(chunks_per_batch))
    return stream.group_by_window(
        key_func=lambda serialized, key: key,
        reduce_func=lambda key, window: window.batch(largest),
        window_size_func=lambda key: k[key],
    )


def _chunk_stream(files, keys, compression_type: str, cfg: InputConfig, training: bool, epoch: int, plan: BatchPlan):
    """Chunks of `files` (a string tensor), grouped into batches by class: (serialized [k], keys [k]).

    The files are read interleaved record by record; `keys` are the chunks' classes in that order
    (the split's layout knows them). Training shuffles with the seed every rank shares: a shuffle's
    permutation depends on the seed and the element count only, so the ranks' class sequences stay
    equal."""
    import tensorflow as tf

    stream = tf.data.Dataset.from_tensor_slices(files).interleave(
        lambda path: tf.data.TFRecordDataset(path, compression_type=compression_type),
        cycle_length=plan.files_per_rank if training else 1,
        block_length=1,
        num_parallel_calls=AUTOTUNE,
        deterministic=True,  # the order `keys` describe
    )
    stream = tf.data.Dataset.zip(stream, tf.data.Dataset.from_tensor_slices(keys))
    if training:
        stream = stream.shuffle(cfg.shuffle_buffer, seed=chunk_seed(cfg.seed, epoch), reshuffle_each_iteration=False)
    return group_by_class(stream, plan.chunks_per_batch)


def unordered_chunks(part: records.SplitShards, compression_type: str, cfg: InputConfig, epoch: int, passes):
    """(serialized chunk, its class) of every shard of `part`, `passes` times (None: forever), the
    files in a new order every pass and the chunks shuffled: for readers that get whichever files a
    tf.data service dispatcher hands them, so the split's class sequence does not apply and each
    chunk's class is read from the record itself."""
    import tensorflow as tf

    paths = [str(f.path) for f in part.files]
    files = tf.data.Dataset.from_tensor_slices(paths).shuffle(
        len(paths), seed=file_seed(cfg.seed, epoch), reshuffle_each_iteration=True
    )
    stream = (
        files.repeat(passes)
        .interleave(
            lambda path: tf.data.TFRecordDataset(path, compression_type=compression_type),
            cycle_length=min(len(paths), 4),
            num_parallel_calls=AUTOTUNE,
        )
        .shuffle(cfg.shuffle_buffer, seed=chunk_seed(cfg.seed, epoch))
    )
    return stream.map(lambda serialized: (serialized, records.parse_class(serialized)))


def _batches(shards: records.ShardSet, part: records.SplitShards, cfg, rank, size, epoch, training, assemble):
    """The part both models share: this rank's chunks of split `part`, grouped into batches by
    class, parsed and assembled by `assemble(batch_index, serialized [k], keys [k]) -> batch`."""
    paths = [str(f.path) for f in part.files]
    # Every file follows the split's class sequence (checked when the shard set was opened).
    sequence = np.asarray(part.class_sequence, np.int64)
    if training:
        plan = batch_plan(part, size, cfg, training=True)
        files = rank_files(paths, rank, size, epoch, cfg.seed)
        # Record j of every file (round robin over the rank's files) has class sequence[j].
        keys = np.repeat(sequence, plan.files_per_rank)
    else:
        mine = list(range(len(paths)))[rank::size]
        plan = batch_plan(part, size, cfg, training=False, files=len(mine))
        files = [paths[i] for i in mine]
        keys = np.tile(sequence, len(mine))  # the files one after the other
    grouped = _chunk_stream(files, keys, shards.compression_type, cfg, training, epoch, plan)
    # deterministic: the batches keep the order of the class sequence (the ranks' lockstep).
    dataset = grouped.enumerate().map(
        lambda i, batch: assemble(i, *batch), num_parallel_calls=AUTOTUNE, deterministic=True
    )
    return without_autotuner(dataset), plan.batches


def without_autotuner(dataset):
    """`dataset` with tf.data's autotuning off: every AUTOTUNE parallelism is tf.data's starting
    value (the smaller of 16 and its thread pool's size) and no tuning thread runs.

    Why: with TensorFlow 2.17 an iterator's destructor waits for the tuning thread, which sleeps in
    a timed wait for its next optimization. A rank that finished its training steps waited there
    5-55 s while the other ranks waited for it in the next collective (its stack:
    `~RootDataset::Iterator` waiting for the thread in `Model::OptimizeLoop`). The batches here cost
    milliseconds, so a tuned parallelism buys nothing. The option is set on every epoch's dataset;
    the chain of epochs and its prefetch inherit it."""
    import tensorflow as tf

    options = tf.data.Options()
    options.autotune.enabled = False
    return dataset.with_options(options)


def _without_empty_slots(batch: dict, lengths) -> dict:
    """The batch without the rows of empty record slots (only the last length class has them)."""
    import tensorflow as tf

    real = tf.where(lengths > 0)[:, 0]
    return tf.cond(
        tf.size(real) == tf.size(lengths),
        lambda: batch,
        lambda: {key: tf.gather(value, real) for key, value in batch.items()},
    )


def asr_assembler(shards: records.ShardSet, part: records.SplitShards, cfg: InputConfig):
    """`assemble(batch index, serialized chunks [k], their classes [k]) -> batch` of the acoustic
    model for split `part` of `shards` (see `asr_dataset`), for the local pipeline and the tf.data
    service alike."""
    import tensorflow as tf

    with_targets, with_phones = shards.num_targets > 0, bool(shards.phone_vocabulary)
    dim, dtype = shards.feature_dim, shards.feature_dtype
    stats = _speaker_stats(part, cfg.cmvn)
    padded = tf.constant(part.max_lengths, tf.int32)  # [classes]

    def assemble(index, serialized, keys):
        chunk = records.parse_chunks(serialized, padded[keys[0]], dim, dtype, with_targets, with_phones=with_phones)
        tf.debugging.assert_equal(chunk["class"], keys, message="a chunk is not of the class the manifest says")
        # feats [N, T, D] as stored and their map to normalized features, as serving builds them from audio
        acoustic = frontend.acoustic_batch(
            chunk["feats"], chunk["lengths"], chunk["dequant"], stats(chunk["speaker"]), cfg.cmvn
        )
        out = {
            **acoustic,
            "tokens": chunk["tokens"].to_tensor(),  # [N, L] 0-padded
            "token_lengths": tf.cast(chunk["tokens"].row_lengths(), tf.int32),
            "utt_id": chunk["utt_id"],
            "speaker": chunk["speaker"],
        }
        if with_targets:
            out["targets"] = chunk["targets"].to_tensor(default_value=-1, shape=[None, padded[keys[0]]])
        if with_phones:
            out["phones"] = chunk["phones"].to_tensor()  # [N, P] 0-padded
            out["phone_lengths"] = tf.cast(chunk["phones"].row_lengths(), tf.int32)
        return _without_empty_slots(out, chunk["lengths"])

    return assemble


def asr_dataset(
    shards: records.ShardSet,
    split: str,
    cfg: InputConfig,
    rank: int = 0,
    size: int = 1,
    epoch: int = 0,
    training: bool = True,
):
    """Batches for the acoustic model from `split` of `shards` (`records.open_shard_set`), for one
    epoch of one rank. Returns (dataset, batches).

    Each element: `feats` [B, T, D] the stored features as they are (uint8 codes or float log-mel,
    padded to the class's longest utterance), `feat_lengths` int32 [B], `feat_scale` and
    `feat_offset` float32 [B, D] (feats * scale + offset = the speaker-normalized log-mel: the
    training step applies it with pipeline/frontend.py), `utterance_cmvn` bool [B] (cmvn="utterance":
    the step then normalizes each utterance by its own statistics), `tokens` int32 [B, L] (0-padded),
    `token_lengths` int32 [B], `utt_id` and `speaker` string [B], `targets` int32 [B, T]
    (-1-padded) when the shards carry frame targets, and `phones` int32 [B, P] (0-padded) and
    `phone_lengths` int32 [B] when they carry phone targets (pipeline/phones.py). `training=False`:
    this rank's share of the shards in order, unshuffled (evaluation).
    """
    part = shards.split(split)
    return _batches(shards, part, cfg, rank, size, epoch, training, _traced_once(asr_assembler, shards, part, cfg))


def tts_assembler(shards: records.ShardSet, part: records.SplitShards, cfg: InputConfig):
    """`assemble(batch index, serialized chunks [k], their classes [k]) -> batch` of the synthesis
    model for split `part` of `shards` (see `tts_dataset`)."""
    import tensorflow as tf

    dim, dtype = shards.feature_dim, shards.feature_dtype
    # The training split's statistics when the set has one (a model normalizes as it trained); the
    # synthesis model trains on the clean split only, never on the augmented copies (train_aug).
    _, means, inv_stds = cmvn_tables(shards.splits.get(CLEAN_SPLIT, part), "global")
    mean, std = tf.constant(means[-1], tf.float32), tf.constant(1.0 / inv_stds[-1], tf.float32)  # [D] each
    padded = tf.constant(part.max_lengths, tf.int32)  # [classes]
    with_phonemes = bool(shards.phonemes)

    def assemble(index, serialized, keys):
        chunk = records.parse_chunks(serialized, padded[keys[0]], dim, dtype, with_phonemes=with_phonemes)
        tf.debugging.assert_equal(chunk["class"], keys, message="a chunk is not of the class the manifest says")
        lengths = chunk["lengths"]
        if with_phonemes:
            phonemes = {
                "phonemes": chunk["phonemes"].to_tensor(),  # [N, P] 0-padded
                "phoneme_lengths": tf.cast(chunk["phonemes"].row_lengths(), tf.int32),
            }
        else:
            phonemes = {}
        scale, offset = chunk["dequant"]  # stored -> log-mel
        mels = frontend.normalize(chunk["feats"], scale / std, (offset - mean) / std, lengths)  # [N, T, D]
        frames = tf.range(tf.shape(mels)[1])[None, :]  # [1, T]
        return _without_empty_slots(
            {
                "tokens": chunk["tokens"].to_tensor(),
                "token_lengths": tf.cast(chunk["tokens"].row_lengths(), tf.int32),
                "mels": mels,
                "mel_lengths": lengths,
                "stop_targets": tf.cast(frames >= lengths[:, None] - 1, tf.float32),  # [N, T]
                "utt_id": chunk["utt_id"],
                "speaker": chunk["speaker"],
                **phonemes,
            },
            lengths,
        )

    return assemble


def tts_dataset(
    shards: records.ShardSet,
    split: str,
    cfg: InputConfig,
    rank: int = 0,
    size: int = 1,
    epoch: int = 0,
    training: bool = True,
):
    """Batches for the synthesis model from `split` of `shards` (`records.open_shard_set`), for one
    epoch of one rank. Returns (dataset, batches).

    Each element: `tokens` int32 [B, N], `token_lengths` int32 [B], `mels` float32 [B, T, D]
    (log-mel normalized with the training split's global mean and std), `mel_lengths` int32 [B],
    `stop_targets` float32 [B, T] (1 from the last real frame on), `utt_id` and `speaker` string [B],
    and for shards written with phonemes `phonemes` int32 [B, P] (0-padded) and `phoneme_lengths` [B].
    """
    part = shards.split(split)
    return _batches(shards, part, cfg, rank, size, epoch, training, _traced_once(tts_assembler, shards, part, cfg))


# split -> {(assembler maker, input config): its assembler traced once}; gone with the split's shard set
_ASSEMBLERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _traced_once(make: Callable, shards: records.ShardSet, part: records.SplitShards, cfg: InputConfig):
    """`make(shards, part, cfg)` as one graph, traced at its first use and kept for the split: every
    epoch's `map` then calls that graph instead of tracing the parser again (building the demo's
    28 epochs on one rank of a 2-core CPU: 3.4 s instead of 7.8)."""
    import tensorflow as tf

    traced = _ASSEMBLERS.setdefault(part, {})
    key = (make, cfg)
    if key not in traced:
        signature = [tf.TensorSpec([], tf.int64), tf.TensorSpec([None], tf.string), tf.TensorSpec([None], tf.int64)]
        traced[key] = tf.function(make(shards, part, cfg), input_signature=signature, autograph=False)
    return traced[key]


@dataclasses.dataclass(frozen=True)
class Pipeline:
    """How one kind of batch is read from the shards: `batches(shards, split, cfg, rank, size, epoch,
    training) -> (dataset, count)` for a rank's own reading, and `assembler(shards, part, cfg) ->
    assemble(batch index, serialized [k], classes [k]) -> batch` for readers that group the chunks
    themselves (the tf.data service). A model's task names its own (models/interfaces.py)."""

    batches: Callable
    assembler: Callable


ASR = Pipeline(asr_dataset, asr_assembler)
TTS = Pipeline(tts_dataset, tts_assembler)


def chain_epochs(make_epoch: Callable, first_epoch: int, epochs: int, skip: int = 0, prefetch: int = 8):
    """The batches of epochs first_epoch..epochs-1 as ONE dataset, with no bubble at epoch boundaries.

    `make_epoch(epoch) -> dataset` builds one epoch. `skip` batches of the first epoch are skipped
    (resuming). The prefetch buffer sits around all epochs together: while the last batches of an
    epoch wait in it to be taken, the next epoch's pipeline is already filling it (a prefetch inside
    each epoch would start that epoch's reads only when the previous one was exhausted).

    Why a chain of per-epoch datasets rather than `flat_map` over epoch numbers: each epoch's
    shuffle needs its own seed, and `Dataset.shuffle` takes only a Python integer as its seed.
    The epochs are chained as a balanced tree, so a long run does not nest thousands deep.
    """
    if epochs <= first_epoch:
        raise ValueError(f"no epochs to run: first_epoch={first_epoch}, epochs={epochs}")
    parts = [make_epoch(epoch) for epoch in range(first_epoch, epochs)]
    if skip:
        parts[0] = parts[0].skip(skip)
    while len(parts) > 1:
        pairs = [parts[i].concatenate(parts[i + 1]) for i in range(0, len(parts) - 1, 2)]
        parts = pairs + parts[len(parts) - len(parts) % 2 :]
    return parts[0].prefetch(prefetch)
