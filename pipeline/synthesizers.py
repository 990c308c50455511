"""Runs the demo corpus' synthesizer engines (pipeline/engines/, registered in common/voices.py) and
sox: which voices this machine has, each engine's batch of utterances into wavs (pipeline/corpus.py
plans the utterances; this module only runs the tools). An utterance is a `PlannedUtterance` of
pipeline/corpus_plan.py: engine, voice, rate, pitch, warp, text, utt_id.
"""

from __future__ import annotations

import importlib
import shutil
import subprocess
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import NamedTuple

from common import voices


def install_hint(engines: Iterable[str] = ()) -> str:
    packages = [p for name in engines for p in voices.engine(name).packages]
    return f"install them with `apt-get install {' '.join([*packages, 'sox'])}` (`make setup` does)"


def engine(name: str):
    """The registered engine `name`'s runner (pipeline/engines/ Engine)."""
    module, _, attribute = voices.engine(name).runner.partition(":")
    return getattr(importlib.import_module(module), attribute)


class VoiceInventory(NamedTuple):
    """What this machine's engines have: engine -> the names its `installed` listed."""

    voices: Mapping[str, frozenset[str]]

    def has(self, spec: str) -> bool:
        name, voice = voices.parse(spec)
        return name in self.voices and engine(name).has(voice, self.voices[name])


def tool(name: str, engines: Iterable[str] = ()) -> str:
    path = shutil.which(name)
    if path is None:
        owner = [e for e in voices.ENGINES if name in engine(e).tools]
        leave_out = f", or leave {owner[0]}'s voices out with `--engines`" if owner else ""
        raise FileNotFoundError(
            f"{name} is not on PATH; the corpus runs {', '.join([*engines, 'sox'])}: {install_hint(engines)}{leave_out}"
        )
    return path


def tools_of(engines: Iterable[str]) -> dict[str, str]:
    """name -> path of every program the engines and sox need; FileNotFoundError naming a missing one."""
    engines = tuple(engines)
    return {name: tool(name, engines) for e in engines for name in (*engine(e).tools, "sox")}


def run_status(cmd: list[str], **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, **kwargs)


def run(cmd: list[str], what: str, **kwargs) -> bytes:
    proc = run_status(cmd, **kwargs)
    if proc.returncode != 0:
        raise RuntimeError(f"{what}: `{' '.join(cmd)}` exited {proc.returncode}: {proc.stderr.decode()[-2000:]}")
    return proc.stdout


def installed_voices(engines: Iterable[str], tools: dict[str, str]) -> VoiceInventory:
    """Asks each engine of `engines` which voices exist here: no engine fails on a missing voice
    (espeak-ng and flite speak with their default one), which would give two "speakers" one voice."""
    return VoiceInventory({name: engine(name).installed(tools) for name in engines})


def to_wav(speech: bytes, wav: Path, sample_rate: int, warp: int, tools: dict[str, str], utt_id: str) -> None:
    """An engine's wav piped through sox into a 16-bit mono wav at `sample_rate` (a warp: sox's
    `speed`, which moves tempo, pitch and formants together)."""
    tmp = wav.with_name(wav.name + ".tmp")
    # -R: sox dithers with a fixed seed, so the same input gives byte-identical output.
    output = ["-t", "wav", "-r", str(sample_rate), "-c", "1", "-b", "16", "-e", "signed-integer", str(tmp)]
    speed = ["speed", f"{warp / 100:g}"] if warp != 100 else []
    run([tools["sox"], "-R", "-t", "wav", "-", *output, *speed], f"sox for {utt_id}", input=speech)
    tmp.replace(wav)


def synthesize(utt, wav: Path, sample_rate: int, amplitude: int, tools: dict[str, str]) -> None:
    """One planned utterance into `wav`, by its engine."""
    engine(utt.engine).render([utt], [wav], sample_rate, amplitude, tools)


def version(tool: str) -> str:
    """`tool --version`'s words; flite says its version and then exits 1, so the status is not checked."""
    proc = subprocess.run([tool, "--version"], capture_output=True, text=True)
    if not proc.stdout.strip():
        raise RuntimeError(f"`{tool} --version` printed no version: {proc.stderr[-2000:]}")
    return " ".join(proc.stdout.split())
