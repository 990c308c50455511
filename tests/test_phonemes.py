"""The phoneme front-end: espeak-ng's phonemes of a sentence, stored in the shards beside the characters,
read by a synthesis model with `tts.input: phonemes`, and made the same way from typed text for serving."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from models.training.config import TrainConfig
from models.tts import config as tts
from models.tts.task import TtsTask, encode_input
from pipeline import dataset, phonemes, records, shards, text
from tests.kaldi_fixtures import make_feats_dir


def test_a_sentence_becomes_espeak_ngs_phonemes_with_a_symbol_between_words():
    the_cat, empty, punctuated = phonemes.phonemize(["the cat", "", "The cat, sat."])
    assert the_cat == ["D", "@2", phonemes.WORD, "k", "'a", "t"]  # stress stays with its vowel
    assert empty == []
    # punctuation ends a clause for espeak-ng; here it is a space, so each sentence is one answer
    assert punctuated == [*the_cat, phonemes.WORD, "s", "'a", "t"]


def test_a_sentence_espeak_ng_splits_is_still_matched_to_its_own_phonemes():
    long = " ".join(["turn left at the lights"] * 30)  # espeak-ng answers it in several lines
    short, spoken_long, after = phonemes.phonemize(["go", long, "stop"])
    once = phonemes.phonemize(["turn left at the lights"])[0]
    assert spoken_long == ([*once, phonemes.WORD] * 30)[:-1]
    assert (short, after) == tuple(phonemes.phonemize(["go", "stop"]))


def test_an_unknown_voice_is_an_error_that_says_how_to_list_them():
    with pytest.raises(ValueError, match="espeak-ng --voices=en"):
        phonemes.phonemize(["hello"], voice="nosuch")


@pytest.fixture(scope="module")
def phoneme_shards(tmp_path_factory):
    root = tmp_path_factory.mktemp("phonemes")
    splits = {
        name: make_feats_dir(root / name, num_utts=n, dim=80, seed=s)[0]
        for name, n, s in [("train", 16, 1), ("dev", 8, 2)]
    }
    out = root / "shards"
    shards.make_shards(splits, out, shards.ShardConfig(num_shards=2, phonemes="en-us", jobs=1), progress=False)
    return records.open_shard_set(out), {name: dict(text_table(d)) for name, d in splits.items()}


def text_table(data_dir):
    for line in (data_dir / "text").read_text().splitlines():
        utt, _, transcript = line.partition(" ")
        yield utt, transcript


@pytest.mark.parametrize("boundaries", [False, True])
def test_the_shards_hold_the_phonemes_and_the_model_reads_them_as_served_text_gives_them(phoneme_shards, boundaries):
    shard_set, transcripts = phoneme_shards
    assert shard_set.phonemes == "en-us" and shard_set.phoneme_vocabulary[:2] == (text.BLANK, text.UNK)
    settings = tts.TtsConfig(alignment="durations", input="phonemes", speaker_dim=0, boundaries=boundaries)
    config = TrainConfig(model="tts", settings=settings)
    task = TtsTask.create(config, shard_set)
    symbols = len(shard_set.phoneme_vocabulary)
    unframed = dataclasses.replace(task.config, boundaries=False)
    assert task.config.vocab_size == symbols + (2 if boundaries else 0)
    data = {"vocabulary": list(shard_set.vocabulary), "lowercase": True, **task.model_data()}
    characters = TtsTask.create(
        dataclasses.replace(config, settings=dataclasses.replace(settings, input="characters", boundaries=False)),
        shard_set,
    )
    cfg = dataset.InputConfig(frames_per_batch=4000, max_batch_size=8)
    seen = 0
    for split in ("train", "dev"):
        batches, _ = task.dataset(shard_set, split, cfg, 0, 1, 0, False)
        plain, _ = characters.dataset(shard_set, split, cfg, 0, 1, 0, False)
        for batch, chars in zip(batches, plain):
            sentences = [transcripts[split][u.decode()] for u in batch["utt_id"].numpy()]
            # the input: what serving makes of the same typed sentences (one function, pipeline/phonemes.py)
            ids, lengths = encode_input(task.config, data, sentences)
            np.testing.assert_array_equal(batch["token_lengths"], lengths)
            np.testing.assert_array_equal(batch["tokens"][:, : ids.shape[1]], ids)
            if boundaries:  # the start symbol, the sentence's phonemes as the shards hold them, the end symbol
                for row, n, plain_ids in zip(ids, lengths, encode_input(unframed, data, sentences)[0]):
                    assert row[0] == symbols and row[n - 1] == symbols + 1 and not row[n:].any()
                    inner = row[1 : n - 1]
                    np.testing.assert_array_equal(inner, plain_ids[: n - 2])
                    assert inner.all() and inner.max() < symbols
            # what the listener should hear: the characters, as a character model reads them
            np.testing.assert_array_equal(batch["text_tokens"], chars["tokens"])
            np.testing.assert_array_equal(chars["text_tokens"], chars["tokens"])
            assert "phonemes" not in batch
            seen += len(sentences)
    assert seen == 24


def test_phoneme_input_on_shards_without_phonemes_says_how_to_write_them(tiny_shards):
    config = TrainConfig(model="tts", settings=tts.TtsConfig(input="phonemes"))
    with pytest.raises(ValueError, match="--phonemes en-us"):
        TtsTask.create(config, records.open_shard_set(tiny_shards))
    with pytest.raises(ValueError, match="'characters' or 'phonemes'"):
        tts.TtsConfig(input="letters")


def test_a_new_test_set_for_a_phoneme_model_gets_its_phonemes_and_ids(phoneme_shards, tmp_path):
    shard_set, _ = phoneme_shards
    other, _, _ = make_feats_dir(tmp_path / "other", num_utts=4, dim=80, seed=9)
    out = tmp_path / "shards"
    shards.make_shards(
        {"other": other},
        out,
        shards.ShardConfig(num_shards=1, vocabulary_from=str(shard_set.root), jobs=1),
        progress=False,
    )
    made = records.open_shard_set(out)
    assert made.phonemes == "en-us" and made.phoneme_vocabulary == shard_set.phoneme_vocabulary


def test_a_phoneme_model_will_not_serve_without_espeak_ng(monkeypatch, tmp_path):
    from models.tts.server import TtsServer

    config = TrainConfig(model="tts", settings=tts.TtsConfig(input="phonemes"))
    TtsServer(None, config, {})  # espeak-ng is here
    monkeypatch.setenv("PATH", str(tmp_path))  # and now it is not
    with pytest.raises(FileNotFoundError, match="apt-get install espeak-ng"):
        TtsServer(None, config, {})
    TtsServer(None, TrainConfig(model="tts"), {})  # characters need nothing
