"""Synthesis models (shapes, masking, tf.function, inference, overfitting, checkpoints, voices, the compiled
decoder) and audio utilities."""

from __future__ import annotations

import dataclasses

import keras
import numpy as np
import pytest
import scipy.io.wavfile
import scipy.signal
import tensorflow as tf

from models.tts import audio
from models.tts.alignment import (
    attention_diagonality,
    attention_monotonicity,
    beta_binomial_cost,
    monotonic_alignment,
)
from models.tts.base import speaker_ids
from models.tts.config import TtsConfig
from models.tts.network import build_tts
from models.tts.task import TtsTask, resolve_tts, speak
from pipeline import features
from tests.conftest import shard_set

TINY = TtsConfig(
    vocab_size=16,
    embedding_dim=32,
    encoder_conv_layers=1,
    encoder_conv_filters=32,
    encoder_lstm_units=32,
    attention_dim=32,
    location_filters=8,
    location_kernel=7,
    prenet_units=(32, 16),
    decoder_lstm_units=64,
    reduction_factor=3,
    postnet_layers=1,
    postnet_filters=32,
    prenet_dropout_at_inference=False,
)


def synthetic_batch(config=TINY, lengths=(6, 8, 10, 12), seed=0):
    """Sentences of random characters whose mel frames are a fixed vector per character, held for
    4-6 frames depending on the character (speech has 6-8 per character at 10 ms): a text-to-mel map
    an attention model can learn."""
    rng = np.random.default_rng(seed)
    table = np.random.default_rng(1234).normal(size=[config.vocab_size, config.n_mels])
    sentences = [rng.integers(1, config.vocab_size, size=n) for n in lengths]
    frames = [np.repeat(table[s], 4 + s % 3, axis=0) for s in sentences]
    t_max, n_max = max(len(f) for f in frames), max(lengths)
    batch = dict(
        tokens=np.zeros([len(lengths), n_max], np.int32),
        mels=np.zeros([len(lengths), t_max, 80], np.float32),
        stop_targets=np.zeros([len(lengths), t_max], np.float32),
    )
    for i, (s, f) in enumerate(zip(sentences, frames)):
        batch["tokens"][i, : len(s)] = s
        batch["mels"][i, : len(f)] = f
        batch["stop_targets"][i, len(f) - 1 :] = 1.0
    batch["token_lengths"] = np.array(lengths, np.int32)
    batch["mel_lengths"] = np.array([len(f) for f in frames], np.int32)
    return {k: tf.constant(v) for k, v in batch.items()}


