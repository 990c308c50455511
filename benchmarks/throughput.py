"""Training throughput of both models at np=1 and np=2, and the acoustic model's FLOP/s.

    python benchmarks/throughput.py [--json out.json] [--tiny] [--shards DIR]

Runs the real trainer (`python -m models.train`, and `horovodrun -np 2` for np=2) for a fixed
number of steps and reads its summary: frames/s over all ranks with the warm-up steps excluded,
and the step-time breakdown (input / compute / communication). It measures this machine's float32
(and bfloat16) matrix-multiply peak with `tf.matmul`, and reports the acoustic model's achieved
FLOP/s (analytic FLOPs per frame x frames/s) against it, in float32 and mixed bfloat16.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.harness import ROOT, print_table, run_training, synthetic_shards, write_json  # noqa: E402


def matmul_peak(dtype: str, size: int = 2048, repeats: int = 20) -> float:
    """FLOP/s of a large square tf.matmul with all cores (the practical ceiling of dense layers)."""
    import tensorflow as tf

    a = tf.cast(tf.random.normal([size, size]), dtype)
    matmul = tf.function(lambda x: tf.matmul(x, x))
    matmul(a).numpy()
    start = time.perf_counter()
    for _ in range(repeats):
        out = matmul(a)
    out.numpy()
    return 2 * size**3 * repeats / (time.perf_counter() - start)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path)
    parser.add_argument("--tiny", action="store_true", help="tiny models and data (for tests)")
    parser.add_argument("--shards", type=Path, help="shards to train on (default: synthetic, demo-sized)")
    parser.add_argument("--steps", type=int, default=40, help="training steps per measurement")
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="throughput-"))
    if args.tiny:
        configs = {"asr": ROOT / "tests/configs/tiny_asr.yaml", "tts": ROOT / "tests/configs/tiny_tts.yaml"}
        shards = args.shards or synthetic_shards(work, 48, mean_frames=60, dim=13, num_shards=4)
        steps, warmup = 6, 2
    else:
        configs = {"asr": ROOT / "configs/demo_asr.yaml", "tts": ROOT / "configs/demo_tts.yaml"}
        shards = args.shards or synthetic_shards(work, 1200)
        steps, warmup = args.steps, 5
    common = [
        f"max_steps={steps}",
        f"warmup_exclude={warmup}",
        "checkpoint_every=100000",
        "log_every=100000",
        "log_model=false",
        f"profile_every={max(2, steps // 4)}",  # the synthesis model's per-module timings (outside the throughput)
    ]
    results: dict = {"tiny": args.tiny, "steps": steps, "warmup_steps_excluded": warmup}
    results["matmul_peak_flops_float32"] = matmul_peak("float32", 256 if args.tiny else 2048)
    results["matmul_peak_flops_bfloat16"] = matmul_peak("bfloat16", 256 if args.tiny else 2048)
    rows = []
    runs = [
        ("asr", 1, "float32"),
        ("asr", 2, "float32"),
        ("asr", 1, "mixed_bfloat16"),
        ("asr", 2, "mixed_bfloat16"),
        ("tts", 1, "float32"),
        ("tts", 2, "float32"),
    ]
    if args.tiny:  # the test only needs every kind of run once; np=2 bfloat16 adds nothing new there
        runs.remove(("asr", 2, "mixed_bfloat16"))
    from common import config as configlib
    from models import asr
    from models.tasks import resolve_asr
    from pipeline.records import load_manifest

    for model, np_, precision in runs:
        key = f"{model}_np{np_}" + ("_bf16" if precision != "float32" else "")
        summary = run_training(shards, work / key, np_, configs[model], [*common, f"precision={precision}"])
        results[f"{key}_frames_per_s"] = summary["frames_per_s_total"]
        results[f"{key}_steps_per_s"] = summary["steps_per_s"]
        for part in ("input", "compute", "communication"):
            results[f"{key}_share_{part}"] = summary.get(f"share_{part}", 0.0)
            results[f"{key}_time_{part}_ms"] = summary.get(f"time_{part}_ms", 0.0)
        row = [
            key,
            summary["frames_per_s_total"],
            summary["steps_per_s"],
            summary.get("share_input", 0.0),
            summary.get("share_communication", 0.0),
        ]
        if model == "asr":
            from models.train_config import TrainConfig

            cfg = resolve_asr(configlib.load(TrainConfig, configs[model]).asr, load_manifest(shards))
            flops = asr.flops_per_frame(cfg) * summary["frames_per_s_total"]
            peak = results["matmul_peak_flops_float32"]
            results[f"{key}_flops"] = flops
            results[f"{key}_fraction_of_fp32_peak"] = flops / peak
            row += [flops / 1e9, flops / peak]
        else:
            for module in ("encoder", "decoder", "postnet"):
                results[f"{key}_profile_{module}_ms"] = summary.get(f"profile_{module}_ms", float("nan"))
            row += ["", ""]
        rows.append(row)
    print(
        f"matmul peak: float32 {results['matmul_peak_flops_float32'] / 1e9:.0f} GFLOP/s, "
        f"bfloat16 {results['matmul_peak_flops_bfloat16'] / 1e9:.0f} GFLOP/s"
    )
    print_table(["run", "frames/s", "steps/s", "input share", "comm share", "GFLOP/s", "of fp32 peak"], rows)
    tts = [results.get(f"tts_np1_profile_{m}_ms") for m in ("encoder", "decoder", "postnet")]
    print(
        "synthesis per-module time per step (np=1, forward+backward, ms): encoder {:.1f}, decoder {:.1f}, post-net {:.1f}".format(
            *tts
        )
    )
    write_json(args.json, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
