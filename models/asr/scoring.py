"""Scoring transcripts Kaldi-style: CER, WER and the counts behind them (what the parts of a split,
scored apart, add up to: the dev evaluation sums them over batches and ranks)."""

from __future__ import annotations


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


def oov_figures(references: list[str], hypotheses: list[str], known: set[str]) -> dict:
    """How the words that `known` (the training transcripts' words) lacks were heard.

    `oov_rate`: the share of the references' word tokens not in `known`; `oov_cer`: the character
    error rate of those words alone, each scored against the hypothesis word Kaldi's word alignment
    pairs it with (a deleted word counts all its characters; a word split in two is scored against
    the part aligned with it, so the rate is an estimate of how the unknown words are spelled, not a
    sum that adds up to the split's CER); `oov_tokens`, `oov_chars`: the counts behind them (no
    `oov_cer` without such words). Empty `known` (a model that did not record its words): {}."""
    import kaldialign

    if not known:
        return {}
    tokens = oov = chars = errors = 0
    for ref, hyp in zip(references, hypotheses, strict=True):
        words = ref.split()
        tokens += len(words)
        if all(w in known for w in words):
            continue
        for r, h in kaldialign.align(words, hyp.split(), "\0"):
            if r == "\0" or r in known:
                continue
            oov += 1
            chars += len(r)
            errors += kaldialign.edit_distance(list(r), [] if h == "\0" else list(h))["total"]
    figures = {"oov_rate": oov / max(tokens, 1), "oov_tokens": oov, "oov_chars": chars}
    return figures | ({"oov_cer": errors / chars} if chars else {})
