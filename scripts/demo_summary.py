"""The summary `make demo` prints at its end: each model's figures per split, the decoding graph or word LM, the
demo corpus' sentences and voices, where the artifacts are and how to open the UIs.

    python scripts/demo_summary.py SUMMARY_JSON ELAPSED_S STATUS ROOT AIRFLOW_LOG

It reads the DAG run's summary.json (workflow's `finish_mlflow_run`), each model's train_summary.json and
eval tables, and the corpus' corpus.json. scripts/demo.sh calls it.
"""

import json
import os
import sys
from pathlib import Path

from common.voices import describe as voices  # ENGINE:VOICE specs, grouped by engine

INDENT = " " * 19  # the column the models' lines continue in
SPLITS = ("dev", "test", "test_noisy", "test_engine")


def pct(metrics: dict, key: str) -> str:
    return f"{100 * metrics[key]:.1f}%" if key in metrics else "n/a"


def trained(info: dict) -> str:
    """Steps and minutes of a model's training (its train_summary.json; rank 0's measured loop)."""
    path = Path(info["workdir"]) / "train_summary.json"
    if not path.exists():
        return "training time n/a (no train_summary.json)"
    t = json.loads(path.read_text())
    return f"trained {t['steps']} steps in {t['measured_seconds'] / 60:.1f} min"


def registered(info: dict) -> str:
    """The model's registry line: its name, version and whether it became the champion."""
    r = info.get("registered")
    if not r:
        return "not registered"
    verdict = "now the champion" if r["promoted"] else f"champion stays version {r['champion_version']}"
    return f"registered {r['name']} version {r['version']}, {verdict} ({r['reason']})"


def char_table(m: dict) -> None:
    print(f"{INDENT}{'split':<12} {'CER greedy':>10} {'beam':>6} {'LM':>6}   {'WER greedy':>10} {'beam':>6} {'LM':>6}")
    for split in SPLITS:
        if f"{split}_cer" in m:
            print(
                f"{INDENT}{split:<12} {pct(m, f'{split}_cer'):>10} {pct(m, f'{split}_cer_beam'):>6} "
                f"{pct(m, f'{split}_cer_lm'):>6}   {pct(m, f'{split}_wer'):>10} {pct(m, f'{split}_wer_beam'):>6} "
                f"{pct(m, f'{split}_wer_lm'):>6}"
            )


def phone_table(m: dict) -> None:
    print(f"{INDENT}{'split':<12} {'PER greedy':>10} {'beam':>6}   {'WER':>6} {'CER':>6}   {'RTF':>6}")
    for split in SPLITS:
        if f"{split}_per" in m:
            rtf = f"{m[f'{split}_decode_rtf_lm']:.3f}" if f"{split}_decode_rtf_lm" in m else "n/a"
            print(
                f"{INDENT}{split:<12} {pct(m, f'{split}_per'):>10} {pct(m, f'{split}_per_beam'):>6}   "
                f"{pct(m, f'{split}_wer_lm'):>6} {pct(m, f'{split}_cer_lm'):>6}   {rtf:>6}"
            )


def decoding(m: dict, lm_dir: Path) -> None:
    """The attached LM's or graph's line (models/tune_lm.py chose its settings)."""
    if not (lm_dir / "decoding.json").exists():
        print(f"{INDENT}no word LM attached (the param word_lm is off, or tune_lm_asr did not run: see its log)")
        return
    d = json.loads((lm_dir / "decoding.json").read_text())
    chosen = d["settings"]
    if (lm_dir / "lang.json").exists():  # an HLG graph (pipeline/lang.py)
        g = json.loads((lm_dir / "lang.json").read_text())
        print(
            f"{INDENT}HLG graph: {g['words']:,} words, {g['hlg']['states']:,} states, {g['hlg']['arcs']:,} arcs "
            f"({g['hlg']['bytes'] / 1e6:.0f} MB), acoustic scale {chosen['acoustic_scale']}, word penalty "
            f"{chosen['word_penalty']} (chosen on {d['chosen_on']['split']}); its words miss "
            f"{pct(m, 'test_lm_oov_rate')} of test's"
        )
        return
    lm_text = json.loads((lm_dir / "lm.json").read_text())["text"]
    print(
        f"{INDENT}word LM: {lm_text['sentences']:,} sentences, {lm_text['vocabulary_size']:,} words, "
        f"weight {chosen['weight']}, word bonus {chosen['word_bonus']} (chosen on "
        f"{d['chosen_on']['split']}); its words miss {pct(m, 'test_lm_oov_rate')} of test's"
    )


