"""pipeline.augment: the plan of copies (pure) and real runs of the stage through `main()` on a tiny
data directory of wavs; where the acoustic model's settings choose the split it trains on."""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from common import config as configlib
from models.training.config import TrainConfig
from pipeline import augment, kaldi
from pipeline.augment import Utterance, plan_copies
from pipeline.augment_config import CopiesConfig
from tests.kaldi_fixtures import make_wav_dir

ALL = CopiesConfig(speed_factors=(0.9, 1.1), reverb_share=0.5, noise_share=0.5, telephone_share=0.5)
UTTS = [Utterance(f"spk{i % 3}-utt{i:03d}", f"spk{i % 3}", f"words {i}") for i in range(20)]
PREFIXES = {"speed": None, "reverb": "rvb1-", "noise": "noise1-", "telephone": "tel1-"}


def sorted_as_kaldi_wants(utt2spk: dict[str, str]) -> bool:
    """utils/validate_data_dir.sh: utt2spk sorted by utterance is also sorted by speaker."""
    by_utt = sorted(utt2spk.items())
    return by_utt == sorted(by_utt, key=lambda item: (item[1], item[0]))


# --- the plan -----------------------------------------------------------------------------------
def test_the_plan_names_copies_as_kaldi_does_and_takes_exact_shares():
    copies = plan_copies(ALL, UTTS)
    kinds = {kind: [c for c in copies if c.kind == kind] for kind in PREFIXES}
    assert {k: len(v) for k, v in kinds.items()} == {"speed": 40, "reverb": 10, "noise": 10, "telephone": 10}
    source = {u.utt_id: u for u in UTTS}
    for c in copies:
        prefix = f"sp{c.effects[1]}-" if c.kind == "speed" else PREFIXES[c.kind]
        assert c.utt_id == prefix + c.source and c.speaker == prefix + source[c.source].speaker
        assert c.text == source[c.source].text
    assert {c.utt_id.split("-")[0] for c in kinds["speed"]} == {"sp0.9", "sp1.1"}
    assert kinds["speed"][0].effects in (("speed", "0.9"), ("speed", "1.1"))
    assert all(c.effects[0] == "reverb" and len(c.effects) == 6 for c in kinds["reverb"])
    assert all(c.codec in ("mulaw", "gsm") and c.effects == ("sinc", "300-3400") for c in kinds["telephone"])
    for c in kinds["noise"]:
        assert 5.0 <= c.snr_db <= 20.0 and (c.source not in c.babble)
        assert (c.noise == "babble") == bool(c.babble) and (not c.babble or 3 <= len(c.babble) <= 6)
    assert copies == sorted(copies)
    everything = {**{u.utt_id: u.speaker for u in UTTS}, **{c.utt_id: c.speaker for c in copies}}
    assert sorted_as_kaldi_wants(everything)
    assert plan_copies(CopiesConfig(), UTTS) == []


def test_every_draw_is_the_utterances_own():
    shuffled = random.Random(1).sample(UTTS, len(UTTS))
    assert plan_copies(ALL, shuffled) == plan_copies(ALL, UTTS), "the input's order changes nothing"
    # A copy's room, noise and codec depend on (seed, kind, utterance) only, not on the others.
    fewer = {c.utt_id: c for c in plan_copies(ALL, UTTS[:12]) if c.kind in ("reverb", "telephone")}
    more = {c.utt_id: c for c in plan_copies(ALL, UTTS) if c.kind in ("reverb", "telephone")}
    shared = set(fewer) & set(more)
    assert shared and all(fewer[u] == more[u] for u in shared)
    other = plan_copies(dataclasses.replace(ALL, seed=1), UTTS)
    assert {c.utt_id for c in other if c.kind == "reverb"} != {u for u, c in more.items() if c.kind == "reverb"}


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("speed_factors", [1.0, 1.1], "speed_factors .* other than 1.0"),
        ("speed_factors", [0.9, 0.9], "distinct factors"),
        ("reverb_share", 1.5, "reverb_share 1.5: a share"),
        ("noise_snr_db", [20, 5], "noise_snr_db \\[20.0, 5.0\\]: two values, low <= high"),
        ("noise_kinds", ["babble", "rain"], "noise_kinds .* one or more of"),
        ("telephone_codecs", [], "telephone_codecs"),
    ],
)
def test_settings_out_of_range_name_their_key(key, value, message):
    with pytest.raises(ValueError, match=message):
        configlib.load(TrainConfig, assignments=[f"asr.augment.copies.{key}={value}"])


