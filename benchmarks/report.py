"""docs/benchmarks.md from benchmarks/results/*.json: every table, its provenance and its plots.

    python benchmarks/report.py [--results benchmarks/results] [--out docs/benchmarks.md]

(`make bench-report`.) Every figure on the page comes from a JSON file; the short texts under the
tables, kept here, hold no figures. tests/test_docs.py fails when the committed page differs from
what this program makes of the committed JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# The benchmarks' own table columns; importing them loads no TensorFlow.
import benchmarks.convergence  # noqa: E402
import benchmarks.faults  # noqa: E402
import benchmarks.serving  # noqa: E402
import benchmarks.speedup_model  # noqa: E402
import benchmarks.straggler  # noqa: E402
import benchmarks.throughput  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
PAGE = ROOT / "docs" / "benchmarks.md"

# Variants in the order the benchmarks run them.
STRAGGLER_VARIANTS = ("allreduce", "fixed-ring", "random-ring", "delay-by-one")
CONVERGENCE_VARIANTS = ("allreduce", "delay-by-one", "fixed-ring", "random-ring", "hierarchical")


# ---- formatting -----------------------------------------------------------------------------------


def pct(value, digits: int = 1) -> str:
    return "" if value is None else f"{100 * value:.{digits}f}%"


def num(value, digits: int = 0) -> str:
    """A figure with thousands separators; "" for a missing one."""
    if value is None:
        return ""
    return f"{value:,.{digits}f}"


def milliseconds(value: float) -> str:
    """Whole milliseconds, or two significant digits below ten."""
    return num(value) if value >= 10 else f"{value:.2g}"


def thousands(value) -> str:
    """Frames per second as 14.6k."""
    return "" if value is None else f"{value / 1000:.1f}k"


def table(headers: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(headers) + " |", "| " + " | ".join("---" for _ in headers) + " |"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return [*lines, ""]


def provenance(meta: dict | None, data: dict) -> list[str]:
    """The lines that say which commit, date, machine, command and seeds produced a file's figures."""
    meta = meta or {}
    machine = meta.get("machine")
    if isinstance(machine, dict):
        avx = "AVX-512" if machine.get("avx512") else "no AVX-512"
        where = f"{machine.get('cpu_model') or 'CPU model unknown'}, {machine.get('cores')} cores, {avx}"
    elif isinstance(data.get("machine"), str):
        where = f"machine not recorded by the benchmark; the file says: {data['machine']}"
    else:
        where = "machine not recorded"
    commit = meta.get("commit") or "not recorded"
    parts = [f"commit `{commit[:12]}`", meta.get("date") or "date not recorded", where]
    if meta.get("command"):
        parts.append(f"command `{meta['command']}`")
    seeds = meta.get("seeds")
    if seeds is not None:
        parts.append("seeds " + ", ".join(f"{k} {v}" for k, v in sorted(seeds.items())))
    lines = ["*Measured:* " + "; ".join(parts) + "."]
    if meta.get("provenance"):
        note = f"; {meta['note']}." if meta.get("note") else "."
        lines += ["", f"*Provenance:* {meta['provenance']}{note}"]
    return [*lines, ""]


# ---- one renderer per benchmark: (title, lines) from its JSON -------------------------------------


