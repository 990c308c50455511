"""Print every function over 60 lines outside the tests; exit 1 when there is one.

The house style's limit (a function fits on a screen). CI runs it: `python scripts/long_functions.py`.
"""

import argparse
import ast
import subprocess
import sys
from pathlib import Path

LIMIT = 60


def tracked_sources(root: Path) -> list[Path]:
    """The repository's Python files outside tests/, as git lists them."""
    names = subprocess.run(
        ["git", "ls-files", "*.py"], cwd=root, capture_output=True, text=True, check=True
    ).stdout.split()
    return [root / name for name in names if not name.startswith("tests/")]


def long_functions(path: Path, limit: int = LIMIT) -> list[tuple[int, str, int]]:
    """(line, qualified name, length) of each function in `path` longer than `limit` lines."""
    found: list[tuple[int, str, int]] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                name = f"{prefix}{child.name}"
                start = min([d.lineno for d in child.decorator_list] + [child.lineno])
                length = child.end_lineno - start + 1
                if length > limit:
                    found.append((start, name, length))
                visit(child, f"{name}.")
            elif isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")

    visit(ast.parse(path.read_text(), filename=str(path)), "")
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=int, default=LIMIT, help="the most lines a function may have")
    args = parser.parse_args(argv)
    root = Path(__file__).resolve().parent.parent
    rows = [
        (path.relative_to(root), line, name, length)
        for path in tracked_sources(root)
        for line, name, length in long_functions(path, args.limit)
    ]
    for path, line, name, length in sorted(rows, key=lambda row: -row[3]):
        print(f"{path}:{line} {name} {length} lines")
    print(f"{len(rows)} functions over {args.limit} lines", file=sys.stderr)
    return 1 if rows else 0


if __name__ == "__main__":
    sys.exit(main())
