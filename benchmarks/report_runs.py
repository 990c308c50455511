"""The sections of docs/benchmarks.md (benchmarks/report.py) on what runs reached: the demo, the
strategies' convergence, the injected faults and the time to accuracy, each from its JSON (the
synthesis model's: benchmarks/report_tts.py). Each benchmark prints its own section's tables with
these functions."""

from __future__ import annotations

from benchmarks.report_format import num, pct, table, thousands

# The DAG's tasks in the order they run (the JSON's keys are sorted), by task id prefix.
DAG_ORDER = (
    "plan",
    "start_mlflow_run",
    "prepare_corpus",
    "augment_train",
    "features_",
    "lm_text",
    "lexicon",
    "make_shards",
    "build_lm",
    "build_graph",
    "train_asr",
    "train_tts",
    "tune_lm",
    "evaluate_asr",
    "evaluate_tts",
    "register_",
    "finish_mlflow_run",
)
# benchmarks/convergence.py's columns: part 1, then part 2 (rank 1 at half speed)
CONVERGENCE_TABLE = ["strategy", "seeds", "test CER (mean)", "spread", "test WER", "CER vs allreduce", "from"]
HALF_SPEED_TABLE = [
    "rank 1 at half speed",
    "target dev CER",
    "minutes to it",
    "final dev CER",
    "minutes to both's level",
    "job minutes",
]
# Variants in the order the benchmark runs them.
CONVERGENCE_VARIANTS = ("allreduce", "delay-by-one", "fixed-ring", "random-ring", "hierarchical")


def calibration(c: dict, extra: list[list[str]] | None = None) -> list[str]:
    """benchmarks/calibrate.py's record: each model's seconds a step, the probe's, the whole calibration's;
    then the rows `extra`."""
    rows = [
        ["acoustic model, seconds per step", num(c["asr_step_s"], 3)],
        ["synthesis model, seconds per step", num(c["tts_step_s"], 3)],
        ["one core's probe, seconds", num(c["probe_s"], 3)],
        ["the calibration, launch to end, seconds", num(c["seconds"], 1)],
    ]
    return table(["calibration", "value"], rows + (extra or []))


def demo_calibration(r: dict) -> list[str]:
    """The calibration taken before the run (benchmarks/calibrate.py), and what the run before it predicted."""
    c = r.get("calibration")
    if not c:
        return []
    extra = []
    if r.get("estimated_minutes"):
        e = r["estimated_minutes"]
        there = e["from"]["machine"] or {}
        extra.append(
            [f"the estimate from the run before (a {there.get('cpu_model', 'CPU')}), minutes", num(e["minutes"], 1)]
        )
    return [
        "The calibration before the run (what the demo scales a measured run's minutes by):",
        "",
        *calibration(c, extra),
    ]


DEMO_SPLITS = (
    ("dev", "dev (training voices, new sentences)"),
    ("test", "test (voices never heard in training)"),
    ("test_noisy", "noisy test (the test sentences with noise)"),
    ("test_engine", "engine test (the test sentences in held-out speakers' voices, every engine's)"),
)


def demo_asr(asr: dict) -> list[str]:
    """The demo's phone model: PER greedy and beam, and the words through its HLG graph, per split."""
    rows = []
    for split, what in DEMO_SPLITS:
        if f"{split}_per" in asr:
            rows.append(
                [
                    what,
                    pct(asr[f"{split}_per"]),
                    pct(asr[f"{split}_per_beam"]),
                    pct(asr.get(f"{split}_wer_lm")),
                    pct(asr.get(f"{split}_cer_lm")),
                    pct(asr.get(f"{split}_lm_oov_rate")),
                    num(asr.get(f"{split}_decode_rtf_lm"), 4),
                ]
            )
    graph = (
        f" Words through the HLG graph the run built and attached: {num(asr['lm_vocabulary_size'])} words, "
        f"{num(asr['lm_graph_arcs'])} arcs, acoustic scale {asr['lm_acoustic_scale']:g}, word penalty "
        f"{asr['lm_word_penalty']:g}, chosen by `models.tune_lm` on `dev_engine`."
        if "lm_graph_arcs" in asr
        else ""
    )
    header = ["split", "PER greedy", "PER beam", "WER (HLG)", "CER (HLG)", "words outside the lexicon", "search RTF"]
    return [f"Acoustic model of phones (the champion chosen on dev).{graph}", "", *table(header, rows)]


