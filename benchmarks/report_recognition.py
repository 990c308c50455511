"""The sections of docs/benchmarks.md (benchmarks/report.py) on what a trained recognizer hears: an
off-the-shelf recognizer beside ours, the held-out speakers' levers, open English, decoding with a
word LM, characters against phones and vocal-tract warps, each from its benchmark's JSON. Each
benchmark prints its own section's tables with these functions."""

from __future__ import annotations

import statistics

from benchmarks.report_format import num, pct, table


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
        rows.append(
            [
                f"`{split}`",
                str(s["utterances"]),
                pct(theirs["all"]["cer"]),
                pct(theirs["all"]["wer"]),
                pct(mine.get("all", {}).get("cer")),
                pct(mine.get("all", {}).get("wer")),
                measured.get(mine.get("from"), ""),
                num(s["real_time_factor"], 2),
            ]
        )
        for voice, rates in theirs["voices"].items():
            own = mine.get("voices", {}).get(voice, {})
            voice_rows.append(
                [
                    f"`{split}`",
                    f"`{voice}`",
                    str(rates["utterances"]),
                    pct(rates["cer"]),
                    pct(rates["wer"]),
                    pct(own.get("cer")),
                    pct(own.get("wer")),
                ]
            )
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
        rows.append(
            [
                f"`{name}`",
                "; ".join(f"`{s}`" for s in settings) or "the corpus' defaults",
                pct(arm["natural_share_seconds"]),
                seeds(arm, "test_cer"),
                seeds(arm, "test_engine_cer"),
                verdict(name, arm),
                measured_on(arm),
            ]
        )
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
        rows.append(
            [
                f"`{name}`",
                "; ".join(f"`{s}`" for s in settings) or "the corpus' defaults",
                seeds(arm, "test_cer"),
                pct(arm["runs"][0].get("test_oov_rate")),
                seeds(arm, "test_oov_cer"),
                seeds(arm, "test_engine_cer"),
                seeds(arm, "test_engine_oov_cer"),
                verdict,
                measured_on(arm),
            ]
        )
    return table(
        [
            "arm",
            "settings",
            "test CER",
            "test words unheard",
            "their CER",
            "held-out speakers CER",
            "their unheard words' CER",
            "test against 5.0%",
            "run",
        ],
        rows,
    )


def lm_decoding(r: dict) -> list[str]:
    """benchmarks/lm_decoding.py: per LM (its text and order) and split, greedy, beam and beam+LM CER
    and WER, the LM's WER over beam search's, and how well the LM's text knows the split."""
    rows = []
    for name, c in r["conditions"].items():
        chosen = f"{c['chosen']['weight']:g} / {c['chosen']['word_bonus']:g} (on `{c['chosen']['on']}`)"
        for split, f in c["splits"].items():
            ratio = f"{f['wer_lm_over_beam']:.2f}x" if f.get("wer_lm_over_beam") is not None else ""
            rows.append(
                [
                    f"`{name}`",
                    f"{num(c['sentences'])} sentences, {num(c['vocabulary_size'])} words",
                    chosen,
                    f"`{split}`",
                    pct(f["cer"]),
                    pct(f["cer_beam"]),
                    pct(f["cer_lm"]),
                    pct(f["wer"]),
                    pct(f["wer_beam"]),
                    pct(f["wer_lm"]),
                    ratio,
                    pct(f["lm_oov_rate"]),
                    pct(f["lm_3gram_hit"]),
                ]
            )
    return table(
        [
            "LM",
            "its text",
            "weight / word bonus",
            "split",
            "CER greedy",
            "CER beam",
            "CER beam+LM",
            "WER greedy",
            "WER beam",
            "WER beam+LM",
            "WER: LM / beam",
            "words the LM lacks",
            "3-grams its text had",
        ],
        rows,
    )


# benchmarks/targets.py's first table: per split, the char arm's and the demo lexicon's phone arm's figures
# (the column, "chars" or "phones", the key in the JSON)
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


# The lexicon table's figures per phone arm: (column, split, key); WER and CER are of the words through HLG
LEXICON_COLUMNS = (
    ("dev WER", "dev", "wer_lm"),
    ("dev_engine WER (tuned on)", "dev_engine", "wer_lm"),
    ("test WER", "test", "wer_lm"),
    ("test_engine WER", "test_engine", "wer_lm"),
    ("test_noisy WER", "test_noisy", "wer_lm"),
    ("test_engine CER", "test_engine", "cer_lm"),
    ("test PER greedy", "test", "per"),
)


