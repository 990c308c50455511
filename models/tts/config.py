"""The synthesis model's settings, declared with it and registered with it (common/catalog.py): its
architecture (`TtsConfig`, the `tts:` section of a training config) and its evaluation options
(`TtsEvalConfig`, models.evaluate).

Plain frozen dataclasses, no TensorFlow: the DAG's plan loads them to check a run's settings
before any work starts.
"""

from __future__ import annotations

import dataclasses
from typing import Literal


@dataclasses.dataclass(frozen=True)
class TtsConfig:
    """Both synthesis models' config; `alignment` picks the model (models/tts/network.py `build_tts`)."""

    # What the model reads: each sentence's "characters", or its "phonemes" (espeak-ng's, from shards
    # written with `--phonemes VOICE`; served text is turned into them by pipeline/phonemes.py).
    input: Literal["characters", "phonemes"] = "characters"
    vocab_size: int = 64  # token ids 1..vocab_size-1; id 0 is padding
    # Each sentence framed by two symbols of its own, a start and an end (ids vocab_size - 2 and
    # vocab_size - 1, after the vocabulary's): the silence before and after the speech gets its own
    # symbol and duration instead of lengthening the first and last sound. Where the input is made:
    # models/tts/task.py `frame_sentences`, for training, evaluation and serving alike.
    boundaries: bool = False
    embedding_dim: int = 128  # character embedding width
    encoder_conv_layers: int = 3  # conv + layer norm + ReLU + dropout blocks before the BLSTM
    encoder_conv_filters: int = 128  # channels of each encoder convolution
    encoder_conv_kernel: int = 5  # width in characters of each encoder convolution
    encoder_lstm_units: int = 64  # per direction; the decoder's memory is twice as wide
    attention_dim: int = 64  # "attention": width of the tanh layer that scores each encoder step
    location_filters: int = 16  # "attention": channels of the convolution over previous + cumulative weights
    location_kernel: int = 15  # "attention": its width in encoder steps (odd, so it is centred)
    prenet_units: tuple[int, ...] = (128, 64)  # "attention": dense+ReLU+dropout layers over the previous frame
    prenet_dropout: float = 0.5  # high on purpose: the bottleneck stops the decoder copying frames
    prenet_dropout_at_inference: bool = True  # Tacotron 2 keeps it on; off only for exact repeats
    # "attention": feed each decoder step the previous frame (through the pre-net), as Tacotron does.
    # False: the decoder sees only the attention context and its own state, so synthesis runs exactly
    # the computation training ran (no exposure bias). See docs/training.md.
    decoder_feedback: bool = True
    decoder_lstm_units: int = 192  # units of every decoder LSTM layer; 256 trains ~20% slower on 2 cores
    decoder_lstm_layers: int = 1  # "attention": the first is the attention RNN; more are stacked above it
    n_mels: int = 80  # mel bins of the features
    reduction_factor: int = 3  # frames emitted per decoder step; fewer steps, faster, coarser
    postnet_layers: int = 3  # conv + layer norm + tanh blocks before the output convolution
    postnet_filters: int = 128  # channels of each post-net convolution
    postnet_kernel: int = 5  # width in frames of each post-net convolution
    dropout: float = 0.1  # dropout in the encoder convolutions and the post-net (training only)
    mel_loss: Literal["l1", "l2"] = "l1"  # L1: blurs less than L2 and is not dominated by outlier frames
    stop_pos_weight: float = 5.0  # weight of the one positive (last) frame in the stop loss
    guided_attention: bool = True  # "attention": add the guided-attention loss (Tachibana et al. 2017)
    guided_attention_sigma: float = 0.2  # width g of the tolerated band around the diagonal
    guided_attention_weight: float = 1.0  # weight of the guided-attention loss in the total
    # The training voices, one speaker-embedding row each, in this order (models/tts/task.py fills them
    # in from the training split); empty: one voice, no speaker input.
    speakers: tuple[str, ...] = ()
    speaker_dim: int = 64  # width of the speaker embedding (0: no speaker input even with speakers)
    # Where each character is spoken, and so which model. "attention": Tacotron's location-sensitive
    # attention learns it (models/tts/attention.py). "durations": monotonic alignment search
    # (Glow-TTS, Kim et al. 2020) finds it in every training batch and a duration predictor learns
    # it for synthesis (FastSpeech, Ren et al. 2019): models/tts/durations.py, the demo's model.
    alignment: Literal["attention", "durations"] = "attention"
    duration_weight: float = 1.0  # "durations": weight of the duration loss (squared steps) in the total
    # "durations": the alignment search's cost starts with a static diagonal prior (beta-binomial, Badlani
    # et al. 2021, "One TTS Alignment To Rule Them All"), weight 1 fading linearly to 0 over this many
    # training steps, so that the first paths are near the diagonal whatever the initial weights; 0: none.
    alignment_prior_steps: int = 0
    # "durations": whether the search may give a character no step of its own (a silent letter, a space);
    # False: every character (phoneme) is spoken for at least one step, as in Glow-TTS' search.
    alignment_skips: bool = True
    # "durations": after training, the duration predictor alone is fitted again for this many epochs of the
    # training split on the final weights' alignments (models/tts/refit.py; it lags them otherwise); 0: not.
    duration_refit_epochs: int = 0
    # "durations": the decoder over the characters repeated by their durations. "lstm": a bidirectional
    # LSTM of decoder_lstm_units per direction. "conv": residual blocks of dilated convolutions
    # (decoder_conv_layers of decoder_conv_filters channels, dilations 1, 2, 4, 8, ...): no step waits
    # for the one before, so a training step is not a chain of small matrix products.
    durations_decoder: Literal["lstm", "conv"] = "lstm"
    decoder_conv_layers: int = 4  # "conv": residual conv + layer norm + ReLU + dropout blocks
    decoder_conv_filters: int = 128  # "conv": channels of each block (256: slower than the LSTM on 2 CPU cores)
    decoder_conv_kernel: int = 5  # "conv": width in decoder steps of each convolution (odd)
    # "attention": compile the decoder loops with XLA (jit_compile): one fused program per batch shape.
    # Helps where each op is a kernel launch (a GPU); on 2 CPU cores see benchmarks/throughput.py.
    xla: bool = False
    # Which path runs the encoder's (and an LSTM decoder's) bidirectional LSTMs: "auto" is
    # models/layers/lstm.py's CPU path without a GPU and Keras' (cuDNN) with one; "keras"; "fused".
    lstm: str = "auto"

    def __post_init__(self):
        if self.alignment not in ("attention", "durations"):
            raise ValueError(f"TtsConfig.alignment must be 'attention' or 'durations', got {self.alignment!r}")
        if self.durations_decoder not in ("lstm", "conv"):
            raise ValueError(f"TtsConfig.durations_decoder must be 'lstm' or 'conv', got {self.durations_decoder!r}")
        if self.input not in ("characters", "phonemes"):
            raise ValueError(f"TtsConfig.input must be 'characters' or 'phonemes', got {self.input!r}")
        if self.mel_loss not in ("l1", "l2"):
            raise ValueError(f"TtsConfig.mel_loss must be 'l1' or 'l2', got {self.mel_loss!r}")
        if self.duration_refit_epochs < 0:
            raise ValueError(f"TtsConfig.duration_refit_epochs must not be negative, got {self.duration_refit_epochs}")
        if self.alignment_prior_steps < 0:
            raise ValueError(f"TtsConfig.alignment_prior_steps must not be negative, got {self.alignment_prior_steps}")
        if self.reduction_factor < 1 or self.decoder_lstm_layers < 1 or self.vocab_size < 2:
            raise ValueError(f"TtsConfig needs reduction_factor, decoder_lstm_layers >= 1 and vocab_size >= 2: {self}")
        kernels = (self.location_kernel, self.postnet_kernel, self.encoder_conv_kernel, self.decoder_conv_kernel)
        if any(k % 2 == 0 for k in kernels):
            raise ValueError("TtsConfig kernels must be odd so that 'same' convolutions stay centred")
        if len(set(self.speakers)) != len(self.speakers):
            raise ValueError("TtsConfig.speakers names a voice twice")

    @property
    def multi_speaker(self) -> bool:
        """Whether the model has a speaker table (and batches need `speaker_ids`)."""
        return bool(self.speakers) and self.speaker_dim > 0


@dataclasses.dataclass(frozen=True)
class TtsEvalConfig:
    """models.evaluate's options for the synthesis model (beside the shared `splits`)."""

    max_utterances: int = 100  # test sentences to synthesize
    num_audio: int = 3  # sentences rendered as Griffin-Lim WAVs
    num_plots: int = 4  # sentences with attention and mel plots
    # padded frames per evaluation batch: fewer than the acoustic model's, as free-running synthesis
    # holds up to 1.5 times each reference and an attention row per decoder step for every sentence
    frames_per_batch: int = 12000
    # a training voice to speak every sentence in; empty: each recording's own voice (dev), or for
    # voices training never heard (test), the nearest training voice (models/tts/task.py TtsTask.voices)
    voice: str = ""
