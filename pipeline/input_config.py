"""What every model's input pipeline shares (pipeline/dataset.py): batching, normalization, shuffling.

The `input:` section of a training config. A model's own input settings (the acoustic model's
augmentation) are its own (models/asr/config.py). No TensorFlow or numpy here: the DAG's plan
loads it to check a run's settings.
"""

from __future__ import annotations

import dataclasses

CMVN = ("speaker", "global", "utterance", "none")


@dataclasses.dataclass(frozen=True)
class InputConfig:
    frames_per_batch: int = 24000  # padded input frames per batch: a class's longest utterance x batch size
    max_batch_size: int = 64  # cap for classes of short utterances (a batch holds at least one chunk)
    shuffle_buffer: int = 64  # chunks (of about 8 utterances); also bounds the time to the first batch
    # "speaker" (Kaldi per-speaker CMVN), "global" (split-wide), "utterance" (each utterance's own
    # statistics, in the training step: what a served model can compute), "none"
    cmvn: str = "speaker"
    prefetch_batches: int = 8  # batches kept ready, across epoch boundaries too
    seed: int = 0  # shuffling; every rank must use the same seed

    def __post_init__(self):
        if self.cmvn not in CMVN:
            raise ValueError(f"input.cmvn must be one of {', '.join(CMVN)}, got {self.cmvn!r}")
        if self.frames_per_batch < 1 or self.max_batch_size < 1:
            raise ValueError(
                f"input.frames_per_batch and input.max_batch_size must be 1 or more, got "
                f"{self.frames_per_batch}, {self.max_batch_size}"
            )
