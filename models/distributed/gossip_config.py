"""The options of the asynchronous gossip strategy (AD-PSGD, models/distributed/gossip.py), declared
with it and registered with it (common/catalog.py): `strategy.gossip`, `strategy.hierarchical`, ...
beside `strategy.name: adpsgd` in a training config. No TensorFlow: the DAG's plan loads it."""

from __future__ import annotations

import dataclasses

VARIANTS = ("fixed-ring", "random-ring", "delay-by-one")


@dataclasses.dataclass(frozen=True)
class GossipOptions:
    gossip: str = "fixed-ring"  # whom each worker averages with: "fixed-ring", "random-ring" or "delay-by-one"
    hierarchical: bool = False  # ranks on a host average by allreduce; one rank per host gossips
    gossip_compression: str = "none"  # exchanges travel as "none" (float32) or "fp16"
    consensus_every: int = 10  # gossip rounds between consensus-distance measurements
    seed: int = 0  # random-ring: the seed every rank draws the matchings from
    # Scale the learning rate with the number of workers, as allreduce does. Averaging n workers'
    # models, each stepped by its own gradient, moves the average by lr x the mean gradient per n
    # batches: the same as one allreduce step, so both need the same rate per sample.
    gossip_scale_lr: bool = True

    def __post_init__(self):
        if self.gossip not in VARIANTS:
            raise ValueError(f"strategy.gossip must be {', '.join(VARIANTS)}, got {self.gossip!r}")
        if self.gossip_compression not in ("none", "fp16"):
            raise ValueError(f"strategy.gossip_compression must be 'none' or 'fp16', got {self.gossip_compression!r}")
        if self.consensus_every < 1:
            raise ValueError(f"strategy.consensus_every must be 1 or more, got {self.consensus_every}")
