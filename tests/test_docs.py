"""The documentation: docs/benchmarks.md is what `make bench-report` makes of the committed JSON,
every relative link in the README and docs/ resolves, the benchmarks record their provenance, and the
manual (README.md, docs/*.md but the generated page) holds no measured figure nor history."""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import pytest

from benchmarks import harness, report
from tests.conftest import ROOT

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "k8s" / "README.md"]
# [text](target) and ![alt](target); the target ends at whitespace or the closing parenthesis.
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def test_the_benchmarks_page_is_what_the_report_makes_of_the_committed_json(tmp_path):
    out = tmp_path / "benchmarks.md"
    assert report.main(["--out", str(out)]) == 0
    assert out.read_text() == (ROOT / "docs" / "benchmarks.md").read_text(), (
        "docs/benchmarks.md differs from what benchmarks/report.py makes of benchmarks/results/:"
        " run `make bench-report`"
    )


def test_the_report_refuses_a_results_file_it_has_no_section_for(tmp_path):
    (tmp_path / "new_benchmark.json").write_text("{}")
    with pytest.raises(ValueError, match="new_benchmark.json: add a section"):
        report.render(tmp_path, ROOT / "docs" / "benchmarks.md")


def fixed_texts() -> dict[str, str]:
    """The page's texts that no results file fills: each string of a report.SECTIONS entry, and the prose
    of the page's templates (benchmarks/*.j2) with their tags, comments and links' targets left out."""
    texts = {
        f"SECTIONS[{name!r}][{index}]": part
        for name, section in report.SECTIONS.items()
        for index, part in enumerate(section)
        if isinstance(part, str)
    }
    for template in sorted((ROOT / "benchmarks").glob("*.j2")):
        prose = re.sub(r"\{#.*?#\}|\{%.*?%\}|\{\{.*?\}\}", "", template.read_text(), flags=re.S)
        texts[template.name] = re.sub(r"\]\([^)]*\)", "]", re.sub(r"```.*?```", "", prose, flags=re.S))
    return texts


def test_the_report_texts_hold_no_figures():
    """Figures come from the JSON; the fixed texts of the page only say what to read."""
    texts = fixed_texts()
    assert texts, "no fixed text found: this test checks nothing"
    for where, text in texts.items():
        # A number standing alone is a figure; one inside a name (float32, bfloat16) is not.
        figure = re.search(r"(?<![\w.])\d[\d,.]*%?(?!\w)", re.sub(r"`[^`]*`", "", text))
        assert not figure, f"{where}: a figure ({figure.group()}) in a fixed text: {text[:300]}"


def test_every_results_file_says_where_its_figures_come_from():
    for path in sorted((ROOT / "benchmarks" / "results").glob("*.json")):
        meta = json.loads(path.read_text()).get("meta")
        assert meta, f"{path.name} has no meta"
        assert re.fullmatch(r"[0-9a-f]{40}(-dirty)?", meta["commit"]), path.name
        assert meta["date"] and "machine" in meta and "command" in meta and "seeds" in meta, path.name
        assert meta["machine"] is not None or meta.get("provenance"), f"{path.name}: no machine and no provenance"


def machines_of(data: dict) -> list:
    """The machine records a results file holds: its own, or (a file gathered from several runs) each run's."""
    if (data.get("meta") or {}).get("machine") is not None:
        return [data["meta"]["machine"]]
    runs = data.get("runs")
    return [(run.get("meta") or {}).get("machine") for run in runs.values()] if isinstance(runs, dict) else []


def names_a_machine(machine) -> bool:
    """CPU model, cores and flags (files from before the flags were recorded: whether it had AVX-512)."""
    return (
        isinstance(machine, dict)
        and bool(machine.get("cpu_model"))
        and bool(machine.get("cores"))
        and ("flags" in machine or "avx512" in machine)
    )


def test_every_results_file_names_its_machine():
    for path in sorted((ROOT / "benchmarks" / "results").glob("*.json")):
        machines = machines_of(json.loads(path.read_text()))
        assert machines and all(names_a_machine(m) for m in machines), (
            f"{path.name} names no machine (CPU model, cores, flags): measure it again with its benchmark "
            "(benchmarks/harness.py's write_json records the machine)"
        )


