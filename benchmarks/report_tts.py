"""The sections of docs/benchmarks.md (benchmarks/report.py) on the synthesis model: its seeds, the
levers tried on it (three seeds each), what each part of its speech costs, and the first levers'
single runs, each from its JSON."""

from __future__ import annotations

from benchmarks.report_format import num, pct, table

# benchmarks/tts_durations.py's arms, in its order
DURATION_ARMS = {
    "teacher_forced": "the decoder over the searched path (training's computation)",
    "searched": "the searched durations through synthesis",
    "searched_noise_0.25": "searched + 0.25 steps of Gaussian noise per character",
    "searched_noise_0.5": "searched + 0.5 steps of Gaussian noise per character",
    "predicted": "the predicted durations (what the model speaks)",
    "predicted_rescaled": "predicted, scaled to the recording's length",
    "predicted_vocoded": "predicted, through Griffin-Lim and the feature stage (what a person hears)",
}


# tts_levers.json's columns: one row per run
LEVER_RUNS_TABLE = [
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


def lever_runs(runs: dict) -> list[str]:
    """A table of tts_levers.json's runs: each one's flags, steps, minutes and dev figures."""
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
    return table(LEVER_RUNS_TABLE, rows)


def reference_points(a: dict) -> list[str]:
    """tts_levers.json's analysis: the mel L1 of trivial predictions, the attention's drift, the lengths."""
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
    return ["Reference points (dev split):", "", *table(["what", "value"], rows)]


def tts_levers(r: dict) -> list[str]:
    """tts_levers.json: the first synthesis model's levers, the reference points, and the runs on the demo corpus."""
    out = [
        f"Corpus: {r['corpus']}. Listener: {r['judge']}.",
        "",
        f"Training: `{r['train_command']}`; evaluation: `{r['eval_command']}`. {r['config_note']}.",
        "",
    ]
    out += lever_runs(r["runs"]) + reference_points(r["analysis"])
    demo_runs = r["demo_corpus_runs"]
    out += [f"On the demo's corpus and listener: {demo_runs['what']}.", ""]
    return out + lever_runs(demo_runs["runs"])


def tts_seeds(r: dict) -> list[str]:
    rows = [
        [
            seed,
            pct(s["dev_intelligibility_cer"]),
            pct(s["test_intelligibility_cer"]),
            pct(s["dev_intelligibility_cer_teacher_forced"]),
            pct(s["dev_intelligibility_cer_recordings"]),
            pct(s.get("dev_intelligibility_cer_vocoded")) or "not measured",
            s["steps"],
            s["source"],
        ]
        for seed, s in r["seeds"].items()
    ]
    m = r["mean"]
    rows.append(
        [
            "**mean**",
            f"**{pct(m['dev_intelligibility_cer'])}**",
            f"**{pct(m['test_intelligibility_cer'])}**",
            pct(m["dev_intelligibility_cer_teacher_forced"]),
            pct(m["dev_intelligibility_cer_recordings"]),
            pct(m.get("dev_intelligibility_cer_vocoded")),
            "",
            "",
        ]
    )
    out = [
        f"`{r['config']}`{' with ' + ', '.join(r['overrides']) if r['overrides'] else ''}; {r['max_utterances']} "
        f"sentences per split; the listener's own test CER: {pct(r['listener_test_cer']) or 'not measured'}"
        f"; the listener, pinned: {r['listener']['model']} ({r['listener']['weights']}, sha256 "
        f"{r['listener']['sha256'][:12]}).",
        "",
    ]
    return out + table(
        [
            "seed",
            "dev CER free-running",
            "test CER free-running",
            "dev CER teacher-forced",
            "dev CER of the recordings",
            "dev CER through the vocoder",
            "steps",
            "from",
        ],
        rows,
    )


def tts_seed_levers(r: dict) -> list[str]:
    """benchmarks/tts_seeds.py runs kept with --lever: one row per lever, its seeds' mean and spread."""
    rows = []
    for name, run in r["levers"].items():
        m, spread = run["mean"], run["spread"]
        per_seed = " / ".join(pct(s["dev_intelligibility_cer"]) for s in run["seeds"].values())
        rows.append(
            [
                f"`{name}`",
                ", ".join(f"`{o}`" for o in run["overrides"]) or "the demo config",
                " / ".join(str(n) for n in sorted({s["steps"] for s in run["seeds"].values()})),
                f"**{pct(m['dev_intelligibility_cer'])}** ({per_seed})",
                num(100 * spread["dev_intelligibility_cer"], 1),
                pct(m["test_intelligibility_cer"]),
                pct(m["dev_intelligibility_cer_teacher_forced"]),
                pct(m.get("dev_intelligibility_cer_vocoded")) or "not measured",
                num(m["dev_mel_l1"], 3),
                f"{run['meta']['commit'][:7]}, {run['meta']['date'][:10]}",
            ]
        )
    first = next(iter(r["levers"].values()))
    out = [
        f"Seeds {', '.join(first['seeds'])} of each; {first['max_utterances']} sentences per split; the "
        f"listener (the same demo run's acoustic model in every row) has a test CER of "
        f"{pct(first['listener_test_cer'])}. Dev CER by the listener on the model's mels, then on them "
        "through the vocoder and the feature stage (what a person hears). A row's overrides are set on the "
        "demo config as it was at the row's commit: the rows named with the refit start from the config "
        "that refits the duration predictor (`refit30`, kept).",
        "",
    ]
    headers = ["lever", "overrides", "training steps", "dev CER, mean (each seed)", "dev spread (points)"]
    headers += ["test CER", "teacher-forced"]
    headers += ["through the vocoder", "mel L1", "measured at"]
    return out + table(headers, rows)


def tts_durations(r: dict) -> list[str]:
    """benchmarks/tts_durations.py: each arm's CER (the models' mean, each training seed's in brackets), and
    the predicted durations against the searched."""
    runs = r["models"]

    def each(mean: float, figures: list[float], show) -> str:
        """The models' mean (as benchmarks/tts_durations.py `combine` stored it), each seed's in brackets."""
        return show(mean) + (f" ({' / '.join(show(f) for f in figures)})" if len(runs) > 1 else "")

    order = [n for n in DURATION_ARMS if n in r["arms"]] + [n for n in r["arms"] if n not in DURATION_ARMS]
    rows = [
        [
            f"`{n}`",
            DURATION_ARMS.get(n, ""),
            each(r["arms"][n]["cer"], [run["arms"][n]["cer"] for run in runs], pct),
            each(r["arms"][n]["wer"], [run["arms"][n]["wer"] for run in runs], pct),
        ]
        for n in order
    ]
    seeds = ", ".join(str(s) for s in r["training_seeds"])
    mean = ["their mean, each seed's in brackets"] if len(runs) > 1 else []
    mean += [
        f"seed {run['training_seed']} is the demo run's own model" for run in runs if run["source"] == "the demo run"
    ]
    out = [
        f"The demo's synthesis config, training seed{'s' if len(runs) > 1 else ''} {seeds}"
        + (f" ({'; '.join(mean)})" if mean else "")
        + f", {r['utterances']} {r['split']} sentences; the listener's test CER {pct(r['listener_test_cer'])}.",
        "",
    ]
    out += table(["arm", "durations", f"{r['split']} CER", f"{r['split']} WER"], rows)

    def measure(key: str, show) -> str:
        return each(r["durations"][key], [run["durations"][key] for run in runs], show)

    figures = [
        ["mean absolute error per character (decoder steps)", measure("mean_abs_error_steps", lambda v: num(v, 2))],
        ["characters the search gives no step", measure("searched_zero_step_share", pct)],
        ["characters predicted under half a step", measure("predicted_below_half_share", pct)],
        ["predicted over searched length", measure("length_ratio", lambda v: num(v, 3))],
        [
            "last character's steps (its trailing silence), searched / predicted",
            f"{measure('last_character_searched_steps', lambda v: num(v, 1))} / "
            f"{measure('last_character_predicted_steps', lambda v: num(v, 1))}",
        ],
    ]
    return out + ["The predicted durations against the searched ones:", ""] + table(["", ""], figures)
