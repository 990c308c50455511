"""Small file-system helpers every stage uses to be safe to re-run.

Stages write to a temporary name and rename into place (a rename within one directory is atomic
on POSIX), and skip work whose done-marker records the same input fingerprint.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any


def atomic_write_text(path: Path, text: str) -> None:
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)


def atomic_write_json(path: Path, value: Any) -> None:
    atomic_write_text(path, json.dumps(value, indent=2, sort_keys=True) + "\n")


def read_json(path: Path) -> Any | None:
    """The JSON in `path`, or None when it is absent or unreadable (a half-written marker)."""
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def file_sha256(path: Path, chunk: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def fingerprint_files(paths: Iterable[Path], content: bool = True) -> str:
    """A hash over files: their bytes (`content`), or only name, size and mtime (cheap, for audio)."""
    digest = hashlib.sha256()
    for path in sorted(Path(p) for p in paths):
        digest.update(str(path.name if content else path).encode())
        if not path.exists():
            digest.update(b"<absent>")
        elif content:
            digest.update(file_sha256(path).encode())
        else:
            stat = path.stat()
            digest.update(f"{stat.st_size}:{stat.st_mtime_ns}".encode())
    return digest.hexdigest()[:16]


def code_version(*modules: Any) -> str:
    """Hash of the source files of `modules`: a stage's outputs are stale when its code changes."""
    digest = hashlib.sha256()
    for module in modules:
        digest.update(Path(module.__file__).read_bytes())
    return digest.hexdigest()[:16]


def config_hash(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()[:16]


def slug(text: str, max_len: int, dns: bool = False) -> str:
    """A short, safe name made from free text (an Airflow run id), with a hash of the text when changed.

    `dns=False`: a file name (letters, digits, `._-`; other runs become `_`), e.g.
    `manual__2026-01-01T00:00:00.123456+00:00` -> `manual__2026-01-01T00_00_00-1a2b3c4d`.
    `dns=True`: a Kubernetes name (a DNS label: lower case, digits and `-`, starting with a letter).
    The hash keeps texts that differ only in dropped characters apart.
    """
    if dns:
        name = re.sub(r"-{2,}", "-", re.sub(r"[^a-z0-9-]+", "-", text.lower())).strip("-")
        if not name or not name[0].isalpha():
            name = f"x-{name}"
        fill = "-"
    else:
        name = re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("._") or "run"
        fill = "._"
    if name == text and len(name) <= max_len:
        return name
    digest = hashlib.sha256(text.encode()).hexdigest()[:8]
    return f"{name[: max_len - 9].rstrip(fill)}-{digest}"
