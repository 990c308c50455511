"""`make airflow-ui` for real: `airflow standalone` (scripts/airflow_ui.sh) on a free port, the DAG
triggered through the REST API (v2, with a JWT from the simple auth manager) with params, followed
until it succeeds, and every process it started stopped afterwards, whatever happened.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections import defaultdict
from pathlib import Path

import pytest

from common.ports import reserve_port
from tests.conftest import AIRFLOW_BIN, ROOT
from tests.test_dag import TINY, airflow_env

# Only the acoustic model: the synthesis branch is skipped, which the run must survive. The smallest
# run the form accepts, on one worker: what only standalone checks is the scheduler, its executor and
# the REST API around the tasks; test_dag's `dags test` runs the whole DAG at two workers.
CONF = {
    **TINY,
    "models": ["asr"],
    "experiment": "standalone",
    "demo_utterances": 20,
    "num_shards": 1,
    "num_workers": 1,
    "max_steps": 2,
    "eval_utterances": 2,
}


def descendants(pid: int) -> set[int]:
    """Every process below `pid`, including those in sessions of their own (the stage commands)."""
    children: dict[int, list[int]] = defaultdict(list)
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue  # the process ended while we looked
        children[ppid].append(int(stat.parent.name))
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def stop(proc: subprocess.Popen) -> set[int]:
    """SIGTERM to standalone's process group and to each of its descendants, SIGKILL after 60 s.
    Returns the processes that are still alive afterwards (none, unless something is badly wrong)."""
    family = descendants(proc.pid) | {proc.pid}
    for pid in family:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and any(alive(p) for p in family):
        proc.poll()
        time.sleep(0.5)
    family |= descendants(proc.pid)
    for pid in family:
        if alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(30)
    time.sleep(1)
    return {p for p in family if alive(p)}


def request(method: str, url: str, body: dict | None = None, token: str | None = None, timeout: float = 30):
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, headers=headers, method=method)
    with urllib.request.urlopen(req, timeout=timeout) as response:
        return response.status, json.loads(response.read() or b"null")


def wait_for(what: str, check, timeout: float, every: float = 2, log: Path | None = None):
    """Calls `check` until it returns something truthy; fails with `what` (and the log's tail) after `timeout`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if result := check():
                return result
        except (
            urllib.error.URLError,
            ConnectionError,
            TimeoutError,
            json.JSONDecodeError,
            FileNotFoundError,
        ):
            pass
        time.sleep(every)
    tail = log.read_text(errors="replace")[-6000:] if log and log.exists() else ""
    pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}\n{tail}")


def failure_report(run_url: str, token: str, states: dict[str, str], log: Path) -> str:
    """The task states, each failed task's own log and the tail of standalone's: what a failed run needs read."""
    parts = [json.dumps(states, indent=1)]
    for task in (t for t, s in states.items() if s == "failed"):
        try:
            _, body = request("GET", f"{run_url}/taskInstances/{task}/logs/1?full_content=true", token=token)
            parts.append(f"--- {task}'s log ---\n{json.dumps(body, indent=1)[-6000:]}")
        except (urllib.error.URLError, TimeoutError) as err:
            parts.append(f"--- {task}'s log could not be read: {err}")
    parts.append(f"--- standalone.log ---\n{log.read_text(errors='replace')[-8000:]}")
    return "\n".join(parts)


@pytest.mark.skipif(not (AIRFLOW_BIN / "airflow").exists(), reason=".venv-airflow is missing (make setup builds it)")
@pytest.mark.slow
@pytest.mark.airflow
def test_standalone_runs_the_dag_triggered_through_the_rest_api(tmp_path, sqlite_store):
    port, home = reserve_port(), tmp_path / "home"
    base = f"http://127.0.0.1:{port}"
    work = Path(tempfile.mkdtemp(prefix="sf-"))  # short: see test_dag's end-to-end test
    env = airflow_env(
        home,
        AIRFLOW_PORT=str(port),
        AIRFLOW__CORE__PARALLELISM="2",
        MLFLOW_TRACKING_URI=sqlite_store,
        SPEECHFLOW_WORK_ROOT=str(work),
    )
    log = tmp_path / "standalone.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            ["bash", str(ROOT / "scripts" / "airflow_ui.sh")],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        wait_for(
            "the API server", lambda: request("GET", f"{base}/api/v2/monitor/health")[0] == 200, 300, every=0.5, log=log
        )
        passwords = home / "simple_auth_manager_passwords.json.generated"
        password = wait_for("the admin password", lambda: json.loads(passwords.read_text()).get("admin"), 60)
        _, login = request("POST", f"{base}/auth/token", {"username": "admin", "password": password})
        token = login["access_token"]
        dag_url = f"{base}/api/v2/dags/speech_pipeline"

        def parsed():
            try:
                return request("GET", dag_url, token=token)[1]
            except urllib.error.HTTPError as err:
                if err.code == 404:  # not parsed yet
                    return None
                raise

        assert wait_for("the DAG to be parsed", parsed, 180, every=0.5, log=log)["dag_id"] == "speech_pipeline"
        request("PATCH", dag_url, {"is_paused": False}, token)
        status, run = request("POST", f"{dag_url}/dagRuns", {"logical_date": None, "conf": CONF}, token)
        assert status == 200 and run["conf"]["models"] == ["asr"]
        run_url = f"{dag_url}/dagRuns/{urllib.request.quote(run['dag_run_id'], safe='')}"

        asked = [0.0]

        def finished():
            # A REST call costs the API server about 40 ms of CPU that the run's tasks want: ask every 5 s,
            # and every time once the teardown has written the run's summary (the run ends right after).
            if time.monotonic() - asked[0] < 5 and not any(work.glob("*/summary.json")):
                return None
            asked[0] = time.monotonic()
            state = request("GET", run_url, token=token)[1]["state"]
            return state if state in ("success", "failed") else None

        state = wait_for("the DAG run to finish", finished, 900, every=0.5, log=log)
        _, instances = request("GET", f"{run_url}/taskInstances", token=token)
        states = {ti["task_id"]: ti["state"] for ti in instances["task_instances"]}
        assert state == "success", failure_report(run_url, token, states, log)
        # No copies of the training audio in the tiny config: the augment stage skips too; and it trains on
        # characters: no LM text, lexicon or decoding graph.
        skipped = {"train_tts", "evaluate_tts", "register_tts", "augment_train", "features_train_aug"}
        skipped |= {"lm_text", "lexicon", "build_graph"}
        assert {t for t, s in states.items() if s == "skipped"} == skipped, states
        assert all(s == "success" for t, s in states.items() if t not in skipped), states
        assert (next(work.glob("*/summary.json"))).is_file()
        # The task log holds the stage's own output (pipeline.shards prints where the manifest went).
        _, task_log = request("GET", f"{run_url}/taskInstances/make_shards/logs/1?full_content=true", token=token)
        assert "manifest:" in json.dumps(task_log) and "python -m pipeline.shards" in json.dumps(task_log)
    finally:
        survivors = stop(proc)
        shutil.rmtree(work, ignore_errors=True)
    assert not survivors, f"processes left running: {survivors}"
