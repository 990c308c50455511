"""pipeline.corpus: the plan (pure, nothing synthesized) and real tiny runs through `main()`."""

from __future__ import annotations

import json
import logging
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from common import voices
from pipeline import corpus, corpus_plan, grammar, open_text, synthesizers
from pipeline.corpus import CorpusConfig
from pipeline.corpus_plan import plan_corpus, select_voices
from pipeline.synthesizers import VoiceInventory

ALL_SPLITS = corpus_plan.ALL_SPLITS
DEFAULTS = CorpusConfig()
ESPEAK = [voices.parse(v)[1] for v in (*DEFAULTS.train_voices, *DEFAULTS.test_voices) if v.startswith("espeak-ng:")]
ALL_BASES = frozenset(v.partition("+")[0] for v in ESPEAK)
ALL_VARIANTS = frozenset(v.partition("+")[2] for v in ESPEAK)
FLITE = frozenset({"awb", "rms", "slt", "kal16", "kal"})
FESTIVAL = frozenset({"ked_diphone", "kal_diphone", "cmu_us_slt_arctic_hts"})


def inventory(variants=ALL_VARIANTS, flite=FLITE, bases=ALL_BASES, festival=FESTIVAL) -> VoiceInventory:
    espeak = bases | {f"+{v}" for v in variants}
    return VoiceInventory({"espeak-ng": espeak, "flite": flite, "festival": festival})


def by_split(plan, field):
    return {s: {getattr(u, field) for u in plan if u.split == s} for s in corpus_plan.SPLITS}


# --- the plan -----------------------------------------------------------------------------------
def test_plan_of_open_text_has_thousands_of_words_and_new_ones_in_test():
    plan = plan_corpus(CorpusConfig())
    texts = by_split(plan, "text")
    heard = {w for t in texts["train"] for w in t.split()}
    assert len(heard) > 3000 and not heard <= grammar.grammar_vocabulary()
    assert not texts["test"] & texts["train"] and texts["test_engine"] == texts["test"]
    assert 0.05 < open_text.oov_rates({"test": sorted(texts["test"])}, heard)["test"] < 0.5
    for u in plan:
        assert re.fullmatch(r"[a-z']+( [a-z']+)*", u.text), u.text
        assert 3 <= len(u.text.split()) <= 14, u.text


def test_plan_has_a_few_hundred_words_and_spoken_form_transcripts():
    plan = plan_corpus(CorpusConfig(text="grammar"))
    assert {s: sum(u.split == s for u in plan) for s in corpus_plan.SPLITS} == {
        "train": 2000,
        "dev": 250,
        "test": 250,
        "test_engine": 250,
        "dev_engine": 250,
    }
    words = {w for u in plan for w in u.text.split()}
    assert 300 <= len(words) <= 500
    assert words <= grammar.grammar_vocabulary()
    assert len({u.utt_id for u in plan}) == len(plan)
    for u in plan:
        assert re.fullmatch(r"[a-z']+( [a-z']+)*", u.text), u.text
        assert 3 <= len(u.text.split()) <= 14, u.text
        assert u.utt_id.startswith(u.speaker + "-")


def test_plan_holds_test_voices_and_sentences_out_of_training():
    plan = plan_corpus(CorpusConfig())
    specs, speakers, texts = by_split(plan, "spec"), by_split(plan, "speaker"), by_split(plan, "text")
    assert not specs["train"] & specs["test"] and not specs["train"] & specs["test_engine"]
    assert len(speakers["train"]) >= 8 and len(speakers["test"]) >= 3
    assert speakers["dev"] <= speakers["train"]
    assert not texts["dev"] & texts["train"]
    assert not texts["test"] & (texts["train"] | texts["dev"])
    # dev_engine: sentences of its own in the held-out engines' voices, for choosing decoding settings
    assert specs["dev_engine"] == specs["test_engine"]
    assert not texts["dev_engine"] & (texts["train"] | texts["dev"] | texts["test"])
    # drawn last: without it, every other split says the same sentences in the same voices
    without = plan_corpus(CorpusConfig(dev_engine_fraction=0))
    assert [u for u in plan if u.split != "dev_engine"] == without and "dev_engine" not in corpus_plan.corpus_splits(
        without
    )


