"""Evaluating the synthesis model, in three steps that `models.evaluate` runs in order:

1. `synthesize`: inference only. Each test sentence is spoken twice, teacher-forced (for the mel L1
   and the attention's diagonality) and free-running (what a listener hears), and kept as a `Spoken`
   with the voice it was spoken in: the recording's own speaker when training heard that voice (the
   dev split: held-out sentences in training voices), otherwise the training voice nearest to it
   (the test split's voices are new; see `TtsTask.voices`), or one voice asked for by name.
2. `tts_metrics`: numbers from the `Spoken`s (mel L1, filterbank cepstral distance after DTW, attention
   monotonicity and diagonality), and `intelligibility`: our acoustic model (`Listener`) transcribes
   the synthesized mels, and its error rates say how understandable they are: a char model's CER
   and WER, or a phone model's PER against the targets it trains on and the WER of its words through
   its decoding graph. `intelligibility_listener` in the figures says which listener heard them.
3. `write_samples`: attention and mel plots and Griffin-Lim WAVs of the first few sentences, each
   file named with its voice, and `SPLIT_samples.tsv` saying who speaks what.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from models.asr import network as asr
from models.tts import alignment as tts_alignment
from models.tts import audio

if TYPE_CHECKING:  # a char listener needs no lexicon (pipeline/phones.py imports kaldifst)
    from pipeline.phones import PhoneTable


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
    """A trained acoustic model that transcribes log-mels [T, 80] (any form models/trained_model.py
    opens). Features are normalized as it was trained: each utterance by its own statistics
    (`input.cmvn: utterance`), or each voice as one speaker, by the mean and variance of all its
    utterances among those it is given (speaker CMVN and the others).

    A char model's words are its greedy characters. A phone model (data.json `targets: phones`)
    hears greedy phones, scored against the targets it trains on (`references`), and spells words
    only through its decoding graph (models/asr/lm.py `choose`), which is opened here once."""

    def __init__(self, asr_model: str | Path):
        from models import trained_model
        from models.asr import lm

        self.name = str(asr_model)
        self.model, self.config, self.data = trained_model.open_model(asr_model)
        self.per_utterance = self.config.input.cmvn == "utterance"
        self.phones = lm.targets_of(self.data) == "phones"
        self.graph = lm.choose(self.data) if self.phones else None
        self.table = listener_table(self.data, self.name) if self.phones else None

    def transcribe(self, mels: list[np.ndarray], voices: list[str]) -> list[str]:
        """One transcript (words) per log-mel matrix; `voices` names whose statistics normalize each."""
        return self.hear(mels, voices)["words"]

    def hear(self, mels: list[np.ndarray], voices: list[str]) -> dict[str, list[str]]:
        """{"words": one transcript per log-mel matrix}, and for a phone listener "phones": its greedy
        phones, space-joined (the strings whose word error rate is the PER)."""
        from models.asr import lm
        from models.asr.phone_evaluation import phone_string

        heard: dict[str, list[str]] = {"words": [], "phones": []} if self.phones else {"words": []}
        for feats, lengths in self._batches(mels, voices):
            if not self.phones:
                heard["words"] += asr.transcribe(self.model, feats, lengths, self.data["vocabulary"])
                continue
            logits, out_lengths = asr.forward(self.model, feats, lengths)  # [B, T', outputs], [B]
            greedy = asr.greedy_decode(logits.numpy(), out_lengths.numpy())
            heard["phones"] += [phone_string(ids, self.data["outputs"]) for ids in greedy]
            heard["words"] += self.graph.decode(lm.log_probs_of(logits, out_lengths))
        return heard

    def _batches(self, mels: list[np.ndarray], voices: list[str]) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """Batches of 16 as the model reads them: (feats float32 [B, T, D] normalized, lengths int32 [B])."""
        from pipeline import frontend

        stats = {}  # per-voice statistics, for a judge that does not normalize each utterance itself
        for voice in () if self.per_utterance else set(voices):
            frames = np.concatenate([m for m, v in zip(mels, voices) if v == voice])
            stats[voice] = frames.mean(0), np.maximum(frames.std(0), 1e-4)
        for start in range(0, len(mels), 16):
            chunk, chunk_voices = mels[start : start + 16], voices[start : start + 16]
            lengths = np.asarray([len(m) for m in chunk], np.int32)
            feats = np.zeros([len(chunk), lengths.max(), chunk[0].shape[1]], np.float32)  # [B, T, D]
            for i, (m, voice) in enumerate(zip(chunk, chunk_voices)):
                mean, std = (0.0, 1.0) if self.per_utterance else stats[voice]
                feats[i, : len(m)] = (m - mean) / std
            if self.per_utterance:
                feats = frontend.utterance_normalize(feats, lengths).numpy()
            yield feats, lengths

    def references(self, sentences: Mapping[tuple[str, str], str]) -> dict[tuple[str, str], str]:
        """A phone listener's reference phones of {(split, utt): the sentence's text}: the target
        sequence its shards hold for that text (`phone_references`)."""
        from pipeline import phonemes, text

        lowercase = bool(self.data.get("lowercase", True))
        normalized = {key: text.normalize_transcript(t, lowercase) for key, t in sentences.items()}
        voice = self.data.get("phonemes") or phonemes.DEFAULT_VOICE
        try:
            return phone_references(normalized, self.data.get("phones", {}), self.table, voice)
        except ValueError as err:
            raise ValueError(f"the phone listener {self.name}'s reference phones: {err}") from err

    def describe(self) -> dict:
        """Which listener heard a figure: its targets, the model, and how its words are spelled (for a
        phone model the graph, models/asr/hlg.py `GraphDecoder.describe`, and the lexicon)."""
        if not self.phones:
            return {"targets": "chars", "model": self.name, "decoding": "greedy", "lm": None}
        record, graph = self.data.get("phones", {}), self.graph.describe()
        return {
            "targets": "phones",
            "model": self.name,
            "decoding": "greedy phones; words through the graph",
            "lm": graph["lm_kind"],
            "lm_dir": str(self.graph.lm_dir),
            **graph,
            "phones_from": record.get("from", ""),
            "phone_source": record.get("source", "lexicon"),
        }


def listener_table(data: dict, name: str) -> PhoneTable:
    """The phone table of the lexicon a phone model's targets came from (data.json `phones.from`),
    checked to be the one it trained with. FileNotFoundError naming the directory and the fix when it
    is gone; ValueError when its phone set is not the model's output layer, or (targets looked up in
    the lexicon) its files are not the ones the model's shards were made with."""
    from pipeline import phones

    record = data.get("phones") or {}
    source = record.get("from", "")
    fix = (
        "put the dict or lang dir the model's shards were made with (`pipeline.shards --phones-from`) back "
        "there, or give a char model as the listener"
    )
    if not source:
        raise ValueError(f"{name}: a phone model whose data.json names no lexicon (phones.from): train it again")
    if not Path(source).is_dir():
        raise FileNotFoundError(
            f"{source}: no such directory; it is the lexicon the phone listener {name} was trained with "
            f"(data.json phones.from), which its reference phones are built from: {fix}"
        )
    table = phones.open_table(source)
    if list(table.outputs) != list(data["outputs"]):
        raise ValueError(
            f"{source}: its phone set is not the output layer of the phone listener {name} "
            f"(only the lexicon's: {sorted(set(table.outputs) - set(data['outputs']))}, only the model's: "
            f"{sorted(set(data['outputs']) - set(table.outputs))}): {fix}"
        )
    if record.get("source", "lexicon") == "lexicon" and record.get("sha256") not in (None, table.sha256):
        raise ValueError(
            f"{source}: not the lexicon the phone listener {name} was trained with (sha256 {table.sha256}, "
            f"data.json records {record['sha256']}), so its pronunciations may not be the targets: {fix}"
        )
    return table