def demo_asr_chars(asr: dict) -> list[str]:
    """The demo's character model: CER and WER greedy, beam and with its word LM, per split."""
    out = []
    rows = []
    for split, what in (
        ("dev", "dev (training voices, new sentences)"),
        ("test", "test (voices never heard in training)"),
        ("test_noisy", "noisy test (the test sentences with noise)"),
        ("test_engine", "engine test (the test sentences in held-out speakers' voices, every engine's)"),
    ):
        if f"{split}_cer" not in asr:  # a corpus without that split
            continue
        rows.append(
            [
                what,
                pct(asr[f"{split}_cer"]),
                pct(asr[f"{split}_wer"]),
                pct(asr[f"{split}_cer_beam"]),
                pct(asr[f"{split}_wer_beam"]),
                *((pct(asr.get(f"{split}_cer_lm")), pct(asr.get(f"{split}_wer_lm"))) if "lm_weight" in asr else ()),
            ]
        )
    lm = (
        f" Beam search with the word LM the run built and attached: order {asr['lm_order']}, "
        f"{num(asr['lm_vocabulary_size'])} words, weight {asr['lm_weight']:g}, word bonus {asr['lm_word_bonus']:g}, "
        "chosen by `models.tune_lm` on `dev_engine` where the corpus has one: new sentences in the voices of "
        "the engine test, whose LM columns are then held out in sentences, not in voices."
        if "lm_weight" in asr
        else ""
    )
    out += [f"Acoustic model (the champion chosen on dev).{lm}", ""]
    header = ["split", "CER greedy", "WER greedy", "CER beam", "WER beam"]
    out += table(header + (["CER beam+LM", "WER beam+LM"] if lm else []), rows)
    return out


def demo_tts(r: dict, tts: dict) -> list[str]:
    """The demo's synthesis model as its listener (the acoustic model of the same run) hears it."""
    out, phones = [], "dev_intelligibility_per" in tts
    rows = []
    for split, what in (("dev", "dev (training voices)"), ("test", "test (unseen voices, nearest training voice)")):
        rows.append(
            [
                what,
                tts[f"{split}_utterances"],
                *((pct(tts[f"{split}_intelligibility_per"]),) if phones else ()),
                pct(tts[f"{split}_intelligibility_cer"]),
                pct(tts[f"{split}_intelligibility_wer"]),
                pct(tts[f"{split}_intelligibility_cer_teacher_forced"]),
                *((pct(tts[f"{split}_intelligibility_per_recordings"]),) if phones else ()),
                pct(tts[f"{split}_intelligibility_cer_recordings"]),
                num(tts[f"{split}_fbank_cepstral_distance_db"], 2),
            ]
        )
    heard = (
        " The listener is the phone model: PER of its phones, CER and WER of its words through its graph."
        if phones
        else ""
    )
    out += [f"Synthesis model ({r['tts_training'].get('decoder', 'the demo config')}).{heard}", ""]
    out += table(
        [
            "split",
            "sentences",
            *(["PER free-running"] if phones else []),
            "CER free-running",
            "WER free-running",
            "CER teacher-forced",
            *(["PER of the recordings"] if phones else []),
            "CER of the recordings",
            "fbank cepstral distance (dB)",
        ],
        rows,
    )
    return out


