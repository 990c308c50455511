"""Error rates as speech people read them: Kaldi's substitutions, deletions and insertions."""

from __future__ import annotations

import pytest

from models.asr.scoring import compute_wer_lines, error_rates


def test_counts_each_kind_of_edit_as_kaldi_does():
    refs = ["the cat sat on the mat", "hello world", "a b c"]
    hyps = ["the cat sat on mat", "hello there big world", "a b c"]
    rates = error_rates(refs, hyps)
    # "the" deleted; "there" and "big" inserted; nothing substituted.
    assert (rates["word_sub"], rates["word_del"], rates["word_ins"], rates["words"]) == (0, 1, 2, 11)
    assert rates["wer"] == pytest.approx(3 / 11)
    assert rates["sentence_errors"] == 2 and rates["sentence_error_rate"] == pytest.approx(2 / 3)
    substituted = error_rates(["one two three"], ["one too three"])
    assert (substituted["word_sub"], substituted["word_del"], substituted["word_ins"]) == (1, 0, 0)
    # Characters, spaces included: "two" -> "too" is one substitution.
    assert (substituted["char_sub"], substituted["chars"]) == (1, 13)
    assert substituted["cer"] == pytest.approx(1 / 13)


def test_edge_cases_keep_their_meaning():
    assert error_rates(["a b"], [""])["wer"] == 1.0  # everything deleted
    assert error_rates(["a b"], ["a b c d"])["wer"] == 1.0  # two insertions over two words
    assert error_rates([], [])["wer"] == 0.0
    with pytest.raises(ValueError, match="in pairs"):
        error_rates(["a"], [])


def test_compute_wer_lines_read_like_kaldi():
    lines = compute_wer_lines(error_rates(["the cat sat on the mat", "hello world"], ["the cat sat on mat", "hello"]))
    assert lines[0] == "%WER 25.00 [ 2 / 8, 0 ins, 2 del, 0 sub ]"
    assert lines[1].startswith("%CER ") and lines[1].endswith("0 ins, 10 del, 0 sub ]")
    assert lines[2:] == ["%SER 100.00 [ 2 / 2 ]", "Scored 2 sentences, 0 not present in hyp."]
