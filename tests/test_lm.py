"""The word LM: pipeline/lm.py builds it with KenLM's lmplz (the binary `make setup` compiles),
models/asr/lm.py decodes with it (pyctcdecode's beam search querying it through `kenlm`), and every
bad input is an error that names its file and the fix."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from models import tune_lm
from models.asr import lm
from pipeline import lm as lmstage
from pipeline import text

VOCABULARY = text.build_vocabulary(["abcdefghijklmnopqrstuvwxyz '"])
TEXT = ["the cat sat on the mat", "a cat sat on a hat", "the cat ate the rat", "the dog sat on the log"]


def data_dir(root, sentences):
    root.mkdir(parents=True, exist_ok=True)
    (root / "text").write_text("".join(f"utt{i:03d} {s}\n" for i, s in enumerate(sentences)), encoding="utf-8")
    return root


def build(tmp_path, sentences=TEXT, name="lm", **config):
    data = data_dir(tmp_path / f"data-{name}", sentences)
    path, lines = lmstage.read_lines(data, None)
    record = lmstage.build_lm(path, lines, tmp_path / name, lmstage.LmConfig(**config), VOCABULARY)
    return tmp_path / name, record


def posteriors(spelled: list[dict[str, float]]) -> np.ndarray:
    """Log-probabilities [T, V] of a CTC output that emits each position's characters (a {char:
    probability} each) in one frame, with a blank frame after each."""
    frames = []
    for position in spelled:
        frame = np.full(len(VOCABULARY), 1e-4)
        for ch, p in position.items():
            frame[VOCABULARY.index(ch)] = p
        blank = np.full(len(VOCABULARY), 1e-4)
        blank[0] = 1.0
        frames += [frame / frame.sum(), blank / blank.sum()]
    return np.log(np.asarray(frames, np.float32))


def spelled(sentence: str, doubt: dict[int, dict[str, float]] = {}) -> np.ndarray:  # noqa: B006 (read only)
    return posteriors([doubt.get(i, {ch: 0.95}) for i, ch in enumerate(sentence)])


# "the cat sat": the acoustics hear "k" a little more than "c" at position 4
DOUBTFUL = spelled("the kat sat", {4: {"k": 0.55, "c": 0.45}})


def test_an_lm_of_a_data_dirs_transcripts_is_built_once_and_again_when_its_text_changes(tmp_path):
    directory, record = build(tmp_path)
    assert record["order"] == 3 and record["text"]["sentences"] == 4 and record["text"]["vocabulary_size"] == 11
    assert record["arpa"]["ngrams"]["1"] == 11 + 3  # the words, <s>, </s> and <unk>
    assert lmstage.ngram_counts(directory / "lm.arpa") == {int(k): n for k, n in record["arpa"]["ngrams"].items()}
    assert json.loads((directory / "lm.json").read_text())["text"]["sha256"] == record["text"]["sha256"]
    again = lmstage.build_lm(*lmstage.read_lines(tmp_path / "data-lm", None), directory, lmstage.LmConfig(), VOCABULARY)
    assert again.get("skipped") and again["arpa"]["sha256"] == record["arpa"]["sha256"]
    _, changed = build(tmp_path, [*TEXT, "a dog ate a log"])
    assert not changed.get("skipped") and changed["text"]["sentences"] == 5
    _, bigram = build(tmp_path, name="bigram", order=2)
    assert set(bigram["arpa"]["ngrams"]) == {"1", "2"}


def test_a_corpus_file_is_normalized_as_open_text_and_its_unsayable_lines_counted(tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("The cat paid $12.\n\nNASA sat.\nthe dog, a log!\n", encoding="utf-8")
    path, lines = lmstage.read_lines(None, corpus)
    record = lmstage.build_lm(path, lines, tmp_path / "lm", lmstage.LmConfig(), VOCABULARY, spoken=True)
    assert record["text"]["sentences"] == 2 and record["text"]["left_out"] == {"an acronym": 1}
    assert "twelve" in lm.unigrams(tmp_path / "lm" / "lm.arpa")


def test_a_text_the_model_cannot_spell_or_an_empty_one_is_refused_with_the_line_and_the_fix(tmp_path, capsys):
    shards = tmp_path / "shards"
    shards.mkdir()
    (shards / "manifest.json").write_text(json.dumps({"vocabulary": VOCABULARY, "lowercase": True}))
    bad = data_dir(tmp_path / "bad", ["the cat sat", "the caf\u00e9 is 2 km away"])
    args = ["--data", str(bad), "--vocabulary-from", str(shards), "--out", str(tmp_path / "lm")]
    assert lmstage.main(args) == 1
    err = capsys.readouterr().err
    assert f"{bad / 'text'}: 1 of 2 lines" in err and "line 2" in err and "'2\u00e9'" in err and "Normalize" in err
    assert not (tmp_path / "lm" / "lm.json").exists()
    (tmp_path / "empty.txt").write_text("\n\n")
    args = ["--text-file", str(tmp_path / "empty.txt"), "--vocabulary-from", str(shards), "--out", str(tmp_path / "e")]
    assert lmstage.main(args) == 1
    assert "no sentences" in capsys.readouterr().err


def test_the_lm_spells_what_the_acoustics_leave_open(tmp_path):
    directory, _ = build(tmp_path)
    assert lm.LmDecoder(directory, VOCABULARY, lm.LmDecoding(weight=0.0, word_bonus=0.0)).decode([DOUBTFUL]) == [
        "the kat sat"
    ]
    decoder = lm.LmDecoder(directory, VOCABULARY, lm.LmDecoding(weight=0.5, word_bonus=1.0))
    clear = spelled("a dog sat")
    assert decoder.decode([DOUBTFUL, clear]) == ["the cat sat", "a dog sat"]
    assert decoder.describe()["lm_order"] == 3 and decoder.describe()["lm_weight"] == 0.5
    # the honest figures beside it: words the LM never saw, and 3-grams its text had
    covered = lm.coverage(directory, ["the cat sat", "the bat sat on the mat"])
    assert covered["lm_oov_rate"] == pytest.approx(1 / 9)
    assert covered["lm_3gram_hit"] == pytest.approx(3 / 5)  # the cat sat, sat on the, on the mat


def test_the_grid_chooses_the_weights_on_a_dev_split_and_every_decoder_then_uses_them(tmp_path, capsys):
    directory, _ = build(tmp_path)
    refs = ["the cat sat", "a dog sat"]
    best, grid = lm.tune(refs, [DOUBTFUL, spelled("a dog sat")], directory, VOCABULARY, [0.0, 0.5], [1.0], 16, False)
    assert best.weight == 0.5 and [g["wer"] for g in grid] == [pytest.approx(1 / 6), 0.0]
    lm.write_decoding(directory, best, {"split": "dev", "grid": grid})
    assert lm.LmDecoder(directory, VOCABULARY).settings == best
    assert lm.settings_of(directory, beam_width=8).beam_width == 8
    # never on a test split
    args = ["--model", "m", "--shards", str(tmp_path), "--lm", str(directory), "--split", "test_engine"]
    assert tune_lm.main(args) == 1
    assert "never on test" in capsys.readouterr().err


def test_a_missing_truncated_foreign_or_unspellable_lm_is_an_error_naming_the_file(tmp_path):
    directory, record = build(tmp_path)
    with pytest.raises(lm.LmError, match="no such LM directory"):
        lm.LmDecoder(tmp_path / "nowhere", VOCABULARY)
    broken = tmp_path / "broken"
    shutil.copytree(directory, broken)
    arpa = (broken / "lm.arpa").read_bytes()
    (broken / "lm.arpa").write_bytes(arpa[: len(arpa) // 2])
    with pytest.raises(lm.LmError, match=r"broken/lm.arpa: not the file lm.json records .*python -m pipeline.lm"):
        lm.LmDecoder(broken, VOCABULARY)
    # a file that is not an ARPA at all, recorded as if it were: KenLM's own refusal, with the file
    (broken / "lm.arpa").write_text("this is not a language model\n")
    forged = {**record, "arpa": {**record["arpa"], "sha256": lmstage.fsutil.file_sha256(broken / "lm.arpa")}}
    (broken / "lm.json").write_text(json.dumps(forged))
    with pytest.raises(lm.LmError, match="broken/lm.arpa: KenLM cannot read it"):
        lm.LmDecoder(broken, VOCABULARY)
    (broken / "lm.json").unlink()
    with pytest.raises(lm.LmError, match="broken/lm.json: missing or not an LM record"):
        lm.LmDecoder(broken, VOCABULARY)
    # an LM built for another alphabet: words the model cannot spell
    no_z = [v for v in VOCABULARY if v != "z"]
    with pytest.raises(lm.LmError, match=r"outside the acoustic model's alphabet \('z'\)"):
        lm.LmDecoder(build(tmp_path, ["a lazy dog"], name="z")[0], no_z)


def test_without_lmplz_the_error_says_how_to_get_it(tmp_path, monkeypatch):
    monkeypatch.setenv(lmstage.LMPLZ_ENV, str(tmp_path / "missing"))
    monkeypatch.setattr(lmstage.sys, "executable", str(tmp_path / "python"))
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(FileNotFoundError, match="make setup"):
        lmstage.lmplz()
