"""Fault injection: what happens to a real job when things break, and what it costs.

    python benchmarks/faults.py [--json out.json] [--tiny] [--faults NAME,...] [--utterances 400] [--epochs 20]

On a small demo corpus (espeak-ng voices, the real feature and shard stages) and the demo's acoustic
model, each fault is injected into a real run and the outcome measured:
- `kill_worker`: SIGKILL of rank 1 of `horovodrun -np 2` (not elastic): the launcher's exit code and
  the seconds from the kill to its exit; then the same command again (the Airflow retry), which
  resumes from the last checkpoint: the steps lost (reached before the kill, minus resumed from).
- `kill_worker_elastic`: the same under Horovod elastic (two hosts of one slot, `localhost` and
  `127.0.0.1`): the job goes on with one worker; seconds until the survivor has reset, steps lost
  (reached before the kill, minus the last commit it went back to), exit code.
- `kill_job`: SIGKILL of the whole job (launcher and ranks), then the command again: steps lost.
- `kill_shard_writer`: SIGKILL of the shard stage while it writes, then a re-run: its exit code and
  whether the manifest is the one an undisturbed run writes.
- `corrupt_shard`: one flipped byte in a training shard: exit code, seconds to the error, and
  whether the error names the file.
- `mlflow_down`: the MLflow server stopped for 30 s during training (`--tiny`: for as long as it takes
  to start again), then started again: whether every logged loss point arrived.
The final test CER of each finished training is reported beside an undisturbed run of the same budget.

`--tiny` (tests/test_faults.py) is the test of these faults: the tests' tiny model, which learns nothing in
its budget, on synthetic shards (the faults do not depend on what the features say; the DAG's end-to-end
test runs the corpus, feature and shard stages), the undisturbed job's CER only, and without the faults
that another test injects the same way (`TINY_LEFT_OUT`): the JSON's `left_out` names them and that test.
Every other fault keeps its real launch and its own injection. `--faults` injects only the named ones (the
JSON's `faults`), each on its own job as in the whole run: the tests run them in two halves, side by side.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import report_runs  # noqa: E402
from benchmarks.harness import NO_COPIES, PYTHON, ROOT, synthetic_shards, write_json  # noqa: E402
from common.ports import reserve_port  # noqa: E402
from workflow import commands  # noqa: E402


def env(**extra: str) -> dict:
    return dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1", **extra)


def build_corpus(work: Path, utterances: int) -> Path:
    """Demo corpus -> features -> shards, through the stages' command lines."""
    data, out = work / "data", work / "shards"
    stage = lambda module, *args: subprocess.run(  # noqa: E731
        [PYTHON, "-m", module, *args], cwd=ROOT, env=env(), check=True, capture_output=True
    )
    stage(commands.CORPUS, "--out", str(data), "--num-utterances", str(utterances))
    for split in ("train", "test"):
        stage(commands.FEATURES, "--data-dir", str(data / split), "--no-progress")
    stage(
        commands.SHARDS,
        "--split",
        f"train={data / 'train'}",
        "--split",
        f"test={data / 'test'}",
        "--out",
        str(out),
        "--num-shards",
        "8",
        "--no-progress",
    )
    return out


def repeat_split(src: Path, dst: Path, times: int) -> Path:
    """Kaldi data directory `dst`: every utterance of `src` `times` times, under ids suffixed -xNN
    (the speaker prefix kept), the features and CMVN statistics shared with `src`."""
    dst.mkdir(parents=True, exist_ok=True)
    for name in ("feats.scp", "text", "utt2spk", "utt2num_frames", "wav.scp"):
        if (src / name).exists():
            entries = [line.split(" ", 1) for line in (src / name).read_text().splitlines() if line]
            repeated = sorted(f"{utt}-x{i:02d} {value}" for i in range(times) for utt, value in entries)
            (dst / name).write_text("\n".join(repeated) + "\n")
    shutil.copy(src / "cmvn.scp", dst / "cmvn.scp")
    speakers: dict[str, list[str]] = {}
    for line in (dst / "utt2spk").read_text().splitlines():
        utt, speaker = line.split()
        speakers.setdefault(speaker, []).append(utt)
    (dst / "spk2utt").write_text("".join(f"{s} {' '.join(u)}\n" for s, u in sorted(speakers.items())))
    return dst


