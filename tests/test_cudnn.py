"""The demo models' LSTMs stay eligible for cuDNN's fused kernel on a GPU: Keras 3 (TensorFlow
backend) takes it only for tanh/sigmoid activations, a bias, no unrolling, no recurrent dropout,
`use_cudnn` "auto" or True, and a mask, if any, that only pads on the right (ours pass none)."""

from __future__ import annotations

import dataclasses

import keras
import pytest
from keras.src.backend.tensorflow.rnn import _do_lstm_arguments_support_cudnn

from common import config as configlib
from models.asr import network as asr
from models.training.config import TrainConfig
from models.tts import network as tts
from tests.conftest import ROOT


def lstms(model) -> list:
    return [layer for layer in model._flatten_layers(include_self=False) if isinstance(layer, keras.layers.LSTM)]


def demo_models():
    asr_config = configlib.load(TrainConfig, ROOT / "configs" / "demo_asr.yaml").settings
    tts_config = configlib.load(TrainConfig, ROOT / "configs" / "demo_tts.yaml").settings
    yield "asr", asr.build_asr(dataclasses.replace(asr_config, vocab_size=30)), 2 * asr_config.num_layers
    yield "tts", tts.build_tts(dataclasses.replace(tts_config, vocab_size=30)), 2  # the encoder's two directions
    lstm_decoder = dataclasses.replace(tts_config, vocab_size=30, durations_decoder="lstm")
    yield "tts, LSTM decoder", tts.build_tts(lstm_decoder), 4
    yield "tts, attention", tts.build_tts(dataclasses.replace(tts_config, vocab_size=30, alignment="attention")), 2


@pytest.mark.parametrize("name, model, count", list(demo_models()), ids=lambda v: v if isinstance(v, str) else "")
def test_every_lstm_of_the_demo_models_can_take_the_cudnn_kernel(name, model, count):
    found = lstms(model)
    assert len(found) == count, f"{name}: {[layer.name for layer in found]}"
    for layer in found:
        cell = layer.cell
        # cudnn_ok() of the same module adds "and a GPU is visible": on this CPU, the arguments' part
        assert _do_lstm_arguments_support_cudnn(
            cell.activation, cell.recurrent_activation, layer.unroll, cell.use_bias
        ), layer.name
        assert layer.use_cudnn in ("auto", True) and not cell.recurrent_dropout, layer.name
