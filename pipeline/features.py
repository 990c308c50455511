"""Feature stage: Kaldi-compatible log-mel fbank from `wav.scp` (+ `segments`), and per-speaker CMVN.

    python -m pipeline.features --data-dir data/train [--allow-pipes] [--set num_mel_bins=40]

When the directory already has a `feats.scp` that this stage did not write (features made by
Kaldi), it is left alone and only the CMVN statistics are computed if they are missing. Output,
beside the inputs: `feats.ark`/`feats.scp` (kaldiio), `cmvn.ark`/`cmvn.scp` (Kaldi's per-speaker
2 x (D+1) statistics), `feats_rejected.tsv` (utterances whose audio could not be used, with the
reason; the shard stage carries them into its own `rejected.tsv`) and a done-marker recording
the input fingerprint, so a re-run with unchanged inputs does nothing.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import os
import struct
import sys
from pathlib import Path

import numpy as np

from common import cli, fsutil
from common import config as configlib
from common.parallel import worker_pool
from common.progress import progress as progress_bar
from pipeline import kaldi

MARKER = ".features.done.json"
REJECTED = "feats_rejected.tsv"


@dataclasses.dataclass(frozen=True)
class FeatureConfig:
    num_mel_bins: int = 80  # log-mel bins
    sample_rate: int = 16000  # Hz; other rates are resampled to it (or rejected, see resample)
    frame_length_ms: float = 25.0  # analysis window
    frame_shift_ms: float = 10.0  # hop
    dither: float = 0.0  # Kaldi's default is 1.0; 0 keeps features deterministic
    resample: bool = True  # False: reject recordings at another sample rate instead
    downmix: bool = True  # False: reject multi-channel recordings instead of averaging channels
    segment_tolerance_s: float = 0.1  # a segment may end this far past its recording (Kaldi allows overshoot)
    allow_pipes: bool = False  # run `cmd |` entries of wav.scp (kaldiio would execute them)
    max_rejected_fraction: float = 0.05  # fail the stage above this share of rejected utterances
    jobs: int = 0  # worker processes; 0 = one per CPU


class AudioError(Exception):
    """Audio that cannot be used; `reason` is a key of kaldi.REASONS."""

    def __init__(self, reason: str, detail: str):
        super().__init__(detail)
        self.reason = reason


def _check_riff(path: Path) -> None:
    """Raises AudioError('truncated') when a WAV's data chunk is longer than the file.

    libsndfile (soundfile) silently returns the samples that exist, so a half-copied file would
    be read as a shorter utterance; the header tells us what should be there.
    """
    size = path.stat().st_size
    with open(path, "rb") as handle:
        head = handle.read(12)
        if len(head) < 12 or head[:4] != b"RIFF" or head[8:12] != b"WAVE":
            return  # not a RIFF WAV: soundfile decides
        pos = 12
        while pos + 8 <= size:
            handle.seek(pos)
            chunk_id, length = struct.unpack("<4sI", handle.read(8))
            if chunk_id == b"data":
                # 0 and 0xFFFFFFFF mean "unknown length" (a WAV written to a pipe).
                if length not in (0, 0xFFFFFFFF) and pos + 8 + length > size:
                    raise AudioError(
                        "truncated", f"{path}: header announces {length} data bytes, file has {size - pos - 8}"
                    )
                return
            pos += 8 + length + (length & 1)
    raise AudioError("truncated", f"{path}: no complete data chunk")


def read_audio(spec: str, allow_pipes: bool) -> tuple[int, np.ndarray]:
    """Reads one wav.scp entry. Returns (rate, samples float32 [n, channels] on the int16 scale)."""
    import kaldiio
    import soundfile

    if kaldi.is_pipe(spec):
        if not allow_pipes:
            raise AudioError("pipe_refused", f"{spec!r} is a command; pass --allow-pipes to run it")
        try:
            rate, data = kaldiio.load_mat(spec)
        except Exception as err:  # the command's failure, whatever it is, is this utterance's reason
            raise AudioError("unreadable", f"{spec!r}: {type(err).__name__}: {err}") from err
        data = np.asarray(data, dtype=np.float32)
        return rate, data.reshape(len(data), -1)
    path = kaldi.spec_path(spec)
    if not path.is_file():
        raise AudioError("file_missing", f"{path} does not exist")
    try:
        if path == Path(spec):
            _check_riff(path)
            data, rate = soundfile.read(str(path), dtype="float32", always_2d=True)
            return rate, data * 32768.0  # Kaldi computes fbank on the int16 scale
        rate, data = kaldiio.load_mat(spec)  # a wav inside an ark (`foo.ark:123`)
        data = np.asarray(data, dtype=np.float32)
        return rate, data.reshape(len(data), -1)
    except AudioError:
        raise
    except Exception as err:  # libsndfile raises its own error types for every malformed file
        raise AudioError("unreadable", f"{spec}: {type(err).__name__}: {err}") from err


def prepare_waveform(rate: int, samples: np.ndarray, segment: kaldi.Segment | None, cfg: FeatureConfig) -> np.ndarray:
    """Cuts the segment, mixes down and resamples: float32 [n] at cfg.sample_rate, int16 scale."""
    from scipy.signal import resample_poly

    channels = samples.shape[1]
    if channels > 1:
        if not cfg.downmix:
            raise AudioError("unsupported_audio", f"{channels} channels and downmix is off")
        samples = samples.mean(axis=1, keepdims=True)
    wave = samples[:, 0]
    if segment is not None:
        duration = len(wave) / rate
        if segment.start >= duration or segment.end > duration + cfg.segment_tolerance_s:
            raise AudioError(
                "segment_outside_recording",
                f"segment {segment.start:.2f}-{segment.end:.2f} s of {segment.recording!r}, which lasts {duration:.2f} s",
            )
        wave = wave[int(round(segment.start * rate)) : int(round(min(segment.end, duration) * rate))]
    if rate != cfg.sample_rate:
        if not cfg.resample:
            raise AudioError(
                "unsupported_audio", f"sample rate {rate} Hz, expected {cfg.sample_rate} and resample is off"
            )
        divisor = np.gcd(rate, cfg.sample_rate)
        wave = resample_poly(wave, cfg.sample_rate // divisor, rate // divisor)
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


def _featurize_recording(task):
    """Worker: one recording (and all its segments). Returns [(utt, matrix | None, Rejection | None)]."""
    spec, entries, cfg = task
    try:
        rate, samples = read_audio(spec, cfg.allow_pipes)
    except AudioError as err:
        return [(e.utt_id, None, kaldi.Rejection(e.utt_id, err.reason, str(err))) for e in entries]
    results = []
    for entry in entries:
        try:
            wave = prepare_waveform(rate, samples, entry.segment, cfg)
        except AudioError as err:
            results.append((entry.utt_id, None, kaldi.Rejection(entry.utt_id, err.reason, f"{spec}: {err}")))
            continue
        feats = compute_fbank(wave, cfg)
        if feats.shape[0] == 0:
            results.append(
                (
                    entry.utt_id,
                    None,
                    kaldi.Rejection(entry.utt_id, "zero_frames", f"{spec}: {len(wave)} samples give no frame"),
                )
            )
        else:
            results.append((entry.utt_id, feats, None))
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
    fsutil.atomic_write_text(scp, "\n".join(fixed) + "\n")
    tmp_scp.unlink()


def _fingerprint(data_dir: Path, cfg: FeatureConfig) -> dict:
    tables = [data_dir / name for name in ("wav.scp", "segments", "utt2spk")]
    audio: list[Path] = []
    if (data_dir / "wav.scp").is_file():
        for spec in kaldi.read_table(data_dir / "wav.scp").values.values():
            path = kaldi.spec_path(spec)
            if path is not None:
                audio.append(path)
    return {
        "tables": fsutil.fingerprint_files(tables),
        "audio": fsutil.fingerprint_files(audio, content=False),
        "config": configlib.to_dict(cfg),
        "code": fsutil.code_version(sys.modules[__name__], kaldi),
    }


def compute_features(data_dir: Path, cfg: FeatureConfig, progress: bool = True) -> dict:
    """The stage driver. Returns a summary dict; raises ValueError when too much was rejected."""
    data_dir = Path(data_dir)
    marker = data_dir / MARKER
    feats_scp = data_dir / "feats.scp"
    done = fsutil.read_json(marker)
    if feats_scp.is_file() and done is None:
        return _cmvn_for_existing(data_dir, progress)
    fingerprint = _fingerprint(data_dir, cfg)
    if done is not None and done.get("fingerprint") == fingerprint and feats_scp.is_file():
        return {**done["summary"], "skipped": True}

    # Mark the directory as ours before feats.scp appears, so an interrupted run is redone on the
    # next one instead of being mistaken for features that Kaldi made.
    fsutil.atomic_write_json(marker, {"fingerprint": None, "state": "running"})
    entries, rejections = kaldi.scan_data_dir(data_dir, allow_pipes=cfg.allow_pipes, need_text=False, source="audio")
    utt2spk = {e.utt_id: e.speaker for e in entries}
    tasks = [(spec, group, cfg) for spec, group in group_by_recording(entries)]
    jobs = cfg.jobs or os.cpu_count() or 1
    tmp_ark, tmp_scp = data_dir / ".feats.ark.tmp", data_dir / ".feats.scp.tmp"
    cmvn = CmvnAccumulator()
    frames = 0
    import kaldiio

    bar = progress_bar(total=len(entries), desc=f"fbank {data_dir.name}", unit="utt", disable=not progress)
    with worker_pool(jobs) as pool, kaldiio.WriteHelper(f"ark,scp:{tmp_ark},{tmp_scp}") as writer:
        for results in pool.imap(_featurize_recording, tasks):
            for utt, feats, rejection in results:
                if rejection is not None:
                    rejections.append(rejection)
                else:
                    writer(utt, feats)
                    cmvn.add(utt2spk[utt], feats)
                    frames += len(feats)
            bar.update(len(results))
    bar.close()
    _finish_ark(tmp_ark, tmp_scp, data_dir / "feats.ark", feats_scp)
    cmvn.write(data_dir)
    kaldi.write_rejections(data_dir / REJECTED, [(data_dir.name, r) for r in rejections])
    total = len(entries) + sum(1 for r in rejections if r.utt_id not in utt2spk)
    summary = {
        "utterances": total,
        "featurized": total - len(rejections),
        "rejected": len(rejections),
        "frames": frames,
        "speakers": len(cmvn.stats),
        "dim": cfg.num_mel_bins,
    }
    fsutil.atomic_write_json(marker, {"fingerprint": fingerprint, "summary": summary})
    _raise_if_too_many(data_dir, rejections, total, cfg.max_rejected_fraction)
    return {**summary, "skipped": False}


def _cmvn_for_existing(data_dir: Path, progress: bool) -> dict:
    """Kaldi-made features: keep them, add CMVN statistics if there are none."""
    if (data_dir / "cmvn.scp").is_file():
        return {"skipped": True, "existing_features": True}
    entries, _ = kaldi.scan_data_dir(data_dir, need_text=False, source="feats")
    cmvn = CmvnAccumulator()
    for entry in progress_bar(entries, desc=f"cmvn {data_dir.name}", unit="utt", disable=not progress):
        # Unreadable matrices are the shard stage's to reject, with reasons; statistics skip them.
        matrix, rejection = kaldi.check_matrix(entry.utt_id, entry.feats, kaldi.FeatureCheck(max_frames=10**9), None)
        if rejection is None:
            cmvn.add(entry.speaker, matrix)
    cmvn.write(data_dir)
    return {"skipped": False, "existing_features": True, "speakers": len(cmvn.stats)}


def _raise_if_too_many(data_dir: Path, rejections: list, total: int, limit: float) -> None:
    if total and len(rejections) / total > limit:
        raise ValueError(
            f"{len(rejections)} of {total} utterances in {data_dir} were rejected "
            f"({len(rejections) / total:.1%} > max_rejected_fraction={limit}); see {data_dir / REJECTED}. "
            f"Most common: {kaldi.summarize(rejections)}"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--data-dir", required=True, type=Path, help="Kaldi data directory (wav.scp, utt2spk, ...)")
    parser.add_argument("--allow-pipes", action="store_true", help="run 'cmd |' entries of wav.scp as shell commands")
    cli.add_jobs_argument(parser)
    cli.add_config_arguments(parser, "FeatureConfig")
    cli.add_progress_argument(parser)
    args = parser.parse_args(argv)
    return cli.run(lambda: _main(args))


def _main(args: argparse.Namespace) -> None:
    flags = {"allow_pipes": args.allow_pipes or None, "jobs": args.jobs}
    cfg = configlib.load(FeatureConfig, args.config, args.set, flags=flags)
    summary = compute_features(args.data_dir, cfg, progress=not args.no_progress)
    print(" ".join(f"{k}={v}" for k, v in summary.items()))


if __name__ == "__main__":
    sys.exit(main())