def demo(r: dict) -> list[str]:
    asr, tts = r["asr"], r["tts"]
    out = [
        f"`make demo` with the DAG's default parameters. Commit named in the file: {r.get('commit', 'not named')}.",
        "",
    ]
    out += table(
        ["run", "minutes"],
        [
            ["the DAG (`make demo`)", num(r["dag_wall_s"] / 60, 1)],
            ["`make setup` from the pip cache, then `make demo`", num(r["make_demo_wall_s_with_setup"] / 60, 1)],
        ],
    )
    rows = []
    for name, t in (("acoustic model", r["asr_training"]), ("synthesis model", r["tts_training"])):
        rows.append(
            [
                name,
                t["steps"],
                num(t["measured_seconds"] / 60, 1),
                thousands(t["frames_per_s_total"]),
                pct(t["share_compute"]),
                pct(t["share_communication"]),
                pct(t["share_input"], 2),
                pct(t["input_wait_share_max_10_step_window"], 2),
            ]
        )
    out += table(
        [
            "training",
            "steps",
            "minutes",
            "frames/s (all ranks)",
            "compute",
            "communication",
            "input",
            "input, worst 10-step window",
        ],
        rows,
    )
    rows = []
    for split, what in (
        ("dev", "dev (training voices, new sentences)"),
        ("test", "test (voices never heard in training)"),
        ("test_noisy", "noisy test (the test sentences with noise)"),
    ):
        rows.append(
            [
                what,
                pct(asr[f"{split}_cer"]),
                pct(asr[f"{split}_wer"]),
                pct(asr[f"{split}_cer_beam"]),
                pct(asr[f"{split}_wer_beam"]),
            ]
        )
    out += ["Acoustic model (the champion chosen on dev):", ""]
    out += table(["split", "CER greedy", "WER greedy", "CER beam", "WER beam"], rows)
    rows = []
    for split, what in (("dev", "dev (training voices)"), ("test", "test (unseen voices, nearest training voice)")):
        rows.append(
            [
                what,
                tts[f"{split}_utterances"],
                pct(tts[f"{split}_intelligibility_cer"]),
                pct(tts[f"{split}_intelligibility_wer"]),
                pct(tts[f"{split}_intelligibility_cer_teacher_forced"]),
                pct(tts[f"{split}_intelligibility_cer_recordings"]),
                num(tts[f"{split}_fbank_cepstral_distance_db"], 2),
            ]
        )
    out += [f"Synthesis model ({r['tts_training'].get('decoder', 'the demo config')}):", ""]
    out += table(
        [
            "split",
            "sentences",
            "CER free-running",
            "WER free-running",
            "CER teacher-forced",
            "CER of the recordings",
            "fbank cepstral distance (dB)",
        ],
        rows,
    )
    t = r["tts_training"]
    out += ["Synthesis step on two ranks, per module (ms):", ""]
    out += table(
        ["", "encoder", "decoder", "post-net"],
        [
            [part] + [num(t[f"profile_{m}_{part}_ms"]) for m in ("encoder", "decoder", "postnet")]
            for part in ("forward", "backward")
        ],
    )
    return out


def input_pipeline(r: dict) -> list[str]:
    rows = [
        [
            "steady-state throughput, one GPU's batches (frames/s)",
            num(r["baseline_frames_per_s"]),
            num(r["tfdata_frames_per_s"]),
        ],
        [
            f"first batch, {r['demo_frames']:,} frames (s)",
            num(r["demo_baseline_first_batch_s"], 3),
            num(r["demo_tfdata_first_batch_s"], 3),
        ],
        [
            f"first batch, {r['large_frames']:,} frames (s)",
            num(r["baseline_first_batch_s"], 3),
            num(r["tfdata_first_batch_s"], 3),
        ],
    ]
    for name, (budget, _, step) in r["consumers"].items():
        rows.append(
            [
                f"utilization: {name} ({budget:,} frames / {step * 1000:g} ms)",
                num(r[f"baseline_{name}_utilization"], 3),
                num(r[f"tfdata_{name}_utilization"], 3),
            ]
        )
    out = table(["", "seed-style", "tf.data"], rows)
    out += [
        f"tf.data per core: {num(r['frames_per_s_per_core'])} frames/s; one GPU at batch 1024 (bf16) needs about "
        f"{num(r['gpu_b1024_cores_needed'], 1)} such cores (or tf.data service workers).",
        "",
    ]
    return out


