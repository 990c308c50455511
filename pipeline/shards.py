"""Shard stage: validated Kaldi features -> TFRecord shards + `manifest.json`.

    python -m pipeline.shards --split train=data/train --split dev=data/dev --split test=data/test \
        --out shards/ [--num-shards 8] [--max-rejected-fraction 0.05] [--alignments train=ali.scp] \
        [--phonemes en-us]

Every utterance of every split is read and checked (kaldi.py lists the reasons); the rejected
ones go to `OUT/rejected.tsv` with the feature stage's rejections, so none disappears. Shards are
`{split}-{i:05d}-of-{K:05d}.tfrecord[.gz]` in the format of pipeline/records.py: records are chunks
of about 8 utterances of one length class (features as 8-bit codes by default, `feature_dtype`
float16 or float32 on request, never normalized: normalization is applied by the input pipeline, so
it can change without re-sharding),
and every shard holds the same number of chunks of each class in the same order (`plan_layout`),
so every Horovod rank's share has the same mix of lengths and the ranks' batches line up.
With `--phonemes VOICE` every transcript's phonemes (pipeline/phonemes.py, espeak-ng's in that
voice's accent) are stored beside its characters, their vocabulary in the manifest: the input of a
synthesis model with `tts.input: phonemes`. With `--phones-from DIR` (a Kaldi dict dir or lang dir)
every transcript's phone targets over that lexicon's phone table are stored too (pipeline/phones.py):
what an acoustic model with `asr.targets: phones` learns; `--phone-source espeak` takes them from
espeak-ng's phonemes of the sentence (with `--phonemes`), `--g2p` lets the lexicon's G2P say the words
it lacks (espeak-ng; for a CMUdict lexicon CMUdict, then espeak-ng mapped to ARPAbet).
Writes are atomic; a re-run with unchanged inputs does nothing and changed inputs rebuild.

This file holds the stage's planning (classes, chunks, balance), writing and its CLI; pass 1, the
check of every utterance of a split, is pipeline/split_validation.py, and the record format itself
pipeline/records.py.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import os
import random
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from common import cli, fsutil
from common import config as configlib
from common.parallel import worker_pool
from common.progress import progress as progress_bar
from pipeline import features as features_stage
from pipeline import kaldi, phonemes, phones, records, split_validation, text

REJECTED = "rejected.tsv"


@dataclasses.dataclass(frozen=True)
class ShardConfig:
    num_shards: int = 8  # shards per split (a split with fewer utterances gets one per utterance)
    compression: str = "none"  # "none" or "gzip"
    max_frames: int = 3000  # longest utterance accepted, in frames
    feature_dim: int = 0  # 0: the split's most common dimension; else required
    max_rejected_fraction: float = 0.05  # fail above this share of rejected utterances (all splits)
    lowercase: bool = True  # transcripts are lower-cased before tokenization
    allow_pipes: bool = False  # run `cmd |` entries of feats.scp (kaldiio would execute them)
    vocabulary_split: str = "train"  # the split whose characters make the token vocabulary
    # Or the vocabulary (and lower-casing) of a trained model or of other shards: a model workdir,
    # its model/ or data.json, a shards directory or its manifest.json (a new test set for a model)
    vocabulary_from: str = ""
    # An espeak-ng voice (e.g. "en-us"): every transcript's phonemes in its accent are stored too (a
    # synthesis model's input, `tts.input: phonemes`); "": characters only.
    phonemes: str = ""
    # A Kaldi dict dir or lang dir: every transcript's phone targets over its phone table are stored
    # too (pipeline/phones.py; an acoustic model with `asr.targets: phones`); "": none.
    phones_from: str = ""
    # Where a transcript's phones come from: "lexicon" (each word's most probable pronunciation) or
    # "espeak" (espeak-ng's phonemes of the sentence in context: needs `phonemes`)
    phone_source: str = "lexicon"
    g2p: bool = False  # "lexicon": the lexicon's G2P says the words it lacks (counted per split)
    # How features are stored: "uint8" (a quarter of the bytes: 8-bit codes per chunk and dimension,
    # as Kaldi's compressed matrices), "float16" (half) or "float32" (exact).
    feature_dtype: str = "uint8"
    chunk_utterances: int = 8  # utterances of one length class per record (pipeline/records.py)
    length_classes: int = 12  # at most this many length classes per split (fewer when it is small)
    seed: int = 0  # the order of the length classes in the shards
    jobs: int = 0  # worker processes; 0 = one per CPU

    def __post_init__(self):
        if self.feature_dtype not in records.FEATURE_DTYPES:
            raise ValueError(
                f"feature_dtype must be one of {sorted(records.FEATURE_DTYPES)}, got {self.feature_dtype!r}"
            )
        if self.chunk_utterances < 1 or self.length_classes < 1 or self.num_shards < 1:
            raise ValueError("num_shards, chunk_utterances and length_classes must be at least 1")
        if self.phone_source not in phones.SOURCES:
            raise ValueError(f"phone_source must be one of {phones.SOURCES}, got {self.phone_source!r}")


@dataclasses.dataclass(frozen=True)
class Layout:
    """Where a split's utterances go: chunks of one length class, the same classes in every shard."""

    classes: list[dict]  # per length class: min_length, max_length, utterances, chunks_per_shard, slots
    class_sequence: list[int]  # the class of each record position, the same in every shard
    shards: list[list[tuple[int, list[str]]]]  # per shard, in record order: (class, utterance ids)


