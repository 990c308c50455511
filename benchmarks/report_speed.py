"""The speed benchmarks' sections of docs/benchmarks.md (benchmarks/report.py): input pipeline,
training throughput, the speedup model, stragglers and serving under load, each a table from its JSON.
Each benchmark prints its own section's tables with these functions."""

from __future__ import annotations

import re

from benchmarks.report_format import milliseconds, num, pct, table, thousands

# benchmarks/straggler.py's columns, and its variants in the order it runs them
STRAGGLER_TABLE = [
    "strategy",
    "rank 1 speed",
    "job s alone",
    "job s slowed",
    "batches r0/r1",
    "job ratio",
    "ideal",
    "fast rank",
]
STRAGGLER_VARIANTS = ("allreduce", "fixed-ring", "random-ring", "delay-by-one")


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


# benchmarks/throughput.py's columns: its runs, and the synthesis model's batch-size curve
THROUGHPUT_TABLE = ["run", "frames/s", "steps/s", "input share", "comm share", "GFLOP/s", "of fp32 peak"]
CURVE_TABLE = ["", "encoder", "decoder", "post-net", "backward + Adam", "frames/s"]


def throughput_runs(r: dict) -> list[str]:
    """A row per training run of benchmarks/throughput.py, then the threads per rank and the speedups."""
    rows = []
    for model in ("asr", "tts"):
        paths = ("", "_fp32_grads", "_keras", "_keras_sparse_ctc")
        for key in [f"{model}_np{n}{bf16}{path}" for bf16 in ("", "_bf16") for n in (1, 2) for path in paths]:
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
    out = table(THROUGHPUT_TABLE, rows)
    threads = sorted({v for k, v in r.items() if k.endswith("_intra_op_threads_per_rank")})
    if threads:
        out += [f"Threads per rank (TensorFlow's intra-op pool): {', '.join(str(t) for t in threads)}.", ""]
    out += [
        f"`{model}_np2`: a training step {r[f'{model}_np2_speedup_over_keras']:.2f}x as fast as `{model}_np2_keras` "
        "(Keras' LSTM loop" + (", CTC from dense labels" if model == "asr" else "") + ")."
        for model in ("asr", "tts")
        if f"{model}_np2_speedup_over_keras" in r
    ]
    if "asr_np2_speedup_over_fp32_grads" in r:
        out += [
            f"`asr_np2`: a training step {r['asr_np2_speedup_over_fp32_grads']:.2f}x as fast as `asr_np2_fp32_grads` "
            "(every gradient matmul in float32)."
        ]
    if any(k.endswith(("_speedup_over_keras", "_speedup_over_fp32_grads")) for k in r):
        out += [""]
    return out


def tts_profile(r: dict) -> list[str]:
    """The synthesis model's per-module forward and backward times in training, per number of ranks."""
    rows = []
    for n in (1, 2):
        for part in ("forward", "backward"):
            keys = [f"tts_np{n}_profile_{m}_{part}_ms" for m in ("encoder", "decoder", "postnet")]
            if all(k in r for k in keys):
                rows.append([f"np={n}, {part}", *(num(r[k]) for k in keys)])
    if not rows:
        return []
    head = ["Synthesis per-module time per step in training (ms, the trainer's profile):", ""]
    return head + table(["", "encoder", "decoder", "post-net"], rows)


def tts_curve_rows(r: dict, batches: tuple[int, ...]) -> list[list]:
    """The batch-size curve's rows (CURVE_TABLE's columns): this machine's, then the GPU calibration's."""
    rows = []
    for mode in ("graph", "xla"):
        for b in batches:
            key = f"tts_curve_{mode}_b{b}"
            rows.append(
                [
                    f"this machine, {mode}, batch {b}",
                    r[f"{key}_profile_encoder_forward_ms"],
                    r[f"{key}_profile_decoder_forward_ms"],
                    r[f"{key}_profile_postnet_forward_ms"],
                    r[f"{key}_backward_adam_ms"],
                    r[f"{key}_frames_per_s"],
                ]
            )
    calibration = sorted(r.get("gpu_calibration_tts", {}).items(), key=lambda item: int(item[0]))
    for b, (enc, dec, post, back, fps) in calibration:  # batch sizes as JSON keys: strings
        rows.append([f"H100 calibration, PyTorch eager, batch {b}", enc, dec, post, back, fps])
    return rows


def tts_curve(r: dict) -> list[str]:
    """The synthesis model's training step at each batch size beside the GPU calibration's; [] without one."""
    batches = sorted({int(k.split("_b")[1].split("_")[0]) for k in r if k.startswith("tts_curve_graph_b")})
    if not batches:
        return []
    rows = [
        [label, *(milliseconds(v) for v in times), thousands(fps)]
        for label, *times, fps in tts_curve_rows(r, tuple(batches))
    ]
    head = ["Synthesis training step, 60 characters x 600 frames, r=3 (forward per module; ms):", ""]
    return head + table(CURVE_TABLE, rows)


def throughput(r: dict) -> list[str]:
    """benchmarks/throughput.py: its runs, the synthesis model's profile and its batch-size curve."""
    out = [
        f"{r['steps']} steps, the first {r['warmup_steps_excluded']} excluded, on synthetic demo-shaped shards. "
        f"Matmul peak: float32 {num(r['matmul_peak_flops_float32'] / 1e9)} GFLOP/s, "
        f"bfloat16 {num(r['matmul_peak_flops_bfloat16'] / 1e9)} GFLOP/s.",
        "",
    ]
    return out + throughput_runs(r) + tts_profile(r) + tts_curve(r)