def throughput(r: dict) -> list[str]:
    out = [
        f"{r['steps']} steps, the first {r['warmup_steps_excluded']} excluded, on synthetic demo-shaped shards. "
        f"Matmul peak: float32 {num(r['matmul_peak_flops_float32'] / 1e9)} GFLOP/s, "
        f"bfloat16 {num(r['matmul_peak_flops_bfloat16'] / 1e9)} GFLOP/s.",
        "",
    ]
    rows = []
    for model in ("asr", "tts"):
        for key in (f"{model}_np1", f"{model}_np2", f"{model}_np1_bf16", f"{model}_np2_bf16"):
            if f"{key}_frames_per_s" not in r:
                continue
            flops = r.get(f"{key}_flops")
            rows.append(
                [
                    key,
                    num(r[f"{key}_frames_per_s"]),
                    num(r[f"{key}_steps_per_s"], 2),
                    pct(r[f"{key}_share_input"], 2),
                    pct(r[f"{key}_share_communication"]),
                    "" if flops is None else num(flops / 1e9),
                    pct(r.get(f"{key}_fraction_of_fp32_peak"), 0),
                ]
            )
    out += table(benchmarks.throughput.TABLE, rows)
    rows = []
    for n in (1, 2):
        for part in ("forward", "backward"):
            keys = [f"tts_np{n}_profile_{m}_{part}_ms" for m in ("encoder", "decoder", "postnet")]
            if all(k in r for k in keys):
                rows.append([f"np={n}, {part}", *(num(r[k]) for k in keys)])
        totals = [f"tts_np{n}_profile_{m}_ms" for m in ("encoder", "decoder", "postnet")]
        if not any(row[0].startswith(f"np={n},") for row in rows) and all(k in r for k in totals):
            rows.append([f"np={n}, forward + backward", *(num(r[k]) for k in totals)])
    if rows:
        out += ["Synthesis per-module time per step in training (ms, the trainer's profile):", ""]
        out += table(["", "encoder", "decoder", "post-net"], rows)
    batches = sorted({int(k.split("_b")[1].split("_")[0]) for k in r if k.startswith("tts_curve_graph_b")})
    if batches:
        rows = [
            [label, *(milliseconds(v) for v in times), thousands(fps)]
            for label, *times, fps in benchmarks.throughput.tts_curve_rows(r, tuple(batches))
        ]
        out += ["Synthesis training step, 60 characters x 600 frames, r=3 (forward per module; ms):", ""]
        out += table(benchmarks.throughput.CURVE_TABLE, rows)
    return out


def speedup_model(r: dict) -> list[str]:
    out = [
        f"Tcalc {num(r['tcalc_s'] * 1000, 1)} ms, Ttransmit {num(r['ttransmit_s'] * 1000, 2)} ms "
        f"({r['parameters']:,} float32 weights), Tmerge {num(r['tmerge_s'] * 1000, 2)} ms.",
        "",
    ]
    rows = []
    for strategy in ("allreduce", "adpsgd"):
        rows.append(
            [
                strategy,
                num(r[f"{strategy}_predicted_speedup_n1"], 2),
                num(r[f"{strategy}_predicted_speedup_n2"], 2),
                num(r.get(f"{strategy}_measured_speedup_n2"), 2) or "not recorded",
                num(r.get(f"{strategy}_job_speedup_n2"), 2) or "not recorded",
                num(r[f"{strategy}_predicted_speedup_n128"], 1),
            ]
        )
    out += table(benchmarks.speedup_model.TABLE, rows)
    return out


def straggler(r: dict) -> list[str]:
    rows = []
    for name in STRAGGLER_VARIANTS:
        if f"{name}_job_wall_s" not in r:
            continue
        for factor in r["factors"]:
            rows.append(
                [
                    name,
                    f"1/{factor}",
                    num(r[f"{name}_job_wall_s"]),
                    num(r[f"{name}_job_wall_s_f{factor}"]),
                    "/".join(str(b) for b in r[f"{name}_per_rank_batches_f{factor}"]),
                    num(r[f"{name}_job_throughput_ratio_f{factor}"], 3),
                    num((1 + 1 / factor) / 2, 3),
                    num(r[f"{name}_fast_rank_ratio_f{factor}"], 2),
                ]
            )
    out = [f"{r['epochs']} epochs for every strategy.", ""]
    out += table(benchmarks.straggler.TABLE, rows)
    return out