def rank_pid(rank: int, workdir: Path, timeout: float = 180) -> int:
    """The pid of the training process of Horovod rank `rank` (its environment names it) of the job
    training in `workdir` (other trainings on the machine, a test suite's, are left alone)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
                environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            except OSError:
                continue
            if (
                b"models.train" in cmdline
                and str(workdir).encode() in cmdline
                and b"horovodrun" not in cmdline
                and f"HOROVOD_RANK={rank}".encode() in environ
            ):
                return int(pid)
        time.sleep(0.2)
    raise RuntimeError(f"no training process of rank {rank}")


class Job:
    """A training command run in the background, its output collected line by line; its progress
    read from the loss points rank 0 logs (log_every=1) into its MLflow run."""

    def __init__(self, argv: list[str], environment: dict, workdir: Path):
        self.workdir, self.uri = workdir, environment["MLFLOW_TRACKING_URI"]
        self.proc = subprocess.Popen(
            argv,
            cwd=ROOT,
            env=environment,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        self.lines: list[str] = []
        import threading

        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line)

    def step(self) -> int:
        """The last training step rank 0 logged."""
        import mlflow

        run = self.workdir / "mlflow_run.json"
        if not run.is_file():
            return 0
        history = mlflow.MlflowClient(self.uri).get_metric_history(json.loads(run.read_text())["run_id"], "loss")
        return max((m.step for m in history), default=0)

    def wait_for_step(self, step: int, timeout: float = 600) -> None:
        deadline = time.monotonic() + timeout
        while self.step() < step:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                tail = "".join(self.lines[-40:])
                raise RuntimeError(f"the job ended before step {step}:\n{tail}")
            time.sleep(0.5)

    def wait(self, timeout: float = 1200) -> int:
        code = self.proc.wait(timeout=timeout)
        self.reader.join(timeout=10)
        return code

    def output(self) -> str:
        return "".join(self.lines)


def evaluate_cer(workdir: Path, shards: Path) -> float:
    args = ["--model", str(workdir), "--shards", str(shards), "--split", "test", "--no-mlflow", "--beam-width", "1"]
    subprocess.run(
        commands.module_command(PYTHON, commands.EVALUATE, args), cwd=ROOT, env=env(), check=True, capture_output=True
    )
    return json.loads((workdir / "eval.json").read_text())["test_cer"]


@dataclasses.dataclass(frozen=True)
class Run:
    """The benchmark's settings and places, shared by every fault."""

    work: Path  # the temporary directory every job writes under
    shards: Path  # the small demo corpus' shards
    config: Path  # the acoustic config every job trains
    epochs: int  # each job's budget
    kill_at: int  # the step each fault is injected at
    sets: tuple[str, ...]  # the `--set` items every job trains with
    uri: str  # the MLflow tracking URI of the jobs that keep their server
    tiny: bool  # the tests' run: the CER only of the undisturbed job

    def train_args(self, name: str, *extra: str, shards: Path | None = None) -> list[str]:
        shards = shards or self.shards
        sets = list(self.sets)
        return commands.train_args(
            shards, self.work / name, config=self.config, epochs=self.epochs, sets=sets, extra=extra
        )

    def launch(self, name: str, *extra: str, environment: dict | None = None) -> Job:
        environment = environment or env(MLFLOW_TRACKING_URI=self.uri)
        argv = commands.horovodrun_local(PYTHON, 2, commands.TRAIN, self.train_args(name, *extra))
        return Job(argv, environment, self.work / name)

    def cer(self, name: str) -> float | None:
        """The test CER of the job trained in `name`; None in the tiny run (its model learns nothing, and
        the evaluation's code is the same for every job)."""
        return None if self.tiny else evaluate_cer(self.work / name, self.shards)


