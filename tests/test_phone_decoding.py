"""A phone model's words through its HLG graph, by the word LM's mechanism (models/asr/lm.py `choose`,
`attach`, models/asr/hlg.py `GraphDecoder`, `tune`): chosen, attached, tuned, evaluated, transcribed
with word times and served, on a graph of tests/fixtures/dict_tiny and one-hot posteriors; no training."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import types
from importlib.metadata import version
from pathlib import Path

import numpy as np
import pytest

from common import fsutil
from models import tune_lm
from models.asr import hlg, lm
from pipeline import lang as langstage
from tests.conftest import ROOT, quiet_env

FIXTURES = Path(__file__).parent / "fixtures"
DICT, LANG, ARPA = FIXTURES / "dict_tiny", FIXTURES / "lang_tiny", FIXTURES / "lm_tiny.arpa"
VOCABULARY = ["<blank>", "<unk>", " ", *"acdehmnost"]  # the characters of the tiny lexicon's words
SETTINGS = {f: getattr(hlg.HlgDecoding(), f) for f in ("beam", "max_active")}


@pytest.fixture(scope="module")
def graph(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("graphs") / "lang"
    langstage.build(DICT, ARPA, out, langstage.LangConfig(), kind="dict")
    return out


@pytest.fixture(scope="module")
def outputs(graph) -> list[str]:
    tables = langstage.Tables(langstage.read_table(graph / "tokens.txt"), langstage.read_table(graph / "words.txt"))
    return list(tables.tokens[: tables.num_outputs])


def phone_data(outputs, **extra) -> dict:
    """A phone model's data record as models/trained_model.py loads it."""
    return {
        "targets": "phones",
        "outputs": list(outputs),
        "vocabulary": VOCABULARY,
        "model_dir": "runs/p/model",
        **extra,
    }


def one_hot(outputs, phones: str, frames: int = 2) -> np.ndarray:
    """[frames, outputs] log-posteriors: each phone `frames` frames, then a blank frame."""
    ids: list[int] = []
    for phone in phones.split():
        ids += [outputs.index(phone)] * frames + [0]
    log_probs = np.full((len(ids), len(outputs)), -30.0, np.float32)
    log_probs[np.arange(len(ids)), ids] = 0.0
    return log_probs


def tuned_copy(graph: Path, tmp_path: Path, **settings) -> Path:
    """A copy of the lang dir with decoding.json, as models.tune_lm leaves it."""
    copy = tmp_path / "lang"
    shutil.copytree(graph, copy)
    lm.write_decoding(copy, hlg.HlgDecoding(**settings), {"split": "dev_engine"})
    return copy


def test_choose_gives_a_phone_model_its_graph_and_a_char_model_no_graph(graph, outputs):
    decoder = lm.choose(phone_data(outputs), graph)
    assert isinstance(decoder, hlg.GraphDecoder) and decoder.settings == hlg.HlgDecoding()
    said = [one_hot(outputs, "DH AH K AE T S AE T"), one_hot(outputs, "AH M AE T")]
    assert decoder.decode(said) == ["the cat sat", "a mat"]
    described = decoder.describe()
    assert described["lm_kind"] == "hlg" and described["lm_acoustic_scale"] == 1.0
    assert described["lm_graph_sha256"] == fsutil.read_json(graph / "lang.json")["hlg"]["sha256"]
    assert decoder.coverage(["the cat sat", "the dog sat"]) == {"lm_oov_rate": 1 / 6, "lm_3gram_hit": None}
    assert lm.choose({"vocabulary": VOCABULARY}) is None  # a char model without an LM decodes greedy
    assert lm.is_graph(graph) and isinstance(lm.settings_of(graph), hlg.HlgDecoding)
    assert lm.GRAPH_RECORD == langstage.RECORD
    assert set(lm.GRAPH_FILES) == {langstage.HLG_FST, langstage.TOKENS, langstage.WORDS, langstage.RECORD}


