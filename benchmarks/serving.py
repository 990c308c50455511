"""Load on a served acoustic model: `mlflow models serve` of an acoustic model under 1, 4 and 16
concurrent clients posting one utterance a request (base64 WAV), and one request of 16 rows.

Per level: requests/s, p50 and p99 latency, real-time factor (latency over the utterance's
duration, median and p99) and failed requests. The model: by default one of the demo config's exact
shapes (configs/demo_asr.yaml: 3 BLSTM layers of 192, 80 mel bins) with untrained weights, posted
3-6 s of voiced noise (inference costs the same whatever the weights); with `--demo-run DIR`, the
run's trained acoustic model (`asr/model`), posted utterances of its held-out voices (the corpus'
`test_engine`, else `test`). A model with an attached word LM (models/asr/lm.py) is
measured twice on the same server: as served (beam search with the LM) and with the request param
`lm: false` (greedy). Clients run in this process, on the same machine as the server, so they share
its cores.

Goals (2-core machine): real-time factor <= 0.05 at one client, p99 <= 2 s at 4 clients for the
untrained model's 3-6 s utterances (1 s for a trained model with its LM), no failed request
at 16.
"""

from __future__ import annotations

import argparse
import base64
import concurrent.futures
import dataclasses
import io
import json
import os
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import report_speed  # noqa: E402
from benchmarks.harness import ROOT, write_json  # noqa: E402
from common.ports import reserve_port  # noqa: E402

GOALS = {"rtf_1_client": 0.05, "p99_s_4_clients": 2.0, "failed_16_clients": 0}
GOALS_WITH_LM = {**GOALS, "p99_s_4_clients": 1.0}  # a trained model served with its word LM
GOALS_WITH_GRAPH = {**GOALS, "p99_s_4_clients": 0.5}  # a trained phone model served through its HLG graph
VOCABULARY_TEXT = "abcdefghijklmnopqrstuvwxyz '"


def model_dir(path: Path, config_file: Path) -> Path:
    """A model directory of `config_file`'s acoustic model with untrained weights (data.json as the
    trainer writes it: the feature stage's defaults, per-utterance CMVN from the config)."""
    import keras

    from common import config as configlib
    from models.asr import network as asr
    from models.training import checkpoint
    from models.training.config import TrainConfig
    from pipeline import features, text

    keras.utils.set_random_seed(0)
    vocabulary = text.build_vocabulary([VOCABULARY_TEXT])
    config = configlib.load(TrainConfig, config_file)
    config = dataclasses.replace(
        config, settings=dataclasses.replace(config.settings, feature_dim=80, vocab_size=len(vocabulary))
    )
    model = asr.build_asr(config.settings)
    checkpoint.save(path, 1, model.weights, [], {"final": True}, 1, (model.name,))
    configlib.save(config, path / "config.yaml")
    data = {
        "model": "asr",
        "vocabulary": vocabulary,
        "lowercase": True,
        "feature_dim": 80,
        "mel_mean": [0.0] * 80,
        "mel_std": [1.0] * 80,
        "features": configlib.to_dict(features.FeatureConfig(jobs=1)),
        "voices": [],
    }
    (path / "data.json").write_text(json.dumps(data))
    return path


def utterances(count: int, low: float, high: float, seed: int = 0) -> list[tuple[float, str]]:
    """(seconds, base64 16-bit WAV at 16 kHz) of `count` lengths spread over [low, high]: voiced
    noise, so fbank and decoding do their usual work."""
    import soundfile

    rng = np.random.default_rng(seed)
    out = []
    for seconds in np.linspace(low, high, count):
        n = int(seconds * 16000)
        t = np.arange(n) / 16000
        wave = 0.2 * np.sin(2 * np.pi * (150 + 50 * np.sin(2 * np.pi * 0.5 * t)) * t) + 0.05 * rng.normal(size=n)
        buffer = io.BytesIO()
        soundfile.write(buffer, np.clip(wave, -1, 1), 16000, subtype="PCM_16", format="WAV")
        out.append((n / 16000, base64.b64encode(buffer.getvalue()).decode()))
    rng.shuffle(out)
    return out


