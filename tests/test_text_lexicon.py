"""pipeline/text_lexicon.py: a text's words in espeak-ng's phonemes, alone and in the text's own contexts."""

from __future__ import annotations

from collections import Counter

import pytest

from pipeline import lexicon as lexlib
from pipeline import phonemes
from pipeline import text_lexicon as textlex

ALONE = {"a": ("a#",), "cup": ("k", "'V", "p"), "of": ("'V", "v"), "the": ("D", "'@2"), "tea": ("t", "'i:")}
SENTENCES = [
    "the ship slipped away in the darkness",
    "a cup of tea",
    "one of the best",
    "the cat sat on the mat",
    "most of the time",
]


def test_merged_phoneme_words_align_to_runs_of_text_words():
    spoken = [("a#",), ("k", "'V", "p"), ("V", "v", "D", "@2"), ("t", "'i:")]
    assert textlex.segment(["a", "cup", "of", "the", "tea"], spoken, ALONE) == [(0, 1), (1, 2), (2, 4), (4, 5)]
    assert textlex.segment(["a", "cup"], [("a#",)] * 3, ALONE) is None  # no word for the third


def test_variants_come_from_one_to_one_words_and_merged_runs_give_none():
    sentences = ["a cup of tea", "a cup of the tea", "of tea"]
    spoken = [
        ["a#", " ", "k", "'V", "p", " ", "V", "v", " ", "t", "'i:"],
        ["a#", " ", "k", "'V", "p", " ", "V", "v", "D", "@2", " ", "t", "'i:"],  # "of the" as one
        ["'V", " ", "v", " ", "t", "'i:"],  # more phoneme words than words: no variants
    ]
    variants, stats = textlex.count_variants(sentences, spoken, ALONE, fold_stress=False)
    assert variants == Counter(
        {("a", ("a#",)): 2, ("cup", ("k", "'V", "p")): 2, ("of", ("V", "v")): 1, ("tea", ("t", "'i:")): 2}
    )
    assert stats == Counter(
        sentences_one_to_one=1, sentences_merged=1, merged_runs=1, words_in_merged_runs=2, sentences_without_variants=1
    )
    folded, _ = textlex.count_variants(sentences[:1], spoken[:1], ALONE, fold_stress=True)
    assert ("cup", ("k", "V", "p")) in folded


def test_a_stressed_symbol_alone_maps_to_its_unstressed_form_in_the_phone_set():
    stats: Counter = Counter()
    assert textlex.fit_alone(("D", "'@2"), {"D", "@2"}, stats) == ("D", "@2")
    assert textlex.fit_alone(("'aI",), {"D", "@2"}, stats) == ("'aI",)  # no aI either: kept, and counted
    assert stats == Counter(alone_symbols_unstressed=1, alone_symbols_outside_context=1)


def test_probabilities_are_counts_over_the_likeliest_with_the_alone_pronunciation_counted_once():
    variants = Counter({("the", ("D", "@2")): 3, ("the", ("D", "i:")): 1})
    entries, unspelled = textlex.to_entries(["the", "zzz"], variants, {"the": ("D", "i:"), "zzz": ()}, 0.0)
    assert [(e.phones, e.prob) for e in entries] == [(("D", "@2"), 1.0), (("D", "i:"), 2 / 3)]
    assert unspelled == ["zzz"]
    pruned, _ = textlex.to_entries(["the"], variants, {"the": ("D", "i:")}, 0.9)
    assert [e.phones for e in pruned] == [("D", "@2")]


@pytest.fixture(scope="module")
def built():
    return textlex.lexicon_for_text(SENTENCES, textlex.TextLexiconConfig(), show_progress=False)


def test_the_lexicon_holds_only_the_texts_contexts_and_each_word_alone(built):
    lexicon, record = built
    spoken = phonemes.phonemize(SENTENCES)
    in_text = {p for symbols in spoken for p in textlex.phone_words(symbols, False)}
    vocabulary = sorted({w for s in SENTENCES for w in s.split()})
    assert lexicon.words == tuple(vocabulary)
    alone = dict(zip(vocabulary, (tuple(p for p in s if p != " ") for s in phonemes.phonemize(vocabulary))))
    reference = {p for word in in_text for p in word}
    for entry in lexicon.entries:
        assert entry.phones in in_text or entry.phones == textlex.fit_alone(alone[entry.word], reference, Counter())
    # "the" alone is D '@2; in running speech D @2: the stressed symbol never reaches the phone set.
    assert "'@2" not in lexicon.phones and ("D", "@2") in lexicon.pronunciations("the")
    assert record["alone_symbols_unstressed"] >= 1
    assert set(textlex.COUNTS) <= set(record) and record["sentences_without_variants"] == 0  # zeros are recorded
    assert record["sentences_merged"] >= 1 and record["sentences"] == len(SENTENCES)  # "of the" runs together
    # the phone set: every symbol of the running speech (merged words' too) and of the pronunciations
    assert lexicon.phones == (*sorted(reference | {p for e in lexicon.entries for p in e.phones}), "SIL")
    assert {max(e.prob for e in lexicon.entries if e.word == w) for w in vocabulary} == {1.0}


def test_folded_stress_leaves_no_stress_mark_in_the_phone_set():
    lexicon, _ = textlex.lexicon_for_text(SENTENCES[:2], textlex.TextLexiconConfig(fold_stress=True), False)
    assert not [p for p in lexicon.nonsilence_phones if p[0] in textlex.STRESS]
    assert ("k", "V", "p") in lexicon.pronunciations("cup")


def test_the_cli_writes_a_dict_dir_that_reads_back_and_a_rerun_does_nothing(built, tmp_path, capsys):
    text = tmp_path / "lm_text.txt"
    text.write_text("\n".join(SENTENCES) + "\n")
    out = tmp_path / "dict"
    assert textlex.main(["--text", str(text), "--out", str(out), "--no-progress"]) == 0
    assert "wrote" in capsys.readouterr().out
    lexicon = lexlib.read_dict_dir(out)
    assert lexicon.words == built[0].words and lexicon.phones == built[0].phones
    assert textlex.main(["--text", str(text), "--out", str(out), "--no-progress"]) == 0
    assert "up to date" in capsys.readouterr().out
    assert textlex.main(["--text", str(tmp_path / "none.txt"), "--out", str(out)]) == 1
    assert "none.txt: no such file; give the LM text" in capsys.readouterr().err
