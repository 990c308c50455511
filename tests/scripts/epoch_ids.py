"""Run under horovodrun: prints the utterance ids of every batch this rank gets in epochs 0 and 1."""

import json
import sys

import horovod.tensorflow as hvd

from common.runtime import configure_tensorflow
from pipeline import dataset, records

configure_tensorflow()
hvd.init()
cfg = dataset.InputConfig(frames_per_batch=600, max_batch_size=16, shuffle_buffer=16)
shards = records.open_shard_set(sys.argv[1])
result = {}
for epoch in (0, 1):
    ds, steps = dataset.asr_dataset(shards, "train", cfg, rank=hvd.rank(), size=hvd.size(), epoch=epoch)
    result[epoch] = [[u.decode() for u in b["utt_id"]] for b in ds.as_numpy_iterator()]
    assert len(result[epoch]) == steps
print(f"EPOCH rank={hvd.rank()} {json.dumps(result)}", flush=True)
