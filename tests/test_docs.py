"""The documentation: docs/benchmarks.md is what `make bench-report` makes of the committed JSON,
every relative link in the README and docs/ resolves, and the benchmarks record their provenance."""

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
        "docs/benchmarks.md differs from what benchmarks/report.py makes of benchmarks/results/: run `make bench-report`"
    )


def test_the_report_refuses_a_results_file_it_has_no_section_for(tmp_path):
    (tmp_path / "new_benchmark.json").write_text("{}")
    with pytest.raises(ValueError, match="new_benchmark.json: add a section"):
        report.render(tmp_path, ROOT / "docs" / "benchmarks.md")


def test_the_report_texts_hold_no_figures():
    """Figures come from the JSON; the fixed texts kept in report.py only say what to read."""
    for name, (_, what, _, analysis) in report.SECTIONS.items():
        for text in (what, analysis):
            # A number standing alone is a figure; one inside a name (float32, bfloat16) is not.
            figure = re.search(r"(?<![\w.])\d[\d,.]*%?(?!\w)", re.sub(r"`[^`]*`", "", text))
            assert not figure, f"{name}: a figure ({figure.group()}) in a fixed text: {text}"


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


def test_the_readme_quotes_only_figures_the_benchmarks_page_has():
    page = (ROOT / "docs" / "benchmarks.md").read_text()
    readme = (ROOT / "README.md").read_text()
    quoted = re.findall(r"\d+(?:\.\d+)?%|\d+\.\d+ minutes", readme)
    assert quoted, "the README quotes no figure: this test checks nothing"
    missing = [q for q in quoted if q.split()[0] not in page]
    assert not missing, f"figures in the README that docs/benchmarks.md lacks: {missing}"
    assert readme.count("docs/benchmarks.md") >= 2


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
