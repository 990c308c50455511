"""pipeline/lexicon.py: a Kaldi dict dir read, validated, written back, and G2P for missing words."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from pipeline import lexicon as lexlib
from pipeline import phonemes

DICT = Path(__file__).parent / "fixtures" / "dict_tiny"


def copy_dict(tmp_path: Path) -> Path:
    out = tmp_path / "dict"
    shutil.copytree(DICT, out)
    return out


def test_reads_the_handwritten_dict_dir():
    lexicon = lexlib.read_dict_dir(DICT)
    assert lexicon.nonsilence_phones == ("AA", "AE", "AH", "DH", "EY", "IY", "K", "M", "N", "S", "T")
    assert lexicon.silence_phones == ("SIL", "SPN")
    assert lexicon.optional_silence == "SIL"
    assert lexicon.phones == lexicon.nonsilence_phones + ("SIL", "SPN")
    assert lexicon.words == ("<UNK>", "a", "cat", "mat", "on", "sat", "the")
    assert lexicon.pronunciations("the") == (("DH", "AH"), ("DH", "IY"))
    assert lexicon.pronunciations("<UNK>") == (("SPN",),)
    assert [e.prob for e in lexicon.entries if e.word == "a"] == [1.0, 0.4]


def test_phone_table_is_the_phone_set_not_what_the_lexicon_uses(tmp_path):
    # ZH is in the phone set and in no pronunciation: it still has its place in the table.
    path = copy_dict(tmp_path)
    (path / lexlib.NONSILENCE).write_text((DICT / lexlib.NONSILENCE).read_text() + "ZH\n")
    assert lexlib.read_dict_dir(path).phones[-3:] == ("ZH", "SIL", "SPN")


def test_write_then_read_round_trip(tmp_path):
    lexicon = lexlib.read_dict_dir(DICT)
    lexlib.write_dict_dir(lexicon, tmp_path / "out")
    assert lexlib.read_dict_dir(tmp_path / "out") == lexicon


def test_lexicon_txt_without_probabilities(tmp_path):
    path = copy_dict(tmp_path)
    (path / lexlib.LEXICONP).unlink()
    (path / lexlib.LEXICON).write_text("cat K AE T\nthe DH AH\nthe DH IY\n")
    lexicon = lexlib.read_dict_dir(path)
    assert lexicon.pronunciations("the") == (("DH", "AH"), ("DH", "IY"))
    assert {e.prob for e in lexicon.entries} == {1.0}


@pytest.mark.parametrize(
    "line, message",
    [
        ("dog 1.0 D AO G\n", r"lexiconp\.txt:10: 'dog' has phone\(s\) D AO G outside the phone set; add them to"),
        ("dog x D\n", r"lexiconp\.txt:10: 'dog' has probability 'x'; it must be a number in \(0, 1\]"),
        ("dog 0 K\n", r"lexiconp\.txt:10: 'dog' has probability '0'"),
        ("dog 1.5 K\n", r"lexiconp\.txt:10: 'dog' has probability '1.5'"),
        ("dog 1.0\n", r"lexiconp\.txt:10: 'dog' has no phones"),
        ("#0 1.0 K\n", r"lexiconp\.txt:10: word '#0' is reserved"),
    ],
)
def test_a_bad_lexicon_line_names_the_file_the_line_and_the_fix(tmp_path, line, message):
    path = copy_dict(tmp_path)
    with open(path / lexlib.LEXICONP, "a") as handle:
        handle.write(line)
    with pytest.raises(ValueError, match=message):
        lexlib.read_dict_dir(path)


def test_an_empty_lexicon_is_an_error(tmp_path):
    path = copy_dict(tmp_path)
    (path / lexlib.LEXICONP).write_text("\n")
    with pytest.raises(ValueError, match=r"lexiconp\.txt: the lexicon is empty; give one `WORD PROB PHONE\.\.\.`"):
        lexlib.read_dict_dir(path)


@pytest.mark.parametrize("name", [lexlib.NONSILENCE, lexlib.SILENCE, lexlib.OPTIONAL_SILENCE])
def test_a_missing_phone_file_is_named(tmp_path, name):
    path = copy_dict(tmp_path)
    (path / name).unlink()
    with pytest.raises(FileNotFoundError, match=rf"{name}: no such file"):
        lexlib.read_dict_dir(path)


def test_a_missing_lexicon_or_dir_is_named(tmp_path):
    path = copy_dict(tmp_path)
    (path / lexlib.LEXICONP).unlink()
    with pytest.raises(FileNotFoundError, match=r"neither lexiconp\.txt nor lexicon\.txt"):
        lexlib.read_dict_dir(path)
    with pytest.raises(FileNotFoundError, match=r"nowhere: no such directory"):
        lexlib.read_dict_dir(tmp_path / "nowhere")


def test_bad_phone_files(tmp_path):
    path = copy_dict(tmp_path)
    (path / lexlib.OPTIONAL_SILENCE).write_text("NSN\n")
    with pytest.raises(ValueError, match=r"optional_silence\.txt:1: 'NSN' is not in silence_phones\.txt"):
        lexlib.read_dict_dir(path)
    (path / lexlib.OPTIONAL_SILENCE).write_text("SIL\n")
    (path / lexlib.SILENCE).write_text("SIL\nSPN\nK\n")
    with pytest.raises(ValueError, match=r"K in both nonsilence_phones\.txt and silence_phones\.txt"):
        lexlib.read_dict_dir(path)
    (path / lexlib.SILENCE).write_text("SIL\n#1\n")
    with pytest.raises(ValueError, match=r"silence_phones\.txt:2: phone '#1' is reserved"):
        lexlib.read_dict_dir(path)


def test_without_g2p_a_word_with_no_pronunciation_is_named():
    lexicon = lexlib.read_dict_dir(DICT)
    with pytest.raises(ValueError, match=r"train/text: no pronunciation for dog zebra; add them to the lexicon"):
        lexlib.fill_missing(lexicon, ["the", "zebra", "cat", "dog"], use_g2p=False, source="train/text")
    assert lexlib.fill_missing(lexicon, ["the", "cat"], use_g2p=False) == (lexicon, ())


def test_g2p_fills_missing_words_with_espeak_ng_and_counts_them():
    spoken = phonemes.phonemize(["cat", "dog", "fish"])
    phone_set = tuple(dict.fromkeys(p for word in spoken for p in word if p != phonemes.WORD))
    lexicon = lexlib.Lexicon((lexlib.Entry("cat", tuple(spoken[0])),), phone_set, ("SIL",), "SIL")
    filled, words = lexlib.fill_missing(lexicon, ["cat", "fish", "dog", "fish"], use_g2p=True)
    assert words == ("dog", "fish")
    assert filled.pronunciations("dog") == (tuple(spoken[1]),)
    assert filled.pronunciations("fish") == (tuple(spoken[2]),)
    assert filled.phones == lexicon.phones  # G2P never grows the phone table


def test_g2p_phones_outside_the_phone_set_are_an_error():
    # dict_tiny's phones are ARPAbet; espeak-ng's symbols for "dog" are not among them.
    lexicon = lexlib.read_dict_dir(DICT)
    with pytest.raises(
        ValueError, match=r"lm\.arpa: espeak-ng -v en-us says 'dog' as .* is not in the lexicon's phone"
    ):
        lexlib.fill_missing(lexicon, ["dog"], use_g2p=True, source="lm.arpa")