def test_a_graph_attaches_to_a_model_directory_and_is_found_there(graph, outputs, tmp_path):
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    with pytest.raises(lm.LmError, match=r"decoding\.json: missing: choose the LM's settings first"):
        lm.attach(graph, model_dir)
    tuned = tuned_copy(graph, tmp_path, acoustic_scale=0.7, word_penalty=1.0)
    (model_dir / "lm").mkdir()
    (model_dir / "lm" / "lm.arpa").write_text("an n-gram attached before\n")
    attached = lm.attach(tuned, model_dir)
    assert attached == model_dir / "lm" == lm.attached(model_dir)
    assert sorted(p.name for p in attached.iterdir()) == sorted([*lm.GRAPH_FILES, lm.DECODING])  # no L, no G
    assert sorted(p.name for p in model_dir.iterdir()) == ["lm"]  # no staging left behind
    decoder = lm.choose(phone_data(outputs, lm_dir=str(attached)))
    assert decoder.settings == hlg.HlgDecoding(acoustic_scale=0.7, word_penalty=1.0)
    from models import registry

    tags = registry._attached_lm_tags(model_dir)
    assert tags["speechflow.lm.kind"] == "hlg" and tags["speechflow.lm.word_penalty"] == "1.0"
    assert tags["speechflow.lm.graph_sha256"] == decoder.describe()["lm_graph_sha256"]
    assert lm.attached(tmp_path) is None


def test_the_grid_chooses_the_acoustic_scale_and_word_penalty_and_every_decoder_then_uses_them(
    graph, outputs, tmp_path
):
    lang = tuned_copy(graph, tmp_path)
    decoder = hlg.GraphDecoder(lang, outputs, hlg.HlgDecoding())
    said = [one_hot(outputs, "AH M AE T"), one_hot(outputs, "DH AH K AE T")]
    # At a small acoustic scale the LM's "the mat" (a bigram) wins over the "a mat" the phones say.
    best, grid = hlg.tune(["a mat", "the cat"], said, decoder, [0.05, 1.0], [0.0, 0.5], progress=False)
    assert [(g["word_penalty"], g["acoustic_scale"]) for g in grid] == [
        (0.0, 0.05),
        (0.0, 1.0),
        (0.5, 0.05),
        (0.5, 1.0),
    ]
    assert grid[0]["wer"] > 0 and grid[1]["wer"] == 0.0
    assert best == hlg.HlgDecoding(acoustic_scale=1.0, word_penalty=0.0, **SETTINGS)
    best, _ = hlg.tune(["the mat"], said[:1], decoder, [0.05, 1.0], [0.0], progress=False)
    assert best.acoustic_scale == 0.05
    lm.write_decoding(lang, best, {"split": "dev_engine", "grid": grid})
    assert lm.settings_of(lang) == best == hlg.GraphDecoder(lang, outputs).settings
    assert json.loads((lang / lm.DECODING).read_text())["settings"]["acoustic_scale"] == 0.05


def test_tune_lm_refuses_a_test_split_for_a_graph_too(graph, tmp_path, capsys):
    args = ["--model", str(tmp_path / "m"), "--shards", str(tmp_path), "--lm", str(graph), "--split", "test"]
    assert tune_lm.main(args) == 1
    assert "--split test is a test split: choose decoding settings on a dev split" in capsys.readouterr().err
    assert not (graph / lm.DECODING).exists()


