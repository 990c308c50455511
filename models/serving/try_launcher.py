"""`make try`: serves the registered champions and opens the page that tries them (apps/try_page.py).

    python -m models.serving.try_launcher [--port 7860] [--host 127.0.0.1] [--asr-name speechflow-asr] ...

Runs in the training environment (.venv), which has MLflow and TensorFlow: it looks up each
champion (`models:/NAME@champion`) in the MLflow store of MLFLOW_TRACKING_URI, reads the synthesis
voices from the model's `data.json`, starts one `mlflow models serve` per champion on a free
loopback port, then the page in `.venv-try` (Gradio; see apps/try_page.py for why it lives
apart). A champion that is not registered yet is no error: its tab says so and names the command
that makes one (`make demo`). Ctrl-C (or SIGTERM) stops the servers and the page.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from common.ports import reserve_port
from models import registry
from models.serving import mlflow_serve
from models.tracking import runs as tracking

ROOT = Path(__file__).resolve().parents[2]
PAGE_PYTHON = ROOT / ".venv-try" / "bin" / "python"
KINDS = ("asr", "tts")
START_TIMEOUT_S = 300  # a model server imports TensorFlow and loads the weights; slow on 2 busy cores


def champion(name: str, kind: str, alias: str = registry.ALIAS) -> dict:
    """What the page needs of `name`'s champion: {name, alias, version, uri, voices, targets}, or {name,
    alias, error} when no version holds `alias` or the version is not a `kind` model."""
    import mlflow
    from mlflow.exceptions import MlflowException

    found = {"name": name, "alias": alias}
    try:
        version = tracking.client().get_model_version_by_alias(name, alias)
    except MlflowException as err:
        if err.error_code not in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE") or "not found" not in str(err):
            raise
        store = tracking.tracking_uri()
        error = (
            f"no version of {name} holds the alias '{alias}' in the MLflow store {store}: "
            "`make demo` trains and registers one; then run `make try` again."
        )
        return {**found, "error": error}
    uri = f"models:/{name}/{version.version}"  # this version, even if the alias moves meanwhile
    # models/serving/pyfunc.py log_model: the model directory is the pyfunc artifact `model_dir`.
    flavor = mlflow.models.Model.load(uri).flavors["python_function"]
    model_dir = flavor["artifacts"]["model_dir"]["path"]
    with tempfile.TemporaryDirectory() as tmp:
        data_file = mlflow.artifacts.download_artifacts(artifact_uri=f"{uri}/{model_dir}/data.json", dst_path=tmp)
        data = json.loads(Path(data_file).read_text(encoding="utf-8"))
    if data.get("model") != kind:
        return {**found, "error": f"{name} version {version.version} is a {data.get('model')!r} model, not {kind!r}"}
    voices = list(data.get("voices") or [])
    # what an acoustic model spells: a phone model answers words through its attached graph (models/asr/lm.py)
    return {**found, "version": version.version, "uri": uri, "voices": voices, "targets": data.get("targets", "chars")}


def start(cmd: list[str], log: Path, env: dict) -> subprocess.Popen:
    """A child in a session of its own (`mlflow_serve.stop_session` ends it with the workers it starts),
    output to `log`."""
    with log.open("w") as out:
        return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def wait_until_up(children: dict[str, tuple[subprocess.Popen, str, Path]], timeout: float) -> None:
    """Waits for every child's URL to answer 200; raises RuntimeError with a child's log when it exits."""
    waiting = dict(children)
    deadline = time.monotonic() + timeout
    while waiting:
        for what, (proc, url, log) in list(waiting.items()):
            if proc.poll() is not None:
                raise RuntimeError(
                    f"{what} exited with status {proc.returncode}; its log ({log}):\n{log.read_text()[-4000:]}"
                )
            try:
                with urllib.request.urlopen(url, timeout=2) as answer:
                    if answer.status == 200:
                        del waiting[what]
            except OSError:
                pass
        if waiting and time.monotonic() > deadline:
            logs = sorted(str(log) for _, _, log in waiting.values())
            raise RuntimeError(f"not up after {timeout:.0f} s: {', '.join(waiting)} (logs: {', '.join(logs)})")
        time.sleep(0.5)


def check_can_start(host: str, port: int) -> None:
    """RuntimeError when the page's port is taken (a page already there would answer for ours),
    FileNotFoundError when Gradio's environment is missing."""
    with socket.socket() as sock:
        try:
            sock.bind((host, port))
        except OSError as err:
            raise RuntimeError(
                f"{host}:{port} is taken ({err.strerror}): choose another port, TRY_PORT=N make try"
            ) from err
    if not PAGE_PYTHON.is_file():
        raise FileNotFoundError(
            f"{PAGE_PYTHON} does not exist: run `make setup` (it builds .venv-try, Gradio's environment)"
        )