def demo(r: dict) -> list[str]:
    asr, tts = r["asr"], r["tts"]
    params = "the DAG's default parameters" if not r["params"] else f"parameters `{r['params']}`"
    out = [f"`make demo` with {params}, `make setup` done before.", ""]
    tasks = sorted(r["task_minutes"], key=lambda t: next((i for i, p in enumerate(DAG_ORDER) if t.startswith(p)), 99))
    rows = [[f"`{task}`", num(r["task_minutes"][task], 1)] for task in tasks]
    out += table(["task", "minutes"], [*rows, ["**`make demo`, launch to exit**", num(r["demo_wall_s"] / 60, 1)]])
    out += demo_calibration(r)
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
                pct(t.get("input_wait_share_max_10_step_window"), 2),
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
    out += demo_asr(asr) if "dev_per" in asr or "test_per" in asr else demo_asr_chars(asr)
    out += demo_tts(r, tts)
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
    budget = "The demo config's own schedule" if r["epochs"] is None else f"{r['epochs']} epochs"
    out = [f"{budget} of the demo acoustic model for every strategy; test CER greedy.", ""]
    out += table([*CONVERGENCE_TABLE, "test CER per seed", "job minutes per seed"], rows)
    if "common_dev_level" in r:
        out += convergence_time(r)
    half = [n for n in (r.get("best_gossip_variant"), "allreduce") if n and f"{n}_half_speed_job_minutes" in r]
    if half:
        rows = []
        for name in half:
            to_target = r.get(f"{name}_half_speed_minutes_to_allreduce_dev_cer")
            rows.append(
                [
                    name,
                    pct(r["half_speed_target_dev_cer"], 2),
                    "never" if to_target is None else num(to_target, 1),
                    pct(r[f"{name}_half_speed_final_dev_cer"], 2),
                    num(r[f"{name}_half_speed_minutes_to_common_dev_cer"], 1),
                    num(r[f"{name}_half_speed_job_minutes"], 1),
                    "/".join(str(b) for b in r[f"{name}_half_speed_batches"]),
                ]
            )
        level = pct(r["half_speed_common_dev_cer"], 2)
        where = f", from {r['half_speed_from']}" if r.get("half_speed_from") else ""
        out += [f"The second part, rank 1 at half speed (the level both reached: {level} dev CER{where}):", ""]
        out += table([*HALF_SPEED_TABLE, "batches r0/r1"], rows)
        gossip, base = (r.get(f"{n}_half_speed_minutes_to_common_dev_cer") for n in half)
        if len(half) == 2 and gossip is not None and base:
            line = f"`{half[0]}` reached {level} in {gossip / base:.2f}x allreduce's minutes"
            aimed, aimed_base = (r.get(f"{n}_half_speed_minutes_to_allreduce_dev_cer") for n in half)
            if aimed is not None and aimed_base:
                target = pct(r["half_speed_target_dev_cer"], 2)
                line += f", and the target, {target}, in {aimed / aimed_base:.2f}x"
            out += [line + ".", ""]
    return out


def convergence_time(r: dict) -> list[str]:
    """Time to accuracy: minutes from launching horovodrun to each dev CER, per strategy."""

    def minutes(value) -> str:
        return "never" if value is None else num(value, 1)

    keys = [*(f"{t:g}" for t in r["targets"]), "common_level"]
    rows = []
    for name in CONVERGENCE_VARIANTS:
        if f"{name}_minutes_to_common_level" not in r:
            continue
        seeds = range(len(r[f"{name}_cers"]))
        ratio = r.get(f"{name}_minutes_to_common_level_vs_allreduce")
        rows.append(
            [
                name,
                pct(r[f"{name}_final_dev_cer"]),
                *(minutes(r[f"{name}_minutes_to_{k}"]) for k in keys),
                " / ".join(minutes(r[f"{name}_seed{s}_minutes_to_common_level"]) for s in seeds),
                "" if ratio is None or name == "allreduce" else num(ratio, 2),
                num(r[f"{name}_job_minutes"], 1),
            ]
        )
    level = pct(r["common_dev_level"])
    headers = [
        "strategy",
        "final dev CER",
        *(f"minutes to {pct(t)}" for t in r["targets"]),
        f"minutes to {level}",
        "per seed",
        "vs allreduce",
        "job minutes",
    ]
    out = [
        f"Time to accuracy: minutes from launching horovodrun until the dev CER first reached each level "
        f"(the seeds' mean; never: a seed did not reach it); {level} is the level every run reached, the highest "
        "of the runs' best dev CERs.",
        "",
    ]
    return out + table(headers, rows)


# benchmarks/faults.py's columns
FAULTS_TABLE = ["fault", "exit code", "seconds to detect", "steps lost", "final test CER / outcome"]


