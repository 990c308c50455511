"""Recipe audio without a shell: the decoder commands of Kaldi recipes, read in-process.

Kaldi recipes put commands in `wav.scp`: LibriSpeech `flac -c -d -s F.flac |`, Switchboard and WSJ
`sph2pipe -f wav -p -c 1 F.sph |` (one recording per channel of a two-channel file), resampling
recipes `sox F.wav -t wav -r 8000 - |`. kaldiio would hand such an entry to a shell, so the stages
refuse arbitrary commands. These three decoders only turn a file into samples, though, and
`parse_command` reads what they are asked to produce (which file, which channel, what rate,
whether channels are mixed) into a `Source`, which `read_source` produces with libsndfile
(soundfile: WAV, FLAC, NIST SPHERE with PCM, u-law or A-law samples). A command that does anything
else raises `UnsupportedCommand` saying why; the stages refuse it unless pipes are allowed.

Not covered: shorten-compressed SPHERE (how LDC ships Switchboard and WSJ), which libsndfile cannot
decode. Such a file raises `CompressedSphere` (an `unsupported_audio` rejection that names the fix:
decompress the corpus once with sph2pipe, or allow pipes so that the entry's own command runs).
"""

from __future__ import annotations

import dataclasses
import shlex
import struct
from pathlib import Path

import numpy as np

DECODERS = ("flac", "sph2pipe", "sox")
# A shell would give these a meaning (sequences, redirections, expansions, globs); a command holding
# any of them is not one simple decoder call, whatever its program.
SHELL_SYNTAX = frozenset(";&|<>()$`*?[]{}\n")


class AudioError(Exception):
    """Audio that cannot be used; `reason` is a key of kaldi.REASONS."""

    def __init__(self, reason: str, detail: str):
        super().__init__(detail)
        self.reason = reason


class CompressedSphere(AudioError):
    """A shorten-compressed SPHERE file: only the recipe's own sph2pipe can decode it."""


class UnsupportedCommand(ValueError):
    """A `cmd |` entry that is not a decoder call this module reproduces; the message says why."""


@dataclasses.dataclass(frozen=True)
class Source:
    """Samples a wav.scp entry stands for: a file, and what the entry's decoder does to it."""

    path: Path
    channel: int | None = None  # 0-based channel to keep (sph2pipe -c, sox remix); None: all
    mix: bool = False  # average the channels into one (sox's `-c 1` or `channels 1` does)
    rate: int | None = None  # resample to this rate in Hz (sox -r, `rate`); None: the file's own
    program: str = ""  # the decoder named by the command; "" for a plain path


# ---- parsing the commands ------------------------------------------------------------------------


def parse_command(spec: str) -> Source:
    """`flac -c -d -s F |`, `sph2pipe [-f wav] [-p] [-c N] F |` or `sox F [opts] -t wav - [effects] |`
    -> the Source it decodes. Raises UnsupportedCommand (with the reason) for anything else."""
    body = spec.strip()
    if not body.endswith("|") or body.startswith("|"):
        raise UnsupportedCommand("not a command of the form `program args |`")
    body = body[:-1].strip()
    syntax = sorted(SHELL_SYNTAX & set(body))
    if syntax:
        raise UnsupportedCommand(f"it uses shell syntax ({' '.join(syntax)}), not one plain decoder call")
    try:
        argv = shlex.split(body)
    except ValueError as err:
        raise UnsupportedCommand(f"it cannot be split into arguments ({err})") from err
    if not argv:
        raise UnsupportedCommand("the command is empty")
    program = Path(argv[0]).name
    parser = {"flac": _flac, "sph2pipe": _sph2pipe, "sox": _sox}.get(program)
    if parser is None:
        raise UnsupportedCommand(f"{program!r} is not one of the decoders read in-process ({', '.join(DECODERS)})")
    return dataclasses.replace(parser(argv[1:]), program=program)


def command_path(spec: str) -> Path | None:
    """The audio file a recognized decoder command reads; None for any other entry."""
    try:
        return parse_command(spec).path
    except UnsupportedCommand:
        return None


def _one_file(files: list[str], program: str) -> Path:
    if len(files) != 1 or files[0] == "-":
        raise UnsupportedCommand(f"{program} must read exactly one named file and write to stdout, got {files}")
    return Path(files[0])


def _flac(args: list[str]) -> Source:
    files, decode, stdout = [], False, False
    for arg in args:
        if arg in ("--decode", "--stdout", "--silent", "--force"):
            decode |= arg == "--decode"
            stdout |= arg == "--stdout"
        elif arg.startswith("-") and not arg.startswith("--") and len(arg) > 1 and set(arg[1:]) <= set("cdsf"):
            decode |= "d" in arg
            stdout |= "c" in arg
        elif arg.startswith("-") and arg != "-":
            raise UnsupportedCommand(f"flac option {arg!r} is not one of -c -d -s -f")
        else:
            files.append(arg)
    if not (decode and stdout):
        raise UnsupportedCommand("a flac command that does not decode to stdout (-c -d)")
    return Source(_one_file(files, "flac"))