def convergence(r: dict) -> list[str]:
    rows = []
    for name in CONVERGENCE_VARIANTS:
        if f"{name}_cers" not in r:
            continue
        seeds = len(r[f"{name}_cers"])
        minutes = [r.get(f"{name}_seed{s}_job_wall_s") for s in range(seeds)]
        rows.append(
            [
                name,
                seeds,
                pct(r[f"{name}_cer"]),
                pct(r[f"{name}_cer_spread"]),
                pct(r[f"{name}_wer"]),
                pct(r.get(f"{name}_relative_to_allreduce")) if name != "allreduce" else "",
                r.get(f"{name}_from", "this run"),
                " / ".join(pct(c) for c in r[f"{name}_cers"]),
                " / ".join("" if m is None else num(m / 60, 1) for m in minutes),
            ]
        )
    out = [f"{r['epochs']} epochs of the demo acoustic model for every strategy; test CER greedy.", ""]
    out += table([*benchmarks.convergence.TABLE, "test CER per seed", "job minutes per seed"], rows)
    half = [n for n in (r.get("best_gossip_variant"), "allreduce") if n and f"{n}_half_speed_job_minutes" in r]
    if half:
        rows = []
        for name in half:
            to_target = r.get(f"{name}_half_speed_minutes_to_allreduce_dev_cer")
            rows.append(
                [
                    name,
                    pct(r.get("allreduce_final_dev_cer")),
                    "never" if to_target is None else num(to_target, 1),
                    pct(r[f"{name}_half_speed_final_dev_cer"]),
                    num(r[f"{name}_half_speed_minutes_to_common_dev_cer"], 1),
                    num(r[f"{name}_half_speed_job_minutes"], 1),
                    "/".join(str(b) for b in r[f"{name}_half_speed_batches"]),
                ]
            )
        level = pct(r["half_speed_common_dev_cer"])
        out += [f"The second part, rank 1 at half speed (the level both reached: {level} dev CER):", ""]
        out += table([*benchmarks.convergence.HALF_SPEED_TABLE, "batches r0/r1"], rows)
    return out


def faults(r: dict) -> list[str]:
    def cer(key: str) -> str:
        return f"test CER {pct(r[key])}" if r.get(key) is not None else ""

    rows = [
        ["none (undisturbed)", r["clean_exit"], "", "", cer("clean_cer")],
        [
            "SIGKILL rank 1",
            r["kill_worker_exit"],
            num(r["kill_worker_detect_s"], 2),
            r["kill_worker_steps_lost"],
            f"rank named: {r['kill_worker_rank_named']}; re-run exit {r['kill_worker_retry_exit']}, "
            + cer("kill_worker_cer"),
        ],
        [
            "SIGKILL rank 1, `--elastic`",
            r["kill_worker_elastic_exit"],
            f"{num(r['kill_worker_elastic_reset_s'], 1)} (to the reset)",
            r["kill_worker_elastic_steps_lost"],
            cer("kill_worker_elastic_cer"),
        ],
        [
            "SIGKILL of the whole job, then the command again",
            r["kill_job_retry_exit"],
            "",
            r["kill_job_steps_lost"],
            cer("kill_job_cer"),
        ],
        [
            "SIGKILL of the shard writer, then again",
            r["kill_shard_writer_rerun_exit"],
            "",
            "",
            f"the same shards: {r['kill_shard_writer_same_shards']}",
        ],
        [
            "a corrupted shard",
            r["corrupt_shard_exit"],
            num(r["corrupt_shard_detect_s"], 1),
            "",
            f"shard named: {r['corrupt_shard_named']}",
        ],
        [
            "MLflow down, then back",
            r["mlflow_down_exit"],
            "",
            "",
            f"{r['mlflow_down_loss_points']}/{r['mlflow_down_steps']} loss points",
        ],
    ]
    out = [f"{r['epochs']} epochs on two ranks; each fault injected at step {r['kill_at_step']} of a real run.", ""]
    out += table(benchmarks.faults.TABLE, rows)
    return out


