"""What both synthesis models share: the character encoder, the output projections, the post-net, the
speaker table and the frame losses (their config: models/tts/config.py).

`SynthesisModel` is the base of `DurationsTts` (models/tts/durations.py, the demo's model) and
`AttentionTacotron` (models/tts/attention.py). It holds every layer the two have in common and
the stages around the decoder: `encode` (characters -> memory), `postnet` (frames -> refined
frames), `teacher_forced` (encode, the subclass' `decode`, post-net) and the masked mel and stop
losses; each subclass adds its decoder, its own losses and `infer`.

Voices: with `config.speakers` (the training split's speakers, filled in by models/tts/task.py) a
model has a speaker embedding table, one row per training voice, as multi-speaker Tacotron and
Deep Voice 2 (Arik et al. 2017) have: each utterance's embedding is projected into the encoder
output (so the decoder's memory knows the voice) and onto the output frames (the attention
decoder also adds it to its LSTM's input every step). Without it, a corpus of many voices is
learned as their average: smeared spectra.

Batch keys: tokens [B, N] int32 (0 = padding), token_lengths [B], mels [B, T, 80], mel_lengths [B],
stop_targets [B, T] (1.0 from the last real frame on), and speaker_ids [B] int32 (rows of the
speaker table) for a model with voices.
"""

from __future__ import annotations

from collections.abc import Sequence

import keras
import numpy as np
import tensorflow as tf
from keras import layers

from models.layers import lstm
from models.tts.alignment import guided_attention_loss
from models.tts.config import TtsConfig

F32 = tf.float32


def speaker_ids(config: TtsConfig, voices: Sequence[str | None]) -> np.ndarray:
    """Rows of the speaker table for voice names: int32 [len(voices)]. A missing voice (None or "")
    is the default voice, the first training voice. ValueError naming the model's voices for a name
    it does not have. What serving calls with a request's `voice` column."""
    known = {name: i for i, name in enumerate(config.speakers)}
    ids = []
    for voice in voices:
        if voice is None or voice == "":
            ids.append(0)
        elif voice in known:
            ids.append(known[voice])
        else:
            have = f"these voices: {', '.join(config.speakers)}" if config.speakers else "one voice, not named"
            raise ValueError(f"voice {voice!r} is not one this model was trained on; it has {have}")
    return np.asarray(ids, np.int32)


# The models' methods hold no Python control flow on tensors (the attention decoder's loops are
# explicit tf.while_loops), so AutoGraph has nothing to convert in them; tracing them as they are
# also avoids a TF 2.17 AutoGraph failure seen once in a test run, where a converted `postnet` was
# called without its `self` ("tf__postnet() missing 1 required positional argument").
no_autograph = tf.autograph.experimental.do_not_convert


def dropout(x, rate: float, on: bool):
    return tf.nn.dropout(x, rate) if on and rate > 0 else x


def mask(lengths, maxlen, dtype):
    return tf.sequence_mask(lengths, maxlen, dtype=dtype)  # [B, maxlen]


