"""A page to try the registered champions: audio in, transcript out; a sentence and a voice in, speech
out. `make try` starts it (through `models.serving.try_launcher`, which serves the champions first).

Why over HTTP, in an environment of its own: Gradio pins `pillow<13`, and the training environment
(.venv) has pillow 13 through matplotlib, so the page cannot share .venv without moving a package
under the training stack. It runs in `.venv-try` (Gradio alone, requirements/try.in), where neither
TensorFlow nor MLflow is installed, and asks the champions as any client would: through the HTTP API
of `mlflow models serve`, each server holding `mlflow.pyfunc.load_model("models:/NAME@champion")`
(models/serving/pyfunc.py `SpeechModel`). What the page shows is what serving answers, byte for byte.

Imports nothing of the project but common/voices.py: `--champions FILE` (JSON written by the launcher,
models/serving/try_launcher.py) tells it, for `asr` and `tts`, the registered name and version, the URL
of its server, the synthesis voices and what the acoustic model's outputs are (`targets`: chars, or
phones spelled into words through its graph), or why that champion is missing.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import tempfile
import urllib.error
import urllib.request
import wave
from pathlib import Path

from common import voices

TIMEOUT_S = 300  # one request; an untrained synthesis model may decode all of its max_steps
MAX_STEPS = 400  # synthesis decoder steps (the served model's default)
LABELS = {"asr": "acoustic model", "tts": "synthesis model"}
# What the models of `make demo` know (pipeline/corpus.py, docs/data.md "The demo corpus"), said
# before anyone records their own voice and wonders at the transcript.
HEARD = (
    "**What the demo models have heard: synthetic speech only.** `make demo` trains them on the voices "
    f"of three speech synthesizers, {voices.describe(voices.TRAIN_VOICES)}, and tests them on voices they "
    f"never heard: {voices.describe(voices.TEST_VOICES)}, and the speakers slt and kal in every engine that "
    f"has them, {voices.describe(voices.TEST_ENGINE_VOICES)}. They have never heard a human voice: a "
    "recording of yours will come back mostly wrong. A model trained on a corpus of your own (the "
    "pipeline's `data_dir`) knows what that corpus holds."
)


class PageError(Exception):
    """A request the page cannot answer, with the reason a user can act on."""


def missing_message(kind: str, champion: dict) -> str | None:
    """Why `kind`'s champion cannot answer (None when it can)."""
    if champion.get("url"):
        return None
    return champion.get("error") or f"no {LABELS[kind]} is being served"


def invoke(url: str, body: dict) -> object:
    """POSTs a JSON request to a `mlflow models serve` endpoint; returns its `predictions`."""
    request = urllib.request.Request(
        f"{url}/invocations", json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_S) as answer:
            return json.loads(answer.read())["predictions"]
    except urllib.error.HTTPError as err:  # MLflow's JSON error: {"error_code": ..., "message": ...}
        detail = err.read().decode("utf-8", "replace")
        with contextlib.suppress(ValueError, AttributeError):  # not MLflow's JSON: the text as it came
            detail = json.loads(detail).get("message", detail)
        raise PageError(f"the model server refused the request (HTTP {err.code}): {detail[:2000]}") from err
    except OSError as err:
        raise PageError(f"the model server at {url} does not answer ({err}); is `make try` still running?") from err


def transcribe(champion: dict, audio_path: str | None) -> str:
    """An audio file (WAV, FLAC, SPHERE; any rate) -> the champion's transcript."""
    if missing := missing_message("asr", champion):
        raise PageError(missing)
    if not audio_path:
        raise PageError("upload or record some audio first")
    encoded = base64.b64encode(Path(audio_path).read_bytes()).decode("ascii")
    predictions = invoke(champion["url"], {"dataframe_records": [{"audio": encoded}]})
    return str(predictions[0])