def tts_levers(r: dict) -> list[str]:
    out = [
        f"Corpus: {r['corpus']}. Listener: {r['judge']}.",
        "",
        f"Training: `{r['train_command']}`; evaluation: `{r['eval_command']}`. {r['config_note']}.",
        "",
    ]

    def rows_of(runs: dict) -> list[list]:
        rows = []
        for name, run in runs.items():
            seconds = run.get("training_seconds")
            rows.append(
                [
                    f"`{name}`: {run['what']}" + (f" ({run['note']})" if run.get("note") else ""),
                    f"`{run['flags']}`" if run["flags"] else "",
                    run["steps"],
                    "" if seconds is None else num(seconds / 60, 1),
                    pct(run["dev_intelligibility_cer"]),
                    pct(run["dev_intelligibility_cer_teacher_forced"]),
                    pct(run["dev_intelligibility_cer_recordings"]),
                    num(run["dev_mel_l1"], 3),
                    num(run["dev_fbank_cepstral_distance_db"], 2),
                ]
            )
        return rows

    headers = [
        "run",
        "flags",
        "steps",
        "training minutes",
        "dev CER free-running",
        "dev CER teacher-forced",
        "dev CER of the recordings",
        "mel L1",
        "fbank cepstral distance (dB)",
    ]
    out += table(headers, rows_of(r["runs"]))
    a = r["analysis"]
    peak = a["attention_peak_distance_from_straight_line_chars"]
    lengths = a["synthesized_over_recorded_length"]
    rows = [
        [
            "mel L1 of copying the previous frame, r=3 / r=6",
            f"{a['copy_previous_frame_mel_l1']['r3']} / {a['copy_previous_frame_mel_l1']['r6']}",
        ],
        ["mel L1 of the utterance's mean frame", a["utterance_mean_frame_mel_l1"]["value"]],
        [
            "attention peak's largest distance from the diagonal (characters), `base` teacher-forced / free-running",
            f"{peak['base']['teacher_forced']} / {peak['base']['free_running']}",
        ],
        [
            "the same, `r6long`",
            f"{peak['r6long']['teacher_forced']} / {peak['r6long']['free_running']}",
        ],
        [
            "synthesized over recorded length, " + ", ".join(f"`{k}`" for k in lengths if k != "what"),
            " / ".join(str(v) for k, v in lengths.items() if k != "what"),
        ],
    ]
    out += ["Reference points (dev split):", ""]
    out += table(["what", "value"], rows)
    demo_runs = r["demo_corpus_runs"]
    out += [f"On the demo's corpus and listener: {demo_runs['what']}.", ""]
    out += table(headers, rows_of(demo_runs["runs"]))
    return out


def serving(r: dict) -> list[str]:
    rows = []
    for workers in sorted({int(k[1]) for k in r if k.startswith("w") and "_" in k}):
        levels = sorted((v for k, v in r.items() if k.startswith(f"w{workers}_c")), key=lambda v: v["clients"])
        for v in levels:
            rows.append(
                [
                    f"{workers} worker(s), {v['clients']} client(s)",
                    v["requests"],
                    num(v["requests_per_s"], 1),
                    num(v["p50_s"], 3),
                    num(v["p99_s"], 3),
                    num(v["rtf_p50"], 3),
                    num(v["rtf_p99"], 3),
                    v["failed"],
                ]
            )
        b = r[f"w{workers}_batch"]
        rtf = num(b["latency_s"] / b["audio_s"], 3)
        latency = num(b["latency_s"], 3)
        rows.append(
            [f"{workers} worker(s), 1 request of {b['rows']} rows", 1, "", latency, latency, rtf, rtf, int(not b["ok"])]
        )
    goals = r["goals"]
    out = [f"Model: {r['model']}. Clients post base64 WAVs of 3 to 6 s on the server's own machine.", ""]
    out += table(benchmarks.serving.TABLE, rows)
    out += [
        f"Goals at one worker: real-time factor at one client {num(r['rtf_1_client'], 3)} (goal <= "
        f"{goals['rtf_1_client']}); p99 latency at 4 clients {num(r['p99_s_4_clients'], 2)} s (goal <= "
        f"{goals['p99_s_4_clients']} s); failed requests at 16 clients {r['failed_16_clients']} (goal "
        f"{goals['failed_16_clients']}).",
        "",
    ]
    return out


# ---- the page -------------------------------------------------------------------------------------

