"""The reader's path from `python -m models.train` to the gradient is short on every path: on the
first call of the task's loss, the stack holds `main` (models/train.py) and at most four more frames
of this repository's code, for the plain step, the fused step and an elastic run alike. The
horovodrun tests of tests/test_train.py run their ranks through this module's `__main__`, which
records the same for every rank (the ranks other than 0 included) and leaves the check to them.

    python -m tests.test_trainer_path OUT_DIR models.train-ARGS...   # OUT_DIR/rank-N.json per rank
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from pathlib import Path

import pytest

from tests.conftest import CONFIGS, ROOT

MOST_BELOW_MAIN = 4  # frames of this repository's code between models/train.py main and the task's loss


def frames_below_main(stack: list[traceback.FrameSummary]) -> list[str]:
    """`file:function` of each frame of this repository's code (not of its virtual environments)
    after models/train.py `main` in `stack`, the recording frame itself left out."""
    mains = [i for i, f in enumerate(stack) if f.name == "main" and f.filename == str(ROOT / "models" / "train.py")]
    assert mains, "the stack holds no models/train.py main"
    ours = []
    for frame in stack[mains[-1] + 1 : -1]:
        path = Path(frame.filename).resolve()
        if path.is_relative_to(ROOT) and not path.relative_to(ROOT).parts[0].startswith(".venv"):
            ours.append(f"{path.relative_to(ROOT)}:{frame.name}")
    return ours


def record_first_loss(record) -> None:
    """Wraps the loss of every registered model's task: its first call hands the stack to `record`."""
    from common import catalog

    called = []
    for name in catalog.models():
        task_class = catalog.task_class(name)

        def loss(self, *args, _original=task_class.loss, **kwargs):
            if not called:
                called.append(True)
                record(frames_below_main(traceback.extract_stack()))
            return _original(self, *args, **kwargs)

        task_class.loss = loss


def run_recorded(argv: list[str]) -> tuple[int, list[list[str]]]:
    """`models.train` main on `argv` in this process, with the frames of each first loss call."""
    from models import train

    seen: list[list[str]] = []
    record_first_loss(seen.append)
    return train.main(argv), seen


@pytest.fixture
def restore_losses():
    from common import catalog

    saved = {name: catalog.task_class(name).loss for name in catalog.models()}
    yield
    for name, loss in saved.items():
        catalog.task_class(name).loss = loss


@pytest.mark.parametrize(
    "extra",
    [[], ["--set", "strategy.fused_step=true"], ["--elastic"]],
    ids=["plain", "fused", "elastic"],
)
def test_main_reaches_the_loss_in_a_few_calls(extra, tiny_shards, tmp_path, mlflow_uri, restore_losses):
    config = ["--config", str(CONFIGS / "tiny_asr.yaml"), "--max-steps", "2", "--set", "log_model=false"]
    argv = ["--shards", str(tiny_shards), "--workdir", str(tmp_path / "w"), *config, *extra]
    status, seen = run_recorded(argv)
    assert status == 0 and seen, "the run trained"
    frames = seen[0]
    assert len(frames) <= MOST_BELOW_MAIN, frames
    assert frames[0] == "models/training/loop.py:train", frames
    assert frames[-1] in ("models/training/step.py:compute", "models/training/step.py:fused"), frames


def check_ranks(out: Path, ranks: int) -> None:
    """What `__main__` recorded under horovodrun: every rank reached its loss within the bound."""
    for rank in range(ranks):
        frames = json.loads((out / f"rank-{rank}.json").read_text())
        assert len(frames) <= MOST_BELOW_MAIN, (rank, frames)


def _probe(out: Path, argv: list[str]) -> int:
    out.mkdir(parents=True, exist_ok=True)
    rank = os.environ.get("HOROVOD_RANK", "0")

    def record(frames: list[str]) -> None:
        (out / f"rank-{rank}.json").write_text(json.dumps(frames))

    record_first_loss(record)
    from models import train

    return train.main(argv)


if __name__ == "__main__":
    sys.exit(_probe(Path(sys.argv[1]), sys.argv[2:]))