def test_training_hears_every_engine_and_test_engine_is_the_test_sentences_in_held_out_speakers():
    plan = plan_corpus(CorpusConfig())
    train = [u for u in plan if u.split == "train"]
    natural = {u.spec for u in train if u.engine != "espeak-ng"}
    assert natural == {"flite:awb", "flite:rms", "festival:ked_diphone"} == set(voices.NATURAL_TRAIN_VOICES)
    # natural_share: a quarter of train and dev, over seven speakers a voice at varied rate and warp.
    for split in ("train", "dev"):
        utts = [u for u in plan if u.split == split]
        assert sum(u.engine != "espeak-ng" for u in utts) == round(0.25 * len(utts))
    awb = {(u.rate, u.pitch, u.warp) for u in train if u.voice == "awb"}
    assert len(awb) == 7 and all(90 <= r <= 130 and 85 <= p <= 190 and 90 <= w <= 120 for r, p, w in awb)
    assert {p for u in train if u.voice == "rms" for p in [u.pitch]} == {0}  # rms keeps its own pitch
    assert len({u.speaker for u in train if u.engine == "festival"}) == 7
    half = [u for u in plan_corpus(CorpusConfig(natural_share=0.5)) if u.split == "train"]
    assert sum(u.engine != "espeak-ng" for u in half) == 1000
    test = {u.utt_id.rsplit("-", 1)[1]: u.text for u in plan if u.split == "test"}
    engine = [u for u in plan if u.split == "test_engine"]
    assert {u.utt_id.rsplit("-", 1)[1]: u.text for u in engine} == test
    # slt and kal in every rendering, as they ship, each about a fifth.
    assert {u.spec for u in engine} == set(voices.TEST_ENGINE_VOICES) and {
        (u.rate, u.pitch, u.warp) for u in engine
    } == {(100, 0, 100)}
    assert {sum(u.spec == v for u in engine) for v in voices.TEST_ENGINE_VOICES} == {50}
    assert corpus_plan.corpus_splits(plan) == ALL_SPLITS


def test_engines_choose_the_voices_and_without_flite_there_is_no_test_engine():
    plan = plan_corpus(CorpusConfig(engines=("espeak-ng",)))
    assert {u.engine for u in plan} == {"espeak-ng"} and "test_engine" not in corpus_plan.corpus_splits(plan)
    assert sum(u.split == "train" for u in plan) == 2000  # the corpus keeps its size
    flite_only = CorpusConfig(engines=("flite",), test_voices=("flite:kal",), test_engine_voices=("flite:slt",))
    assert {u.spec for u in plan_corpus(flite_only)} == {"flite:awb", "flite:rms", "flite:kal", "flite:slt"}
    # espeak-ng alone: no natural voice, so no natural share.
    assert plan_corpus(CorpusConfig(engines=("espeak-ng",), natural_share=0.5))[0].engine == "espeak-ng"
    with pytest.raises(ValueError, match=r"only 2 train and 0 test voices of the engines in use \(flite\)"):
        plan_corpus(CorpusConfig(engines=("flite",)))


def test_plan_is_deterministic_for_a_seed_and_differs_for_another():
    assert plan_corpus(CorpusConfig(seed=3)) == plan_corpus(CorpusConfig(seed=3))
    other = plan_corpus(CorpusConfig(seed=4))
    assert [u.text for u in plan_corpus(CorpusConfig(seed=3))] != [u.text for u in other]


