"""The durations model's duration predictor fitted again after training, on the alignments of the
final weights (`tts.duration_refit_epochs`; TtsTask.finish runs it on the weights that are saved).

During training the predictor chases a moving target: the search's durations change as the
encoder learns, and the steps end when the frames are good, not when the predictor has caught up.
benchmarks/tts_durations.py shows what that costs: on the demo's model the predicted durations are
heard at about twice the CER of the searched ones. Here the encoder and the search are fixed, so
each training batch is searched once and its encoder output kept; the predictor alone (a few
thousand weights on those outputs) then trains for several epochs over them in seconds, with the
loss it trained with (squared steps).
"""

from __future__ import annotations

import time

import numpy as np


def refit_durations(model, batches, epochs: int, learning_rate: float = 1e-3, seed: int = 0) -> dict:
    """Fits `model.duration_variables()` to the searched durations of `batches` (training batches of
    the durations model, each a dict of tensors) for `epochs` passes in a seeded random order of the
    batches. Returns the mean loss of the first and the last epoch, the batches and the seconds."""
    import keras
    import tensorflow as tf

    start = time.perf_counter()

    @tf.function(reduce_retracing=True)
    def searched(batch):
        ids = model.batch_speakers(batch)
        memory = model.encode(batch["tokens"], batch["token_lengths"], False, ids)  # [B, N, M]
        align, _, _, _ = model.search(memory, batch["token_lengths"], batch["mels"], batch["mel_lengths"])
        return memory, tf.reduce_sum(align, 1)  # [B, N] decoder steps per character

    cache = [(*searched(batch), batch["token_lengths"]) for batch in batches]
    variables = model.duration_variables()
    optimizer = keras.optimizers.Adam(learning_rate)

    @tf.function(reduce_retracing=True)
    def step(memory, durations, token_lengths):
        with tf.GradientTape() as tape:
            predicted = model.predict_durations(memory, token_lengths, training=True)  # [B, N]
            n_mask = tf.sequence_mask(token_lengths, tf.shape(memory)[1], tf.float32)
            loss = tf.reduce_sum(tf.square(predicted - durations) * n_mask) / tf.maximum(tf.reduce_sum(n_mask), 1.0)
        optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables))
        return loss

    rng = np.random.default_rng(seed)
    losses = []
    for _ in range(epochs):
        losses.append(float(np.mean([float(step(*cache[i])) for i in rng.permutation(len(cache))])))
    return {
        "duration_refit_batches": len(cache),
        "duration_refit_first_epoch_loss": losses[0] if losses else None,
        "duration_refit_last_epoch_loss": losses[-1] if losses else None,
        "duration_refit_seconds": time.perf_counter() - start,
    }