def phone_references(
    sentences: Mapping[tuple[str, str], str], record: dict, table: PhoneTable, voice: str
) -> dict[tuple[str, str], str]:
    """{(split, utt): phone string} of normalized sentences: the target sequence the shard stage
    (pipeline/shards.py with pipeline/phones.py) stores for that text with the lexicon `table` and
    the source `record` (data.json `phones`) names: espeak-ng's phonemes of the sentence in `voice`
    (source "espeak"), or each word's likeliest pronunciation (source "lexicon"; the words espeak-ng
    filled when the shards had G2P, which filled some). Phone symbols joined by single spaces."""
    from models.asr.phone_evaluation import phone_string
    from pipeline import phonemes, phones

    if record.get("source", "lexicon") == "espeak":
        keys = list(sentences)
        said = phonemes.phonemize([sentences[k] for k in keys], voice)
        ids = phones.ids_from_espeak(dict(zip(keys, said)), table)
    else:
        g2p = bool(record.get("g2p")) or any((record.get("g2p_words") or {}).values())
        ids, _ = phones.ids_from_lexicon(sentences, table, g2p, voice)
    return {key: phone_string(ids[key], table.outputs) for key in sentences}


# What the listener hears, beside the free-running synthesis: the name of its figures and its TSV column
SOURCES = {"synthesis": "", "teacher_forced": "_teacher_forced", "recording": "_recordings", "vocoded": "_vocoded"}


