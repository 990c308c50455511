"""The synthesis model's listener (models/tts/evaluation.py `Listener`, `intelligibility`; models/tts/diagnosis.py
`heard`): a char model's CER and WER, a phone model's PER against the targets its shards hold for the
sentence and its WER through its graph. The listeners are stand-ins whose output is the argmax of
their input frames (one-hot "log-mels"), heard through the real normalization, forward pass and
decoders; the graph is built from tests/fixtures/dict_tiny; no training."""

from __future__ import annotations

import dataclasses
import types
from pathlib import Path

import numpy as np
import pytest

from models import trained_model
from models.tts import diagnosis
from models.tts import evaluation as tts_eval
from pipeline import lang as langstage
from pipeline import phones, records, shards, text
from tests.kaldi_fixtures import make_feats_dir, write_table

FIXTURES = Path(__file__).parent / "fixtures"
DICT, LANG, ARPA = FIXTURES / "dict_tiny", FIXTURES / "lang_tiny", FIXTURES / "lm_tiny.arpa"
VOCABULARY = ["<blank>", "<unk>", " ", *"acdehmnost"]  # the synthesis model's characters
SENTENCES = ["the cat sat on the mat", "a cat"]
DIM = 80  # log-mel bins


class OneHotModel:
    """An acoustic model whose logits are its first `outputs` input dimensions, scaled: normalized
    one-hot frames (the one 1 is above its dimension's mean, every 0 at or below) keep their argmax."""

    def __init__(self, outputs: int):
        self.outputs = outputs

    def __call__(self, feats, lengths):
        return 30.0 * feats[..., : self.outputs], lengths  # [B, T, outputs], [B]


def frames(ids: list[int]) -> np.ndarray:
    """[frames, DIM] "log-mels" a `OneHotModel` hears as `ids`: each id two frames, then a blank frame."""
    path = [i for token in ids for i in (token, token, 0)]
    out = np.zeros((len(path), DIM), np.float32)
    out[np.arange(len(path)), path] = 1.0
    return out


def spoken(sentence: str, utt: str, said: np.ndarray, truth: np.ndarray) -> tts_eval.Spoken:
    """A sentence the synthesis spoke as `said`, its recording and teacher-forced frames `truth`."""
    return tts_eval.Spoken(
        utt_id=utt,
        speaker="spk",
        voice="spk",
        tokens=np.asarray(text.encode(sentence, VOCABULARY)),
        reference=truth,
        teacher_forced=truth,
        synthesized=said,
        forced_alignment=np.zeros((1, 1)),
        free_alignment=np.zeros((1, 1)),
    )


def listener(monkeypatch, data: dict, cmvn: str = "speaker") -> tts_eval.Listener:
    """A `Listener` of `data` (a data.json as models/trained_model.py loads it) and a `OneHotModel`."""
    outputs = len(data.get("outputs") or data["vocabulary"])
    config = types.SimpleNamespace(input=types.SimpleNamespace(cmvn=cmvn))
    monkeypatch.setattr(trained_model, "open_model", lambda spec: (OneHotModel(outputs), config, data))
    return tts_eval.Listener("runs/listener")