def test_a_results_file_without_a_machine_is_caught():
    recorded = {"cpu_model": "AMD EPYC", "cores": 2, "flags": ["avx2"]}
    assert names_a_machine(machines_of({"meta": {"machine": recorded}})[0])
    assert machines_of({"meta": {"machine": None}}) == []
    assert not names_a_machine({"cpu_model": "AMD EPYC", "cores": 2})  # no flags
    gathered = {"meta": {"machine": None}, "runs": {"a": {"meta": {"machine": recorded}}, "b": {"meta": {}}}}
    assert [names_a_machine(m) for m in machines_of(gathered)] == [True, False]


def test_write_json_records_commit_date_machine_command_and_seeds(tmp_path, monkeypatch):
    argv = [str(ROOT / "benchmarks" / "straggler.py"), "--epochs", "2", "--shards", "/data/elsewhere"]
    argv += ["--lever", "no skips (with the refit)"]
    monkeypatch.setattr(sys, "argv", [*argv, "--json", str(ROOT / "benchmarks" / "results" / "x.json")])
    out = tmp_path / "straggler.json"
    harness.write_json(out, {"epochs": 2}, seeds={"synthetic_shards": 0, "training": 0})
    meta = json.loads(out.read_text())["meta"]
    assert re.fullmatch(r"[0-9a-f]{40}(-dirty)?", meta["commit"])
    assert meta["date"].endswith("+00:00")
    assert meta["machine"]["cores"] == os.cpu_count() and isinstance(meta["machine"]["avx512"], bool)
    # the program and the repository's files as repository paths, the machine's other paths hidden,
    # quoted as a shell would need (an argument with spaces reads back as one)
    assert meta["command"] == (
        "benchmarks/straggler.py --epochs 2 --shards PATH --lever 'no skips (with the refit)' "
        "--json benchmarks/results/x.json"
    )
    assert meta["seeds"] == {"synthetic_shards": 0, "training": 0}
    # A file written this way renders with its machine, not "not recorded".
    line = report.provenance(meta, {})[0]
    assert f"{meta['machine']['cores']} cores" in line and "not recorded" not in line


def slug(heading: str) -> str:
    """GitHub's anchor for a markdown heading."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip().lower()).replace("`", "")
    return "".join(c for c in text if c.isalnum() or c in " -_").replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)  # no headings inside code blocks
    return {slug(m) for m in re.findall(r"^#{1,6} (.+)$", text, re.M)}


def links(page: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    text = re.sub(r"`[^`\n]*`", "", text)  # nor in inline code
    return LINK.findall(text)


def test_every_relative_link_in_the_readme_and_docs_resolves():
    broken = []
    for page in PAGES:
        for target in links(page):
            if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
                continue
            path, _, anchor = target.partition("#")
            resolved = (page.parent / path).resolve() if path else page
            if not resolved.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such file)")
            elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such heading)")
    assert not broken, "\n".join(broken)


def test_the_link_check_sees_links_and_headings():
    """A link checker that finds nothing passes everything: it must see the README's links."""
    targets = links(ROOT / "README.md")
    assert "docs/benchmarks.md#the-demo" in targets and "k8s/README.md" in targets
    assert "the-demo" in anchors(ROOT / "docs" / "benchmarks.md")
    assert slug("Cluster mode (`execution_mode=kubernetes`)") == "cluster-mode-execution_modekubernetes"


# The manual's pages: what the project does and how to run it. Measured figures live on the generated page.
MANUAL = [ROOT / "README.md", *(p for p in sorted((ROOT / "docs").glob("*.md")) if p.name != "benchmarks.md")]
# A measured figure, as the manual would quote one: a percentage, a speed, a ratio of speeds, a timing in
# decimal minutes, a CPU model.
FIGURE = re.compile(
    r"\d(?:[\d,.]*\d)?\s?%"
    r"|\b\d+(?:\.\d+)?\s?(?:steps|frames|utterances)/s\b"
    r"|\b\d+\.\d+x\b"
    r"|\b\d+\.\d+ min(?:utes)?\b"
    r"|\b(?:EPYC|Xeon|Ryzen|Core i[3579]|AVX-512)\b"
)
# History: an issue number (`#123`, `owner/repo#123`; not a link's `#1-images` anchor), a commit id,
# words that tell what the code did before.
HISTORY = re.compile(
    r"(?:\b[\w.-]+/[\w.-]+|(?<![\w-]))#\d+(?![\w-])"
    r"|\b(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}\b"
    r"|\b(?:until now|earlier release|for one release|no longer)\b",
    re.I,
)


