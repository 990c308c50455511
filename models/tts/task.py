"""The synthesis model as the trainer sees it (models/interfaces.py `Task`), what serving asks of it
(`speak`: sentences to log-mels), and the per-module profile the trainer records."""

from __future__ import annotations

import dataclasses
import functools
import time

import numpy as np
import tensorflow as tf

from models.interfaces import DevLoss
from models.tts.base import speaker_ids
from models.tts.config import TtsConfig
from models.tts.network import build_tts
from pipeline import dataset, records, text
from pipeline.augment_config import CLEAN_SPLIT  # the synthesis model reads clean audio only: no copies


def resolve_tts(config: TtsConfig, shards: records.ShardSet) -> TtsConfig:
    """Fills the sizes that come from the data (the input's vocabulary, mel bins) and the voices: the
    training split's speakers, one speaker-embedding row each (a config that names them keeps its
    own: a trained model's, read back for evaluation or serving). ValueError with the fix for a
    model with phoneme input on shards without phonemes."""
    speakers = config.speakers
    train = shards.splits.get(CLEAN_SPLIT)
    if not speakers and config.speaker_dim > 0 and train is not None:
        speakers = train.speakers
    vocabulary = shards.vocabulary
    if config.input == "phonemes":
        vocabulary = shards.phoneme_vocabulary
        if not vocabulary:
            raise ValueError(
                f"tts.input is phonemes, but the shards{_where(shards)} hold none: write them with "
                "`python -m pipeline.shards ... --phonemes en-us` (the DAG's `phonemes` parameter), or "
                "train on characters (tts.input=characters)"
            )
    vocab_size = len(vocabulary) + (2 if config.boundaries else 0)  # the start and end symbols after the rest
    return dataclasses.replace(config, vocab_size=vocab_size, n_mels=shards.feature_dim, speakers=speakers)


def frame_sentences(config: TtsConfig, tokens, lengths):
    """With `config.boundaries`, each sentence between a start and an end symbol: tokens [B, N] int
    0-padded, lengths [B] -> tokens [B, N + 2] (start, the sentence, end, padding), lengths + 2.
    Without, the input unchanged. The one place the model's input is framed: `prepare` (training,
    evaluation) and `encode_input` (synthesis, serving) both call it."""
    if not config.boundaries:
        return tokens, lengths
    tokens, lengths = tf.convert_to_tensor(tokens), tf.convert_to_tensor(lengths)
    start, end = tf.cast(config.vocab_size - 2, tokens.dtype), tf.cast(config.vocab_size - 1, tokens.dtype)
    b = tf.shape(tokens)[0]
    framed = tf.concat([tf.fill([b, 1], start), tokens, tf.zeros([b, 1], tokens.dtype)], 1)  # [B, N + 2]
    at_end = tf.range(tf.shape(framed)[1])[None, :] == tf.cast(lengths, tf.int32)[:, None] + 1  # [B, N + 2]
    return tf.where(at_end, end, framed), lengths + 2


def _where(shards) -> str:
    return f" in {shards.root}" if shards.root is not None else ""


