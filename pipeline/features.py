"""Feature stage: Kaldi-compatible log-mel fbank from `wav.scp` (+ `segments`), and per-speaker CMVN.

    python -m pipeline.features --data-dir data/train [--out-dir feats/train] [--allow-pipes]
                                [--set num_mel_bins=40]

Audio entries are files (WAV, FLAC, SPHERE) or the decoder commands of Kaldi recipes (`flac -c -d
-s F |`, `sph2pipe -f wav -p -c 1 F |`, `sox F -t wav -r 8000 - |`), which are read in-process as
the command would decode them (pipeline/audio_io.py); other commands are refused unless pipes are
allowed. `segments` may end at -1 (to the end of the recording) and name a channel in a fifth
field; `reco2file_and_channel` names the channel of a recording otherwise.

Output goes to the data directory itself, or with `--out-dir` to a directory of its own (for
read-only corpora), which then is a complete Kaldi data directory: the input's tables (`text`,
`utt2spk`, ...) are copied beside the features. Written: `feats.ark`/`feats.scp` (kaldiio),
`utt2num_frames`, `cmvn.ark`/`cmvn.scp` (Kaldi's per-speaker 2 x (D+1) statistics),
`feats_rejected.tsv` (utterances whose audio could not be used, with the reason; the shard stage
carries them into its own `rejected.tsv`) and, last, a done-marker recording the input
fingerprint, so a re-run with unchanged inputs does nothing. A run that rejects more than
`max_rejected_fraction` publishes no features and marks the failure, so a retry fails again.

When the data directory already has a `feats.scp` that this stage did not write (features made by
Kaldi), it is kept (copied to `--out-dir`) and only CMVN statistics are computed if there are none.

One file: the stage's job list, its resumable parallel writer and per-speaker CMVN; reading a
`wav.scp` entry is pipeline/kaldi.py's `read_audio` (recipes' decoder commands: pipeline/audio_io.py).
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import os
import sys
from pathlib import Path

import numpy as np

from common import cli, fsutil
from common import config as configlib
from common.parallel import worker_pool
from common.progress import progress as progress_bar
from pipeline import audio_io, kaldi
from pipeline.audio_io import AudioError

MARKER = ".features.done.json"
REJECTED = "feats_rejected.tsv"
# The input's tables that describe its utterances; `--out-dir` gets copies, so it is a data
# directory of its own (the shard stage reads text and utt2spk from it); utt2voice: the demo
# corpus' engine and voice of each utterance.
TABLES = (
    "text",
    "utt2spk",
    "spk2utt",
    "spk2gender",
    "wav.scp",
    "segments",
    "reco2file_and_channel",
    "utt2dur",
    "utt2voice",
)
# Kaldi-made features: what `--out-dir` gets of them besides TABLES.
KALDI_FEATURES = ("feats.scp", "cmvn.scp", "utt2num_frames", "frame_shift")


@dataclasses.dataclass(frozen=True)
class FeatureConfig:
    num_mel_bins: int = 80  # log-mel bins
    sample_rate: int = 16000  # Hz; other rates are resampled to it (or rejected, see resample)
    frame_length_ms: float = 25.0  # analysis window
    frame_shift_ms: float = 10.0  # hop
    dither: float = 0.0  # Kaldi's default is 1.0; 0 keeps features deterministic
    resample: bool = True  # False: reject recordings at another sample rate instead
    # False: reject multi-channel recordings whose channel nothing names (a decoder command's -c, the
    # fifth field of segments, reco2file_and_channel) instead of averaging their channels
    downmix: bool = True
    segment_tolerance_s: float = 0.1  # a segment may end this far past its recording (Kaldi allows overshoot)
    # run `cmd |` entries of wav.scp that are not a recognized decoder call (kaldiio runs them in a shell)
    allow_pipes: bool = False
    max_rejected_fraction: float = 0.05  # fail the stage above this share of rejected utterances
    jobs: int = 0  # worker processes; 0 = one per CPU


def prepare_waveform(
    rate: int, samples: np.ndarray, segment: kaldi.Segment | None, cfg: FeatureConfig, channel: int | None = None
) -> np.ndarray:
    """Picks the channel (or mixes down), cuts the segment and resamples: float32 [n] at
    cfg.sample_rate, int16 scale. `channel`: 0-based, from `segments` or `reco2file_and_channel`;
    it applies to recordings with several channels (a decoder command may have picked one already)."""
    channels = samples.shape[1]
    if channels > 1 and channel is not None:
        if channel >= channels:
            raise AudioError("unsupported_audio", f"channel {channel + 1} asked for, the recording has {channels}")
        samples = samples[:, [channel]]
    elif channels > 1:
        if not cfg.downmix:
            raise AudioError("unsupported_audio", f"{channels} channels and downmix is off")
        samples = samples.mean(axis=1, keepdims=True)
    wave = samples[:, 0]
    if segment is not None:
        duration = len(wave) / rate
        end = duration if segment.end is None else segment.end
        if segment.start >= duration or end > duration + cfg.segment_tolerance_s:
            raise AudioError(
                "segment_outside_recording",
                f"segment {segment.start:.2f}-{end:.2f} s of {segment.recording!r}, which lasts {duration:.2f} s",
            )
        wave = wave[int(round(segment.start * rate)) : int(round(min(end, duration) * rate))]
    if rate != cfg.sample_rate:
        if not cfg.resample:
            raise AudioError(
                "unsupported_audio", f"sample rate {rate} Hz, expected {cfg.sample_rate} and resample is off"
            )
        wave = audio_io.resample(wave, rate, cfg.sample_rate)
    return np.ascontiguousarray(wave, dtype=np.float32)


def compute_fbank(wave: np.ndarray, cfg: FeatureConfig) -> np.ndarray:
    """Kaldi-compatible log-mel fbank (kaldi-native-fbank). float32 [frames, num_mel_bins]."""
    import kaldi_native_fbank as knf

    opts = knf.FbankOptions()
    opts.frame_opts.samp_freq = cfg.sample_rate
    opts.frame_opts.frame_length_ms = cfg.frame_length_ms
    opts.frame_opts.frame_shift_ms = cfg.frame_shift_ms
    opts.frame_opts.dither = cfg.dither
    opts.mel_opts.num_bins = cfg.num_mel_bins
    fbank = knf.OnlineFbank(opts)
    fbank.accept_waveform(cfg.sample_rate, wave.tolist())
    fbank.input_finished()
    frames = fbank.num_frames_ready
    if frames == 0:
        return np.zeros((0, cfg.num_mel_bins), np.float32)
    return np.stack([fbank.get_frame(i) for i in range(frames)]).astype(np.float32)


def featurize_recording(task):
    """Worker: one recording (and all its segments). Returns [(utt, matrix | None, Rejection | None)]."""
    spec, entries, cfg = task
    try:
        rate, samples = kaldi.read_audio(spec, cfg.allow_pipes)
    except AudioError as err:
        return [(e.utt_id, None, kaldi.Rejection(e.utt_id, err.reason, str(err))) for e in entries]
    results = []
    for entry in entries:
        try:
            wave = prepare_waveform(rate, samples, entry.segment, cfg, entry.channel)
        except AudioError as err:
            results.append((entry.utt_id, None, kaldi.Rejection(entry.utt_id, err.reason, f"{spec}: {err}")))
            continue
        feats = compute_fbank(wave, cfg)
        rejection = None
        if feats.shape[0] == 0:
            rejection = kaldi.Rejection(entry.utt_id, "zero_frames", f"{spec}: {len(wave)} samples give no frame")
        elif not np.isfinite(feats).all():  # checked here, so the shard stage need not read the matrix again
            rejection = kaldi.Rejection(entry.utt_id, "nan_or_inf", f"{spec}: the audio gives NaN/Inf features")
        results.append((entry.utt_id, None, rejection) if rejection else (entry.utt_id, feats, None))
    return results


def group_by_recording(entries: list[kaldi.Entry]) -> list[tuple[str, list[kaldi.Entry]]]:
    """Utterances that share a recording are cut from one read of it."""
    groups: dict[str, list[kaldi.Entry]] = collections.OrderedDict()
    for entry in entries:
        groups.setdefault(entry.audio, []).append(entry)
    return list(groups.items())


class CmvnAccumulator:
    """Per-speaker Kaldi CMVN statistics: [2, D+1] float64 (sums and count; sums of squares)."""

    def __init__(self):
        self.stats: dict[str, np.ndarray] = {}

    def add(self, speaker: str, feats: np.ndarray) -> None:
        dim = feats.shape[1]
        stats = self.stats.setdefault(speaker, np.zeros((2, dim + 1), np.float64))
        if stats.shape[1] != dim + 1:
            raise ValueError(f"speaker {speaker!r}: feature dimension {dim} differs from earlier {stats.shape[1] - 1}")
        x = feats.astype(np.float64)
        stats[0, :dim] += x.sum(axis=0)
        stats[0, dim] += len(x)
        stats[1, :dim] += (x * x).sum(axis=0)

    def write(self, data_dir: Path) -> None:
        import kaldiio

        ark, scp = data_dir / "cmvn.ark", data_dir / "cmvn.scp"
        tmp_ark, tmp_scp = data_dir / ".cmvn.ark.tmp", data_dir / ".cmvn.scp.tmp"
        with kaldiio.WriteHelper(f"ark,scp:{tmp_ark},{tmp_scp}") as writer:
            for speaker in sorted(self.stats):
                writer(speaker, self.stats[speaker])
        _finish_ark(tmp_ark, tmp_scp, ark, scp)


def _finish_ark(tmp_ark: Path, tmp_scp: Path, ark: Path, scp: Path) -> None:
    """Renames an ark/scp pair written under temporary names, pointing the scp at the final ark."""
    lines = tmp_scp.read_text(encoding="utf-8").splitlines()
    prefix = f"{tmp_ark}:"
    fixed = []
    for line in sorted(lines):
        key, spec = line.split(" ", 1)
        fixed.append(f"{key} {ark.resolve()}:{spec[len(prefix) :]}" if spec.startswith(prefix) else line)
    tmp_ark.replace(ark)
    fsutil.atomic_write_text(scp, "\n".join(fixed) + "\n" if fixed else "")
    tmp_scp.unlink()


def audio_files(data_dir: Path) -> list[Path]:
    """The files wav.scp's entries read: paths, arks, and the files of recognized decoder commands."""
    if not (data_dir / "wav.scp").is_file():
        return []
    paths = []
    for spec in kaldi.read_table(data_dir / "wav.scp").values.values():
        path = kaldi.spec_path(spec) or audio_io.command_path(spec)
        if path is not None:
            paths.append(path)
    return paths