def prose(text: str) -> str:
    """The text outside code: fenced blocks and `inline code` blanked out, its lines kept in place."""
    text = re.sub(r"```.*?```", lambda m: re.sub(r"[^\n]", " ", m.group()), text, flags=re.S)
    return re.sub(r"`[^`\n]*`", lambda m: " " * len(m.group()), text)


def figures_in(text: str, pattern: re.Pattern = FIGURE) -> list[str]:
    """`line N: match` for every match of `pattern` in the prose of a page.

    The rule: outside code, the manual quotes no measured figure. A setting or a default is written as
    code (`0.05`, `stretch_range=(90, 130)`) or as a plain count or duration it configures (2500
    utterances, 30 s), which this pattern does not read as a figure; a percentage, a speed (steps/s), a
    ratio like 1.23x, decimal minutes or a CPU model in prose is a measurement, and belongs on
    docs/benchmarks.md, which the manual links by section."""
    return [
        f"line {number}: {match.group()}"
        for number, line in enumerate(prose(text).splitlines(), 1)
        for match in pattern.finditer(line)
    ]


def test_the_manual_quotes_no_measured_figure_and_no_history():
    found = [
        f"{page.relative_to(ROOT)} {where}"
        for page in MANUAL
        for pattern in (FIGURE, HISTORY)
        for where in figures_in(page.read_text(), pattern)
    ]
    assert not found, (
        "the manual quotes measured figures or history; link the benchmarks page's section instead "
        "(benchmarks.md#SECTION), write a setting as code:\n" + "\n".join(found)
    )


def test_the_figure_check_finds_figures_and_passes_settings():
    """A check that finds nothing passes everything: it must catch a figure in a doc."""
    measured = "CER 1.8% against 2.6%; 4.47 steps/s bound; a step 1.23x as fast; 19.4 minutes on an AMD EPYC"
    assert [w.split(": ")[1] for w in figures_in(measured)] == [
        "1.8%",
        "2.6%",
        "4.47 steps/s",
        "1.23x",
        "19.4 minutes",
        "EPYC",
    ]
    assert figures_in("a\n\nthe held-out voices 23.5%") == ["line 3: 23.5%"]
    settings = (
        "more than `--max-rejected-fraction` (default `0.05`); 2500 utterances, retries from 30 s, 8 shards;\n"
        "```bash\nmake demo  # 12% in a code block is the command's, not a quote\n```\n`%WER 12.00 [ 30 / 250 ]`"
    )
    assert figures_in(settings) == []
    assert figures_in("Horovod 0.28.1 (horovod/horovod#4021), from 8693aef", HISTORY) == [
        "line 1: horovod/horovod#4021",
        "line 1: 8693aef",
    ]
    assert figures_in("[Images](../k8s/README.md#1-images), sha256 of the text", HISTORY) == []


def section(text: str, heading: str) -> str:
    """The lines under `heading` up to the next heading of its level or above, blank ends stripped."""
    level = heading.split(" ", 1)[0]
    body = text.split(f"\n{heading}\n", 1)[1]
    return re.split(rf"\n#{{1,{len(level)}}} ", body, maxsplit=1)[0].strip("\n")


def test_the_readme_is_a_short_manual_with_one_link_for_the_demos_figures():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 150, "README.md over 150 lines: move the detail to docs/"
    assert "\n## The demo\n" in readme, "README.md has no '## The demo' section: update this test with it"
    demo = section(readme, "## The demo")
    assert len(demo.splitlines()) <= 10, f"the demo section is {len(demo.splitlines())} lines, at most 10"
    assert LINK.findall(demo) == ["docs/benchmarks.md#the-demo"], "the demo section links the page, once, and only it"


@pytest.mark.parametrize(
    "program",
    [p.name for p in sorted((ROOT / "benchmarks").glob("*.py")) if "def main(" in p.read_text()],
)
def test_every_benchmark_program_runs_as_a_script(program, monkeypatch, capsys):
    """`python benchmarks/NAME.py --help` prints its usage: the program calls its main() when run."""
    import runpy

    monkeypatch.setattr(sys, "argv", [str(ROOT / "benchmarks" / program), "--help"])
    with pytest.raises(SystemExit) as exit_:
        runpy.run_path(str(ROOT / "benchmarks" / program), run_name="__main__")
    assert exit_.value.code == 0
    assert capsys.readouterr().out.startswith(f"usage: {program}")