def _fault_rows(r: dict) -> dict:
    """benchmarks/faults.py's table: each fault's label and the rest of its row, built only when called,
    since a fault the run left out has none of its keys."""

    def cer(key: str) -> str:
        return f"test CER {pct(r[key])}" if r.get(key) is not None else ""

    return {
        "clean": ("none (undisturbed)", lambda: [r["clean_exit"], "", "", cer("clean_cer")]),
        "kill_worker": (
            "SIGKILL rank 1",
            lambda: [
                r["kill_worker_exit"],
                num(r["kill_worker_detect_s"], 2),
                r["kill_worker_steps_lost"],
                f"rank named: {r['kill_worker_rank_named']}; re-run exit {r['kill_worker_retry_exit']}, "
                + cer("kill_worker_cer"),
            ],
        ),
        "kill_worker_elastic": (
            "SIGKILL rank 1, `--elastic`",
            lambda: [
                r["kill_worker_elastic_exit"],
                f"{num(r['kill_worker_elastic_reset_s'], 1)} (to the reset)",
                r["kill_worker_elastic_steps_lost"],
                cer("kill_worker_elastic_cer"),
            ],
        ),
        "kill_job": (
            "SIGKILL of the whole job, then the command again",
            lambda: [r["kill_job_retry_exit"], "", r["kill_job_steps_lost"], cer("kill_job_cer")],
        ),
        "kill_shard_writer": (
            "SIGKILL of the shard writer, then again",
            lambda: [
                r["kill_shard_writer_rerun_exit"],
                "",
                "",
                f"the same shards: {r['kill_shard_writer_same_shards']}",
            ],
        ),
        "corrupt_shard": (
            "a corrupted shard",
            lambda: [
                r["corrupt_shard_exit"],
                num(r["corrupt_shard_detect_s"], 1),
                "",
                f"shard named: {r['corrupt_shard_named']}",
            ],
        ),
        "mlflow_down": (
            "MLflow down, then back",
            lambda: [
                r["mlflow_down_exit"],
                "",
                "",
                f"{r['mlflow_down_loss_points']}/{r['mlflow_down_steps']} loss points",
            ],
        ),
    }


def faults(r: dict) -> list[str]:
    """benchmarks/faults.py: per fault it injected (`faults`; a record without: every one), the job's exit
    code, the seconds to detect it, the steps lost and the final test CER or the outcome; for a fault the
    run left out (its tiny run), the test that covers it."""
    left_out, injected = r.get("left_out", {}), r.get("faults")
    rows = [
        [label, "", "", "", f"left out: {left_out[name]}"] if name in left_out else [label, *row()]
        for name, (label, row) in _fault_rows(r).items()
        if injected is None or name in injected or name in left_out
    ]
    out = [f"{r['epochs']} epochs on two ranks; each fault injected at step {r['kill_at_step']} of a real run.", ""]
    out += table(FAULTS_TABLE, rows)
    return out


def time_to_accuracy(r: dict) -> list[str]:
    targets = r["targets"]
    rows = []
    for name in sorted(r["arms"], key=lambda n: (n != "before", n)):  # before, then after
        arm = r["arms"][name]
        runs = arm["runs"]
        for run in [*runs, {**arm, "seed": "mean"}] if len(runs) > 1 else runs:
            rows.append(
                [
                    name,
                    f"`{arm['config']}`",
                    run["seed"],
                    num(run["steps"], 0),
                    num(run["startup_minutes"], 1),
                    *(
                        "never" if run.get(f"minutes_to_{t:g}") is None else num(run[f"minutes_to_{t:g}"], 1)
                        for t in targets
                    ),
                    num(run["job_minutes"], 1),
                    pct(run["final_dev_cer"]),
                    pct(run["test_cer"]),
                    "-" if run.get("test_engine_cer") is None else pct(run["test_engine_cer"]),
                ]
            )
    headers = [
        "arm",
        "config",
        "seed",
        "steps",
        "start-up minutes",
        *(f"minutes to dev CER {pct(t)}" for t in targets),
        "job minutes",
        "final dev CER",
        "test CER",
        "test_engine CER",
    ]
    return table(headers, rows)
