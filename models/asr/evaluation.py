"""Evaluating the acoustic model: transcripts of a split, greedy and beam search, and their error rates."""

from __future__ import annotations

from pathlib import Path

from models.asr import network as asr
from models.asr.task import AsrTask


def _counts(pairs: list[tuple[list[str], list[str]]]) -> dict[str, int]:
    """Substitutions, deletions, insertions and reference length summed over (reference, hypothesis) pairs.

    kaldialign wraps Kaldi's own Levenshtein alignment (the one `compute-wer` uses), so the split
    of the edits into the three kinds is Kaldi's too."""
    import kaldialign

    total = {"sub": 0, "del": 0, "ins": 0, "ref": 0, "sentence_errors": 0}
    for ref, hyp in pairs:
        found = kaldialign.edit_distance(ref, hyp)
        for key in ("sub", "del", "ins"):
            total[key] += found[key]
        total["ref"] += len(ref)
        total["sentence_errors"] += found["total"] > 0
    return total


# The counts behind the rates: what shares of a split, scored apart, add up (then `rates_of`).
COUNTS = ("utterances", "chars", "char_sub", "char_del", "char_ins", "words", "word_sub", "word_del", "word_ins")


def rates_of(counts: dict) -> dict:
    """`cer` and `wer` of `COUNTS` (summed over the parts of a split, or of one part)."""
    return {
        "cer": (counts["char_sub"] + counts["char_del"] + counts["char_ins"]) / max(counts["chars"], 1),
        "wer": (counts["word_sub"] + counts["word_del"] + counts["word_ins"]) / max(counts["words"], 1),
    }


def error_rates(references: list[str], hypotheses: list[str]) -> dict:
    """Corpus-level CER and WER, Kaldi-style: (substitutions + deletions + insertions) / reference length.

    Words are the whitespace-separated tokens; characters are every character, spaces included.
    Returns `cer`, `wer`, `utterances`, `sentence_error_rate`, and the counts behind each rate:
    `words`, `word_sub`, `word_del`, `word_ins`, and likewise `chars`, `char_sub`, `char_del`,
    `char_ins`; `compute_wer_lines` prints them as Kaldi's `compute-wer` does.
    """
    if len(references) != len(hypotheses):
        raise ValueError(f"{len(references)} references but {len(hypotheses)} hypotheses: score them in pairs")
    words = _counts([(r.split(), h.split()) for r, h in zip(references, hypotheses)])
    chars = _counts([(list(r), list(h)) for r, h in zip(references, hypotheses)])
    rates = {
        "utterances": len(references),
        "sentence_error_rate": words["sentence_errors"] / max(len(references), 1),
        "sentence_errors": words["sentence_errors"],
    }
    for unit, counts, total in (("word", words, "words"), ("char", chars, "chars")):
        rates[total] = counts["ref"]
        rates.update({f"{unit}_{kind}": counts[kind] for kind in ("sub", "del", "ins")})
    return {**rates_of(rates), **rates}


def compute_wer_lines(rates: dict) -> list[str]:
    """The lines Kaldi's `compute-wer` prints, for the words and (as %CER) the characters of `error_rates`:

    %WER 12.00 [ 30 / 250, 5 ins, 10 del, 15 sub ]
    %CER 2.90 [ 36 / 1240, 6 ins, 12 del, 18 sub ]
    %SER 35.00 [ 7 / 20 ]
    Scored 20 sentences, 0 not present in hyp.
    """
    lines = []
    for name, unit, total in (("WER", "word", "words"), ("CER", "char", "chars")):
        errors = sum(rates[f"{unit}_{kind}"] for kind in ("ins", "del", "sub"))
        lines.append(
            f"%{name} {100.0 * errors / max(rates[total], 1):.2f} [ {errors} / {rates[total]}, "
            f"{rates[f'{unit}_ins']} ins, {rates[f'{unit}_del']} del, {rates[f'{unit}_sub']} sub ]"
        )
    lines.append(
        f"%SER {100.0 * rates['sentence_error_rate']:.2f} [ {rates['sentence_errors']} / {rates['utterances']} ]"
    )
    lines.append(f"Scored {rates['utterances']} sentences, 0 not present in hyp.")
    return lines


