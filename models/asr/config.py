"""The acoustic model's settings, declared with it and registered with it (common/catalog.py): its
architecture (`AsrConfig`, the `asr:` section of a training config, with the training step's
augmentation under `asr.augment`) and its evaluation options (`AsrEvalConfig`, models.evaluate).

Plain frozen dataclasses, no TensorFlow: the DAG's plan loads them to check a run's settings
before any work starts.
"""

from __future__ import annotations

import dataclasses

from common.config import ARCHITECTURE
from pipeline.augment_config import CopiesConfig

TARGETS = ("chars", "phones")


@dataclasses.dataclass(frozen=True)
class AugmentConfig:
    """What the training step does to the acoustic model's features (pipeline/frontend.py), and the
    offline copies of the training split's audio it trains on (`copies`, pipeline/augment.py)."""

    # SpecAugment (Park et al. 2019): mask random bands of mel bins and runs of frames of each utterance
    spec_augment: bool = False
    freq_masks: int = 2  # bands of mel bins set to the mean, each up to freq_mask_width wide
    freq_mask_width: int = 15
    time_masks: int = 2  # runs of frames set to the mean, each up to time_mask_fraction long
    time_mask_fraction: float = 0.05
    # Vocal tract length perturbation (Jaitly and Hinton 2013): each utterance's spectrum stretched
    # along frequency by its own factor drawn from this range (>1: formants move up, as for a shorter
    # vocal tract); (1.0, 1.0): off.
    vtlp_range: tuple[float, float] = (1.0, 1.0)
    # The training step from which SpecAugment and VTLP apply (1-based, as the trainer counts; 0 or 1:
    # every step): unaugmented, a model's first steps learn the alignment sooner.
    augment_from_step: int = 0
    # Perturbed copies of the training audio (speed, reverberation, noise, a telephone channel),
    # made before the features by pipeline/augment.py; any asked for: training reads the split
    # `train_aug` (the clean utterances and their copies) instead of `train`. Off by default.
    copies: CopiesConfig = CopiesConfig()

    def __post_init__(self):
        low, high = self.vtlp_range
        if not 0.5 <= low <= high <= 2.0:
            raise ValueError(f"vtlp_range {tuple(self.vtlp_range)}: two warp factors, low <= high, in 0.5-2.0")
        if self.augment_from_step < 0:
            raise ValueError(f"augment_from_step {self.augment_from_step}: a training step, 0 or more")

    @property
    def enabled(self) -> bool:
        """Whether the training step augments (the offline copies are `copies.enabled`)."""
        return self.spec_augment or tuple(self.vtlp_range) != (1.0, 1.0)


@dataclasses.dataclass(frozen=True)
class AsrConfig:
    feature_dim: int = 80  # input features per frame (read from the manifest at training time)
    vocab_size: int = 0  # output tokens including the CTC blank (0: from the manifest)
    num_targets: int = 0  # pdf ids for frame cross-entropy (0: from the manifest)
    loss: str = "ctc"  # "ctc" over `targets`, or "frame_ce" over alignment targets
    # What CTC learns to emit: "chars" (the transcript's characters) or "phones" (its phone targets
    # over a lexicon's phone table, shards written with --phones-from: pipeline/phones.py); a phone
    # model spells words only through its decoding graph (models/asr/hlg.py)
    targets: str = "chars"
    # "stack": neighbouring frames stacked into one vector, every `subsample`-th kept (a linear
    # front-end: the first LSTM's input kernel); "conv": two strided 1-D convolutions over time
    # (ReLU, `conv_channels` each; strides 2 and subsample/2), a learned front-end of few FLOPs
    frontend: str = "stack"
    # 0: the normalized log-mel spectrum as it is; N: each frame as its first N cepstral coefficients
    # (a fixed DCT, MFCCs), which keep the spectral envelope (formants) and drop its fine structure
    # (the harmonics of the pitch, the excitation of a synthesizer)
    cepstra: int = 0
    stack_frames: int = 3  # "stack": neighbouring frames stacked into one input vector
    subsample: int = 3  # input frames per LSTM step (frame rate 100 Hz -> 33 Hz); "conv": even
    conv_channels: int = 256  # "conv": channels of both convolutions
    num_layers: int = 3  # bidirectional LSTM layers
    units: int = 192  # LSTM cells per direction
    projection: int = 256  # linear bottleneck before the output layer (0: none)
    dropout: float = 0.1  # between layers, training only
    lstm: str = (
        "auto"  # "auto": models/layers/lstm.py's CPU path without a GPU, Keras' (cuDNN) with one; "keras"; "fused"
    )
    ctc_labels: str = "auto"  # "auto": "sparse" (TensorFlow's C++ CTC kernel) without a GPU, "dense" with one
    # The CPU path's two large gradient matmuls per LSTM direction (models/layers/lstm.py GRAD_MATMULS):
    # "float32"; "bfloat16" (float32 sums); "auto": bfloat16 where the CPU has avx512_bf16 or amx_bf16
    lstm_grad_matmuls: str = "float32"
    # Augmentation of the training step's features: not architecture (a resumed run may change it)
    augment: AugmentConfig = dataclasses.field(default_factory=AugmentConfig, metadata={ARCHITECTURE: False})

    def __post_init__(self):
        if self.targets not in TARGETS:
            raise ValueError(f"targets must be one of {TARGETS}, got {self.targets!r}")
        if self.targets == "phones" and self.loss != "ctc":
            raise ValueError(f"targets phones is for loss ctc, not {self.loss!r}")

    @property
    def audio_copies(self) -> CopiesConfig | None:
        """The offline copies of the training audio this model trains on (None: none, the clean split).
        A model's settings may declare it; models/training/config.py `TrainConfig.train_split` reads it."""
        return self.augment.copies if self.augment.copies.enabled else None


@dataclasses.dataclass(frozen=True)
class AsrEvalConfig:
    """models.evaluate's options for the acoustic model (beside the shared `splits`)."""

    beam_width: int = 16  # CTC beam search width (greedy decoding is always reported too)
    frames_per_batch: int = 40000  # padded input frames per evaluation batch
    # a word LM's directory (pipeline/lm.py): beam search with it is reported too, with its tuned
    # settings (models/asr/lm.py); empty: the model's attached LM, if it has one
    lm: str = ""
    no_lm: bool = False  # no LM, not even the attached one

    def __post_init__(self):
        if self.beam_width < 0 or self.frames_per_batch < 1:
            raise ValueError(
                f"beam_width must be 0 or more and frames_per_batch 1 or more, got {self.beam_width}, "
                f"{self.frames_per_batch}"
            )
