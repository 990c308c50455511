"""Checkpoints restore every variable by its name, whatever order the variables come in."""

from __future__ import annotations

import keras
import numpy as np
import pytest

from models.training import checkpoint


def variables(*names: str, fill: float = 0.0) -> list:
    return [keras.Variable(np.full([2, 3], fill + i, np.float32), name=n) for i, n in enumerate(names)]


def test_same_shaped_variables_in_another_order_are_restored_by_name(tmp_path):
    saved = variables("encoder_kernel", "decoder_kernel", fill=1.0)  # 1.0 and 2.0
    path = checkpoint.save(tmp_path, 7, saved, [], {"epoch": 1})
    # The same two layers built in the other order: by position they would be swapped silently.
    restored = variables("decoder_kernel", "encoder_kernel")
    meta = checkpoint.restore(path, restored)
    assert meta["step"] == 7 and meta["position"] == {"epoch": 1}
    values = {v.path: float(v.numpy()[0, 0]) for v in restored}
    assert values == {"encoder_kernel": 1.0, "decoder_kernel": 2.0}


def test_a_missing_or_reshaped_variable_is_named_and_nothing_is_assigned(tmp_path):
    path = checkpoint.save(tmp_path, 1, variables("encoder_kernel", "decoder_kernel", fill=5.0), [], {})
    other = variables("encoder_kernel", "postnet_kernel")
    with pytest.raises(ValueError, match="postnet_kernel"):
        checkpoint.restore(path, other)
    assert float(other[0].numpy()[0, 0]) == 0.0, "a failed restore leaves every variable as it was"
    reshaped = [keras.Variable(np.zeros([3, 2], np.float32), name="encoder_kernel"), *variables("decoder_kernel")]
    with pytest.raises(ValueError, match=r"encoder_kernel has shape \(2, 3\)"):
        checkpoint.restore(path, reshaped)


def test_a_second_model_in_one_process_restores_the_first_ones_checkpoint(tmp_path):
    """Keras numbers models and unnamed layers per process (`acoustic_model_1`): the names that
    checkpoints use leave the owners' names out, so a rebuilt model finds its variables."""
    import keras

    from models.asr import network as asr
    from models.tts import network as tts

    for build, config in (
        (asr.build_asr, asr.AsrConfig(feature_dim=5, vocab_size=7, num_layers=1, units=4, projection=0)),
        (
            tts.build_tts,
            tts.TtsConfig(
                vocab_size=7,
                n_mels=5,
                embedding_dim=4,
                encoder_conv_layers=1,
                encoder_conv_filters=4,
                encoder_lstm_units=4,
                attention_dim=4,
                prenet_units=(4,),
                decoder_lstm_units=4,
                postnet_layers=1,
                postnet_filters=4,
            ),
        ),
    ):
        first = build(config)
        optimizer = keras.optimizers.Adam()
        optimizer.build(first.trainable_variables)
        owners = (first.name, optimizer.name)
        path = checkpoint.save(tmp_path / first.name, 3, first.weights, optimizer.variables, {}, owners=owners)
        second = build(config)
        second_optimizer = keras.optimizers.Adam()
        second_optimizer.build(second.trainable_variables)
        assert second_optimizer.name != optimizer.name  # `adam_1`: numbered per process
        assert any(not np.array_equal(a.numpy(), b.numpy()) for a, b in zip(first.weights, second.weights))
        checkpoint.restore(path, second.weights, second_optimizer.variables, (second.name, second_optimizer.name))
        for a, b in zip(first.weights, second.weights):
            np.testing.assert_array_equal(a.numpy(), b.numpy())