def recorded(data_dir: Path, count: int, seed: int = 0) -> list[tuple[float, str]]:
    """(seconds, base64 WAV) of `count` utterances of a Kaldi data directory's wav.scp (files, as the
    demo corpus writes them), drawn at random with `seed`."""
    import random

    import soundfile

    from pipeline import kaldi

    table = sorted(kaldi.read_table(data_dir / "wav.scp").values.items())
    if not table:
        raise ValueError(f"{data_dir / 'wav.scp'}: no utterances")
    out = []
    for _, path in random.Random(seed).sample(table, min(count, len(table))):
        out.append((soundfile.info(path).duration, base64.b64encode(Path(path).read_bytes()).decode()))
    return out


def post(url: str, rows: list[dict], timeout: float = 120, params: dict | None = None) -> tuple[float, bool, str]:
    """(seconds, answered 200, error text) of one request; `params`: the request's (`lm`, `beam_width`)."""
    body = json.dumps({"dataframe_records": rows, **({"params": params} if params else {})}).encode()
    request = urllib.request.Request(url, body, headers={"Content-Type": "application/json"}, method="POST")
    started = time.perf_counter()
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            response.read()
            return time.perf_counter() - started, True, ""
    except (urllib.error.URLError, OSError) as err:
        return time.perf_counter() - started, False, str(err)[:300]


def load_level(
    url: str, clients: int, requests_each: int, utts: list[tuple[float, str]], params: dict | None = None
) -> dict:
    """`clients` threads, each posting `requests_each` one-utterance requests back to back."""

    def client(k: int) -> list[tuple[float, float, bool, str]]:
        out = []
        for i in range(requests_each):
            seconds, audio = utts[(k * requests_each + i) % len(utts)]
            latency, ok, error = post(url, [{"audio": audio}], params=params)
            out.append((seconds, latency, ok, error))
        return out

    started = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(clients) as pool:
        done = [r for rs in pool.map(client, range(clients)) for r in rs]
    wall = time.perf_counter() - started
    latency = np.asarray([r[1] for r in done])
    rtf = np.asarray([r[1] / r[0] for r in done])
    return {
        "clients": clients,
        "requests": len(done),
        "requests_per_s": len(done) / wall,
        "audio_s_per_s": sum(r[0] for r in done) / wall,
        "p50_s": float(np.percentile(latency, 50)),
        "p99_s": float(np.percentile(latency, 99)),
        "rtf_p50": float(np.percentile(rtf, 50)),
        "rtf_p99": float(np.percentile(rtf, 99)),
        "failed": sum(not r[2] for r in done),
        "errors": sorted({r[3] for r in done if not r[2]})[:5],
    }


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path)
    parser.add_argument("--tiny", action="store_true", help="a one-layer model, few requests (the test's run)")
    parser.add_argument("--workers", default="1", help="comma-separated `mlflow models serve -w` counts to measure")
    parser.add_argument("--requests", type=int, default=48, help="requests per level (split among its clients)")
    parser.add_argument(
        "--demo-run", type=Path, help="a demo run's directory: its trained acoustic model, posted its held-out voices"
    )
    parser.add_argument("--max-utterances", type=int, default=24, help="with --demo-run: utterances posted")
    args = parser.parse_args(argv)
    args.model = args.audio = None
    if args.demo_run:
        args.model = args.demo_run / "asr" / "model"
        corpus = args.demo_run / "corpus"
        args.audio = corpus / "test_engine" if (corpus / "test_engine" / "wav.scp").is_file() else corpus / "test"
    return args


def posted_audio(args) -> tuple[list, list]:
    """(the utterances the clients post one a request, the rows of the one batch request)."""
    if args.audio:
        return recorded(args.audio, args.max_utterances), recorded(args.audio, min(args.max_utterances, 16), seed=1)
    return utterances(4 if args.tiny else 24, 3.0, 6.0), utterances(4 if args.tiny else 16, 3.0, 6.0, seed=1)


