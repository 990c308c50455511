"""A slow worker under synchronous allreduce and under asynchronous gossip (np=2).

    python benchmarks/straggler.py [--json out.json] [--tiny] [--shards DIR]

Trains the acoustic model with `horovodrun -np 2` four times: allreduce and adpsgd, each without
and with a straggler (rank 1 sleeps, every step, as long as one normal step takes). Reports the
fast rank's (rank 0's) throughput with the straggler divided by without. Allreduce makes every
step wait for the slowest rank, so the fast rank drops to about half; gossip never makes a
worker's computation wait, so it should keep most of its speed (the research: >= 0.85).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.harness import asr_setup, print_table, run_training, write_json  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path)
    parser.add_argument("--tiny", action="store_true")
    parser.add_argument("--shards", type=Path)
    parser.add_argument("--steps", type=int, default=40)
    args = parser.parse_args(argv)
    work, config, shards, common = asr_setup(args, "straggler-", tiny_steps=10)

    results: dict = {"tiny": args.tiny, "steps": args.steps if not args.tiny else 10}
    rows = []
    for strategy in ("allreduce", "adpsgd"):
        alone = run_training(shards, work / f"{strategy}-alone", 2, config, common, extra_args=["--strategy", strategy])
        # One normal step of the fast rank, measured without the straggler.
        step_ms = 1000.0 / alone["steps_per_s"]
        slowed = run_training(
            shards,
            work / f"{strategy}-straggler",
            2,
            config,
            common,
            extra_args=["--strategy", strategy, "--straggler-rank", "1", "--straggler-delay-ms", f"{step_ms:.1f}"],
        )
        fast_alone, fast_slowed = alone["per_rank_frames_per_s"][0], slowed["per_rank_frames_per_s"][0]
        ratio = fast_slowed / fast_alone
        results.update(
            {
                f"{strategy}_step_ms": step_ms,
                f"{strategy}_fast_rank_frames_per_s": fast_alone,
                f"{strategy}_fast_rank_frames_per_s_with_straggler": fast_slowed,
                f"{strategy}_slow_rank_frames_per_s_with_straggler": slowed["per_rank_frames_per_s"][1],
                f"{strategy}_fast_rank_ratio": ratio,
                f"{strategy}_ranks_agree": slowed["ranks_agree"],
            }
        )
        rows.append([strategy, step_ms, fast_alone, fast_slowed, slowed["per_rank_frames_per_s"][1], ratio])
    print_table(["strategy", "step (ms)", "fast rank alone", "fast rank, straggler", "slow rank", "ratio"], rows)
    write_json(args.json, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
