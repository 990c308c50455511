"""Progress bars that read well in a terminal and in a log file (an Airflow task log, CI).

tqdm redraws its line with carriage returns; a log file keeps none of the redraws apart, so a
whole stage's progress ends up as one endless line that only appears when the stage ends. When
stderr is not a terminal, each update here is its own line, at most every `log_interval` seconds.
"""

from __future__ import annotations

import sys

from tqdm import tqdm


class _LineWriter:
    """Turns tqdm's carriage-return redraws into newline-terminated lines."""

    def __init__(self, stream):
        self.stream = stream

    def write(self, text: str) -> None:
        text = text.replace("\r", "\n").replace("\x1b[A", "")
        if text.strip():
            self.stream.write(text.lstrip("\n").rstrip("\n") + "\n")

    def flush(self) -> None:
        self.stream.flush()


def progress(iterable=None, log_interval: float = 15.0, **kwargs) -> tqdm:
    """`tqdm(iterable, **kwargs)` on stderr; line by line, every `log_interval` s, into logs."""
    stream = sys.stderr
    if not stream.isatty():
        kwargs.setdefault("mininterval", log_interval)
        kwargs.setdefault("maxinterval", log_interval)
        kwargs["file"] = _LineWriter(stream)
        kwargs.setdefault("ascii", True)
    else:
        kwargs.setdefault("file", stream)
    return tqdm(iterable, **kwargs)