def evaluate_asr(model, vocabulary: list[str], dataset, split: str, out_dir: Path, beam_width: int) -> dict:
    """Transcribes every utterance of `dataset` (the acoustic input pipeline in evaluation mode),
    writes `OUT/{split}_hypotheses.tsv`, `OUT/{split}_wer.txt` (Kaldi's `compute-wer` lines) and
    `OUT/{split}_speakers.tsv` (each speaker's error rates, `speaker_rows`), and returns the split's
    CER and WER, greedy and beam, with the substitution, deletion and insertion counts behind them
    (`{split}_word_sub`, ..., `_beam` for beam search)."""
    rows, speakers = [], {}
    for batch in dataset:
        feats, lengths = AsrTask.features(batch), batch["feat_lengths"]
        greedy, beam = asr.transcriptions(model, feats, lengths, vocabulary, (0, beam_width))
        tokens, token_lengths = batch["tokens"].numpy(), batch["token_lengths"].numpy()
        for i, (utt, speaker) in enumerate(zip(batch["utt_id"].numpy(), batch["speaker"].numpy())):
            reference = "".join(vocabulary[t] for t in tokens[i, : token_lengths[i]])
            name = utt.decode()
            rows.append((name, reference, greedy[i], beam[i]))
            speakers[name] = speaker.decode()
    rows.sort()
    (out_dir / f"{split}_speakers.tsv").write_text("\n".join(speaker_rows(rows, speakers)) + "\n", encoding="utf-8")
    refs = [r[1] for r in rows]
    greedy_rates = error_rates(refs, [r[2] for r in rows])
    beam_rates = error_rates(refs, [r[3] for r in rows])
    lines = ["utt_id\treference\tgreedy\tbeam"] + ["\t".join(r) for r in rows]
    (out_dir / f"{split}_hypotheses.tsv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    report = [f"# {split}, greedy"] + compute_wer_lines(greedy_rates)
    report += [f"# {split}, beam search (width {beam_width})"] + compute_wer_lines(beam_rates)
    (out_dir / f"{split}_wer.txt").write_text("\n".join(report) + "\n", encoding="utf-8")
    counts = ("words", "word_sub", "word_del", "word_ins", "chars", "char_sub", "char_del", "char_ins")
    return {
        f"{split}_cer": greedy_rates["cer"],
        f"{split}_wer": greedy_rates["wer"],
        f"{split}_cer_beam": beam_rates["cer"],
        f"{split}_wer_beam": beam_rates["wer"],
        f"{split}_utterances": greedy_rates["utterances"],
        **{f"{split}_{key}": greedy_rates[key] for key in counts},
        **{f"{split}_{key}_beam": beam_rates[key] for key in counts if key not in ("words", "chars")},
    }


def speaker_rows(rows: list[tuple[str, str, str, str]], speakers: dict[str, str]) -> list[str]:
    """`{split}_speakers.tsv`'s lines: each speaker's utterances, characters and greedy and beam CER
    and WER, the worst greedy CER first (a held-out voice the split's total hides shows here).
    `rows`: (utt_id, reference, greedy, beam); `speakers`: utt_id -> speaker."""
    by_speaker: dict[str, list[tuple[str, str, str, str]]] = {}
    for row in rows:
        by_speaker.setdefault(speakers[row[0]], []).append(row)
    table = []
    for speaker, own in by_speaker.items():
        refs = [r[1] for r in own]
        greedy, beam = error_rates(refs, [r[2] for r in own]), error_rates(refs, [r[3] for r in own])
        table.append((speaker, len(own), greedy["chars"], greedy["cer"], beam["cer"], greedy["wer"], beam["wer"]))
    table.sort(key=lambda t: (-t[3], t[0]))
    lines = ["speaker\tutterances\tchars\tcer\tcer_beam\twer\twer_beam"]
    return lines + ["\t".join([s, str(n), str(c), *(f"{v:.4f}" for v in rates)]) for s, n, c, *rates in table]


def evaluate(model, config, data: dict, batches, splits: list[str], cfg, out_dir: Path, listener=None) -> dict:
    """models.evaluate's evaluation of the acoustic model (common/catalog.py): `evaluate_asr` on each
    of `splits` (`batches(split, frames_per_batch)` gives its input); the champion is chosen on the
    first split's CER (dev, when the shards have it)."""
    metrics = {}
    for split in splits:
        dataset = batches(split, cfg.asr_frames_per_batch)
        metrics.update(evaluate_asr(model, data["vocabulary"], dataset, split, out_dir, cfg.beam_width))
    metrics["primary_metric"] = f"{splits[0]}_cer"
    return metrics
