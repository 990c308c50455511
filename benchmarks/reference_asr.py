"""An off-the-shelf recognizer beside our CER: pocketsphinx, with the en-us acoustic model, language
model and dictionary it ships (never trained on our data), on Kaldi data splits, scored as
`models.evaluate` scores our acoustic model.

    .venv-benchmarks/bin/python benchmarks/reference_asr.py --data CORPUS/test_engine [--data CORPUS/test ...]
        [--ours RUN] [--limit N] [--jobs N] [--json OUT]

A split is a Kaldi data directory with `wav.scp`, `text` and `utt2spk` (and `utt2voice`, the demo
corpus' `ENGINE:VOICE` of each utterance: then a table per voice too). Its audio is read as the
feature stage reads it (pipeline/kaldi.py, pipeline/features.py: the segment, one channel) at
16 kHz, the rate of pocketsphinx's model; each utterance is decoded whole by a `Decoder` of
pocketsphinx's default configuration, as a new one decodes it (nothing carried over from the
utterances before: `recognize`), in a pool of `--jobs` processes. References are the
transcripts as the shard stage writes them (pipeline/text.py `normalize_transcript`), hypotheses
are normalized the same way, and CER and WER are models/asr/scoring.py's, Kaldi's alignment.

`--ours` puts our model's figures on the same split beside them: a training workdir (its eval.json
and eval/, what `models.evaluate` writes), a pipeline run directory (its summary.json), or one of
those JSON files (or benchmarks/demo.py's). With the evaluation's hypotheses
(`eval/SPLIT_hypotheses.tsv`) ours are scored on the very utterances decoded here, per voice too
(greedy decoding, as the demo's table); from metrics alone, the split's figures as evaluated.

pocketsphinx lives in its own environment, `.venv-benchmarks` (`make setup` builds it from
requirements/benchmarks.in), without TensorFlow: this file imports only the project's modules that
need none.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import report_recognition  # noqa: E402
from benchmarks.harness import shown_path, write_json  # noqa: E402
from common import fsutil  # noqa: E402
from common.parallel import worker_pool  # noqa: E402
from common.progress import progress  # noqa: E402
from models.asr import scoring  # noqa: E402
from pipeline import kaldi, text  # noqa: E402
from pipeline.audio_io import AudioError  # noqa: E402
from pipeline.features import FeatureConfig, group_by_recording, prepare_waveform  # noqa: E402

RECOGNIZER = "pocketsphinx"
SETUP_HINT = (
    "`make setup` builds .venv-benchmarks, which has it: run .venv-benchmarks/bin/python benchmarks/reference_asr.py"
)
# The audio as the feature stage cuts it, never resampled: pocketsphinx's en-us model is a 16 kHz
# one, and .venv-benchmarks has no scipy to resample with.
AUDIO = FeatureConfig(resample=False)
# The guard: pocketsphinx on the demo corpus' test_engine split (its defaults: 2500 utterances,
# seed 0) in flite's voices kal16 and slt, CER within TOLERANCE of TARGET.
GUARD = {
    "split": "test_engine",
    "voices": ["flite:kal16", "flite:slt"],
    "corpus": {"num_utterances": 2500, "seed": 0},
    "target": 0.075,
    "tolerance": 0.005,
}


@dataclasses.dataclass(frozen=True)
class Split:
    """The utterances of a data directory to decode, and what they are scored against."""

    name: str  # the directory's name, as the shard stage names the split
    data_dir: Path
    entries: list[kaldi.Entry]  # by id
    total: int  # utterances of the split (entries: all of them or `--limit` of them)
    references: dict[str, str]  # utt -> transcript, normalized
    voices: dict[str, str]  # utt -> ENGINE:VOICE (utt2voice); empty without one


@dataclasses.dataclass(frozen=True)
class Ours:
    """Our model's evaluation: its metrics and, where they are, its files of hypotheses."""

    source: Path
    metrics: dict
    eval_dir: Path | None  # models.evaluate's eval/ (SPLIT_hypotheses.tsv); None: metrics only


