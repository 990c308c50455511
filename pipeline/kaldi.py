"""Reading Kaldi data directories, and validating every utterance in them.

A Kaldi data directory is a set of text tables keyed by utterance id: `text`, `utt2spk`,
`feats.scp` (or `wav.scp` + optional `segments` and `reco2file_and_channel`), optional `cmvn.scp`
keyed by speaker. The tables are parsed here, not by kaldiio, for two reasons: an scp entry of the
form `command |` would be run as a shell command by kaldiio, and we refuse those unless the user
allows pipes (a `wav.scp` entry that calls one of the decoders of Kaldi recipes, flac, sph2pipe or
sox, is read in-process instead: pipeline/audio_io.py); and a malformed table must produce a
message naming its file and line.

Nothing is dropped silently. Every utterance either comes out as valid or as a `Rejection`
with one of the reason codes in `REASONS`; the stages write those to `rejected.tsv`.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from pipeline import audio_io
from pipeline.audio_io import AudioError

# reason code -> what it means (also the legend written next to rejected.tsv)
REASONS = {
    "missing_features": "the utterance has no entry in feats.scp",
    "missing_transcript": "the utterance has no entry in text",
    "missing_speaker": "the utterance has no entry in utt2spk",
    "missing_audio": "the utterance's recording has no entry in wav.scp",
    "missing_alignment": "frame targets were requested but the utterance has none",
    "file_missing": "the file an scp entry points to does not exist",
    "unreadable": "the matrix or audio could not be read",
    "truncated": "the file ends before the data its header announces",
    "unsupported_audio": "audio format that cannot be converted to 16 kHz mono",
    "segment_outside_recording": "segments start/end lies outside the recording",
    "bad_segment": "a segments line with start >= end or unparsable times",
    "nan_or_inf": "the features contain NaN or Inf",
    "wrong_dimension": "feature dimension differs from the rest of the split",
    "zero_frames": "the features have no frames",
    "too_many_frames": "more frames than the configured maximum",
    "alignment_length_mismatch": "frame targets and features differ in length",
    "empty_transcript": "the transcript is empty",
    "undecodable_transcript": "the transcript is not valid UTF-8",
    "duplicate_id": "the same id appears twice with different data",
    "pipe_refused": (
        "an scp entry is a command ('cmd |') the stage does not read itself; --allow-pipes runs it in a shell"
    ),
}


@dataclasses.dataclass(frozen=True)
class Rejection:
    """One utterance that did not make it, and why."""

    utt_id: str
    reason: str  # a key of REASONS
    detail: str  # names the file and what was found

    def __post_init__(self):
        if self.reason not in REASONS:
            raise ValueError(f"unknown rejection reason {self.reason!r}")


@dataclasses.dataclass(frozen=True)
class Table:
    """A parsed Kaldi table: key -> value, plus what was wrong with some keys."""

    path: Path
    values: dict[str, str]
    duplicates: frozenset[str]  # keys seen twice with different values
    undecodable: frozenset[str]  # keys whose value is not UTF-8


def is_pipe(spec: str) -> bool:
    """True for Kaldi rxspecifiers that run a command (`cmd |`, `| cmd`)."""
    stripped = spec.strip()
    return stripped.endswith("|") or stripped.startswith("|")


def read_table(path: Path, allow_empty_value: bool = True) -> Table:
    """Parses `key value...` lines (the value keeps its inner spaces).

    The same key twice with identical values is harmless (kept once); with different values it
    is recorded in `duplicates`, so that neither version is used. Lines are decoded as UTF-8 per
    line, so one bad transcript does not hide the others.
    """
    values: dict[str, str] = {}
    duplicates: set[str] = set()
    undecodable: set[str] = set()
    with open(path, "rb") as handle:
        for number, raw in enumerate(handle, start=1):
            line = raw.rstrip(b"\r\n")
            if not line.strip():
                continue
            parts = line.strip().split(maxsplit=1)
            try:
                key = parts[0].decode("utf-8")
            except UnicodeDecodeError as err:
                raise ValueError(f"{path}:{number}: the key is not UTF-8 ({err}); fix the file") from err
            value_bytes = parts[1] if len(parts) > 1 else b""
            try:
                value = value_bytes.decode("utf-8").strip()
            except UnicodeDecodeError:
                undecodable.add(key)
                value = value_bytes.decode("utf-8", errors="replace").strip()
            if not value and not allow_empty_value:
                raise ValueError(f"{path}:{number}: {key!r} has no value")
            if key in values and values[key] != value:
                duplicates.add(key)
            values[key] = value
    return Table(Path(path), values, frozenset(duplicates), frozenset(undecodable))


def read_optional_table(path: Path) -> Table | None:
    return read_table(path) if Path(path).is_file() else None


@dataclasses.dataclass(frozen=True)
class Segment:
    """An utterance cut from a recording (Kaldi `segments`): times in seconds."""

    recording: str
    start: float
    end: float | None  # None: to the end of the recording (-1 in the file)


@dataclasses.dataclass(frozen=True)
class Entry:
    """One utterance of a data directory, before its features or audio are read."""

    utt_id: str
    speaker: str
    transcript: str | None  # None when the directory has no `text` (features only)
    feats: str | None  # rxspecifier from feats.scp
    audio: str | None  # rxspecifier from wav.scp (of the recording, when segmented)
    segment: Segment | None
    # The 0-based channel to keep when the recording has several: the 5th field of `segments`, else
    # the channel `reco2file_and_channel` names (A/B or 1/2). None: the feature stage's downmix rule.
    channel: int | None = None


def scan_data_dir(
    data_dir: Path, allow_pipes: bool = False, need_text: bool = True, source: str = "feats"
) -> tuple[list[Entry], list[Rejection]]:
    """Reads a data directory's tables and checks everything that needs no matrix or audio.

    `source`: "feats" (utterances come from feats.scp) or "audio" (from wav.scp + segments).
    Returns the entries that passed, sorted by id, and the rejections.
    """
    data_dir = Path(data_dir)
    if not data_dir.is_dir():
        raise FileNotFoundError(f"data directory {data_dir} does not exist")
    utt2spk_path = data_dir / "utt2spk"
    if not utt2spk_path.is_file():
        raise FileNotFoundError(f"{utt2spk_path} is missing: every Kaldi data directory needs utt2spk")
    utt2spk = read_table(utt2spk_path)
    text = read_optional_table(data_dir / "text")
    if need_text and text is None:
        raise FileNotFoundError(f"{data_dir / 'text'} is missing: training needs transcripts")

    feats = read_optional_table(data_dir / "feats.scp") if source == "feats" else None
    wav = segments = reco2channel = None
    if source == "feats" and feats is None:
        raise FileNotFoundError(
            f"{data_dir / 'feats.scp'} is missing: run `python -m pipeline.features --data-dir {data_dir}` first"
        )
    if source == "audio":
        wav = read_optional_table(data_dir / "wav.scp")
        if wav is None:
            raise FileNotFoundError(f"{data_dir / 'wav.scp'} is missing: nothing to compute features from")
        segments = read_optional_table(data_dir / "segments")
        reco2channel = read_optional_table(data_dir / "reco2file_and_channel")

    # Every id any table mentions is accounted for, so an utterance present in only one table is
    # reported instead of vanishing.
    ids: set[str] = set(utt2spk.values)
    if text is not None:
        ids |= set(text.values)
    if feats is not None:
        ids |= set(feats.values)
    if segments is not None:
        ids |= set(segments.values)
    elif wav is not None:
        ids |= set(wav.values)

    entries, rejections = [], []
    for utt in sorted(ids):
        entry, rejection = _check_entry(utt, utt2spk, text, feats, wav, segments, reco2channel, allow_pipes, need_text)
        if rejection:
            rejections.append(rejection)
        else:
            entries.append(entry)
    return entries, rejections


class _Refused(Exception):
    """An utterance's entry fails a check of `scan_data_dir`: `reason` (a key of REASONS) and `detail`."""

    def __init__(self, reason: str, detail: str):
        super().__init__(detail)
        self.reason, self.detail = reason, detail


