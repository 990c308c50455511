"""The section of docs/benchmarks.md (benchmarks/report.py) on the levers that chose the demo's
acoustic config: one row per arm with each seed's figures, then the runs that measured them (their
commit, date, machine as their record states it, command and base config), from
benchmarks/results/levers.json."""

from __future__ import annotations

import json

from benchmarks.report_format import num, pct, table, thousands

# An arm's figures beside the CERs, in this order: (key, how one seed's value reads)
EXTRAS = (
    ("dev_cer_at", lambda points: ", ".join(f"dev {cer(c)} at {num(m, 1)} min" for m, c in points)),
    ("frames_per_s_per_rank", lambda v: f"{thousands(v)} frames/s a rank"),
    ("frames_per_s_ratio", lambda v: f"{num(v, 2)}x the kept row's frames a second"),
    ("step_compute_ms", lambda v: f"a step's computation {num(v)} ms"),
    ("loop_seconds", lambda v: f"training loop {num(v)} s"),
)


def cer(value: float) -> str:
    """A CER as the records give it: two decimals below ten percent, one above."""
    return pct(value, 2 if value < 0.1 else 1)


def machine_text(machine: dict | None) -> str:
    """A run's machine as its record states it: `2-core AMD EPYC with avx2, avx512f`."""
    if not machine:
        return "not stated"
    if machine.get("flags") is not None:
        flags = ", ".join(machine["flags"]) or "none of avx2, avx512f, avx512_bf16, amx_bf16"
    else:  # a record that says only whether the CPU has AVX-512
        flags = "AVX-512" if machine.get("avx512") else "no AVX-512"
    cores = f"{machine['cores']}-core " if machine.get("cores") else "cores not stated, "
    return f"{cores}{machine.get('cpu_model') or 'CPU model unknown'} with {flags}"


def _cer(seeds: list[dict], key: str, show=cer) -> str:
    """One seed's CER, or the seeds' mean with each seed's in brackets; "-" where not measured."""
    values = [s.get(key) for s in seeds]
    if any(v is None for v in values):
        return "-"
    if len(values) == 1:
        return show(values[0])
    return f"{show(sum(values) / len(values))} ({' / '.join(show(v) for v in values)})"


def _job_minutes(seed: dict) -> str:
    minutes = seed.get("job_minutes")
    return "" if minutes is None else num(minutes, 1)


def _per_seed(values: list[str]) -> str:
    """Each seed's value, "-" for a seed without one; "" where no seed has one."""
    return " / ".join(v or "-" for v in values) if any(values) else ""


def _also(arm: dict) -> str:
    seeds = arm["seeds"]
    parts = []
    for name, seed in seeds.items():
        text = "; ".join(show(seed[key]) for key, show in EXTRAS if key in seed)
        if text:
            parts.append(f"seed {name}: {text}" if len(seeds) > 1 else text)
    if arm.get("note"):
        parts.append(arm["note"])
    return "; ".join(parts)


def _setting(key: str, value) -> str:
    return f"`{key}={json.dumps(value)}`"


def levers(r: dict) -> list[str]:
    """benchmarks/results/levers.json: a row per arm of each lever, then a row per run they name."""
    runs = r["runs"]
    rows = []
    for lever in r["levers"]:
        for i, arm in enumerate(lever["arms"]):
            seeds = list(arm["seeds"].values())
            settings = ", ".join(_setting(k, v) for k, v in arm["settings"].items())
            by_run = {}  # run -> its seeds, in the arm's seed order
            for name, seed in arm["seeds"].items():
                by_run.setdefault(seed["run"], []).append(name)
            measured = "; ".join(
                f"`{run}`{' (seed ' + ', '.join(names) + ')' if len(by_run) > 1 else ''}, "
                f"{machine_text(runs[run]['meta']['machine'])}"
                for run, names in by_run.items()
            )
            rows.append(
                [
                    f"**{lever['lever']}**" if i == 0 else "",
                    arm["arm"] + (f": {settings}" if settings else ""),
                    f"**{arm['verdict']}**" if arm["verdict"] == "kept" else arm["verdict"],
                    ", ".join(arm["seeds"]),
                    num(arm["steps"]) if "steps" in arm else "",
                    _cer(seeds, "test_cer"),
                    _cer(seeds, "test_engine_cer", lambda v: pct(v, 1)),
                    _cer(seeds, "dev_cer"),
                    _per_seed([_job_minutes(s) for s in seeds]),
                    _also(arm),
                    measured,
                ]
            )
    headers = ["lever", "arm", "verdict", "seeds", "steps", "test CER", "test_engine CER", "dev CER"]
    headers += ["job minutes", "also", "run (see below), machine"]
    out = table(headers, rows)
    rows = [
        [
            f"`{key}`",
            ", ".join(f"`{h[:7]}`" for h in run["recorded_in"]) + f" ({run['source']})",
            f"`{run['meta']['commit'][:7]}`, {run['meta']['date']}",
            run.get("machine_stated") or machine_text(run["meta"]["machine"]),
            run["meta"]["command"] if run["source"] == "commit message" else f"`{run['meta']['command']}`",
            run["base"],
            run.get("note", ""),
        ]
        for key, run in runs.items()
    ]
    out += [
        "The runs (for one recorded in a commit message, the code measured is that commit's, its change "
        "included, unless the message names another, and the date is the commit's):",
        "",
    ]
    return out + table(["run", "recorded in", "code measured, date", "machine", "command", "base config", "note"], rows)
