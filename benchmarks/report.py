"""docs/benchmarks.md from benchmarks/results/*.json: every table, its provenance and its plots.

    python benchmarks/report.py [--results benchmarks/results] [--out docs/benchmarks.md]

(`make bench-report`.) Every figure on the page comes from a JSON file; the page's texts around the
tables live in the template benchmarks/page.md.j2 and hold no figures. tests/test_docs.py fails when
the committed page differs from what this program makes of the committed JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import jinja2

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.report_format import provenance  # noqa: E402
from benchmarks.report_levers import levers  # noqa: E402
from benchmarks.report_recognition import (  # noqa: E402
    lm_decoding,
    reference_asr,
    targets,
    text_levers,
    voice_levers,
    voice_warp,
)
from benchmarks.report_runs import convergence, demo, faults, time_to_accuracy  # noqa: E402
from benchmarks.report_speed import input_pipeline, serving, speedup_model, straggler, throughput  # noqa: E402
from benchmarks.report_tts import tts_durations, tts_levers, tts_seed_levers, tts_seeds  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
PAGE = ROOT / "docs" / "benchmarks.md"
TEMPLATE = Path(__file__).resolve().with_name("page.md.j2")
PROSE = jinja2.Environment(
    loader=jinja2.FileSystemLoader(TEMPLATE.parent), keep_trailing_newline=True, undefined=jinja2.StrictUndefined
).get_template(TEMPLATE.name)
# The template's macros: each section's texts.
MACROS = PROSE.make_module({"sections": [], "results": ""})


class Section(NamedTuple):
    """A results file's section: its heading, what it measures and what to read from its table (both from
    page.md.j2, without figures: those are in the table), and its renderer of the JSON into markdown lines."""

    title: str
    what: str
    renderer: Callable[[dict], list[str]]
    read: str


def section(name: str, title: str, renderer: Callable[[dict], list[str]]) -> Section:
    """`name`'s section, its texts the template's `<stem>_what` and `<stem>_read` macros joined into one line."""
    stem = Path(name).stem
    missing = [f"{stem}_{part}" for part in ("what", "read") if not hasattr(MACROS, f"{stem}_{part}")]
    if missing:
        raise ValueError(f"{TEMPLATE}: no macro {' or '.join(missing)} for {name}'s section: add it")
    what, read = (" ".join(str(getattr(MACROS, f"{stem}_{part}")()).split()) for part in ("what", "read"))
    return Section(title, what, renderer, read)


# One section per results file, in the page's order.
SECTIONS: dict[str, Section] = {
    name: section(name, title, renderer)
    for name, title, renderer in [
        ("demo.json", "The demo", demo),
        ("reference_asr.json", "An off-the-shelf recognizer beside ours", reference_asr),
        ("voice_levers.json", "Held-out speakers: the corpus' natural share and the augmentations", voice_levers),
        ("text_levers.json", "Open English: the acoustic recipe on sentences no grammar made", text_levers),
        ("lm_decoding.json", "Decoding with a word LM", lm_decoding),
        ("targets.json", "Characters against phones, and the lexicons", targets),
        ("tts_seeds.json", "Synthesis: the mean of its seeds", tts_seeds),
        ("tts_seed_levers.json", "Synthesis: levers, three seeds each", tts_seed_levers),
        ("tts_durations.json", "Synthesis: what each part costs", tts_durations),
        ("time_to_accuracy.json", "Time to accuracy", time_to_accuracy),
        ("levers.json", "Levers: what chose the demo configs", levers),
        ("voice_warp.json", "Held-out voices: vocal-tract length", voice_warp),
        ("input_pipeline.json", "Input pipeline", input_pipeline),
        ("throughput.json", "Training throughput", throughput),
        ("lstm_paths.json", "The acoustic model's LSTM path on a CPU", throughput),
        ("speedup_model.json", "Speedup model", speedup_model),
        ("straggler.json", "Straggler", straggler),
        ("straggler_repeat.json", "Straggler: the gossip variants again", straggler),
        ("convergence.json", "Convergence", convergence),
        ("faults.json", "Faults", faults),
        ("serving.json", "Serving under load", serving),
        ("tts_levers.json", "Synthesis: what limits intelligibility", tts_levers),
    ]
}


def slug(title: str) -> str:
    """GitHub's anchor for a heading."""
    text = title.strip().lower().replace("`", "")
    return "".join(c for c in text if c.isalnum() or c in " -_").replace(" ", "-")


def body(name: str, data: dict, results_dir: Path, page: Path) -> str:
    """A section's figures: its provenance, its renderer's tables and its plots, in markdown."""
    lines = provenance(data.get("meta"), data) + SECTIONS[name].renderer(data)
    for plot in (results_dir / f"{Path(name).stem}{suffix}.png" for suffix in ("", "_dev")):
        if plot.is_file():
            lines += [f"![{SECTIONS[name].title}]({os.path.relpath(plot, page.parent)})", ""]
    return "\n".join(lines)


def render(results_dir: Path, page: Path) -> str:
    """The page for the JSON files in `results_dir`; links are relative to `page`'s directory."""
    files = sorted(results_dir.glob("*.json"))
    unknown = [f.name for f in files if f.name not in SECTIONS]
    if unknown:
        raise ValueError(
            f"{', '.join(unknown)}: add a section for each to SECTIONS in benchmarks/report.py and its texts to "
            "benchmarks/page.md.j2"
        )
    sections = [
        {
            "title": SECTIONS[name].title,
            "anchor": slug(SECTIONS[name].title),
            "what": SECTIONS[name].what,
            "body": body(name, json.loads((results_dir / name).read_text()), results_dir, page),
            "read": SECTIONS[name].read,
        }
        for name in SECTIONS
        if (results_dir / name).is_file()
    ]
    text = PROSE.render(sections=sections, results=os.path.relpath(results_dir, page.parent))
    return text.rstrip() + "\n"


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
