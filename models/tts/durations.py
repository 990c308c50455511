"""The durations model, `DurationsTts` (`alignment: durations`, configs/demo_tts.yaml): the demo's
synthesis model, characters -> normalized 80-bin log-mel frames.

Where each character is spoken is searched, not learned by attention. In every training batch a
monotonic alignment search (Glow-TTS, Kim et al. 2020; models/tts/alignment.py) finds the path
through (decoder step, character) that best matches the frames the encoder predicts for each
character; a duration predictor learns those durations for synthesis (FastSpeech, Ren et al.
2019); a decoder fed no frames (a bidirectional LSTM, or dilated convolutions with
`durations_decoder: conv`) runs over the characters repeated by their durations. Nothing has to be
learned by attention first, and synthesis runs the computation training ran (no exposure bias):
use it unless you need the attention model.

The other model, the attention Tacotron (`alignment: attention`), is in models/tts/attention.py;
the encoder, post-net, speaker table and frame losses both have are in models/tts/base.py;
models/tts/network.py's `build_tts` builds either from its config.

Use: `model = build_tts(config)`; training `outputs = model.teacher_forced(batch, training=True)`
and `model.compute_losses(batch, outputs)["total"]` inside `tf.function(reduce_retracing=True)`;
synthesis `model.infer(tokens, token_lengths, max_steps, speaker_ids=...)`. `encode`, `decode` and
`postnet` are the three stages of `teacher_forced`, callable on their own to time each one. Batch
keys and shapes: models/tts/base.py.
"""

from __future__ import annotations

import tensorflow as tf
from keras import layers

from models.layers import lstm
from models.tts.alignment import monotonic_alignment, step_and_character_masks
from models.tts.attention import attention_decoder_layers
from models.tts.base import F32, SynthesisModel, dropout, mask, no_autograph
from models.tts.config import TtsConfig