def _check_entry(utt, utt2spk, text, feats, wav, segments, reco2channel, allow_pipes, need_text):
    """(the utterance's Entry, None), or (None, its Rejection): the checks in the order REASONS reports them."""
    try:
        for table in (utt2spk, text, feats, segments):
            if table is not None and utt in table.duplicates:
                raise _Refused("duplicate_id", f"{table.path} lists {utt!r} twice with different values")
        if utt not in utt2spk.values:
            raise _Refused("missing_speaker", f"{utt2spk.path} has no line for {utt!r}")
        transcript = _transcript(utt, text, need_text) if text is not None else None
        feats_spec = _feats_spec(utt, feats, allow_pipes) if feats is not None else None
        audio_spec, segment, channel = None, None, None
        if wav is not None:
            audio_spec, segment, channel = _audio(utt, wav, segments, reco2channel, allow_pipes)
    except _Refused as refused:
        return None, Rejection(utt, refused.reason, refused.detail)
    return Entry(utt, utt2spk.values[utt], transcript, feats_spec, audio_spec, segment, channel), None


def _transcript(utt: str, text: Table, need_text: bool) -> str | None:
    """The utterance's transcript (None when `text` lacks it and none is needed)."""
    if utt not in text.values:
        if need_text:
            raise _Refused("missing_transcript", f"{text.path} has no line for {utt!r}")
        return None
    if utt in text.undecodable:
        raise _Refused("undecodable_transcript", f"{text.path}: the transcript of {utt!r} is not valid UTF-8")
    if not text.values[utt]:
        raise _Refused("empty_transcript", f"{text.path}: {utt!r} has an empty transcript")
    return text.values[utt]