def read_split(data_dir: Path, limit: int | None = None) -> Split:
    """The split's utterances (`limit`: that many, spread evenly over its ids, so each voice keeps
    its share), checked as the feature stage checks them; an error naming the file otherwise."""
    data_dir = Path(data_dir)
    for name in ("wav.scp", "text"):
        if not (data_dir / name).is_file():
            raise FileNotFoundError(
                f"{data_dir / name} is missing: --data names a Kaldi data split with wav.scp (the audio) and "
                "text (what is scored against), e.g. the demo corpus' CORPUS/test_engine"
            )
    entries, rejections = kaldi.scan_data_dir(data_dir, source="audio")
    if rejections:
        first = rejections[0]
        raise ValueError(
            f"{data_dir}: {len(rejections)} utterance(s) cannot be scored ({kaldi.summarize(rejections)}); "
            f"the first, {first.utt_id}: {first.detail}. Fix the split's tables (or score a split without them)"
        )
    total = len(entries)
    if limit and limit < total:
        entries = [entries[i * len(entries) // limit] for i in range(limit)]
    missing = [e for e in entries if (path := kaldi.spec_path(e.audio)) is not None and not path.is_file()]
    if missing:
        raise FileNotFoundError(
            f"{data_dir / 'wav.scp'}: the audio of {len(missing)} utterance(s) is missing, the first "
            f"{missing[0].utt_id}'s: {missing[0].audio}. Build the corpus again (python -m pipeline.corpus "
            "--out CORPUS) or fix wav.scp"
        )
    voices = kaldi.read_optional_table(data_dir / "utt2voice")
    return Split(
        name=data_dir.resolve().name,
        data_dir=data_dir,
        entries=entries,
        total=total,
        references={e.utt_id: text.normalize_transcript(e.transcript or "") for e in entries},
        voices={e.utt_id: voices.values[e.utt_id] for e in entries if e.utt_id in voices.values} if voices else {},
    )


@functools.cache
def decoder():
    """One pocketsphinx Decoder per process, of its default configuration (its log quieted)."""
    from pocketsphinx import Decoder

    return Decoder(loglevel="FATAL")


def recognize(pcm: bytes):
    """pocketsphinx's Hypothesis (hypstr, score, prob) of one whole utterance, 16-bit samples at
    16 kHz; None when it hears nothing.

    The feature stage is reset first: its cepstral mean is otherwise carried from one utterance to
    the next (live CMN even in whole-utterance decoding), so an utterance's words would depend on
    which utterances the same process decoded before it, and a pool's figures on the scheduling.
    Reset, each utterance is decoded as a new Decoder decodes it."""
    recognizer = decoder()
    recognizer.reinit_feat()
    recognizer.start_utt()
    recognizer.process_raw(pcm, full_utt=True)
    recognizer.end_utt()
    return recognizer.hyp()


def decode_recording(task: tuple[str, list[kaldi.Entry]]) -> list[tuple[str, str, float, float]]:
    """Worker: one recording's utterances -> (utt, hypothesis, seconds of audio, CPU seconds decoding:
    this process's, so other jobs on shared cores do not count)."""
    spec, entries = task
    results = []
    try:
        rate, samples = kaldi.read_audio(spec, allow_pipes=False)  # float32 [samples, channels], int16 scale
        for entry in entries:
            wave = prepare_waveform(rate, samples, entry.segment, AUDIO, entry.channel)  # float32 [n] at 16 kHz
            pcm = np.clip(np.rint(wave), -32768, 32767).astype("<i2").tobytes()  # what process_raw reads
            started = time.process_time()
            hypothesis = recognize(pcm)
            seconds = time.process_time() - started
            results.append(
                (entry.utt_id, hypothesis.hypstr if hypothesis else "", len(wave) / AUDIO.sample_rate, seconds)
            )
    except AudioError as err:
        raise ValueError(
            f"{entries[0].utt_id} ({spec}): {err}. The reference recognizer reads 16 kHz audio as the feature "
            "stage reads it; convert the split's audio (e.g. sox IN -r 16000 -b 16 OUT)"
        ) from err
    return results


def decode_split(split: Split, jobs: int) -> dict[str, tuple[str, float, float]]:
    """utt -> (hypothesis, seconds of audio, CPU seconds decoding) for every utterance of `split`."""
    tasks = group_by_recording(split.entries)
    decoded = {}
    with worker_pool(jobs) as pool:
        bar = progress(pool.imap(decode_recording, tasks), total=len(tasks), desc=split.name, unit="recording")
        for rows in bar:
            decoded.update({utt: (hypothesis, audio_s, decode_s) for utt, hypothesis, audio_s, decode_s in rows})
    return decoded


def score(references: dict[str, str], hypotheses: dict[str, str], voices: dict[str, str]) -> dict:
    """{"all": scoring.error_rates of every utterance of `hypotheses`, "voices": the same per voice}.
    Hypotheses are normalized as references are."""
    utts = sorted(hypotheses)
    rates = {"all": rates_of(references, hypotheses, utts), "voices": {}}
    for voice in sorted({voices[u] for u in utts if u in voices}):
        rates["voices"][voice] = rates_of(references, hypotheses, [u for u in utts if voices.get(u) == voice])
    return rates


def rates_of(references: dict[str, str], hypotheses: dict[str, str], utts: list[str]) -> dict:
    return scoring.error_rates([references[u] for u in utts], [text.normalize_transcript(hypotheses[u]) for u in utts])


# ---- our model's figures ----


def read_ours(path: Path, splits: list[str]) -> Ours:
    """Our evaluation named by `--ours`: a training workdir (eval.json, eval/), a pipeline run
    directory (summary.json), or one of those files, or benchmarks/demo.py's JSON; of the models
    it holds, the one with a CER on one of `splits`."""
    path = Path(path)
    if path.is_dir():
        found = [path / name for name in ("eval.json", "summary.json") if (path / name).is_file()]
        if not found:
            raise FileNotFoundError(
                f"--ours {path} holds neither eval.json (a training workdir, after python -m models.evaluate) "
                "nor summary.json (a pipeline run directory): name one of those, or either file"
            )
        path = found[0]
    if not path.is_file():
        raise FileNotFoundError(f"--ours {path} does not exist: name a training workdir, a run directory or its JSON")
    data = fsutil.read_json(path)
    for metrics, eval_dir in evaluations(data if isinstance(data, dict) else {}, path):
        if any(f"{split}_cer" in metrics for split in splits):
            return Ours(path, metrics, eval_dir if eval_dir and eval_dir.is_dir() else None)
    raise ValueError(
        f"--ours {path} holds no CER of {', '.join(splits)}: name the evaluation of an acoustic model on these "
        f"splits (python -m models.evaluate --model WORKDIR --shards SHARDS writes WORKDIR/eval.json)"
    )


def evaluations(data: dict, path: Path) -> list[tuple[dict, Path | None]]:
    """(metrics, their eval/ directory) of each model's evaluation in a JSON file: eval.json is one,
    summary.json has one per model under "models" (with its workdir), benchmarks/demo.py's names
    its models under "models" and keeps each one's metrics under its name."""
    found: list[tuple[dict, Path | None]] = [(data, path.parent / "eval")]
    models = data.get("models")
    if isinstance(models, dict):
        for info in models.values():
            if isinstance(info, dict) and isinstance(info.get("metrics"), dict):
                workdir = info.get("workdir")
                found.append((info["metrics"], Path(workdir) / "eval" if workdir else None))
    elif isinstance(models, list):
        found += [(data[name], None) for name in models if isinstance(data.get(name), dict)]
    return found


def ours_on(split: Split, ours: Ours, decoded: list[str]) -> dict | None:
    """Our figures on `split`: scored here on the utterances of `decoded` from the evaluation's
    hypotheses where it kept them, else the split's figures as evaluated; None: not evaluated."""
    table = ours.eval_dir / f"{split.name}_hypotheses.tsv" if ours.eval_dir else None
    if table is not None and table.is_file():
        rows = {}
        for line in table.read_text(encoding="utf-8").splitlines()[1:]:  # utt_id, reference, greedy, beam
            utt, reference, greedy, _ = line.split("\t")
            rows[utt] = (reference, greedy)
        utts = [u for u in decoded if u in rows]
        differ = [u for u in utts if rows[u][0] != split.references[u]]
        if differ:
            raise ValueError(
                f"--ours {ours.source}: {table} holds other references than {split.data_dir / 'text'} for "
                f"{len(differ)} utterance(s), e.g. {differ[0]}: {rows[differ[0]][0]!r} against "
                f"{split.references[differ[0]]!r}; name the evaluation of a model on this corpus"
            )
        return {"from": "hypotheses", **score(split.references, {u: rows[u][1] for u in utts}, split.voices)}
    if f"{split.name}_cer" not in ours.metrics:
        return None
    m = ours.metrics
    rates = {
        "cer": m[f"{split.name}_cer"],
        "wer": m[f"{split.name}_wer"],
        "utterances": m.get(f"{split.name}_utterances"),
    }
    return {"from": "metrics", "all": rates, "voices": {}}


# ---- the run ----


def recognizer_record() -> dict:
    """What decoded: pocketsphinx's version and the model files its default configuration names."""
    import importlib.metadata

    config = decoder().config
    return {
        "name": RECOGNIZER,
        "version": importlib.metadata.version("pocketsphinx"),
        "configuration": "Decoder() defaults, whole utterances, each as a new Decoder hears it",
        "acoustic_model": Path(config["hmm"]).name,
        "language_model": Path(config["lm"]).name,
        "dictionary": Path(config["dict"]).name,
        "sample_rate": int(config["samprate"]),
    }


def corpus_record(data_dir: Path) -> dict | None:
    """The demo corpus' settings when the split is one of its splits (corpus.json beside it)."""
    corpus = fsutil.read_json(Path(data_dir).resolve().parent / "corpus.json")
    if not isinstance(corpus, dict) or not isinstance(corpus.get("config"), dict):
        return None
    config = corpus["config"]
    return {
        "num_utterances": config.get("num_utterances"),
        "seed": config.get("seed"),
        "code_version": corpus.get("code_version"),
    }


def guard(name: str, result: dict) -> dict | None:
    """The guard on the demo corpus' test_engine split, whole and of the corpus' defaults."""
    corpus = result.get("corpus") or {}
    if name != GUARD["split"] or result["limited"] or any(corpus.get(k) != v for k, v in GUARD["corpus"].items()):
        return None
    rates = [result[RECOGNIZER]["voices"].get(v) for v in GUARD["voices"]]
    if None in rates:
        return None
    cer = sum(r["cer"] * r["chars"] for r in rates) / sum(r["chars"] for r in rates)  # the voices' utterances together
    return {**GUARD, "cer": cer, "within": abs(cer - GUARD["target"]) <= GUARD["tolerance"]}


def parse(argv: list[str] | None) -> tuple[argparse.ArgumentParser, argparse.Namespace]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--data",
        type=Path,
        action="append",
        required=True,
        metavar="DIR",
        help="a Kaldi data split (wav.scp, text, utt2spk; utt2voice: per voice too); repeat for more",
    )
    parser.add_argument(
        "--ours",
        type=Path,
        metavar="RUN_OR_EVAL_FILE",
        help="our model's evaluation: a training workdir, a pipeline run directory, or their JSON",
    )
    parser.add_argument("--limit", type=int, help="decode this many utterances of each split, spread over it")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="decoding processes (default: the CPUs)")
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args(argv)
    if args.limit is not None and args.limit < 1:
        parser.error("--limit: at least 1")
    return parser, args