def _sph2pipe(args: list[str]) -> Source:
    files, channel, i = [], None, 0
    while i < len(args):
        arg = args[i]
        if arg in ("-f", "-c"):
            if i + 1 == len(args):
                raise UnsupportedCommand(f"sph2pipe option {arg} has no value")
            value, i = args[i + 1], i + 1
        elif arg[:2] in ("-f", "-c") and len(arg) > 2:
            arg, value = arg[:2], arg[2:]
        elif arg == "-p":
            value = ""  # PCM output: what libsndfile decodes u-law and A-law samples to anyway
        elif arg.startswith("-"):
            raise UnsupportedCommand(f"sph2pipe option {arg!r} is not one of -f -p -c")
        else:
            files.append(arg)
            value = None
        if arg == "-f" and value not in ("wav", "rif"):
            raise UnsupportedCommand(f"sph2pipe -f {value}: Kaldi reads only -f wav")
        if arg == "-c":
            if value not in ("1", "2"):
                raise UnsupportedCommand(f"sph2pipe -c {value}: the channel is 1 or 2")
            channel = int(value) - 1
        i += 1
    return Source(_one_file(files, "sph2pipe"), channel=channel)


_SOX_GLOBAL = {"-q", "--no-show-progress", "-S", "--show-progress", "-R", "-G", "--guard", "-D", "--no-dither"}
_SOX_VALUED = {"-t": "type", "--type": "type", "-r": "rate", "--rate": "rate", "-c": "channels"}
_SOX_VALUED |= {"--channels": "channels", "-b": "bits", "--bits": "bits", "-e": "encoding", "--encoding": "encoding"}


def _sox(args: list[str]) -> Source:
    """`sox [global] [input opts] IN [output opts] - [effects]` with a wav on stdout."""
    files, (given, wanted), effects = _sox_files_and_options(args)
    if len(files) != 2 or files[1] != "-":
        raise UnsupportedCommand("sox must read one named file and write to stdout (`-`)")
    _check_sox_formats(given, wanted)
    rate = _sox_rate(wanted["rate"]) if "rate" in wanted else None
    mix = False
    if "channels" in wanted:
        if wanted["channels"] != "1":
            raise UnsupportedCommand(f"sox -c {wanted['channels']}: only -c 1 (mix to mono) is reproduced")
        mix = True
    rate, mix, channel = _sox_effects(effects, rate, mix)
    return Source(_one_file(files[:1], "sox"), channel=channel, mix=mix and channel is None, rate=rate)


def _sox_files_and_options(args: list[str]) -> tuple[list[str], list[dict[str, str]], list[str]]:
    """(the file names, [the input's, the output's] format options, the effects after the output)."""
    files: list[str] = []
    options: list[dict[str, str]] = [{}, {}]  # the input's and the output's format options
    i = 0
    while i < len(args) and len(files) < 2:
        arg = args[i]
        if arg in _SOX_GLOBAL or (arg.startswith("-V") and arg[2:].isdigit() or arg == "-V"):
            pass
        elif arg in _SOX_VALUED:
            if i + 1 == len(args):
                raise UnsupportedCommand(f"sox option {arg} has no value")
            options[len(files)][_SOX_VALUED[arg]] = args[i + 1]
            i += 1
        elif arg.startswith("-") and arg != "-":
            raise UnsupportedCommand(
                f"sox option {arg!r} is not one the stage reproduces (-t -r -c -b -e, -q -R -G -V)"
            )
        else:
            files.append(arg)
        i += 1
    return files, options, args[i:]


def _check_sox_formats(given: dict[str, str], wanted: dict[str, str]) -> None:
    """UnsupportedCommand unless the input is read as it is and the output is a wav of the same samples."""
    if set(given) - {"type"}:
        raise UnsupportedCommand(
            f"sox input options {sorted('-' + k[0] for k in set(given) - {'type'})} reinterpret the file; "
            "convert it once instead"
        )
    if wanted.get("type", "").lower() not in ("wav", "wavpcm"):
        raise UnsupportedCommand("sox must write a wav (`-t wav -`), which is what Kaldi reads")
    if wanted.get("bits", "16") not in ("16", "24", "32"):
        raise UnsupportedCommand(f"sox -b {wanted['bits']}: samples of fewer than 16 bits change the signal")
    if wanted.get("encoding", "signed-integer") not in ("signed-integer", "signed", "floating-point"):
        raise UnsupportedCommand(f"sox -e {wanted['encoding']} changes the samples (companding)")


