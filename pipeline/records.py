"""The shard store's format in one place: file names, the manifest, and the record (its `SCHEMA`, which
the writer, the reader's parsing spec and the tf.data service all follow).

The shard stage fills it (pipeline/shards.py), the input pipeline reads it (pipeline/dataset.py),
and nothing else knows how a record is laid out.

Format 2. A record is a *chunk*: `slots` utterances of one length class, as one tf.train.Example.
Its features are one block [slots, T, D] in the storage dtype, each utterance zero-padded to T, the
longest length of its class; so every record of a class has the same shape, and a batch of them
is decoded by one `decode_raw` into [k * slots, T, D] with no per-utterance padding or copying.
Beside the block: lengths (0 marks an empty slot), ids, speakers, transcripts, token ids, and in
shards written with phonemes (`pipeline/phonemes.py`) each transcript's phoneme ids.

Storage dtypes: "uint8" (8-bit codes, linear between each dimension's minimum and maximum in the
chunk, stored with the record; the dequantization is an affine map that the training step merges
with CMVN, like Kaldi's compressed matrices but with one range per chunk), "float16", "float32".
Bytes per 80-dim frame: 80, 160, 320. Reading and copying bytes is what bounds the input on a CPU,
so a record holds a whole chunk and is decoded with one copy.

Every shard of a split holds the same number of chunks of each length class, in the same order
(`class_sequence` in the manifest). So any rank that reads the same number of shards, interleaved
record by record, sees the same sequence of classes as every other rank: the input pipeline builds
its batches from that sequence alone, and every rank's batch of a step comes from the same class.

Readers open a shard directory once (`open_shard_set`): the manifest is read, its format version
and every split's layout checked, and what the input pipeline needs (files, layout, statistics,
vocabulary) handed on as one frozen `ShardSet`, so no reader looks anything up in the manifest again.

Format 1 is refused with the command that rewrites the shards.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np

from common import fsutil

MANIFEST = "manifest.json"
FORMAT_VERSION = 2
COMPRESSION = {"none": "", "gzip": "GZIP"}  # our name -> TensorFlow's compression_type
FEATURE_DTYPES = {"uint8": "u1", "float16": "<f2", "float32": "<f4"}  # how features are stored -> numpy dtype


# The record: one tf.train.Example per chunk. Each key's value type and how many values it holds:
# "chunk" one, "slot" one per slot (`lengths` 0 marks an empty slot), "token" the slots' token ids
# concatenated, "phoneme" the slots' phoneme ids concatenated, "phone" the slots' phone targets
# concatenated, "frame" the slots' frame targets concatenated, "dim" one per feature dimension.
# `when`: present only for uint8 storage ("uint8"), for shards with frame targets ("targets"), for
# shards written with phonemes ("phonemes") or with phone targets of a lexicon ("phones").
@dataclasses.dataclass(frozen=True)
class Field:
    kind: str  # "int64", "bytes" or "float"
    count: str  # "chunk", "slot", "token", "phoneme", "phone", "frame" or "dim"
    when: str = ""


SCHEMA = {
    "class": Field("int64", "chunk"),  # the length class of every utterance of the chunk
    "utt_ids": Field("bytes", "slot"),
    "speakers": Field("bytes", "slot"),
    "transcripts": Field("bytes", "slot"),
    "lengths": Field("int64", "slot"),  # frames of each utterance
    "feats": Field("bytes", "chunk"),  # the block [slots, T, D] in the storage dtype (encode_block)
    "token_lengths": Field("int64", "slot"),
    "tokens": Field("int64", "token"),
    "quant_min": Field("float", "dim", when="uint8"),  # x = code * quant_step + quant_min
    "quant_step": Field("float", "dim", when="uint8"),
    "targets": Field("int64", "frame", when="targets"),
    "phoneme_lengths": Field("int64", "slot", when="phonemes"),
    "phonemes": Field("int64", "phoneme", when="phonemes"),
    "phone_lengths": Field("int64", "slot", when="phones"),
    "phones": Field("int64", "phone", when="phones"),  # ids into the manifest's phone_vocabulary
}


def shard_name(split: str, index: int, count: int, compression: str) -> str:
    return f"{split}-{index:05d}-of-{count:05d}.tfrecord" + (".gz" if compression == "gzip" else "")


def rewrite_command(out_dir: Path, data_dirs: dict[str, str]) -> str:
    """The shard stage's command line that writes `out_dir` again from the splits' data dirs."""
    splits = " ".join(f"--split {name}={data_dir}" for name, data_dir in data_dirs.items())
    return f"python -m pipeline.shards {splits or '--split train=DATA/train ...'} --out {out_dir}"


def load_manifest(out_dir: Path) -> dict:
    """The manifest of a shard directory as stored; FileNotFoundError or ValueError with the fix when
    it is missing or of another format version. Readers want `open_shard_set`."""
    path = Path(out_dir) / MANIFEST
    manifest = fsutil.read_json(path)
    if manifest is None:
        raise FileNotFoundError(f"{path} does not exist: run `python -m pipeline.shards ... --out {out_dir}` first")
    version = manifest.get("version")
    if version != FORMAT_VERSION:
        kind = {1: " (one tf.train.Example of float32 features per utterance)"}.get(version, "")
        data_dirs = {name: split["data_dir"] for name, split in manifest.get("splits", {}).items()}
        raise ValueError(
            f"{path}: the shards are in format version {version}{kind}; this speechflow reads format "
            f"{FORMAT_VERSION} (chunks of same-length utterances, uint8, float16 or float32 features). "
            f"Rewrite them with `{rewrite_command(Path(out_dir), data_dirs)}` "
            "(the shard stage replaces shards of another format)"
        )
    return manifest


# ----------------------------------------------------------------------------------------------
# The shard set: a shard directory, read and checked once, for every reader


@dataclasses.dataclass(frozen=True)
class ShardFile:
    path: Path  # the TFRecord file
    bytes: int  # its size when written
    sha256: str  # its content when written


@dataclasses.dataclass(frozen=True, eq=False)
class SplitShards:
    """One split of a shard set: its files, the layout every one of them follows, its statistics."""

    name: str
    data_dir: str  # the Kaldi data directory the split was made from
    utterances: int
    frames: int
    speakers: tuple[str, ...]  # the speakers of its utterances, sorted
    cmvn_speakers: tuple[str, ...]  # the rows of `cmvn_stats`, sorted
    cmvn_stats: np.ndarray  # [S, 2, D+1] float64 Kaldi CMVN statistics per speaker (read-only)
    files: tuple[ShardFile, ...]  # in the manifest's order (by file name)
    class_sequence: tuple[int, ...]  # the length class of each record position, the same in every file
    max_lengths: tuple[int, ...]  # per length class: its longest utterance = its records' padded length T
    slots: tuple[int, ...]  # per length class: utterances per record


@dataclasses.dataclass(frozen=True, eq=False)
class ShardSet:
    """A shard directory as its manifest describes it; made by `open_shard_set`."""

    root: Path  # the directory: manifest.json and the shard files
    fingerprint: dict  # the shard stage's inputs, config and code (what a rebuild compares)
    feature_dim: int  # D
    feature_dtype: str  # how features are stored: "uint8", "float16" or "float32"
    compression_type: str  # TensorFlow's name for the files' compression ("" or "GZIP")
    vocabulary: tuple[str, ...]  # token id -> character
    # The phonemes' espeak-ng voice ("": the shards hold no phonemes) and phoneme id -> symbol.
    phonemes: str
    phoneme_vocabulary: tuple[str, ...]
    lowercase: bool  # transcripts were lower-cased before tokenization
    num_targets: int  # frame-target (pdf) classes; 0: the shards carry no frame targets
    splits: dict[str, SplitShards]
    # split -> its transcripts' distinct words, sorted (empty: shards written before they were recorded)
    words: dict[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)
    # Phone targets (pipeline/phones.py): id -> phone, `<blk>` first (empty: the shards hold none),
    # and where they came from (the lexicon, its kind and checksum, the source, G2P counts)
    phone_vocabulary: tuple[str, ...] = ()
    phones: dict = dataclasses.field(default_factory=dict)

    def split(self, name: str) -> SplitShards:
        """The split `name`; ValueError naming the manifest and its splits when it has no such split."""
        if name not in self.splits:
            raise ValueError(f"split {name!r} is not in {self.root / MANIFEST} (it has {sorted(self.splits)})")
        return self.splits[name]

    @property
    def data_dirs(self) -> dict[str, str]:
        """Each split's Kaldi data directory: what the shard stage reads to write them again."""
        return {name: split.data_dir for name, split in self.splits.items()}

    @classmethod
    def from_manifest(cls, root: Path, manifest: dict) -> ShardSet:
        """The pure core of `open_shard_set`: the manifest of `root` (format checked), each split's
        layout checked, typed."""
        dim = int(manifest["feature_dim"])
        return cls(
            root=Path(root),
            fingerprint=manifest.get("fingerprint", {}),
            feature_dim=dim,
            feature_dtype=manifest["feature_dtype"],
            compression_type=COMPRESSION[manifest["compression"]],
            vocabulary=tuple(manifest["vocabulary"]),
            phonemes=manifest.get("phonemes", ""),
            phoneme_vocabulary=tuple(manifest.get("phoneme_vocabulary", ())),
            lowercase=bool(manifest.get("lowercase", True)),
            num_targets=int(manifest.get("num_targets", 0)),
            splits={name: _split(Path(root), name, info, dim) for name, info in manifest["splits"].items()},
            words={name: tuple(words) for name, words in manifest.get("words", {}).items()},
            phone_vocabulary=tuple(manifest.get("phone_vocabulary", ())),
            phones=dict(manifest.get("phones", {})),
        )