def _fingerprint(data_dir: Path, cfg: FeatureConfig) -> dict:
    tables = [data_dir / name for name in ("wav.scp", "segments", "utt2spk", "reco2file_and_channel")]
    return {
        "tables": fsutil.fingerprint_files(tables),
        "audio": fsutil.fingerprint_files(audio_files(data_dir), content=False),
        "config": configlib.to_dict(cfg),
        "code": fsutil.code_version(sys.modules[__name__], kaldi, audio_io),
    }


def _outputs_fingerprint(out: Path) -> dict:
    """What the done-marker vouches for: the tables written and the arks they point into."""
    return {
        "tables": fsutil.fingerprint_files([out / "feats.scp", out / "utt2num_frames", out / "cmvn.scp"]),
        "arks": fsutil.fingerprint_files([out / "feats.ark", out / "cmvn.ark"], content=False),
    }


def _copy_tables(source: Path, out: Path, names: tuple[str, ...]) -> None:
    """Copies the tables of `source` into `out` (atomically, only when changed); a table that `out`
    has and `source` lacks is removed from `out`."""
    for name in names:
        src, dst = source / name, out / name
        if src.is_file():
            content = src.read_bytes()
            if not dst.is_file() or dst.read_bytes() != content:
                tmp = dst.with_name(f".{name}.{os.getpid()}.tmp")
                tmp.write_bytes(content)
                tmp.replace(dst)
        elif dst.is_file():
            dst.unlink()