def targets_cell(record: dict, split: str, key: str) -> str:
    """One arm's figure on a split: the seeds' mean, and with several seeds each seed's in brackets."""
    mean = record["mean"].get(split, {}).get(key)
    each = [run["splits"][split].get(key) for run in record["runs"].values()] if mean is not None else []
    if mean is None or len(each) < 2:
        return pct(mean)
    return f"{pct(mean)} ({', '.join(pct(v) for v in each)})"


def targets_settings(targets: str, run: dict) -> str:
    """A model's decoding settings that models.tune_lm chose: the n-gram's weight and word bonus, or the
    graph's acoustic scale and word penalty, and the split they were chosen on."""
    t = run["tuned"]
    if targets == "phones":
        return f"acoustic scale {t['acoustic_scale']:g}, word penalty {t['word_penalty']:g} (on `{t['on']}`)"
    return f"weight {t['weight']:g}, word bonus {t['word_bonus']:g} (on `{t['on']}`)"


# The build stages of a phone arm's lexicon in the order they run (benchmarks/targets.py build_lexicon_arm)
LEXICON_STAGES = ("lexicon", "shards", "lm", "graph")


def lexicons(arms: dict, demo: str) -> list[str]:
    """The phone arms side by side, one row a lexicon (`demo`'s marked): its phones and entries, the words
    through HLG per split (the seeds' mean, each seed's in brackets), the greedy PER (over that lexicon's
    own phone set), where it was built and each build stage's seconds, and its graph's size."""
    rows = []
    for arm, record in arms.items():
        lexicon = record.get("lexicon")
        if not lexicon:
            continue
        seconds = [f"{key} {lexicon['seconds'][key]:g}" for key in LEXICON_STAGES if key in lexicon["seconds"]]
        built = f"{lexicon['source']}: {', '.join(seconds)}" if seconds else lexicon["source"]
        graph, name = lexicon["graph"], f"`{lexicon['name']}`" + (" (the demo's)" if arm == demo else "")
        rows.append(
            [name, num(lexicon["phones"]), num(lexicon["entries"])]
            + [targets_cell(record, split, key) for _, split, key in LEXICON_COLUMNS]
            + [built, f"{num(graph['states'])} / {num(graph['arcs'])}"]
        )
    headers = ["lexicon", "phones", "entries", *(name for name, _, _ in LEXICON_COLUMNS)]
    return table([*headers, "built, seconds per stage", "HLG states / arcs"], rows)


def targets(r: dict) -> list[str]:
    """benchmarks/targets.py: per split, the char model greedy and with its n-gram, the phone model of
    the demo's lexicon greedy (PER) and through its graph, each the mean of its seeds with every seed's
    in brackets, the share of words each LM lacks and the graph search's real-time factor (the seeds'
    mean); then every lexicon's phone arm; then each model's source, steps and decoding settings."""
    arms, lm = r["arms"], r["lm"]
    column = {"chars": arms["chars"], "phones": arms[r["demo_lexicon"]]}
    # The demo lexicon's own graph (built here or the run's); a record without lexicons has the run's only
    lexicon = column["phones"].get("lexicon") or {"name": r["demo_lexicon"], "graph": r["graph"]}
    graph = lexicon["graph"]
    rows = [
        [f"`{split}`", *(targets_cell(column[arm], split, key) for _, arm, key in TARGETS_COLUMNS)]
        + [pct(column[arm]["mean"][split]["lm_oov_rate"]) for _, arm in TARGETS_OOV]
        + [num(column["phones"]["mean"][split].get("decode_rtf_lm"), 3)]
        for split in r["splits"]
    ]
    seeds = "; ".join(f"`{arm}` {', '.join(map(str, record['seeds']))}" for arm, record in arms.items())
    out = [
        f"Seeds: {seeds}. The n-gram (order {lm['order']}) of {num(lm['text']['sentences'])} sentences and "
        f"{num(lm['text']['vocabulary_size'])} words; the phones: `{lexicon['name']}`, the demo's lexicon, "
        f"whose graph has {num(graph['words'])} entries in its word table, {num(graph['states'])} states, "
        f"{num(graph['arcs'])} arcs.",
        "",
    ]
    headers = ["split", *(name for name, _, _ in TARGETS_COLUMNS), *(name for name, _ in TARGETS_OOV)]
    out += table([*headers, "HLG search RTF"], rows)
    out += lexicons(arms, r["demo_lexicon"])
    models = [
        [f"`{arm}`", seed, TARGETS_SOURCES.get(run["source"], run["source"]), num(run["steps"])]
        + [targets_settings(record["targets"], run)]
        for arm, record in arms.items()
        for seed, run in record["runs"].items()
    ]
    return out + table(["arm", "seed", "model", "steps", "decoding settings"], models)
