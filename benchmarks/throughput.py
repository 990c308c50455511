"""Training throughput of both models at np=1 and np=2, the acoustic model's FLOP/s, and the
synthesis model's per-module profile and batch-size curve.

    python benchmarks/throughput.py [--json out.json] [--tiny] [--shards DIR] [--only tts]

Runs the real trainer (`python -m models.train`, and `horovodrun -np 2` for np=2) for a fixed
number of steps and reads its summary: frames/s over all ranks with the warm-up steps excluded,
and the step-time breakdown (input / compute / communication). It measures this machine's float32
(and bfloat16) matrix-multiply peak with `tf.matmul`, and reports the acoustic model's achieved
FLOP/s (analytic FLOPs per frame x frames/s) against it, in float32 and mixed bfloat16. For the
synthesis model the trainer's per-module profile (encoder, decoder, post-net; forward and backward
apart, warm-up excluded) at np=1 and np=2.

Synthesis batch-size curve (`tts_curve`): one process, the shapes of ../shared/gpu-calibration.md
(60 characters, 600 frames, r=3, the demo model), a training step (forward, backward, Adam) at
batch 16, 32 and 64, with the decoder loop compiled as a graph and with XLA: frames/s and the
per-module times, printed beside the GPU calibration's rows. Frames/s that grow with the batch say
the step is bound by per-step latency (launches, the recurrence), not by arithmetic.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import report_speed  # noqa: E402
from benchmarks.harness import NO_COPIES, ROOT, SHORT_RUN_SEEDS, run_training, synthetic_shards, write_json  # noqa: E402


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


# --set items of each path a run measures: the models' defaults (models/layers/lstm.py's LSTMs and the C++
# CTC kernel on a CPU), the same with every gradient matmul in float32 (the acoustic config's
# lstm_grad_matmuls: auto is bfloat16 where the CPU has it), Keras' LSTM loop with the dense-label CTC
# graph, Keras' loop with the C++ kernel.
PATHS = {
    "default": lambda model: [],
    "fp32_grads": lambda model: ["asr.lstm_grad_matmuls=float32"],
    "keras": lambda model: [f"{model}.lstm=keras"] + (["asr.ctc_labels=dense"] if model == "asr" else []),
    "keras_sparse_ctc": lambda model: [f"{model}.lstm=keras", "asr.ctc_labels=sparse"],
}

# ../shared/gpu-calibration.md, synthesis model on one H100 (PyTorch eager, fp32): batch ->
# (encoder, decoder, post-net forward, backward + Adam) in ms, and frames/s.
GPU_CALIBRATION_TTS = {
    16: (1.4, 112.0, 0.5, 235.0, 27.5e3),
    64: (1.5, 106.0, 0.6, 215.0, 119e3),
    256: (1.6, 101.0, 1.4, 245.0, 441e3),
}


TINY_TTS = dict(
    embedding_dim=16,
    encoder_conv_filters=16,
    encoder_lstm_units=8,
    attention_dim=8,
    prenet_units=(16,),
    decoder_lstm_units=16,
    postnet_filters=16,
    location_filters=4,
)


def random_tts_batch(batch_size: int, chars: int, frames: int) -> dict:
    """A synthesis batch of random tokens and mels, seeded by its size."""
    import numpy as np
    import tensorflow as tf

    rng = np.random.default_rng(batch_size)
    return {
        "tokens": tf.constant(rng.integers(1, 40, [batch_size, chars]), tf.int32),  # [batch, chars]
        "token_lengths": tf.fill([batch_size], chars),
        "mels": tf.constant(rng.normal(size=[batch_size, frames, 80]), tf.float32),  # [batch, frames, 80]
        "mel_lengths": tf.fill([batch_size], frames),
        "stop_targets": tf.one_hot(tf.fill([batch_size], frames - 1), frames),  # [batch, frames]
    }


def time_calls(fn, batch, repeats: int) -> float:
    """Seconds per call of `fn(batch)`, the mean over `repeats`."""
    start = time.perf_counter()
    for _ in range(repeats):
        fn(batch).numpy()
    return (time.perf_counter() - start) / repeats


def tts_steps(config):
    """(task, model, the compiled training step, the compiled forward pass) of a synthesis config."""
    import keras
    import tensorflow as tf

    from models.tts.task import TtsTask

    task = TtsTask(config)
    model = task.build()
    optimizer = keras.optimizers.Adam(1e-4)

    def step(batch):
        with tf.GradientTape() as tape:
            loss, _ = task.loss(model, batch, training=True)
        optimizer.apply(tape.gradient(loss, model.trainable_variables), model.trainable_variables)
        return loss

    compiled = tf.function(step, reduce_retracing=True)
    forward = tf.function(lambda b: task.loss(model, b, training=True)[0])
    return task, model, compiled, forward


def tts_curve(batches: tuple[int, ...], tiny: bool, repeats: int) -> dict:
    """Synthesis training-step time and frames/s at each batch size, decoder as a graph and with
    XLA, and the per-module forward/backward times (TtsTask.profile), on random inputs of the GPU
    calibration's shapes. The first steps (tracing, XLA compilation) are not counted."""
    import dataclasses

    from models.tts.config import TtsConfig

    chars, frames = (12, 30) if tiny else (60, 600)
    base = TtsConfig(vocab_size=40)
    if tiny:
        base = dataclasses.replace(base, **TINY_TTS)
    results = {}
    for xla in (False, True):
        task, model, compiled, forward = tts_steps(dataclasses.replace(base, xla=xla))
        mode = "xla" if xla else "graph"
        for batch_size in batches:
            batch = random_tts_batch(batch_size, chars, frames)
            for _ in range(2):  # tracing and compilation
                compiled(batch).numpy()
                forward(batch).numpy()
            task.profile(model, batch)
            step_s = time_calls(compiled, batch, repeats)
            forward_s = time_calls(forward, batch, repeats)
            profile = task.profile(model, batch)
            key = f"tts_curve_{mode}_b{batch_size}"
            results[f"{key}_step_ms"] = 1000 * step_s
            results[f"{key}_forward_ms"] = 1000 * forward_s
            results[f"{key}_backward_adam_ms"] = 1000 * (step_s - forward_s)
            results[f"{key}_frames_per_s"] = batch_size * frames / step_s
            for name, seconds in profile.items():
                results[f"{key}_profile_{name[:-2]}_ms"] = 1000 * seconds
    return results