def open_shard_set(out_dir: Path) -> ShardSet:
    """The shard set in `out_dir`, its manifest read once and checked: the format version (see
    `load_manifest`) and every split's layout (each file follows its split's class sequence).
    FileNotFoundError or ValueError naming the manifest or the shard and the fix."""
    return ShardSet.from_manifest(Path(out_dir), load_manifest(out_dir))


def _split(root: Path, name: str, info: dict, dim: int) -> SplitShards:
    """One split of the manifest, checked: every shard follows the split's class sequence (the
    reader's batches rely on it); ValueError naming the shard that does not."""
    sequence = tuple(info["class_sequence"])
    for shard in info["shards"]:
        if tuple(shard["chunk_classes"]) != sequence:
            raise ValueError(
                f"shard {shard['file']} of split {name!r} does not follow the split's class sequence; "
                "the shards were changed after the manifest was written: rewrite them with the shard stage"
            )
    speakers = tuple(sorted(info["cmvn"]))
    stats = np.asarray([info["cmvn"][s] for s in speakers], np.float64).reshape(len(speakers), 2, dim + 1)
    stats.flags.writeable = False  # shared by every reader of the set
    return SplitShards(
        name=name,
        data_dir=info["data_dir"],
        utterances=info["utterances"],
        frames=info["frames"],
        speakers=tuple(info["speakers"]),
        cmvn_speakers=speakers,
        cmvn_stats=stats,  # [S, 2, D+1]
        files=tuple(ShardFile(root / s["file"], s["bytes"], s["sha256"]) for s in info["shards"]),
        class_sequence=sequence,
        max_lengths=tuple(c["max_length"] for c in info["classes"]),
        slots=tuple(c["slots"] for c in info["classes"]),
    )


