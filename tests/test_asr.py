"""The acoustic model: exact shapes, masking, decoding, and that it can learn."""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

from models.asr import network as asr
from pipeline import text

CFG = asr.AsrConfig(feature_dim=13, vocab_size=7, num_layers=2, units=8, projection=6, stack_frames=3, subsample=3)


def test_output_shapes_follow_stacking_and_subsampling():
    model = asr.build_asr(CFG)
    logits, lengths = model(tf.random.normal([4, 31, 13]), tf.constant([31, 30, 10, 1]))
    assert logits.shape == (4, 11, 7) and logits.dtype == tf.float32
    assert lengths.numpy().tolist() == [11, 10, 4, 1]
    no_projection = asr.build_asr(
        asr.AsrConfig(feature_dim=40, vocab_size=30, num_layers=1, units=4, projection=0, subsample=1, stack_frames=1)
    )
    assert no_projection(tf.zeros([2, 5, 40]), tf.constant([5, 2]))[0].shape == (2, 5, 30)


def test_padding_does_not_change_valid_outputs():
    model = asr.build_asr(CFG)
    x = tf.random.normal([1, 12, 13])
    short, _ = model(x, tf.constant([12]))
    padded, _ = model(tf.concat([x, 100 * tf.ones([1, 9, 13])], axis=1), tf.constant([12]))
    # Both directions see only the real frames: the backward LSTM reads each sequence reversed
    # within its own length, so garbage after the end cannot leak into frames before it.
    np.testing.assert_allclose(padded[:, :4].numpy(), short.numpy(), atol=1e-5)


CONV = asr.AsrConfig(
    feature_dim=13, vocab_size=7, num_layers=1, units=8, projection=6, frontend="conv", subsample=4, conv_channels=5
)


def test_conv_frontend_subsamples_by_its_strides_and_ignores_padding():
    model = asr.build_asr(CONV)
    logits, lengths = model(tf.random.normal([4, 31, 13]), tf.constant([31, 30, 10, 1]))
    assert logits.shape == (4, 8, 7) and lengths.numpy().tolist() == [8, 8, 3, 1]
    assert [c.strides[0] for c in model.convs] == [2, 2]
    x = tf.random.normal([1, 13, 13])  # 13 frames: the last LSTM step's convolutions reach past the end
    short, _ = model(x, tf.constant([13]))
    padded, _ = model(tf.concat([x, 100 * tf.ones([1, 11, 13])], axis=1), tf.constant([13]))
    np.testing.assert_allclose(padded[:, :4].numpy(), short.numpy(), atol=1e-5)
    with pytest.raises(ValueError, match="asr.subsample must be even"):
        asr.build_asr(asr.AsrConfig(feature_dim=13, vocab_size=7, frontend="conv", subsample=3))


def test_cepstra_keep_the_envelope_and_drop_the_fine_structure():
    cfg = asr.AsrConfig(feature_dim=40, vocab_size=7, num_layers=1, units=8, projection=0, cepstra=12)
    model = asr.build_asr(cfg)
    assert model.lstms[0].forward.cell.kernel.shape[0] == 12 * cfg.stack_frames  # [cepstra * stack, 4 * units]
    x = tf.random.normal([2, 9, 40])
    lengths = tf.constant([9, 5])
    ripple = np.cos(np.pi * 30 * (np.arange(40) + 0.5) / 40).astype(np.float32)  # the 31st DCT-II basis
    base, _ = model(x, lengths)
    rippled, _ = model(x + 3.0 * ripple, lengths)  # harmonics: fine structure across the bins
    np.testing.assert_allclose(rippled.numpy(), base.numpy(), atol=1e-4)
    tilted, _ = model(x + 3.0 * np.linspace(-1, 1, 40, dtype=np.float32), lengths)  # an envelope change
    assert np.abs(tilted.numpy() - base.numpy()).max() > 1e-2
    with pytest.raises(ValueError, match="asr.cepstra"):
        asr.build_asr(asr.AsrConfig(feature_dim=40, vocab_size=7, cepstra=41))


def test_frame_ce_model_outputs_pdf_ids():
    cfg = asr.AsrConfig(
        feature_dim=13, vocab_size=7, num_targets=11, loss="frame_ce", num_layers=1, units=4, subsample=2
    )
    model = asr.build_asr(cfg)
    logits, lengths = model(tf.zeros([2, 10, 13]), tf.constant([10, 7]))
    assert logits.shape == (2, 5, 11)
    targets = tf.constant([[1] * 10, [2] * 7 + [-1] * 3])
    loss = asr.frame_ce_loss(logits, lengths, targets, subsample=2)
    np.testing.assert_allclose(float(loss), np.log(11), rtol=0.05)  # uniform-ish outputs at init