def make_train_step(model, learning_rate=3e-3):
    optimizer = keras.optimizers.Adam(learning_rate)

    @tf.function(reduce_retracing=True)
    def step(batch):
        with tf.GradientTape() as tape:
            outputs = model.teacher_forced(batch, training=True)
            losses = model.compute_losses(batch, outputs)
        grads = tape.gradient(losses["total"], model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return losses, outputs["alignments"]

    return step


def decoder_lengths(batch, config=TINY):
    return (batch["mel_lengths"].numpy() + config.reduction_factor - 1) // config.reduction_factor


@pytest.fixture(scope="module")
def model():
    return build_tts(TINY)


def test_config_rejects_bad_values():
    with pytest.raises(ValueError, match="mel_loss"):
        TtsConfig(mel_loss="l3")
    with pytest.raises(ValueError, match="odd"):
        TtsConfig(location_kernel=4)


def test_shapes_with_frames_not_a_multiple_of_r(model):
    batch = synthetic_batch(lengths=(5, 3))
    t, n = batch["mels"].shape[1], 5
    assert t % TINY.reduction_factor != 0, "the point of this test: frames do not fill the last decoder step"
    out = model.teacher_forced(batch, training=True)
    assert out["mel_before"].shape == (2, t, 80) and out["mel_after"].shape == (2, t, 80)
    assert out["stop_logits"].shape == (2, t)
    assert out["alignments"].shape == (2, -(-t // 3), n)
    align = out["alignments"].numpy()
    np.testing.assert_allclose(align.sum(-1), 1.0, atol=1e-5)
    assert np.all(align[1, :, 3:] < 1e-6), "padded characters must get no attention"
    memory = model.encode(batch["tokens"], batch["token_lengths"])
    assert memory.shape == (2, n, 2 * TINY.encoder_lstm_units)
    assert np.all(memory.numpy()[1, 3:] == 0)
    after = model.postnet(out["mel_before"], batch["mel_lengths"])
    assert np.all(after.numpy()[1, batch["mel_lengths"][1] :] == 0)
    losses = model.compute_losses(batch, out)
    assert set(losses) == {"total", "mel", "postnet", "stop", "guided_attention"}
    assert all(v.shape == () and np.isfinite(v.numpy()) for v in losses.values())


def test_stacked_decoder_and_reduction_factor_one():
    config = dataclasses.replace(TINY, decoder_lstm_layers=2, reduction_factor=1, prenet_units=(16,))
    model = build_tts(config)
    batch = synthetic_batch(config, lengths=(4, 2))
    t = batch["mels"].shape[1]
    assert model.teacher_forced(batch, training=True)["alignments"].shape == (2, t, 4)
    # One more decoder LSTM (input kernel + bias, recurrent kernel), one pre-net layer fewer (kernel + bias).
    assert len(model.weights) == len(build_tts(TINY).weights) + 3 - 2
    out = model.infer(batch["tokens"], batch["token_lengths"], max_steps=3, stop_threshold=1.0)
    assert out["mels"].shape == (2, 3, 80) and out["alignments"].shape == (2, 3, 4)


def test_padding_values_change_neither_outputs_nor_losses(model):
    batch = synthetic_batch()
    changed = dict(batch)
    pad_frames = ~tf.sequence_mask(batch["mel_lengths"], batch["mels"].shape[1])
    pad_tokens = ~tf.sequence_mask(batch["token_lengths"], batch["tokens"].shape[1])
    changed["mels"] = tf.where(pad_frames[..., None], 7.0, batch["mels"])
    changed["tokens"] = tf.where(pad_tokens, 5, batch["tokens"])
    changed["stop_targets"] = tf.where(pad_frames, 0.0, batch["stop_targets"])
    assert not np.array_equal(changed["mels"], batch["mels"])
    out, out2 = model.teacher_forced(batch), model.teacher_forced(changed)
    losses, losses2 = model.compute_losses(batch, out), model.compute_losses(changed, out2)
    for key in losses:
        np.testing.assert_allclose(losses[key], losses2[key], rtol=1e-6, err_msg=key)
    real = tf.sequence_mask(batch["mel_lengths"], batch["mels"].shape[1])
    np.testing.assert_allclose(out["mel_after"][real], out2["mel_after"][real], atol=1e-5)
    # The amount of padding does not matter either: the shortest utterance alone, unpadded,
    # gets the same outputs (catches a backward LSTM or a convolution reading padding first).
    n0, t0 = int(batch["token_lengths"][0]), int(batch["mel_lengths"][0])
    alone = dict(
        tokens=batch["tokens"][:1, :n0],
        token_lengths=batch["token_lengths"][:1],
        mels=batch["mels"][:1, :t0],
        mel_lengths=batch["mel_lengths"][:1],
    )
    out_alone = model.teacher_forced(alone)
    np.testing.assert_allclose(out_alone["mel_after"][0], out["mel_after"][0, :t0], atol=1e-5)
    np.testing.assert_allclose(out_alone["alignments"][0], out["alignments"][0, : -(-t0 // 3), :n0], atol=1e-6)
    # ... while a change to a real frame does move the loss, so the comparisons above can fail.
    changed["mels"] = batch["mels"] + 0.5
    assert abs(float(model.compute_losses(changed, model.teacher_forced(changed))["mel"] - losses["mel"])) > 1e-3


def test_tf_function_train_step_with_two_batch_shapes():
    model = build_tts(TINY)
    step = make_train_step(model)
    before = [v.numpy().copy() for v in model.trainable_variables]
    for batch in (synthetic_batch(lengths=(4, 9)), synthetic_batch(lengths=(7, 3, 5), seed=1)):
        losses, align = step(batch)
        assert np.isfinite(losses["total"].numpy())
        assert align.shape[:2] == (batch["tokens"].shape[0], -(-batch["mels"].shape[1] // 3))
    moved = [not np.array_equal(b, v.numpy()) for b, v in zip(before, model.trainable_variables)]
    assert all(moved), "every trainable variable must receive a gradient"


def test_mixed_bfloat16_train_step():
    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    try:
        model = build_tts(TINY)
        losses, align = make_train_step(model)(synthetic_batch(lengths=(4, 6)))
    finally:
        keras.mixed_precision.set_global_policy("float32")
    assert model.trainable_variables[0].dtype == "float32"
    assert losses["total"].dtype == tf.float32 and align.dtype == tf.float32
    assert np.isfinite(losses["total"].numpy())


def set_stop_bias(model, bias):
    model.stop_proj.kernel.assign(tf.zeros_like(model.stop_proj.kernel))
    model.stop_proj.bias.assign(tf.constant(bias, tf.float32))


def test_infer_respects_max_steps_and_stop_threshold():
    model = build_tts(TINY)
    tokens, lengths = synthetic_batch(lengths=(5, 3))["tokens"], tf.constant([5, 3])
    set_stop_bias(model, [-6.0, -6.0, -6.0])  # stop probability 0.0025 on every frame: never stops
    out = model.infer(tokens, lengths, max_steps=4)
    assert out["mels"].shape == (2, 12, 80) and out["alignments"].shape == (2, 4, 5)
    assert list(out["lengths"].numpy()) == [12, 12]
    set_stop_bias(model, [-6.0, 6.0, -6.0])  # the second frame of every step is past 0.5
    out = tf.function(model.infer, reduce_retracing=True)(tokens, lengths, max_steps=10)
    assert list(out["lengths"].numpy()) == [2, 2] and out["mels"].shape == (2, 3, 80)
    assert np.all(out["mels"].numpy()[:, 2:] == 0), "frames past the stop are zeroed"
    set_stop_bias(model, [0.0, 0.0, 0.0])  # probability exactly 0.5: the threshold decides
    assert list(model.infer(tokens, lengths, 3, stop_threshold=0.4)["lengths"].numpy()) == [1, 1]
    assert list(model.infer(tokens, lengths, 3, stop_threshold=0.6)["lengths"].numpy()) == [9, 9]


def test_checkpoint_round_trip_gives_identical_outputs(tmp_path):
    batch = synthetic_batch()
    model = build_tts(TINY)
    for variable in model.weights:  # so the saved weights differ from any fresh initialization
        variable.assign(variable + tf.random.normal(variable.shape, stddev=0.1))
    path = tf.train.Checkpoint(model=model).save(str(tmp_path / "ckpt"))
    saved = [name for name, _ in tf.train.list_variables(path) if name.startswith("model/")]
    assert len(saved) == len(model.weights), "every variable (layer stacks included) is in the checkpoint"
    restored = build_tts(TINY)
    fresh = restored.teacher_forced(batch)["mel_after"].numpy()
    tf.train.Checkpoint(model=restored).restore(path).assert_existing_objects_matched()
    expected = model.teacher_forced(batch)["mel_after"].numpy()
    assert not np.allclose(fresh, expected)
    for ours, theirs in zip(model.weights, restored.weights):
        np.testing.assert_array_equal(ours.numpy(), theirs.numpy(), err_msg=ours.path)
    np.testing.assert_array_equal(restored.teacher_forced(batch)["mel_after"].numpy(), expected)
    tokens, lengths = batch["tokens"], batch["token_lengths"]
    np.testing.assert_array_equal(model.infer(tokens, lengths, 5)["mels"], restored.infer(tokens, lengths, 5)["mels"])


def test_without_decoder_feedback_synthesis_runs_what_training_ran():
    # Without the previous frame as input, the free-running loop computes exactly the teacher-forced
    # pass (no exposure bias); with it, synthesis reads its own frames and drifts from that pass.
    batch = synthetic_batch(lengths=(7, 9))
    steps = int(decoder_lengths(batch).max())
    for feedback in (False, True):
        model = build_tts(dataclasses.replace(TINY, decoder_feedback=feedback))
        for variable in model.weights:  # weights far enough from initialization to move the outputs
            variable.assign(variable + tf.random.normal(variable.shape, stddev=0.3, seed=1))
        set_stop_bias(model, [-9.0, -9.0, -9.0])  # never stops: both run all steps
        forced = model.teacher_forced(batch)["mel_before"].numpy()
        free = model.infer(batch["tokens"], batch["token_lengths"], steps)["mels_before"].numpy()
        t = forced.shape[1]
        if feedback:
            assert not np.allclose(forced[:, 3:], free[:, 3:t], atol=1e-3)
        else:
            np.testing.assert_allclose(forced, free[:, :t], atol=1e-4)


def test_monotonic_alignment_finds_the_cheapest_path_and_respects_lengths():
    # Utterance 0: 3 characters over 6 steps, each step cheap on one character (2, 3 and 1 steps);
    # utterance 1: padded (4 of 6 steps, 2 of 3 characters) and a character that the path must skip.
    truth = [[0, 0, 1, 1, 1, 2], [0, 0, 2, 2]]
    cost = np.ones([2, 6, 3])
    for i, path in enumerate(truth):
        cost[i, np.arange(len(path)), path] = 0.0
    cost[1, :, 1] = 5.0  # never worth a step of its own
    path = monotonic_alignment(cost, np.array([6, 4]), np.array([3, 3]))
    assert path.dtype == np.int32 and path.shape == (2, 6)
    assert path[0].tolist() == truth[0]
    assert path[1, :4].tolist() == truth[1] and path[1, 4:].tolist() == [2, 2]  # past the steps: the last character
    # ends at the last real character even where the cheapest steps lie elsewhere
    short = monotonic_alignment(np.zeros([1, 5, 4]), np.array([5]), np.array([2]))
    assert short[0, 0] == 0 and short[0, 4] == 1 and np.all(np.diff(short[0]) >= 0)
    # without skips the costly character gets its one step (the cheapest place for it), the rest as before
    spoken = monotonic_alignment(cost, np.array([6, 4]), np.array([3, 3]), skips=False)
    assert spoken[0].tolist() == truth[0]
    assert sorted(set(spoken[1, :4].tolist())) == [0, 1, 2] and np.all(np.diff(spoken[1]) >= 0)
    assert np.bincount(spoken[1, :4], minlength=3)[1] == 1
    # more characters than steps: the utterance may still skip, and still ends on its last character
    crowded = monotonic_alignment(np.zeros([1, 3, 5]), np.array([3]), np.array([5]), skips=False)
    assert crowded[0].tolist()[-1] == 4 and np.all(np.diff(crowded[0]) >= 0)


def test_the_alignment_prior_is_a_diagonal_band_that_steers_an_undecided_search():
    cost = beta_binomial_cost(np.array([8, 5]), np.array([4, 3]), 9, 5)  # [B, S, N]
    assert cost.shape == (2, 9, 5) and np.all(cost[0, 8:] == 0) and np.all(cost[0, :, 4:] == 0)
    # each real step's prior is a distribution over the utterance's characters, peaked on the diagonal
    np.testing.assert_allclose(np.exp(-cost[0, :8, :4]).sum(-1), 1.0, rtol=1e-6)
    np.testing.assert_allclose(np.exp(-cost[1, :5, :3]).sum(-1), 1.0, rtol=1e-6)
    assert cost[0, 0, :4].argmin() == 0 and cost[0, 7, :4].argmin() == 3
    # A flat cost leaves every path equal; with the prior the search walks the diagonal, two steps each.
    flat = np.zeros([1, 8, 4])
    path = monotonic_alignment(flat, np.array([8]), np.array([4]), prior_weight=1.0)
    assert path[0].tolist() == [0, 0, 1, 1, 2, 2, 3, 3]
    steep = np.zeros([1, 8, 4])
    steep[0, :, 0] = -1.0  # the frames favour the first character throughout
    assert monotonic_alignment(steep, np.array([8]), np.array([4]))[0].tolist()[:6] == [0] * 6
    assert monotonic_alignment(steep, np.array([8]), np.array([4]), prior_weight=10.0)[0].tolist()[:4] != [0] * 4


def test_the_prior_fades_with_the_training_steps_and_is_saved_with_the_weights():
    config = dataclasses.replace(TINY, alignment="durations", durations_decoder="conv", alignment_prior_steps=4)
    model = build_tts(config)
    assert "alignment_prior_batches" in [w.name for w in model.non_trainable_weights]
    for i in range(3):
        TtsTask._loss(model, synthetic_batch(config, seed=i), training=True)
    TtsTask._loss(model, synthetic_batch(config), training=False)  # evaluation does not count
    batch = synthetic_batch(config)
    memory = model.encode(batch["tokens"], batch["token_lengths"])
    model.decode(memory, batch["token_lengths"], batch["mels"], training=True)  # nor the profiler's passes
    assert float(model.trained_batches.numpy()) == 3.0
    assert "alignment_prior_batches" not in [
        w.name for w in build_tts(dataclasses.replace(config, alignment_prior_steps=0)).weights
    ]


def test_the_duration_predictor_refit_moves_only_its_weights_toward_the_searched_durations():
    from models.tts.refit import refit_durations

    config = dataclasses.replace(TINY, alignment="durations", durations_decoder="conv")
    tf.keras.utils.set_random_seed(5)
    model = build_tts(config)
    batches = [synthetic_batch(config, lengths=(5 + i, 9, 7), seed=i) for i in range(3)]
    before = {v.path: v.numpy().copy() for v in model.weights}
    figures = refit_durations(model, batches, epochs=20, learning_rate=1e-2)
    assert figures["duration_refit_batches"] == 3
    assert figures["duration_refit_last_epoch_loss"] < 0.5 * figures["duration_refit_first_epoch_loss"]
    fitted = {v.path for v in model.duration_variables()}
    assert fitted and all(p.startswith("duration_") or "/duration_" in p for p in fitted)
    for v in model.weights:
        assert np.array_equal(v.numpy(), before[v.path]) != (v.path in fitted), v.path


def test_synthesis_with_the_searched_durations_speaks_the_teacher_forced_frames():
    """The diagnostic's check (models/tts/diagnosis.py): the alignment search's durations through
    `infer_with_durations` run the computation teacher forcing ran, so the frames are the same."""
    config = dataclasses.replace(TINY, alignment="durations", durations_decoder="conv", reduction_factor=2)
    tf.keras.utils.set_random_seed(3)
    model = build_tts(config)
    batch = synthetic_batch(config, lengths=(5, 9, 7))
    forced = model.teacher_forced(batch)
    given = model.infer_with_durations(batch["tokens"], batch["token_lengths"], forced["durations"])
    lengths = batch["mel_lengths"].numpy()
    assert np.all(given["lengths"].numpy() == -(-lengths // 2) * 2)  # whole decoder steps
    np.testing.assert_array_equal(given["durations"].numpy(), forced["durations"].numpy())
    for i, t in enumerate(lengths):
        np.testing.assert_allclose(given["mels_before"][i, :t], forced["mel_before"][i, :t], atol=1e-5)
        # the post-net (two convolutions of 5 frames) also hears a partial last step's extra frame
        np.testing.assert_allclose(given["mels"][i, : t - 4], forced["mel_after"][i, : t - 4], atol=1e-4)
    predicted = model.infer(batch["tokens"], batch["token_lengths"], 100)
    again = model.infer_with_durations(batch["tokens"], batch["token_lengths"], predicted["durations"])
    np.testing.assert_allclose(again["mels"], predicted["mels"], atol=1e-5)


@pytest.mark.slow  # hundreds of training steps of each decoder: 30 s, an end-to-end learning check
@pytest.mark.parametrize("decoder", ["lstm", "conv"])
def test_durations_model_learns_where_characters_are_spoken(decoder):
    # alignment="durations": the search, the duration predictor and a decoder fed no frames; synthesis
    # holds each character for its predicted steps, so its length and frames follow the text.
    config = dataclasses.replace(TINY, alignment="durations", durations_decoder=decoder, decoder_conv_filters=64)
    tf.keras.utils.set_random_seed(0)
    model, rng = build_tts(config), np.random.default_rng(0)
    created = len(model.weights)
    step = make_train_step(model)
    for i in range(200):
        step(synthetic_batch(config, lengths=tuple(rng.integers(6, 15, size=8)), seed=i + 1))
    assert len(model.weights) == created, "build_tts created every variable"
    held_out = synthetic_batch(config, lengths=(7, 9, 11, 13), seed=0)
    forced = model.teacher_forced(held_out)
    assert np.all(forced["alignments"].numpy().sum(-1) <= 1.0)  # one character per decoder step
    free = model.compiled_infer()(
        held_out["tokens"], held_out["token_lengths"], tf.constant(100), tf.constant(0.5), tf.zeros([4], tf.int32)
    )
    true_lengths = held_out["mel_lengths"].numpy()
    np.testing.assert_allclose(free["lengths"].numpy(), true_lengths, rtol=0.15)
    t = int(min(free["mels"].shape[1], held_out["mels"].shape[1]))
    untrained = np.abs(held_out["mels"].numpy()).mean()  # the L1 of predicting zeros
    assert np.abs(free["mels"].numpy()[:, :t] - held_out["mels"].numpy()[:, :t]).mean() < 0.5 * untrained


def test_overfits_a_handful_of_utterances():
    tf.keras.utils.set_random_seed(0)
    model, batch = build_tts(TINY), synthetic_batch()
    step = make_train_step(model)
    totals = [float(step(batch)[0]["total"]) for _ in range(120)]
    assert np.mean(totals[-5:]) < 0.5 * np.mean(totals[:3]), totals[::10]


def train_on_fresh_sentences(config, steps=250):
    """Trains on new random sentences every step (4 fixed ones can be memorized with a chunky,
    every-third-character alignment); returns the model and its alignments on held-out text."""
    tf.keras.utils.set_random_seed(0)
    model, rng = build_tts(config), np.random.default_rng(0)
    step = make_train_step(model)
    for i in range(steps):
        step(synthetic_batch(config, lengths=tuple(rng.integers(6, 15, size=8)), seed=i + 1))
    held_out = synthetic_batch(config, lengths=(7, 9, 11, 13), seed=0)
    align = model.teacher_forced(held_out)["alignments"].numpy()
    args = (align, held_out["token_lengths"].numpy(), decoder_lengths(held_out, config))
    return model, held_out, attention_monotonicity(*args), attention_diagonality(*args)


@pytest.mark.slow
def test_guided_attention_makes_attention_monotonic():
    # Measured: with guided attention 1.0 / 0.99 after 200 steps on a CPU with AVX-512, 0.83 / 0.87
    # after 250 (and 0.83 / 0.88 after 500) on one with AVX2 only, whose kernels round differently;
    # without it, 0.65 / 0.2 after 400.
    model, held_out, mono, diag = train_on_fresh_sentences(TINY)
    assert mono > 0.8 and diag > 0.8, (mono, diag)
    _, _, mono_off, diag_off = train_on_fresh_sentences(dataclasses.replace(TINY, guided_attention=False))
    assert diag_off < 0.6 < diag, "the guided-attention loss, not luck, makes the alignment diagonal"
    # The stop token generalizes too: free-running synthesis of unseen text ends near its length.
    lengths = model.infer(held_out["tokens"], held_out["token_lengths"], 30)["lengths"].numpy()
    reference = held_out["mel_lengths"].numpy()
    assert np.all(np.abs(lengths - reference) <= np.maximum(6, 0.2 * reference)), (lengths, reference)


# ---- voices ----

VOICED = dataclasses.replace(TINY, speakers=("low", "high"), speaker_dim=8)
VOICE_ENVELOPES = np.random.default_rng(99).normal(scale=1.5, size=[2, 80]).astype(np.float32)


def voiced_batch(voices, lengths=(6, 8, 10, 12), seed=0):
    """`synthetic_batch` spoken in `voices` [B] (rows of VOICED.speakers): each voice adds its own
    spectral envelope to every real frame, as a voice's timbre shifts its log-mel."""
    batch = synthetic_batch(VOICED, lengths, seed)
    mask = tf.sequence_mask(batch["mel_lengths"], batch["mels"].shape[1], tf.float32)[..., None]
    batch["mels"] += tf.constant(VOICE_ENVELOPES[list(voices)])[:, None, :] * mask
    batch["speaker_ids"] = tf.constant(voices, tf.int32)
    return batch


def masked_l1(a, b, lengths):
    mask = tf.sequence_mask(lengths, a.shape[1], tf.float32)[..., None]
    return float(tf.reduce_sum(tf.abs(a - b) * mask) / (tf.reduce_sum(mask) * a.shape[-1]))


@pytest.fixture(scope="module")
def two_voice_model():
    """A tiny model trained on sentences in two voices (new sentences, random voices every step)."""
    tf.keras.utils.set_random_seed(0)
    model, rng = build_tts(VOICED), np.random.default_rng(0)
    step = make_train_step(model)
    for i in range(150):
        step(voiced_batch(rng.integers(0, 2, size=8), tuple(rng.integers(6, 13, size=8)), seed=i + 1))
    return model


def test_config_and_task_take_the_voices_from_the_training_split():
    shards = shard_set({"train": {"speakers": ["s1", "s2"]}}, vocabulary="abc", feature_dim=80)
    config = resolve_tts(TtsConfig(), shards)
    assert config.speakers == ("s1", "s2") and config.multi_speaker
    assert resolve_tts(TtsConfig(speaker_dim=0), shards).speakers == ()  # one voice, on request
    other = shard_set({}, vocabulary="abc", feature_dim=80)
    assert resolve_tts(config, other).speakers == ("s1", "s2")  # a trained model keeps its own
    with pytest.raises(ValueError, match="twice"):
        TtsConfig(speakers=("a", "a"))
    np.testing.assert_array_equal(speaker_ids(config, ["s2", None, "", "s1"]), [1, 0, 0, 0])
    with pytest.raises(
        ValueError, match="voice 'bob' is not one this model was trained on; it has these voices: s1, s2"
    ):
        speaker_ids(config, ["bob"])


def cmvn(mean):
    """Kaldi CMVN statistics [2, D + 1] of 10 frames with this mean (and variance 1)."""
    mean = np.asarray(mean, float)
    return [[*(10 * mean), 10.0], [*(10 * (mean**2 + 1)), 0.0]]


def test_unseen_voices_are_spoken_in_the_nearest_training_voice():
    shards = shard_set(
        {
            "train": {"speakers": ["a", "b"], "cmvn": {"a": cmvn([0, 0]), "b": cmvn([10, 10])}},
            "test": {"speakers": ["a", "x", "y"], "cmvn": {"a": cmvn([0, 0]), "x": cmvn([9, 8]), "y": cmvn([1, -1])}},
        },
        feature_dim=2,
    )
    config = TtsConfig(speakers=("a", "b"))
    assert TtsTask(config).voices(shards, "test") == {"a": 0, "x": 1, "y": 0}
    assert TtsTask(config, voice="b").voices(shards, "test") == {"a": 1, "x": 1, "y": 1}
    with pytest.raises(ValueError, match="voice 'c'"):
        TtsTask(config, voice="c")


def test_speaker_embedding_learns_distinct_voices(two_voice_model):
    model, sentences = two_voice_model, (7, 9, 11, 13)
    for voice in (0, 1):
        batch = voiced_batch([voice] * 4, sentences)
        own = model.teacher_forced(batch)["mel_after"]
        other = model.teacher_forced({**batch, "speaker_ids": tf.constant([1 - voice] * 4)})["mel_after"]
        # Measured: 0.5 with its own voice, 2.2 with the other (the envelopes differ by 1.7 on average).
        l1_own, l1_other = (
            masked_l1(own, batch["mels"], batch["mel_lengths"]),
            masked_l1(other, batch["mels"], batch["mel_lengths"]),
        )
        assert l1_own < 0.5 * l1_other, (voice, l1_own, l1_other)
    # Free-running, the same sentences come out in each voice: their mean spectra differ as the
    # voices' envelopes do.
    tokens, lengths = batch["tokens"], batch["token_lengths"]
    spoken = [
        model.infer(tokens, lengths, 8, stop_threshold=1.0, speaker_ids=tf.constant([v] * 4))["mels"] for v in (0, 1)
    ]
    shift = (tf.reduce_mean(spoken[1], [0, 1]) - tf.reduce_mean(spoken[0], [0, 1])).numpy()  # [80]
    expected = VOICE_ENVELOPES[1] - VOICE_ENVELOPES[0]
    assert np.corrcoef(shift, expected)[0, 1] > 0.9


def test_compiled_decoder_matches_eager():
    """The decoder loop run eagerly (Python drives tf.while_loop step by step), as one graph
    (tf.function) and XLA-compiled gives the same outputs and gradients on the same inputs."""
    tf.keras.utils.set_random_seed(0)
    eager_model, xla_model = build_tts(VOICED), build_tts(dataclasses.replace(VOICED, xla=True))
    for ours, theirs in zip(eager_model.weights, xla_model.weights):
        theirs.assign(ours + tf.random.normal(ours.shape, stddev=0.05))  # the same, non-initial weights
        ours.assign(theirs)
    batch = voiced_batch([0, 1, 1, 0])
    assert tf.executing_eagerly()
    outputs = {
        "eager": eager_model.teacher_forced(batch),
        "graph": tf.function(eager_model.teacher_forced)(batch),
        "xla": xla_model.teacher_forced(batch),
    }
    for mode in ("graph", "xla"):
        for key in ("mel_after", "stop_logits", "alignments"):
            np.testing.assert_allclose(outputs[mode][key], outputs["eager"][key], atol=2e-5, err_msg=f"{mode} {key}")

    def gradients(model):
        with tf.GradientTape() as tape:
            losses = model.compute_losses(batch, model.teacher_forced(batch))
        return [tf.convert_to_tensor(g) for g in tape.gradient(losses["total"], model.trainable_variables)]

    for ours, theirs in zip(tf.function(lambda: gradients(eager_model))(), tf.function(lambda: gradients(xla_model))()):
        np.testing.assert_allclose(theirs, ours, atol=1e-4, rtol=1e-3)
    args = (batch["tokens"], batch["token_lengths"], tf.constant(6), tf.constant(0.5), batch["speaker_ids"])
    eager = eager_model.infer(*args)
    for compiled in (eager_model.compiled_infer()(*args), xla_model.compiled_infer()(*args)):
        np.testing.assert_array_equal(compiled["lengths"], eager["lengths"])
        np.testing.assert_allclose(compiled["mels"], eager["mels"], atol=2e-5)
        np.testing.assert_allclose(compiled["alignments"], eager["alignments"], atol=2e-5)


def test_speak_returns_the_voice_asked_for(two_voice_model):
    """What serving runs for a request's `text` and `voice` columns."""
    model = two_voice_model
    data = {"vocabulary": ["<blank>", "<unk>", *"abcdefghijklmn"], "mel_mean": [5.0] * 80, "mel_std": [2.0] * 80}
    texts = ["abcdef", "abcdef", "cafe"]
    out = speak(model, data, texts, ["high", "low", None], max_steps=8)
    assert out["voices"] == ["high", "low", "low"] and out["mels"].shape[0] == 3
    tokens, lengths = [tf.constant(x) for x in (np.array([[2, 3, 4, 5, 6, 7]] * 2), np.array([6, 6], np.int32))]
    for i, voice in enumerate((1, 0)):
        alone = model.infer(tokens[:1], lengths[:1], 8, speaker_ids=tf.constant([voice]))
        n = int(alone["lengths"][0])
        assert out["lengths"][i] == n
        np.testing.assert_allclose(out["mels"][i, :n], alone["mels"][0, :n] * 2.0 + 5.0, atol=1e-4)
    assert np.abs(out["mels"][0] - out["mels"][1]).mean() > 0.5, "the two voices sound different"
    with pytest.raises(ValueError, match="voice 'alice'"):
        speak(model, data, ["abc"], ["alice"])


def test_attention_metrics_tell_diagonal_from_stuck_and_backwards():
    eye = np.eye(10)[None]  # [1, 10 steps, 10 characters]
    lengths, steps = [10], [10]
    assert attention_monotonicity(eye, lengths, steps) == 1.0
    assert attention_diagonality(eye, lengths, steps) == 1.0
    assert attention_monotonicity(eye[:, ::-1], lengths, steps) == 0.0
    stuck = np.zeros([1, 10, 10])
    stuck[..., 0] = 1.0
    assert attention_diagonality(stuck, lengths, steps) < 0.3
    jumpy = np.eye(10)[None, :, [0, 4, 8, 1, 5, 9, 2, 6, 3, 7]]
    assert attention_monotonicity(jumpy, lengths, steps) < 0.5


# ---- audio ----


def speech_like(seconds=1.5, seed=0):
    """A pulse train at a gliding 80-160 Hz through three vowel-like formant sets, plus a fricative burst."""
    rng = np.random.default_rng(seed)
    n = int(seconds * 16000)
    t = np.arange(n) / 16000
    cycles = np.cumsum(120 + 40 * np.sin(2 * np.pi * 1.5 * t)) / 16000
    source = np.diff(np.floor(cycles), prepend=0.0)
    wave = np.zeros(n)
    for k, formants in enumerate([(700, 1200, 2600), (300, 2300, 3000), (500, 900, 2400)]):
        part = slice(k * n // 3, (k + 1) * n // 3)
        for f in formants:
            r = np.exp(-np.pi * 80 / 16000)
            wave[part] += scipy.signal.lfilter(
                [1 - r], [1, -2 * r * np.cos(2 * np.pi * f / 16000), r * r], source[part]
            )
    burst = slice(int(0.6 * n), int(0.7 * n))
    wave[burst] += 0.05 * scipy.signal.lfilter([1, -0.9], [1], rng.normal(size=burst.stop - burst.start))
    wave += 1e-4 * rng.normal(size=n)
    return (0.5 * wave / np.abs(wave).max()).astype(np.float32)


def fbank(wave) -> np.ndarray:
    """Log-mel fbank [frames, 80] of a 16-kHz waveform, as the feature stage computes it."""
    return features.compute_fbank(np.asarray(wave, np.float32), features.FeatureConfig())


def test_kaldi_mel_matrix_shape_and_range():
    mel = audio.kaldi_mel_matrix()
    assert mel.shape == (257, 80) and mel.min() >= 0 and mel.max() <= 1
    hz = np.arange(257) * 16000 / 512
    assert not mel[hz < 20].any() and not mel[-1].any(), "nothing below 20 Hz, Nyquist bin unused like Kaldi"
    assert np.all(mel.sum(0) > 0), "every filter covers at least one FFT bin"
    with pytest.raises(ValueError, match="mel range"):
        audio.kaldi_mel_matrix(high_freq=9000)


def test_griffin_lim_reanalysis_is_close_to_the_original():
    reference = fbank(speech_like())
    wave = audio.griffin_lim(reference, n_iter=48)
    assert wave.dtype == np.float32 and wave.shape == ((len(reference) - 1) * 160 + 400,)
    rebuilt = fbank(wave)
    random_phase = fbank(audio.griffin_lim(reference, n_iter=0))
    # Measured on this signal: 48 iterations 0.31 dB cepstral distance / 0.13 log-mel L1; random phase 1.17 dB / 1.3.
    assert audio.fbank_cepstral_distance(reference, rebuilt) < 0.4
    assert audio.mel_l1(reference, rebuilt) < 0.2
    assert audio.fbank_cepstral_distance(reference, random_phase) > 0.8


def test_griffin_lim_of_a_batch_is_each_sentence_alone_and_the_vocoded_features_come_back():
    long, short = fbank(speech_like()), fbank(speech_like(0.6, seed=1))
    together = audio.griffin_lim_batch([long, short], n_iter=8)
    for mel, wave in zip((long, short), together):
        np.testing.assert_allclose(wave, audio.griffin_lim(mel, n_iter=8), rtol=1e-4, atol=1e-3 * np.abs(wave).max())
    heard = audio.vocoded([long, short], n_iter=8)
    assert [h.shape for h in heard] == [long.shape, short.shape]
    assert audio.fbank_cepstral_distance(long, heard[0]) < 1.0  # the level differs (a 16-bit WAV), not the shape


def test_cepstral_distance_is_zero_for_identical_inputs_and_grows_with_noise():
    reference = fbank(speech_like())
    rng = np.random.default_rng(0)
    assert audio.fbank_cepstral_distance(reference, reference) == 0.0
    noisy = [
        audio.fbank_cepstral_distance(reference, reference + s * rng.normal(size=reference.shape))
        for s in (0.05, 0.2, 0.8)
    ]
    assert 0 < noisy[0] < noisy[1] < noisy[2]
    # DTW absorbs a time stretch: every frame repeated twice costs nothing.
    assert audio.fbank_cepstral_distance(reference, np.repeat(reference, 2, axis=0)) == 0.0


def test_dtw_path_matches_the_sequential_recursion():
    cost = np.random.default_rng(0).random([7, 11])
    acc = np.full([8, 12], np.inf)
    acc[0, 0] = 0
    for i in range(1, 8):
        for j in range(1, 12):
            acc[i, j] = cost[i - 1, j - 1] + min(acc[i - 1, j], acc[i, j - 1], acc[i - 1, j - 1])
    ia, ib = audio.dtw_path(cost)
    assert (ia[0], ib[0], ia[-1], ib[-1]) == (0, 0, 6, 10)
    assert np.all(np.diff(ia) >= 0) and np.all(np.diff(ib) >= 0) and np.all(np.diff(ia) + np.diff(ib) >= 1)
    np.testing.assert_allclose(cost[ia, ib].sum(), acc[-1, -1])


def test_mel_l1_ignores_padding():
    a, b = np.zeros([2, 5, 80]), np.zeros([2, 5, 80])
    b[0, :2], b[1, :4], b[:, 4] = 1.0, 1.0, 100.0  # frame 4 is padding in both
    assert audio.mel_l1(a, b, lengths=[2, 4]) == pytest.approx(1.0)
    assert audio.mel_l1(a[0], b[0]) == pytest.approx((2 + 100) / 5)


def test_write_wav_and_plots(tmp_path):
    wave = np.sin(np.linspace(0, 200, 1600)) * 3.0
    audio.write_wav(tmp_path / "a.wav", wave)
    rate, pcm = scipy.io.wavfile.read(tmp_path / "a.wav")
    assert rate == 16000 and pcm.dtype == np.int16 and len(pcm) == 1600
    assert abs(np.abs(pcm).max() / 32767 - 0.9) < 1e-3
    assert (tmp_path / "a.wav").read_bytes() == audio.wav_bytes(wave)  # what the server sends, base64-encoded
    mels = fbank(speech_like(0.5))
    audio.plot_alignment(np.eye(20, 12), tmp_path / "align.png", "step 1")
    audio.plot_mels(mels, mels + 1, tmp_path / "mels.png", "utt1")
    for name in ("align.png", "mels.png"):
        data = (tmp_path / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
