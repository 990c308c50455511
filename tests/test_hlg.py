"""pipeline/lang.py builds HLG from a dict dir or a Kaldi lang dir; models/asr/hlg.py decodes through it."""

from __future__ import annotations

import shutil
from pathlib import Path

import kaldifst
import numpy as np
import pytest

from common import fsutil
from models.asr import hlg
from pipeline import lang as langstage
from pipeline import lexicon as lexlib
from pipeline import phonemes

FIXTURES = Path(__file__).parent / "fixtures"
DICT, LANG, ARPA = FIXTURES / "dict_tiny", FIXTURES / "lang_tiny", FIXTURES / "lm_tiny.arpa"
CONFIG = langstage.LangConfig()


@pytest.fixture(scope="module")
def dict_graph(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("graphs") / "dict"
    langstage.build(DICT, ARPA, out, CONFIG, kind="dict")
    return out


@pytest.fixture(scope="module")
def lang_graph(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("graphs") / "lang"
    langstage.build(LANG, ARPA, out, CONFIG, kind="lang")
    return out


def one_hot(graph: hlg.HlgGraph, phones: str, frames: int = 2) -> np.ndarray:
    """[frames, outputs] log-posteriors: each phone `frames` frames, then a blank frame."""
    ids: list[int] = []
    for phone in phones.split():
        ids += [graph.tokens.index(phone)] * frames + [0]
    log_probs = np.full((len(ids), graph.num_outputs), -30.0, np.float32)
    log_probs[np.arange(len(ids)), ids] = 0.0
    return log_probs


def test_tables_from_the_dict_dir(dict_graph):
    tokens = langstage.read_table(dict_graph / langstage.TOKENS)
    lexicon = lexlib.read_dict_dir(DICT)
    assert tokens == ("<blk>", *lexicon.phones, "#0")  # no homophones or prefixes in dict_tiny: #0 alone
    words = langstage.read_table(dict_graph / langstage.WORDS)
    assert words == ("<eps>", *lexicon.words, "#0", "<s>", "</s>")
    record = fsutil.read_json(dict_graph / langstage.RECORD)
    assert record["num_outputs"] == len(lexicon.phones) + 1
    assert record["lm_words_unspelled"] == 1  # "dog": in the ARPA, not in the lexicon
    for name in ("L.fst", "L_disambig.fst", "G.fst", "HLG.fst", "lexicon_disambig.txt"):
        assert (dict_graph / name).is_file()


def test_add_disambig_marks_homophones_and_prefixes():
    entries = [
        lexlib.Entry("two", ("T", "UW")),
        lexlib.Entry("too", ("T", "UW")),
        lexlib.Entry("tool", ("T", "UW", "L")),
    ]
    marked, top = langstage.add_disambig(entries)
    assert [e.phones for e in marked] == [("T", "UW", "#1"), ("T", "UW", "#2"), ("T", "UW", "L")]
    assert top == 2
    lexicon = lexlib.Lexicon(tuple(entries), ("T", "UW", "L"), ("SIL",), "SIL")
    assert langstage.dict_tables(lexicon, top).tokens[-3:] == ("#0", "#1", "#2")


def test_one_hot_posteriors_decode_to_their_words(dict_graph):
    graph = hlg.load_graph(dict_graph, 14)
    decoder = hlg.HlgDecoder(graph)
    assert decoder.decode(one_hot(graph, "DH AH K AE T S AE T AA N DH AH M AE T")) == [
        "the",
        "cat",
        "sat",
        "on",
        "the",
        "mat",
    ]
    # the second pronunciation of "the", and the optional silence between words
    assert decoder.decode(one_hot(graph, "DH IY K AE T SIL S AE T")) == ["the", "cat", "sat"]
    assert decoder.decode(one_hot(graph, "EY K AE T")) == ["a", "cat"]  # "a" as EY, its second
    assert decoder.decode(np.zeros((0, 14), np.float32)) == []


def test_the_kaldi_lang_dir_keeps_position_dependent_phones_and_its_l(lang_graph):
    phones = langstage.read_table(LANG / "phones.txt")
    tokens = langstage.read_table(lang_graph / langstage.TOKENS)
    outputs = [p for p in phones if p != "<eps>" and not p.startswith("#")]
    assert tokens == ("<blk>", *outputs, "#0", "#1", "#2")
    assert {"SIL", "SIL_B", "SPN_S", "AE_I", "T_E"} <= set(tokens)
    graph = hlg.load_graph(lang_graph, 1 + len(outputs), outputs=("<blk>", *outputs))
    decoder = hlg.HlgDecoder(graph)
    said = "SIL DH_B IY_E K_B AE_I T_E SIL S_B AE_I T_E AA_B N_E AH_S M_B AE_I T_E SIL"
    assert decoder.decode(one_hot(graph, said)) == ["the", "cat", "sat", "on", "a", "mat"]


def test_acoustic_scale_and_word_penalty(dict_graph):
    graph = hlg.load_graph(dict_graph, 14)
    penalised = hlg._with_word_penalty(graph.fst, 2.5, len(graph.words))

    def word_arcs(fst):
        weights = [
            a.weight.value for s in kaldifst.StateIterator(fst) for a in kaldifst.ArcIterator(fst, s) if a.olabel
        ]
        return len(weights), sum(weights)

    (n, before), (m, after) = word_arcs(graph.fst), word_arcs(penalised)
    assert n == m > 0 and after == pytest.approx(before + 2.5 * n, rel=1e-5)
    assert word_arcs(graph.fst) == (n, before)  # the loaded graph itself is left as it was
    # A small acoustic scale leaves the LM in charge: "the mat" (a bigram of the ARPA) over "a mat"
    # (backed off), at the price of one frame read as DH.
    said = one_hot(graph, "AH M AE T")
    assert hlg.HlgDecoder(graph).decode(said) == ["a", "mat"]
    assert hlg.HlgDecoder(graph, hlg.HlgDecoding(acoustic_scale=0.05)).decode(said) == ["the", "mat"]
    with pytest.raises(ValueError, match="acoustic_scale and beam must be positive"):
        hlg.HlgDecoding(acoustic_scale=0)


def test_rebuild_is_skipped_when_inputs_are_unchanged(tmp_path):
    out = tmp_path / "lang"
    first = langstage.build(DICT, ARPA, out, CONFIG)
    assert "skipped" not in first
    assert langstage.build(DICT, ARPA, out, CONFIG)["skipped"]
    dict_dir = tmp_path / "dict"
    shutil.copytree(DICT, dict_dir)
    with open(dict_dir / lexlib.LEXICONP, "a") as handle:
        handle.write("cat 0.5 K AA T\n")
    again = langstage.build(dict_dir, ARPA, out, CONFIG)
    assert "skipped" not in again and again["hlg"]["sha256"] != first["hlg"]["sha256"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dict", "lang"]  # no temporary dir left behind


def test_cli_writes_the_graph(tmp_path, capsys):
    out = tmp_path / "lang"
    assert langstage.main(["--lang", str(LANG), "--arpa", str(ARPA), "--out", str(out)]) == 0
    assert "wrote" in capsys.readouterr().out and (out / langstage.HLG_FST).is_file()
    assert langstage.main(["--dict", str(tmp_path / "nowhere"), "--arpa", str(ARPA), "--out", str(out)]) == 1
    assert "nowhere: no such directory" in capsys.readouterr().err


def test_a_missing_graph_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"HLG\.fst: no such file; build it with `python -m pipeline\.lang"):
        hlg.load_graph(tmp_path, 14)


def test_a_truncated_graph_is_refused(dict_graph, tmp_path):
    copy = tmp_path / "lang"
    shutil.copytree(dict_graph, copy)
    data = (copy / langstage.HLG_FST).read_bytes()
    (copy / langstage.HLG_FST).write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match=r"HLG\.fst: \d+ bytes where lang\.json records \d+ \(truncated"):
        hlg.load_graph(copy, 14)


def test_a_foreign_graph_is_refused(dict_graph, lang_graph, tmp_path):
    copy = tmp_path / "lang"
    shutil.copytree(dict_graph, copy)
    foreign = (lang_graph / langstage.HLG_FST).read_bytes()
    own = (copy / langstage.HLG_FST).stat().st_size
    (copy / langstage.HLG_FST).write_bytes(foreign[:own].ljust(own, b"\0"))  # same size, other bytes
    with pytest.raises(ValueError, match=r"HLG\.fst: its checksum is not the one lang\.json records"):
        hlg.load_graph(copy, 14)
    (copy / langstage.RECORD).unlink()
    with pytest.raises(FileNotFoundError, match=r"lang\.json: missing or unreadable"):
        hlg.load_graph(copy, 14)


def test_tokens_that_do_not_match_the_model_are_refused(dict_graph):
    with pytest.raises(ValueError, match=r"tokens\.txt: the graph has 14 CTC outputs and the model 40; build it"):
        hlg.load_graph(dict_graph, 40)
    outputs = langstage.read_table(dict_graph / langstage.TOKENS)[:14]
    swapped = (outputs[0], outputs[2], outputs[1], *outputs[3:])
    with pytest.raises(ValueError, match=r"tokens\.txt:2: token 'AA' where the model's output 1 is 'AE'"):
        hlg.load_graph(dict_graph, 14, outputs=swapped)


def test_a_lang_dir_with_a_bad_l_is_named(tmp_path):
    lang = tmp_path / "lang"
    shutil.copytree(LANG, lang)
    (lang / "L_disambig.fst").write_bytes((LANG / "L_disambig.fst").read_bytes()[:100])
    with pytest.raises(ValueError, match=r"L_disambig\.fst: not a whole OpenFst vector FST"):
        langstage.build(lang, ARPA, tmp_path / "out", CONFIG, kind="lang")
    (lang / "phones.txt").write_text("<eps> 0\nSIL 2\n")
    with pytest.raises(ValueError, match=r"phones\.txt:2: expected `SYMBOL 1`, got 'SIL 2'"):
        langstage.build(lang, ARPA, tmp_path / "out", CONFIG, kind="lang")
    assert not (tmp_path / "out").exists()


def test_g2p_spells_lm_words_the_dict_dir_lacks(tmp_path):
    # A dict dir in espeak-ng's symbols that lacks "dog", an LM that has it: --g2p gives it espeak-ng's
    # pronunciation, and the graph reads it.
    spoken = dict(zip(["the", "dog"], phonemes.phonemize(["the", "dog"])))
    phone_set = tuple(dict.fromkeys(p for ps in spoken.values() for p in ps))
    lexicon = lexlib.Lexicon((lexlib.Entry("the", tuple(spoken["the"])),), phone_set, ("SIL",), "SIL")
    lexlib.write_dict_dir(lexicon, tmp_path / "dict")
    arpa = tmp_path / "lm.arpa"
    arpa.write_text("\\data\\\nngram 1=4\n\n\\1-grams:\n-1\t</s>\n-99\t<s>\n-1\tthe\n-1\tdog\n\n\\end\\\n")
    left_out = langstage.build(tmp_path / "dict", arpa, tmp_path / "plain", CONFIG)
    assert (left_out["g2p_filled"], left_out["lm_words_unspelled"]) == (0, 1)
    filled = langstage.build(tmp_path / "dict", arpa, tmp_path / "g2p", langstage.LangConfig(g2p=True))
    assert (filled["g2p_filled"], filled["lm_words_unspelled"]) == (1, 0)
    graph = hlg.load_graph(tmp_path / "g2p", 1 + len(phone_set) + 1)
    assert hlg.HlgDecoder(graph).decode(one_hot(graph, " ".join(spoken["the"] + spoken["dog"]))) == ["the", "dog"]


def test_g2p_phones_outside_the_dict_dirs_phone_set_are_named(tmp_path):
    with pytest.raises(ValueError, match=r"lm_tiny\.arpa: espeak-ng -v en-us says 'dog' as .* not in the lexicon's"):
        langstage.build(DICT, ARPA, tmp_path / "out", langstage.LangConfig(g2p=True))
