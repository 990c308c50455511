"""pipeline/open_text.py: open English sentences normalized into what the voices say, WordNet's
examples read from Debian's wordnet-base, and a user's text file."""

from __future__ import annotations

import json

import pytest

from models.asr.scoring import oov_figures
from pipeline import corpus, open_text


@pytest.mark.parametrize(
    ("written", "spoken"),
    [
        ("the judge set bail at $10,000", "the judge set bail at ten thousand dollars"),
        ("Many people subsist on $1 a day.", "many people subsist on one dollar a day"),
        ("Feb. 29 is an intercalary day", "february twenty nine is an intercalary day"),
        ("the post was created in 1977", "the post was created in nineteen seventy seven"),
        ("the 21st century", "the twenty first century"),
        ("prices rose 3.5% in the 1990s", "prices rose three point five percent in the nineteen nineties"),
        ("the word `dog' is animate", "the word dog is animate"),
        ("a black-and-white TV show?", None),  # an acronym: a voice spells it, the transcript would not
        ("a picture of St. George and the slain dragon", "a picture of saint george and the slain dragon"),
        ("if you don't order dessert I won't either", "if you don't order dessert i won't either"),
        ("World War II", None),
        ("- Peter S. Prescott; ", None),
        ("a x b = b x a", None),
        ("The QE2 will sail tomorrow", None),
        ("café society", None),
    ],
)
def test_normalize_spells_out_what_it_can_and_refuses_the_rest(written, spoken):
    if spoken is None:
        with pytest.raises(open_text.Unspeakable):
            open_text.normalize(written)
    else:
        assert open_text.normalize(written) == spoken


def test_a_typed_sentence_is_always_spoken_leniently():
    typed = "Call Dr. Smith at 5 p.m., the FBI said: café & 20% off!"
    assert open_text.normalize(typed, strict=False) == (
        "call doctor smith at five p m the fbi said cafe and twenty percent off"
    )


def test_sentence_pool_counts_what_it_leaves_out():
    kept, left_out = open_text.sentence_pool(
        ["The ship slipped away.", "the ship slipped away", "FBI agents", "hi", "a x = y", "one two three four"], 3, 4
    )
    assert kept == ["the ship slipped away", "one two three four"]
    assert left_out == {"a repeat": 1, "an acronym": 1, "not 3-4 words": 1, "a symbol": 1}


def test_wordnet_examples_are_tens_of_thousands_of_sentences():
    sentences, source = open_text.load_pool("", 3, 14)
    assert len(sentences) > 30000 and source["sentences"] == len(sentences)
    assert "the ship slipped away in the darkness" in sentences
    assert len({w for s in sentences for w in s.split()}) > 20000
    assert sum(source["left_out"].values()) > 0 and len(source["sha256"]) == 64


def test_missing_wordnet_and_bad_text_files_name_the_fix(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"data.noun.* wordnet-base.*--text grammar"):
        open_text.wordnet_examples(tmp_path)
    with pytest.raises(FileNotFoundError, match="does not exist; name a UTF-8 file"):
        open_text.read_sentences(tmp_path / "nothing.txt")
    (tmp_path / "empty.txt").write_text("\n\n")
    with pytest.raises(ValueError, match="holds no sentences"):
        open_text.read_sentences(tmp_path / "empty.txt")
    (tmp_path / "latin1.txt").write_bytes("caf\xe9\n".encode("latin-1"))
    with pytest.raises(ValueError, match="is not UTF-8"):
        open_text.read_sentences(tmp_path / "latin1.txt")


def test_a_users_text_file_makes_the_corpus_and_is_recorded(tmp_path):
    text = tmp_path / "mine.txt"
    text.write_text("".join(f"my sentence number {i} is here.\n" for i in range(40)) + "FBI agents came in\n")
    out = tmp_path / "corpus"
    corpus.main(["--out", str(out), "--num-utterances", "12", "--engines", "espeak-ng", "--text-file", str(text)])
    summary = json.loads((out / "corpus.json").read_text())
    assert summary["text"]["source"] == str(text) and summary["text"]["left_out"] == {"an acronym": 1}
    assert summary["text"]["sentences"] == 40 and set(summary["oov_rate"]) >= {"train", "dev", "test"}
    assert summary["oov_rate"]["train"] == 0.0
    lines = (out / "train" / "text").read_text().splitlines()
    assert all(" ".join(line.split()[1:]).startswith("my sentence number ") for line in lines)
    text.write_text(text.read_text() + "one more sentence of mine\n")  # a changed file rebuilds the corpus
    corpus.main(["--out", str(out), "--num-utterances", "12", "--engines", "espeak-ng", "--text-file", str(text)])
    assert json.loads((out / "corpus.json").read_text())["text"]["sentences"] == 41


def test_oov_figures_score_the_unheard_words_alone():
    known = {"the", "cat", "sat", "a", "ran"}
    figures = oov_figures(["the cat sat", "a zebra ran"], ["the cat sat", "a zebr ran"], known)
    assert figures == {"oov_rate": 1 / 6, "oov_tokens": 1, "oov_chars": 5, "oov_cer": 1 / 5}
    assert oov_figures(["the cat"], ["the"], known) == {"oov_rate": 0.0, "oov_tokens": 0, "oov_chars": 0}
    assert oov_figures(["the okapi"], ["the"], known)["oov_cer"] == 1.0  # a deleted word: every character
    assert oov_figures(["x"], ["y"], set()) == {}