def _feats_spec(utt: str, feats: Table, allow_pipes: bool) -> str:
    """The utterance's feats.scp entry; a command only with `allow_pipes`."""
    if utt not in feats.values:
        raise _Refused("missing_features", f"{feats.path} has no line for {utt!r}")
    spec = feats.values[utt]
    if is_pipe(spec) and not allow_pipes:
        raise _Refused(
            "pipe_refused",
            f"{feats.path}: {utt!r} -> {spec!r} is a command, not run; write the features to an "
            "ark (Kaldi's copy-feats) or pass --allow-pipes to run it in a shell",
        )
    return spec


def _audio(
    utt: str, wav: Table, segments: Table | None, reco2channel: Table | None, allow_pipes: bool
) -> tuple[str, Segment | None, int | None]:
    """(the wav.scp entry of the utterance's recording, its segment or None, its 0-based channel or None)."""
    recording, segment, channel = utt, None, None
    if segments is not None:
        segment, channel = _segment(utt, segments)
        recording = segment.recording
    if recording not in wav.values:
        raise _Refused("missing_audio", f"{wav.path} has no line for recording {recording!r} of {utt!r}")
    if recording in wav.duplicates:
        raise _Refused("duplicate_id", f"{wav.path} lists {recording!r} twice with different values")
    audio_spec = wav.values[recording]
    why = _not_a_decoder(audio_spec) if is_pipe(audio_spec) and not allow_pipes else None
    if why is not None:
        raise _Refused(
            "pipe_refused",
            f"{wav.path}: recording {recording!r} is the command {audio_spec!r}, which is not run: {why}. "
            "List the audio files themselves (WAV, FLAC, SPHERE), or pass --allow-pipes "
            "(the DAG's allow_pipes) to run it in a shell",
        )
    if channel is None and reco2channel is not None and recording in reco2channel.values:
        channel = _channel_index(reco2channel.values[recording])
    return audio_spec, segment, channel


def _segment(utt: str, segments: Table) -> tuple[Segment, int | None]:
    """The utterance's line of `segments`: `recording start end [channel]`, end -1 for the recording's end."""
    if utt not in segments.values:
        raise _Refused("missing_audio", f"{segments.path} has no line for {utt!r}")
    fields = segments.values[utt].split()
    try:
        recording, start, end = fields[0], float(fields[1]), float(fields[2])
        channel = int(fields[3]) if len(fields) == 4 else None
        if len(fields) not in (3, 4) or (channel is not None and channel < 0):
            raise ValueError
    except (IndexError, ValueError):
        raise _Refused(
            "bad_segment",
            f"{segments.path}: cannot parse {segments.values[utt]!r} for {utt!r} "
            "(expected `recording start end [channel]`)",
        ) from None
    if end == -1:  # Kaldi: to the end of the recording
        end = None
    if start < 0 or (end is not None and start >= end):
        raise _Refused("bad_segment", f"{segments.path}: {utt!r} has start {start} and end {end}")
    return Segment(recording, start, end), channel


