"""espeak-ng: formant synthesis of every English accent with variants (the timbre); 22050 Hz."""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

from pipeline import synthesizers


class EspeakNg:
    name = "espeak-ng"
    tools = ("espeak-ng",)
    listing = "`espeak-ng --voices=en` and `espeak-ng --voices=variant`"

    def installed(self, tools):
        """Base voices, and variants as `+NAME`. mbrola voices (mb/) need separately installed
        data; !v/ entries are variants."""
        names = set()
        for line in synthesizers.run([tools["espeak-ng"], "--voices=en"], "listing voices").decode().splitlines()[1:]:
            fields = line.split()
            if len(fields) >= 5 and not fields[4].startswith(("mb/", "!v/")):
                names |= {fields[1], *re.findall(r"\((\S+) \d+\)", line)}
        variants = synthesizers.run([tools["espeak-ng"], "--voices=variant"], "listing variants").decode()
        for line in variants.splitlines()[1:]:
            names |= {f"+{v}" for v in re.findall(r"!v/(\S+)", line)}
        return frozenset(names)

    def has(self, voice, installed):
        # Needed because espeak-ng does not fail on a missing voice: `-v en-xx` or `-v en+nosuch`
        # silently speak with the default voice, which would give two "speakers" the same voice.
        base, _, variant = voice.partition("+")
        return base in installed and (not variant or f"+{variant}" in installed)

    def draw(self, voice, rng, config):
        return rng.randint(*config.rate_range), rng.randint(*config.pitch_range), 100

    def shipped(self, voice):
        return 175, 50, 100  # its defaults: 175 words per minute, pitch 50

    def speaker_id(self, voice, rate, pitch, warp):
        return f"{voice.replace('+', '-')}-r{rate:03d}-p{pitch:02d}"

    def render(self, utts: Sequence, wavs: Sequence[Path], sample_rate: int, amplitude: int, tools) -> None:
        for utt, wav in zip(utts, wavs, strict=True):
            voice = ["-v", utt.voice, "-s", str(utt.rate), "-p", str(utt.pitch), "-a", str(amplitude)]
            cmd = [tools["espeak-ng"], *voice, "--stdout", utt.text]
            speech = synthesizers.run(cmd, f"espeak-ng for {utt.utt_id}")
            synthesizers.to_wav(speech, wav, sample_rate, utt.warp, tools, utt.utt_id)


ENGINE = EspeakNg()