def _is_kaldi_made(source: Path) -> bool:
    """A feats.scp this stage did not write (it marks a directory as its own before writing one)."""
    return (source / "feats.scp").is_file() and fsutil.read_json(source / MARKER) is None


def compute_features(data_dir: Path, cfg: FeatureConfig, progress: bool = True, out_dir: Path | None = None) -> dict:
    """The stage driver: `data_dir`'s audio to features in `out_dir` (default: `data_dir` itself).
    Returns a summary dict; raises ValueError when too much was rejected (and again on every re-run
    until the inputs or the config change)."""
    source = Path(data_dir)
    if not source.is_dir():
        raise FileNotFoundError(f"data directory {source} does not exist")
    out = Path(out_dir) if out_dir is not None else source
    in_place = out.resolve() == source.resolve()
    if not in_place:
        out.mkdir(parents=True, exist_ok=True)
        _copy_tables(source, out, TABLES)
    if _is_kaldi_made(source):
        return _cmvn_for_existing(source, out, progress)
    marker = out / MARKER
    fingerprint = _fingerprint(source, cfg)
    done = _earlier_run(marker, fingerprint, out)
    if done is not None:
        return {**done["summary"], "skipped": True}

    # Mark the directory as ours before feats.scp appears, so an interrupted run is redone on the
    # next one instead of being mistaken for features that Kaldi made.
    fsutil.atomic_write_json(marker, {"fingerprint": None, "state": "running"})
    entries, rejections = kaldi.scan_data_dir(source, allow_pipes=cfg.allow_pipes, need_text=False, source="audio")
    utt2spk = {e.utt_id: e.speaker for e in entries}
    tmp_ark, tmp_scp = out / ".feats.ark.tmp", out / ".feats.scp.tmp"
    desc = f"fbank {source.name}"
    cmvn, num_frames = _write_fbank(entries, utt2spk, rejections, cfg, (tmp_ark, tmp_scp), desc, progress)
    kaldi.write_rejections(out / REJECTED, [(source.name, r) for r in rejections])
    total = len(entries) + sum(1 for r in rejections if r.utt_id not in utt2spk)
    error = _too_many(out, rejections, total, cfg.max_rejected_fraction)
    if error:
        # Nothing of this run is published (and nothing of an earlier one stays to be mistaken for
        # it); the marker holds the failure, so a retry with the same inputs fails the same way.
        for path in (tmp_ark, tmp_scp, *(out / n for n in ("feats.scp", "feats.ark", "utt2num_frames", "cmvn.scp"))):
            path.unlink(missing_ok=True)
        fsutil.atomic_write_json(marker, {"fingerprint": fingerprint, "state": "failed", "error": error})
        raise ValueError(error)
    _finish_ark(tmp_ark, tmp_scp, out / "feats.ark", out / "feats.scp")
    fsutil.atomic_write_text(out / "utt2num_frames", "".join(f"{u} {n}\n" for u, n in sorted(num_frames.items())))
    cmvn.write(out)
    summary = {
        "utterances": total,
        "featurized": total - len(rejections),
        "rejected": len(rejections),
        "frames": sum(num_frames.values()),
        "speakers": len(cmvn.stats),
        "dim": cfg.num_mel_bins,
    }
    outputs = _outputs_fingerprint(out)
    fsutil.atomic_write_json(
        marker, {"fingerprint": fingerprint, "state": "done", "summary": summary, "outputs": outputs}
    )
    return {**summary, "skipped": False}


