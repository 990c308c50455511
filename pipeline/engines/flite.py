"""flite: statistical voices (awb, rms, slt) and diphone ones (kal at 8 kHz, kal16); 16000 Hz."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from pipeline import synthesizers
from pipeline.engines import stretched_speaker_id

# Voices whose F0 model (rms: SPAM) ignores int_f0_target_mean: they keep their own pitch, and
# their speakers differ in rate and warp only (tests/test_corpus.py checks it still holds).
OWN_PITCH = frozenset({"rms"})


class Flite:
    name = "flite"
    tools = ("flite",)
    listing = "`flite -lv`"

    def installed(self, tools):
        listing = synthesizers.run([tools["flite"], "-lv"], "listing flite voices").decode()
        return frozenset(listing.partition(":")[2].split())  # "Voices available: kal awb_time kal16 ..."

    def has(self, voice, installed):
        # flite's `-voice nosuch` silently speaks with its default voice.
        return voice in installed

    def draw(self, voice, rng, config):
        rate, pitch = rng.randint(*config.stretch_range), rng.randint(*config.f0_range)
        return rate, 0 if voice in OWN_PITCH else pitch, rng.randint(*config.warp_range)

    def shipped(self, voice):
        return None, 0, 100

    def speaker_id(self, voice, rate, pitch, warp):
        return stretched_speaker_id(self.name, voice, rate, pitch, warp)

    def render(self, utts: Sequence, wavs: Sequence[Path], sample_rate: int, amplitude: int, tools) -> None:
        for utt, wav in zip(utts, wavs, strict=True):
            # A warp: slower and lower by it here, sox speeds it up by it (synthesizers.to_wav).
            cmd = [tools["flite"], "-voice", utt.voice, "--setf", f"duration_stretch={utt.rate * utt.warp / 10000:g}"]
            if utt.pitch:
                cmd += ["--setf", f"int_f0_target_mean={utt.pitch * 100 / utt.warp:g}"]
            # It writes the wav header's sizes before the samples, so a pipe works.
            speech = synthesizers.run([*cmd, "-t", utt.text, "-o", "/dev/stdout"], f"flite for {utt.utt_id}")
            synthesizers.to_wav(speech, wav, sample_rate, utt.warp, tools, utt.utt_id)


ENGINE = Flite()
