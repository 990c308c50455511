"""Training plots that people would rather look at than read (logged to MLflow as artifacts)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def training_plots(history: list[dict], summary: dict, out_dir: Path) -> list[Path]:
    """Loss and learning rate, step-time breakdown, per-rank throughput and memory. Returns the PNGs."""
    out_dir = Path(out_dir)
    paths = []
    if history:
        steps = [h["step"] for h in history]
        fig, ax = plt.subplots(figsize=(7, 4))
        ax.plot(steps, [h["loss"] for h in history], label="loss", color="tab:blue")
        ax.set_xlabel("step")
        ax.set_ylabel("training loss")
        ax.set_yscale("log")
        twin = ax.twinx()
        twin.plot(steps, [h["learning_rate"] for h in history], color="tab:orange", alpha=0.6, label="learning rate")
        twin.set_ylabel("learning rate")
        ax.set_title("Training loss and learning rate")
        fig.legend(loc="upper right")
        paths.append(_save(fig, out_dir / "loss.png"))

        timed = [h for h in history if "time_compute_ms" in h]
        if timed:
            fig, ax = plt.subplots(figsize=(7, 4))
            bottom = [0.0] * len(timed)
            for key, color in (("input", "tab:red"), ("compute", "tab:blue"), ("communication", "tab:green")):
                values = [h.get(f"time_{key}_ms", 0.0) for h in timed]
                ax.bar(
                    [h["step"] for h in timed],
                    values,
                    bottom=bottom,
                    width=max(1, steps[-1] // (2 * len(timed))),
                    label=key,
                    color=color,
                )
                bottom = [b + v for b, v in zip(bottom, values)]
            ax.set_xlabel("step")
            ax.set_ylabel("milliseconds per step")
            ax.set_title("Where each step's time goes (rank 0)")
            ax.legend()
            paths.append(_save(fig, out_dir / "step_time_breakdown.png"))
    ranks = summary.get("per_rank_frames_per_s") or []
    if ranks:
        fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.5))
        names = [str(r) for r in range(len(ranks))]
        left.bar(names, ranks, color="tab:blue")
        left.set_xlabel("rank")
        left.set_ylabel("input frames / s")
        left.set_title("Throughput per rank")
        right.bar(names, summary.get("per_rank_peak_memory_mb", []), color="tab:purple")
        right.set_xlabel("rank")
        right.set_ylabel("MiB")
        right.set_title("Peak memory per rank")
        paths.append(_save(fig, out_dir / "ranks.png"))
    return paths


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