@pytest.fixture(scope="module")
def graph(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("graphs") / "lang"
    langstage.build(DICT, ARPA, out, langstage.LangConfig(), kind="dict")
    return out


def phone_data(graph: Path, **record) -> dict:
    """A phone model's data.json, its targets each word's likeliest pronunciation in dict_tiny."""
    table = phones.open_table(DICT)
    described = {**table.describe(), "source": "lexicon", "g2p_words": {}, **record}
    return {
        "targets": "phones",
        "outputs": list(table.outputs),
        "vocabulary": VOCABULARY,
        "phones": described,
        "lm_dir": str(graph),
        "model_dir": "runs/listener/model",
    }


def phone_frames(words: str, table: phones.PhoneTable) -> np.ndarray:
    return frames([table.outputs.index(p) for w in words.split() for p in table.pronunciations[w]])


def test_a_char_listener_reports_the_cer_and_wer_it_always_did(monkeypatch, tmp_path):
    judge = listener(monkeypatch, {"vocabulary": VOCABULARY}, cmvn="utterance")
    assert not judge.phones and judge.describe() == {
        "targets": "chars",
        "model": "runs/listener",
        "decoding": "greedy",
        "lm": None,
    }
    chars = [frames(text.encode(s, VOCABULARY)) for s in SENTENCES]
    wrong = frames(text.encode("a mat", VOCABULARY))
    said = [spoken(SENTENCES[0], "u1", chars[0], chars[0]), spoken(SENTENCES[1], "u2", wrong, chars[1])]
    metrics = tts_eval.intelligibility(said, VOCABULARY, judge, "dev", tmp_path)
    names = ["cer", "wer", "cer_teacher_forced", "cer_recordings", "cer_vocoded"]
    assert list(metrics) == [f"dev_intelligibility_{n}" for n in names]
    assert metrics["dev_intelligibility_cer"] == pytest.approx(1 / 27)  # "a cat" heard "a mat"
    assert metrics["dev_intelligibility_wer"] == pytest.approx(1 / 8)
    assert metrics["dev_intelligibility_cer_teacher_forced"] == metrics["dev_intelligibility_cer_recordings"] == 0
    rows = [r.split("\t") for r in (tmp_path / "dev_intelligibility.tsv").read_text().splitlines()]
    assert rows[0] == [
        "utt_id",
        "speaker",
        "voice",
        "reference",
        "asr_on_synthesis",
        "asr_on_teacher_forced",
        "asr_on_recording",
        "asr_on_vocoded",
    ]
    assert rows[2][:7] == ["u2", "spk", "spk", "a cat", "a mat", "a cat", "a cat"]


def test_a_phone_listener_scores_its_phones_against_its_targets_and_its_words_through_its_graph(
    monkeypatch, tmp_path, graph
):
    judge = listener(monkeypatch, phone_data(graph))
    table = judge.table
    truth = [phone_frames(s, table) for s in SENTENCES]
    said = [
        spoken(SENTENCES[0], "u1", truth[0], truth[0]),
        spoken(SENTENCES[1], "u2", phone_frames("a mat", table), truth[1]),
    ]
    metrics = tts_eval.intelligibility(said, VOCABULARY, judge, "test", tmp_path)
    sources = ["", "_teacher_forced", "_recordings", "_vocoded"]
    assert list(metrics) == [f"test_intelligibility_{k}{s}" for s in sources for k in ("per", "wer", "cer")]
    assert metrics["test_intelligibility_per"] == pytest.approx(1 / 19)  # K for M among 15 + 4 phones
    assert metrics["test_intelligibility_wer"] == pytest.approx(1 / 8)  # the graph's "a mat"
    assert metrics["test_intelligibility_cer"] == pytest.approx(1 / 27)
    for name in ("per", "wer", "cer"):  # the floor: the listener hears the recordings' own phones
        assert metrics[f"test_intelligibility_{name}_recordings"] == 0.0
        assert metrics[f"test_intelligibility_{name}_teacher_forced"] == 0.0
    rows = [r.split("\t") for r in (tmp_path / "test_intelligibility.tsv").read_text().splitlines()]
    assert rows[0][3:7] == ["reference", "phones_reference", "asr_on_synthesis", "phones_on_synthesis"]
    assert rows[2][3:9] == ["a cat", "AH K AE T", "a mat", "AH M AE T", "a cat", "AH K AE T"]
    with pytest.raises(ValueError, match=r"the phone listener runs/listener's reference phones: .* word 'dog'"):
        judge.references({("test", "u3"): "the dog"})
    described = judge.describe()
    assert (described["targets"], described["lm"], described["model"]) == ("phones", "hlg", "runs/listener")
    assert described["phones_from"] == str(DICT) and described["lm_dir"] == str(graph)


def test_the_diagnosis_hears_each_arm_through_a_phone_listener(monkeypatch, graph):
    judge = listener(monkeypatch, phone_data(graph))
    truth = [phone_frames(s, judge.table) for s in SENTENCES]
    arms = {
        "mels": {"teacher_forced": truth, "predicted": [truth[0], phone_frames("a mat", judge.table)]},
        "voices": ["spk", "spk"],
        "tokens": [np.asarray(text.encode(s, VOCABULARY)) for s in SENTENCES],
    }
    rates = diagnosis.heard(arms, VOCABULARY, judge)
    assert rates["teacher_forced"]["per"] == rates["teacher_forced"]["wer"] == 0.0
    assert rates["predicted"]["per"] == pytest.approx(1 / 19) and rates["predicted"]["phones"] == 19
    assert rates["predicted"]["wer"] == pytest.approx(1 / 8) and rates["predicted"]["cer"] == pytest.approx(1 / 27)


def sharded_phones(tmp_path: Path, cfg: shards.ShardConfig, sentences: list[str]) -> tuple[dict, dict, dict]:
    """(the manifest's `phones` record, {utt: sentence}, {utt: its stored phone targets, space-joined})
    of a tiny data dir of `sentences`, sharded with `cfg`."""
    from pipeline import dataset

    data_dir, _, texts = make_feats_dir(tmp_path / "train", num_utts=len(sentences), dim=5, seed=0)
    texts = {utt: sentences[i] for i, utt in enumerate(sorted(texts))}
    write_table(data_dir / "text", texts)
    manifest = shards.make_shards({"train": data_dir}, tmp_path / "out", cfg, progress=False)
    shard_set = records.open_shard_set(tmp_path / "out")
    batches, _ = dataset.asr_dataset(shard_set, "train", dataset.InputConfig(frames_per_batch=400), training=False)
    stored = {}
    for batch in batches:
        for utt, row, n in zip(batch["utt_id"].numpy(), batch["phones"].numpy(), batch["phone_lengths"].numpy()):
            stored[utt.decode()] = " ".join(shard_set.phone_vocabulary[i] for i in row[:n])
    return manifest["phones"], texts, stored


@pytest.mark.parametrize("source", ["lexicon", "espeak"])
def test_the_reference_phones_are_the_targets_the_shard_stage_stores_for_the_sentence(tmp_path, source):
    cfg = shards.ShardConfig(num_shards=1, jobs=1, feature_dtype="float32", phones_from=str(DICT))
    sentences = [*SENTENCES, "the mat sat on a cat", "on the mat"]
    if source == "espeak":  # a lexicon of espeak-ng's phonemes, stress folded; the sentences said in context
        from pipeline.text_lexicon import TextLexiconConfig, build_text_lexicon

        lines = ["the cat sat on the mat", "the mat sat on a cat", "a cat", "the cat", "the apple"]
        (tmp_path / "text.txt").write_text("\n".join(lines) + "\n")
        build_text_lexicon(tmp_path / "text.txt", tmp_path / "dict", TextLexiconConfig(fold_stress=True), False)
        cfg = dataclasses.replace(cfg, phones_from=str(tmp_path / "dict"), phone_source="espeak", phonemes="en-us")
        # in context "the" before a vowel is not its likeliest pronunciation, the lexicon's "D @"
        sentences[2] = "the apple"
    record, texts, stored = sharded_phones(tmp_path, cfg, sentences)
    assert record["source"] == source and sorted(stored) == sorted(texts)
    table = phones.open_table(record["from"])
    refs = tts_eval.phone_references({("train", u): t for u, t in texts.items()}, record, table, "en-us")
    assert refs == {("train", u): phones_of for u, phones_of in stored.items()}
    assert len(set(refs.values())) == 4 and all(refs.values())


def test_a_lexicon_the_listener_cannot_find_or_trust_is_an_error_naming_it_and_the_fix(tmp_path, graph):
    gone = phone_data(graph, **{"from": str(tmp_path / "dict")})
    with pytest.raises(FileNotFoundError, match=r"dict: no such directory; it is the lexicon the phone listener"):
        tts_eval.listener_table(gone, "runs/listener")
    with pytest.raises(FileNotFoundError, match=r"--phones-from\`\) back there"):
        tts_eval.listener_table(gone, "runs/listener")
    other = phone_data(graph, **{"from": str(LANG)})
    with pytest.raises(ValueError, match=r"lang_tiny: its phone set is not the output layer of the phone listener"):
        tts_eval.listener_table(other, "runs/listener")
    edited = phone_data(graph, sha256="0123456789abcdef")
    with pytest.raises(ValueError, match=r"not the lexicon the phone listener runs/listener was trained with"):
        tts_eval.listener_table(edited, "runs/listener")
    assert tts_eval.listener_table(phone_data(graph), "runs/listener").outputs == phones.open_table(DICT).outputs


def test_a_phone_models_data_records_the_voice_its_targets_were_said_in_and_the_listener_says_its_sentences_in_it(
    monkeypatch, graph
):
    from models.asr.config import AsrConfig
    from models.asr.task import AsrTask

    table = phones.open_table(DICT)
    sizes = types.SimpleNamespace(
        feature_dim=5, vocabulary=VOCABULARY, phone_vocabulary=table.outputs, phones={}, phonemes="en-gb", num_targets=0
    )
    for targets, voice in (("phones", "en-gb"), ("chars", None)):
        config = types.SimpleNamespace(settings=AsrConfig(num_layers=1, units=8, projection=0, targets=targets))
        assert AsrTask.create(config, sizes).model_data().get("phonemes") == voice
    said = []
    monkeypatch.setattr(tts_eval, "phone_references", lambda sentences, record, t, voice: said.append(voice) or {})
    listener(monkeypatch, {**phone_data(graph), "phonemes": "en-gb"}).references({})
    listener(monkeypatch, phone_data(graph)).references({})  # a model of before: espeak-ng's default voice
    assert said == ["en-gb", "en-us"]
