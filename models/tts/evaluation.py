"""Evaluating the synthesis model, in three steps that `models.evaluate` runs in order:

1. `synthesize`: inference only. Each test sentence is spoken twice, teacher-forced (for the mel L1
   and the attention's diagonality) and free-running (what a listener hears), and kept as a `Spoken`
   with the voice it was spoken in: the recording's own speaker when training heard that voice (the
   dev split: held-out sentences in training voices), otherwise the training voice nearest to it
   (the test split's voices are new; see `TtsTask.voices`), or one voice asked for by name.
2. `tts_metrics`: numbers from the `Spoken`s (mel L1, filterbank cepstral distance after DTW, attention
   monotonicity and diagonality), and `intelligibility`: our acoustic model transcribes the
   synthesized mels, and its CER says how understandable they are.
3. `write_samples`: attention and mel plots and Griffin-Lim WAVs of the first few sentences, each
   file named with its voice, and `SPLIT_samples.tsv` saying who speaks what.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from models.asr import network as asr
from models.tts import alignment as tts_alignment
from models.tts import audio


@dataclasses.dataclass
class Spoken:
    """One test sentence spoken by the model; mels are raw log-mel fbank [frames, dim]."""

    utt_id: str
    speaker: str  # who recorded the reference
    voice: str  # the training voice the model spoke it in ("" for a model with one voice)
    tokens: np.ndarray  # [N] token ids of the sentence
    reference: np.ndarray  # [T, D] the recording's features
    teacher_forced: np.ndarray  # [T, D] post-net output with the reference frames fed back
    synthesized: np.ndarray  # [T', D] free-running output
    forced_alignment: np.ndarray  # [ceil(T / r), N] attention weights, teacher-forced
    free_alignment: np.ndarray  # [ceil(T' / r), N] attention weights, free-running


def synthesize(model, config, data: dict, dataset, max_utterances: int, forced_pass) -> Iterator[Spoken]:
    """Speaks the sentences of `dataset` (`TtsTask.dataset` in evaluation mode: its `speaker_ids`
    say in which voice) with compiled functions: the decoder loops run as graphs; `forced_pass`:
    `teacher_forced_graph` of the model for `dataset`."""
    import tensorflow as tf

    mean, std = np.asarray(data["mel_mean"], np.float32), np.asarray(data["mel_std"], np.float32)
    r = config.settings.reduction_factor
    voices = list(config.settings.speakers) if config.settings.multi_speaker else [""]
    infer = model.compiled_infer()
    count = 0
    for batch in dataset:
        forced = forced_pass(batch)
        reference = batch["mels"].numpy() * std + mean  # [B, T, D] log-mel
        lengths = batch["mel_lengths"].numpy()
        predicted = forced["mel_after"].numpy() * std + mean
        token_lengths = batch["token_lengths"].numpy()  # the model's input symbols
        text_lengths = batch["text_token_lengths"].numpy()  # the sentence's characters
        ids = batch.get("speaker_ids", tf.zeros_like(batch["token_lengths"]))
        # Free-running synthesis may run up to 1.5 times the reference's length before it is cut.
        steps = tf.constant(int(1.5 * reference.shape[1] / r) + 10)
        free = infer(batch["tokens"], batch["token_lengths"], steps, tf.constant(0.5), ids)
        free_mels = free["mels"].numpy() * std + mean
        free_lengths = np.maximum(free["lengths"].numpy(), 1)
        for i, utt in enumerate(batch["utt_id"].numpy()):
            if count >= max_utterances:
                return
            n, t, f = int(token_lengths[i]), int(lengths[i]), int(free_lengths[i])
            yield Spoken(
                utt_id=utt.decode(),
                speaker=batch["speaker"][i].numpy().decode(),
                voice=voices[int(ids[i])],
                tokens=batch["text_tokens"][i, : text_lengths[i]].numpy(),
                reference=reference[i, :t],
                teacher_forced=predicted[i, :t],
                synthesized=free_mels[i, :f],
                forced_alignment=forced["alignments"][i, : -(-t // r), :n].numpy(),
                free_alignment=free["alignments"][i, : -(-f // r), :n].numpy(),
            )
            count += 1


def tts_metrics(spoken: list[Spoken], split: str) -> dict:
    """Mel L1 (teacher-forced), filterbank cepstral distance (free-running, DTW-aligned; not the MCD of
    papers, see `audio.fbank_cepstral_distance`), attention shape."""

    def attention(measure, key: str) -> float:
        values = [
            measure(s.__dict__[key][None], [s.__dict__[key].shape[1]], [s.__dict__[key].shape[0]]) for s in spoken
        ]
        return float(np.nanmean(values)) if values else float("nan")

    l1 = sum(float(np.abs(s.teacher_forced - s.reference).sum()) for s in spoken)
    count = sum(s.reference.size for s in spoken)
    return {
        f"{split}_mel_l1": l1 / max(count, 1),
        f"{split}_fbank_cepstral_distance_db": float(
            np.mean([audio.fbank_cepstral_distance(s.synthesized, s.reference) for s in spoken])
        ),
        f"{split}_attention_monotonicity": attention(tts_alignment.attention_monotonicity, "free_alignment"),
        f"{split}_attention_monotonicity_teacher_forced": attention(
            tts_alignment.attention_monotonicity, "forced_alignment"
        ),
        f"{split}_attention_diagonality_teacher_forced": attention(
            tts_alignment.attention_diagonality, "forced_alignment"
        ),
        f"{split}_utterances": len(spoken),
        f"{split}_voices": len({s.voice for s in spoken}),
        # how many sentences were spoken in the voice that recorded them (the rest: a nearest or chosen voice)
        f"{split}_own_voice_fraction": float(np.mean([s.voice == s.speaker for s in spoken])) if spoken else 0.0,
    }


class Listener:
    """A trained acoustic model that transcribes log-mels [T, 80] (any form models/opening.py
    opens). Features are normalized as it was trained: each utterance by its own statistics
    (`input.cmvn: utterance`), or each voice as one speaker, by the mean and variance of all its
    utterances among those it is given (speaker CMVN and the others)."""

    def __init__(self, asr_model: str | Path):
        from models import opening

        self.model, self.config, self.data = opening.open_model(asr_model)
        self.per_utterance = self.config.input.cmvn == "utterance"

    def transcribe(self, mels: list[np.ndarray], voices: list[str]) -> list[str]:
        """One transcript per log-mel matrix; `voices` names whose statistics normalize each."""
        from pipeline import frontend

        stats = {}  # per-voice statistics, for a judge that does not normalize each utterance itself
        for voice in () if self.per_utterance else set(voices):
            frames = np.concatenate([m for m, v in zip(mels, voices) if v == voice])
            stats[voice] = frames.mean(0), np.maximum(frames.std(0), 1e-4)
        hyps = []
        for start in range(0, len(mels), 16):
            chunk, chunk_voices = mels[start : start + 16], voices[start : start + 16]
            lengths = np.asarray([len(m) for m in chunk], np.int32)
            feats = np.zeros([len(chunk), lengths.max(), chunk[0].shape[1]], np.float32)  # [B, T, D]
            for i, (m, voice) in enumerate(zip(chunk, chunk_voices)):
                mean, std = (0.0, 1.0) if self.per_utterance else stats[voice]
                feats[i, : len(m)] = (m - mean) / std
            if self.per_utterance:
                feats = frontend.utterance_normalize(feats, lengths).numpy()
            hyps += asr.transcribe(self.model, feats, lengths, self.data["vocabulary"])
        return hyps


def intelligibility(spoken: list[Spoken], vocabulary: list[str], listener: Listener, split: str, out_dir: Path) -> dict:
    """CER of an acoustic model (`listener`) on the synthesized log-mels (`SPLIT_intelligibility_cer`),
    and, to say where what it misses is lost, on two more sources of the same sentences: the model's
    teacher-forced output (`..._cer_teacher_forced`: the frames it predicts when it is fed the
    recording, so free-running drift is left out) and the recordings themselves
    (`..._cer_recordings`: the judge's own errors); and on what a person hears (`..._cer_vocoded`:
    the synthesized mels through Griffin-Lim as the user gets them, analysed again by the feature
    stage, `audio.vocoded`)."""
    from models.asr.evaluation import error_rates

    refs = ["".join(vocabulary[t] for t in s.tokens) for s in spoken]
    hyps = listener.transcribe([s.synthesized for s in spoken], [s.voice for s in spoken])
    # teacher-forced frames follow the recording they are fed, so they are normalized by its speaker
    forced = listener.transcribe([s.teacher_forced for s in spoken], [s.speaker for s in spoken])
    recorded = listener.transcribe([s.reference for s in spoken], [s.speaker for s in spoken])
    heard = listener.transcribe(audio.vocoded([s.synthesized for s in spoken]), [s.voice for s in spoken])
    columns = ["utt_id", "speaker", "voice", "reference", "asr_on_synthesis", "asr_on_teacher_forced"]
    columns += ["asr_on_recording", "asr_on_vocoded"]
    rows = ["\t".join(columns)] + [
        "\t".join([s.utt_id, s.speaker, s.voice, *texts])
        for s, *texts in zip(spoken, refs, hyps, forced, recorded, heard)
    ]
    (out_dir / f"{split}_intelligibility.tsv").write_text("\n".join(rows) + "\n", encoding="utf-8")
    rates, forced_rates, recorded_rates, heard_rates = (error_rates(refs, h) for h in (hyps, forced, recorded, heard))
    return {
        f"{split}_intelligibility_cer": rates["cer"],
        f"{split}_intelligibility_wer": rates["wer"],
        f"{split}_intelligibility_cer_teacher_forced": forced_rates["cer"],
        f"{split}_intelligibility_cer_recordings": recorded_rates["cer"],
        f"{split}_intelligibility_cer_vocoded": heard_rates["cer"],
    }


def write_samples(
    spoken: list[Spoken], vocabulary: list[str], out_dir: Path, split: str, num_plots: int, num_audio: int
) -> None:
    """Attention and mel plots of the first `num_plots` sentences, Griffin-Lim WAVs of the first
    `num_audio`, each named `UTT_in_VOICE_...`, and `SPLIT_samples.tsv`: file, recorded speaker,
    synthesized voice, text. Sentences in different voices come first, so the samples show several."""
    firsts = {}
    for s in spoken:
        firsts.setdefault(s.voice, s)
    ordered = list(firsts.values()) + [s for s in spoken if firsts[s.voice] is not s]
    rows = ["file\tspeaker\tvoice\ttext"]

    def stem(s: Spoken) -> str:
        return f"{s.utt_id}_in_{s.voice}" if s.voice else s.utt_id

    for s in ordered[:num_plots]:
        title = f"{s.utt_id} in {s.voice or 'the model voice'}"
        audio.plot_alignment(
            s.forced_alignment, out_dir / f"{stem(s)}_attention_teacher_forced.png", f"{title}: teacher-forced"
        )
        audio.plot_alignment(
            s.free_alignment, out_dir / f"{stem(s)}_attention_synthesis.png", f"{title}: while synthesizing"
        )
        audio.plot_mels(s.synthesized, s.reference, out_dir / f"{stem(s)}_mels.png", title)
    sampled = ordered[:num_audio]
    # one batch: the synthesized and the recorded mels of every sample
    waves = audio.griffin_lim_batch([s.synthesized for s in sampled] + [s.reference for s in sampled])
    for s, synthesized, reference in zip(sampled, waves[: len(sampled)], waves[len(sampled) :]):
        text = "".join(vocabulary[t] for t in s.tokens)
        audio.write_wav(out_dir / f"{stem(s)}_synthesized.wav", synthesized)
        audio.write_wav(out_dir / f"{s.utt_id}_reference_griffin_lim.wav", reference)
        rows += [
            f"{stem(s)}_synthesized.wav\t{s.speaker}\t{s.voice}\t{text}",
            f"{s.utt_id}_reference_griffin_lim.wav\t{s.speaker}\t{s.speaker}\t{text}",
        ]
    (out_dir / f"{split}_samples.tsv").write_text("\n".join(rows) + "\n", encoding="utf-8")


def evaluate(model, config, data: dict, batches, splits: list[str], cfg, out_dir: Path, listener=None) -> dict:
    """models.evaluate's evaluation of the synthesis model (common/catalog.py) on each of `splits`
    (`batches(split, frames_per_batch)` gives its input); `listener`: a trained acoustic model's
    workdir, for intelligibility. The champion is chosen on dev's teacher-forced mel L1; without dev,
    on the first split's intelligibility CER (or cepstral distance without a listener)."""
    metrics = {}
    judge = Listener(listener) if listener is not None else None  # opened once, for every split
    for split in splits:
        dataset = batches(split, cfg.frames_per_batch)
        # dev: held-out sentences in training voices; test: voices training never heard (reported apart)
        forced = teacher_forced_graph(model, dataset)
        spoken = list(synthesize(model, config, data, dataset, cfg.max_utterances, forced))
        metrics.update(tts_metrics(spoken, split))
        if split == "dev":  # selection: the teacher-forced mel L1 of all of dev
            metrics["dev_mel_l1"] = teacher_forced_l1(forced, dataset)
        if judge is not None:
            metrics.update(intelligibility(spoken, data["vocabulary"], judge, split, out_dir))
        write_samples(spoken, data["vocabulary"], out_dir, split, cfg.num_plots, cfg.num_audio)
    if "dev" in splits:
        metrics["primary_metric"] = "dev_mel_l1"
    else:
        reported = splits[0]
        metrics["primary_metric"] = (
            f"{reported}_intelligibility_cer" if listener else f"{reported}_fbank_cepstral_distance_db"
        )
    return metrics


def teacher_forced_l1(forced, dataset) -> float:
    """Mean absolute error of the post-net's normalized mels, teacher-forced (`forced`:
    `teacher_forced_graph` of the model for `dataset`), over real frames."""
    import tensorflow as tf

    total = count = 0.0
    for batch in dataset:
        out = forced(batch)
        mask = tf.sequence_mask(batch["mel_lengths"], tf.shape(batch["mels"])[1], tf.float32)[..., None]
        total += float(tf.reduce_sum(tf.abs(out["mel_after"] - batch["mels"]) * mask))
        count += float(tf.reduce_sum(mask)) * int(batch["mels"].shape[-1])
    return total / max(count, 1.0)


def teacher_forced_graph(model, dataset):
    """The model's teacher-forced pass over `dataset`'s batches as one graph, not a Python step per
    frame; traced once, for the batches' element spec (their batch and time axes free), where
    tracing for each new shape traced it again for most of the evaluation's batches."""
    import tensorflow as tf

    return tf.function(lambda b: model.teacher_forced(b, training=False), input_signature=[dataset.element_spec])
