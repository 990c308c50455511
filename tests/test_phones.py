"""Phone targets from a lexicon (pipeline/phones.py) through the shard stage and the input pipeline,
from the committed dict dir and lang dir (tests/fixtures, written by hand, not by the code under test)."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline import phones, records, shards
from tests.conftest import ROOT
from tests.kaldi_fixtures import make_feats_dir, write_table

DICT = ROOT / "tests" / "fixtures" / "dict_tiny"
LANG = ROOT / "tests" / "fixtures" / "lang_tiny"
SENTENCES = ["the cat sat on the mat", "a cat", "the mat sat on a cat", "on the mat"]


def test_a_dict_dirs_table_is_blank_then_its_phone_set_and_its_words_take_their_likeliest_pronunciation():
    table = phones.open_table(DICT)
    assert table.kind == "dict"
    assert table.outputs == ("<blk>", "AA", "AE", "AH", "DH", "EY", "IY", "K", "M", "N", "S", "T", "SIL", "SPN")
    assert table.pronunciations["the"] == ("DH", "AH")  # 1.0 over 0.6
    assert table.pronunciations["a"] == ("AH",)


def test_a_lang_dirs_table_keeps_position_variants_and_reads_each_words_pronunciation_off_its_L():
    table = phones.open_table(LANG)
    assert table.kind == "lang"
    assert table.outputs[0] == "<blk>" and "K_B" in table.outputs and "SIL_S" in table.outputs
    assert not any(p.startswith("#") or p == "<eps>" for p in table.outputs)
    assert len(table.outputs) == 58 - 1 - 3 + 1  # phones.txt less <eps> and #0-#2, then <blk>
    assert table.pronunciations["cat"] == ("K_B", "AE_I", "T_E")
    assert table.pronunciations["the"] == ("DH_B", "AH_E")  # cost 0 beats -ln 0.6
    assert table.pronunciations["a"] == ("AH_S",)


@pytest.mark.parametrize("source", [DICT, LANG])
def test_a_word_the_lexicon_lacks_is_an_error_naming_the_utterance_and_the_word(source):
    table = phones.open_table(source)
    with pytest.raises(ValueError, match=r"utterance u2 of split dev: word 'dog' has no pronunciation"):
        phones.ids_from_lexicon({("train", "u1"): "the cat", ("dev", "u2"): "the dog"}, table, g2p=False)


def test_g2p_fills_a_missing_word_with_espeak_and_counts_it_per_split(tmp_path):
    from pipeline import lexicon as lexlib

    spoken = lexlib.g2p(["cat", "sat", "tat"])
    phone_set = tuple(sorted({p for ps in spoken.values() for p in ps}))
    entries = tuple(lexlib.Entry(w, spoken[w]) for w in ("cat", "sat"))
    lexlib.write_dict_dir(lexlib.Lexicon(entries, phone_set, ("SIL",), "SIL"), tmp_path / "dict")
    table = phones.open_table(tmp_path / "dict")
    transcripts = {("train", "u1"): "cat sat", ("dev", "u2"): "tat sat tat"}
    ids, filled = phones.ids_from_lexicon(transcripts, table, g2p=True)
    assert filled == {"train": 0, "dev": 2}
    assert [table.outputs[i] for i in ids["dev", "u2"]] == [*spoken["tat"], *spoken["sat"], *spoken["tat"]]
    # espeak-ng's phones are not ARPAbet: G2P into the fixture's phone set is refused, naming the word
    with pytest.raises(ValueError, match="'dog'"):
        phones.ids_from_lexicon({("dev", "u2"): "the dog"}, phones.open_table(DICT), g2p=True)


def test_espeak_phonemes_outside_the_phone_set_are_an_error_naming_the_utterance():
    table = phones.open_table(DICT)
    ids = phones.ids_from_espeak({("train", "u1"): ["DH", "AH", " ", "K", "AE", "T"]}, table)
    assert [table.outputs[i] for i in ids["train", "u1"]] == ["DH", "AH", "K", "AE", "T"]  # no word separator
    with pytest.raises(ValueError, match=r"utterance u3 of split test: espeak-ng's phoneme '@'"):
        phones.ids_from_espeak({("test", "u3"): ["DH", "@"]}, table)


def _data_dir(tmp_path, name, seed):
    data_dir, _, texts = make_feats_dir(tmp_path / name, num_utts=8, dim=5, seed=seed)
    texts = {utt: SENTENCES[i % len(SENTENCES)] for i, utt in enumerate(sorted(texts))}
    write_table(data_dir / "text", texts)
    return data_dir, texts


@pytest.mark.parametrize("source", [DICT, LANG])
def test_shards_store_phone_targets_and_the_acoustic_batches_carry_them(tmp_path, source):
    from pipeline import dataset

    train, texts = _data_dir(tmp_path, "train", 0)
    dev, _ = _data_dir(tmp_path, "dev", 1)
    cfg = shards.ShardConfig(num_shards=2, jobs=1, feature_dtype="float32", phones_from=str(source))
    manifest = shards.make_shards({"train": train, "dev": dev}, tmp_path / "out", cfg, progress=False)
    table = phones.open_table(source)
    assert manifest["phone_vocabulary"] == list(table.outputs)
    assert manifest["phones"]["kind"] == table.kind and manifest["phones"]["source"] == "lexicon"
    shard_set = records.open_shard_set(tmp_path / "out")
    assert shard_set.phone_vocabulary == table.outputs
    data, _ = dataset.asr_dataset(shard_set, "train", dataset.InputConfig(frames_per_batch=400), training=False)
    seen = {}
    for batch in data:
        for utt, row, n in zip(batch["utt_id"].numpy(), batch["phones"].numpy(), batch["phone_lengths"].numpy()):
            seen[utt.decode()] = [table.outputs[i] for i in row[:n]]
    assert sorted(seen) == sorted(texts)
    for utt, got in seen.items():
        assert got == [p for w in texts[utt].split() for p in table.pronunciations[w]]
    again = shards.make_shards({"train": train, "dev": dev}, tmp_path / "out", cfg, progress=False)
    assert again["skipped"]


def test_a_phone_table_unlike_the_models_is_refused(tmp_path):
    train, _ = _data_dir(tmp_path, "train", 0)
    cfg = shards.ShardConfig(num_shards=2, jobs=1, feature_dtype="float32", phones_from=str(DICT))
    shards.make_shards({"train": train}, tmp_path / "a", cfg, progress=False)
    other = shards.ShardConfig(
        num_shards=2, jobs=1, feature_dtype="float32", phones_from=str(LANG), vocabulary_from=str(tmp_path / "a")
    )
    with pytest.raises(ValueError, match="not the output layer"):
        shards.make_shards({"test": train}, tmp_path / "b", other, progress=False)


def test_new_shards_from_a_models_vocabulary_take_its_phones_source_and_g2p(tmp_path):
    train, _ = _data_dir(tmp_path, "train", 0)
    cfg = shards.ShardConfig(num_shards=2, jobs=1, feature_dtype="float32", phones_from=str(DICT), g2p=True)
    shards.make_shards({"train": train}, tmp_path / "a", cfg, progress=False)
    new_set = shards.ShardConfig(num_shards=1, jobs=1, vocabulary_from=str(tmp_path / "a"))
    carried, _ = shards._with_given_vocabulary(new_set, {"eval": train})
    assert (carried.phones_from, carried.phone_source, carried.g2p) == (str(DICT.resolve()), "lexicon", True)


def test_an_acoustic_model_with_phone_targets_learns_from_the_phones(tmp_path):
    import dataclasses

    from models.asr.config import AsrConfig
    from models.asr.task import AsrTask, resolve_asr

    train, _ = _data_dir(tmp_path, "train", 0)
    cfg = shards.ShardConfig(num_shards=2, jobs=1, feature_dtype="float32", phones_from=str(DICT))
    shards.make_shards({"train": train}, tmp_path / "out", cfg, progress=False)
    shard_set = records.open_shard_set(tmp_path / "out")
    config = dataclasses.replace(AsrConfig(num_layers=1, units=8, projection=0), targets="phones")
    resolved = resolve_asr(config, shard_set)
    assert resolved.vocab_size == len(phones.open_table(DICT).outputs)
    task = AsrTask(resolved, list(shard_set.phone_vocabulary))
    assert task.selection_metric == "dev_per"
    assert task.strings(np.array([[4, 3, 0]])) == ["DH AH"]
    with pytest.raises(ValueError, match="--phones-from"):
        chars_only = records.open_shard_set(tmp_path / "out")
        resolve_asr(config, dataclasses.replace(chars_only, phone_vocabulary=()))
    with pytest.raises(ValueError, match="targets must be one of"):
        AsrConfig(targets="units")