# (model, np, precision, path) of every run: the acoustic model's default path on this machine, and
# Keras' LSTM loop with the dense-label CTC graph, and Keras' loop with the C++ CTC kernel (which part
# of the difference is which).
RUNS = (
    ("asr", 1, "float32", "default"),
    ("asr", 2, "float32", "default"),
    ("asr", 2, "float32", "fp32_grads"),
    ("asr", 2, "float32", "keras"),
    ("asr", 2, "float32", "keras_sparse_ctc"),
    ("asr", 1, "mixed_bfloat16", "default"),
    ("asr", 2, "mixed_bfloat16", "default"),
    ("tts", 1, "float32", "default"),
    ("tts", 2, "float32", "default"),
    ("tts", 2, "float32", "keras"),
)
# The tests need every kind of run once: alone and under horovodrun, bfloat16, both models.
TINY_RUNS = (
    ("asr", 1, "mixed_bfloat16", "default"),
    ("asr", 2, "float32", "default"),
    ("asr", 1, "float32", "keras"),
    ("tts", 2, "float32", "default"),
)


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path)
    parser.add_argument("--tiny", action="store_true", help="tiny models and data (for tests)")
    parser.add_argument("--shards", type=Path, help="shards to train on (default: synthetic, demo-sized)")
    parser.add_argument("--steps", type=int, default=40, help="training steps per measurement")
    parser.add_argument("--only", choices=("asr", "tts"), help="measure one model only")
    parser.add_argument("--np", type=int, choices=(1, 2), help="only the runs with this many workers")
    parser.add_argument("--precision", choices=("float32", "mixed_bfloat16"), help="only the runs in this precision")
    return parser.parse_args(argv)


@dataclasses.dataclass(frozen=True)
class Setup:
    """What every training run shares."""

    work: Path  # the temporary directory the runs write under
    shards: Path  # the shards every run trains on
    configs: dict  # model -> its config file
    steps: int  # training steps per run
    warmup: int  # the first steps, left out of the throughput
    common: tuple[str, ...]  # `--set` items of every run


