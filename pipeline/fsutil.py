"""Small file-system helpers every stage uses to be safe to re-run.

Stages write to a temporary name and rename into place (a rename within one directory is atomic
on POSIX), and skip work whose done-marker records the same input fingerprint.
"""

from __future__ import annotations

import hashlib
import json
import os
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
