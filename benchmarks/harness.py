"""Shared pieces of the benchmarks: synthetic shards, running the real trainer, tables."""

from __future__ import annotations

import datetime
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
PYTHON = sys.executable
# A `--set` item that trains the acoustic model on the shards' clean `train` split, whatever copies
# its config asks for (configs/demo_asr.yaml trains on `train_aug`): the benchmarks of a step's cost
# and of faults use shards without copies.
NO_COPIES = "asr.augment.copies.speed_factors=[]"
HOROVODRUN = str(Path(sys.executable).with_name("horovodrun"))

# What the benchmarks of short runs on synthetic shards seed: the shards (synthetic_shards' default)
# and the training (TrainConfig.seed's default, which the configs they train leave alone).
SHORT_RUN_SEEDS = {"synthetic_shards": 0, "training": 0}


def synthetic_shards(
    work: Path,
    utterances: int,
    mean_frames: int = 300,
    dim: int = 80,
    num_shards: int = 8,
    test_utterances: int = 0,
    dev_utterances: int = 0,
    seed: int = 0,
) -> Path:
    """Shards of random features with the demo corpus's length spread and short transcripts.

    Throughput does not depend on the values, only on shapes; quality benchmarks use real data.
    """
    import kaldiio

    from pipeline import shards

    rng = np.random.default_rng(seed)
    splits = {}
    for split, count in (("train", utterances), ("dev", dev_utterances), ("test", test_utterances)):
        if not count:
            continue
        root = work / "data" / split
        root.mkdir(parents=True, exist_ok=True)
        words = [
            "turn",
            "on",
            "the",
            "kitchen",
            "lights",
            "in",
            "oslo",
            "at",
            "seven",
            "thirty",
            "please",
            "call",
            "anna",
        ]
        with kaldiio.WriteHelper(f"ark,scp:{root / 'feats.ark'},{root / 'feats.scp'}") as writer:
            texts, speakers = [], []
            for i in range(count):
                utt = f"spk{i % 16:02d}-{split}{i:06d}"
                frames = int(np.clip(rng.normal(mean_frames, mean_frames / 3), 60, 3 * mean_frames))
                writer(utt, rng.normal(size=(frames, dim)).astype(np.float32))
                # About 12 characters per second of speech, like the demo sentences.
                n_words = max(1, frames // 50)
                texts.append(f"{utt} {' '.join(rng.choice(words, size=n_words))}\n")
                speakers.append(f"{utt} {utt.split('-')[0]}\n")
        (root / "text").write_text("".join(sorted(texts)))
        (root / "utt2spk").write_text("".join(sorted(speakers)))
        splits[split] = root
    out = work / "shards"
    # with the transcripts' phonemes, as the demo's shards: the demo's synthesis model reads them
    shards.make_shards(splits, out, shards.ShardConfig(num_shards=num_shards, phonemes="en-us"), progress=False)
    return out


def run_training(
    shards: Path,
    workdir: Path,
    np_: int,
    config: Path,
    overrides: list[str],
    env_extra: dict | None = None,
    timeout: float = 1800,
    extra_args: list[str] | None = None,
    hosts: str | None = None,
) -> dict:
    """Runs `models.train` (alone for np_=1, else under horovodrun) and returns its train_summary.json
    with `job_wall_s` added: seconds from launching the command to its exit (what a user waits), and
    `launched_unix_s`: when it was launched."""
    from workflow import commands

    args = commands.train_args(shards, workdir, config=config, sets=overrides, extra=extra_args or ())
    cmd = (
        commands.module_command(PYTHON, commands.TRAIN, args)
        if np_ == 1
        else commands.horovodrun_local(PYTHON, np_, commands.TRAIN, args, hosts)
    )
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=str(ROOT), **(env_extra or {}))
    # The store `make` targets use (models/tracking/runs.py's default too), never the repository root.
    (ROOT / ".runs").mkdir(exist_ok=True)
    env.setdefault("MLFLOW_TRACKING_URI", f"sqlite:///{ROOT / '.runs' / 'mlflow.db'}")
    launched_unix_s = time.time()
    started = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    wall = time.perf_counter() - started
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}")
    summary = json.loads((workdir / "train_summary.json").read_text())
    return {**summary, "job_wall_s": wall, "launched_unix_s": launched_unix_s}


def dev_curve_from_launch(summary: dict, launched_unix_s: float) -> list[list[float]]:
    """[minutes from launching the job, dev CER] at every dev evaluation, the final one included."""
    offset = summary["dev_clock_started_unix_s"] - launched_unix_s  # start-up before the dev clock began
    points = [[(offset + p["dev_wall_s"]) / 60, p["dev_cer"]] for p in summary.get("dev_history", [])]
    last = summary.get("last_dev_wall_s")
    if last is not None and (not points or (offset + last) / 60 > points[-1][0]):
        points.append([(offset + last) / 60, summary["last_dev_cer"]])
    return points