def serve_champions(champions: dict, env: dict, log_dir: Path, children: dict) -> None:
    """Starts `mlflow models serve` of each found champion on a free loopback port; adds it to
    `children` (what: (process, ping URL, log)) and its `url` to the champion."""
    for kind, found in champions.items():
        if "uri" not in found:
            print(f"[try] {found['error']}", flush=True)
            continue
        server_port = reserve_port()
        found["url"] = f"http://127.0.0.1:{server_port}"
        log = log_dir / f"serve-{kind}.log"
        serve = mlflow_serve.serve_command(found["uri"], server_port)
        children[f"the {kind} model server"] = (start(serve, log, env), f"{found['url']}/ping", log)
        print(f"[try] serving {found['uri']} on {found['url']} (log: {log})", flush=True)


def start_page(champions: dict, env: dict, host: str, port: int, log_dir: Path, children: dict) -> None:
    """Writes champions.json and starts the page in .venv-try; adds it to `children`."""
    champions_file = log_dir / "champions.json"
    champions_file.write_text(json.dumps(champions, indent=2) + "\n", encoding="utf-8")
    page_env = dict(env, GRADIO_ANALYTICS_ENABLED="False", HF_HUB_OFFLINE="1", PYTHONPATH=str(ROOT))
    page = [str(PAGE_PYTHON), "-m", "apps.try_page", "--champions", str(champions_file)]
    page += ["--host", host, "--port", str(port)]
    page_log = log_dir / "page.log"
    children["the page"] = (start(page, page_log, page_env), f"http://{host}:{port}/", page_log)


def run(host: str, port: int, names: dict[str, str], alias: str, log_dir: Path) -> int:
    """Serves the champions and the page until one of them exits or a signal arrives."""
    check_can_start(host, port)
    log_dir.mkdir(parents=True, exist_ok=True)
    champions = {kind: champion(names[kind], kind, alias) for kind in KINDS}
    env = mlflow_serve.serve_env(
        os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1", MLFLOW_TRACKING_URI=tracking.tracking_uri()
    )
    children: dict[str, tuple[subprocess.Popen, str, Path]] = {}
    try:
        serve_champions(champions, env, log_dir, children)
        start_page(champions, env, host, port, log_dir, children)
        wait_until_up(children, START_TIMEOUT_S)
        print(f"[try] ready: open http://{host}:{port}/ (Ctrl-C stops it)", flush=True)
        while all(proc.poll() is None for proc, _, _ in children.values()):
            time.sleep(1)
        ended = next(what for what, (proc, _, _) in children.items() if proc.poll() is not None)
        log = children[ended][2]
        print(f"[try] {ended} exited; its log ({log}):\n{log.read_text()[-4000:]}", file=sys.stderr)
        return 1
    finally:
        for proc, _, _ in children.values():
            mlflow_serve.stop_session(proc, grace=20)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m models.serving.try_launcher", description=__doc__.split("\n\n")[0])
    p.add_argument("--host", default="127.0.0.1", help="the page's address (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=7860, help="the page's port (default 7860)")
    p.add_argument("--asr-name", default="speechflow-asr", help="registered acoustic model (default speechflow-asr)")
    p.add_argument("--tts-name", default="speechflow-tts", help="registered synthesis model (default speechflow-tts)")
    p.add_argument(
        "--alias", default=registry.ALIAS, help=f"the alias that marks the version to try (default {registry.ALIAS})"
    )
    p.add_argument("--log-dir", type=Path, default=ROOT / ".runs" / "try", help="the servers' and the page's logs")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    # SIGTERM ends the run as Ctrl-C does, so that `finally` stops the children.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        return run(args.host, args.port, {"asr": args.asr_name, "tts": args.tts_name}, args.alias, args.log_dir)
    except KeyboardInterrupt:
        return 130
    except (FileNotFoundError, RuntimeError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
