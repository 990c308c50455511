"""The sections of docs/benchmarks.md (benchmarks/report.py) on what runs reached: the demo, the
strategies' convergence, the injected faults and the time to accuracy, each from its JSON (the
synthesis model's: benchmarks/report_tts.py)."""

from __future__ import annotations

import statistics

# The benchmarks' own table columns; importing them loads no TensorFlow.
import benchmarks.convergence
import benchmarks.faults
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
# Variants in the order the benchmark runs them.
CONVERGENCE_VARIANTS = ("allreduce", "delay-by-one", "fixed-ring", "random-ring", "hierarchical")


def demo_calibration(r: dict) -> list[str]:
    """The calibration taken before the run (benchmarks/calibrate.py), and what the run before it predicted."""
    c = r.get("calibration")
    if not c:
        return []
    rows = [
        ["acoustic model, seconds per step", num(c["asr_step_s"], 3)],
        ["synthesis model, seconds per step", num(c["tts_step_s"], 3)],
        ["one core's probe, seconds", num(c["probe_s"], 3)],
        ["the calibration, launch to end, seconds", num(c["seconds"], 1)],
    ]
    if r.get("estimated_minutes"):
        e = r["estimated_minutes"]
        there = e["from"]["machine"] or {}
        rows.append(
            [f"the estimate from the run before (a {there.get('cpu_model', 'CPU')}), minutes", num(e["minutes"], 1)]
        )
    return [
        "The calibration before the run (what the demo scales a measured run's minutes by):",
        "",
        *table(["calibration", "value"], rows),
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
    out += table([*benchmarks.convergence.TABLE, "test CER per seed", "job minutes per seed"], rows)
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
        out += table([*benchmarks.convergence.HALF_SPEED_TABLE, "batches r0/r1"], rows)
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


def voice_warp(r: dict) -> list[str]:
    """benchmarks/voice_warp.py: per split, each voice's greedy CER at each warp, its best warp."""
    warps = r["warps"]
    out = [
        f"The demo run's acoustic model (training seed {r['meta']['seeds']['training']}); greedy CER of each "
        "voice with every utterance's mel axis warped by the factor in the column head (1.0: unwarped).",
        "",
    ]
    for split, s in r["splits"].items():
        rows = []
        for name, cers, count in [
            *((f"`{n}`", v["cer"], v["utterances"]) for n, v in s["voices"].items()),
            ("**all**", s["all"], sum(v["utterances"] for v in s["voices"].values())),
        ]:
            best = min(range(len(warps)), key=lambda i: cers[i])
            cells = [f"**{pct(c)}**" if i == best else pct(c) for i, c in enumerate(cers)]
            rows.append([name, str(count), *cells, num(warps[best], 2)])
        out += [f"`{split}`:", ""]
        out += table(["voice", "utterances", *(num(w, 2) for w in warps), "best warp"], rows)
    return out


def reference_asr(r: dict) -> list[str]:
    """benchmarks/reference_asr.py: per split and per voice, pocketsphinx's CER and WER beside ours."""
    rec = r["recognizer"]
    ours = f"from `{r['ours']}`, greedy" if r.get("ours") else "not given"
    out = [
        f"pocketsphinx {rec['version']} as it ships (`{rec['acoustic_model']}`, `{rec['language_model']}`, "
        f"`{rec['dictionary']}`; {rec['configuration']}); ours: {ours}.",
        "",
    ]
    measured = {"hypotheses": "the same utterances", "metrics": "the whole split"}
    rows, voice_rows, guards = [], [], []
    for split, s in r["splits"].items():
        theirs, mine = s["pocketsphinx"], s.get("ours") or {}
        rows.append([f"`{split}`", str(s["utterances"]), pct(theirs["all"]["cer"]), pct(theirs["all"]["wer"]),
                     pct(mine.get("all", {}).get("cer")), pct(mine.get("all", {}).get("wer")),
                     measured.get(mine.get("from"), ""), num(s["real_time_factor"], 2)])  # fmt: skip
        for voice, rates in theirs["voices"].items():
            own = mine.get("voices", {}).get(voice, {})
            voice_rows.append([f"`{split}`", f"`{voice}`", str(rates["utterances"]), pct(rates["cer"]),
                               pct(rates["wer"]), pct(own.get("cer")), pct(own.get("wer"))])  # fmt: skip
        if s.get("guard"):
            g = s["guard"]
            verdict = "within" if g["within"] else "outside"
            guards.append(
                f"`{split}`{' in ' + ', '.join(f'`{v}`' for v in g['voices']) if g.get('voices') else ''}: CER "
                f"{pct(g['cer'])}, {verdict} the target {pct(g['target'])} ± {pct(g['tolerance'])}"
            )
    heads = ["CER pocketsphinx", "WER pocketsphinx", "CER ours", "WER ours"]
    out += table(["split", "utterances", *heads, "ours on", "real-time factor (CPU time)"], rows)
    if voice_rows:
        keep = 7 if any(row[-1] for row in voice_rows) else 5  # ours per voice only from hypotheses
        out += table(["split", "voice", "utterances", *heads][:keep], [row[:keep] for row in voice_rows])
    if guards:
        out += ["Guard: " + "; ".join(guards) + ".", ""]
    return out


def measured_on(arm: dict) -> str:
    """An arm's own commit and machine (arms of one results file may come from several runs)."""
    run = arm["run"]
    machine = run["machine"]
    return f"`{run['commit'][:7]}`, {machine['cpu_model']} ({', '.join(machine['flags'])}), {run['date'][:10]}"


def voice_levers(r: dict) -> list[str]:
    """benchmarks/voice_levers.py: each arm's test and held-out-speaker CER (seeds' mean, each seed
    beside it), per held-out voice, and the verdict against the base arm."""
    arms, base = r["arms"], r["arms"].get("base")

    def seeds(arm: dict, key: str) -> str:
        each = ", ".join(pct(run[key], 2) for run in arm["runs"])
        return f"{pct(arm['mean'][key], 2)} ({each})"

    def verdict(name: str, arm: dict) -> str:
        if name == "base" or not base:
            return "the base"
        if len(arm["runs"]) < 2:
            return "one seed: not judged"
        gain = base["mean"]["test_engine_cer"] - arm["mean"]["test_engine_cer"]
        spread = max(base["spread"]["test_engine_cer"], arm["spread"]["test_engine_cer"])
        if arm["mean"]["test_cer"] > 0.030:
            return f"rejected: test {pct(arm['mean']['test_cer'], 2)} > 3.0%"
        return "kept" if gain > spread else f"rejected: held-out gain {pct(gain, 2)} within the seeds' spread"

    rows = []
    for name, arm in arms.items():
        settings = [*arm["corpus_sets"], *(f"copies.{c}" for c in arm.get("copies", []))]
        rows.append([f"`{name}`", "; ".join(f"`{s}`" for s in settings) or "the corpus' defaults", pct(arm["natural_share_seconds"]),
                     seeds(arm, "test_cer"), seeds(arm, "test_engine_cer"), verdict(name, arm), measured_on(arm)])  # fmt: skip
    out = table(
        ["arm", "settings", "natural share of train seconds", "test CER", "held-out speakers CER", "verdict", "run"],
        rows,
    )
    voices = sorted({v for arm in arms.values() for v in arm["test_engine_voices_mean"]})
    out += table(
        ["held-out voice", *(f"`{name}`" for name in arms)],
        [[f"`{v}`", *(pct(arm["test_engine_voices_mean"].get(v), 1) for arm in arms.values())] for v in voices],
    )
    return out


def text_levers(r: dict) -> list[str]:
    """benchmarks/voice_levers.py --text open: each arm's CER on open-text sentences (test, the
    held-out speakers), the share of each split's words no training sentence has and their own CER
    (seeds' mean, each seed beside it), against the ceiling for test."""

    def seeds(arm: dict, key: str) -> str:
        values = [run.get(key) for run in arm["runs"]]
        if any(v is None for v in values):
            return ""
        return f"{pct(statistics.fmean(values), 2)} ({', '.join(pct(v, 2) for v in values)})"

    rows = []
    for name, arm in r["arms"].items():
        settings = [*arm["corpus_sets"], *(f"copies.{c}" for c in arm.get("copies", []))]
        mean_test = statistics.fmean(run["test_cer"] for run in arm["runs"])
        verdict = "one seed" if len(arm["runs"]) < 2 else "within 5.0%" if mean_test <= 0.05 else "above 5.0%"
        rows.append([f"`{name}`", "; ".join(f"`{s}`" for s in settings) or "the corpus' defaults",
                     seeds(arm, "test_cer"), pct(arm["runs"][0].get("test_oov_rate")), seeds(arm, "test_oov_cer"),
                     seeds(arm, "test_engine_cer"), seeds(arm, "test_engine_oov_cer"), verdict, measured_on(arm)])  # fmt: skip
    return table(
        ["arm", "settings", "test CER", "test words unheard", "their CER", "held-out speakers CER", "their unheard words' CER",
         "test against 5.0%", "run"],
        rows,
    )  # fmt: skip


def lm_decoding(r: dict) -> list[str]:
    """benchmarks/lm_decoding.py: per LM (its text and order) and split, greedy, beam and beam+LM CER
    and WER, the LM's WER over beam search's, and how well the LM's text knows the split."""
    rows = []
    for name, c in r["conditions"].items():
        chosen = f"{c['chosen']['weight']:g} / {c['chosen']['word_bonus']:g} (on `{c['chosen']['on']}`)"
        for split, f in c["splits"].items():
            ratio = f"{f['wer_lm_over_beam']:.2f}x" if f.get("wer_lm_over_beam") is not None else ""
            rows.append([f"`{name}`", f"{num(c['sentences'])} sentences, {num(c['vocabulary_size'])} words",
                         chosen, f"`{split}`", pct(f["cer"]), pct(f["cer_beam"]), pct(f["cer_lm"]), pct(f["wer"]),
                         pct(f["wer_beam"]), pct(f["wer_lm"]), ratio, pct(f["lm_oov_rate"]), pct(f["lm_3gram_hit"])])  # fmt: skip
    return table(
        ["LM", "its text", "weight / word bonus", "split", "CER greedy", "CER beam", "CER beam+LM", "WER greedy",
         "WER beam", "WER beam+LM", "WER: LM / beam", "words the LM lacks", "3-grams its text had"],
        rows,
    )  # fmt: skip


# benchmarks/targets.py's columns: per split, each arm's figures (the arm, its key in the JSON)
TARGETS_COLUMNS = (
    ("chars: CER greedy", "chars", "cer"),
    ("WER greedy", "chars", "wer"),
    ("WER with the n-gram", "chars", "wer_lm"),
    ("CER with the n-gram", "chars", "cer_lm"),
    ("phones: PER greedy", "phones", "per"),
    ("WER through HLG", "phones", "wer_lm"),
    ("CER through HLG", "phones", "cer_lm"),
)
# then the share of each split's words each arm's LM lacks (the same for every seed)
TARGETS_OOV = (("words the n-gram lacks", "chars"), ("words the graph lacks", "phones"))
# benchmarks/targets.py's model sources, as the page names them
TARGETS_SOURCES = {"the demo run": "the demo run's own model"}


def targets_cell(record: dict, split: str, key: str) -> str:
    """One arm's figure on a split: the seeds' mean, and with several seeds each seed's in brackets."""
    mean = record["mean"][split].get(key)
    each = [run["splits"][split].get(key) for run in record["runs"].values()]
    if mean is None or len(each) < 2:
        return pct(mean)
    return f"{pct(mean)} ({', '.join(pct(v) for v in each)})"


def targets_settings(arm: str, run: dict) -> str:
    """A model's decoding settings that models.tune_lm chose: the n-gram's weight and word bonus, or the
    graph's acoustic scale and word penalty, and the split they were chosen on."""
    t = run["tuned"]
    if arm == "phones":
        return f"acoustic scale {t['acoustic_scale']:g}, word penalty {t['word_penalty']:g} (on `{t['on']}`)"
    return f"weight {t['weight']:g}, word bonus {t['word_bonus']:g} (on `{t['on']}`)"


def targets(r: dict) -> list[str]:
    """benchmarks/targets.py: per split, the char model greedy and with its n-gram, the phone model
    greedy (PER) and through its graph, each the mean of its seeds with every seed's in brackets, the
    share of words each LM lacks and the graph search's real-time factor (the seeds' mean); then each
    model's source, steps and decoding settings."""
    arms, lm, graph = r["arms"], r["lm"], r["graph"]
    rows = [
        [f"`{split}`", *(targets_cell(arms[arm], split, key) for _, arm, key in TARGETS_COLUMNS)]
        + [pct(arms[arm]["mean"][split]["lm_oov_rate"]) for _, arm in TARGETS_OOV]
        + [num(arms["phones"]["mean"][split].get("decode_rtf_lm"), 3)]
        for split in r["splits"]
    ]
    seeds = "; ".join(f"`{arm}` {', '.join(map(str, record['seeds']))}" for arm, record in arms.items())
    out = [
        f"Seeds: {seeds}. The n-gram (order {lm['order']}) of {num(lm['text']['sentences'])} sentences and "
        f"{num(lm['text']['vocabulary_size'])} words; the graph: {num(graph['words'])} entries in its word table, "
        f"{num(graph['states'])} states, {num(graph['arcs'])} arcs.",
        "",
    ]
    headers = ["split", *(name for name, _, _ in TARGETS_COLUMNS), *(name for name, _ in TARGETS_OOV)]
    out += table([*headers, "HLG search RTF"], rows)
    models = [
        [f"`{arm}`", seed, TARGETS_SOURCES.get(run["source"], run["source"]), num(run["steps"])]
        + [targets_settings(arm, run)]
        for arm, record in arms.items()
        for seed, run in record["runs"].items()
    ]
    return out + table(["arm", "seed", "model", "steps", "decoding settings"], models)