def plan_layout(
    lengths: dict[str, int], num_shards: int, chunk_utterances: int, length_classes: int, seed: int
) -> Layout:
    """The pure core of the shard stage: utterances (id -> frames) to shards of chunks.

    Utterances are sorted by length and cut into up to `length_classes` classes of about equal
    counts. Every class but the last is rounded to a multiple of `num_shards x chunk_utterances`
    (the rest moves on to the next, longer class), so its chunks are all full: one record shape
    per class, which the reader decodes without padding or copying (records.py). The last class
    takes what remains, in `num_shards x m` chunks of at most `chunk_utterances` (its records have
    empty slots where it does not divide). Every shard gets the same number of chunks of every
    class (largest first, each to the shard with the fewest frames so far, so the shards also
    hold nearly the same frames), and the records of every shard follow one shared, seeded
    random order of classes.
    """
    ordered = sorted(lengths, key=lambda utt: (lengths[utt], utt))
    count = len(ordered)
    if count < num_shards:
        raise ValueError(f"{count} utterances cannot fill {num_shards} shards")
    full = num_shards * chunk_utterances  # utterances of one full chunk per shard
    groups = np.array_split(np.arange(count), max(1, min(length_classes, count // full)))
    per_shard: list[list[list[list[str]]]] = [[] for _ in range(num_shards)]  # shard -> class -> chunks
    classes, frames, start = [], [0] * num_shards, 0
    for i, group in enumerate(groups):
        last = i == len(groups) - 1
        take = count - start if last else int(group[-1] + 1 - start) // full * full
        if take == 0:
            continue  # too few for a full chunk per shard: they join the next class
        members = ordered[start : start + take]
        start += take
        slots = chunk_utterances if not last else min(chunk_utterances, -(-take // num_shards))
        chunks = num_shards * -(-take // (num_shards * slots))
        cut = [list(c) for c in np.array_split(np.asarray(members, dtype=object), chunks)]
        for shard in per_shard:
            shard.append([])
        for chunk in sorted(cut, key=lambda c: (-sum(lengths[u] for u in c), c[0])):
            room = [j for j in range(num_shards) if len(per_shard[j][-1]) < chunks // num_shards]
            seat = min(room, key=lambda j: (frames[j], j))
            per_shard[seat][-1].append(chunk)
            frames[seat] += sum(lengths[u] for u in chunk)
        classes.append(
            {
                "min_length": lengths[members[0]],
                "max_length": lengths[members[-1]],
                "utterances": take,
                "chunks_per_shard": chunks // num_shards,
                "slots": max(len(c) for c in cut),  # utterances per record; fewer fill the rest with empty slots
            }
        )
    sequence = [c for c, info in enumerate(classes) for _ in range(info["chunks_per_shard"])]
    random.Random(seed).shuffle(sequence)
    shards = []
    for by_class in per_shard:
        taken = [iter(chunks) for chunks in by_class]
        shards.append([(c, next(taken[c])) for c in sequence])
    return Layout(classes, sequence, shards)


# ----------------------------------------------------------------------------------------------
# Writing (pass 2): one process per shard at a time.


def _examples(utts, entries, vocabulary, targets, phoneme_ids, cfg: ShardConfig) -> Iterator[dict]:
    """`phoneme_ids`: None, or {utt: (phoneme ids or None, phone ids or None)}."""
    for utt in utts:
        entry = entries[utt]
        transcript = text.normalize_transcript(entry.transcript, cfg.lowercase)
        yield {
            "utt_id": utt,
            "speaker": entry.speaker,
            "matrix": kaldi.load_matrix(entry.feats),  # [frames, dim]
            "transcript": transcript,
            "tokens": text.encode(transcript, vocabulary),
            "targets": None if targets is None else split_validation.load_targets(targets[utt]).tolist(),
            "phonemes": None if phoneme_ids is None else phoneme_ids[utt][0],
            "phones": None if phoneme_ids is None else phoneme_ids[utt][1],
        }


def _write_shard(task) -> dict:
    """Writes one shard of chunks from its utterances' Kaldi entries. Returns its manifest record."""
    path, chunks, classes, entries, vocabulary, targets, phoneme_ids, cfg = task
    with_utterances = (
        (
            c,
            list(_examples(utts, entries, vocabulary, targets, phoneme_ids, cfg)),
            classes[c]["slots"],
            classes[c]["max_length"],
        )
        for c, utts in chunks
    )
    return records.write_shard(path, with_utterances, cfg.compression, cfg.feature_dtype)


# ----------------------------------------------------------------------------------------------
# The driver.


def _fingerprint(splits: dict[str, Path], alignments: dict[str, Path], cfg: ShardConfig, given: dict | None) -> dict:
    """What the shards are made of: the input tables and arks, the settings, the code, espeak-ng's
    version and the phone table, and a given vocabulary (a model retrained under the same path changes it)."""
    per_dir = {}
    for name, data_dir in sorted(splits.items()):
        tables = [data_dir / t for t in ("feats.scp", "text", "utt2spk", "cmvn.scp", features_stage.REJECTED)]
        arks = set()
        for table in ("feats.scp", "cmvn.scp"):
            if (data_dir / table).is_file():
                arks |= {kaldi.spec_path(s) for s in kaldi.read_table(data_dir / table).values.values()} - {None}
        if name in alignments:
            tables.append(alignments[name])
        per_dir[name] = {
            "dir": str(data_dir.resolve()),
            "tables": fsutil.fingerprint_files(tables),
            "arks": fsutil.fingerprint_files(arks, content=False),
        }
    fingerprint = {
        "inputs": per_dir,
        "config": configlib.to_dict(dataclasses.replace(cfg, jobs=0)),
        "code": fsutil.code_version(sys.modules[__name__], split_validation, kaldi, records, text, phonemes),
        # the phonemes are espeak-ng's: another version may write other ones
        "phonemizer": phonemes.version() if cfg.phonemes or cfg.g2p else "",
        "phone_table": phones.open_table(cfg.phones_from).sha256 if cfg.phones_from else "",
    }
    if given is not None:
        fingerprint["vocabulary"] = given["vocabulary"]
        fingerprint["phoneme_vocabulary"] = given["phoneme_vocabulary"]
    return fingerprint


def _shards_complete(out_dir: Path, manifest: dict) -> bool:
    return all(
        (out_dir / shard["file"]).is_file() and (out_dir / shard["file"]).stat().st_size == shard["bytes"]
        for split in manifest["splits"].values()
        for shard in split["shards"]
    )


def make_shards(
    splits: dict[str, Path],
    out_dir: Path,
    cfg: ShardConfig,
    alignments: dict[str, Path] | None = None,
    progress: bool = True,
) -> dict:
    """Validates and shards every split. Returns the manifest; raises ValueError on too many rejections."""
    cfg, given = _with_given_vocabulary(cfg, splits)
    alignments = alignments or {}
    unknown = set(alignments) - set(splits)
    if unknown:
        raise ValueError(f"--alignments names splits {sorted(unknown)} that have no --split")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    splits = {name: Path(d) for name, d in splits.items()}
    fingerprint = _fingerprint(splits, alignments, cfg, given)
    existing = _up_to_date_manifest(out_dir, fingerprint)
    if existing is not None:
        return {**existing, "skipped": True}
    # First: a rebuild that fails (too many rejections) or stops never leaves a manifest that looks done.
    (out_dir / records.MANIFEST).unlink(missing_ok=True)
    for stale in out_dir.glob(".*.tmp"):
        stale.unlink()  # left by an interrupted run

    jobs = cfg.jobs or os.cpu_count() or 1
    with worker_pool(jobs) as pool:
        plans = {
            name: split_validation.validate_split(name, d, cfg, pool, alignments.get(name), progress)
            for name, d in splits.items()
        }
        _publish_rejections(plans, out_dir, cfg)
        feature_dim = _feature_dim(plans)
        vocabulary = _vocabulary(plans, cfg, given)
        phoneme_vocabulary, phoneme_ids, phone_info = _phonemes(plans, cfg, given)
        tasks, layouts = _shard_tasks(plans, out_dir, cfg, vocabulary, phoneme_ids)
        written = _write_shards(tasks, pool, progress)

    manifest = {
        "version": records.FORMAT_VERSION,
        "fingerprint": fingerprint,
        "feature_dim": feature_dim,
        "compression": cfg.compression,
        "feature_dtype": cfg.feature_dtype,
        "chunk_utterances": cfg.chunk_utterances,
        "vocabulary": vocabulary,
        "lowercase": cfg.lowercase,
        "phonemes": cfg.phonemes,
        "phoneme_vocabulary": phoneme_vocabulary,
        **phone_info,  # phone_vocabulary and phones, with --phones-from
        "num_targets": split_validation.num_targets(plans),
        # Each split's distinct words: a model records its training split's, so that evaluation can
        # tell the words it never heard (models/asr/evaluation.py's out-of-vocabulary figures).
        "words": {name: _words(plan, cfg) for name, plan in plans.items()},
        "splits": {name: _split_record(plan, layouts[name], written[name]) for name, plan in plans.items()},
    }
    _remove_other_layouts(out_dir, splits, manifest)
    fsutil.atomic_write_json(out_dir / records.MANIFEST, manifest)
    return {**manifest, "skipped": False}


def _with_given_vocabulary(cfg: ShardConfig, splits: dict[str, Path]) -> tuple[ShardConfig, dict | None]:
    """(`cfg`, the vocabulary of `cfg.vocabulary_from` or None). With a given vocabulary, `cfg` takes its
    transcript normalization and its phonemes and phones (the table, their source and the G2P), so the shards
    hold what its model reads."""
    if cfg.compression not in ("none", "gzip"):
        raise ValueError(f"compression must be 'none' or 'gzip', got {cfg.compression!r}")
    given = text.load_vocabulary(cfg.vocabulary_from) if cfg.vocabulary_from else None
    if given is not None:
        cfg = dataclasses.replace(
            cfg,
            lowercase=given["lowercase"],
            phonemes=cfg.phonemes or given["phonemes"],
            phones_from=cfg.phones_from or given["phones"].get("from", ""),
            phone_source=given["phones"].get("source", cfg.phone_source),
            # a new set's words the lexicon lacks are said as the model's training words were
            g2p=cfg.g2p or bool(given["phones"].get("g2p", False)),
        )
    elif cfg.vocabulary_split not in splits:
        raise ValueError(
            f"the vocabulary comes from split {cfg.vocabulary_split!r}, which is not among {sorted(splits)}"
        )
    return cfg, given


def _up_to_date_manifest(out_dir: Path, fingerprint: dict) -> dict | None:
    """The manifest in `out_dir` when it is of this format and fingerprint and its shards are all there."""
    existing = fsutil.read_json(out_dir / records.MANIFEST)
    if (
        existing
        and existing.get("version") == records.FORMAT_VERSION
        and existing.get("fingerprint") == fingerprint
        and _shards_complete(out_dir, existing)
    ):
        return existing
    return None


def _publish_rejections(plans: dict, out_dir: Path, cfg: ShardConfig) -> None:
    """Writes every split's rejections to OUT/rejected.tsv; ValueError above `max_rejected_fraction`."""
    rejected = [(name, r) for name, plan in plans.items() for r in plan.rejections]
    kaldi.write_rejections(out_dir / REJECTED, rejected)
    total = sum(len(p.entries) + len(p.rejections) for p in plans.values())
    if total and len(rejected) / total > cfg.max_rejected_fraction:
        raise ValueError(
            f"{len(rejected)} of {total} utterances were rejected ({len(rejected) / total:.1%} > "
            f"max_rejected_fraction={cfg.max_rejected_fraction}); see {out_dir / REJECTED}. "
            f"Most common: {kaldi.summarize([r for _, r in rejected])}"
        )


def _feature_dim(plans: dict) -> int:
    """The feature dimension all splits share (0 when none has an utterance); ValueError when they disagree."""
    dims = {p.dim for p in plans.values() if p.entries}
    if len(dims) > 1:
        raise ValueError(f"splits disagree on the feature dimension: { {n: p.dim for n, p in plans.items()} }")
    return dims.pop() if dims else 0


def _vocabulary(plans: dict, cfg: ShardConfig, given: dict | None) -> list[str]:
    """The token vocabulary: the given one (warning of characters it lacks), else the vocabulary split's."""
    if given is None:
        vocab_plan = plans[cfg.vocabulary_split]
        return text.build_vocabulary(
            [text.normalize_transcript(e.transcript, cfg.lowercase) for e in vocab_plan.entries.values()]
        )
    vocabulary = given["vocabulary"]
    seen = {
        ch
        for p in plans.values()
        for e in p.entries.values()
        for ch in text.normalize_transcript(e.transcript, cfg.lowercase)
    }
    if seen - set(vocabulary):
        print(
            f"warning: characters {''.join(sorted(seen - set(vocabulary)))!r} are not in the vocabulary of "
            f"{cfg.vocabulary_from}; they are stored as {text.UNK}",
            file=sys.stderr,
        )
    return vocabulary


def _shard_tasks(
    plans: dict, out_dir: Path, cfg: ShardConfig, vocabulary: list[str], phoneme_ids: dict
) -> tuple[list[tuple], dict[str, Layout]]:
    """Every shard's `_write_shard` task, splits in order, and each split's layout."""
    tasks, layouts = [], {}
    for name, plan in plans.items():
        count = max(1, min(cfg.num_shards, len(plan.entries)))
        layouts[name] = layout = plan_layout(plan.lengths, count, cfg.chunk_utterances, cfg.length_classes, cfg.seed)
        for index, chunks in enumerate(layout.shards):
            path = out_dir / records.shard_name(name, index, count, cfg.compression)
            utts = [u for _, chunk in chunks for u in chunk]
            own = {u: plan.entries[u] for u in utts}
            own_targets = {u: plan.targets[u] for u in utts} if plan.targets is not None else None
            own_phonemes = {u: phoneme_ids[name, u] for u in utts} if phoneme_ids else None
            tasks.append((path, chunks, layout.classes, own, vocabulary, own_targets, own_phonemes, cfg))
    return tasks, layouts


def _write_shards(tasks: list[tuple], pool, progress: bool) -> dict[str, list[dict]]:
    """Writes the shards in the worker pool; returns split -> the shards' manifest records."""
    written: dict[str, list] = collections.defaultdict(list)
    total = sum(len(t[3]) for t in tasks)
    bar = progress_bar(total=total, desc="write shards", unit="utt", disable=not progress)
    for task, record in zip(tasks, pool.imap(_write_shard, tasks)):
        written[task[0].name.split("-")[0]].append(record)
        bar.update(record["count"])
    bar.close()
    return written


def _words(plan, cfg: ShardConfig) -> list[str]:
    """A split's distinct words, sorted."""
    return sorted(
        {w for e in plan.entries.values() for w in text.normalize_transcript(e.transcript, cfg.lowercase).split()}
    )


def _split_record(plan, layout: Layout, written: list[dict]) -> dict:
    """A split's entry in the manifest: its counts, speakers, CMVN statistics, layout and shards."""
    return {
        "data_dir": str(plan.data_dir.resolve()),
        "utterances": len(plan.entries),
        "rejected": len(plan.rejections),
        "frames": sum(plan.lengths.values()),
        "speakers": sorted({e.speaker for e in plan.entries.values()}),
        "cmvn": {spk: stats.tolist() for spk, stats in sorted(plan.stats.items())},
        "classes": layout.classes,
        "class_sequence": layout.class_sequence,
        "shards": sorted(written, key=lambda r: r["file"]),
    }


def _remove_other_layouts(out_dir: Path, splits: dict[str, Path], manifest: dict) -> None:
    """Removes the shards of the written splits that the manifest does not list (another --num-shards)."""
    keep = {shard["file"] for split in manifest["splits"].values() for shard in split["shards"]}
    for name in splits:
        for old in out_dir.glob(f"{name}-*-of-*.tfrecord*"):
            if old.name not in keep:
                old.unlink()


def _phonemes(plans: dict, cfg: ShardConfig, given: dict | None) -> tuple[list[str], dict, dict]:
    """(phoneme vocabulary, {(split, utterance): (phoneme ids or None, phone ids or None)}, the
    manifest's phone keys) of every transcript, espeak-ng called once; ([], {}, {}) when the shards
    hold neither. The phoneme vocabulary is the given one (a model's, for a new test set) when it has
    one, else that of the vocabulary split's phonemes; the phones are pipeline/phones.py's."""
    if not cfg.phonemes and not cfg.phones_from:
        return [], {}, {}
    keys = [(name, utt) for name, plan in plans.items() for utt in plan.entries]
    transcripts = {(n, u): text.normalize_transcript(plans[n].entries[u].transcript, cfg.lowercase) for n, u in keys}
    symbols = {}
    if cfg.phonemes:  # each distinct sentence once: the copies in train_aug repeat train's
        distinct = sorted(set(transcripts.values()))
        said = dict(zip(distinct, phonemes.phonemize(distinct, cfg.phonemes)))
        symbols = {key: said[t] for key, t in transcripts.items()}
    vocabulary: list[str] = []
    if given is not None and given["phoneme_vocabulary"]:
        vocabulary = given["phoneme_vocabulary"]
    elif symbols:
        vocabulary = text.build_vocabulary([s for (n, _), s in symbols.items() if n == cfg.vocabulary_split])
    phone_ids, info = _phones(transcripts, symbols, cfg, given) if cfg.phones_from else ({}, {})
    ids = {key: (text.encode(symbols[key], vocabulary) if symbols else None, phone_ids.get(key)) for key in keys}
    return vocabulary, ids, info


def _phones(transcripts: dict, symbols: dict, cfg: ShardConfig, given: dict | None) -> tuple[dict, dict]:
    """({(split, utterance): phone ids}, the manifest's `phone_vocabulary` and `phones`) of the
    lexicon `cfg.phones_from` (pipeline/phones.py). ValueError when a given model's output layer is
    another table's."""
    table = phones.open_table(cfg.phones_from)
    if given is not None and given["phone_vocabulary"] and tuple(given["phone_vocabulary"]) != table.outputs:
        raise ValueError(
            f"{cfg.phones_from}: its phone table is not the output layer of {cfg.vocabulary_from}; shard with "
            "the lexicon (or lang dir) the model was trained with"
        )
    g2p_words: dict[str, int] = {}
    if cfg.phone_source == "espeak":
        if not symbols:
            raise ValueError("phone_source espeak takes espeak-ng's phonemes of each sentence: give --phonemes VOICE")
        ids = phones.ids_from_espeak(symbols, table)
    else:
        ids, g2p_words = phones.ids_from_lexicon(transcripts, table, cfg.g2p, cfg.phonemes or phonemes.DEFAULT_VOICE)
    info = {**table.describe(), "source": cfg.phone_source, "g2p": cfg.g2p, "g2p_words": g2p_words}
    return ids, {"phone_vocabulary": list(table.outputs), "phones": info}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--split", action="append", required=True, metavar="NAME=DIR", help="a split and its Kaldi data directory"
    )
    parser.add_argument("--out", required=True, type=Path, help="output directory for shards and manifest.json")
    parser.add_argument("--num-shards", type=int, help="shards per split (default 8)")
    parser.add_argument(
        "--max-rejected-fraction", type=float, help="fail above this share of rejected utterances (default 0.05)"
    )
    parser.add_argument(
        "--alignments",
        action="append",
        default=[],
        metavar="NAME=PATH",
        help="frame targets (ali.scp or an int-vector ark) for a split",
    )
    parser.add_argument("--compression", choices=["none", "gzip"], help="TFRecord compression")
    parser.add_argument(
        "--vocabulary-from",
        metavar="PATH",
        help="use the vocabulary of a trained model (its workdir) or of other shards instead of the train split's",
    )
    parser.add_argument(
        "--phonemes",
        metavar="VOICE",
        help="store every transcript's phonemes too, in this espeak-ng voice's accent (e.g. en-us): "
        "the input of a synthesis model with tts.input=phonemes",
    )
    parser.add_argument(
        "--phones-from",
        metavar="DIR",
        help="store every transcript's phone targets too, over this Kaldi dict dir's or lang dir's phone table "
        "(an acoustic model with asr.targets=phones)",
    )
    parser.add_argument(
        "--phone-source",
        choices=phones.SOURCES,
        help="lexicon: each word's most probable pronunciation (default); espeak: espeak-ng's phonemes of the "
        "sentence (needs --phonemes)",
    )
    parser.add_argument(
        "--g2p",
        action="store_true",
        help="the lexicon's G2P says the words it lacks (counted): espeak-ng; CMUdict's for a CMUdict lexicon",
    )
    parser.add_argument("--allow-pipes", action="store_true", help="run 'cmd |' entries of feats.scp as shell commands")
    cli.add_jobs_argument(parser)
    cli.add_config_arguments(parser, "ShardConfig")
    cli.add_progress_argument(parser)
    args = parser.parse_args(argv)
    return cli.run(lambda: _main(args))


def _main(args: argparse.Namespace) -> None:
    flags = {
        "num_shards": args.num_shards,
        "max_rejected_fraction": args.max_rejected_fraction,
        "compression": args.compression,
        "allow_pipes": args.allow_pipes or None,
        "vocabulary_from": args.vocabulary_from,
        "phonemes": args.phonemes,
        "phones_from": args.phones_from,
        "phone_source": args.phone_source,
        "g2p": args.g2p or None,
        "jobs": args.jobs,
    }
    cfg = configlib.load(ShardConfig, args.config, args.set, flags=flags)
    manifest = make_shards(
        {k: Path(v) for k, v in cli.parse_pairs(args.split, "--split", identifiers=True).items()},
        args.out,
        cfg,
        {k: Path(v) for k, v in cli.parse_pairs(args.alignments, "--alignments", identifiers=True).items()},
        progress=not args.no_progress,
    )
    state = "unchanged" if manifest["skipped"] else "written"
    for name, split in manifest["splits"].items():
        print(
            f"{name}: {split['utterances']} utterances, {split['frames']} frames, {len(split['shards'])} shards, "
            f"{split['rejected']} rejected ({state})"
        )
    print(f"manifest: {Path(args.out) / records.MANIFEST}")


if __name__ == "__main__":
    sys.exit(main())