class TtsTask(DevLoss):
    name = "tts"
    profile_every = True  # the research timed Tacotron's modules apart

    @classmethod
    def create(cls, config, shards: records.ShardSet, eval_config=None) -> TtsTask:
        """The task of TrainConfig `config`, sized from `shards`; evaluation speaks in `eval_config.voice`
        (`eval_config`: its TtsEvalConfig)."""
        resolved = resolve_tts(config.settings, shards)
        phonemes = (
            {"phonemes": shards.phonemes, "phoneme_vocabulary": list(shards.phoneme_vocabulary)}
            if resolved.input == "phonemes"
            else {}
        )
        return cls(resolved, eval_config.voice if eval_config is not None else "", phonemes)

    def resolved(self, config):
        return dataclasses.replace(config, settings=self.config)

    def model_data(self) -> dict:
        # Serving asks for voices by name, and turns text into the model's input as the shards did.
        return {"voices": list(self.config.speakers), **self.phonemes}

    def __init__(self, config: TtsConfig, voice: str = "", phonemes: dict | None = None):
        """`voice`: a training voice that every utterance is spoken in (evaluation); empty: each
        utterance's own voice, or for a voice the model never heard, the nearest training voice.
        `phonemes`: for phoneme input, the voice and vocabulary the shards' phonemes were written
        with (`phonemes`, `phoneme_vocabulary`; the model's data.json keeps them for serving)."""
        self.config = config
        self.voice = voice
        if voice:
            speaker_ids(config, [voice])  # ValueError now, naming the voices, for one it lacks
        self._eval_loss = None
        self.phonemes = phonemes or {}

    def build(self):
        return build_tts(self.config)

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
        """The synthesis batches (pipeline/dataset.py `tts_dataset`) with `speaker_ids` [B] int32
        added: each utterance's row of the speaker table (see `voices`)."""
        batches, count = dataset.TTS.batches(shards, split, cfg, rank, size, epoch, training)
        return self.prepare(batches, shards, split), count

    @staticmethod
    def input_pipeline() -> dataset.Pipeline:
        return dataset.TTS

    def prepare(self, batches, shards: records.ShardSet, split: str):
        """`batches` of `tts_dataset` (here or from the tf.data service) as the model reads them:
        `tokens` and `token_lengths` are its input (the characters, or with `input: phonemes` the
        phonemes), `text_tokens` and `text_token_lengths` the characters (what a listener should
        hear); and for a model with voices `speaker_ids` [B] int32, each utterance's row of the
        speaker table (see `voices`)."""
        phonemes = self.config.input == "phonemes"
        table = None
        if self.config.multi_speaker:
            names, rows = zip(*self.voices(shards, split).items())
            table = tf.lookup.StaticHashTable(
                tf.lookup.KeyValueTensorInitializer(tf.constant(names), tf.constant(rows, tf.int32)), default_value=0
            )

        def model_input(b):
            out = {k: v for k, v in b.items() if k not in ("phonemes", "phoneme_lengths")}
            out["text_tokens"], out["text_token_lengths"] = b["tokens"], b["token_lengths"]
            if phonemes:
                out["tokens"], out["token_lengths"] = b["phonemes"], b["phoneme_lengths"]
            out["tokens"], out["token_lengths"] = frame_sentences(self.config, out["tokens"], out["token_lengths"])
            if table is not None:
                out["speaker_ids"] = table.lookup(b["speaker"])
            return out

        return batches.map(model_input)

    def voices(self, shards: records.ShardSet, split: str) -> dict[str, int]:
        """Each speaker of `split` -> the speaker-table row it is spoken with: `self.voice` for all
        when set; a training voice its own row; a voice training never heard the training voice whose
        mean log-mel spectrum (from the shards' CMVN statistics) is nearest, or the default voice
        (row 0) when the shards hold no training split to compare with."""
        part = shards.split(split)
        speakers = part.speakers
        if self.voice:
            return dict.fromkeys(speakers, int(speaker_ids(self.config, [self.voice])[0]))
        own = {name: i for i, name in enumerate(self.config.speakers)}
        unseen = [s for s in speakers if s not in own]
        nearest = dict.fromkeys(unseen, 0)
        train = shards.splits.get(CLEAN_SPLIT)
        known = [s for s in self.config.speakers if train is not None and s in train.cmvn_speakers]
        if unseen and known:
            means, voices = _speaker_means(part), _speaker_means(train)
            table = np.stack([voices[s] for s in known])  # [V, D]
            for s in unseen:
                nearest[s] = own[known[int(np.argmin(np.sum((table - means[s]) ** 2, axis=1)))]]
        return {s: own.get(s, nearest.get(s, 0)) for s in speakers}

    @staticmethod
    def frames(batch) -> tf.Tensor:
        return tf.reduce_sum(batch["mel_lengths"])

    def loss(self, model, batch, training: bool, seed=None) -> tuple[tf.Tensor, dict]:
        if not training and tf.executing_eagerly():
            # Dev evaluation calls this eagerly: one compiled pass instead of a Python step per frame.
            if self._eval_loss is None:
                self._eval_loss = tf.function(lambda b: self._loss(model, b, False), reduce_retracing=True)
            return self._eval_loss(batch)
        return self._loss(model, batch, training)

    @staticmethod
    def _loss(model, batch, training: bool):
        outputs = model.teacher_forced(batch, training=training)
        losses = model.compute_losses(batch, outputs)
        if training:
            model.count_batch()
        return losses["total"], {k: v for k, v in losses.items() if k != "total"}

    def finish(self, model, shards: records.ShardSet, config) -> dict:
        """The durations model's duration predictor fitted again on the final alignments of the whole
        training split (`tts.duration_refit_epochs`; models/tts/refit.py)."""
        if self.config.alignment != "durations" or not self.config.duration_refit_epochs:
            return {}
        from models.tts.refit import refit_durations

        ordered = dataclasses.replace(config.input, shuffle_buffer=1)
        batches, _ = self.dataset(shards, config.train_split, ordered, 0, 1, 0, False)
        return refit_durations(model, batches, self.config.duration_refit_epochs, seed=config.seed)

    def flops_per_frame(self) -> float:
        return 0.0  # not reported for the synthesis model

    def profile(self, model, batch) -> dict:
        """Seconds per module on this batch, forward and backward apart: `{encoder,decoder,postnet}_
        {forward,backward}_s` (backward = forward + gradients minus forward), and their sums.

        Inside one compiled step the modules cannot be told apart, so each module runs here on its
        own, each pass a function compiled once (the trainer's first call compiles them and is not
        counted).
        """
        return _profile_tts(model, batch)