def check_shards(shards: ShardSet, split: str, content: bool = False) -> None:
    """ValueError naming the first shard of `split` whose size (and with `content`, sha256) is not
    what the manifest recorded: a truncated, corrupted or replaced file."""
    for shard in shards.split(split).files:
        path = shard.path
        fix = f"rewrite the shards: `{rewrite_command(shards.root, shards.data_dirs)}` (after deleting {path})"
        if not path.is_file():
            raise FileNotFoundError(f"shard {path} is missing; {fix}")
        size = path.stat().st_size
        if size != shard.bytes:
            raise ValueError(f"shard {path} has {size} bytes, the manifest recorded {shard.bytes}: {fix}")
        if content and fsutil.file_sha256(path) != shard.sha256:
            raise ValueError(f"shard {path} is corrupted: its sha256 is not the manifest's: {fix}")


# ----------------------------------------------------------------------------------------------
# Writing


def _feature(key: str, values) -> object:
    """The tf.train.Feature of record key `key` (SCHEMA says its value type)."""
    import tensorflow as tf

    kind = SCHEMA[key].kind
    if kind == "bytes":
        return tf.train.Feature(bytes_list=tf.train.BytesList(value=list(values)))
    if kind == "int64":
        return tf.train.Feature(int64_list=tf.train.Int64List(value=[int(v) for v in values]))
    return tf.train.Feature(float_list=tf.train.FloatList(value=[float(v) for v in values]))