def test_the_acoustic_models_copies_choose_its_training_split_and_the_synthesis_model_has_none():
    assert TrainConfig().train_split == "train" and TrainConfig().audio_copies is None
    asked = configlib.load(TrainConfig, assignments=["asr.augment.copies.speed_factors=[0.9, 1.1]"])
    assert asked.train_split == "train_aug" and asked.audio_copies.speed_factors == (0.9, 1.1)
    assert configlib.load(TrainConfig, assignments=["asr.augment.copies.noise_share=0.2"]).train_split == "train_aug"
    # Another model's section in a file is ignored: the synthesis model reads clean audio only.
    tts = configlib.load(TrainConfig, assignments=["model=tts", "asr.augment.copies.speed_factors=[0.9]"])
    assert tts.train_split == "train" and tts.audio_copies is None
    with pytest.raises(ValueError, match="did you mean 'asr.augment.copies.speed_factors'"):
        configlib.load(TrainConfig, assignments=["asr.augment.copies.speed_factor=[0.9]"])


# --- the stage, for real ------------------------------------------------------------------------
SETS = ["speed_factors=[0.9, 1.1]", "reverb_share=0.5", "noise_share=0.5", "telephone_share=0.5"]


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """A tiny wav data dir (6 utterances of 0.5 s) and its augmented copy, made with 2 jobs."""
    root = tmp_path_factory.mktemp("aug")
    train = make_wav_dir(root / "train", num_utts=6, seconds=0.5)
    (train / "utt2voice").write_text("".join(f"spk{i % 2}-utt{i:03d} espeak-ng:en\n" for i in range(6)))
    settings = [a for s in SETS for a in ("--set", s)]
    args = ["--data", str(train), "--out", str(root / "train_aug"), "--jobs", "2", "--no-progress", *settings]
    assert augment.main(args) == 0
    return train, root / "train_aug"


def tables(out: Path) -> dict[str, dict[str, str]]:
    return {name: kaldi.read_table(out / name).values for name in ("wav.scp", "text", "utt2spk", "utt2voice")}