def speak(model, data: dict, texts: list[str], voices: list, max_steps: int = 400) -> dict:
    """What a served synthesis model does before its vocoder: sentences -> log-mel, each in the
    voice asked for.

    `texts` [B]; `voices` [B]: names of training voices (`data.json`'s `voices`, the model config's
    `speakers`), None or "" for the default voice (the first); ValueError naming the model's voices
    for a name it lacks. Synthesis is `model.compiled_infer()` (the decoder loop one graph). Returns
    `mels` float32 [B, T, D] (log-mel as the feature stage computes it, 0 after each sentence),
    `lengths` int32 [B] and `voices` [B] (the voice each sentence was spoken in)."""
    config = model.config
    ids = speaker_ids(config, voices)
    tokens, lengths = encode_input(config, data, texts)
    out = model.compiled_infer()(
        tf.constant(tokens), tf.constant(lengths), tf.constant(max_steps, tf.int32), tf.constant(0.5), tf.constant(ids)
    )
    mel_lengths = out["lengths"].numpy().astype(np.int32)
    mels = out["mels"].numpy() * np.asarray(data["mel_std"], np.float32) + np.asarray(data["mel_mean"], np.float32)
    mels *= np.arange(mels.shape[1])[None, :, None] < mel_lengths[:, None, None]  # [B, T, D], 0 after each
    names = list(config.speakers) if config.multi_speaker else [""]
    return {"mels": mels.astype(np.float32), "lengths": mel_lengths, "voices": [names[i] for i in ids]}