def intelligibility(spoken: list[Spoken], vocabulary: list[str], listener: Listener, split: str, out_dir: Path) -> dict:
    """How well an acoustic model (`listener`) hears the synthesized log-mels, and, to say where what
    it misses is lost, three more sources of the same sentences: the model's teacher-forced output
    (`..._teacher_forced`: the frames it predicts when it is fed the recording, so free-running drift
    is left out), the recordings themselves (`..._recordings`: the judge's own errors, the floor), and
    what a person hears (`..._vocoded`: the synthesized mels through Griffin-Lim as the user gets
    them, analysed again by the feature stage, `audio.vocoded`).

    A char listener: `SPLIT_intelligibility_cer` and `_wer` of the synthesis, the CER of the others
    (`..._cer_teacher_forced`, ...). A phone listener: for each source its greedy PER against the
    targets it trains on (`SPLIT_intelligibility_per`, `..._per_teacher_forced`, ...), and the WER and
    CER of its words through its graph (`..._wer`, `..._cer`, `..._wer_recordings`, ...).
    Writes `SPLIT_intelligibility.tsv`: each sentence, its reference and what was heard of each source."""
    refs = ["".join(vocabulary[t] for t in s.tokens) for s in spoken]
    said = None
    if listener.phones:
        from pipeline import text

        keys = [(split, s.utt_id) for s in spoken]
        found = listener.references({k: text.decode(s.tokens, vocabulary) for k, s in zip(keys, spoken)})
        said = [found[k] for k in keys]
    voices, speakers = [s.voice for s in spoken], [s.speaker for s in spoken]
    # teacher-forced frames follow the recording they are fed, so they are normalized by its speaker
    heard = {
        "synthesis": listener.hear([s.synthesized for s in spoken], voices),
        "teacher_forced": listener.hear([s.teacher_forced for s in spoken], speakers),
        "recording": listener.hear([s.reference for s in spoken], speakers),
        "vocoded": listener.hear(audio.vocoded([s.synthesized for s in spoken]), voices),
    }
    write_heard(out_dir / f"{split}_intelligibility.tsv", spoken, refs, said, heard)
    return intelligibility_metrics({name: heard_rates(refs, said, h) for name, h in heard.items()}, split)


def heard_rates(refs: list[str], said: list[str] | None, heard: dict[str, list[str]]) -> dict:
    """`error_rates` of what a listener heard (`Listener.hear`) against the sentences `refs`; for a
    phone listener (`said`: the reference phone strings) with `per` and `phones` (the reference's
    count) of its greedy phones."""
    from models.asr.scoring import error_rates

    rates = error_rates(refs, heard["words"])
    if said is None:
        return rates
    phone_rates = error_rates(said, heard["phones"])
    return {**rates, "per": phone_rates["wer"], "phones": phone_rates["words"]}


def intelligibility_metrics(rates: dict[str, dict], split: str) -> dict:
    """The figures of `intelligibility` from each source's `heard_rates`."""
    prefix = f"{split}_intelligibility"
    if "per" not in rates["synthesis"]:  # a char listener
        return {
            f"{prefix}_cer": rates["synthesis"]["cer"],
            f"{prefix}_wer": rates["synthesis"]["wer"],
            **{f"{prefix}_cer{SOURCES[name]}": rates[name]["cer"] for name in SOURCES if name != "synthesis"},
        }
    return {f"{prefix}_{kind}{SOURCES[name]}": rates[name][kind] for name in SOURCES for kind in ("per", "wer", "cer")}


def write_heard(path: Path, spoken: list[Spoken], refs: list[str], said: list[str] | None, heard: dict) -> None:
    """`SPLIT_intelligibility.tsv`: utt_id, speaker, voice, reference, then the words heard of each
    source (`asr_on_SOURCE`); for a phone listener also the reference phones after the reference and
    the phones heard after each source's words (`phones_on_SOURCE`)."""
    columns = ["utt_id", "speaker", "voice", "reference"] + ([] if said is None else ["phones_reference"])
    for name in SOURCES:
        columns += [f"asr_on_{name}"] + ([] if said is None else [f"phones_on_{name}"])
    rows = ["\t".join(columns)]
    for i, s in enumerate(spoken):
        fields = [s.utt_id, s.speaker, s.voice, refs[i]] + ([] if said is None else [said[i]])
        for name in SOURCES:
            fields += [heard[name]["words"][i]] + ([] if said is None else [heard[name]["phones"][i]])
        rows.append("\t".join(fields))
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")


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
    if judge is not None:  # which listener heard the intelligibility figures (eval.json; not a number)
        metrics["intelligibility_listener"] = judge.describe()
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
