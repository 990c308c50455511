"""The page that tries the champions (`make try`: models/serving/try_launcher.py serves them,
apps/try_page.py is the page): untrained tiny models registered as champions in a temporary MLflow
store, the launcher run as `make try` runs it, and headless Chromium uploading a WAV and asking for
speech."""

from __future__ import annotations

import base64
import http.server
import importlib.util
import io
import json
import re
import socket
import subprocess
import threading
import time
from pathlib import Path

import pandas as pd
import pytest
import soundfile

from apps import try_page
from common.ports import reserve_port
from models.serving import mlflow_serve, try_launcher
from tests.conftest import PYTHON, ROOT, quiet_env
from tests.kaldi_fixtures import tone
from tests.test_serving import model_dir, served

CHROMIUM = Path("/usr/bin/chromium")
# Headless, and nothing that reaches outside the machine (updates, sync, QUIC probes).
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def why_no_browser_test() -> str | None:
    if not CHROMIUM.is_file():
        return f"{CHROMIUM} is missing: `make setup` as root installs Debian's chromium (or apt-get install chromium)"
    if importlib.util.find_spec("playwright") is None:
        return "the playwright package is missing from .venv: run `make setup`"
    if not try_launcher.PAGE_PYTHON.is_file():
        return f"{try_launcher.PAGE_PYTHON} is missing (Gradio's environment): run `make setup`"
    return None


def use_store(uri: str, monkeypatch) -> str:
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    return uri


def register_champion(path: Path, name: str) -> None:
    """Logs a model directory as the pyfunc model and makes the new version `name`'s champion."""
    import mlflow

    from models import registry, trained_model
    from models.serving import pyfunc as serving
    from models.tracking import runs as tracking

    _, config, data = trained_model.load_model_dir(path)
    experiment_id = tracking.ensure_experiment("try")
    with mlflow.start_run(experiment_id=experiment_id):
        logged = serving.log_model(path, config, data)
    version = mlflow.register_model(logged.model_uri, name)
    tracking.client().set_registered_model_alias(name, registry.ALIAS, version.version)


def test_a_missing_champion_names_the_command_that_makes_one(tmp_path, sqlite_store, monkeypatch):
    use_store(sqlite_store, monkeypatch)
    missing = try_launcher.champion("nobody-asr", "asr")
    assert "`make demo` trains and registers one" in missing["error"] and "uri" not in missing
    assert try_page.header("asr", missing).startswith("**No acoustic model to try.**")
    with pytest.raises(try_page.PageError, match="make demo"):
        try_page.transcribe(missing, str(tmp_path / "any.wav"))
    with pytest.raises(try_page.PageError, match="make demo"):
        try_page.speak(missing, "hello", None, tmp_path)


def test_a_taken_port_is_refused_before_anything_starts(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        port = taken.getsockname()[1]
        with pytest.raises(RuntimeError, match=f"127.0.0.1:{port} is taken .*TRY_PORT=N make try"):
            try_launcher.run("127.0.0.1", port, {"asr": "a", "tts": "t"}, "champion", tmp_path / "logs")
    assert not (tmp_path / "logs").exists()


class Refusing(http.server.BaseHTTPRequestHandler):
    """Answers every POST as `mlflow models serve` answers a request that predict() refused."""

    def do_POST(self):  # noqa: N802 (the name http.server calls)
        self.rfile.read(int(self.headers["Content-Length"]))
        body = json.dumps({"error_code": "BAD_REQUEST", "message": "voice 'carol' is not one of alice, bob"})
        self.send_response(400)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(body.encode())

    def log_message(self, *args):
        pass


def test_a_refused_request_shows_the_servers_reason_and_a_silent_server_says_so(tmp_path):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Refusing)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        champion = {"name": "t", "version": "1", "url": f"http://127.0.0.1:{server.server_port}"}
        with pytest.raises(try_page.PageError, match=r"HTTP 400\): voice 'carol' is not one of alice, bob"):
            try_page.speak(champion, "hello", "carol", tmp_path)
    finally:
        server.shutdown()
        server.server_close()
    with pytest.raises(try_page.PageError, match="does not answer"):
        try_page.speak({**champion, "url": f"http://127.0.0.1:{reserve_port()}"}, "hello", None, tmp_path)


LOCAL = ("http://127.0.0.1", "data:", "blob:")  # what the page may load: itself, and what it made
# In the page: waits for the <audio> element's metadata (the browser decoded the file's header), then
# returns its duration and the bytes behind its src (a blob: URL, which only the page can read).
PLAYABLE = """async (el) => {
  if (el.readyState < 1) await new Promise((ok, fail) => {
    el.addEventListener("loadedmetadata", ok, {once: true});
    el.addEventListener("error", () => fail(new Error("the browser cannot decode " + el.src)), {once: true});
  });
  const bytes = new Uint8Array(await (await fetch(el.src)).arrayBuffer());
  let binary = "";
  for (const b of bytes) binary += String.fromCharCode(b);
  return {duration: el.duration, base64: btoa(binary)};
}"""


