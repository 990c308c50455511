"""The shard stage's pass 1: one split's Kaldi data directory read and checked, utterance by utterance.

Every utterance is checked (kaldi.py lists the reasons: unreadable, too long, wrong dimension; with
alignments also a missing or mismatched one) and the rejected ones kept with their reason, so the
shard stage can write them to `rejected.tsv`. Features the feature stage wrote and vouches for are
not read again: their lengths come from `utt2num_frames`. What a split turns out to be (its valid
utterances, their lengths, the speakers' CMVN statistics) is a `SplitPlan`, which the shard stage
(pipeline/shards.py) lays out into shards.
"""

from __future__ import annotations

import collections
import dataclasses
from pathlib import Path

import numpy as np

from common.progress import progress as progress_bar
from pipeline import features as features_stage
from pipeline import kaldi


def _validate_chunk(task):
    """Checks a list of utterances in a worker process (`validate_split` sends lists of 16). Rows of
    (utt, shape or None, moments [2, dim] of the valid, rejection or None)."""
    entries, check, targets = task
    out = []
    for entry in entries:
        matrix, rejection = kaldi.check_matrix(entry.utt_id, entry.feats, check, None)
        if rejection is None and targets is not None:
            rejection = _check_targets(entry.utt_id, targets.get(entry.utt_id), len(matrix))
        if rejection is not None:
            out.append((entry.utt_id, None, None, rejection))
        else:
            x = matrix.astype(np.float64)
            out.append((entry.utt_id, matrix.shape, np.stack([x.sum(0), (x * x).sum(0)]), None))
    return out


def _vouched(utt: str, frames: int, dim: int, check: kaldi.FeatureCheck, targets) -> tuple:
    """Pass 1 of an utterance whose length the feature stage vouches for (it checked the matrix when
    it wrote it): the checks that need only the length, no matrix read. As _validate_chunk's rows."""
    rejection = None
    if frames > check.max_frames:
        rejection = kaldi.Rejection(utt, "too_many_frames", f"{frames} frames > max_frames={check.max_frames}")
    elif targets is not None:
        rejection = _check_targets(utt, targets.get(utt), frames)
    return (utt, None, None, rejection) if rejection else (utt, (frames, dim), np.zeros((2, dim)), None)


def load_targets(spec) -> np.ndarray:
    """Frame targets int64 [frames] of an alignment entry (a Kaldi rspecifier, or already loaded)."""
    if isinstance(spec, np.ndarray):
        return spec
    import kaldiio

    return np.asarray(kaldiio.load_mat(spec), dtype=np.int64)


def _check_targets(utt: str, spec, frames: int) -> kaldi.Rejection | None:
    if spec is None:
        return kaldi.Rejection(utt, "missing_alignment", f"no frame targets for {utt!r}")
    try:
        targets = load_targets(spec)
    except Exception as err:  # kaldiio raises many types for a damaged alignment entry
        return kaldi.Rejection(utt, "unreadable", f"alignment of {utt!r}: {type(err).__name__}: {err}")
    if len(targets) != frames:
        return kaldi.Rejection(utt, "alignment_length_mismatch", f"{utt!r}: {len(targets)} targets for {frames} frames")
    return None


@dataclasses.dataclass
class SplitPlan:
    """What pass 1 found for one split."""

    name: str
    data_dir: Path
    entries: dict[str, kaldi.Entry]  # valid utterances
    lengths: dict[str, int]  # frames per valid utterance
    dim: int
    rejections: list[kaldi.Rejection]
    stats: dict[str, np.ndarray]  # speaker -> Kaldi CMVN stats [2, dim+1]
    targets: dict | None