def setup(args, work: Path) -> Run:
    # Tiny (the tests): 6 epochs of 4 steps, a checkpoint and an elastic commit every 2 steps, the
    # kills at step 5, so that each resume starts from a saved step.
    epochs, kill_at, every = (6, 5, 2) if args.tiny else (args.epochs, 20, 5)
    # The demo's model, so that the final CERs compare a model that learned something.
    config = ROOT / ("tests/configs/tiny_asr.yaml" if args.tiny else "configs/demo_asr.yaml")
    sets = (NO_COPIES, f"checkpoint_every={every}", f"commit_every={every}", "log_every=1", "log_model=false")
    if args.tiny:  # four training shards: two a rank, one of them corrupted by corrupt_shard
        shards = synthetic_shards(work, 48, mean_frames=150, dim=13, num_shards=4, test_utterances=12)
    else:
        shards = build_corpus(work, args.utterances)
    return Run(work, shards, config, epochs, kill_at, sets, f"sqlite:///{work / 'mlflow.db'}", args.tiny)


def clean(run: Run) -> dict:
    """The undisturbed job of the same budget."""
    code = run.launch("clean").wait()
    return {"clean_exit": code, "clean_cer": evaluate_cer(run.work / "clean", run.shards)}


def kill_worker(run: Run) -> dict:
    """A worker killed, not elastic; then the command again (the Airflow retry)."""
    job = run.launch("kill_worker")
    job.wait_for_step(run.kill_at)
    reached = job.step()
    os.kill(rank_pid(1, run.work / "kill_worker"), signal.SIGKILL)
    killed = time.monotonic()
    code = job.wait()
    detect = time.monotonic() - killed
    retry_code = run.launch("kill_worker").wait()
    retried = json.loads((run.work / "kill_worker" / "train_summary.json").read_text())
    resumed = retried["resumed_from_step"]
    return dict(
        kill_worker_exit=code,
        kill_worker_detect_s=detect,
        kill_worker_rank_named="Process name: 1" in job.output() or "Process 1 exit" in job.output(),
        kill_worker_retry_exit=retry_code,
        kill_worker_reached_step=reached,
        kill_worker_resumed_from_step=resumed,
        kill_worker_retry_ranks_agree=retried["ranks_agree"],
        kill_worker_steps_lost=max(0, reached - resumed),
        kill_worker_cer=run.cer("kill_worker"),
    )


def elastic_job(run: Run) -> Job:
    """The training job under Horovod elastic: two hosts of one slot on this machine."""
    hosts = run.work / "hosts.txt"
    hosts.write_text("localhost:1\n127.0.0.1:1\n")
    launcher = [
        str(Path(PYTHON).with_name("horovodrun")),
        *("-np", "2", "--min-np", "1", "--max-np", "2"),
        *("--host-discovery-script", str(ROOT / "scripts" / "discover_hosts.sh")),
        *("--network-interface", "lo", "--gloo"),
    ]
    argv = [*launcher, PYTHON, "-m", commands.TRAIN, *run.train_args("elastic", "--elastic")]
    return Job(argv, env(MLFLOW_TRACKING_URI=run.uri, SPEECHFLOW_HOSTS_FILE=str(hosts)), run.work / "elastic")


def kill_worker_elastic(run: Run) -> dict:
    """A worker killed under Horovod elastic: the survivor resets and goes on alone."""
    job = elastic_job(run)
    job.wait_for_step(run.kill_at)
    reached = job.step()
    os.kill(rank_pid(1, run.work / "elastic"), signal.SIGKILL)
    killed = time.monotonic()
    while "the job now has 1 workers" not in job.output() and job.proc.poll() is None:
        time.sleep(0.1)
    reset = time.monotonic() - killed
    match = re.search(r"going on from step (\d+)", job.output())
    code = job.wait()
    if code != 0:
        print(f"the elastic job exited {code}:\n{job.output()[-4000:]}", file=sys.stderr)
    survived = json.loads((run.work / "elastic" / "train_summary.json").read_text()) if code == 0 else {}
    return dict(
        kill_worker_elastic_exit=code,
        kill_worker_elastic_reset_s=reset,
        kill_worker_elastic_reset_said="the job now has 1 workers" in job.output(),
        kill_worker_elastic_world_size=survived.get("world_size"),
        kill_worker_elastic_world_size_changes=len(survived.get("world_size_changes") or []),
        kill_worker_elastic_model_saved=(run.work / "elastic" / "model" / "config.yaml").is_file(),
        kill_worker_elastic_steps_lost=max(0, reached - int(match.group(1))) if match else None,
        kill_worker_elastic_cer=run.cer("elastic") if code == 0 else None,
    )


