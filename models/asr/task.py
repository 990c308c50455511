"""The acoustic model as the trainer sees it (models/interfaces.py `Task`): build the network, make
the batches, compute the CTC (or frame) loss, count the frames, decode a dev batch.

With `targets: chars` CTC learns the transcript's characters (the batch's `tokens`) and the best
weights are those of the lowest dev CER; with `targets: phones` it learns the phone targets the
shards hold over a lexicon's phone table (`phones`, pipeline/phones.py), its output layer is that
table, and the best weights are those of the lowest dev phone error rate (PER)."""

from __future__ import annotations

import dataclasses

import tensorflow as tf

from models.asr import network as asr
from models.asr import scoring
from models.asr.config import AsrConfig
from pipeline import dataset, frontend, records, text


def resolve_asr(config: asr.AsrConfig, shards: records.ShardSet) -> asr.AsrConfig:
    """Fills the sizes that come from the data (feature dim, vocabulary, pdf count)."""
    loss = config.loss
    if loss == "frame_ce" and not (config.num_targets or shards.num_targets):
        raise ValueError("loss=frame_ce needs shards with frame targets: re-shard with --alignments train=ali.scp")
    if config.targets == "phones" and not shards.phone_vocabulary:
        raise ValueError(
            f"asr.targets phones needs shards with phone targets; {shards.root} has none: shard again with "
            "--phones-from DICT_OR_LANG_DIR (python -m pipeline.shards)"
        )
    return dataclasses.replace(
        config,
        feature_dim=shards.feature_dim,
        vocab_size=config.vocab_size or len(outputs_of(config, shards)),
        num_targets=config.num_targets or shards.num_targets,
    )


def outputs_of(config: AsrConfig, shards: records.ShardSet) -> tuple[str, ...]:
    """The output layer's symbols in id order: the characters, or `<blk>` and the phones."""
    return shards.phone_vocabulary if config.targets == "phones" else shards.vocabulary