def encode_block(matrices: list[np.ndarray], slots: int, frames: int, feature_dtype: str):
    """Utterances [T_i, D] -> (block [slots, frames, D] in the storage dtype, zero-padded, and for
    uint8 the (minimum, step) [D] float32 per dimension that decode it: x = code * step + minimum)."""
    dim = matrices[0].shape[1]
    block = np.zeros([slots, frames, dim], np.float32)
    for i, m in enumerate(matrices):
        block[i, : len(m)] = m
    if feature_dtype != "uint8":
        return block.astype(FEATURE_DTYPES[feature_dtype]), None
    every = np.concatenate(matrices)  # the real frames only: padding does not stretch the range
    low, high = every.min(0), every.max(0)
    step = np.maximum(high - low, 1e-6) / 255.0
    codes = np.clip(np.rint((block - low) / step), 0, 255).astype(np.uint8)
    for i, m in enumerate(matrices):
        codes[i, len(m) :] = 0
    codes[len(matrices) :] = 0
    return codes, (low.astype(np.float32), step.astype(np.float32))


def serialize_chunk(utterances: list[dict], length_class: int, slots: int, frames: int, feature_dtype: str) -> bytes:
    """One chunk as a tf.train.Example. Each utterance: `utt_id`, `speaker`, `matrix` float
    [frames, dim], `transcript`, `tokens` [label_len], `targets` [frames] or None and, in shards
    with phonemes, `phonemes` [phoneme_len]. `slots` utterances fit (the rest are empty slots), each
    padded to `frames`."""
    import tensorflow as tf

    empty = slots - len(utterances)
    block, quant = encode_block([u["matrix"] for u in utterances], slots, frames, feature_dtype)
    values = {
        "class": [length_class],
        "utt_ids": [u["utt_id"].encode() for u in utterances] + [b""] * empty,
        "speakers": [u["speaker"].encode() for u in utterances] + [b""] * empty,
        "transcripts": [u["transcript"].encode() for u in utterances] + [b""] * empty,
        "lengths": [u["matrix"].shape[0] for u in utterances] + [0] * empty,
        "feats": [block.tobytes()],
        "token_lengths": [len(u["tokens"]) for u in utterances] + [0] * empty,
        "tokens": [t for u in utterances for t in u["tokens"]],
    }
    if quant is not None:
        values["quant_min"], values["quant_step"] = quant
    if utterances[0].get("targets") is not None:
        values["targets"] = [t for u in utterances for t in u["targets"]]
    for key in ("phonemes", "phones"):
        if utterances[0].get(key) is not None:
            values[f"{key[:-1]}_lengths"] = [len(u[key]) for u in utterances] + [0] * empty
            values[key] = [p for u in utterances for p in u[key]]
    feature = {key: _feature(key, v) for key, v in values.items()}
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


def write_shard(path: Path, chunks: Iterable[tuple], compression: str, feature_dtype: str) -> dict:
    """Writes `(length class, utterances, slots, frames)` chunks in order under a temporary name and
    renames the file into place. Returns the shard's manifest record (hash, size, ids, lengths,
    the class and size of each chunk)."""
    import tensorflow as tf

    tmp = path.with_name(f".{path.name}.tmp")
    options = tf.io.TFRecordOptions(compression_type=COMPRESSION[compression])
    utt_ids, lengths, label_lengths, classes, sizes = [], [], [], [], []
    with tf.io.TFRecordWriter(str(tmp), options) as writer:
        for length_class, utterances, slots, frames in chunks:
            writer.write(serialize_chunk(utterances, length_class, slots, frames, feature_dtype))
            classes.append(length_class)
            sizes.append(len(utterances))
            for u in utterances:
                utt_ids.append(u["utt_id"])
                lengths.append(int(u["matrix"].shape[0]))
                label_lengths.append(len(u["tokens"]))
    os.replace(tmp, path)
    return {
        "file": path.name,
        "sha256": fsutil.file_sha256(path),
        "bytes": path.stat().st_size,
        "count": len(utt_ids),
        "frames": sum(lengths),
        "utt_ids": utt_ids,
        "lengths": lengths,
        "label_lengths": label_lengths,
        "chunk_classes": classes,
        "chunk_sizes": sizes,
    }


# ----------------------------------------------------------------------------------------------
# Reading


def chunk_spec(feature_dtype: str, with_targets: bool, with_phonemes: bool = False, with_phones: bool = False) -> dict:
    """The parsing spec of a record (SCHEMA) of shards stored as `feature_dtype`."""
    import tensorflow as tf

    dtypes = {"int64": tf.int64, "bytes": tf.string, "float": tf.float32}
    present = {
        "",
        "uint8" if feature_dtype == "uint8" else "",
        "targets" if with_targets else "",
        "phonemes" if with_phonemes else "",
        "phones" if with_phones else "",
    }
    return {
        key: tf.io.FixedLenFeature([], dtypes[f.kind]) if f.count == "chunk" else tf.io.VarLenFeature(dtypes[f.kind])
        for key, f in SCHEMA.items()
        if f.when in present
    }


