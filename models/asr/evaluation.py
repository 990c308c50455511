"""Evaluating the acoustic model: transcripts of a split, greedy and beam search, and their error rates
(a phone model's: models/asr/phone_evaluation.py)."""

from __future__ import annotations

from pathlib import Path

from models.asr import lm
from models.asr import network as asr
from models.asr.phone_evaluation import evaluate_phones
from models.asr.scoring import compute_wer_lines, error_rates, oov_figures
from models.asr.task import AsrTask

# the counts behind an error rate, as scoring.error_rates gives them
COUNTED = ("words", "word_sub", "word_del", "word_ins", "chars", "char_sub", "char_del", "char_ins")


def evaluate_asr(
    model,
    vocabulary: list[str],
    dataset,
    split: str,
    out_dir: Path,
    beam_width: int,
    known_words: set[str] = frozenset(),
    lm_decoder=None,
) -> dict:
    """Transcribes every utterance of `dataset` (the acoustic input pipeline in evaluation mode),
    writes `OUT/{split}_hypotheses.tsv`, `OUT/{split}_wer.txt` (Kaldi's `compute-wer` lines) and
    `OUT/{split}_speakers.tsv` (each speaker's error rates, `speaker_rows`), and returns the split's
    CER and WER, greedy and beam, with the substitution, deletion and insertion counts behind them
    (`{split}_word_sub`, ..., `_beam` for beam search); with `known_words` (the model's training
    words), the share of the split's words outside them and their greedy CER (`{split}_oov_rate`,
    `{split}_oov_cer`: scoring.oov_figures). With `lm_decoder` (models/asr/lm.py), the beam search
    with the word LM too (`_lm`), and beside it how well the LM's text knows the split
    (`{split}_lm_oov_rate`, `{split}_lm_3gram_hit`)."""
    rows, speakers = transcribe_split(model, vocabulary, dataset, beam_width, lm_decoder)
    (out_dir / f"{split}_speakers.tsv").write_text("\n".join(speaker_rows(rows, speakers)) + "\n", encoding="utf-8")
    refs = [r[1] for r in rows]
    greedy_rates = error_rates(refs, [r[2] for r in rows])
    beam_rates = error_rates(refs, [r[3] for r in rows])
    header = ["utt_id", "reference", "greedy", "beam"] + (["beam_lm"] if lm_decoder else [])
    lines = ["\t".join(header)] + ["\t".join(r[: len(header)]) for r in rows]
    (out_dir / f"{split}_hypotheses.tsv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    report = [f"# {split}, greedy"] + compute_wer_lines(greedy_rates)
    report += [f"# {split}, beam search (width {beam_width})"] + compute_wer_lines(beam_rates)
    with_lm = {}
    if lm_decoder:
        lm_report, with_lm = lm_figures(split, refs, [r[4] for r in rows], lm_decoder)
        report += lm_report
    (out_dir / f"{split}_wer.txt").write_text("\n".join(report) + "\n", encoding="utf-8")
    oov = oov_figures(refs, [r[2] for r in rows], set(known_words))
    return {
        **with_lm,
        **{f"{split}_{key}": value for key, value in oov.items()},
        f"{split}_cer": greedy_rates["cer"],
        f"{split}_wer": greedy_rates["wer"],
        f"{split}_cer_beam": beam_rates["cer"],
        f"{split}_wer_beam": beam_rates["wer"],
        f"{split}_utterances": greedy_rates["utterances"],
        **{f"{split}_{key}": greedy_rates[key] for key in COUNTED},
        **{f"{split}_{key}_beam": beam_rates[key] for key in COUNTED if key not in ("words", "chars")},
    }


def transcribe_split(model, vocabulary: list[str], dataset, beam_width: int, lm_decoder=None):
    """(rows, speakers) of every utterance of `dataset`, sorted by utterance id: a row is (utt_id,
    reference, greedy, beam of `beam_width`, beam with `lm_decoder`'s word LM or None); `speakers`
    maps utt_id -> speaker."""
    rows, speakers = [], {}
    for batch in dataset:
        feats, lengths = AsrTask.features(batch), batch["feat_lengths"]
        logits, out_lengths = asr.forward(model, feats, lengths)
        greedy, beam = asr.decode_logits(logits, out_lengths, vocabulary, (0, beam_width))
        with_lm = lm_decoder.decode(lm.log_probs_of(logits, out_lengths)) if lm_decoder else [None] * len(greedy)
        tokens, token_lengths = batch["tokens"].numpy(), batch["token_lengths"].numpy()
        for i, (utt, speaker) in enumerate(zip(batch["utt_id"].numpy(), batch["speaker"].numpy())):
            reference = "".join(vocabulary[t] for t in tokens[i, : token_lengths[i]])
            name = utt.decode()
            rows.append((name, reference, greedy[i], beam[i], with_lm[i]))
            speakers[name] = speaker.decode()
    rows.sort()
    return rows, speakers


def lm_figures(split: str, refs: list[str], hypotheses: list[str], lm_decoder) -> tuple[list[str], dict]:
    """The `compute-wer` lines and the `_lm` metrics of the beam search with the word LM, and how well
    the LM's text knows the split's references (`lm_decoder.coverage`)."""
    rates = error_rates(refs, hypotheses)
    s = lm_decoder.settings
    title = f"# {split}, beam search (width {s.beam_width}) with the word LM"
    report = [f"{title} (weight {s.weight}, word bonus {s.word_bonus})"] + compute_wer_lines(rates)
    metrics = {
        f"{split}_cer_lm": rates["cer"],
        f"{split}_wer_lm": rates["wer"],
        **{f"{split}_{key}_lm": rates[key] for key in COUNTED if key not in ("words", "chars")},
        **{f"{split}_{key}": value for key, value in lm_decoder.coverage(refs).items()},
    }
    return report, metrics


def speaker_rows(rows: list[tuple], speakers: dict[str, str]) -> list[str]:
    """`{split}_speakers.tsv`'s lines: each speaker's utterances, characters and greedy and beam CER
    and WER, the worst greedy CER first (a held-out voice the split's total hides shows here).
    `rows`: (utt_id, reference, greedy, beam, ...); `speakers`: utt_id -> speaker."""
    by_speaker: dict[str, list[tuple]] = {}
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
    """models.evaluate's evaluation of the acoustic model (common/catalog.py): on each of `splits`
    (`batches(split, frames_per_batch)` gives its input), `evaluate_asr` for a char model, and for a
    phone model models/asr/phone_evaluation.py's `evaluate_phones`, its words through its graph. The
    champion is chosen on the first split's (dev, when the shards have it) CER for a char model, and
    WER of the words through the graph for a phone model."""
    metrics = {}
    decoder = lm.choose(data, cfg.lm, cfg.no_lm)
    if decoder:
        metrics.update(decoder.describe())
    phones = lm.targets_of(data) == "phones"
    for split in splits:
        dataset = batches(split, cfg.frames_per_batch)
        known = set(data.get("words", ()))
        if phones:
            metrics.update(evaluate_phones(model, data, dataset, split, out_dir, cfg.beam_width, decoder, known))
        else:
            vocabulary = data["vocabulary"]
            metrics.update(evaluate_asr(model, vocabulary, dataset, split, out_dir, cfg.beam_width, known, decoder))
    metrics["primary_metric"] = f"{splits[0]}_wer_lm" if phones else f"{splits[0]}_cer"
    return metrics
