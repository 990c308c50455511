"""Evaluating a phone model (its data record's `targets: phones`): its phones, greedy and by beam
search, against the shards' phone targets, and its words through its decoding graph (models/asr/hlg.py
`GraphDecoder`) against the transcripts' words.

A phone string is the phone symbols joined by single spaces, so the word error rate of phone strings
is the phone error rate: `{split}_per`, `{split}_per_beam`, and the counts behind them named as the
char model's word counts are with `phone` for `word` (`{split}_phones`, `{split}_phone_sub`, ...,
`_beam`). The words through the graph have the names of the char model's figures with its word LM
(`{split}_wer_lm`, `{split}_cer_lm`, `{split}_word_sub_lm`, ...), so that a report sets a char model
with its LM beside a phone model through its graph; beside them the share of the split's words the
graph cannot spell (`{split}_lm_oov_rate`) and the graph search's real-time factor on one thread
(`{split}_decode_rtf_lm`: its seconds per second of audio, the forward pass not counted).
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from models.asr import lm
from models.asr import network as asr
from models.asr.scoring import compute_wer_lines, error_rates, oov_figures
from models.asr.task import AsrTask

HEADER = ("utt_id", "reference", "phones_reference", "greedy", "beam", "words")  # {split}_hypotheses.tsv
_KINDS = ("sub", "del", "ins")


def phone_string(ids, outputs) -> str:
    """Phone ids (ids into the output layer; 0, the blank, left out) -> the symbols joined by spaces."""
    return " ".join(outputs[int(i)] for i in ids if int(i) > 0)


def transcribe_split(model, data: dict, dataset, beam_width: int, graph) -> tuple[list[tuple], dict, dict]:
    """(rows, speakers, timing) of a split: a row per utterance, `HEADER`'s fields, sorted; utt_id ->
    speaker; the graph search's seconds and the audio's (`decode_seconds`, `audio_seconds`)."""
    outputs, vocabulary = data["outputs"], data["vocabulary"]
    frame_seconds = float((data.get("features") or {}).get("frame_shift_ms", 10.0)) / 1000.0
    rows, speakers, timing = [], {}, {"decode_seconds": 0.0, "audio_seconds": 0.0}
    for batch in dataset:
        lengths = batch["feat_lengths"]
        logits, out_lengths = asr.forward(model, AsrTask.features(batch), lengths)  # [B, T', outputs], [B]
        greedy = asr.greedy_decode(logits.numpy(), out_lengths.numpy())
        beam = asr.beam_decode(logits, out_lengths, beam_width) if beam_width else greedy
        log_probs = lm.log_probs_of(logits, out_lengths)
        started = time.perf_counter()
        words = graph.decode(log_probs)
        timing["decode_seconds"] += time.perf_counter() - started
        timing["audio_seconds"] += float(np.sum(lengths)) * frame_seconds
        tokens, token_lengths = batch["tokens"].numpy(), batch["token_lengths"].numpy()
        phones, phone_lengths = batch["phones"].numpy(), batch["phone_lengths"].numpy()
        for i, (utt, speaker) in enumerate(zip(batch["utt_id"].numpy(), batch["speaker"].numpy())):
            reference = "".join(vocabulary[t] for t in tokens[i, : token_lengths[i]])
            said = phone_string(phones[i, : phone_lengths[i]], outputs)
            rows.append(
                (utt.decode(), reference, said, *(phone_string(h[i], outputs) for h in (greedy, beam)), words[i])
            )
            speakers[rows[-1][0]] = speaker.decode()
    rows.sort()
    return rows, speakers, timing


def evaluate_phones(
    model, data: dict, dataset, split: str, out_dir: Path, beam_width: int, graph, known_words=frozenset()
) -> dict:
    """Transcribes every utterance of `dataset` (the acoustic input pipeline in evaluation mode, with
    the shards' `phones`), writes `OUT/{split}_hypotheses.tsv` (`HEADER`), `OUT/{split}_wer.txt`
    (Kaldi's `compute-wer` lines: %PER of the phones, %WER and %CER of the words) and
    `OUT/{split}_speakers.tsv`, and returns the split's figures (the module docstring); with
    `known_words` (the training transcripts' words), the share of the split's words outside them and
    how the graph's words spelled them (`{split}_oov_rate`, `{split}_oov_cer`: scoring.oov_figures)."""
    rows, speakers, timing = transcribe_split(model, data, dataset, beam_width, graph)
    column = {name: [r[i] for r in rows] for i, name in enumerate(HEADER)}
    per = error_rates(column["phones_reference"], column["greedy"])
    per_beam = error_rates(column["phones_reference"], column["beam"])
    words = error_rates(column["reference"], column["words"])
    s = graph.settings
    report = [f"# {split}, greedy phones"] + per_lines(per)
    report += [f"# {split}, phones by beam search (width {beam_width})"] + per_lines(per_beam)
    report += [
        f"# {split}, words through the graph (acoustic scale {s.acoustic_scale}, word penalty {s.word_penalty})"
    ] + compute_wer_lines(words)
    (out_dir / f"{split}_wer.txt").write_text("\n".join(report) + "\n", encoding="utf-8")
    lines = ["\t".join(HEADER)] + ["\t".join(r) for r in rows]
    (out_dir / f"{split}_hypotheses.tsv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    (out_dir / f"{split}_speakers.tsv").write_text("\n".join(speaker_rows(rows, speakers)) + "\n", encoding="utf-8")
    oov = oov_figures(column["reference"], column["words"], set(known_words))
    return {
        f"{split}_per": per["wer"],
        f"{split}_per_beam": per_beam["wer"],
        f"{split}_utterances": per["utterances"],
        f"{split}_phones": per["words"],
        **{f"{split}_phone_{k}": per[f"word_{k}"] for k in _KINDS},
        **{f"{split}_phone_{k}_beam": per_beam[f"word_{k}"] for k in _KINDS},
        f"{split}_wer_lm": words["wer"],
        f"{split}_cer_lm": words["cer"],
        f"{split}_words": words["words"],
        f"{split}_chars": words["chars"],
        **{f"{split}_{unit}_{k}_lm": words[f"{unit}_{k}"] for unit in ("word", "char") for k in _KINDS},
        **{f"{split}_{key}": value for key, value in graph.coverage(column["reference"]).items()},
        f"{split}_decode_rtf_lm": timing["decode_seconds"] / max(timing["audio_seconds"], 1e-9),
        **{f"{split}_{key}": value for key, value in oov.items()},
    }


def per_lines(rates: dict) -> list[str]:
    """Kaldi's `compute-wer` lines of `error_rates` over phone strings, its %WER named %PER (the
    characters of phone strings mean nothing, so no %CER)."""
    lines = compute_wer_lines(rates)
    return [line.replace("%WER", "%PER", 1) for line in lines if not line.startswith("%CER")]


def speaker_rows(rows: list[tuple], speakers: dict[str, str]) -> list[str]:
    """`{split}_speakers.tsv`'s lines for a phone model: each speaker's utterances, reference phones,
    greedy and beam PER, reference words and the WER and CER through the graph, the worst WER first.
    `rows`: `HEADER`'s fields; `speakers`: utt_id -> speaker."""
    by_speaker: dict[str, list[tuple]] = {}
    for row in rows:
        by_speaker.setdefault(speakers[row[0]], []).append(row)
    table = []
    for speaker, own in by_speaker.items():
        said = [r[2] for r in own]
        greedy, beam = error_rates(said, [r[3] for r in own]), error_rates(said, [r[4] for r in own])
        words = error_rates([r[1] for r in own], [r[5] for r in own])
        counts = (len(own), greedy["words"], words["words"])
        table.append((speaker, counts, (greedy["wer"], beam["wer"], words["wer"], words["cer"])))
    table.sort(key=lambda t: (-t[2][2], t[0]))
    lines = ["speaker\tutterances\tphones\tper\tper_beam\twords\twer_lm\tcer_lm"]
    for speaker, (n, phones, words), (per, per_beam, wer, cer) in table:
        fields = [speaker, str(n), str(phones), f"{per:.4f}", f"{per_beam:.4f}", str(words), f"{wer:.4f}", f"{cer:.4f}"]
        lines.append("\t".join(fields))
    return lines