def _sox_effects(effects: list[str], rate: int | None, mix: bool) -> tuple[int | None, bool, int | None]:
    """(rate, mix, channel) after the effects `rate R`, `remix N`, `remix -` and `channels 1`; any other
    effect is UnsupportedCommand. A rate given as an output option wins over the effect's."""
    channel = None
    while effects:
        name, effects = effects[0], effects[1:]
        values = []
        while effects and effects[0] not in ("rate", "remix", "channels"):
            values.append(effects[0])
            effects = effects[1:]
        if name == "rate":
            flags = [v for v in values if v.startswith("-")]
            numbers = [v for v in values if not v.startswith("-")]
            if len(numbers) > 1 or set(flags) - {"-q", "-l", "-m", "-h", "-v", "-s", "-I", "-M", "-L"}:
                raise UnsupportedCommand(f"sox effect `rate {' '.join(values)}` is not `rate [-q|-l|-m|-h|-v] RATE`")
            rate = rate or (_sox_rate(numbers[0]) if numbers else None)
        elif name == "remix" and values == ["-"] or name == "channels" and values == ["1"]:
            mix = True
        elif name == "remix" and len(values) == 1 and values[0].isdigit() and int(values[0]) >= 1:
            channel = int(values[0]) - 1
        else:
            effect = " ".join([name, *values])
            raise UnsupportedCommand(
                f"sox effect `{effect}` is not reproduced (only rate R, remix N, remix -, channels 1)"
            )
    return rate, mix, channel


def _sox_rate(value: str) -> int:
    try:
        rate = float(value[:-1]) * 1000 if value.lower().endswith("k") else float(value)
    except ValueError as err:
        raise UnsupportedCommand(f"sox rate {value!r} is not a number of Hz") from err
    if rate <= 0 or rate != int(rate):
        raise UnsupportedCommand(f"sox rate {value!r} is not a whole number of Hz")
    return int(rate)


# ---- reading -------------------------------------------------------------------------------------


def check_riff(path: Path) -> None:
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


def sphere_header(path: Path) -> dict[str, str] | None:
    """The fields of a NIST SPHERE header (`sample_count`, `sample_coding`, ...); None when `path` is
    not a SPHERE file."""
    with open(path, "rb") as handle:
        head = handle.read(1024)
        if not head.startswith(b"NIST_1A"):
            return None
        try:
            size = int(head[8:16])
        except ValueError as err:
            raise AudioError("unreadable", f"{path}: SPHERE header without a size") from err
        if size > len(head):
            head += handle.read(size - len(head))
    fields = {}
    for line in head[16:size].decode("latin-1").splitlines():
        parts = line.split(None, 2)
        if parts and parts[0] == "end_head":
            break
        if len(parts) == 3:
            fields[parts[0]] = parts[2].strip()
    fields["header_bytes"] = str(size)
    return fields


def check_sphere(path: Path, header: dict[str, str]) -> None:
    """Raises CompressedSphere for shorten (or other) compression, AudioError('truncated') when the
    samples the header announces are not all in the file (libsndfile would return fewer silently)."""
    coding = header.get("sample_coding", "pcm")
    if "shorten" in coding or "wavpack" in coding or "shortpack" in coding:
        raise CompressedSphere(
            "unsupported_audio",
            f"{path} is compressed SPHERE (sample_coding {coding}), which libsndfile cannot decode: "
            f"decompress the corpus once (`sph2pipe -f sph {path.name} OUT.sph` for each file) and list "
            "the new files, or pass --allow-pipes so that the entry's sph2pipe command runs",
        )
    try:
        expected = int(header["sample_count"]) * int(header.get("channel_count", 1)) * int(header["sample_n_bytes"])
    except (KeyError, ValueError):
        return  # libsndfile decides what an incomplete header means
    have = path.stat().st_size - int(header["header_bytes"])
    if expected > have:
        raise AudioError("truncated", f"{path}: header announces {expected} sample bytes, file has {have}")


def read_file(path: Path) -> tuple[int, np.ndarray]:
    """One audio file (WAV, FLAC, SPHERE, ...): (rate in Hz, float32 [samples, channels] on the int16
    scale, as Kaldi computes fbank). Raises AudioError with the reason."""
    import soundfile

    path = Path(path)
    if not path.is_file():
        raise AudioError("file_missing", f"{path} does not exist")
    try:
        check_riff(path)
        header = sphere_header(path)
        if header is not None:
            check_sphere(path, header)
        data, rate = soundfile.read(str(path), dtype="float32", always_2d=True)
    except AudioError:
        raise
    except Exception as err:  # libsndfile raises its own error types for every malformed file
        raise AudioError("unreadable", f"{path}: {type(err).__name__}: {err}") from err
    return rate, data * 32768.0


def read_source(source: Source) -> tuple[int, np.ndarray]:
    """What the decoder command would write: (rate, float32 [samples, channels], int16 scale)."""
    rate, data = read_file(source.path)
    if source.channel is not None:
        if source.channel >= data.shape[1]:
            raise AudioError(
                "unsupported_audio",
                f"{source.path} has {data.shape[1]} channel(s); the {source.program} command asks for "
                f"channel {source.channel + 1}",
            )
        data = data[:, [source.channel]]
    elif source.mix and data.shape[1] > 1:
        data = data.mean(axis=1, keepdims=True)
    if source.rate is not None and source.rate != rate:
        data, rate = resample(data, rate, source.rate), source.rate
    return rate, data


def resample(samples: np.ndarray, rate: int, target: int) -> np.ndarray:
    """Polyphase resampling along the first axis ([samples] or [samples, channels]), float32."""
    from scipy.signal import resample_poly

    divisor = np.gcd(rate, target)
    return resample_poly(samples, target // divisor, rate // divisor, axis=0).astype(np.float32)