def test_missing_voices_are_skipped_without_moving_the_others():
    config = CorpusConfig()
    no_klatt = inventory(ALL_VARIANTS - {"klatt"})
    train, test, test_engine, skipped = select_voices(config, no_klatt)
    assert skipped == [v for v in config.train_voices if v.endswith("+klatt")]
    assert len(train) == len(config.train_voices) - len(skipped) and test == list(config.test_voices)
    assert test_engine == list(config.test_engine_voices)
    full = {u.speaker for u in plan_corpus(config)}
    for u in plan_corpus(config, no_klatt):
        assert not u.voice.endswith("+klatt")
        assert u.speaker in full  # same rates and pitches as with every voice

    with pytest.raises(ValueError, match=r"only 1 train and 0 test voices .*need 2 and 1"):
        select_voices(config, inventory(frozenset({"m1"}), frozenset({"slt", "kal16"}), frozenset({"en"}), frozenset()))
    with pytest.raises(ValueError, match=r"none of the test_engine voices .*flite:slt"):
        select_voices(config, inventory(flite=FLITE - {"slt", "kal16", "kal"}, festival=frozenset()))


def test_config_rejects_overlapping_voices_and_empty_splits():
    with pytest.raises(ValueError, match="both train_voices and test_voices"):
        CorpusConfig(test_voices=("espeak-ng:en+m1", "espeak-ng:en+m3"))
    with pytest.raises(ValueError, match="both train_voices and test_engine_voices"):
        CorpusConfig(test_engine_voices=("flite:awb",))
    with pytest.raises(ValueError, match="at least 10"):
        CorpusConfig(num_utterances=4)
    with pytest.raises(ValueError, match="not a espeak-ng voice name"):
        CorpusConfig(test_voices=("espeak-ng:en m3",))
    with pytest.raises(ValueError, match=r"'en\+m3' does not name its engine: write ENGINE:VOICE"):
        CorpusConfig(test_voices=("en+m3",))
    with pytest.raises(ValueError, match="engines must be a non-empty selection"):
        CorpusConfig(engines=("mbrola",))
    with pytest.raises(ValueError, match="natural_share must lie in 0-1"):
        CorpusConfig(natural_share=1.5)
    with pytest.raises(ValueError, match="widen the range"):
        plan_corpus(CorpusConfig(max_words=2, min_words=1, text="grammar"))
    with pytest.raises(ValueError, match="text must be one of"):
        CorpusConfig(text="poetry")
    with pytest.raises(ValueError, match="usable sentences of 3-14 words, fewer than num_utterances"):
        plan_corpus(CorpusConfig(), sentences=["a short sentence here"] * 3)


def test_numbers_are_spelled_as_spoken():
    assert grammar.number_to_words(0) == "zero"
    assert grammar.number_to_words(23) == "twenty three"
    assert grammar.number_to_words(105) == "one hundred and five"
    assert grammar.number_to_words(2040) == "two thousand and forty"
    assert grammar.number_to_words(9999) == "nine thousand nine hundred and ninety nine"
    ordinals = ["first", "twelfth", "twentieth", "twenty second", "thirty first"]
    assert [grammar.ordinal_to_words(n) for n in (1, 12, 20, 22, 31)] == ordinals


def test_mix_at_snr_hits_the_target():
    rng = np.random.default_rng(0)
    clean = (rng.standard_normal(16000) * 3000).astype(np.int16)
    noisy, snr = corpus.mix_at_snr(clean, rng.standard_normal(16000) * 7.0, 15.0)
    residual = noisy.astype(np.float64) - clean
    measured = 10 * np.log10(np.sum(clean.astype(np.float64) ** 2) / np.sum(residual**2))
    assert abs(measured - 15.0) < 0.05 and snr == pytest.approx(measured)