def parse_class(serialized):
    """The length class (int64 scalar) of one serialized chunk, without parsing the rest."""
    import tensorflow as tf

    return tf.io.parse_single_example(serialized, {"class": tf.io.FixedLenFeature([], tf.int64)})["class"]


def parse_chunks(
    serialized,
    frames,
    dim: int,
    feature_dtype: str,
    with_targets: bool = False,
    with_phonemes: bool = False,
    with_phones: bool = False,
) -> dict:
    """A batch of serialized chunks of ONE class [k] -> their slots, in order (empty ones included).

    `frames`: the class's padded length T (a scalar, may be a tensor). Returns `class` int64 [k],
    `utt_id`, `speaker`, `transcript` string [N], `lengths` int32 [N] (0: an empty slot), `feats`
    [N, T, D] in the storage dtype, `dequant` (scale, offset) float32 [N, D] each (x = code * scale
    + offset; 1 and 0 for float storage), `tokens` int32 ragged [N, (label_len)], and when asked
    for `targets` int32 ragged [N, (frames)], `phonemes` int32 ragged [N, (phoneme_len)] and `phones`
    int32 ragged [N, (phone_len)]; N = k * slots.
    """
    import tensorflow as tf

    parsed = tf.io.parse_example(serialized, chunk_spec(feature_dtype, with_targets, with_phonemes, with_phones))
    # One decode for the whole batch: the records of one class have blocks of one size.
    feats = tf.reshape(tf.io.decode_raw(parsed["feats"], getattr(tf, feature_dtype)), [-1, frames, dim])
    lengths = tf.cast(parsed["lengths"].values, tf.int32)  # [N]
    slots = tf.shape(lengths)[0] // tf.shape(serialized)[0]
    if feature_dtype == "uint8":
        per_chunk = (
            tf.reshape(parsed["quant_step"].values, [-1, dim]),
            tf.reshape(parsed["quant_min"].values, [-1, dim]),
        )
        dequant = tuple(tf.repeat(v, slots, axis=0) for v in per_chunk)  # [N, D] each
    else:
        dequant = (tf.ones([tf.shape(lengths)[0], dim]), tf.zeros([tf.shape(lengths)[0], dim]))
    out = {
        "class": parsed["class"],
        "utt_id": parsed["utt_ids"].values,
        "speaker": parsed["speakers"].values,
        "transcript": parsed["transcripts"].values,
        "lengths": lengths,
        "feats": feats,
        "dequant": dequant,
        "tokens": tf.RaggedTensor.from_row_lengths(
            tf.cast(parsed["tokens"].values, tf.int32), parsed["token_lengths"].values
        ),
    }
    if with_targets:
        out["targets"] = tf.RaggedTensor.from_row_lengths(tf.cast(parsed["targets"].values, tf.int32), lengths)
    if with_phonemes:
        out["phonemes"] = tf.RaggedTensor.from_row_lengths(
            tf.cast(parsed["phonemes"].values, tf.int32), parsed["phoneme_lengths"].values
        )
    if with_phones:
        out["phones"] = tf.RaggedTensor.from_row_lengths(
            tf.cast(parsed["phones"].values, tf.int32), parsed["phone_lengths"].values
        )
    return out


def read_utterances(shards: ShardSet, split: str) -> Iterator[tuple[str, np.ndarray, str]]:
    """Yields `(utt_id, features float32 [frames, dim], transcript)` as the shards hold them
    (dequantized when stored as uint8)."""
    import tensorflow as tf

    part = shards.split(split)
    dim, dtype = shards.feature_dim, shards.feature_dtype
    paths = [str(f.path) for f in part.files]
    for serialized in tf.data.TFRecordDataset(paths, compression_type=shards.compression_type):
        length_class = parse_class(serialized)
        chunk = parse_chunks(serialized[None], part.max_lengths[int(length_class)], dim, dtype)
        scale, offset = (v.numpy() for v in chunk["dequant"])
        feats = chunk["feats"].numpy()
        for i, (utt, transcript) in enumerate(zip(chunk["utt_id"].numpy(), chunk["transcript"].numpy())):
            n = int(chunk["lengths"][i])
            if n:
                yield utt.decode(), feats[i, :n].astype(np.float32) * scale[i] + offset[i], transcript.decode()
