"""A speaker classifier over the same shards, added in one file: which training speaker says an
utterance, from the mean of its log-mel frames (one hidden layer).

Registered by naming this module in SPEECHFLOW_EXTENSIONS (common/catalog.py): the task the trainer
runs, the evaluation `models.evaluate` runs and the server the pyfunc model answers with. TensorFlow
is imported inside the functions, as the DAG parser imports this module too. Its settings are
its own dataclasses, registered with it: `SpeakerIdConfig` is the `speaker_id:` section of a
training config (`--set speaker_id.hidden=16`), `SpeakerIdEvalConfig` its evaluation options.
tests/test_extension.py runs it.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from common import catalog

catalog.register_model(
    catalog.ModelEntry(
        "speaker_id",
        f"{__name__}:SpeakerIdTask",
        f"{__name__}:evaluate",
        f"{__name__}:SpeakerIdServer",
        "speaker_id: speaker classifier",
        "tests/configs/tiny_asr.yaml",
        f"{__name__}:SpeakerIdConfig",
        f"{__name__}:SpeakerIdEvalConfig",
    )
)


@dataclasses.dataclass(frozen=True)
class SpeakerIdConfig:
    hidden: int = 16  # units of the hidden layer
    feature_dim: int = 0  # from the shards
    speakers: tuple[str, ...] = ()  # the training split's speakers, one class each (from the shards)


@dataclasses.dataclass(frozen=True)
class SpeakerIdEvalConfig:
    frames_per_batch: int = 12000  # padded frames per evaluation batch


def pooled(mels, lengths):
    """The mean of each utterance's real frames: mels [B, T, D], lengths [B] -> [B, D]."""
    import tensorflow as tf

    mask = tf.sequence_mask(lengths, tf.shape(mels)[1], mels.dtype)[..., None]  # [B, T, 1]
    return tf.reduce_sum(mels * mask, axis=1) / tf.maximum(tf.reduce_sum(mask, axis=1), 1.0)


class SpeakerIdTask:
    name = "speaker_id"
    # A dev metric no built-in model has: the share of dev utterances (of training speakers) whose
    # speaker it names wrongly. The trainer keeps the step where it is lowest.
    selection_metric = "dev_error"
    dev_count_names: tuple[str, ...] = ("wrong", "known", "loss_sum", "batches")
    profile_every = False

    def __init__(self, config: SpeakerIdConfig):
        self.config = config

    @classmethod
    def create(cls, config, shards, eval_config=None) -> SpeakerIdTask:
        own = config.settings
        train = shards.splits.get("train")
        speakers = own.speakers or (tuple(train.speakers) if train is not None else ())
        return cls(dataclasses.replace(own, feature_dim=shards.feature_dim, speakers=speakers))

    def resolved(self, config):
        return dataclasses.replace(config, settings=self.config)

    def build(self):
        import keras

        c = self.config
        layers = [keras.layers.Dense(c.hidden, activation="tanh"), keras.layers.Dense(len(c.speakers))]
        model = keras.Sequential([keras.Input([c.feature_dim]), *layers], name="speaker_id")  # [B, D] -> [B, S]
        return model

    def dataset(self, shards, split, cfg, rank, size, epoch, training):
        batches, count = self.input_pipeline().batches(shards, split, cfg, rank, size, epoch, training)
        return self.prepare(batches, shards, split), count

    @staticmethod
    def input_pipeline():
        from pipeline import dataset

        return dataset.TTS  # the synthesis model's batches: mels and speakers

    def prepare(self, batches, shards, split):
        import tensorflow as tf

        table = tf.lookup.StaticHashTable(
            tf.lookup.KeyValueTensorInitializer(
                tf.constant(list(self.config.speakers)), tf.range(len(self.config.speakers), dtype=tf.int32)
            ),
            default_value=-1,
        )
        return batches.map(lambda b: {**b, "label": table.lookup(b["speaker"])})  # [B], -1: an unknown voice

    @staticmethod
    def frames(batch):
        import tensorflow as tf

        return tf.reduce_sum(batch["mel_lengths"])

    def loss(self, model, batch, training: bool, seed=None):
        import tensorflow as tf

        logits = model(pooled(batch["mels"], batch["mel_lengths"]), training=training)  # [B, S]
        known = tf.cast(batch["label"] >= 0, tf.float32)
        losses = tf.nn.sparse_softmax_cross_entropy_with_logits(tf.maximum(batch["label"], 0), logits)
        correct = tf.cast(tf.argmax(logits, -1, output_type=tf.int32) == batch["label"], tf.float32)
        count = tf.maximum(tf.reduce_sum(known), 1.0)
        return tf.reduce_sum(losses * known) / count, {"accuracy": tf.reduce_sum(correct * known) / count}

    def dev_counts(self, model, batch) -> dict[str, float]:
        import tensorflow as tf

        logits = model(pooled(batch["mels"], batch["mel_lengths"]), training=False)  # [B, S]
        known = batch["label"] >= 0
        wrong = tf.logical_and(known, tf.argmax(logits, -1, output_type=tf.int32) != batch["label"])
        loss, _ = self.loss(model, batch, training=False)
        return {
            "wrong": float(tf.reduce_sum(tf.cast(wrong, tf.float32))),
            "known": float(tf.reduce_sum(tf.cast(known, tf.float32))),
            "loss_sum": float(loss),
            "batches": 1.0,
        }

    def dev_metrics(self, counts: dict[str, float]) -> dict[str, float]:
        return {
            "dev_error": counts["wrong"] / max(1.0, counts["known"]),
            "dev_loss": counts["loss_sum"] / max(1.0, counts["batches"]),
        }

    def flops_per_frame(self) -> float:
        return 0.0

    def profile(self, model, batch) -> dict:
        return {}

    def finish(self, model, shards, config) -> dict:
        return {}

    def model_data(self) -> dict:
        return {"voices": list(self.config.speakers)}