def speak(champion: dict, sentence: str, voice: str | None, out_dir: Path) -> str:
    """A sentence in a voice -> the path of the WAV file that the champion returned, written as it came."""
    if missing := missing_message("tts", champion):
        raise PageError(missing)
    if not sentence or not sentence.strip():
        raise PageError("type a sentence first")
    row = {"text": sentence.strip(), **({"voice": voice} if voice else {})}
    predictions = invoke(champion["url"], {"dataframe_records": [row], "params": {"max_steps": MAX_STEPS}})
    data = base64.b64decode(predictions["audio"][0])
    out = Path(tempfile.mkstemp(suffix=".wav", prefix="speech-", dir=out_dir)[1])
    out.write_bytes(data)
    try:
        with wave.open(str(out)) as check:  # a broken answer is said here, not as a silent player
            check.getnframes()
    except (wave.Error, EOFError) as err:
        raise PageError(f"the synthesis model answered something that is not a WAV file ({err})") from err
    return str(out)


def header(kind: str, champion: dict) -> str:
    """One line over each tab: which registered version answers, or why none does."""
    if missing := missing_message(kind, champion):
        return f"**No {LABELS[kind]} to try.** {missing}"
    line = f"Answered by `{champion['name']}` version {champion['version']} (alias `{champion['alias']}`)."
    if champion.get("targets") == "phones":
        line += " A phone model: it hears phones and spells the words through its decoding graph."
    return line


def build(champions: dict, out_dir: Path):
    """The Gradio page for `champions` (see the module docstring)."""
    import gradio as gr

    def on_transcribe(audio_path):
        try:
            return transcribe(champions["asr"], audio_path)
        except PageError as err:
            raise gr.Error(str(err), duration=None) from err

    def on_speak(sentence, voice):
        try:
            return speak(champions["tts"], sentence, voice, out_dir)
        except PageError as err:
            raise gr.Error(str(err), duration=None) from err

    # The natural voices' speakers first: the ones built from recordings of people.
    speakers = sorted(champions["tts"].get("voices") or [], key=lambda s: not voices.is_natural_speaker(s))
    asr_ready, tts_ready = (missing_message(k, champions[k]) is None for k in ("asr", "tts"))
    with gr.Blocks(title="speechflow: try the models", analytics_enabled=False) as page:
        gr.Markdown("# Try the models\nThe registered champions answer: speech to text, and text to speech.")
        gr.Markdown(HEARD, elem_id="heard")
        with gr.Tab("Speech to text"):
            gr.Markdown(header("asr", champions["asr"]), elem_id="asr-status")
            audio_in = gr.Audio(sources=["upload", "microphone"], type="filepath", label="Audio", elem_id="audio-in")
            transcribe_button = gr.Button("Transcribe", variant="primary", interactive=asr_ready, elem_id="transcribe")
            transcript = gr.Textbox(label="Transcript", interactive=False, elem_id="transcript")
            transcribe_button.click(on_transcribe, audio_in, transcript)
        with gr.Tab("Text to speech"):
            gr.Markdown(header("tts", champions["tts"]), elem_id="tts-status")
            sentence = gr.Textbox(label="Sentence", placeholder="the taxi is late", elem_id="sentence")
            voice = gr.Dropdown(
                choices=speakers,
                value=speakers[0] if speakers else None,
                label="Voice" if speakers or not tts_ready else "Voice (this model has one)",
                interactive=bool(speakers),
                elem_id="voice",
            )
            speak_button = gr.Button("Speak", variant="primary", interactive=tts_ready, elem_id="speak")
            speech = gr.Audio(label="Speech", type="filepath", interactive=False, elem_id="speech")
            speak_button.click(on_speak, [sentence, voice], speech)
    return page


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m apps.try_page", description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--champions", required=True, type=Path, help="JSON from models.serving.try_launcher: servers, voices"
    )
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=7860, help="port to listen on (default 7860)")
    return p


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    champions = json.loads(args.champions.read_text(encoding="utf-8"))
    with tempfile.TemporaryDirectory(prefix="speechflow-try-") as out_dir:
        page = build(champions, Path(out_dir))
        page.launch(server_name=args.host, server_port=args.port, footer_links=[], allowed_paths=[out_dir])


if __name__ == "__main__":
    main()
