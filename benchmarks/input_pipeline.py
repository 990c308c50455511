"""Input pipeline benchmark: the seed-style trainloader against our tf.data pipeline over the shards.

    python benchmarks/input_pipeline.py [--json out.json] [--tiny] [--workdir DIR]

The research behind this project found its GPUs idle because the data loader, at the start of
every epoch, read every utterance with kaldiio and sorted the corpus by length, then padded each
batch with numpy inside the training loop. For each loader, one process on this machine's cores,
from the page cache, this measures:
- steady-state throughput alone (frames/s over two epochs after a warm-up epoch) at the batch
  shape of one GPU (256 utterances of up to 375 frames);
- time to the first batch, on a demo-sized corpus and on a large one (100,000 utterances of
  compressed matrices, as Kaldi's make_fbank.sh stores them);
- the utilization of consumers that need a fixed time per batch, SIMULATED BY SLEEPING: busy time
  over wall time, where busy is every moment the consumer is not blocked waiting for the loader:
  `cpu` (a CPU training step: 6,000 frames every 20 ms), and two calibrated on an H100 running the
  demo acoustic model in bf16 (../shared/gpu-calibration.md): `gpu_b256` (96,000 frames every 26 ms)
  and `gpu_b1024` (384,000 frames every 37 ms).
Both loaders get the same frame budget and batch cap. Our loader hands over what the training step
reads (8-bit codes padded per length class, with each utterance's affine to normalized log-mel);
the seed-style loader hands over unnormalized float32 padded with numpy.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import report_speed  # noqa: E402
from benchmarks.harness import write_json  # noqa: E402
from pipeline import dataset, records, shards  # noqa: E402


def write_corpus(root: Path, utterances: int, mean_frames: int, compress: bool, seed: int = 0) -> Path:
    """A Kaldi data dir of random 80-dim features (float32, or Kaldi-compressed 'CM')."""
    import kaldiio

    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    # A few hundred distinct matrices, reused: the content does not matter, only sizes and reads.
    pool = [
        rng.normal(size=(max(20, int(n)), 80)).astype(np.float32)
        for n in rng.normal(mean_frames, mean_frames / 3, size=min(utterances, 300))
    ]
    ids = [f"spk{i % 40:02d}-utt{i:07d}" for i in range(utterances)]
    with kaldiio.WriteHelper(
        f"ark,scp:{root / 'feats.ark'},{root / 'feats.scp'}", compression_method=2 if compress else None
    ) as w:
        for i, utt in enumerate(ids):
            w(utt, pool[i % len(pool)])
    words = ["turn", "on", "the", "lights", "in", "oslo"]
    (root / "text").write_text("".join(f"{u} {' '.join(words[: 2 + i % 5])}\n" for i, u in enumerate(ids)))
    (root / "utt2spk").write_text("".join(f"{u} {u.split('-')[0]}\n" for u in ids))
    return root


class SeedLoader:
    """The research's trainloader: every epoch, read all of feats.scp with kaldiio, sort by length,
    then cut and pad batches with numpy, synchronously, when the training loop asks."""

    def __init__(self, feats_scp: Path, frames_per_batch: int, max_batch_size: int):
        self.feats_scp, self.budget, self.max_batch = str(feats_scp), frames_per_batch, max_batch_size

    def epoch(self):
        import kaldiio

        utterances = [(utt, matrix) for utt, matrix in kaldiio.load_scp(self.feats_scp).items()]
        utterances.sort(key=lambda item: len(item[1]))
        batch: list = []
        for item in utterances:
            longest = max(len(item[1]), *(len(m) for _, m in batch)) if batch else len(item[1])
            if batch and (longest * (len(batch) + 1) > self.budget or len(batch) == self.max_batch):
                yield self._pad(batch)
                batch = []
            batch.append(item)
        if batch:
            yield self._pad(batch)

    @staticmethod
    def _pad(batch):
        lengths = np.asarray([len(m) for _, m in batch])
        feats = np.zeros([len(batch), lengths.max(), batch[0][1].shape[1]], np.float32)
        for i, (_, matrix) in enumerate(batch):
            feats[i, : len(matrix)] = matrix
        return feats, lengths


def tfdata_epochs(out_dir: Path, cfg: dataset.InputConfig, epochs: int):
    """(an iterator over `epochs` epochs of rank 0 of 1, [batches per epoch]): what the trainer iterates."""
    shard_set = records.open_shard_set(out_dir)
    chained = dataset.chain_epochs(
        lambda e: dataset.asr_dataset(shard_set, "train", cfg, 0, 1, e, True)[0],
        0,
        epochs,
        prefetch=cfg.prefetch_batches,
    )
    batches = dataset.batch_plan(shard_set.split("train"), 1, cfg, training=True).batches
    return iter(chained), [batches] * epochs


def first_batch(make_iterator) -> float:
    start = time.perf_counter()
    next(make_iterator())
    return time.perf_counter() - start


def run_epochs(batches, step_s: float) -> tuple[int, int, float, float]:
    """Consumes batches (sleeping step_s per batch, the simulated accelerator).

    Returns (batches, frames, wall, waiting): `waiting` is the time spent blocked in the loader
    (inside `next`), so the consumer's utilization is (wall - waiting) / wall: the share of the
    wall time it was not starved. (Counting nominal sleeps instead would charge the OS's sleep
    overshoot to the loader.)
    """
    start, count, frames, waiting = time.perf_counter(), 0, 0, 0.0
    iterator = iter(batches)
    while True:
        asked = time.perf_counter()
        try:
            batch = next(iterator)
        except StopIteration:
            waiting += time.perf_counter() - asked
            break
        waiting += time.perf_counter() - asked
        lengths = batch[1] if isinstance(batch, tuple) else batch["feat_lengths"].numpy()
        frames += int(np.sum(lengths))
        count += 1
        if step_s:
            time.sleep(step_s)
    wall = time.perf_counter() - start
    return count, frames, wall, waiting


# consumer -> (frame budget of a batch, most utterances in a batch, seconds per batch)
CONSUMERS = {"cpu": (6000, 64, 0.020), "gpu_b256": (96000, 256, 0.026), "gpu_b1024": (384000, 1024, 0.037)}
GPU_B1024_FRAMES_PER_S = 10.35e6  # the calibration's demand of one GPU at batch 1024


def measure_seed(data_dir: Path, budget: int, max_batch: int, step_s: float, throughput: bool, epochs: int = 2) -> dict:
    """First batch, steady-state frames/s (when `throughput`) and utilization of a `step_s` consumer."""
    loader = SeedLoader(data_dir / "feats.scp", budget, max_batch)
    result = {"first_batch_s": first_batch(loader.epoch)}

    def several():
        for _ in range(epochs):
            yield from loader.epoch()

    if throughput:
        batches, frames, wall, _ = run_epochs(several(), 0.0)
        result["frames_per_s"] = frames / wall
    batches, frames, wall, waiting = run_epochs(several(), step_s)
    result["utilization"] = (wall - waiting) / wall
    result["batches_per_epoch"] = batches // epochs
    return result


def measure_tfdata(out_dir: Path, cfg: dataset.InputConfig, step_s: float, throughput: bool) -> dict:
    iterator, _ = tfdata_epochs(out_dir, cfg, 1)
    for _ in iterator:  # warm-up: builds the graph functions once, fills the page cache
        pass
    result = {"first_batch_s": first_batch(lambda: tfdata_epochs(out_dir, cfg, 1)[0])}
    for key, sleep in (("frames_per_s", 0.0), ("utilization", step_s)):
        if key == "frames_per_s" and not throughput:
            continue
        iterator, counts = tfdata_epochs(out_dir, cfg, 3)
        for _ in range(counts[0]):  # epoch 0 is the warm-up, at the consumer's pace; epochs 1-2 are measured
            next(iterator)
            time.sleep(sleep)
        batches, frames, wall, waiting = run_epochs(iterator, sleep)
        result[key] = frames / wall if key == "frames_per_s" else (wall - waiting) / wall
    result["batches_per_epoch"] = counts[1]
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument("--tiny", action="store_true", help="tiny corpora (for tests)")
    parser.add_argument("--workdir", type=Path, help="where corpora and shards go (default: a temporary directory)")
    parser.add_argument("--medium-utterances", type=int, default=12_000, help="utterances of the GPU-batch corpus")
    parser.add_argument("--large-utterances", type=int, default=100_000, help="utterances of the large corpus")
    args = parser.parse_args(argv)
    from common.runtime import configure_tensorflow

    threads = configure_tensorflow()
    work = args.workdir or Path(tempfile.mkdtemp(prefix="input-bench-"))
    sizes = (
        {"demo": 60, "medium": 300, "large": 400}
        if args.tiny
        else {"demo": 1200, "medium": args.medium_utterances, "large": args.large_utterances}
    )
    consumers = dict(CONSUMERS)
    if args.tiny:  # the same consumers, scaled to corpora of a few hundred utterances
        consumers = {name: (budget // 16, cap // 8, step) for name, (budget, cap, step) in CONSUMERS.items()}
    results: dict = {"tiny": args.tiny, "cores": threads["intra_op_threads"], "consumers": consumers}
    # Which corpus each consumer reads: GPU batches need tens of them per epoch to reach a steady state.
    plan = {"demo": ["cpu"], "medium": ["gpu_b256"], "large": ["gpu_b1024"]}
    try:
        for name, count in sizes.items():
            compress = name == "large"
            print(f"[{name}] writing {count} utterances and sharding them ...", file=sys.stderr, flush=True)
            data = write_corpus(work / name / "data", count, 300, compress)
            manifest = shards.make_shards(
                {"train": data}, work / name / "shards", shards.ShardConfig(num_shards=8), progress=False
            )
            results[f"{name}_utterances"] = count
            results[f"{name}_frames"] = manifest["splits"]["train"]["frames"]
            for consumer in plan[name]:
                budget, cap, step_s = consumers[consumer]
                cfg = dataset.InputConfig(frames_per_batch=budget, max_batch_size=cap, shuffle_buffer=64)
                steady = consumer == "gpu_b256"  # the steady-state throughput is measured at one GPU's batch
                print(f"[{name}] {consumer}: seed-style loader ...", file=sys.stderr, flush=True)
                seed = measure_seed(data, budget, cap, step_s, steady, epochs=1 if compress else 2)
                print(f"[{name}] {consumer}: tf.data ...", file=sys.stderr, flush=True)
                ours = measure_tfdata(work / name / "shards", cfg, step_s, steady)
                for side, measured in (("baseline", seed), ("tfdata", ours)):
                    results[f"{side}_{consumer}_utilization"] = measured["utilization"]
                    results[f"{side}_{consumer}_batches_per_epoch"] = measured["batches_per_epoch"]
                    results[f"{name}_{side}_first_batch_s"] = measured["first_batch_s"]
                    if steady:
                        results[f"{side}_frames_per_s"] = measured["frames_per_s"]
            if name == "large":
                results["baseline_first_batch_s"] = results["large_baseline_first_batch_s"]
                results["tfdata_first_batch_s"] = results["large_tfdata_first_batch_s"]
                if not args.workdir:
                    shutil.rmtree(work / name, ignore_errors=True)
    finally:
        if not args.workdir:
            shutil.rmtree(work, ignore_errors=True)
    results["frames_per_s_per_core"] = results["tfdata_frames_per_s"] / max(1, results["cores"])
    results["gpu_b1024_cores_needed"] = GPU_B1024_FRAMES_PER_S / results["frames_per_s_per_core"]
    record = write_json(args.json, results, seeds={"corpora": 0})
    print("\n".join(report_speed.input_pipeline(record)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