@functools.lru_cache(maxsize=1024)
def _not_a_decoder(spec: str) -> str | None:
    """Why a `cmd |` entry is not a decoder call read in-process; None when it is one. Cached: the
    segments of one recording ask about the same entry."""
    try:
        audio_io.parse_command(spec)
    except audio_io.UnsupportedCommand as err:
        return str(err)
    return None


def _channel_index(value: str) -> int | None:
    """`reco2file_and_channel`'s last field (`sw02001 A`, `rec 1`) -> a 0-based channel."""
    name = value.split()[-1] if value.split() else ""
    if name.upper() in ("A", "B"):
        return "AB".index(name.upper())
    return int(name) - 1 if name.isdigit() and int(name) >= 1 else None


def spec_path(spec: str) -> Path | None:
    """The file an rxspecifier reads (`foo.ark:123[0:9]` -> foo.ark); None for pipes."""
    if is_pipe(spec):
        return None
    name = spec.split("[", 1)[0] if spec.rstrip().endswith("]") else spec
    head, sep, tail = name.rpartition(":")
    return Path(head if sep and tail.isdigit() else name)


@dataclasses.dataclass(frozen=True)
class FeatureCheck:
    """Limits every feature matrix is held to."""

    max_frames: int = 3000  # 30 s at a 10 ms shift; longer utterances starve a batch
    expected_dim: int | None = None  # None: the split's most common dimension


def load_matrix(spec: str) -> np.ndarray:
    """Reads one matrix (binary, compressed CM/CM2/CM3, or text) through kaldiio. float32 [frames, dim]."""
    import kaldiio

    path = spec_path(spec)
    if path is not None and not path.is_file():
        raise FileNotFoundError(f"{path} does not exist")
    matrix = kaldiio.load_mat(spec)
    if isinstance(matrix, tuple):
        raise ValueError("the entry holds audio, not a feature matrix")
    matrix = np.asarray(matrix, dtype=np.float32)
    if matrix.ndim != 2:
        raise ValueError(f"expected a matrix, got an array of shape {matrix.shape}")
    return matrix


def check_matrix(
    utt: str, spec: str, check: FeatureCheck, dim: int | None
) -> tuple[np.ndarray | None, Rejection | None]:
    """Loads and checks one utterance's features: the matrix, or why it was rejected."""
    try:
        matrix = load_matrix(spec)
    except FileNotFoundError as err:
        return None, Rejection(utt, "file_missing", f"{spec}: {err}")
    except (EOFError, ValueError, OSError, AssertionError, IndexError, UnicodeDecodeError) as err:
        reason = "truncated" if _looks_truncated(err) else "unreadable"
        return None, Rejection(utt, reason, f"{spec}: {type(err).__name__}: {err}")
    if matrix.shape[0] == 0:
        return None, Rejection(utt, "zero_frames", f"{spec} has 0 frames")
    if matrix.shape[0] > check.max_frames:
        return None, Rejection(
            utt, "too_many_frames", f"{spec} has {matrix.shape[0]} frames > max_frames={check.max_frames}"
        )
    if dim is not None and matrix.shape[1] != dim:
        return None, Rejection(utt, "wrong_dimension", f"{spec} has dimension {matrix.shape[1]}, the split has {dim}")
    if not np.isfinite(matrix).all():
        return None, Rejection(utt, "nan_or_inf", f"{spec} contains {int((~np.isfinite(matrix)).sum())} NaN/Inf values")
    return matrix, None