def described(args, config_file: Path, decoder: str | None, utts: list, arms: dict) -> dict:
    """What the results file says of the model, the audio posted, the goals and the arms; `decoder`: "lm" (an
    attached n-gram), "graph" (an attached HLG graph) or None."""
    attached = {"lm": ", with its word LM", "graph": ", phones, with its HLG graph", None: ""}[decoder]
    what = (
        f"the demo run's acoustic model (asr/model, trained{attached})"
        if args.model
        else f"{config_file.relative_to(ROOT)} shapes, untrained weights"
    )
    # Named within the run, not by this machine's paths: the page shows them.
    posted = (
        f"{len(utts)} utterances of the run's corpus/{args.audio.name} (base64 WAVs)"
        if args.audio
        else "base64 WAVs of 3 to 6 s"
    )
    return {
        "model": what,
        "posted": posted,
        "goals": {"lm": GOALS_WITH_LM, "graph": GOALS_WITH_GRAPH, None: GOALS}[decoder],
        "with_lm": decoder is not None,
        "decoder": decoder or "greedy",
        "arms": {k or "served": v for k, v in arms.items()},
    }


def measure_server(url: str, workers: int, loads: tuple, utts: list, batch: list, arms: dict) -> dict:
    """Every arm of one server at each load level (`loads`: the levels' clients, the requests in all),
    then one request of the batch's rows."""
    levels, total = loads
    for _, audio in utts[: 2 * workers]:  # every worker's first request
        post(url, [{"audio": audio}])
    results = {}
    for arm, params in arms.items():
        for clients in levels:
            results[f"w{workers}_c{clients}{arm}"] = load_level(url, clients, max(1, total // clients), utts, params)
        latency, ok, error = post(url, [{"audio": audio} for _, audio in batch], params=params)
        seconds = sum(s for s, _ in batch)
        results[f"w{workers}_batch{arm}"] = {
            "rows": len(batch),
            "audio_s": seconds,
            "latency_s": latency,
            "ok": ok,
            "error": error,
        }
    return results


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    from models.asr import lm
    from models.serving import mlflow_serve as serve

    work = Path(tempfile.mkdtemp(prefix="bench-serving-"))
    config_file = ROOT / ("tests/configs/tiny_asr.yaml" if args.tiny else "configs/demo_asr.yaml")
    source = args.model or model_dir(work / "model", config_file)
    attached = lm.attached(args.model) if args.model is not None else None
    decoder = None if attached is None else "graph" if lm.is_graph(attached) else "lm"
    uri, store = serve.log_to_new_store(source, work)
    levels = (1, 2) if args.tiny else (1, 4, 16)
    total = 4 if args.tiny else args.requests
    utts, batch = posted_audio(args)
    env = serve.serve_env(dict(os.environ, MLFLOW_TRACKING_URI=store, TF_CPP_MIN_LOG_LEVEL="2"))
    # A char model with its LM: as served (beam search with the LM), then greedy (the request param lm: false).
    # A phone model spells words only through its graph (lm: false is refused): as served only.
    arms = {"": None, "_greedy": {"lm": False}} if decoder == "lm" else {"": None}
    results = described(args, config_file, decoder, utts, arms)
    for workers in [int(w) for w in args.workers.split(",")]:
        command = serve.serve_command(uri, reserve_port(), workers=workers)
        with serve.ModelServer(command, env, work, work / f"serve-w{workers}.log") as server:
            url = f"{server.url}/invocations"
            results.update(measure_server(url, workers, (levels, total), utts, batch, arms))
    first = args.workers.split(",")[0]
    results["rtf_1_client"] = results[f"w{first}_c1"]["rtf_p50"]
    results["p99_s_4_clients"] = results.get(f"w{first}_c4", results[f"w{first}_c{levels[-1]}"])["p99_s"]
    results["failed_16_clients"] = results[f"w{first}_c{levels[-1]}"]["failed"]
    # the model's initial weights (keras seed 0), the utterances posted (0) and the batch request's (1)
    record = write_json(args.json, results, seeds={"model": 0, "utterances": 0, "batch": 1})
    print("\n".join(report_speed.serving(record)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
