"""The synthesizers the demo corpus runs (espeak-ng, flite) and sox: which voices this machine has,
each engine's command line for one utterance, and the run of it into a wav (pipeline/corpus.py
plans the utterances; this module only runs the tools). An utterance is a `PlannedUtterance` of
pipeline/corpus.py: engine, voice, rate, pitch, warp, text, utt_id.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

from common import voices

INSTALL_HINT = "install them with `apt-get install espeak-ng flite sox`"


class VoiceInventory(NamedTuple):
    """What this machine's engines have: espeak-ng base voices and variants, flite voices."""

    espeak_bases: frozenset[str] = frozenset()
    espeak_variants: frozenset[str] = frozenset()
    flite_voices: frozenset[str] = frozenset()

    def has(self, spec: str) -> bool:
        engine, voice = voices.parse(spec)
        if engine == "flite":
            return voice in self.flite_voices
        base, _, variant = voice.partition("+")
        return base in self.espeak_bases and (not variant or variant in self.espeak_variants)


def tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        leave_out = f", or leave {name}'s voices out with `--engines`" if name in voices.ENGINES else ""
        raise FileNotFoundError(
            f"{name} is not on PATH; the corpus runs espeak-ng, flite and sox: {INSTALL_HINT}{leave_out}"
        )
    return path


def run(cmd: list[str], what: str, **kwargs) -> bytes:
    proc = subprocess.run(cmd, capture_output=True, **kwargs)
    if proc.returncode != 0:
        raise RuntimeError(f"{what}: `{' '.join(cmd)}` exited {proc.returncode}: {proc.stderr.decode()[-2000:]}")
    return proc.stdout


def installed_voices(engines: Sequence[str] = voices.ENGINES) -> VoiceInventory:
    """Asks the engines in `engines` which English voices (and espeak-ng variants) exist here.

    Needed because neither engine fails on a missing voice: espeak-ng's `-v en-xx` or `-v en+nosuch`
    and flite's `-voice nosuch` silently speak with the default voice, which would give two
    "speakers" the same voice.
    """
    bases, variants, flite_voices = set(), set(), set()
    if "espeak-ng" in engines:
        for line in run([tool("espeak-ng"), "--voices=en"], "listing voices").decode().splitlines()[1:]:
            fields = line.split()
            # mbrola voices (mb/) need separately installed data; !v/ entries are variants.
            if len(fields) >= 5 and not fields[4].startswith(("mb/", "!v/")):
                bases |= {fields[1], *re.findall(r"\((\S+) \d+\)", line)}
        for line in run([tool("espeak-ng"), "--voices=variant"], "listing variants").decode().splitlines()[1:]:
            variants |= set(re.findall(r"!v/(\S+)", line))
    if "flite" in engines:  # "Voices available: kal awb_time kal16 awb rms slt"
        listing = run([tool("flite"), "-lv"], "listing flite voices").decode()
        flite_voices |= set(listing.partition(":")[2].split())
    return VoiceInventory(frozenset(bases), frozenset(variants), frozenset(flite_voices))


def synthesis_command(utt, amplitude: int, tools: dict[str, str]) -> list[str]:
    """The engine's command line that writes `utt` as a wav to stdout (`tools`: name -> path)."""
    if utt.engine == "espeak-ng":  # 22050 Hz
        return [tools["espeak-ng"], "-v", utt.voice, "-s", str(utt.rate), "-p", str(utt.pitch),
                "-a", str(amplitude), "--stdout", utt.text]  # fmt: skip
    # flite: 16000 Hz (kal: 8000). It writes the wav header's sizes before the samples, so a pipe works.
    # A warp: slower and lower by it here, sox speeds it up by it (`synthesize`).
    cmd = [tools["flite"], "-voice", utt.voice, "--setf", f"duration_stretch={utt.rate * utt.warp / 10000:g}"]
    if utt.pitch:
        cmd += ["--setf", f"int_f0_target_mean={utt.pitch * 100 / utt.warp:g}"]
    return [*cmd, "-t", utt.text, "-o", "/dev/stdout"]


def synthesize(utt, wav: Path, sample_rate: int, amplitude: int, tools: dict[str, str]) -> None:
    """The engine's wav piped through sox into a 16-bit mono wav at `sample_rate` (flite's warp:
    sox's `speed`, which moves tempo, pitch and formants together)."""
    speech = run(synthesis_command(utt, amplitude, tools), f"{utt.engine} for {utt.utt_id}")
    tmp = wav.with_name(wav.name + ".tmp")
    # -R: sox dithers with a fixed seed, so the same input gives byte-identical output.
    run([tools["sox"], "-R", "-t", "wav", "-", "-t", "wav", "-r", str(sample_rate), "-c", "1", "-b", "16",
          "-e", "signed-integer", str(tmp), *(["speed", f"{utt.warp / 100:g}"] if utt.warp != 100 else [])],
         f"sox for {utt.utt_id}", input=speech)  # fmt: skip
    tmp.replace(wav)


def version(tool: str) -> str:
    """`tool --version`'s words; flite says its version and then exits 1, so the status is not checked."""
    proc = subprocess.run([tool, "--version"], capture_output=True, text=True)
    if not proc.stdout.strip():
        raise RuntimeError(f"`{tool} --version` printed no version: {proc.stderr[-2000:]}")
    return " ".join(proc.stdout.split())