TYPED = "Dr. Lee paid $12 for 3 tickets, didn't she?"


@pytest.mark.slow
@pytest.mark.skipif(why_no_browser_test() is not None, reason=why_no_browser_test() or "")
def test_the_page_transcribes_an_uploaded_wav_and_speaks_a_typed_sentence(tmp_path, sqlite_store, monkeypatch):
    """The transcript on the page is the acoustic champion's for the uploaded file, and the <audio>
    the page plays holds the synthesis champion's WAV in the voice picked, byte for byte."""
    from playwright.sync_api import expect, sync_playwright

    uri = use_store(sqlite_store, monkeypatch)
    monkeypatch.chdir(tmp_path)
    asr_dir = model_dir(tmp_path / "asr", "asr")
    tts_dir = model_dir(tmp_path / "tts", "tts", voices=("alice", "bob"))
    register_champion(asr_dir, "try-asr")
    register_champion(tts_dir, "try-tts")
    assert try_launcher.champion("try-tts", "tts")["voices"] == ["alice", "bob"]
    assert "try-tts version 1 is a 'tts' model, not 'asr'" in try_launcher.champion("try-tts", "asr")["error"]
    port, log = reserve_port(), tmp_path / "launcher.log"
    cmd = [
        PYTHON,
        "-m",
        "models.serving.try_launcher",
        "--port",
        str(port),
        "--asr-name",
        "try-asr",
        "--tts-name",
        "try-tts",
        "--log-dir",
        str(tmp_path / "logs"),
    ]
    with log.open("w") as out:
        launcher = subprocess.Popen(
            cmd, cwd=ROOT, env=quiet_env(MLFLOW_TRACKING_URI=uri), stdout=out, stderr=out, start_new_session=True
        )
    try:
        # What the champions answer, computed here while the launcher starts their servers.
        wav = tmp_path / "upload.wav"
        soundfile.write(wav, tone(0.6, seed=5), 16000, subtype="PCM_16")
        expected = served(asr_dir).predict(
            None, pd.DataFrame({"audio": [base64.b64encode(wav.read_bytes()).decode()]})
        )[0]
        assert expected.strip(), "the untrained model wrote nothing: the comparison below could not fail"
        # A typed sentence of open English, numbers and punctuation in it: the model speaks it spelled out.
        sentence = pd.DataFrame({"text": [TYPED], "voice": ["bob"]})
        spoken = base64.b64decode(served(tts_dir).predict(None, sentence)["audio"][0])
        spelled = pd.DataFrame(
            {"text": ["doctor lee paid twelve dollars for three tickets didn't she"], "voice": ["bob"]}
        )
        assert base64.b64decode(served(tts_dir).predict(None, spelled)["audio"][0]) == spoken

        deadline = time.monotonic() + 240
        while "[try] ready" not in log.read_text():
            assert launcher.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.5)
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
            page = browser.new_page()
            outside = []
            page.on("request", lambda r: r.url.startswith(LOCAL) or outside.append(r.url))
            page.goto(f"http://127.0.0.1:{port}/")
            expect(page.locator("#asr-status")).to_contain_text("Answered by try-asr version 1")
            expect(page.locator("#heard")).to_contain_text("They have never heard a human voice")
            errors = page.get_by_test_id("toast-body")

            page.locator("#audio-in input[type=file]").set_input_files(str(wav))
            page.locator("#transcribe").click()
            expect(page.locator("#transcript textarea")).to_have_value(expected, timeout=60_000)
            expect(errors).to_have_count(0)

            page.get_by_role("tab", name="Text to speech").click()
            page.locator("#speak").click()  # no sentence yet: the page says what to do
            expect(errors.get_by_test_id("toast-text")).to_have_text("type a sentence first")
            errors.get_by_test_id("toast-close").click()
            page.locator("#sentence textarea").fill(TYPED)
            page.locator("#voice input").click()
            page.get_by_role("option", name="bob").click()
            page.locator("#speak").click()
            audio = page.get_by_test_id("waveform-Speech").locator("audio")
            expect(audio).to_have_attribute("src", re.compile(r".+"), timeout=90_000)
            expect(errors).to_have_count(0)
            played = audio.evaluate(PLAYABLE)
            browser.close()
        assert played["duration"] > 0, played
        body = base64.b64decode(played["base64"])
        samples, rate = soundfile.read(io.BytesIO(body))
        assert rate > 0 and len(samples) > 0
        assert body == spoken, "the page played something else than the synthesis champion's WAV in voice bob"
        assert not outside, f"the page reached outside the machine: {outside}"
    finally:
        mlflow_serve.stop_session(launcher, grace=60)  # the launcher stops its servers and the page first