def split_result(split, jobs: int, ours: dict | None) -> dict:
    """One split decoded by pocketsphinx and scored, beside ours, and its guard."""
    started = time.perf_counter()
    decoded = decode_split(split, jobs)
    wall = time.perf_counter() - started
    audio_s, cpu_s = sum(d[1] for d in decoded.values()), sum(d[2] for d in decoded.values())
    result = {
        "utterances": len(decoded),
        "limited": len(decoded) < split.total,
        "corpus": corpus_record(split.data_dir),
        "audio_s": audio_s,
        "decode_cpu_s": cpu_s,
        "real_time_factor": cpu_s / max(audio_s, 1e-9),  # CPU seconds per second of audio, one process
        "wall_s": wall,
        "jobs": jobs,
        RECOGNIZER: score(split.references, {u: d[0] for u, d in decoded.items()}, split.voices),
        "ours": ours_on(split, ours, sorted(decoded)) if ours else None,
    }
    result["guard"] = guard(split.name, result)
    return result


def main(argv: list[str] | None = None) -> int:
    parser, args = parse(argv)
    try:
        import pocketsphinx  # noqa: F401
    except ModuleNotFoundError:
        print(f"pocketsphinx is not installed in {sys.executable}: {SETUP_HINT}", file=sys.stderr)
        return 2

    splits = [read_split(d, args.limit) for d in args.data]
    names = [s.name for s in splits]
    if len(set(names)) < len(names):
        parser.error(f"--data: two splits of one name ({', '.join(names)}); the tables and --ours key them by name")
    ours = read_ours(args.ours, names) if args.ours else None
    results: dict = {"recognizer": recognizer_record(), "ours": shown_path(str(args.ours)) if ours else None}
    results["splits"] = {split.name: split_result(split, args.jobs, ours) for split in splits}
    # Decoding draws nothing at random; the demo corpus' seed made what it heard.
    seeds = {r["corpus"]["seed"] for r in results["splits"].values() if r["corpus"]}
    record = write_json(args.json, results, seeds={"demo_corpus": seeds.pop()} if len(seeds) == 1 else {})
    print("\n".join(report_recognition.reference_asr(record)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