def validate_split(name: str, data_dir: Path, cfg, pool, alignments: Path | None, progress: bool) -> SplitPlan:
    """Pass 1 of split `name`: reads `data_dir` (and `alignments`, frame targets) and checks every
    utterance, the matrices in `pool`'s processes. `cfg`: the shard stage's ShardConfig (its
    max_frames, feature_dim, allow_pipes)."""
    entries, rejections = kaldi.scan_data_dir(data_dir, allow_pipes=cfg.allow_pipes, need_text=True, source="feats")
    previous = Path(data_dir) / features_stage.REJECTED
    if previous.is_file():
        rejections += [r for _, r in kaldi.read_rejections(previous)]
    targets = kaldi.load_alignments(alignments, cfg.allow_pipes) if alignments else None
    check = kaldi.FeatureCheck(max_frames=cfg.max_frames)
    # Features the feature stage wrote and vouches for are not read here: their lengths come from
    # utt2num_frames (and CMVN from cmvn.scp); the others are read once to be checked.
    lengths, vouched_dim = features_stage.vouched_lengths(data_dir) or ({}, 0)
    results = [
        _vouched(e.utt_id, lengths[e.utt_id], vouched_dim, check, targets) for e in entries if e.utt_id in lengths
    ]
    to_read = [e for e in entries if e.utt_id not in lengths]
    chunks = [to_read[i : i + 16] for i in range(0, len(to_read), 16)]
    bar = progress_bar(total=len(to_read), desc=f"validate {name}", unit="utt", disable=not progress)
    for out in pool.imap(_validate_chunk, [(c, check, targets) for c in chunks]):  # in order: deterministic
        results.extend(out)
        bar.update(len(out))
    bar.close()
    dim = cfg.feature_dim or kaldi.most_common_dim(shape[1] for _, shape, _, _ in results if shape is not None)
    by_id = {e.utt_id: e for e in entries}
    valid, lengths, sums = {}, {}, collections.defaultdict(lambda: 0)
    for utt, shape, moments, rejection in results:
        if rejection is not None:
            rejections.append(rejection)
        elif shape[1] != dim:
            rejections.append(
                kaldi.Rejection(
                    utt, "wrong_dimension", f"{by_id[utt].feats} has dimension {shape[1]}, the split has {dim}"
                )
            )
        else:
            valid[utt], lengths[utt] = by_id[utt], shape[0]
            stats = np.zeros((2, dim + 1))
            stats[:, :dim] = moments
            stats[0, dim] = shape[0]
            sums[by_id[utt].speaker] = sums[by_id[utt].speaker] + stats
    return SplitPlan(
        name, Path(data_dir), valid, lengths, dim or 0, rejections, _speaker_stats(data_dir, dict(sums), dim), targets
    )


def _speaker_stats(data_dir: Path, computed: dict[str, np.ndarray], dim: int | None) -> dict[str, np.ndarray]:
    """Kaldi's cmvn.scp when the directory has one (it may come from Kaldi), else what pass 1 summed."""
    cmvn = Path(data_dir) / "cmvn.scp"
    if not cmvn.is_file() or not dim:
        return computed
    import kaldiio

    stats = {}
    for speaker, spec in kaldi.read_table(cmvn).values.items():
        if kaldi.is_pipe(spec):
            raise ValueError(f"{cmvn}: {speaker!r} -> {spec!r} is a command; CMVN statistics must be files")
        matrix = np.asarray(kaldiio.load_mat(spec), dtype=np.float64)
        if matrix.shape != (2, dim + 1):
            raise ValueError(f"{cmvn}: statistics of {speaker!r} have shape {matrix.shape}, expected (2, {dim + 1})")
        stats[speaker] = matrix
    missing = set(computed) - set(stats)
    if missing:
        raise ValueError(
            f"{cmvn} lacks speakers {sorted(missing)[:5]}; re-run `python -m pipeline.features --data-dir {data_dir}`"
        )
    return stats


def num_targets(plans: dict[str, SplitPlan]) -> int:
    """Frame-target classes of the splits' plans (the highest pdf id + 1; 0 without targets)."""
    highest = -1
    for plan in plans.values():
        if plan.targets is not None:
            for utt in plan.entries:
                highest = max(highest, int(load_targets(plan.targets[utt]).max(initial=-1)))
    return highest + 1