def encode_input(config: TtsConfig, data: dict, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """Sentences -> the model's input as its shards wrote it: (ids int32 [B, N] 0-padded, lengths
    [B]); characters, or for `input: phonemes` espeak-ng's phonemes in the voice the shards used;
    framed as `prepare` frames them (`frame_sentences`). A typed sentence is first spelled out as the
    corpus' sentences are (numbers, money, abbreviations: pipeline/open_text.py, leniently) when the
    model's text is lower-case, as every corpus sentence is."""
    from pipeline import open_text

    lowercase = data.get("lowercase", True)
    spoken = [open_text.normalize(t, strict=False) if lowercase else t for t in texts]
    normalized = [text.normalize_transcript(t, lowercase) for t in spoken]
    if config.input != "phonemes":
        ids = [text.encode(t, data["vocabulary"]) for t in normalized]
    else:
        from pipeline import phonemes

        ids = [text.encode(p, data["phoneme_vocabulary"]) for p in phonemes.phonemize(normalized, data["phonemes"])]
    tokens, lengths = frame_sentences(config, *text.pad_batch(ids))
    return np.asarray(tokens, np.int32), np.asarray(lengths, np.int32)


def _speaker_means(part: records.SplitShards) -> dict[str, np.ndarray]:
    """Each speaker of a split -> the mean [D] of its log-mel frames (the shards' CMVN statistics)."""
    names, means, _ = dataset.cmvn_tables(part, "speaker")
    return dict(zip(names, means))


_PROFILE_FNS: dict = {}  # model -> its compiled per-module functions


def _done(outputs) -> tf.Tensor:
    """One float32 scalar that depends on every tensor of `outputs` (waiting for it waits for them)."""
    values = [g.values if isinstance(g, tf.IndexedSlices) else g for g in outputs if g is not None]
    return tf.add_n([tf.reduce_sum(tf.cast(v, tf.float32)) for v in values])


def _profile_tts(model, batch) -> dict:
    """Forward, then forward + backward, of each module on its own inputs (computed once here).
    Each function returns (the module's output, a scalar that waits for all its work)."""
    if model not in _PROFILE_FNS:

        def encoder(b, backward):
            with tf.GradientTape() as tape:
                memory = model.encode(b["tokens"], b["token_lengths"], True, model.batch_speakers(b))
                loss = tf.reduce_sum(tf.cast(memory, tf.float32))
            grads = tape.gradient(loss, model.trainable_variables) if backward else []
            return memory, _done([memory, *grads])

        def decoder(memory, b, backward):
            with tf.GradientTape() as tape:
                tape.watch(memory)
                out = model.decode(memory, b["token_lengths"], b["mels"], True, model.batch_speakers(b))
                loss = tf.reduce_sum(tf.cast(out["mel_before"], tf.float32))
            grads = tape.gradient(loss, [memory, *model.trainable_variables]) if backward else []
            return out["mel_before"], _done([out["mel_before"], *grads])

        def postnet(before, b, backward):
            with tf.GradientTape() as tape:
                tape.watch(before)
                after = model.postnet(before, b["mel_lengths"], training=True)
                loss = tf.reduce_sum(tf.cast(after, tf.float32))
            grads = tape.gradient(loss, [before, *model.trainable_variables]) if backward else []
            return after, _done([after, *grads])

        # A partial, not a lambda: TensorFlow counts traces per code object, so six lambdas of one
        # line read as one function traced six times and logged a retracing warning.
        compiled = {}
        for name, fn in (("encoder", encoder), ("decoder", decoder), ("postnet", postnet)):
            for backward in (False, True):
                compiled[name, backward] = tf.function(functools.partial(fn, backward=backward), reduce_retracing=True)
        _PROFILE_FNS[model] = compiled
    fns = _PROFILE_FNS[model]
    memory = fns["encoder", False](batch)[0]
    before = fns["decoder", False](memory, batch)[0]
    inputs = {"encoder": (batch,), "decoder": (memory, batch), "postnet": (before, batch)}
    timings = {}
    for name, args in inputs.items():
        forward, both = _timed(fns[name, False], args), _timed(fns[name, True], args)
        timings[f"{name}_forward_s"] = forward
        timings[f"{name}_backward_s"] = max(0.0, both - forward)
        timings[f"{name}_s"] = both
    timings["forward_s"] = sum(timings[f"{m}_forward_s"] for m in inputs)
    timings["backward_s"] = sum(timings[f"{m}_backward_s"] for m in inputs)
    return timings


def _timed(fn, args) -> float:
    """Seconds of one call of `fn`, its work waited for."""
    start = time.perf_counter()
    fn(*args)[1].numpy()
    return time.perf_counter() - start
