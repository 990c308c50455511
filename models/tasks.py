"""What the trainer needs to know about each model, behind one small interface.

The trainer and the distributed strategies only see a `Task`: build the model, make the batches,
compute the loss, count the frames. Adding a model means adding a task here; the trainer and the
strategies (allreduce, gossip) stay as they are.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import tensorflow as tf

from models import asr, tts
from pipeline import dataset, frontend


def resolve_asr(config: asr.AsrConfig, manifest: dict) -> asr.AsrConfig:
    """Fills the sizes that come from the data (feature dim, vocabulary, pdf count)."""
    loss = config.loss
    if loss == "frame_ce" and not manifest.get("num_targets"):
        raise ValueError("loss=frame_ce needs shards with frame targets: re-shard with --alignments train=ali.scp")
    return dataclasses.replace(
        config,
        feature_dim=manifest["feature_dim"],
        vocab_size=config.vocab_size or len(manifest["vocabulary"]),
        num_targets=config.num_targets or manifest.get("num_targets", 0),
    )


def resolve_tts(config: tts.TtsConfig, manifest: dict) -> tts.TtsConfig:
    return dataclasses.replace(config, vocab_size=len(manifest["vocabulary"]), n_mels=manifest["feature_dim"])


class AsrTask:
    name = "asr"

    def __init__(self, config: asr.AsrConfig, augment: dataset.InputConfig | None = None):
        self.config = config
        self.augment = augment if augment is not None and augment.spec_augment else None  # SpecAugment settings

    def build(self):
        return asr.build_asr(self.config)

    def dataset(
        self,
        shards: Path,
        split: str,
        cfg: dataset.InputConfig,
        rank: int,
        size: int,
        epoch: int,
        training: bool,
        manifest: dict,
    ):
        return dataset.asr_dataset(shards, split, cfg, rank, size, epoch, training, manifest)

    @staticmethod
    def frames(batch) -> tf.Tensor:
        """Input frames (before subsampling) in a batch: what frames/s counts."""
        return tf.reduce_sum(batch["feat_lengths"])

    @staticmethod
    def features(batch) -> tf.Tensor:
        """What the model reads: the batch's stored features with speaker CMVN, float32 [B, T, D]."""
        return frontend.normalize(batch["feats"], batch["feat_scale"], batch["feat_offset"], batch["feat_lengths"])

    def loss(self, model, batch, training: bool, seed=None) -> tuple[tf.Tensor, dict]:
        """`seed`: int64 [2], the stateless seed of this step's SpecAugment masks (training only)."""
        feats = self.features(batch)
        if training and self.augment is not None and seed is not None:
            feats = frontend.spec_augment(feats, batch["feat_lengths"], self.augment, seed)
        logits, lengths = model(feats, batch["feat_lengths"], training=training)
        if self.config.loss == "frame_ce":
            loss = asr.frame_ce_loss(logits, lengths, batch["targets"], self.config.subsample)
            return loss, {}
        loss, infeasible = asr.ctc_loss(logits, lengths, batch["tokens"], batch["token_lengths"])
        return loss, {"infeasible_utterances": infeasible}

    def flops_per_frame(self) -> float:
        return asr.flops_per_frame(self.config)

    def profile(self, model, batch) -> dict:
        return {}


class TtsTask:
    name = "tts"

    def __init__(self, config: tts.TtsConfig):
        self.config = config

    def build(self):
        return tts.build_tts(self.config)

    def dataset(
        self,
        shards: Path,
        split: str,
        cfg: dataset.InputConfig,
        rank: int,
        size: int,
        epoch: int,
        training: bool,
        manifest: dict,
    ):
        return dataset.tts_dataset(shards, split, cfg, rank, size, epoch, training, manifest)

    @staticmethod
    def frames(batch) -> tf.Tensor:
        return tf.reduce_sum(batch["mel_lengths"])

    def loss(self, model, batch, training: bool, seed=None) -> tuple[tf.Tensor, dict]:
        outputs = model.teacher_forced(batch, training=training)
        losses = model.compute_losses(batch, outputs)
        return losses["total"], {k: v for k, v in losses.items() if k != "total"}

    def flops_per_frame(self) -> float:
        return 0.0  # not reported for the synthesis model

    def profile(self, model, batch) -> dict:
        """Seconds of forward + backward per module on this batch: encoder, decoder, post-net.

        The research timed Tacotron's modules separately; inside one compiled step they cannot be
        told apart, so each module runs here on its own, eagerly compiled once per module.
        """
        return _profile_tts(model, batch)


_PROFILE_FNS: dict = {}


def _connected(grads):
    """The gradients that exist (a module's backward pass reaches only its own weights)."""
    return [g for g in grads if g is not None]


def _profile_tts(model, batch) -> dict:
    if model not in _PROFILE_FNS:

        def encoder(b):
            with tf.GradientTape() as tape:
                memory = model.encode(b["tokens"], b["token_lengths"], training=True)
                loss = tf.reduce_sum(tf.cast(memory, tf.float32))
            return memory, _connected(tape.gradient(loss, model.trainable_variables))

        def decoder(memory, b):
            with tf.GradientTape() as tape:
                tape.watch(memory)
                out = model.decode(memory, b["token_lengths"], b["mels"], training=True)
                loss = tf.reduce_sum(tf.cast(out["mel_before"], tf.float32))
            return out["mel_before"], _connected(tape.gradient(loss, model.trainable_variables))

        def postnet(before, b):
            with tf.GradientTape() as tape:
                after = model.postnet(before, b["mel_lengths"], training=True)
                loss = tf.reduce_sum(tf.cast(after, tf.float32))
            return _connected(tape.gradient(loss, model.trainable_variables))

        _PROFILE_FNS[model] = [tf.function(f, reduce_retracing=True) for f in (encoder, decoder, postnet)]
    encoder, decoder, postnet = _PROFILE_FNS[model]
    timings = {}
    start = time.perf_counter()
    memory, _ = encoder(batch)
    _sync(memory)
    timings["encoder_s"] = time.perf_counter() - start
    start = time.perf_counter()
    before, _ = decoder(memory, batch)
    _sync(before)
    timings["decoder_s"] = time.perf_counter() - start
    start = time.perf_counter()
    grads = postnet(before, batch)
    _sync(grads[-1])
    timings["postnet_s"] = time.perf_counter() - start
    return timings


def _sync(tensor) -> None:
    """Waits for `tensor` (GPU ops run asynchronously; reading a value waits for them)."""
    tf.reduce_sum(tf.cast(tensor, tf.float32)).numpy()


def make_task(
    model_name: str,
    asr_config: asr.AsrConfig,
    tts_config: tts.TtsConfig,
    manifest: dict,
    augment: dataset.InputConfig | None = None,
):
    """The task of `model_name`, sized from the manifest; `augment`: the input config whose
    SpecAugment settings the acoustic model trains with."""
    if model_name == "asr":
        return AsrTask(resolve_asr(asr_config, manifest), augment)
    if model_name == "tts":
        return TtsTask(resolve_tts(tts_config, manifest))
    raise ValueError(f"--model must be 'asr' or 'tts', got {model_name!r}")