def test_missing_tool_names_it_and_the_install_command(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no engine, no sox there
    with pytest.raises(FileNotFoundError, match=r"sox is not on PATH.*apt-get install espeak-ng flite festival .*sox"):
        corpus.build_corpus(CorpusConfig(num_utterances=10), tmp_path / "out")
    with pytest.raises(
        FileNotFoundError, match=r"festival is not on PATH.*or leave festival's voices out with `--engines`"
    ):
        synthesizers.tools_of(["festival"])


def test_an_engine_that_is_not_installed_is_left_out_with_its_packages_named(tmp_path, monkeypatch, caplog):
    bin_dir = tmp_path / "bin"  # every tool but festival
    bin_dir.mkdir()
    for name in ("espeak-ng", "flite", "sox"):
        (bin_dir / name).symlink_to(shutil.which(name))
    monkeypatch.setenv("PATH", str(bin_dir))
    with caplog.at_level(logging.WARNING, logger="pipeline.corpus"):
        summary = corpus.build_corpus(CorpusConfig(num_utterances=10), tmp_path / "out", jobs=2)
    assert "festival is not installed here: its voices are left out" in caplog.text
    assert "apt-get install festival festvox-kdlpc16k festvox-kallpc16k festvox-us-slt-hts" in caplog.text
    assert "festival:ked_diphone" in summary["skipped_voices"] and "festival" not in summary["engines"]["train"]


def synthesize(tmp_path, engine: str, voice: str, rate: int, pitch: int, warp: int = 100) -> np.ndarray:
    """One sentence through the corpus' own engine and sox commands: [samples] int16 at 16 kHz."""
    utt = corpus_plan.PlannedUtterance(
        "train", f"u-{voice}-{rate}-{pitch}-{warp}", "s", engine, voice, rate, pitch, "the taxi is late", warp
    )
    tools = synthesizers.tools_of([engine])
    synthesizers.synthesize(utt, tmp_path / f"{utt.utt_id}.wav", 16000, CorpusConfig().amplitude, tools)
    audio, rate_hz = sf.read(tmp_path / f"{utt.utt_id}.wav", dtype="int16")
    assert rate_hz == 16000
    return audio


def test_flite_rate_and_pitch_change_the_speech_and_rms_ignores_the_pitch(tmp_path):
    slow, fast = synthesize(tmp_path, "flite", "awb", 130, 120), synthesize(tmp_path, "flite", "awb", 90, 120)
    assert 1.3 < len(slow) / len(fast) < 1.6
    assert not np.array_equal(
        synthesize(tmp_path, "flite", "awb", 100, 90), synthesize(tmp_path, "flite", "awb", 100, 180)
    )
    # pipeline/engines/flite.py OWN_PITCH: once rms follows int_f0_target_mean, its speakers can vary in pitch too.
    assert np.array_equal(synthesize(tmp_path, "flite", "rms", 100, 90), synthesize(tmp_path, "flite", "rms", 100, 180))


def test_flite_warp_moves_the_formants_and_keeps_the_pace(tmp_path):
    def centroid(audio):  # Hz: where the spectrum's energy lies
        power = np.abs(np.fft.rfft(audio.astype(np.float64))) ** 2
        return float((np.fft.rfftfreq(len(audio), 1 / 16000) * power).sum() / power.sum())

    plain, warped = synthesize(tmp_path, "flite", "awb", 100, 120), synthesize(tmp_path, "flite", "awb", 100, 120, 120)
    assert 0.93 < len(warped) / len(plain) < 1.07, "the warp keeps the speaking rate"
    assert centroid(warped) > 1.1 * centroid(plain), "and moves the spectrum up"


def test_festival_stretch_slows_every_voice_and_renders_a_batch_in_one_process(tmp_path, monkeypatch):
    for voice in ("ked_diphone", "cmu_us_slt_arctic_hts"):
        slow, plain = synthesize(tmp_path, "festival", voice, 130, 0), synthesize(tmp_path, "festival", voice, 100, 0)
        assert 1.15 < len(slow) / len(plain) < 1.5, voice
    calls = []
    run_status = synthesizers.run_status
    monkeypatch.setattr(synthesizers, "run_status", lambda cmd, **kw: calls.append(cmd) or run_status(cmd, **kw))
    utts = [
        corpus_plan.PlannedUtterance("test", f"u{i}", "s", "festival", v, 100, 0, f'say "{i}" now', 100)
        for i, v in enumerate(["kal_diphone", "cmu_us_slt_arctic_hts", "kal_diphone"])
    ]
    wavs = [tmp_path / f"{u.utt_id}.wav" for u in utts]
    synthesizers.engine("festival").render(utts, wavs, 16000, 60, synthesizers.tools_of(["festival"]))
    assert sum(cmd[0].endswith("festival") for cmd in calls) == 1
    assert all(sf.info(w).samplerate == 16000 and sf.info(w).duration > 0.5 for w in wavs)
    assert not list(tmp_path.glob("*.festival.wav"))


# --- real runs ----------------------------------------------------------------------------------
# Every engine in training; kal (8 kHz) and slt HTS (32 kHz) among the held-out voices show the resampling.
VOICES = ["--train-voices", "espeak-ng:en+m1", "espeak-ng:en-us+f3", "festival:ked_diphone", "flite:awb", "flite:rms"]
ARGS = [
    "--num-utterances",
    "40",
    "--seed",
    "7",
    *VOICES,
    "--test-engine-voices",
    "flite:slt",
    "flite:kal16",
    "flite:kal",
    "festival:cmu_us_slt_arctic_hts",
    "--set",
    "speakers_per_voice=[[flite, 1], [festival, 1]]",  # each voice one speaker, heard in 32 utterances
]


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("corpus") / "a"
    corpus.main(["--out", str(out), *ARGS, "--jobs", "2"])
    return out


def read_table(path: Path) -> list[tuple[str, str]]:
    return [tuple(line.split(" ", 1)) for line in path.read_text().splitlines()]


def test_real_run_writes_valid_sorted_kaldi_dirs(built):
    summary = json.loads((built / "corpus.json").read_text())
    for split in ALL_SPLITS:
        tables = {n: read_table(built / split / n) for n in ("wav.scp", "text", "utt2spk", "spk2utt")}
        ids = [k for k, _ in tables["utt2spk"]]
        assert ids == sorted(ids) and len(set(ids)) == len(ids) == summary["counts"][split]
        assert [k for k, _ in tables["wav.scp"]] == ids == [k for k, _ in tables["text"]]
        utt2spk = dict(tables["utt2spk"])
        assert all(utt.startswith(spk + "-") for utt, spk in utt2spk.items())
        # Kaldi's rule: sorting by speaker must keep the utterances in the same order.
        assert sorted(ids, key=lambda u: (utt2spk[u], u)) == ids
        spk2utt = {spk: utts.split() for spk, utts in tables["spk2utt"]}
        assert list(spk2utt) == sorted(spk2utt) == summary["speakers"][split]
        assert {u: s for s, us in spk2utt.items() for u in us} == utt2spk
        for _, path in tables["wav.scp"]:
            assert Path(path).is_absolute() and Path(path).is_file() and Path(path).parent == built / "wav" / split
    assert read_table(built / "test_noisy" / "text") == read_table(built / "test" / "text")
    held_out = ["festival:cmu_us_slt_arctic_hts", "flite:kal", "flite:kal16", "flite:slt"]
    assert summary["voices"]["train"] == sorted(VOICES[1:]) and summary["voices"]["test_engine"] == held_out
    assert not set(summary["voices"]["train"]) & set(summary["voices"]["test"] + summary["voices"]["test_engine"])
    assert (
        summary["engines"]["test_engine"] == {"festival": 1, "flite": 3}
        and sum(summary["engines"]["train"].values()) == 32
    )
    assert 0.1 < summary["natural_share_seconds"] < 0.5
    for split in ALL_SPLITS:  # utt2voice: each utterance's engine and voice
        utt2voice = dict(read_table(built / split / "utt2voice"))
        assert list(utt2voice) == [u for u, _ in read_table(built / split / "text")]
        assert set(utt2voice.values()) == set(summary["voices"][split])
        for utt, spec in utt2voice.items():  # the speaker id (the utterance id's start) names the voice
            engine, voice = voices.parse(spec)
            assert utt.startswith(f"{engine}-{voice}-" if engine != "espeak-ng" else f"{voice.replace('+', '-')}-r"), (
                utt
            )
    number = {u.rsplit("-", 1)[1]: t for u, t in read_table(built / "test" / "text")}
    assert {u.rsplit("-", 1)[1]: t for u, t in read_table(built / "test_engine" / "text")} == number


def test_real_run_wavs_are_16k_mono_16bit_speech(built):
    for split in ALL_SPLITS:
        for utt, path in read_table(built / split / "wav.scp"):
            info = sf.info(path)
            assert (info.samplerate, info.channels, info.subtype) == (16000, 1, "PCM_16"), utt
            audio, _ = sf.read(path, dtype="int16")
            assert len(audio) > 8000, utt  # over half a second
            assert np.sqrt(np.mean(audio.astype(np.float64) ** 2)) > 300, f"{utt} is near silent"


def test_real_run_noisy_copies_are_mixed_at_15_db(built):
    recorded = {
        u: float(s)
        for u, s in (line.split("\t") for line in (built / "test_noisy" / "snr.tsv").read_text().splitlines()[1:])
    }
    clean_paths = dict(read_table(built / "test" / "wav.scp"))
    assert set(recorded) == set(clean_paths)
    for utt, noisy_path in read_table(built / "test_noisy" / "wav.scp"):
        clean = sf.read(clean_paths[utt], dtype="int16")[0].astype(np.float64)
        noisy = sf.read(noisy_path, dtype="int16")[0].astype(np.float64)
        assert len(clean) == len(noisy) and not np.array_equal(clean, noisy)
        snr = 10 * np.log10(np.sum(clean**2) / np.sum((noisy - clean) ** 2))
        assert abs(snr - 15.0) <= 0.5, utt
        assert recorded[utt] == pytest.approx(snr, abs=1e-3)


def test_rerun_is_a_noop_and_the_same_seed_gives_identical_bytes(built, tmp_path):
    before = {p: p.stat().st_mtime_ns for p in built.rglob("*")}
    corpus.main(["--out", str(built), *ARGS, "--jobs", "1"])  # --jobs changes nothing in the output
    assert {p: p.stat().st_mtime_ns for p in built.rglob("*")} == before

    other = tmp_path / "b"
    corpus.main(["--out", str(other), *ARGS, "--jobs", "1"])
    files = sorted(p.relative_to(built) for p in built.rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(other) for p in other.rglob("*") if p.is_file())
    for rel in files:
        if rel.name == "wav.scp":  # the only place the corpus root appears
            assert (other / rel).read_text() == (built / rel).read_text().replace(str(built), str(other))
        else:
            assert (other / rel).read_bytes() == (built / rel).read_bytes(), rel


def test_changed_config_rebuilds_and_drops_stale_wavs(tmp_path, monkeypatch, caplog):
    out = tmp_path / "c"
    corpus.main(["--out", str(out), "--num-utterances", "12", "--seed", "1"])
    # A machine without the klatt variant: those voices are skipped and logged, the rest build.
    monkeypatch.setattr(corpus, "installed_voices", lambda engines, tools: inventory(ALL_VARIANTS - {"klatt"}))
    with caplog.at_level(logging.INFO, logger="pipeline.corpus"):
        corpus.main(["--out", str(out), "--num-utterances", "12", "--seed", "2"])
    assert "rebuilding" in caplog.text and "espeak-ng:en-us+klatt is not installed" in caplog.text
    summary = json.loads((out / "corpus.json").read_text())
    assert summary["config"]["seed"] == 2 and "espeak-ng:en-us+klatt" in summary["skipped_voices"]
    # Without flite and Festival there is no test_engine nor dev_engine, and the earlier build's are gone.
    corpus.main(["--out", str(out), "--num-utterances", "12", "--seed", "2", "--engines", "espeak-ng"])
    for split in corpus_plan.ENGINE_SPLITS:
        assert not (out / split).exists() and not (out / "wav" / split).exists()
    assert set(json.loads((out / "corpus.json").read_text())["counts"]) == set(ALL_SPLITS) - set(
        corpus_plan.ENGINE_SPLITS
    )
    for split in set(ALL_SPLITS) - set(corpus_plan.ENGINE_SPLITS):
        listed = {Path(p).name for _, p in read_table(out / split / "wav.scp")}
        assert {p.name for p in (out / "wav" / split).iterdir()} == listed