# Per results file: its section's title, what it measures (no figures), its renderer, and what
# to read from the table (no figures: they are in the table).
Section = tuple[str, str, Callable[[dict], list[str]], str]
SECTIONS: dict[str, Section] = {
    "demo.json": (
        "The demo",
        "The whole DAG on the synthesized demo corpus, both models, allreduce, two workers.",
        demo,
        "Waiting for input is a small share of the step for both models. The synthesis model's "
        "intelligibility is what the demo's own acoustic model hears: free-running (what a listener "
        "hears), teacher-forced (the recording's timing, so free-running drift is left out) and on the "
        "recordings themselves (the listener's own errors). The filterbank cepstral distance is the "
        "formula of mel-cepstral distortion applied to the predicted filterbank; it does not compare with "
        "the MCD that papers report.",
    ),
    "input_pipeline.json": (
        "Input pipeline",
        "`benchmarks/input_pipeline.py`: one process, reading shards from the page cache, against a "
        "seed-style loader (read everything, sort each epoch, pad with numpy); consumers sized from a GPU "
        "calibration and from this machine's CPU step.",
        input_pipeline,
        "What keeps utilization below one is the fixed cost of an eager `next()` on the iterator, not the "
        "pipeline's rate. A GPU host whose cores cannot feed its batch shape reads from a tf.data service "
        "(`--data-service`).",
    ),
    "throughput.json": (
        "Training throughput",
        "`benchmarks/throughput.py`: the demo models on synthetic demo-shaped shards, alone and on two ranks, "
        "float32 and mixed bfloat16; the share of each step spent on input and communication.",
        throughput,
        "bfloat16 (`--set precision=mixed_bfloat16`) is off by default: on these CPUs it makes the LSTM "
        "step slower, and on two ranks its input share rises (not investigated).",
    ),
    "throughput_tts.json": (
        "Synthesis throughput and batch-size curve",
        "`benchmarks/throughput.py --only tts`: the demo's synthesis model alone and on two ranks, then the "
        "attention model at the GPU calibration's shapes, its decoder loop as a graph and with XLA.",
        throughput,
        "On a CPU the step is mostly arithmetic, so frames per second stop growing after a small batch; on "
        "the calibration GPU the decoder's time does not move with the batch, so there the lever is the "
        "batch size (`input.max_batch_size`, `input.frames_per_batch`), not more workers. XLA "
        "(`tts.xla`) is off by default: its backward pass by recomputation is slower on a CPU; it is meant "
        "for GPUs and not measured on one.",
    ),
    "speedup_model.json": (
        "Speedup model",
        "`benchmarks/speedup_model.py` (model in `benchmarks/speedup_theory.py`): one step's compute, the "
        "weights' transfer and the merge, measured, then the ring model's predicted speedups beside the "
        "measured ones against one single-threaded process.",
        speedup_model,
        "The model assumes independent workers; two ranks on a two-core machine each run slower than one "
        "rank alone, which is why the measured speedup falls short of the prediction.",
    ),
    "straggler.json": (
        "Straggler",
        "`benchmarks/straggler.py`: synthetic demo-shaped utterances, the demo acoustic model, the same "
        "budget in data for every strategy, one rank made slower by computing each of its steps again, each "
        "rank on its own core. Job ratio: frames trained over the seconds from launch to exit, slowed over "
        "undisturbed; ideal: what a job gets when the fast rank keeps its speed; fast rank: its own "
        "throughput, slowed over undisturbed.",
        straggler,
        "Under AD-PSGD the fast rank takes most of the batches and the job no longer runs at the slow "
        "rank's pace; under allreduce every rank takes the same batches and waits. Job ratios above the "
        "ideal come from undisturbed jobs that ended late, not from slowed jobs that beat the ideal. "
        "Allreduce stays above the pace of its slow rank because a job has fixed parts that do not slow "
        "down (start-up, saving and logging). The delay-by-one rows here predate `DelayedMerge`; the next "
        "section has them on the code with it.",
    ),
    "straggler_delay_by_one.json": (
        "Straggler, delay-by-one",
        "The straggler benchmark for delay-by-one alone (`--variants delay-by-one`), on the code with "
        "`DelayedMerge` (a round's snapshot holds the pulls not yet merged).",
        straggler,
        "",
    ),
    "convergence.json": (
        "Convergence",
        "`benchmarks/convergence.py`: the demo corpus through the real stages, the demo acoustic model "
        "under each strategy for the same budget in data, test CER on voices never heard in training; "
        'hierarchical gossip on two "hosts" of two ranks. The second part: one rank at half speed, the minutes '
        "until the dev CER reaches undisturbed allreduce's final one, and the dev CER curves (plot).",
        convergence,
        "The goal is every gossip variant within a tenth of allreduce's CER. Hierarchical gossip runs "
        "twice the ranks for the same budget in data, so each rank takes half as many batches: a different "
        "optimisation, not only a different exchange. With two ranks the fixed and random rings pair the "
        "same ranks every round, so their runs show the spread of asynchronous training. Job minutes "
        "compare only within one run of the benchmark. In the second part the fast rank is also the one that "
        "evaluates on dev.",
    ),
    "convergence_delay_by_one.json": (
        "Convergence, delay-by-one",
        "The convergence benchmark's first part for allreduce and delay-by-one, one seed, on the code with `DelayedMerge`.",
        convergence,
        "",
    ),
    "faults.json": (
        "Faults",
        "`benchmarks/faults.py`: a small demo corpus through the real stages, the demo acoustic model on "
        "two ranks, each fault injected into a real run; test CER greedy on voices never heard in training.",
        faults,
        "Without `--elastic` a killed worker ends the job with a non-zero exit naming the rank, and the "
        "same command again resumes from the last checkpoint. The elastic job loses no steps but trains the "
        "rest of its budget on one worker, with the learning rate scaled for one; its final CER is one run "
        "and not separated from run-to-run noise. The reset's seconds are spent in Horovod's elastic driver "
        "and its new rendezvous.",
    ),
    "serving.json": (
        "Serving under load",
        "`benchmarks/serving.py`: `mlflow models serve` of an acoustic model of the demo's shapes under "
        "concurrent clients, and one request of many rows; latency from post to answer, real-time factor = "
        "latency / seconds of audio.",
        serving,
        "One worker serves a two-core machine best: concurrent requests run in threads that share "
        "TensorFlow's thread pools, while two worker processes compete for the same cores. The model runs "
        "as one traced graph for every input length. Untrained weights cost what trained ones do.",
    ),
    "tts_levers.json": (
        "Synthesis: what limits intelligibility",
        "Each run trains the synthesis model on two ranks with one lever changed, then evaluates it on dev "
        "sentences (held-out sentences in training voices), heard by an acoustic model.",
        tts_levers,
        "No lever moves the attention model's free-running intelligibility, and more steps do not either, "
        "while its teacher-forced frames are understood far better: without the recording's frames it "
        "learns the voice's average spectrum and the sentence's length, and its attention moves down the "
        "diagonal at an almost constant rate where speech spends a different time on every character. "
        "Durations from a monotonic alignment search (as in Glow-TTS) driving a decoder without feedback "
        "(as in FastSpeech) remove that problem; what remains between free-running and teacher-forced is "
        "where within the sentence each character falls. The demo trains this model with a convolutional "
        "decoder. Training on a CPU is deterministic, so the spread between runs comes from the seed.",
    ),
}