def evaluate_model(workdir: Path, shards: Path, *args: str) -> dict:
    """`models.evaluate --model WORKDIR --shards SHARDS ARGS --no-mlflow`; its eval.json."""
    cmd = [PYTHON, "-m", "models.evaluate", "--model", str(workdir), "--shards", str(shards), *args, "--no-mlflow"]
    subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True)
    return json.loads((workdir / "eval.json").read_text())


def pick_variants(parser, value: str, known: dict, first: str | None = None) -> dict:
    """The `--variants` a,b,c of `known` (name -> flags), in that order; a clear error otherwise."""
    names = value.split(",")
    if any(n not in known for n in names) or (first and names[0] != first):
        lead = f"{first} first, then " if first else ""
        parser.error(f"--variants: {lead}any of {', '.join(known)} (got {value})")
    return {n: known[n] for n in names}


def delay_rounds(summary: dict) -> dict:
    """Delay-by-one's rounds and, per rank, those that started before the previous pull was merged."""
    if "per_rank_gossip_rounds_before_merge" not in summary:
        return {}
    return {"rounds": summary["gossip_rounds"], "rounds_before_merge": summary["per_rank_gossip_rounds_before_merge"]}


# The CPU flags that decide which kernels TensorFlow's oneDNN and Eigen can use.
CPU_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16")


def machine() -> dict:
    """The CPU this process runs on: its model name, its cores, which of CPU_FLAGS it has, and
    TensorFlow's oneDNN setting (TF_ENABLE_ONEDNN_OPTS; unset: TensorFlow's default, on for x86)."""
    from common import runtime  # the benchmarks put the repository on sys.path before they import this

    cpu_model, flags = runtime.cpu_info()
    return {
        "cpu_model": cpu_model,
        "cores": os.cpu_count(),
        "avx512": "avx512f" in flags,
        "flags": [flag for flag in CPU_FLAGS if flag in flags],
        "onednn": os.environ.get("TF_ENABLE_ONEDNN_OPTS", "default"),
    }


def git_commit() -> str | None:
    """HEAD's commit, with "-dirty" when the working tree has changes the commit lacks. Changed
    results files are not such changes: they are what benchmarks write (a benchmark that writes its
    JSON more than once would otherwise call its own code dirty)."""
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True)
        status = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no", "--", ".", ":(exclude)benchmarks/results"],
            cwd=ROOT,
            capture_output=True,
            text=True,
        )
    except (OSError, subprocess.CalledProcessError):
        return None  # not a git checkout (an image's copy of the tree)
    return head.stdout.strip() + ("-dirty" if status.stdout.strip() else "")


def run_metadata(seeds) -> dict:
    """What a benchmark's JSON records about the run that made it: commit, UTC date, machine,
    command line and the seeds it used (docs/benchmarks.md prints it beside every table)."""
    return {
        "commit": git_commit(),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": machine(),
        "command": command_line(),
        "seeds": seeds,
    }


def shown_path(arg: str) -> str:
    """`arg` as a results file may name it: a path inside the repository relative to it, another
    absolute path (a directory of the machine that ran it) as PATH, anything else as it is."""
    if not arg.startswith("/"):
        return arg
    path = Path(arg).resolve()
    return path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else "PATH"


def command_line() -> str:
    """sys.argv as a shell would take it back (quoted where needed), its paths as `shown_path` shows them."""
    return shlex.join(shown_path(a) for a in sys.argv)


def write_json(path: Path | None, results: dict, seeds) -> dict:
    """`results` with the run's metadata under "meta" (see run_metadata), written to `path` when one is
    given; `seeds` names the seeds the benchmark used, e.g. {"training": [0, 1], "synthetic_shards": 0}.
    Returns the record as the file holds it, for the benchmark to print with its page section's renderer."""
    text = json.dumps({**results, "meta": run_metadata(seeds)}, indent=2, sort_keys=True, default=float) + "\n"
    if path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return json.loads(text)


def asr_setup(args, prefix: str, tiny_steps: int = 8):
    """(workdir, config, shards, --set items) for a benchmark of short acoustic-model runs.

    `args` has `tiny`, `shards` and `steps`. The items fix the step count, leave the warm-up out of
    the throughput, and skip checkpoints, logs and model logging.
    """
    import tempfile

    work = Path(tempfile.mkdtemp(prefix=prefix))
    if args.tiny:
        config, steps, warmup = ROOT / "tests/configs/tiny_asr.yaml", tiny_steps, 2
        shards = args.shards or synthetic_shards(work, 48, mean_frames=60, dim=13, num_shards=4)
    else:
        config, steps, warmup = ROOT / "configs/demo_asr.yaml", args.steps, 5
        shards = args.shards or synthetic_shards(work, 1200)
    items = [
        NO_COPIES,
        f"max_steps={steps}",
        f"warmup_exclude={warmup}",
        "checkpoint_every=100000",
        "log_every=100000",
        "log_model=false",
        "epochs=1000",
    ]
    return work, config, shards, items