def read_audio(spec: str, allow_pipes: bool) -> tuple[int, np.ndarray]:
    """Reads one wav.scp entry. Returns (rate, samples float32 [n, channels] on the int16 scale).

    A file is read with libsndfile; a decoder command of a Kaldi recipe (flac, sph2pipe, sox) is
    read in-process as the command would decode it (pipeline/audio_io.py); any other command runs in
    a shell (through kaldiio) only when `allow_pipes`, and so does a recognized command whose file
    libsndfile cannot decode (shorten-compressed SPHERE).
    """
    if is_pipe(spec):
        try:
            source = audio_io.parse_command(spec)
        except audio_io.UnsupportedCommand as err:
            if not allow_pipes:
                raise AudioError("pipe_refused", f"{spec!r} is a command, not run: {err}; pass --allow-pipes") from err
            return _read_with_kaldiio(spec)
        try:
            return audio_io.read_source(source)
        except audio_io.CompressedSphere:
            if not allow_pipes:
                raise
            return _read_with_kaldiio(spec)
    path = spec_path(spec)
    if path == Path(spec):
        return audio_io.read_file(path)
    if not path.is_file():
        raise AudioError("file_missing", f"{path} does not exist")
    return _read_with_kaldiio(spec)  # a wav inside an ark (`foo.ark:123`): kaldiio reads it without a shell


def _read_with_kaldiio(spec: str) -> tuple[int, np.ndarray]:
    import kaldiio

    try:
        rate, data = kaldiio.load_mat(spec)
    except Exception as err:  # the command's or the ark's failure, whatever it is, is this utterance's reason
        raise AudioError("unreadable", f"{spec!r}: {type(err).__name__}: {err}") from err
    if np.asarray(data).dtype == np.uint8:
        # kaldiio hands out the bytes of 8-bit wavs as they are, u-law codes included (sox keeps a
        # u-law input's encoding unless told otherwise): as samples they would be noise.
        raise AudioError(
            "unsupported_audio",
            f"{spec!r} gives 8-bit samples (u-law?); make it write 16-bit PCM (sox: -b 16 -e signed)",
        )
    data = np.asarray(data, dtype=np.float32)
    return rate, data.reshape(len(data), -1)


def _looks_truncated(err: Exception) -> bool:
    # kaldiio reads short files without a dedicated error: numpy or struct complain about sizes.
    text = str(err).lower()
    return isinstance(err, EOFError) or any(
        marker in text for marker in ("buffer size", "unpack requires", "cannot reshape", "end of file", "truncat")
    )


def load_alignments(path: Path, allow_pipes: bool = False) -> dict[str, str]:
    """`ali.scp` (or an ark of int32 pdf-id vectors) -> utt -> rxspecifier/ark entry."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"alignment file {path} does not exist")
    if path.suffix == ".scp":
        table = read_table(path)
        for utt, spec in table.values.items():
            if is_pipe(spec) and not allow_pipes:
                raise ValueError(f"{path}: {utt!r} -> {spec!r} is a command; pass --allow-pipes to run it")
        return dict(table.values)
    import kaldiio

    return {utt: np.asarray(vec, dtype=np.int32) for utt, vec in kaldiio.load_ark(str(path))}


def most_common_dim(dims: Iterable[int]) -> int | None:
    counts = collections.Counter(dims)
    return counts.most_common(1)[0][0] if counts else None


def summarize(rejections: list[Rejection], top: int = 3) -> str:
    """'12 x nan_or_inf, 3 x file_missing' for the most common reasons."""
    counts = collections.Counter(r.reason for r in rejections)
    return ", ".join(f"{n} x {reason}" for reason, n in counts.most_common(top))


def write_rejections(path: Path, rejections: list[tuple[str, Rejection]]) -> None:
    """Writes `split<TAB>utt_id<TAB>reason<TAB>detail` rows (atomically), sorted."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as handle:
        handle.write("split\tutt_id\treason\tdetail\n")
        for split, rej in sorted(rejections, key=lambda item: (item[0], item[1].utt_id)):
            detail = rej.detail.replace("\t", " ").replace("\n", " ")
            handle.write(f"{split}\t{rej.utt_id}\t{rej.reason}\t{detail}\n")
    tmp.replace(path)


def read_rejections(path: Path) -> list[tuple[str, Rejection]]:
    rows = []
    with open(path, encoding="utf-8") as handle:
        next(handle, None)
        for line in handle:
            split, utt, reason, detail = line.rstrip("\n").split("\t", 3)
            rows.append((split, Rejection(utt, reason, detail)))
    return rows