def kill_job(run: Run) -> dict:
    """The whole job killed, then the command again."""
    job = run.launch("kill_job")
    job.wait_for_step(run.kill_at)
    reached = job.step()
    os.killpg(job.proc.pid, signal.SIGKILL)
    # The ranks run in process groups of their own under Horovod's launcher: a lost node takes
    # them too, so they go as well (left running, they would hold the workdir's files).
    for rank in (0, 1):
        with contextlib.suppress(RuntimeError, ProcessLookupError):  # already gone
            os.kill(rank_pid(rank, run.work / "kill_job", timeout=1), signal.SIGKILL)
    job.wait()
    first_run = json.loads((run.work / "kill_job" / "mlflow_run.json").read_text())["run_id"]
    retry = run.launch("kill_job")
    retry_code = retry.wait()
    if retry_code != 0:
        raise RuntimeError(f"the re-run after killing the whole job exited {retry_code}:\n{retry.output()[-3000:]}")
    retried = json.loads((run.work / "kill_job" / "train_summary.json").read_text())
    resumed = retried["resumed_from_step"]
    return dict(
        kill_job_retry_exit=retry_code,
        kill_job_resumed_from_step=resumed,
        kill_job_same_mlflow_run=retried["run_id"] == first_run,  # the rerun goes on logging into it
        kill_job_steps_lost=max(0, reached - resumed),
        kill_job_cer=run.cer("kill_job"),
    )


def kill_shard_writer(run: Run) -> dict:
    """The shard stage killed while writing, then re-run: the same manifest as an undisturbed run."""
    # The training split repeated 30 times: its 48 utterances are written in about 10 ms, a
    # window polling can miss; 1440 take about half a second to write.
    big = repeat_split(run.work / "data" / "train", run.work / "data" / "train_x30", 30)

    def shard_argv(out: Path) -> list[str]:
        split = ["--split", f"train={big}"]
        return commands.module_command(
            PYTHON, commands.SHARDS, [*split, "--out", str(out), "--num-shards", "8", "--no-progress"]
        )

    reshard = run.work / "reshard"
    writer = subprocess.Popen(shard_argv(reshard), cwd=ROOT, env=env(), start_new_session=True)
    # Killed at its first output (a shard being written or one renamed into place), before the manifest.
    while writer.poll() is None and not (list(reshard.glob(".*.tmp")) or list(reshard.glob("train-*"))):
        time.sleep(0.005)
    killed_writer = writer.poll() is None
    if killed_writer:
        os.killpg(writer.pid, signal.SIGKILL)
    writer.wait()
    killed_writer = killed_writer and not (reshard / "manifest.json").exists()
    rerun = subprocess.run(shard_argv(reshard), cwd=ROOT, env=env(), capture_output=True)
    reference = subprocess.run(shard_argv(run.work / "reshard-clean"), cwd=ROOT, env=env(), capture_output=True)
    same = [
        [s["sha256"] for s in json.loads((run.work / d / "manifest.json").read_text())["splits"]["train"]["shards"]]
        for d in ("reshard", "reshard-clean")
    ]
    return dict(
        kill_shard_writer_killed_while_writing=killed_writer,
        kill_shard_writer_rerun_exit=rerun.returncode,
        kill_shard_writer_same_shards=same[0] == same[1] and reference.returncode == 0,
    )