def test_greedy_decoding_merges_repeats_and_drops_blanks():
    eye = np.eye(5)
    path = [0, 2, 2, 0, 2, 3, 3, 0, 0]  # blank a a blank a b b blank blank
    logits = eye[path][None] * 10
    assert asr.greedy_decode(logits, np.asarray([9])) == [[2, 2, 3]]
    assert asr.greedy_decode(logits, np.asarray([3])) == [[2]]


def test_beam_search_agrees_with_greedy_on_a_peaked_path():
    eye = np.eye(5, dtype=np.float32)
    path = [0, 4, 4, 0, 1, 1, 2]
    logits = tf.constant(eye[path][None] * 20)
    assert (
        asr.beam_decode(logits, tf.constant([7]), beam_width=4) == asr.greedy_decode(logits.numpy(), [7]) == [[4, 1, 2]]
    )


def test_greedy_and_beam_transcriptions_share_one_forward_pass(monkeypatch):
    model = asr.build_asr(CFG)
    feats, lengths = tf.random.normal([3, 40, 13], seed=1), tf.constant([40, 25, 9])
    vocabulary = ["<blk>", "a", "b", "c", " ", "d", "e"]
    alone = [asr.transcribe(model, feats, lengths, vocabulary, width) for width in (0, 4)]
    passes = []
    forward = asr.compiled(model, 13)
    monkeypatch.setattr(asr, "compiled", lambda m, dim=None: lambda *a: passes.append(1) or forward(*a))
    assert asr.transcriptions(model, feats, lengths, vocabulary, (0, 4)) == alone
    assert len(passes) == 1


def test_ctc_loss_skips_infeasible_utterances():
    tokens = tf.constant([[1, 2, 0, 0], [1, 1, 1, 1], [2, 2, 0, 0]])  # need 2, 7 and 3 frames
    loss, infeasible = asr.ctc_loss(tf.zeros([3, 3, 5]), tf.constant([3, 3, 3]), tokens, tf.constant([2, 4, 2]))
    assert int(infeasible) == 1
    alone, _ = asr.ctc_loss(tf.zeros([2, 3, 5]), tf.constant([3, 3]), tokens[::2], tf.constant([2, 2]))
    np.testing.assert_allclose(float(loss), float(alone), rtol=1e-6)


def test_ids_to_text_skips_blank_and_unknown():
    vocabulary = ["<blank>", "<unk>", " ", "a", "b"]
    assert text.decode([3, 1, 2, 4, 0], vocabulary) == "a b"


def test_overfits_a_handful_of_utterances():
    keras.utils.set_random_seed(1)
    cfg = asr.AsrConfig(feature_dim=13, vocab_size=6, num_layers=1, units=32, projection=0, stack_frames=2, subsample=2)
    model = asr.build_asr(cfg)
    rng = np.random.default_rng(0)
    feats = tf.constant(rng.normal(size=(4, 40, 13)).astype("float32"))
    lengths = tf.constant([40, 36, 30, 40])
    tokens = tf.constant([[2, 3, 4, 5], [5, 4, 3, 0], [2, 2, 0, 0], [3, 5, 2, 4]])
    token_lengths = tf.constant([4, 3, 2, 4])
    optimizer = keras.optimizers.Adam(0.01)

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            logits, out_lengths = model(feats, lengths, training=True)
            loss, _ = asr.ctc_loss(logits, out_lengths, tokens, token_lengths)
        optimizer.apply(tape.gradient(loss, model.trainable_variables), model.trainable_variables)
        return loss

    first = float(step())
    for _ in range(150):
        last = float(step())
    assert last < first / 2, (first, last)
    logits, out_lengths = model(feats, lengths)
    hyps = asr.greedy_decode(logits.numpy(), out_lengths.numpy())
    assert hyps[0] == [2, 3, 4, 5]


@pytest.mark.parametrize("loss", ["ctc", "frame_ce"])
def test_flops_per_frame_counts_every_layer(loss):
    cfg = asr.AsrConfig(
        feature_dim=80,
        vocab_size=30,
        num_targets=100,
        loss=loss,
        num_layers=1,
        units=10,
        projection=0,
        stack_frames=1,
        subsample=1,
    )
    lstm = 2 * 2 * 4 * 10 * (80 + 10)
    out = 2 * 20 * (30 if loss == "ctc" else 100)
    assert asr.flops_per_frame(cfg) == 3 * (lstm + out)


def test_flops_per_frame_counts_the_conv_frontend():
    cfg = asr.AsrConfig(
        feature_dim=80,
        vocab_size=30,
        num_layers=1,
        units=10,
        projection=0,
        frontend="conv",
        subsample=4,
        conv_channels=16,
    )
    convs = 2 * 3 * 80 * 16 * 2 + 2 * 3 * 16 * 16  # per LSTM step: the first conv runs twice as often
    lstm = 2 * 2 * 4 * 10 * (16 + 10)
    out = 2 * 20 * 30
    assert asr.flops_per_frame(cfg) == 3 * (convs + lstm + out) / 4