class DurationsTts(SynthesisModel):
    """`teacher_forced`, `compute_losses` and `infer` are what trainers call."""

    def __init__(self, config: TtsConfig):
        super().__init__(config)
        c = config
        self.char_frames = layers.Dense(c.reduction_factor * c.n_mels, name="char_frames")
        # FastSpeech's duration predictor: two conv + layer norm + dropout blocks, one output.
        self.duration_convs = self._stack(
            "duration_conv",
            (layers.Conv1D(c.encoder_conv_filters, 3, padding="same", name=f"duration_conv_{i}") for i in range(2)),
        )
        self.duration_norms = self._stack(
            "duration_norm", (layers.LayerNormalization(name=f"duration_norm_{i}") for i in range(2))
        )
        self.duration_out = layers.Dense(1, name="duration_out")  # decoder steps per character
        if c.alignment_prior_steps:
            # the batches trained on (`count_batch`; the prior fades with them), saved with the weights
            self.trained_batches = self.add_weight(
                shape=(), dtype="float32", initializer="zeros", trainable=False, name="alignment_prior_batches"
            )
        if c.durations_decoder == "lstm":
            self.dec_fw = layers.LSTM(c.decoder_lstm_units, return_sequences=True, name="dec_fw")
            self.dec_bw = layers.LSTM(c.decoder_lstm_units, return_sequences=True, name="dec_bw")
        else:
            n_dec_conv = range(c.decoder_conv_layers)
            self.dec_in = layers.Dense(c.decoder_conv_filters, name="dec_in")
            self.dec_convs = self._stack(
                "dec_conv",
                (
                    layers.Conv1D(
                        c.decoder_conv_filters,
                        c.decoder_conv_kernel,
                        padding="same",
                        dilation_rate=2 ** (i % 4),
                        name=f"dec_conv_{i}",
                    )
                    for i in n_dec_conv
                ),
            )
            self.dec_norms = self._stack(
                "dec_norm", (layers.LayerNormalization(name=f"dec_norm_{i}") for i in n_dec_conv)
            )

    def _decoder_layers(self):
        # Made and dropped: each layer's initializer draws a seed from Python's random state when it
        # is made. Drawing the attention decoder's seeds here gives the layers made after them (the
        # output layers) the initial weights they have in the attention model at the same seed.
        attention_decoder_layers(self.config)

    @no_autograph
    def decode(self, memory, token_lengths, mels, training=False, speaker_ids=None, mel_lengths=None):
        """Teacher-forced decoding: the alignment is searched, not attended. memory [B, N, M],
        mels [B, T, 80] (T need not divide by r), mel_lengths [B] (None: all T), speaker_ids [B].

        Returns mel_before [B, T, 80], stop_logits [B, T], alignments [B, S, N] one-hot, and what the
        losses read: the searched and predicted durations [B, N], the frames expected of each step's
        character and the target frames [B, S, r * 80]."""
        c, r = self.config, self.config.reduction_factor
        b, t = tf.shape(mels)[0], tf.shape(mels)[1]
        if mel_lengths is None:
            mel_lengths = tf.fill([b], t)
        align, means, target, step_lengths = self.search(memory, token_lengths, mels, mel_lengths)
        steps = tf.shape(align)[1]
        frames, stops = self._aligned_frames(memory, align, step_lengths, speaker_ids, training)
        return dict(
            mel_before=tf.reshape(frames, [b, steps * r, c.n_mels])[:, :t],  # [B, T, 80]
            stop_logits=tf.reshape(stops, [b, steps * r])[:, :t],  # [B, T]
            alignments=align,  # [B, S, N] one-hot
            aligned_means=tf.einsum("bsn,bnd->bsd", align, tf.cast(means, F32)),  # [B, S, r * 80]
            grouped_targets=target,  # [B, S, r * 80]
            durations=tf.reduce_sum(align, 1),  # [B, N] decoder steps per character, searched
            predicted_durations=self.predict_durations(memory, token_lengths, training),  # [B, N]
        )

    def search(self, memory, token_lengths, mels, mel_lengths):
        """The monotonic alignment search: where each character is spoken. memory [B, N, M], mels
        [B, T, 80], mel_lengths [B]. Returns the path as a one-hot alignment [B, S, N] float32 (0 past
        each utterance's steps), the frames expected of each character [B, N, r * 80], the target
        frames [B, S, r * 80] float32 and the real decoder steps [B]."""
        c, r = self.config, self.config.reduction_factor
        b = tf.shape(mels)[0]
        step_lengths = (mel_lengths + r - 1) // r  # [B] real decoder steps
        grouped = self.group_frames(mels)  # [B, S, r * 80] the target frames in decoder steps
        steps = tf.shape(grouped)[1]
        means = self.char_frames(memory)  # [B, N, r * 80]: the frames each character is expected to make
        # Squared distance of every decoder step's frames to every character's: [B, S, N]
        target = tf.cast(grouped, F32)
        cost = (
            tf.reduce_sum(tf.square(target), -1)[:, :, None]
            - 2.0 * tf.einsum("bsd,bnd->bsn", target, tf.cast(means, F32))
            + tf.reduce_sum(tf.square(tf.cast(means, F32)), -1)[:, None, :]
        ) / float(r * c.n_mels)
        prior_weight = tf.constant(0.0)
        if c.alignment_prior_steps:
            prior_weight = tf.maximum(1.0 - self.trained_batches / float(c.alignment_prior_steps), 0.0)
        path = tf.numpy_function(
            monotonic_alignment,
            [tf.stop_gradient(cost), step_lengths, token_lengths, prior_weight, c.alignment_skips],
            tf.int32,
            stateful=False,
        )
        path = tf.reshape(path, [b, steps])  # [B, S] the character of each decoder step
        align = tf.one_hot(path, tf.shape(memory)[1], dtype=F32) * mask(step_lengths, steps, F32)[..., None]
        return align, means, target, step_lengths

    def duration_variables(self) -> list:
        """The duration predictor's weights (models/tts/refit.py fits them alone)."""
        layers_ = [*self.duration_convs, *self.duration_norms, self.duration_out]
        return [v for layer in layers_ for v in layer.trainable_weights]

    def count_batch(self):
        """A training batch done (TtsTask's training loss calls it): the alignment prior fades with them."""
        if self.config.alignment_prior_steps:
            self.trained_batches.assign_add(1.0)

    def predict_durations(self, memory, token_lengths, training=False):
        """Predicted decoder steps of each character [B, N] (float32, 0 at padding), from the encoder's
        output without moving it (the durations follow the text; the text is not bent to them).
        Steps, not their logarithm: the mean of a log-domain fit is the geometric mean, which falls
        short of the arithmetic mean, and every sentence would come out shorter than its recording."""
        maskf = mask(token_lengths, tf.shape(memory)[1], self.compute_dtype)[..., None]  # [B, N, 1]
        x = self._conv_blocks(tf.stop_gradient(memory), self.duration_convs, self.duration_norms, maskf, training)
        return tf.cast(self.duration_out(x)[..., 0] * maskf[..., 0], F32)

    def _aligned_frames(self, memory, align, step_lengths, speaker_ids, training):
        """The decoder: the characters repeated by `align` [B, S, N] float32 one-hot (memory already
        carries the voice) -> frames [B, S, r * 80] and stop logits [B, S, r]."""
        expanded = tf.matmul(tf.cast(align, self.compute_dtype), memory)  # [B, S, M]
        # Where each step lies within its character: (k - 1/2) / d for its k-th of d steps, and d itself
        # (in tens of steps), so that the decoder need not count to shape a character's start and end.
        d = tf.reduce_sum(align * tf.reduce_sum(align, 1, keepdims=True), -1)  # [B, S] steps of the step's character
        k = tf.reduce_sum(align * tf.cumsum(align, axis=1), -1)  # [B, S] 1..d
        position = tf.stack([(k - 0.5) / tf.maximum(d, 1.0), d / 10.0], -1)  # [B, S, 2]
        expanded = tf.concat([expanded, tf.cast(position, self.compute_dtype)], -1)  # [B, S, M + 2]
        maskf = mask(step_lengths, tf.shape(align)[1], self.compute_dtype)[..., None]  # [B, S, 1]
        if self.config.durations_decoder == "lstm":
            both = lstm.bidirectional(self.dec_fw, self.dec_bw, expanded, step_lengths, self.config.lstm, training)
            hidden = [both]  # [B, S, 2U]
        else:
            x = self.dec_in(expanded) * maskf  # [B, S, C]
            for conv, norm in zip(self.dec_convs, self.dec_norms):
                # residual; padding re-masked so that no block reads past a sentence's end
                x = x + dropout(tf.nn.relu(norm(conv(x))), self.config.dropout, training) * maskf
            hidden = [x]  # [B, S, C]
        out = tf.concat(hidden + [expanded], -1) * maskf  # [B, S, hidden + M + 2]
        frames = self.frame_proj(out)
        voice = self.voice(speaker_ids, tf.shape(memory)[0])
        if voice is not None:
            frames += self.speaker_frames(voice)[:, None, :]
        return frames, self.stop_proj(out)

    @no_autograph
    def compute_losses(self, batch, outputs):
        """Masked losses (float32 scalars): total, mel, postnet, stop, alignment, duration, and
        guided_attention (reported on the searched alignment, never added to the total).

        (Not named `loss`: keras.Model's constructor sets a `loss` attribute that would shadow it.)
        """
        c = self.config
        losses = self.shared_losses(batch, outputs)
        s_mask, n_mask, _ = step_and_character_masks(
            outputs["alignments"], batch["mel_lengths"], batch["token_lengths"], c.reduction_factor
        )
        # The encoder's frames per character toward the frames the search gave it (what makes the
        # next search better), and the predicted durations toward the searched ones (in steps).
        losses["alignment"] = tf.reduce_sum(
            tf.square(outputs["aligned_means"] - outputs["grouped_targets"]) * s_mask[..., None]
        ) / (tf.maximum(tf.reduce_sum(s_mask), 1.0) * c.reduction_factor * c.n_mels)
        losses["duration"] = tf.reduce_sum(
            tf.square(outputs["predicted_durations"] - outputs["durations"]) * n_mask
        ) / tf.maximum(tf.reduce_sum(n_mask), 1.0)
        total = losses["mel"] + losses["postnet"] + losses["stop"]
        return dict(total=total + losses["alignment"] + c.duration_weight * losses["duration"], **losses)

    @no_autograph
    def infer(self, tokens, token_lengths, max_steps, stop_threshold=0.5, speaker_ids=None):
        """Synthesis: each character held for its predicted steps. tokens [B, N] int32, token_lengths
        [B]; at most max_steps decoder steps (`max_steps * r` frames); speaker_ids [B] int32 (a model
        with voices; None: the default voice). `stop_threshold` is unused (the durations say where a
        sentence ends); it is there so that both models are called alike.

        Returns float32 mels [B, T, 80] (post-net output, 0 past each length), mels_before
        [B, T, 80], lengths [B] int32, alignments [B, steps, N] one-hot and the predicted durations
        [B, N] (decoder steps per character, before rounding)."""
        memory = self.encode(tokens, token_lengths, training=False, speaker_ids=speaker_ids)  # [B, N, M]
        durations = tf.maximum(self.predict_durations(memory, token_lengths), 0.0)  # [B, N]
        return dict(self.speak(memory, durations, max_steps, speaker_ids), durations=durations)

    @no_autograph
    def infer_with_durations(self, tokens, token_lengths, durations, speaker_ids=None):
        """Synthesis with durations given [B, N] float32 decoder steps per character instead of
        predicted (the alignment search's own durations give the teacher-forced frames): what each
        part of synthesis costs (benchmarks/tts_durations.py). Returns what `infer` returns."""
        memory = self.encode(tokens, token_lengths, training=False, speaker_ids=speaker_ids)  # [B, N, M]
        durations = tf.maximum(tf.cast(durations, F32), 0.0) * mask(token_lengths, tf.shape(memory)[1], F32)
        max_steps = tf.cast(tf.math.ceil(tf.reduce_max(tf.reduce_sum(durations, 1))), tf.int32) + 1
        return dict(self.speak(memory, durations, max_steps, speaker_ids), durations=durations)

    def speak(self, memory, durations, max_steps, speaker_ids=None):
        """The decoder and post-net over the characters held for `durations` [B, N] float32 steps
        (memory [B, N, M] from `encode`): mels, mels_before, lengths and alignments as `infer` says."""
        c, r = self.config, self.config.reduction_factor
        max_steps = tf.convert_to_tensor(max_steps, tf.int32)
        b, n = tf.shape(memory)[0], tf.shape(memory)[1]
        # Where each character ends, rounded from the running sum: rounding each duration on its own
        # would lose up to half a step per character (a sentence of 1.4-step characters a third short).
        ends = tf.cast(tf.round(tf.cumsum(durations, axis=1)), tf.int32)  # [B, N]
        lengths = tf.maximum(tf.minimum(ends[:, -1], max_steps), 1)  # [B] decoder steps
        steps = tf.reduce_max(lengths)
        # the character of step s: how many characters end at or before s
        path = tf.minimum(tf.searchsorted(ends, tf.tile(tf.range(steps)[None], [b, 1]), side="right"), n - 1)
        align = tf.one_hot(path, n, dtype=F32) * mask(lengths, steps, F32)[..., None]  # [B, S, N]
        frames, _ = self._aligned_frames(memory, align, lengths, speaker_ids, False)
        before = tf.reshape(frames, [b, steps * r, c.n_mels]) * mask(lengths * r, steps * r, frames.dtype)[..., None]
        return dict(
            mels=tf.cast(self.postnet(before, lengths * r), F32),
            mels_before=tf.cast(before, F32),
            lengths=lengths * r,
            alignments=align,
        )