class AsrTask:
    name = "asr"
    profile_every = False

    # what a dev batch adds up: the loss and the error counts behind CER and WER
    dev_count_names: tuple[str, ...] = ("loss_sum", "batches", *scoring.COUNTS)

    @classmethod
    def create(cls, config, shards: records.ShardSet, eval_config=None) -> AsrTask:
        """The task of TrainConfig `config`, sized from `shards` (its vocabulary decodes dev batches)."""
        settings = resolve_asr(config.settings, shards)
        return cls(settings, list(outputs_of(settings, shards)), shards.phones, shards.phonemes)

    def resolved(self, config):
        return dataclasses.replace(config, settings=self.config)

    def model_data(self) -> dict:
        """What data.json adds for this model: its targets, output layer and phone source; a phone
        model also the espeak-ng voice of its shards' phonemes ("": none), in which its targets (or
        the words G2P filled) were said, and in which a sentence's targets are built again
        (models/tts/evaluation.py's phone listener)."""
        data = {"voices": [], "targets": self.config.targets, "outputs": list(self.vocabulary), "phones": self.phones}
        return {**data, "phonemes": self.phonemes} if self.phone_targets else data

    def __init__(
        self, config: AsrConfig, vocabulary: list[str] | None = None, phones: dict | None = None, phonemes: str = ""
    ):
        self.config = config
        self.vocabulary = vocabulary or []  # the output layer's symbols: characters, or <blk> and phones
        self.phones = phones or {}  # the shards' record of the lexicon the phone targets came from
        self.phonemes = phonemes  # the espeak-ng voice of the shards' phonemes ("": none)
        self.phone_targets = config.targets == "phones"
        self.selection_metric = "dev_per" if self.phone_targets else "dev_cer"
        # the training step's augmentation settings (SpecAugment, VTLP); None: none
        self.augment = config.augment if config.augment.enabled else None

    def build(self):
        return asr.build_asr(self.config)

    def dataset(
        self,
        shards: records.ShardSet,
        split: str,
        cfg: dataset.InputConfig,
        rank: int,
        size: int,
        epoch: int,
        training: bool,
    ):
        return dataset.ASR.batches(shards, split, cfg, rank, size, epoch, training)

    @staticmethod
    def input_pipeline() -> dataset.Pipeline:
        return dataset.ASR

    def prepare(self, batches, shards: records.ShardSet, split: str):
        """What the trainer adds to batches that came from elsewhere (the tf.data service): nothing."""
        return batches

    @staticmethod
    def frames(batch) -> tf.Tensor:
        """Input frames (before subsampling) in a batch: what frames/s counts."""
        return tf.reduce_sum(batch["feat_lengths"])

    @staticmethod
    def features(batch) -> tf.Tensor:
        """What the model reads: the batch's stored features normalized as its input config says
        (speaker, split-wide or per-utterance CMVN), float32 [B, T, D]. Serving calls it too."""
        return frontend.normalize(
            batch["feats"],
            batch["feat_scale"],
            batch["feat_offset"],
            batch["feat_lengths"],
            batch.get("utterance_cmvn"),
        )

    def loss(self, model, batch, training: bool, seed=None) -> tuple[tf.Tensor, dict]:
        """`seed`: int64 [2], the stateless seed of this step's augmentation (training only)."""
        feats = self.features(batch)
        if training and self.augment is not None and seed is not None:
            feats = self._augmented(feats, batch, seed)
        logits, lengths = model(feats, batch["feat_lengths"], training=training)
        return self._loss_of(logits, lengths, batch)

    def _augmented(self, feats, batch, seed):
        """feats [B, T, D] with VTLP, then SpecAugment; as they are before `augment_from_step`. One
        graph for both (the training step is traced once): the step is the seed's second element."""

        def augment():
            out = feats
            if tuple(self.augment.vtlp_range) != (1.0, 1.0):
                warp_seed = tf.random.experimental.stateless_fold_in(seed, 1)  # SpecAugment's masks keep theirs
                out = frontend.vtlp(out, self.augment.vtlp_range, warp_seed)
            if self.augment.spec_augment:
                out = frontend.spec_augment(out, batch["feat_lengths"], self.augment, seed)
            return out

        if self.augment.augment_from_step <= 1:
            return augment()
        return tf.cond(seed[1] >= self.augment.augment_from_step, augment, lambda: feats)

    def _loss_of(self, logits, lengths, batch) -> tuple[tf.Tensor, dict]:
        if self.config.loss == "frame_ce":
            loss = asr.frame_ce_loss(logits, lengths, batch["targets"], self.config.subsample)
            return loss, {}
        labels, label_lengths = self.labels(batch)
        loss, infeasible = asr.ctc_loss(logits, lengths, labels, label_lengths, self.config.ctc_labels)
        return loss, {"infeasible_utterances": infeasible}

    def labels(self, batch) -> tuple[tf.Tensor, tf.Tensor]:
        """CTC's targets of a batch: (ids int32 [B, L] 0-padded, lengths int32 [B])."""
        if self.phone_targets:
            return batch["phones"], batch["phone_lengths"]
        return batch["tokens"], batch["token_lengths"]

    def strings(self, ids) -> list[str]:
        """Output ids of each utterance -> its transcript: characters joined, or phones joined by " "
        (so that the word error rate of phone strings is the phone error rate)."""
        if self.phone_targets:
            return [" ".join(self.vocabulary[i] for i in row if 0 < i < len(self.vocabulary)) for row in ids]
        return [text.decode(row, self.vocabulary) for row in ids]

    def dev_counts(self, model, batch) -> dict[str, float]:
        """A dev batch's loss and the error counts of its greedy transcripts, from one compiled forward
        pass (`asr.compiled`: an eager pass steps every LSTM through time in Python)."""
        logits, lengths = asr.compiled(model, self.config.feature_dim)(self.features(batch), batch["feat_lengths"])
        loss, _ = self._loss_of(logits, lengths, batch)
        hyps = self.strings(asr.greedy_decode(logits.numpy(), lengths.numpy()))
        labels, label_lengths = (t.numpy() for t in self.labels(batch))
        refs = self.strings([row[:n] for row, n in zip(labels, label_lengths)])
        rates = scoring.error_rates(refs, hyps)
        return {"loss_sum": float(loss), "batches": 1.0, **{k: rates[k] for k in scoring.COUNTS}}

    def dev_metrics(self, counts: dict[str, float]) -> dict[str, float]:
        rates = scoring.rates_of(counts)
        loss = {"dev_loss": counts["loss_sum"] / max(1.0, counts["batches"])}
        if self.phone_targets:  # the phone strings' word error rate is the PER
            return {**loss, "dev_per": rates["wer"], "dev_utterances": int(counts["utterances"])}
        return {**loss, "dev_cer": rates["cer"], "dev_wer": rates["wer"], "dev_utterances": int(counts["utterances"])}

    def flops_per_frame(self) -> float:
        return asr.flops_per_frame(self.config)

    def profile(self, model, batch) -> dict:
        return {}

    def finish(self, model, shards, config) -> dict:
        return {}