def speakers(workdir: str, phones: bool, heard: dict) -> None:
    """test_engine per speaker (eval/test_engine_speakers.tsv): the held-out speakers, each engine apart."""
    table = Path(workdir) / "eval" / "test_engine_speakers.tsv"
    if not table.exists():
        return
    print(
        f"{INDENT}test_engine: the test sentences in {voices(heard.get('test_engine', [])) or 'n/a'}, "
        "voices never heard in training; per speaker:"
    )
    for row in (line.split("\t") for line in table.read_text().splitlines()[1:] if line):
        if phones:  # speaker utterances phones per per_beam words wer_lm cer_lm
            speaker, utts, _, per, _, _, wer, _ = row
            print(
                f"{INDENT}  {speaker:<34} PER {100 * float(per):5.1f}%, WER {100 * float(wer):5.1f}%, {utts} utterances"
            )
        else:  # speaker utterances chars cer cer_beam wer wer_beam
            speaker, utts, _, cer, cer_beam, wer, _ = row
            print(
                f"{INDENT}  {speaker:<34} CER {100 * float(cer):5.1f}% (beam {100 * float(cer_beam):5.1f}%), "
                f"WER {100 * float(wer):5.1f}%, {utts} utterances"
            )


def unheard_words(m: dict) -> None:
    """The words no training sentence has (models/asr/scoring.py oov_figures), per held-out split."""
    unheard = [
        (split, m[f"{split}_oov_rate"], m.get(f"{split}_oov_cer"))
        for split in ("test", "test_noisy", "test_engine")
        if f"{split}_oov_rate" in m
    ]
    if unheard:
        figures = (
            f"{split} {100 * rate:.1f}% of words" + (f", read at {100 * cer:.1f}% CER" if cer is not None else "")
            for split, rate, cer in unheard
        )
        print(f"{INDENT}words never heard in training: " + "; ".join(figures))


def acoustic(info: dict, heard: dict) -> None:
    """The acoustic model's lines: its table (phones or characters), decoding, speakers, unheard words, registry."""
    m = info["metrics"]
    phones = "test_per" in m or "dev_per" in m
    if phones:
        print(f"  acoustic model   phones, {trained(info)}; phone error rate greedy and beam, words through HLG:")
        phone_table(m)
    else:
        print(f"  acoustic model   {trained(info)}; greedy, beam search and beam search with the word LM:")
        char_table(m)
    decoding(m, Path(info["workdir"]) / "model" / "lm")
    speakers(info["workdir"], phones, heard)
    unheard_words(m)
    print(f"{INDENT}{registered(info)}")


def synthesis(info: dict) -> None:
    """The synthesis model's lines: intelligibility as the new acoustic model hears it, spectral distances, registry."""
    m = info["metrics"]
    fcd = f"{m['test_fbank_cepstral_distance_db']:.2f} dB" if "test_fbank_cepstral_distance_db" in m else "n/a"
    l1 = f"{m['test_mel_l1']:.3f}" if "test_mel_l1" in m else "n/a"
    if "dev_intelligibility_per" in m:  # a phone listener: its PER, and the words through its graph
        print(
            f"  synthesis model  intelligibility PER {pct(m, 'dev_intelligibility_per')} (dev), "
            f"{pct(m, 'test_intelligibility_per')} (test); WER {pct(m, 'dev_intelligibility_wer')} (dev), "
            f"{pct(m, 'test_intelligibility_wer')} (test); recordings: PER "
            f"{pct(m, 'dev_intelligibility_per_recordings')}, WER {pct(m, 'dev_intelligibility_wer_recordings')} (dev)"
        )
    lead = "                 " if "dev_intelligibility_per" in m else "  synthesis model"
    print(
        f"{lead}  intelligibility CER {pct(m, 'dev_intelligibility_cer')} in training voices (dev), "
        f"{pct(m, 'test_intelligibility_cer')} for unseen voices (test), the new acoustic model listening; "
        f"{trained(info)}"
    )
    print(
        f"{INDENT}the same listener on dev: {pct(m, 'dev_intelligibility_cer_teacher_forced')} "
        "teacher-forced (given the recording's frames, or with durations its searched timing), "
        f"{pct(m, 'dev_intelligibility_cer_recordings')} on the recordings themselves"
    )
    print(f"{INDENT}filterbank cepstral distance {fcd} (test, free-running), mel L1 {l1} (test, teacher-forced)")
    print(f"{INDENT}{registered(info)}")


