"""Festival: diphone voices (ked and kal, 16 kHz) and an HTS one (cmu_us_slt_arctic_hts, 32 kHz).

One Festival process renders a whole batch of utterances from a Scheme script on its standard
input (`festival --pipe`): loading the program and a voice takes longer than synthesizing a
sentence, so no utterance pays for its start.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from pipeline import synthesizers
from pipeline.engines import stretched_speaker_id


def _quoted(text: str) -> str:
    """`text` as a Scheme string literal."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


class Festival:
    name = "festival"
    tools = ("festival",)
    listing = "`echo '(print (voice.list))' | festival --pipe`"

    def installed(self, tools):
        listing = synthesizers.run(
            [tools["festival"], "--pipe"], "listing Festival voices", input=b"(print (voice.list))\n"
        )
        return frozenset(listing.decode().strip().strip("()").split())  # "(cmu_us_slt_arctic_hts ked_diphone ...)"

    def has(self, voice, installed):
        return voice in installed

    def draw(self, voice, rng, config):
        # Its voices keep their own pitch model (none of them reads a target mean the same way);
        # the warp moves pitch and formants together.
        return rng.randint(*config.stretch_range), 0, rng.randint(*config.warp_range)

    def shipped(self, voice):
        return None, 0, 100

    def speaker_id(self, voice, rate, pitch, warp):
        return stretched_speaker_id(self.name, voice, rate, pitch, warp)

    @staticmethod
    def script(utts: Sequence, raws: Sequence[Path]) -> str:
        """The Scheme program that writes each utterance's wav to its `raws` path. The voice is
        selected again for every utterance, which resets what the one before set, so an utterance
        sounds the same in any batch."""
        lines = []
        for utt, raw in zip(utts, raws, strict=True):
            stretch = (utt.rate or 100) * utt.warp / 10000  # slower by the warp: sox speeds it up by it
            lines.append(f"(voice_{utt.voice})")
            if utt.voice.endswith("_hts"):  # HTS reads its speed from the engine's options, not Duration_Stretch
                lines.append(
                    f'(set! hts_engine_params (append hts_engine_params (list (list "-r" {1 / stretch:.6g}))))'
                )
            else:
                lines.append(f"(Parameter.set 'Duration_Stretch {stretch:.6g})")
            lines.append(f"(utt.save.wave (SynthText {_quoted(utt.text)}) {_quoted(str(raw))} 'riff)")
        return "\n".join(lines) + "\n"

    def render(self, utts: Sequence, wavs: Sequence[Path], sample_rate: int, amplitude: int, tools) -> None:
        raws = [wav.with_name(wav.name + ".festival.wav") for wav in wavs]
        proc = synthesizers.run_status([tools["festival"], "--pipe"], input=self.script(utts, raws).encode())
        for utt, wav, raw in zip(utts, wavs, raws, strict=True):
            if not raw.is_file():  # Festival reports a failed utterance and goes on with the next
                raise RuntimeError(
                    f"Festival wrote no audio for {utt.utt_id} ({utt.spec}, text {utt.text!r}); it said: "
                    f"{proc.stderr.decode()[-2000:] or '(nothing)'}; check the voice with {self.listing}"
                )
            synthesizers.to_wav(raw.read_bytes(), wav, sample_rate, utt.warp, tools, utt.utt_id)
            raw.unlink()


ENGINE = Festival()
