"""pipeline/lm_text.py: the LM's text holds no held-out sentence, whole or inside a line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from common import fsutil
from pipeline import corpus, corpus_plan, lm_text, open_text


def assert_leak_free(lines, held_out):
    joined = "\n".join(lines)
    leaks = [h for h in held_out if h in joined]  # a sentence has no newline: a hit is inside one line
    assert not leaks, f"held-out sentences in the LM text: {leaks[:5]}"


def test_a_line_holding_a_held_out_sentence_goes_and_is_counted():
    source = [
        "the old cat sat on the mat all day",  # holds a held-out sentence
        "a dog barked",
        "birds sing at dawn",  # a training transcript: kept once, as the transcript
        "the ship slipped away",  # a held-out sentence itself
        "the cat sat on a mat",  # the held-out words, not in their order: kept
    ]
    train = ["birds sing at dawn", "we sailed past the ship slipped away at night"]
    held = {"cat sat on the mat", "the ship slipped away"}
    planned = lm_text.plan_text(source, train, held)
    assert planned.lines == ("a dog barked", "the cat sat on a mat", "birds sing at dawn")
    assert planned.dropped == {
        "source: holds a held-out sentence": 1,
        "source: a training transcript (kept as the transcript)": 1,
        "source: a held-out sentence": 1,
        "train: holds a held-out sentence": 1,
    }
    assert ("the old cat sat on the mat all day", "cat sat on the mat") in planned.examples
    assert_leak_free(planned.lines, held)


def test_held_out_transcripts_are_normalized_as_the_corpus_does():
    # Case, punctuation and a number are what the corpus would have written: the sentence still matches.
    held = lm_text.normalize_held_out(["The Cat sat, on 2 mats!", "  "])
    assert held == {"the cat sat on two mats"}
    planned = lm_text.plan_text(["so the cat sat on two mats again"], [], held)
    assert planned.lines == ()


def test_coverage_counts_oov_tokens_and_trigrams_within_sentences():
    rows = lm_text.coverage(["a b c d", "x y"], {"dev": ["a b c z", "y x"]})
    # 6 tokens, z unknown; 3-grams (a b c) and (b c z), the first in the text; "y x" has none.
    assert rows == {"dev": {"words": 6, "oov_rate": round(1 / 6, 4), "trigrams": 2, "trigram_share": 0.5}}


def write_split(root: Path, split: str, utterances) -> None:
    rows = [(u.utt_id, u.speaker, u.text, f"wav/{u.utt_id}.wav") for u in utterances]
    (root / split).mkdir(parents=True)
    (root / split / "text").write_text(corpus_plan.kaldi_files(rows)["text"])


@pytest.fixture(scope="module")
def demo_root(tmp_path_factory) -> tuple[Path, Path, str]:
    """A demo-style data root planned from the first WordNet examples (the corpus' own plan and
    Kaldi tables, no audio), the source file, and a 3-word held-out phrase planted inside a source line."""
    tmp = tmp_path_factory.mktemp("lm_text")
    source = tmp / "wordnet_head.txt"
    raw = open_text.wordnet_examples()[:4000]
    source.write_text("\n".join(raw) + "\n")
    pool, _ = open_text.sentence_pool(raw, 3, 14)
    config = corpus.CorpusConfig(num_utterances=200, text_file=str(source))
    plan = corpus_plan.plan_corpus(config, inventory=None, sentences=pool)
    root = tmp / "corpus"
    for split in corpus_plan.SPLITS:
        write_split(root, split, [u for u in plan if u.split == split])
    write_split(root, "test_noisy", [u for u in plan if u.split == "test"])
    said = {u.text for u in plan}
    hosts = (s for s in pool if s not in said and len(s.split()) >= 8)
    planted = next(p for p in (" ".join(h.split()[2:5]) for h in hosts) if not any(p in s for s in said))
    with open(root / "dev_engine" / "text", "a") as handle:
        handle.write(f"zz-planted-99999 {planted}\n")
    return root, source, planted


def test_a_demo_style_root_gives_a_leak_free_text_and_a_rerun_does_nothing(demo_root, tmp_path):
    root, source, planted = demo_root
    config = lm_text.LmTextConfig(text_file=str(source))
    record = lm_text.build_lm_text(root, tmp_path / "lm", config)
    lines = (tmp_path / "lm" / lm_text.TEXT).read_text().splitlines()
    held = set()
    for split in lm_text.HELD_OUT:
        held |= {line.split(maxsplit=1)[1] for line in (root / split / "text").read_text().splitlines()}
    assert_leak_free(lines, held)
    assert not any(planted in line for line in lines)
    assert record["dropped"]["source: holds a held-out sentence"] >= 1  # at least the planted one
    assert record["dropped"]["source: a held-out sentence"] == len(held) - 1  # all but the planted phrase
    train = [line.split(maxsplit=1)[1] for line in (root / "train" / "text").read_text().splitlines()]
    assert lines[-len(train) :] == train  # every training transcript, after the source's sentences
    assert record["text"]["sentences"] == len(lines)
    assert set(record["coverage"]) == {"train", *lm_text.HELD_OUT}
    assert record["coverage"]["train"] == {**record["coverage"]["train"], "oov_rate": 0.0, "trigram_share": 1.0}
    assert 0 < record["coverage"]["test"]["oov_rate"] < 0.5
    assert json.loads((tmp_path / "lm" / lm_text.RECORD).read_text())["fingerprint"] == record["fingerprint"]
    again = lm_text.build_lm_text(root, tmp_path / "lm", config)
    assert again.get("skipped") and again["text"] == record["text"]
    assert fsutil.file_sha256(tmp_path / "lm" / lm_text.TEXT) == record["text"]["sha256"]


def test_the_cli_writes_the_text_and_a_missing_train_split_is_named(demo_root, tmp_path, capsys):
    root, source, _ = demo_root
    out = tmp_path / "lm"
    assert lm_text.main(["--data", str(root), "--out", str(out), "--set", f"text_file={source}"]) == 0
    assert "test: OOV" in capsys.readouterr().out and (out / lm_text.TEXT).is_file()
    assert lm_text.main(["--data", str(tmp_path / "nowhere"), "--out", str(out)]) == 1
    assert "nowhere/train/text: no such file; --data is a corpus root" in capsys.readouterr().err