def corpus(corpus_json: dict, heard: dict) -> None:
    """Where the demo corpus' sentences came from (pipeline/open_text.py) and its voices per split."""
    text = corpus_json.get("text")
    if text:
        left = sum(text["left_out"].values())
        usable = (
            f"{text['sentences']:,} usable sentences, {left:,} left out" if text["sentences"] else "its own sentences"
        )
        print(f"Sentences of the demo corpus: {text['source']} ({usable})")
    if heard:  # dev has the voices of train, test_noisy those of test
        print("Voices of the demo corpus (synthetic speech only: the models have never heard a human voice)")
        for split, what in (("train", "heard in training"), ("test", "held out"), ("test_engine", "held out")):
            if split in heard:
                print(f"  {split:<16} {voices(heard[split])}  ({what})")


def artifacts(summary: dict, run_dir: Path, root: Path, log: str) -> None:
    """Where the run's files are, and how to open the MLflow and Airflow UIs."""

    def rel(path) -> str:
        path = Path(path)
        return str(path.relative_to(root)) if path.is_relative_to(root) else str(path)

    models = summary["models"]
    print("Artifacts")
    print(f"  run directory    {rel(run_dir)}/  (corpus/, shards/, asr/, tts/, summary.json)")
    for model, what in (
        ("asr", "hypotheses (eval/test_hypotheses.tsv)"),
        ("tts", "audio and plots (eval/*.wav, *.png)"),
    ):
        if model in models:
            print(f"  {model} model        {rel(models[model]['workdir'])}/  model/, {what}")
    print(f"  MLflow store     {summary['tracking_uri']}")
    print(f"  Airflow log      {rel(log)}")
    print("Open the UIs")
    print("  make mlflow-ui   then http://127.0.0.1:5000  (the parent run holds one child run per stage)")
    passwords = Path(os.environ["AIRFLOW_HOME"]) / "simple_auth_manager_passwords.json.generated"
    print(
        f"  make airflow-ui  then http://127.0.0.1:8080  (user admin, password in {rel(passwords)},"
        " written at its first start)"
    )


def main(argv: list[str]) -> None:
    summary_file, elapsed, status, root, log = Path(argv[0]), int(argv[1]), int(argv[2]), Path(argv[3]), argv[4]
    summary = json.loads(summary_file.read_text())
    # The demo corpus' voices per split (pipeline/corpus.py corpus.json); absent when data_dir was given.
    corpus_file = summary_file.parent / "corpus" / "corpus.json"
    corpus_json = json.loads(corpus_file.read_text()) if corpus_file.exists() else {}
    heard = corpus_json.get("voices", {})
    print()
    print(
        f"speech_pipeline {'succeeded' if status == 0 else 'FAILED'} in {elapsed // 60} min {elapsed % 60} s "
        f"(MLflow parent run {summary['parent_run_id']}, {summary['status']})"
    )
    if "asr" in summary["models"]:
        acoustic(summary["models"]["asr"], heard)
    if "tts" in summary["models"]:
        synthesis(summary["models"]["tts"])
    corpus(corpus_json, heard)
    artifacts(summary, summary_file.parent, root, log)


if __name__ == "__main__":
    main(sys.argv[1:])