def slug(title: str) -> str:
    """GitHub's anchor for a heading."""
    text = title.strip().lower().replace("`", "")
    return "".join(c for c in text if c.isalnum() or c in " -_").replace(" ", "-")


def render(results_dir: Path, page: Path) -> str:
    """The page for the JSON files in `results_dir`; links are relative to `page`'s directory."""
    files = sorted(results_dir.glob("*.json"))
    unknown = [f.name for f in files if f.name not in SECTIONS]
    if unknown:
        raise ValueError(f"{', '.join(unknown)}: add a section for each to SECTIONS in benchmarks/report.py")
    order = [name for name in SECTIONS if (results_dir / name).is_file()]
    lines = [
        "# Benchmarks",
        "",
        "<!-- Generated by `make bench-report` (benchmarks/report.py) from benchmarks/results/*.json: edit those, "
        "not this page. -->",
        "",
        "Every figure here comes from a JSON file in [benchmarks/results/]"
        f"({os.path.relpath(results_dir, page.parent)}/), written by the benchmark that measured it; each "
        "section says which commit, date, machine, command and seeds produced it. `make bench` runs the "
        "benchmarks at full size (CPU only; figures from different machines do not compare), `make "
        "bench-report` rewrites this page. Training figures are at `horovodrun -np 2 -H localhost:2 --gloo` "
        "unless a section says otherwise.",
        "",
    ]
    lines += [f"- [{SECTIONS[name][0]}](#{slug(SECTIONS[name][0])})" for name in order] + [""]
    for name in order:
        title, what, renderer, analysis = SECTIONS[name]
        data = json.loads((results_dir / name).read_text())
        lines += [f"## {title}", "", what, ""]
        lines += provenance(data.get("meta"), data)
        lines += renderer(data)
        plot = results_dir / f"{Path(name).stem}.png"
        if plot.is_file():
            lines += [f"![{title}]({os.path.relpath(plot, page.parent)})", ""]
        if analysis:
            lines += [analysis, ""]
    return "\n".join(lines).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--results", type=Path, default=RESULTS, help="the benchmarks' JSON files")
    parser.add_argument("--out", type=Path, default=PAGE, help="the page to write")
    args = parser.parse_args(argv)
    # Links are made relative to the committed page's place, wherever this copy is written.
    text = render(args.results.resolve(), PAGE)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
