"""Evaluating the acoustic model: transcripts of a split, greedy and beam search, and their error rates."""

from __future__ import annotations

from pathlib import Path

from models import asr
from models.tasks import AsrTask


def error_rates(references: list[str], hypotheses: list[str]) -> dict:
    """Corpus-level CER and WER: total edits over total reference characters / words.

    Edit distances come from `tf.edit_distance` over character and word sequences.
    """
    import tensorflow as tf

    def edits(split_fn):
        ref = split_fn(tf.constant(references)).to_sparse()
        hyp = split_fn(tf.constant(hypotheses)).to_sparse()
        distance = tf.edit_distance(hyp, ref, normalize=False).numpy()
        return float(distance.sum()), int(
            tf.reduce_sum(tf.cast(split_fn(tf.constant(references)).row_lengths(), tf.int64))
        )

    char_edits, chars = edits(lambda t: tf.strings.unicode_split(t, "UTF-8"))
    word_edits, words = edits(lambda t: tf.strings.split(t))
    return {"cer": char_edits / max(chars, 1), "wer": word_edits / max(words, 1), "utterances": len(references)}


def evaluate_asr(model, vocabulary: list[str], dataset, split: str, out_dir: Path, beam_width: int) -> dict:
    """Transcribes every utterance of `dataset` (the acoustic input pipeline in evaluation mode),
    writes `OUT/{split}_hypotheses.tsv` and returns the split's CER and WER, greedy and beam."""
    rows = []
    for batch in dataset:
        feats, lengths = AsrTask.features(batch), batch["feat_lengths"]
        greedy = asr.transcribe(model, feats, lengths, vocabulary)
        beam = asr.transcribe(model, feats, lengths, vocabulary, beam_width)
        tokens, token_lengths = batch["tokens"].numpy(), batch["token_lengths"].numpy()
        for i, utt in enumerate(batch["utt_id"].numpy()):
            reference = "".join(vocabulary[t] for t in tokens[i, : token_lengths[i]])
            rows.append((utt.decode(), reference, greedy[i], beam[i]))
    rows.sort()
    refs = [r[1] for r in rows]
    greedy_rates = error_rates(refs, [r[2] for r in rows])
    beam_rates = error_rates(refs, [r[3] for r in rows])
    lines = ["utt_id\treference\tgreedy\tbeam"] + ["\t".join(r) for r in rows]
    (out_dir / f"{split}_hypotheses.tsv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return {
        f"{split}_cer": greedy_rates["cer"],
        f"{split}_wer": greedy_rates["wer"],
        f"{split}_cer_beam": beam_rates["cer"],
        f"{split}_wer_beam": beam_rates["wer"],
        f"{split}_utterances": greedy_rates["utterances"],
    }