def test_the_stage_writes_real_16khz_copies_of_the_lengths_each_kind_makes(made):
    train, out = made
    t = tables(out)
    clean = kaldi.read_table(train / "wav.scp").values
    assert all(t["wav.scp"][u] == p for u, p in clean.items()), "the clean utterances keep their entries"
    assert len(t["wav.scp"]) == 6 + 12 + 3 * 3 and set(t["utt2voice"]) == set(t["utt2spk"])
    assert sorted_as_kaldi_wants(t["utt2spk"])
    spk2utt = kaldi.read_table(out / "spk2utt").values
    assert spk2utt["sp0.9-spk0"] == "sp0.9-spk0-utt000 sp0.9-spk0-utt002 sp0.9-spk0-utt004"
    for utt, path in t["wav.scp"].items():
        if utt in clean:
            continue
        info = sf.info(path)
        assert (info.samplerate, info.channels, info.subtype, Path(path).parent) == (16000, 1, "PCM_16", out / "wav")
        expected = 0.5 / float(utt[2:5]) if utt.startswith("sp") else 0.5
        assert abs(info.duration - expected) < 0.002, (utt, info.duration)
        samples, _ = sf.read(path, dtype="int16")
        assert np.abs(samples.astype(float)).max() > 1000, f"{utt} is silent"

    # The telephone channel: above its 3.4 kHz band a hundredth of the clean tone's noise at most.
    def high_band(path: str) -> float:
        spectrum = np.abs(np.fft.rfft(sf.read(path)[0])) ** 2  # [bins over 0-8 kHz]
        return spectrum[len(spectrum) * 4200 // 8000 :].sum()

    for tel in (u for u in t["wav.scp"] if u.startswith("tel1-")):
        assert high_band(t["wav.scp"][tel]) < 0.01 * high_band(clean[tel[len("tel1-") :]]), tel
    # Noise at the drawn SNR: the copy minus its clean original.
    plan = {c.utt_id: c for c in plan_copies(configlib.load(CopiesConfig, assignments=SETS), _utts(train))}
    for utt in (u for u in t["wav.scp"] if u.startswith("noise1-")):
        noisy, clean_wave = sf.read(t["wav.scp"][utt])[0], sf.read(clean[plan[utt].source])[0]
        snr = 10 * np.log10(np.mean(clean_wave**2) / np.mean((noisy - clean_wave) ** 2))
        assert abs(snr - plan[utt].snr_db) < 0.5, (utt, plan[utt].noise, snr, plan[utt].snr_db)


def _utts(train: Path) -> list[Utterance]:
    spk, text = kaldi.read_table(train / "utt2spk").values, kaldi.read_table(train / "text").values
    return [Utterance(u, spk[u], text[u]) for u in sorted(spk)]


def test_the_same_bytes_with_one_job_a_rerun_does_nothing_and_new_settings_drop_stale_copies(made, tmp_path):
    train, out = made
    one = tmp_path / "one"
    args = ["--data", str(train), "--no-progress", *(a for s in SETS for a in ("--set", s))]
    assert augment.main([*args, "--out", str(one), "--jobs", "1"]) == 0
    for wav in (out / "wav").iterdir():
        assert (one / "wav" / wav.name).read_bytes() == wav.read_bytes(), wav.name
    mtimes = {p.name: p.stat().st_mtime_ns for p in (one / "wav").iterdir()}
    summary = augment.augment_data_dir(train, one, configlib.load(CopiesConfig, assignments=SETS), progress=False)
    assert summary["skipped"] and {p.name: p.stat().st_mtime_ns for p in (one / "wav").iterdir()} == mtimes
    fewer = augment.augment_data_dir(train, one, CopiesConfig(speed_factors=(0.9,)), progress=False)
    assert not fewer["skipped"] and fewer["kinds"] == {"speed": 6}
    assert sorted(p.name[:5] for p in (one / "wav").iterdir()) == ["sp0.9"] * 6, "stale copies are gone"


def test_mistakes_are_named_with_their_fix(made, tmp_path, capsys):
    train, _ = made
    assert augment.main(["--data", str(tmp_path / "none"), "--out", str(tmp_path / "o")]) == 1
    assert "wav.scp is missing" in capsys.readouterr().err
    assert augment.main(["--data", str(train), "--out", str(train)]) == 1
    assert "name a directory of its own" in capsys.readouterr().err
    broken = tmp_path / "broken"
    make_wav_dir(broken, num_utts=2)
    (broken / "wav" / "spk1-utt001.wav").write_bytes(b"RIFF")
    assert augment.main(["--data", str(broken), "--out", str(tmp_path / "o"), "--set", "speed_factors=[0.9]"]) == 1
    assert "spk1-utt001: its audio" in capsys.readouterr().err


# --- the seam: which split each model trains on -------------------------------------------------
def test_the_acoustic_model_trains_on_its_copies_and_the_synthesis_model_on_clean_train(
    tmp_path, tiny_shards, mlflow_uri
):
    import json

    from models import train
    from pipeline import dataset, records, shards
    from tests.kaldi_fixtures import make_feats_dir
    from tests.test_train import tiny

    splits = {
        name: make_feats_dir(tmp_path / name, num_utts=n, dim=13, frames=(30, 70), seed=seed)[0]
        for name, n, seed in (("train", 12, 3), ("train_aug", 36, 5))
    }
    shards.make_shards(splits, tmp_path / "shards", shards.ShardConfig(num_shards=2, jobs=1), progress=False)
    shard_set = records.open_shard_set(tmp_path / "shards")
    asr = tiny("asr", "epochs=1", "log_model=false", "asr.augment.copies.speed_factors=[0.9, 1.1]")
    epoch = {s: dataset.batch_plan(shard_set.split(s), 1, asr.input, training=True).batches for s in splits}
    assert epoch["train"] < epoch["train_aug"]
    assert train.train(asr, tmp_path / "shards", tmp_path / "asr")["steps"] == epoch["train_aug"]
    # Served with the statistics of the split it trained on (split-wide CMVN normalizes by them).
    data = json.loads((tmp_path / "asr" / "model" / "data.json").read_text())
    assert np.allclose(data["mel_mean"], dataset.mel_stats(shard_set, "train_aug")[0])
    assert not np.allclose(data["mel_mean"], dataset.mel_stats(shard_set, "train")[0])
    # The synthesis model reads clean audio whatever the acoustic model's section of a file says.
    tts = tiny("tts", "epochs=1", "log_model=false", "asr.augment.copies.speed_factors=[0.9]")
    assert tts.input == asr.input
    assert train.train(tts, tmp_path / "shards", tmp_path / "tts")["steps"] == epoch["train"]
    # Shards without the augmented split: the fix is named.
    with pytest.raises(ValueError, match=r"'train_aug'.*python -m pipeline.augment --data DATA/train"):
        train.train(asr, tiny_shards, tmp_path / "missing")


def test_the_dag_records_the_copies_in_mlflow_as_a_stage_of_their_own(made):
    from models import registry

    _, out = made
    params, metrics, artifacts = registry.stage_outputs("augment", out)
    assert metrics["copies"] == 21 and metrics["copies.speed"] == 12 and metrics["utterances"] == 6
    assert params["augment.speed_factors"] == [0.9, 1.1] and artifacts == [out / "augment.json"]