def _earlier_run(marker: Path, fingerprint: dict, out: Path) -> dict | None:
    """The done-marker of a finished run with this fingerprint (None when there is none); a failed
    run's ValueError again when the inputs and config are unchanged."""
    done = fsutil.read_json(marker) or {}
    if done.get("fingerprint") != fingerprint:
        return None
    if done.get("state") == "failed":
        raise ValueError(f"{done['error']} (inputs and config are unchanged since that run)")
    if done.get("state") == "done" and (out / "feats.scp").is_file():
        return done
    return None


def _write_fbank(
    entries: list,
    utt2spk: dict[str, str],
    rejections: list,
    cfg: FeatureConfig,
    tmp: tuple[Path, Path],
    desc: str,
    progress: bool,
) -> tuple[CmvnAccumulator, dict[str, int]]:
    """Featurizes every recording in worker processes into the ark/scp pair `tmp` (in the pool's order),
    appending the utterances that fail to `rejections`. Returns (per-speaker CMVN, utterance -> frames)."""
    import kaldiio

    tasks = [(spec, group, cfg) for spec, group in group_by_recording(entries)]
    jobs = cfg.jobs or os.cpu_count() or 1
    cmvn = CmvnAccumulator()
    num_frames: dict[str, int] = {}
    bar = progress_bar(total=len(entries), desc=desc, unit="utt", disable=not progress)
    with worker_pool(jobs) as pool, kaldiio.WriteHelper(f"ark,scp:{tmp[0]},{tmp[1]}") as writer:
        for results in pool.imap(featurize_recording, tasks):
            for utt, feats, rejection in results:
                if rejection is not None:
                    rejections.append(rejection)
                else:
                    writer(utt, feats)
                    cmvn.add(utt2spk[utt], feats)
                    num_frames[utt] = len(feats)
            bar.update(len(results))
    bar.close()
    return cmvn, num_frames


