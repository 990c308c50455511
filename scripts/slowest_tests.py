"""The slowest tests of one or more pytest JUnit XML reports (what `.ci/run` prints at its end).

    python scripts/slowest_tests.py build/ci/unit.xml build/ci/e2e.xml [--top 20]

pytest's own `--durations` ranks within one session; CI runs two (unit, then end to end), so this
ranks across both. Standard library only: it runs in any of the project's environments.
"""

from __future__ import annotations

import argparse
import sys
import xml.etree.ElementTree as ET
from pathlib import Path


def slowest(reports: list[Path], top: int) -> list[tuple[float, str]]:
    """(seconds, test id) of the `top` slowest test cases, setup and teardown included."""
    cases = []
    for report in reports:
        for case in ET.parse(report).iter("testcase"):
            name = f"{case.get('classname', '').replace('.', '/')}.py::{case.get('name')}"
            cases.append((float(case.get("time") or 0.0), name))
    return sorted(cases, reverse=True)[:top]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("reports", nargs="+", type=Path)
    parser.add_argument("--top", type=int, default=20)
    args = parser.parse_args(argv)
    reports = [r for r in args.reports if r.is_file()]
    rows = slowest(reports, args.top)
    print(f"{len(rows)} slowest tests ({', '.join(r.name for r in reports)}):")
    for seconds, name in rows:
        print(f"{seconds:8.1f} s  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
