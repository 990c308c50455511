"""A model directory saved by an earlier release (tests/fixtures/model_6e45857: every model's
section, the augmentation under `input:`, every strategy's options under `strategy:`) still loads,
evaluates and serves, its settings read under their new names with a warning."""

from __future__ import annotations

import base64
import shutil
import types
import warnings
from pathlib import Path

import pandas as pd
import pytest

from tests.kaldi_fixtures import make_wav_dir

SAVED = Path(__file__).parent / "fixtures" / "model_6e45857"


@pytest.fixture(scope="module")
def wav_shards(tmp_path_factory):
    """The WAVs the fixture was trained on, through the feature and shard stages."""
    from pipeline import features, shards

    root = tmp_path_factory.mktemp("legacy")
    data = make_wav_dir(root / "train", num_utts=6, rate=16000, seconds=0.6)
    features.compute_features(data, features.FeatureConfig(jobs=1), progress=False)
    cfg = shards.ShardConfig(num_shards=1, jobs=1, feature_dtype="float32")
    shards.make_shards({"train": data}, root / "shards", cfg, progress=False)
    return root


def test_the_saved_config_reads_under_the_new_names_with_warnings():
    from common import config as configlib
    from models.training.config import TrainConfig, architecture

    with pytest.warns(FutureWarning, match="'input.vtlp_range' is now 'asr.augment.vtlp_range'"):
        config = configlib.load(TrainConfig, SAVED / "config.yaml")
    augment = config.settings.augment
    assert augment.spec_augment and augment.vtlp_range == (0.9, 1.1) and augment.augment_from_step == 2
    assert config.input.cmvn == "utterance" and config.settings.units == 16
    assert config.strategy.name == "adpsgd" and config.strategy.options.gossip == "delay-by-one"
    assert "augment" not in architecture(config)["asr"]  # augmentation fixes no weight's shape
    saved_again = configlib.to_dict(config)
    assert "tts" not in saved_again and "extension" not in saved_again and "spec_augment" not in saved_again["input"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # what this release writes reads back without a warning
        assert configlib.from_dict(TrainConfig, saved_again) == config


def test_a_later_layer_wins_whichever_spelling_each_uses():
    """The YAML in this release's keys, `--set` in the earlier release's (and the other way round):
    the later layer wins, as it did when each layer was applied in turn."""
    from common import config as configlib
    from models.training.config import TrainConfig

    demo = Path(__file__).parents[1] / "configs" / "demo_asr.yaml"  # asr.augment.vtlp_range: [0.85, 1.15]
    with pytest.warns(FutureWarning, match="'input.vtlp_range' is now 'asr.augment.vtlp_range'"):
        config = configlib.load(TrainConfig, demo, ["input.vtlp_range=[1.0, 1.0]", "input.spec_augment=false"])
    assert config.settings.augment.vtlp_range == (1.0, 1.0) and not config.settings.augment.spec_augment
    with pytest.warns(FutureWarning):
        config = configlib.load(TrainConfig, SAVED / "config.yaml", ["asr.augment.vtlp_range=[0.8, 1.2]"])
    assert config.settings.augment.vtlp_range == (0.8, 1.2) and config.settings.augment.augment_from_step == 2
    # The model chosen by a later layer renames an earlier layer's keys: no section of the file's model.
    with pytest.warns(FutureWarning, match="'input.spec_augment' is now 'asr.augment.spec_augment'"):
        config = configlib.load(TrainConfig, None, ["model=tts", "input.spec_augment=true"], flags={"model": "asr"})
    assert config.model == "asr" and config.settings.augment.spec_augment


def test_the_saved_model_evaluates_and_serves_as_it_transcribes(wav_shards, tmp_path):
    from models import evaluate
    from models.serving import SpeechModel
    from pipeline import kaldi

    model_dir = shutil.copytree(SAVED, tmp_path / "work" / "model")
    cfg = evaluate.eval_config("asr", assignments=["splits=[train]", "beam_width=2"])
    metrics = evaluate.evaluate(model_dir.parent, wav_shards / "shards", cfg)
    assert metrics["model"] == "asr" and metrics["train_cer"] >= 0.0
    hypotheses = {}
    for line in (model_dir.parent / "eval" / "train_hypotheses.tsv").read_text().splitlines()[1:]:
        utt, _reference, greedy, *_ = line.split("\t")
        hypotheses[utt] = greedy

    served = SpeechModel()
    served.load_context(types.SimpleNamespace(artifacts={"model_dir": str(model_dir)}))
    wavs = kaldi.read_table(wav_shards / "train" / "wav.scp").values  # utterance -> WAV file
    audio = [base64.b64encode(Path(path).read_bytes()).decode("ascii") for path in wavs.values()]
    answers = served.predict(None, pd.DataFrame({"audio": audio}))
    assert dict(zip(wavs, answers)) == hypotheses