def evaluate(model, config, data: dict, batches, splits, cfg, out_dir: Path, listener=None) -> dict:
    """Loss and accuracy of each split (over the utterances of training speakers)."""
    import numpy as np

    task = SpeakerIdTask(config.settings)  # as trained
    metrics = {}
    for split in splits:
        losses, accuracies = [], []
        for batch in batches(split, cfg.frames_per_batch):
            loss, aux = task.loss(model, batch, training=False)
            losses.append(float(loss))
            accuracies.append(float(aux["accuracy"]))
        metrics[f"{split}_loss"] = float(np.mean(losses))
        metrics[f"{split}_accuracy"] = float(np.mean(accuracies))
    metrics["primary_metric"] = f"{splits[0]}_loss"
    return metrics


class SpeakerIdServer:
    """Rows with `mels` (an utterance's normalized log-mel frames, [T, D]) -> the speaker of each."""

    def __init__(self, model, config, data: dict):
        self.model, self.speakers = model, list(config.settings.speakers)

    def predict(self, model_input, params: dict, settings) -> list[str]:
        import numpy as np
        import tensorflow as tf

        answers = []
        for mels in model_input["mels"]:
            frames = np.asarray(mels, np.float32)[None]  # [1, T, D]
            logits = self.model(pooled(tf.constant(frames), tf.constant([frames.shape[1]])), training=False)
            answers.append(self.speakers[int(np.argmax(logits[0]))])
        return answers

    @classmethod
    def signature(cls, config, data: dict):
        from mlflow.models import ModelSignature
        from mlflow.types import DataType
        from mlflow.types.schema import AnyType, ColSpec, Schema

        return ModelSignature(inputs=Schema([ColSpec(AnyType(), "mels")]), outputs=Schema([ColSpec(DataType.string)]))

    @classmethod
    def example(cls, config, data: dict) -> dict:
        import numpy as np

        return {"mels": [np.zeros([3, data["feature_dim"]], np.float32).tolist()]}
