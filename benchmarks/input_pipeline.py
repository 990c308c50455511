"""Input pipeline benchmark: the seed-style trainloader against our tf.data pipeline over the shards.

    python benchmarks/input_pipeline.py [--json out.json] [--tiny] [--workdir DIR]

The research behind this project found its GPUs idle because the data loader, at the start of
every epoch, read every utterance with kaldiio and sorted the corpus by length, then padded each
batch with numpy inside the training loop. Raw reading speed does not separate the two loaders
(kaldiio reads page-cached float32 arks at about 10M frames/s); blocking and the global sort do.
For each loader this measures:
- steady-state throughput alone (frames/s over two epochs after a warm-up epoch);
- time to the first batch, on a demo-sized corpus and on a large one written here (compressed
  matrices, as Kaldi's make_fbank.sh stores them, so that reading it all takes the seed-style
  loader tens of seconds);
- the utilization of a consumer that needs a fixed time per batch (an accelerator-like step,
  SIMULATED BY SLEEPING): busy time over wall time across two steady-state epochs, where busy
  is every moment the consumer is not blocked waiting for the loader's next batch.
Both loaders get the same frame budget per batch. One process, this machine's cores.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

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
    manifest = records.load_manifest(out_dir)
    chained, counts = dataset.chain_epochs(
        lambda e: dataset.asr_dataset(out_dir, "train", cfg, 0, 1, e, True, manifest),
        0,
        epochs,
        prefetch=cfg.prefetch_batches,
    )
    return iter(chained), counts


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


def measure_seed(data_dir: Path, budget: int, max_batch: int, step_s: float) -> dict:
    loader = SeedLoader(data_dir / "feats.scp", budget, max_batch)
    for _ in loader.epoch():  # warm-up epoch (page cache)
        pass
    result = {"first_batch_s": first_batch(loader.epoch)}

    def two_epochs():
        yield from loader.epoch()
        yield from loader.epoch()

    batches, frames, wall, _ = run_epochs(two_epochs(), 0.0)
    result["frames_per_s"] = frames / wall
    batches, frames, wall, waiting = run_epochs(two_epochs(), step_s)
    result["utilization"] = (wall - waiting) / wall
    result["batches_per_epoch"] = batches // 2
    return result


def measure_tfdata(out_dir: Path, cfg: dataset.InputConfig, step_s: float) -> dict:
    iterator, _ = tfdata_epochs(out_dir, cfg, 1)
    for _ in iterator:  # warm-up: builds the graph functions once, fills the page cache
        pass
    result = {"first_batch_s": first_batch(lambda: tfdata_epochs(out_dir, cfg, 1)[0])}
    for key, sleep in (("frames_per_s", 0.0), ("utilization", step_s)):
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
    parser.add_argument("--step-ms", type=float, default=20.0, help="the simulated accelerator's time per batch")
    parser.add_argument("--frames-per-batch", type=int, default=6000, help="the frame budget of a batch, both loaders")
    parser.add_argument("--large-utterances", type=int, default=100_000, help="utterances of the large corpus")
    args = parser.parse_args(argv)
    from common.runtime import configure_tensorflow

    configure_tensorflow()
    work = args.workdir or Path(tempfile.mkdtemp(prefix="input-bench-"))
    demo_n, large_n = (60, 400) if args.tiny else (1200, args.large_utterances)
    cfg = dataset.InputConfig(frames_per_batch=args.frames_per_batch, max_batch_size=64, shuffle_buffer=256)
    step_s = args.step_ms / 1000
    results: dict = {"step_ms": args.step_ms, "frames_per_batch": args.frames_per_batch, "tiny": args.tiny}
    try:
        for name, count, compress in (("demo", demo_n, False), ("large", large_n, True)):
            print(f"[{name}] writing {count} utterances and sharding them ...", file=sys.stderr, flush=True)
            data = write_corpus(work / name / "data", count, 300, compress)
            manifest = shards.make_shards(
                {"train": data}, work / name / "shards", shards.ShardConfig(num_shards=8), progress=False
            )
            results[f"{name}_utterances"] = count
            results[f"{name}_frames"] = manifest["splits"]["train"]["frames"]
            if name == "demo":
                seed = measure_seed(data, args.frames_per_batch, 64, step_s)
                ours = measure_tfdata(work / name / "shards", cfg, step_s)
                for key in ("frames_per_s", "utilization", "batches_per_epoch"):
                    results[f"baseline_{key}"], results[f"tfdata_{key}"] = seed[key], ours[key]
                results["demo_baseline_first_batch_s"] = seed["first_batch_s"]
                results["demo_tfdata_first_batch_s"] = ours["first_batch_s"]
            else:
                loader = SeedLoader(data / "feats.scp", args.frames_per_batch, 64)
                results["baseline_first_batch_s"] = first_batch(loader.epoch)
                results["tfdata_first_batch_s"] = first_batch(
                    lambda shards_dir=work / name / "shards": tfdata_epochs(shards_dir, cfg, 1)[0]
                )
            if name == "large" and not args.workdir:
                shutil.rmtree(work / name, ignore_errors=True)
    finally:
        if not args.workdir:
            shutil.rmtree(work, ignore_errors=True)
    print_table(results)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=2, sort_keys=True) + "\n")
    return 0


def print_table(r: dict) -> None:
    rows = [
        (
            "steady-state throughput (frames/s)",
            f"{r['baseline_frames_per_s']:,.0f}",
            f"{r['tfdata_frames_per_s']:,.0f}",
        ),
        (
            f"first batch, demo corpus ({r['demo_frames']:,} frames) (s)",
            f"{r['demo_baseline_first_batch_s']:.3f}",
            f"{r['demo_tfdata_first_batch_s']:.3f}",
        ),
        (
            f"first batch, large corpus ({r['large_frames']:,} frames) (s)",
            f"{r['baseline_first_batch_s']:.3f}",
            f"{r['tfdata_first_batch_s']:.3f}",
        ),
        (
            f"utilization of a {r['step_ms']:g} ms/batch consumer (sleep)",
            f"{r['baseline_utilization']:.3f}",
            f"{r['tfdata_utilization']:.3f}",
        ),
        ("batches per epoch", str(r["baseline_batches_per_epoch"]), str(r["tfdata_batches_per_epoch"])),
    ]
    width = max(len(row[0]) for row in rows)
    print(f"{'':{width}}  {'seed-style':>12}  {'tf.data':>12}")
    for label, base, ours in rows:
        print(f"{label:{width}}  {base:>12}  {ours:>12}")


if __name__ == "__main__":
    sys.exit(main())