# benchmarks/speedup_model.py's columns: the model's predictions beside the measured speedups, then the
# GPU cluster's predictions beside the research's reported ones
SPEEDUP_TABLE = [
    "strategy",
    "predicted n=1",
    "predicted n=2",
    "measured n=2 (training)",
    "measured n=2 (job)",
    "predicted n=8",
    "predicted n=32",
    "predicted n=128",
]
GPU_WORKERS = (8, 32, 128)
GPU_TABLE = ["strategy", *(f"H100 cluster n={n}" for n in GPU_WORKERS), "reported n=32", "reported n=128"]


def gpu_rows(gpu: dict) -> list[list]:
    """The GPU projection's table rows (GPU_TABLE); the research reported AD-PSGD's only."""
    rows = []
    for strategy in ("allreduce", "adpsgd"):
        reported = [gpu["reported_speedup"][str(n)] if strategy == "adpsgd" else "" for n in (32, 128)]
        rows.append([strategy, *(gpu[f"{strategy}_predicted_speedup_n{n}"] for n in GPU_WORKERS), *reported])
    return rows


def speedup_model(r: dict) -> list[str]:
    """benchmarks/speedup_model.py: one step's times, the ring model's speedups beside the measured ones,
    and the same model for a GPU cluster."""
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
                *(num(r.get(f"{strategy}_predicted_speedup_n{n}"), 1) or "not recorded" for n in (8, 32, 128)),
            ]
        )
    out += table(SPEEDUP_TABLE, rows)
    gpu = r["gpu"]
    a, p = gpu["assumptions"], gpu["provenance"]
    out += [
        "",
        f"The same model for a GPU cluster: Tcalc {num(gpu['tcalc_s'] * 1000, 1)} ms (the GPU calibration's "
        f"smallest step of the demo model, {gpu['step']}; {p['device']}, {p['software']}, measured "
        f"{p['measured']}), Ttransmit {num(gpu['ttransmit_s'] * 1000, 2)} ms (the float32 weights over a "
        f"{num(a['link_bytes_per_s'] * 8 / 1e9, 0)} Gb/s link a GPU), Tmerge {num(gpu['tmerge_s'] * 1000, 3)} ms "
        f"(three passes over them at {num(a['hbm_bytes_per_s'] / 1e12, 2)} TB/s). Reported: the research's "
        "AD-PSGD on Switchboard-2000, time to accuracy against one GPU.",
        "",
    ]
    out += table(
        GPU_TABLE,
        [[s, *(num(v, 1) if isinstance(v, float) else v for v in rest)] for s, *rest in gpu_rows(gpu)],
    )
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
    out += table(STRAGGLER_TABLE, rows)
    return out


# benchmarks/serving.py's columns
SERVING_TABLE = ["setting", "requests", "req/s", "p50 s", "p99 s", "RTF p50", "RTF p99", "failed"]


def serving(r: dict) -> list[str]:
    """benchmarks/serving.py: per server and arm, each load level and the one batch request, then the goals."""
    rows = []
    greedy = any(k.endswith("_greedy") for k in r)  # a char model with its LM, also measured with lm: false
    arms = {"": "beam search + LM", "_greedy": "greedy"} if greedy else {"": "as served"}
    for workers in sorted({int(m[1]) for k in r if (m := re.match(r"w(\d+)_", k))}):
        for arm, name in arms.items():
            levels = [v for k, v in r.items() if k.startswith(f"w{workers}_c") and k.endswith(f"_c{v['clients']}{arm}")]
            for v in sorted(levels, key=lambda v: v["clients"]):
                rows.append(
                    [
                        f"{workers} worker(s), {v['clients']} client(s)" + (f", {name}" if len(arms) > 1 else ""),
                        v["requests"],
                        num(v["requests_per_s"], 1),
                        num(v["p50_s"], 3),
                        num(v["p99_s"], 3),
                        num(v["rtf_p50"], 3),
                        num(v["rtf_p99"], 3),
                        v["failed"],
                    ]
                )
            b = r[f"w{workers}_batch{arm}"]
            rtf = num(b["latency_s"] / b["audio_s"], 3)
            latency = num(b["latency_s"], 3)
            label = f"{workers} worker(s), 1 request of {b['rows']} rows" + (f", {name}" if len(arms) > 1 else "")
            rows.append([label, 1, "", latency, latency, rtf, rtf, int(not b["ok"])])
    goals = r["goals"]
    out = [f"Model: {r['model']}. Clients post {r['posted']} on the server's own machine.", ""]
    out += table(SERVING_TABLE, rows)
    out += [
        {"lm": "As served (with its word LM). ", "graph": "As served (words through its HLG graph). "}.get(
            r["decoder"], ""
        )
        + f"Goals at one worker: real-time factor at one client {num(r['rtf_1_client'], 3)} (goal <= "
        f"{goals['rtf_1_client']}); p99 latency at 4 clients {num(r['p99_s_4_clients'], 2)} s (goal <= "
        f"{goals['p99_s_4_clients']} s); failed requests at 16 clients {r['failed_16_clients']} (goal "
        f"{goals['failed_16_clients']}).",
        "",
    ]
    return out