def test_a_graph_that_is_not_the_models_or_not_whole_is_refused(graph, outputs, tmp_path):
    swapped = [outputs[0], outputs[2], outputs[1], *outputs[3:]]
    with pytest.raises(ValueError, match=r"tokens\.txt:2: token 'AA' where the model's output 1 is 'AE'"):
        lm.choose(phone_data(swapped), graph)
    with pytest.raises(ValueError, match=r"tokens\.txt: the graph has 14 CTC outputs and the model 13"):
        lm.choose(phone_data(outputs[:-1]), graph)
    cut = tmp_path / "cut"
    shutil.copytree(graph, cut)
    whole = (cut / "HLG.fst").read_bytes()
    (cut / "HLG.fst").write_bytes(whole[: len(whole) // 2])
    with pytest.raises(ValueError, match=r"cut/HLG\.fst: \d+ bytes where lang\.json records \d+ \(truncated"):
        lm.choose(phone_data(outputs), cut)
    lm.write_decoding(cut, hlg.HlgDecoding(), {})
    with pytest.raises(ValueError, match=r"truncated"):
        lm.attach(cut, tmp_path / "model")
    (cut / "HLG.fst").unlink()
    with pytest.raises(FileNotFoundError, match=r"cut/HLG\.fst: no such file; build it with `python -m pipeline\.lang"):
        lm.choose(phone_data(outputs), cut)


def test_a_phone_model_without_a_graph_or_with_an_lm_of_the_other_kind_is_an_error_naming_the_fix(graph, tmp_path):
    data = phone_data(["<blk>", "AA"])
    fix = "python -m models.tune_lm --model runs/p/model --shards SHARDS --lm LANG_DIR --attach"
    with pytest.raises(lm.LmError, match=f"runs/p/model is a phone model with no decoding graph.*{fix}"):
        lm.choose(data)
    with pytest.raises(lm.LmError, match="runs/p/model is a phone model: it spells words only through its decoding"):
        lm.choose(data, no_lm=True)
    ngram = tmp_path / "ngram"
    ngram.mkdir()
    (ngram / "lm.json").write_text("{}")
    with pytest.raises(lm.LmError, match=f"{ngram} is a word n-gram's directory.*runs/p/model is a phone model"):
        lm.choose(data, ngram)
    char = {"vocabulary": VOCABULARY, "model_dir": "runs/c/model"}
    with pytest.raises(lm.LmError, match=f"{graph} is a decoding graph .*runs/c/model is a char model"):
        lm.choose(char, graph)
    with pytest.raises(ValueError, match="data.json: targets 'words'"):
        lm.choose({**char, "targets": "words"})


def test_word_times_come_from_the_graphs_best_path(graph, outputs):
    assert fsutil.read_json(graph / "lang.json")["optional_silence"] == "SIL"
    decoder = lm.choose(phone_data(outputs), graph)
    # per frame: DH DH _ AH AH _ | K K _ AE AE _ T T _ SIL SIL _ | S S _ AE AE _ T T _
    aligned = decoder.align([one_hot(outputs, "DH AH K AE T SIL S AE T")])
    assert aligned == [[("the", 0, 5), ("cat", 6, 14), ("sat", 18, 26)]]
    from models.asr import transcribe

    rows = transcribe.graph_words(["u1"], aligned, 0.04)
    assert rows[0][:2] == ("u1", "the cat sat")
    assert [(w, round(a, 2), round(d, 2)) for w, a, d in rows[0][2]] == [
        ("the", 0.0, 0.2),
        ("cat", 0.24, 0.32),
        ("sat", 0.72, 0.32),
    ]
    kaldi_lang = langstage.build(LANG, ARPA, graph.parent / "kaldi", langstage.LangConfig(), kind="lang")
    assert kaldi_lang["optional_silence"] is None  # lang_tiny has no phones/optional_silence.txt


def test_the_served_phone_model_refuses_params_that_would_not_give_its_words():
    from models.asr.server import decoding_params
    from models.serving.request_policy import RequestError

    assert decoding_params({}, phones=True) == (0, True)
    assert decoding_params({"lm": True, "beam_width": 0}, phones=True) == (0, True)
    with pytest.raises(RequestError, match=r"param `lm: false`: this is a phone model, which spells words only"):
        decoding_params({"lm": False}, phones=True)
    with pytest.raises(RequestError, match=r"param `beam_width` 8: this is a phone model"):
        decoding_params({"beam_width": 8}, phones=True)
    assert decoding_params({"lm": False, "beam_width": 8}, phones=False) == (8, False)  # a char model's choice


def test_a_served_phone_model_without_a_sound_graph_does_not_start(graph, outputs, tmp_path):
    from models.asr.server import AsrServer

    config = types.SimpleNamespace(input=types.SimpleNamespace(cmvn="utterance"))
    with pytest.raises(lm.LmError, match="phone model with no decoding graph"):
        AsrServer(None, config, phone_data(outputs))
    cut = tmp_path / "lm"
    shutil.copytree(graph, cut)
    (cut / "HLG.fst").write_bytes((cut / "HLG.fst").read_bytes()[:100])
    with pytest.raises(ValueError, match=r"lm/HLG\.fst: 100 bytes where lang\.json records"):
        AsrServer(None, config, phone_data(outputs, lm_dir=str(cut)))
    with pytest.raises(ValueError, match=r"the graph has 14 CTC outputs and the model 3"):
        AsrServer(None, config, phone_data(outputs[:3], lm_dir=str(graph)))


def test_the_logged_model_requires_the_decoder_of_its_attached_lm(graph, tmp_path):
    from models.serving.pyfunc import attached_lm_requirements

    model_dir = tmp_path / "model"
    model_dir.mkdir()
    assert attached_lm_requirements(model_dir) == []
    lm.attach(tuned_copy(graph, tmp_path), model_dir)
    assert attached_lm_requirements(model_dir) == [
        f"kaldifst=={version('kaldifst')}",
        f"kaldi_decoder=={version('kaldi_decoder')}",
    ]
    # a graph decodes with kaldifst and kaldi-decoder alone: kaldilm builds G, and is not imported
    code = "import sys, models.asr.hlg, models.asr.lm; print('kaldilm' in sys.modules)"
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=quiet_env(), capture_output=True, text=True)
    assert proc.stdout.strip() == "False", proc.stderr


def fake_batch(outputs, utterances: list[tuple[str, str, str, str]]):
    """An evaluation batch of (utt_id, transcript, the shards' phones, the phones the posteriors say)
    and the model's output for it: (batch of tf tensors, logits [B, T', outputs], output lengths [B])."""
    import tensorflow as tf

    from models.asr import inference
    from pipeline import text

    said = [one_hot(outputs, heard) for *_, heard in utterances]
    frames = max(len(s) for s in said)
    logits = np.full((len(said), frames, len(outputs)), -30.0, np.float32)  # [B, T', outputs]
    logits[:, :, 0] = 0.0  # blank after the end
    for i, s in enumerate(said):
        logits[i, : len(s)] = s
    feats = [np.zeros((4 * len(s), 3), np.float32) for s in said]  # 4 input frames per output frame
    stats = (np.zeros(3, np.float32), np.ones(3, np.float32))
    batch = dict(inference.features_batch(feats, stats, "none"))
    tokens, token_lengths = text.pad_batch([text.encode(words, VOCABULARY) for _, words, _, _ in utterances])
    phones, phone_lengths = text.pad_batch([[outputs.index(p) for p in ph.split()] for _, _, ph, _ in utterances])
    batch.update(tokens=tokens, token_lengths=token_lengths, phones=phones, phone_lengths=phone_lengths)
    batch["utt_id"] = np.array([u.encode() for u, *_ in utterances])
    batch["speaker"] = np.array([b"spk"] * len(utterances))
    lengths = np.asarray([len(s) for s in said], np.int32)
    return {k: tf.constant(v) for k, v in batch.items()}, tf.constant(logits), tf.constant(lengths)


def test_the_evaluation_of_a_phone_model_scores_its_phones_and_its_words_through_the_graph(
    graph, outputs, tmp_path, monkeypatch
):
    from models.asr import evaluation, phone_evaluation

    batch, logits, lengths = fake_batch(
        outputs,
        [
            ("u1", "the cat sat", "DH AH K AE T S AE T", "DH AH K AE T S AE T"),
            ("u2", "the mat", "DH AH M AE T", "AH M AE T"),  # DH not heard: "a mat"
        ],
    )
    monkeypatch.setattr(phone_evaluation.asr, "forward", lambda model, feats, feat_lengths: (logits, lengths))
    cfg = types.SimpleNamespace(lm=str(graph), no_lm=False, beam_width=4, frames_per_batch=1000)
    data = phone_data(outputs, words=["the", "cat", "sat"])
    metrics = evaluation.evaluate(None, None, data, lambda split, n: [batch], ["dev"], cfg, tmp_path)
    assert metrics["primary_metric"] == "dev_wer_lm" and metrics["lm_kind"] == "hlg"
    assert metrics["dev_per"] == metrics["dev_per_beam"] == pytest.approx(1 / 13)
    assert (metrics["dev_phones"], metrics["dev_phone_del"], metrics["dev_phone_sub"], metrics["dev_phone_ins"]) == (
        13,
        1,
        0,
        0,
    )
    assert metrics["dev_wer_lm"] == pytest.approx(1 / 5) and metrics["dev_word_sub_lm"] == 1
    assert metrics["dev_cer_lm"] == pytest.approx(3 / 18)  # "the mat" -> "a mat": 2 del + 1 sub of 18 chars
    assert metrics["dev_lm_oov_rate"] == 0.0 and metrics["dev_oov_rate"] == pytest.approx(1 / 5)  # "mat"
    assert 0 < metrics["dev_decode_rtf_lm"] < 1
    rows = (tmp_path / "dev_hypotheses.tsv").read_text().splitlines()
    assert rows[0].split("\t") == ["utt_id", "reference", "phones_reference", "greedy", "beam", "words"]
    assert rows[2].split("\t") == ["u2", "the mat", "DH AH M AE T", "AH M AE T", "AH M AE T", "a mat"]
    assert "%PER 7.69 [ 1 / 13, 0 ins, 1 del, 0 sub ]" in (tmp_path / "dev_wer.txt").read_text()
    speakers = (tmp_path / "dev_speakers.tsv").read_text().splitlines()
    assert speakers[0] == "speaker\tutterances\tphones\tper\tper_beam\twords\twer_lm\tcer_lm"
    assert speakers[1].split("\t") == ["spk", "2", "13", "0.0769", "0.0769", "5", "0.2000", "0.1667"]


def test_the_try_page_says_a_phone_model_spells_through_its_graph():
    from apps import try_page

    champion = {"url": "http://127.0.0.1:1", "name": "asr", "version": 3, "alias": "champion"}
    assert "phone model" not in try_page.header("asr", champion)
    assert "spells the words through its decoding graph" in try_page.header("asr", {**champion, "targets": "phones"})


def test_shards_without_the_phone_models_phone_targets_are_refused_before_it_is_scored():
    import dataclasses

    from models.evaluate import check_vocabulary
    from tests.conftest import shard_set

    shards = shard_set({"dev": {}}, vocabulary=VOCABULARY)
    data = phone_data(["<blk>", "AA", "AE"])
    with pytest.raises(ValueError, match=r"hold no phone targets, which the phone model in runs/p is scored against"):
        check_vocabulary(data, shards, "runs/p")
    other = dataclasses.replace(shards, phone_vocabulary=("<blk>", "AA", "IY"))
    with pytest.raises(ValueError, match=r"another table .* only the shards': \['IY'\], only the model's: \['AE'\]"):
        check_vocabulary(data, other, "runs/p")
    check_vocabulary(data, dataclasses.replace(shards, phone_vocabulary=("<blk>", "AA", "AE")), "runs/p")
    check_vocabulary({"vocabulary": VOCABULARY}, shards, "runs/c")  # a char model needs no phones
