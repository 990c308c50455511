"""What every stage's command line shares, so the stages' flags do not drift apart.

Every stage has `--config FILE.yaml` and repeatable `--set KEY=VALUE` for its frozen config
dataclass, `--jobs N` where it runs worker processes, and reports a user's mistake as one
`error: ...` line and exit status 1 instead of a traceback.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path


def split_assignment(item: str, flag: str) -> tuple[str, str]:
    """`"name=value"` -> `("name", "value")`; ValueError naming `flag` when there is no `=` or no name."""
    key, sep, value = item.partition("=")
    if not sep or not key.strip():
        raise ValueError(f"{flag} expects KEY=VALUE, got {item!r}")
    return key.strip(), value


def parse_pairs(items: Sequence[str], flag: str, identifiers: bool = False) -> dict[str, str]:
    """Repeated `KEY=VALUE` flags -> a dict; a key given twice is an error. `identifiers`: keys must
    be Python identifiers (split names)."""
    pairs: dict[str, str] = {}
    for item in items:
        key, value = split_assignment(item, flag)
        if identifiers and not key.isidentifier():
            raise ValueError(f"{flag} {item!r}: names are letters, digits and underscores")
        if key in pairs:
            raise ValueError(f"{flag} names {key!r} twice")
        pairs[key] = value
    return pairs


def add_config_arguments(parser: argparse.ArgumentParser, config_name: str) -> None:
    """`--config FILE.yaml` and repeatable `--set KEY=VALUE` for the stage's `config_name` dataclass."""
    parser.add_argument("--config", type=Path, help=f"YAML file with {config_name} fields")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help=f"override a {config_name} field (repeatable), e.g. --set a.b=3",
    )


def add_jobs_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--jobs", type=int, help="worker processes (default: one per CPU)")


def add_progress_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def run(main: Callable[[], int | None]) -> int:
    """Runs a stage's body; a ValueError or FileNotFoundError (a user's mistake, with its fix in the
    message) becomes one `error: ...` line on stderr and exit status 1."""
    try:
        return main() or 0
    except (ValueError, FileNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
