"""Formatting for docs/benchmarks.md (benchmarks/report.py): percentages, numbers, markdown tables,
and the provenance line that says which commit, date, machine, command and seeds made a file."""

from __future__ import annotations


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
        flags = ", ".join(machine["flags"]) or "none of avx2, avx512f, avx512_bf16, amx_bf16"
        avx = f"flags: {flags}; oneDNN: {machine.get('onednn', 'default')}"
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
