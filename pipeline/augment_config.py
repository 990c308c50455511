"""What the augmentation stage (pipeline/augment.py) makes of a training split: perturbed copies of
its audio, written offline as a Kaldi data directory of their own beside the clean split.

The acoustic model's settings hold it (`asr.augment.copies`, models/asr/config.py), so that one
training config says both what to copy and that training reads the copies. No TensorFlow or numpy
here: the DAG's plan loads it to check a run's settings and to decide whether the stage runs.
"""

from __future__ import annotations

import dataclasses

from common.splits import AUGMENTED_SPLIT, CLEAN_SPLIT  # noqa: F401  (names of this stage's splits)

NOISES = ("babble", "white", "pink", "brown")
CODECS = ("mulaw", "gsm")


def _range(key: str, value: tuple[float, float], low: float, high: float, unit: str) -> None:
    if not low <= value[0] <= value[1] <= high:
        raise ValueError(f"asr.augment.copies.{key} {list(value)}: two values, low <= high, in {low:g}-{high:g} {unit}")


@dataclasses.dataclass(frozen=True)
class CopiesConfig:
    """Copies of the training split's utterances (each copy besides its original); all off by default.

    A share is of the clean utterances: that many (rounded), chosen by a draw of their own per
    utterance, get one copy of that kind. Every draw is seeded by (seed, kind, utterance), so the
    copies are the same bytes however many jobs make them.
    """

    # Speed perturbation (Ko et al. 2015; Kaldi's perturb_data_dir_speed.sh): a copy of every
    # utterance per factor, tempo and pitch together (sox `speed`), a new speaker `spF-SPK`; the
    # recipe's [0.9, 1.1] triples the data. A copy lasts 1/F of its original.
    speed_factors: tuple[float, ...] = ()
    # Simulated reverberation (sox `reverb`, a Freeverb room; no measured impulse responses here):
    # the share of utterances with a copy in a room of their own, drawn from the ranges below.
    reverb_share: float = 0.0
    reverb_reverberance: tuple[float, float] = (20.0, 80.0)  # percent: how long the tail lasts
    reverb_damping: tuple[float, float] = (20.0, 80.0)  # percent: how fast the high frequencies die out
    reverb_room_scale: tuple[float, float] = (30.0, 100.0)  # percent: the room's size
    reverb_pre_delay_ms: tuple[float, float] = (0.0, 30.0)  # before the first reflection
    # Additive noise: the share of utterances with a noisy copy, at an SNR (over the whole utterance)
    # drawn from noise_snr_db, of a kind drawn from noise_kinds: "babble" (other training utterances
    # talking at once, babble_talkers of them) or sox's synthetic "white", "pink" and "brown" noise.
    noise_share: float = 0.0
    noise_snr_db: tuple[float, float] = (5.0, 20.0)
    noise_kinds: tuple[str, ...] = NOISES
    babble_talkers: tuple[int, int] = (3, 6)  # inclusive range of the talkers in one babble
    # A telephone channel: the share of utterances with a copy band-limited to telephone_band_hz,
    # at 8 kHz through a codec drawn from telephone_codecs ("mulaw": G.711 u-law; "gsm": GSM 06.10
    # full rate), and back to 16 kHz.
    telephone_share: float = 0.0
    telephone_band_hz: tuple[float, float] = (300.0, 3400.0)
    telephone_codecs: tuple[str, ...] = CODECS
    seed: int = 0  # every draw above (which utterances, rooms, noises, SNRs, codecs)

    def __post_init__(self):
        factors = tuple(self.speed_factors)
        if any(not 0.5 <= f <= 2.0 or f == 1.0 for f in factors) or len(set(factors)) != len(factors):
            raise ValueError(
                f"asr.augment.copies.speed_factors {list(factors)}: distinct factors in 0.5-2.0 other than 1.0 "
                "(the clean split is the 1.0 copy), e.g. [0.9, 1.1]"
            )
        for key in ("reverb_share", "noise_share", "telephone_share"):
            if not 0.0 <= getattr(self, key) <= 1.0:
                raise ValueError(f"asr.augment.copies.{key} {getattr(self, key)}: a share of the utterances, 0-1")
        _range("reverb_reverberance", self.reverb_reverberance, 0, 100, "percent")
        _range("reverb_damping", self.reverb_damping, 0, 100, "percent")
        _range("reverb_room_scale", self.reverb_room_scale, 0, 100, "percent")
        _range("reverb_pre_delay_ms", self.reverb_pre_delay_ms, 0, 500, "ms")
        _range("noise_snr_db", self.noise_snr_db, -10, 60, "dB")
        _range("babble_talkers", self.babble_talkers, 1, 32, "talkers")
        _range("telephone_band_hz", self.telephone_band_hz, 50, 4000, "Hz (an 8 kHz channel)")
        for key, values, known in (
            ("noise_kinds", self.noise_kinds, NOISES),
            ("telephone_codecs", self.telephone_codecs, CODECS),
        ):
            if not values or set(values) - set(known):
                raise ValueError(f"asr.augment.copies.{key} {list(values)}: one or more of {list(known)}")

    @property
    def enabled(self) -> bool:
        """Whether any copy is asked for (then training reads AUGMENTED_SPLIT)."""
        return bool(self.speed_factors) or any((self.reverb_share, self.noise_share, self.telephone_share))
