"""The shard store's format in one place: file names, the manifest, and the record (write, spec, parse).

The shard stage fills it (pipeline/shards.py), the input pipeline reads it (pipeline/dataset.py),
and nothing else knows how a record is laid out.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np

from common import fsutil

MANIFEST = "manifest.json"
FORMAT_VERSION = 1
COMPRESSION = {"none": "", "gzip": "GZIP"}  # our name -> TensorFlow's compression_type


def shard_name(split: str, index: int, count: int, compression: str) -> str:
    return f"{split}-{index:05d}-of-{count:05d}.tfrecord" + (".gz" if compression == "gzip" else "")


def load_manifest(out_dir: Path) -> dict:
    path = Path(out_dir) / MANIFEST
    manifest = fsutil.read_json(path)
    if manifest is None:
        raise FileNotFoundError(f"{path} does not exist: run `python -m pipeline.shards ... --out {out_dir}` first")
    return manifest


def shard_paths(out_dir: Path, manifest: dict, split: str) -> list[str]:
    if split not in manifest["splits"]:
        raise ValueError(f"split {split!r} is not in {Path(out_dir) / MANIFEST} (it has {sorted(manifest['splits'])})")
    return [str(Path(out_dir) / shard["file"]) for shard in manifest["splits"][split]["shards"]]


def compression_type(manifest: dict) -> str:
    return COMPRESSION[manifest["compression"]]


# ----------------------------------------------------------------------------------------------
# Writing


def _bytes(value: bytes):
    import tensorflow as tf

    return tf.train.Feature(bytes_list=tf.train.BytesList(value=[value]))


def _ints(values: list[int]):
    import tensorflow as tf

    return tf.train.Feature(int64_list=tf.train.Int64List(value=values))


def serialize(utt_id: str, speaker: str, matrix: np.ndarray, transcript: str, tokens: list[int], targets=None) -> bytes:
    """One utterance as a tf.train.Example; `matrix` float [frames, dim]."""
    import tensorflow as tf

    feature = {
        "utt_id": _bytes(utt_id.encode()),
        "speaker": _bytes(speaker.encode()),
        "feats": _bytes(matrix.astype("<f4").tobytes()),
        "num_frames": _ints([matrix.shape[0]]),
        "dim": _ints([matrix.shape[1]]),
        "transcript": _bytes(transcript.encode()),
        "tokens": _ints(tokens),
    }
    if targets is not None:
        feature["targets"] = _ints(list(targets))
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


def write_shard(path: Path, examples: Iterable[dict], compression: str) -> dict:
    """Writes `examples` (dicts of `serialize`'s arguments) under a temporary name and renames the
    file into place. Returns the shard's manifest record (hash, size, ids and lengths)."""
    import tensorflow as tf

    tmp = path.with_name(f".{path.name}.tmp")
    options = tf.io.TFRecordOptions(compression_type=COMPRESSION[compression])
    utt_ids, lengths, label_lengths = [], [], []
    with tf.io.TFRecordWriter(str(tmp), options) as writer:
        for example in examples:
            writer.write(serialize(**example))
            utt_ids.append(example["utt_id"])
            lengths.append(int(example["matrix"].shape[0]))
            label_lengths.append(len(example["tokens"]))
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
    }


# ----------------------------------------------------------------------------------------------
# Reading


def example_spec(with_targets: bool) -> dict:
    import tensorflow as tf

    spec = {
        "utt_id": tf.io.FixedLenFeature([], tf.string),
        "speaker": tf.io.FixedLenFeature([], tf.string),
        "feats": tf.io.FixedLenFeature([], tf.string),
        "num_frames": tf.io.FixedLenFeature([], tf.int64),
        "dim": tf.io.FixedLenFeature([], tf.int64),
        "transcript": tf.io.FixedLenFeature([], tf.string),
        "tokens": tf.io.VarLenFeature(tf.int64),
    }
    if with_targets:
        spec["targets"] = tf.io.VarLenFeature(tf.int64)
    return spec


def parse_example(serialized, dim: int, with_targets: bool = False) -> dict:
    """One serialized example -> dict of tensors; `feats` float32 [frames, dim]."""
    import tensorflow as tf

    parsed = tf.io.parse_single_example(serialized, example_spec(with_targets))
    feats = tf.reshape(tf.io.decode_raw(parsed["feats"], tf.float32), [-1, dim])  # [frames, dim]
    out = {
        "utt_id": parsed["utt_id"],
        "speaker": parsed["speaker"],
        "feats": feats,
        "transcript": parsed["transcript"],
        "tokens": tf.cast(tf.sparse.to_dense(parsed["tokens"]), tf.int32),  # [label_len]
    }
    if with_targets:
        out["targets"] = tf.cast(tf.sparse.to_dense(parsed["targets"]), tf.int32)  # [frames]
    return out


def read_utterances(out_dir: Path, split: str) -> Iterator[tuple[str, np.ndarray, str]]:
    """Yields `(utt_id, features float32 [frames, dim], transcript)` exactly as the shards hold them."""
    import tensorflow as tf

    manifest = load_manifest(out_dir)
    paths = shard_paths(out_dir, manifest, split)
    dataset = tf.data.TFRecordDataset(paths, compression_type=compression_type(manifest))
    dataset = dataset.map(lambda s: parse_example(s, manifest["feature_dim"]))
    for item in dataset.as_numpy_iterator():
        yield item["utt_id"].decode(), item["feats"], item["transcript"].decode()