class SynthesisModel(keras.Model):
    """The layers and stages both synthesis models have. A subclass makes its decoder's layers in
    `_decoder_layers` (called between the encoder's and the output layers, the order in which
    their initializers draw seeds) and defines `decode`, `compute_losses` and `infer`."""

    def __init__(self, config: TtsConfig):
        # One name for both models: checkpoints and registered models keep their variables' names.
        super().__init__(name="tacotron")
        c = self.config = config
        # Every layer is named: checkpoints restore variables by these names (Keras would number
        # unnamed layers per process, and a second model in one process would get other names).
        self.embedding = layers.Embedding(c.vocab_size, c.embedding_dim, name="embedding")
        n_conv = range(c.encoder_conv_layers)
        self.enc_convs = self._stack(
            "enc_conv",
            (
                layers.Conv1D(c.encoder_conv_filters, c.encoder_conv_kernel, padding="same", name=f"enc_conv_{i}")
                for i in n_conv
            ),
        )
        # Layer norm, not batch norm: its statistics are per position, so padding cannot leak in.
        self.enc_norms = self._stack("enc_norm", (layers.LayerNormalization(name=f"enc_norm_{i}") for i in n_conv))
        self.enc_fw = layers.LSTM(c.encoder_lstm_units, return_sequences=True, name="enc_fw")
        self.enc_bw = layers.LSTM(c.encoder_lstm_units, return_sequences=True, name="enc_bw")
        self._decoder_layers()
        self.frame_proj = layers.Dense(c.reduction_factor * c.n_mels, name="frame_proj")
        self.stop_proj = layers.Dense(c.reduction_factor, name="stop_proj")
        n_post = range(c.postnet_layers)
        self.post_convs = self._stack(
            "post_conv",
            (layers.Conv1D(c.postnet_filters, c.postnet_kernel, padding="same", name=f"post_conv_{i}") for i in n_post),
        )
        self.post_norms = self._stack("post_norm", (layers.LayerNormalization(name=f"post_norm_{i}") for i in n_post))
        self.post_out = layers.Conv1D(c.n_mels, c.postnet_kernel, padding="same", name="post_out")
        if c.multi_speaker:
            # One row per training voice, projected to where the voice matters: the decoder's memory
            # (softsign keeps the added term in the LSTM outputs' range), the attention decoder's
            # LSTM gates (every step; the durations model leaves it unbuilt), the output frames (the
            # voice's spectral envelope).
            # The table as a bias-free Dense over one-hot rows: its gradient is dense, and Horovod
            # 0.28.1's grouped allreduce mismatches tensors when a step has two sparse gradients.
            self.speaker_embedding = layers.Dense(
                c.speaker_dim, use_bias=False, kernel_initializer="random_normal", name="speaker_embedding"
            )
            self.speaker_memory = layers.Dense(2 * c.encoder_lstm_units, activation="softsign", name="speaker_memory")
            self.speaker_decoder = layers.Dense(4 * c.decoder_lstm_units, name="speaker_decoder")
            self.speaker_frames = layers.Dense(c.reduction_factor * c.n_mels, name="speaker_frames")
        self._compiled_infer = None

    def _decoder_layers(self):
        raise NotImplementedError

    def _stack(self, name, new_layers):
        """The layers as a tuple, each also set as attribute `name_i`: tf.train.Checkpoint does not
        follow Keras 3's tracked lists, and would silently skip their variables."""
        stack = tuple(new_layers)
        for i, layer in enumerate(stack):
            setattr(self, f"{name}_{i}", layer)
        return stack

    def call(self, batch, training=False):
        return self.teacher_forced(batch, training)

    def voice(self, speaker_ids, batch_size):
        """Speaker embeddings [B, speaker_dim] of `speaker_ids` [B] int32 (None: the default voice,
        row 0); None for a model without voices."""
        if not self.config.multi_speaker:
            return None
        if speaker_ids is None:
            speaker_ids = tf.zeros([batch_size], tf.int32)
        return self.speaker_embedding(
            tf.one_hot(speaker_ids, len(self.config.speakers), dtype=self.compute_dtype)
        )  # [B, E]

    @no_autograph
    def encode(self, tokens, token_lengths, training=False, speaker_ids=None):
        """tokens [B, N] int32, token_lengths [B], speaker_ids [B] (a model with voices; None: the
        default voice) -> memory [B, N, 2 * encoder_lstm_units], 0 at padding."""
        maskf = mask(token_lengths, tf.shape(tokens)[1], self.compute_dtype)[..., None]  # [B, N, 1]
        x = self.embedding(tokens) * maskf  # [B, N, embedding_dim]
        x = self._conv_blocks(x, self.enc_convs, self.enc_norms, maskf, training)
        # Outputs past a sentence's length are masked off below.
        memory = lstm.bidirectional(self.enc_fw, self.enc_bw, x, token_lengths, self.config.lstm, training)
        # [B, N, 2 * units]
        voice = self.voice(speaker_ids, tf.shape(tokens)[0])
        if voice is not None:
            memory += self.speaker_memory(voice)[:, None, :]
        return memory * maskf

    def _conv_blocks(self, x, convs, norms, maskf, training):
        """conv + layer norm + ReLU + dropout blocks over characters [B, N, C] (the encoder's and the
        duration predictor's). Re-masking after each block keeps padded characters out of the real
        ones' receptive field."""
        for conv, norm in zip(convs, norms):
            x = dropout(tf.nn.relu(norm(conv(x))), self.config.dropout, training) * maskf
        return x

    @no_autograph
    def postnet(self, mel_before, mel_lengths, training=False):
        """mel_before [B, T, 80] -> mel_after [B, T, 80] = mel_before + residual, 0 past mel_lengths."""
        maskf = mask(mel_lengths, tf.shape(mel_before)[1], self.compute_dtype)[..., None]  # [B, T, 1]
        x = mel_before = mel_before * maskf
        for conv, norm in zip(self.post_convs, self.post_norms):
            x = dropout(tf.tanh(norm(conv(x))), self.config.dropout, training) * maskf
        return (mel_before + self.post_out(x)) * maskf  # [B, T, 80]

    def group_frames(self, mels):
        """mels [B, T, 80] -> [B, S, r * 80], S = ceil(T / r) decoder steps (zero-padded)."""
        c, r = self.config, self.config.reduction_factor
        b, t = tf.shape(mels)[0], tf.shape(mels)[1]
        steps = (t + r - 1) // r
        grouped = tf.pad(tf.cast(mels, self.compute_dtype), [[0, 0], [0, steps * r - t], [0, 0]])
        return tf.reshape(grouped, [b, steps, r * c.n_mels])  # [B, S, r * 80]

    @no_autograph
    def teacher_forced(self, batch, training=False):
        """Training/validation forward pass; see `decode` for the shapes. Adds mel_after [B, T, 80]."""
        ids = self.batch_speakers(batch)
        memory = self.encode(batch["tokens"], batch["token_lengths"], training, ids)
        outputs = self.decode(memory, batch["token_lengths"], batch["mels"], training, ids, batch["mel_lengths"])
        outputs["mel_after"] = self.postnet(outputs["mel_before"], batch["mel_lengths"], training)
        return outputs

    def count_batch(self):
        """A training batch done (TtsTask's training loss calls it); a model that changes with the
        batches trained on counts them (the durations model's alignment prior)."""

    def batch_speakers(self, batch):
        """The batch's `speaker_ids` [B] (a model with voices: required), else None."""
        if not self.config.multi_speaker:
            return None
        if "speaker_ids" not in batch:
            raise ValueError(
                "this synthesis model has voices, and the batch has no `speaker_ids`: read batches with "
                "models.tts.task.TtsTask.dataset, which adds them"
            )
        return batch["speaker_ids"]

    def shared_losses(self, batch, outputs):
        """The losses both models report (float32 scalars): mel, postnet, stop (padded frames
        excluded, so padding values cannot move them), and guided_attention on `alignments`."""
        c = self.config
        mels = tf.cast(batch["mels"], F32)
        maskf = mask(batch["mel_lengths"], tf.shape(mels)[1], F32)  # [B, T]
        frames = tf.maximum(tf.reduce_sum(maskf), 1.0)
        err = tf.abs if c.mel_loss == "l1" else tf.square

        def mel_loss(pred):
            return tf.reduce_sum(err(tf.cast(pred, F32) - mels) * maskf[..., None]) / (frames * c.n_mels)

        bce = tf.nn.weighted_cross_entropy_with_logits(
            tf.cast(batch["stop_targets"], F32), tf.cast(outputs["stop_logits"], F32), c.stop_pos_weight
        )
        return dict(
            mel=mel_loss(outputs["mel_before"]),
            postnet=mel_loss(outputs["mel_after"]),
            stop=tf.reduce_sum(bce * maskf) / frames,
            guided_attention=guided_attention_loss(
                outputs["alignments"],
                batch["mel_lengths"],
                batch["token_lengths"],
                c.reduction_factor,
                c.guided_attention_sigma,
            ),
        )

    def compiled_infer(self):
        """`infer` as one tf.function, traced once for any batch and sentence length."""
        if self._compiled_infer is None:
            self._compiled_infer = tf.function(
                self.infer,
                input_signature=[
                    tf.TensorSpec([None, None], tf.int32),
                    tf.TensorSpec([None], tf.int32),
                    tf.TensorSpec([], tf.int32),
                    tf.TensorSpec([], F32),
                    tf.TensorSpec([None], tf.int32),
                ],
            )
        return self._compiled_infer

    def build_variables(self):
        """Creates every variable (one teacher-forced pass on a dummy batch), so that
        models/training/checkpoint.py can restore into the model and Keras can count them."""
        r = self.config.reduction_factor
        dummy = dict(
            tokens=tf.ones([1, 3], tf.int32),
            token_lengths=tf.constant([3]),
            mels=tf.zeros([1, r + 1, self.config.n_mels]),
            mel_lengths=tf.constant([r + 1]),
            speaker_ids=tf.zeros([1], tf.int32),
        )
        self.teacher_forced(dummy, training=False)
        self.built = True  # every variable exists now; lets Keras count and summarize them
        return self