def vouched_lengths(data_dir: Path) -> tuple[dict[str, int], int] | None:
    """(utterance -> frames from utt2num_frames, feature dimension) when this stage wrote the
    directory's features and they are unchanged since; None otherwise.

    The stage checked every matrix as it wrote it (frames, finite values), so the shard stage can
    take the lengths from here instead of reading every matrix once more before writing it.
    """
    data_dir = Path(data_dir)
    done = fsutil.read_json(data_dir / MARKER) or {}
    if done.get("state") != "done" or done.get("outputs") != _outputs_fingerprint(data_dir):
        return None
    try:
        lengths = {utt: int(n) for utt, n in kaldi.read_table(data_dir / "utt2num_frames").values.items()}
    except (ValueError, FileNotFoundError):
        return None
    return lengths, int(done["summary"]["dim"])


def _cmvn_for_existing(source: Path, out: Path, progress: bool) -> dict:
    """Kaldi-made features: keep them (a copy of the tables in `out`), add CMVN statistics if there are none."""
    if out.resolve() != source.resolve():
        (out / MARKER).unlink(missing_ok=True)  # features this stage made there before are replaced
        _copy_tables(source, out, KALDI_FEATURES[:1] + KALDI_FEATURES[2:])
        if (source / "cmvn.scp").is_file():
            _copy_tables(source, out, ("cmvn.scp",))
    if (out / "cmvn.scp").is_file():
        return {"skipped": True, "existing_features": True}
    entries, _ = kaldi.scan_data_dir(out, need_text=False, source="feats")
    cmvn = CmvnAccumulator()
    for entry in progress_bar(entries, desc=f"cmvn {source.name}", unit="utt", disable=not progress):
        # Unreadable matrices are the shard stage's to reject, with reasons; statistics skip them.
        matrix, rejection = kaldi.check_matrix(entry.utt_id, entry.feats, kaldi.FeatureCheck(max_frames=10**9), None)
        if rejection is None:
            cmvn.add(entry.speaker, matrix)
    cmvn.write(out)
    return {"skipped": False, "existing_features": True, "speakers": len(cmvn.stats)}


def _too_many(out: Path, rejections: list, total: int, limit: float) -> str | None:
    """The stage's error message when more than `limit` of `total` utterances were rejected, else None."""
    if not total or len(rejections) / total <= limit:
        return None
    message = (
        f"{len(rejections)} of {total} utterances in {out} were rejected "
        f"({len(rejections) / total:.1%} > max_rejected_fraction={limit}); see {out / REJECTED}. "
        f"Most common: {kaldi.summarize(rejections)}"
    )
    if any(r.reason == "pipe_refused" for r in rejections):
        message += (
            ". pipe_refused: wav.scp entries that are commands other than flac, sph2pipe or sox decoding "
            "one file; the detail column says why each was not read. --allow-pipes runs them in a shell"
        )
    return message


def recorded_config(shards, split: str = "train") -> dict | None:
    """The FeatureConfig (as a dict) that this stage used for `split` of a shard set (pipeline/records.py
    `ShardSet`), from the done-marker in the split's data directory; None when the stage did not make
    those features (Kaldi made them) or the directory is not readable from here. A trained model's
    data.json records it, so that serving featurizes audio as training's features were made."""
    data_dir = shards.splits[split].data_dir if split in shards.splits else None
    marker = fsutil.read_json(Path(data_dir) / MARKER) if data_dir else None
    if not marker or marker.get("state") != "done":
        return None
    return (marker.get("fingerprint") or {}).get("config")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--data-dir", required=True, type=Path, help="Kaldi data directory (wav.scp, utt2spk, ...)")
    parser.add_argument(
        "--out-dir",
        type=Path,
        help="write the features (and copies of the data directory's tables) here instead of into --data-dir",
    )
    parser.add_argument(
        "--allow-pipes",
        action="store_true",
        help="run wav.scp commands other than the decoders read in-process (flac, sph2pipe, sox) in a shell",
    )
    cli.add_jobs_argument(parser)
    cli.add_config_arguments(parser, "FeatureConfig")
    cli.add_progress_argument(parser)
    args = parser.parse_args(argv)
    return cli.run(lambda: _main(args))


def _main(args: argparse.Namespace) -> None:
    flags = {"allow_pipes": args.allow_pipes or None, "jobs": args.jobs}
    cfg = configlib.load(FeatureConfig, args.config, args.set, flags=flags)
    summary = compute_features(args.data_dir, cfg, progress=not args.no_progress, out_dir=args.out_dir)
    print(" ".join(f"{k}={v}" for k, v in summary.items()))


if __name__ == "__main__":
    sys.exit(main())