def corrupt_shard(run: Run) -> dict:
    """A training shard with one flipped byte: the job's exit, and whether its error names the file."""
    broken = run.work / "broken"
    shutil.copytree(run.shards, broken)
    victim = sorted(broken.glob("train-*.tfrecord"))[1]
    data_bytes = bytearray(victim.read_bytes())
    data_bytes[len(data_bytes) // 2] ^= 0xFF
    victim.write_bytes(bytes(data_bytes))
    started = time.monotonic()
    argv = commands.horovodrun_local(PYTHON, 2, commands.TRAIN, run.train_args("corrupt", shards=broken))
    proc = subprocess.run(argv, cwd=ROOT, env=env(MLFLOW_TRACKING_URI=run.uri), capture_output=True, text=True)
    return dict(
        corrupt_shard_exit=proc.returncode,
        corrupt_shard_detect_s=time.monotonic() - started,
        corrupt_shard_named=victim.name in proc.stdout + proc.stderr,
        corrupt_shard_checksum_named="sha256" in proc.stdout + proc.stderr,
    )


def start_server(run: Run, port: int) -> subprocess.Popen:
    """An MLflow tracking server on `port`, once it answers."""
    argv = [
        *(str(Path(PYTHON).with_name("mlflow")), "server", "--host", "127.0.0.1", "--port", str(port)),
        *("--backend-store-uri", f"sqlite:///{run.work / 'server.db'}"),
        *("--artifacts-destination", str(run.work / "artifacts")),
    ]
    started = subprocess.Popen(
        argv,
        cwd=run.work,
        # without the job runner for MLflow's GenAI jobs (its Huey consumers take near half a core)
        env=env(MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false"),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    _wait_http(f"http://127.0.0.1:{port}")
    return started


def mlflow_down(run: Run) -> dict:
    """MLflow down for 30 s and its restart (the tiny run: the restart) in the middle of training: whether
    every loss point arrived."""
    import mlflow

    port = reserve_port()
    http = f"http://127.0.0.1:{port}"
    server = start_server(run, port)
    job = run.launch("mlflow_down", environment=env(MLFLOW_TRACKING_URI=http))
    job.wait_for_step(run.kill_at)
    os.killpg(server.pid, signal.SIGTERM)
    server.wait()
    # The tiny run's outage is the restart alone, which takes longer than the tiny job's remaining steps:
    # they are logged while the server is down.
    if not run.tiny:
        time.sleep(30)
    server = start_server(run, port)
    code = job.wait()
    summary = json.loads((run.work / "mlflow_down" / "train_summary.json").read_text())
    points = mlflow.MlflowClient(http).get_metric_history(summary["run_id"], "loss")
    os.killpg(server.pid, signal.SIGTERM)
    server.wait()
    return dict(
        mlflow_down_exit=code,
        mlflow_down_loss_points=len(points),
        mlflow_down_steps=summary["steps"],
        mlflow_down_none_lost=len(points) == summary["steps"],
    )


# The faults in the order they run.
FAULTS = (clean, kill_worker, kill_worker_elastic, kill_job, kill_shard_writer, corrupt_shard, mlflow_down)
# The faults the tiny run leaves out, each with the test that injects it the same way and checks what the
# tiny run would (the full run injects every fault).
TINY_LEFT_OUT = {
    "kill_shard_writer": "tests/test_shards.py::"
    "test_killed_writer_leaves_no_partial_shard_and_rerun_gives_same_manifest SIGKILLs the shard stage"
    " while it writes: no partial shard, and the rerun exits 0 with an undisturbed run's manifest",
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path)
    parser.add_argument("--tiny", action="store_true")
    parser.add_argument(
        "--faults", help=f"comma-separated, of {', '.join(f.__name__ for f in FAULTS)} (default: all, in that order)"
    )
    parser.add_argument("--utterances", type=int, default=400)
    parser.add_argument("--epochs", type=int, default=20)
    args = parser.parse_args(argv)
    names = [f.__name__ for f in FAULTS]
    chosen = args.faults.split(",") if args.faults else names
    if set(chosen) - set(names):
        parser.error(f"--faults: no fault {', '.join(sorted(set(chosen) - set(names)))} (there are {', '.join(names)})")
    work = Path(tempfile.mkdtemp(prefix="faults-"))
    try:
        run = setup(args, work)
        results: dict = {"tiny": args.tiny, "epochs": run.epochs, "kill_at_step": run.kill_at}
        left_out = {k: v for k, v in TINY_LEFT_OUT.items() if k in chosen} if args.tiny else {}
        if left_out:
            results["left_out"] = left_out
        results["faults"] = [name for name in names if name in chosen and name not in left_out]
        for fault in FAULTS:
            if fault.__name__ in results["faults"]:
                results.update(fault(run))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    seeds = {"synthetic_shards" if args.tiny else "demo_corpus": 0, "training": 0}
    record = write_json(args.json, results, seeds=seeds)
    print("\n".join(report_runs.faults(record)))
    return 0


def _wait_http(url: str, timeout: float = 120) -> None:
    import urllib.request

    deadline = time.monotonic() + timeout
    while True:
        try:
            urllib.request.urlopen(url + "/health", timeout=2)
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


if __name__ == "__main__":
    sys.exit(main())