def setup(args) -> Setup:
    work = Path(tempfile.mkdtemp(prefix="throughput-"))
    if args.tiny:
        configs = {"asr": ROOT / "tests/configs/tiny_asr.yaml", "tts": ROOT / "tests/configs/tiny_tts.yaml"}
        shards = args.shards or synthetic_shards(work, 48, mean_frames=60, dim=13, num_shards=4)
        steps, warmup = 6, 2
    else:
        configs = {"asr": ROOT / "configs/demo_asr.yaml", "tts": ROOT / "configs/demo_tts.yaml"}
        shards = args.shards or synthetic_shards(work, 1200)
        steps, warmup = args.steps, 5
    common = (
        NO_COPIES,
        f"max_steps={steps}",
        f"warmup_exclude={warmup}",
        "checkpoint_every=100000",
        "log_every=100000",
        "log_model=false",
        f"profile_every={max(2, steps // 4)}",  # the synthesis model's per-module timings (outside the throughput)
    )
    return Setup(work, shards, configs, steps, warmup, common)


def chosen_runs(args) -> list[tuple]:
    """The runs `--tiny`, `--only`, `--np` and `--precision` leave."""
    return [
        run
        for run in (TINY_RUNS if args.tiny else RUNS)
        if (not args.only or run[0] == args.only)
        and (not args.np or run[1] == args.np)
        and (not args.precision or run[2] == args.precision)
    ]


def measure(s: Setup, results: dict, model: str, np_: int, precision: str, path: str) -> None:
    """One training run's frames/s, step shares and (acoustic model) FLOP/s or (synthesis) profile."""
    from common import config as configlib
    from models.asr import network as asr
    from models.asr.task import resolve_asr
    from models.training.config import TrainConfig
    from pipeline.records import open_shard_set

    key = f"{model}_np{np_}" + ("_bf16" if precision != "float32" else "") + ("" if path == "default" else f"_{path}")
    sets = [*s.common, f"precision={precision}", *PATHS[path](model)]
    summary = run_training(s.shards, s.work / key, np_, s.configs[model], sets)
    results[f"{key}_frames_per_s"] = summary["frames_per_s_total"]
    results[f"{key}_steps_per_s"] = summary["steps_per_s"]
    results[f"{key}_intra_op_threads_per_rank"] = summary["threads_per_rank"]["intra_op_threads"]
    for part in ("input", "compute", "communication"):
        results[f"{key}_share_{part}"] = summary.get(f"share_{part}", 0.0)
        results[f"{key}_time_{part}_ms"] = summary.get(f"time_{part}_ms", 0.0)
    if model == "asr":
        cfg = resolve_asr(configlib.load(TrainConfig, s.configs[model]).settings, open_shard_set(s.shards))
        flops = asr.flops_per_frame(cfg) * summary["frames_per_s_total"]
        results[f"{key}_flops"] = flops
        results[f"{key}_fraction_of_fp32_peak"] = flops / results["matmul_peak_flops_float32"]
    else:
        for module in ("encoder", "decoder", "postnet"):
            for part in ("", "_forward", "_backward"):
                name = f"profile_{module}{part}_ms"
                results[f"{key}_{name}"] = summary.get(name, float("nan"))


def speedups(results: dict) -> None:
    """Each default path's steps/s over Keras' LSTM path's and over float32 gradient matmuls', where both ran."""
    for model in ("asr", "tts"):
        if f"{model}_np2_keras_steps_per_s" in results and f"{model}_np2_steps_per_s" in results:
            speedup = results[f"{model}_np2_steps_per_s"] / results[f"{model}_np2_keras_steps_per_s"]
            results[f"{model}_np2_speedup_over_keras"] = speedup
    if "asr_np2_fp32_grads_steps_per_s" in results and "asr_np2_steps_per_s" in results:
        speedup = results["asr_np2_steps_per_s"] / results["asr_np2_fp32_grads_steps_per_s"]
        results["asr_np2_speedup_over_fp32_grads"] = speedup


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    s = setup(args)
    results: dict = {"tiny": args.tiny, "steps": s.steps, "warmup_steps_excluded": s.warmup}
    results["matmul_peak_flops_float32"] = matmul_peak("float32", 256 if args.tiny else 2048)
    results["matmul_peak_flops_bfloat16"] = matmul_peak("bfloat16", 256 if args.tiny else 2048)
    for run in chosen_runs(args):
        measure(s, results, *run)
    speedups(results)
    if args.only != "asr":
        batches = (4,) if args.tiny else (16, 32, 64)
        results.update(tts_curve(batches, args.tiny, repeats=1 if args.tiny else 3))
        results["gpu_calibration_tts"] = {str(b): list(row) for b, row in GPU_CALIBRATION_TTS.items()}
    record = write_json(args.json, results, seeds=SHORT_RUN_SEEDS)
    print("\n".join(report_speed.throughput(record)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
