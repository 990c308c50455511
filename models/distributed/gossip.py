"""Asynchronous decentralized parallel SGD (AD-PSGD): pairwise gossip averaging of the weights.

After Lian et al. 2018 and Zhang, Cui et al. (ICASSP 2019, 2020). Each worker trains on its own
batches with its own optimizer and never waits for another worker's computation. A background
communication thread averages this worker's weights with one partner per round; the partners of
a round form a perfect matching (gossip_schedule.py), so no cycle of waits can form.

Why Horovod process sets driven from a Python thread: they reuse the launch, rendezvous and
transports (Gloo, MPI, NCCL) the allreduce strategy already has, so `--strategy adpsgd` runs under
the same `horovodrun` as allreduce. A pairwise average is a 2-rank allreduce on the pair's process
set; it blocks only the communication threads of that pair. The alternatives in the research were
one-sided MPI windows or a parameter-server-like exchange, which Horovod does not offer and which
would need a second communication stack.

Variants (`strategy.gossip`; options: models/distributed/gossip_config.py):
- fixed-ring: rounds alternate between the two perfect matchings of the ring's edges.
- random-ring: each round a new random perfect matching from a seed all ranks share (a larger
  spectral gap: consensus contracts faster).
- delay-by-one: the ring, but each exchange carries the weights of the previous step and its
  result is merged at the next step boundary, so communication overlaps a whole step of
  computation and the communication thread never touches the model (a double buffer).
- hierarchical (`strategy.hierarchical`): the ranks of a host first average by allreduce (a
  super-learner), then one leader per host gossips with another host's leader and broadcasts
  the result to its host (H-ADPSGD).

Consistency: in the non-delayed variants the communication thread reads (snapshot) and writes
(merge) the weights under the lock that the training step holds, so it never sees or leaves a
half-updated model. A merge keeps the local progress made while the exchange was in flight:
w <- w + (average - snapshot).

Rounds are decoupled from steps: a worker's communication thread starts a round as soon as its
training thread has finished a step since the last round (or has finished training), and the
round's exchange waits only for the partner's communication thread. A fast worker's training never
waits; it may take several steps per round, and merges its partner's weights as they come. The
workers may take different numbers of steps (a budget counted in data: models/training/loop.py).

Termination: after each round's exchanges, every rank adds its step count and whether it has
finished training to one global sum (a small allreduce of the communication threads, all in the
same round), so all ranks learn together, in the same round, that every rank has finished. They
stop there, and average once with an allreduce so that the saved model is the consensus model.
Every rank performs the same sequence of collectives, so none waits for a collective that
another will never call.

Delay-by-one uses each published step's weights in at most one round (a round waits for a new
step), and a round's snapshot is the published weights plus the pulls of earlier rounds not yet
merged (`DelayedMerge`), so no pull toward the partner is applied twice.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time

import numpy as np
import tensorflow as tf

from models.distributed import gossip_schedule
from models.distributed.gossip_config import GossipOptions

log = logging.getLogger(__name__)


class GossipError(RuntimeError):
    """The communication thread failed; raised in the training thread at the next step."""


class DelayedMerge:
    """Delay-by-one's double buffer: the weights of the last finished step (published by the
    training thread) and the pulls toward the partners that the communication thread has computed
    but the training thread has not merged yet.

    A round's snapshot is published + pending. Without the pending part, a round that starts before
    the training thread has merged the previous round's result (its exchange ended during a step)
    sends weights that do not hold that pull yet, and its own result pulls toward the partner again:
    two ranks then move the whole distance to each other instead of half of it (they swap and never
    agree). Pure NumPy, so the bookkeeping is tested without Horovod."""

    def __init__(self, published: np.ndarray):
        self._lock = threading.Lock()
        self._published = published
        self._pending: np.ndarray | None = None
        self.rounds_before_merge = 0  # rounds whose snapshot held a pull not merged yet

    def snapshot(self) -> np.ndarray:
        """The communication thread: the weights this rank has in effect (what it sends)."""
        with self._lock:
            self.rounds_before_merge += self._pending is not None
            return self._published if self._pending is None else self._published + self._pending

    def add(self, average: np.ndarray, snapshot: np.ndarray) -> None:
        """The communication thread: a round's result, the pull from `snapshot` to `average`."""
        with self._lock:
            delta = average - snapshot
            self._pending = delta if self._pending is None else self._pending + delta

    def merge_and_publish(self, assign_delta, flatten) -> None:
        """The training thread, between steps: adds the pending pulls to the model (`assign_delta`),
        then publishes its weights (`flatten()`) for the next round."""
        with self._lock:
            if self._pending is not None:
                assign_delta(self._pending)
                self._pending = None
            self._published = flatten()


class FlatWeights:
    """A model's weights as one float32 vector, the form in which gossip sends, averages and merges them."""

    def __init__(self, variables: list):
        self.variables = variables
        self.shapes = [tuple(v.shape) for v in variables]
        self.sizes = [int(np.prod(s)) for s in self.shapes]

    def flatten(self) -> np.ndarray:
        return np.concatenate([np.asarray(v.numpy(), np.float32).ravel() for v in self.variables])

    def assign(self, flat: np.ndarray) -> None:
        offset = 0
        for variable, shape, size in zip(self.variables, self.shapes, self.sizes):
            variable.assign(flat[offset : offset + size].reshape(shape).astype(variable.dtype))
            offset += size

    def assign_delta(self, delta: np.ndarray) -> None:
        offset = 0
        for variable, shape, size in zip(self.variables, self.shapes, self.sizes):
            variable.assign_add(delta[offset : offset + size].reshape(shape).astype(variable.dtype))
            offset += size


class GossipStrategy:
    name = "adpsgd"
    fused_step = False  # the weights are averaged between steps, not the gradients inside one

    def lr_workers(self, size: int) -> int:
        """Averaging n workers' models, each stepped by its own gradient, moves the average as one
        allreduce step of n batches: the same rate per sample when `gossip_scale_lr`."""
        return size if self.config.gossip_scale_lr else 1

    def __init__(self, config, model_vars: list, optimizer):
        import horovod.tensorflow as hvd

        self.hvd = hvd
        self.config: GossipOptions = config.options
        self.optimizer = optimizer
        self.variables = model_vars
        self.weights = FlatWeights(model_vars)
        self.rank, self.size = hvd.rank(), hvd.size()
        self.scheme = "random-ring" if self.config.gossip == "random-ring" else "fixed-ring"
        self.delayed = self.config.gossip == "delay-by-one"
        self.lock = threading.Lock()  # held by the training step; the thread snapshots and merges under it
        self.steps_done = 0
        self.training_done = False  # the training thread has taken its last step
        self.global_steps = 0  # every rank's steps together, as of the last round
        self.step_ready = threading.Condition()
        self.stop = threading.Event()
        self.error: BaseException | None = None
        self.delayed_merge: DelayedMerge | None = None  # delay-by-one: set up in start()
        self.rounds_done = 0
        self.exchange_seconds = 0.0
        self.lock_wait_seconds = 0.0
        self.consensus_distance = float("nan")
        self._pending_main_seconds = 0.0
        self._setup_process_sets()
        self.thread = threading.Thread(target=self._run, name="gossip", daemon=True)
        self.started = False

    # -- process sets ---------------------------------------------------------------------------

    def _set_for(self, ranks: tuple[int, ...]):
        if len(ranks) == self.size:
            return self.hvd.global_process_set
        return self._sets[tuple(sorted(ranks))]

    def _setup_process_sets(self) -> None:
        hvd = self.hvd
        if self.config.hierarchical:
            # Horovod: every rank learns every rank's host (cross_rank numbers the hosts).
            self.hosts = [str(h) for h in hvd.allgather_object(hvd.cross_rank())]
        else:
            self.hosts = [str(r) for r in range(self.size)]  # every rank is its own "host"
        self.groups = gossip_schedule.host_groups(self.hosts)
        self.my_group = next(g for g in self.groups if self.rank in g)
        wanted = [tuple(g) for g in self.groups if 1 < len(g) < self.size]
        wanted += [
            pair for pair in gossip_schedule.hierarchical_pairs_needed(self.hosts, self.scheme) if len(pair) < self.size
        ]
        self._sets = {}
        for ranks in wanted:
            # Horovod: register one process set per pair that can meet (and one per host). Collective:
            # all ranks add the same sets in the same order.
            self._sets[ranks] = hvd.add_process_set(list(ranks))

    # -- the training thread's side ----------------------------------------------------------------

    @contextlib.contextmanager
    def step_lock(self):
        """Held around each training step; the time spent waiting for it is communication time."""
        start = time.perf_counter()
        with self.lock:
            self._pending_main_seconds += time.perf_counter() - start
            yield

    def reduce(self, grads):
        return grads  # each worker applies its own gradients

    def start(self) -> None:
        """Before the first step: every rank takes rank 0's weights and optimizer state, then the
        communication thread starts."""
        from models.distributed import hvd_compat

        # Horovod: all workers start from rank 0's weights and optimizer state, then part ways.
        hvd_compat.broadcast(self.variables + list(self.optimizer.variables), root_rank=0)
        if self.delayed:
            self.delayed_merge = DelayedMerge(self.weights.flatten())
        self.started = True
        self.thread.start()

    def after_step(self, step: int) -> float:
        """Called by the training thread after each step. Returns its seconds spent on gossip."""
        if self.error is not None:
            raise GossipError(f"the gossip thread of rank {self.rank} failed: {self.error}") from self.error
        start = time.perf_counter()
        if self.delayed:
            # The pulls that arrived during step `step`, then its weights for the next exchange.
            self.delayed_merge.merge_and_publish(self.weights.assign_delta, self.weights.flatten)
        with self.step_ready:
            self.steps_done = step
            self.step_ready.notify_all()
        seconds = time.perf_counter() - start + self._pending_main_seconds
        self._pending_main_seconds = 0.0
        return seconds

    def training_finished(self) -> None:
        """The training thread has no more batches; the thread goes on with rounds until all ranks
        have finished."""
        with self.step_ready:
            self.training_done = True
            self.step_ready.notify_all()

    def metrics(self) -> dict:
        distance = {"consensus_distance": self.consensus_distance} if np.isfinite(self.consensus_distance) else {}
        return {
            **distance,
            "gossip_rounds": self.rounds_done,
            "gossip_global_steps": self.global_steps,
            "gossip_exchange_ms": 1000 * self.exchange_seconds / max(1, self.rounds_done),
        }

    def finish(self) -> dict:
        """Goes on with rounds until every rank has finished training, then averages all ranks once
        (the consensus model)."""
        self.training_finished()
        if self.started:
            self.thread.join()
        if self.error is not None:
            raise GossipError(f"the gossip thread of rank {self.rank} failed: {self.error}") from self.error
        if self.delayed_merge is not None:
            self.delayed_merge.merge_and_publish(self.weights.assign_delta, self.weights.flatten)
        flat = self.weights.flatten()
        before = self._distance_from_average(flat, name="gossip.final")
        # Horovod: one global average, so every rank saves the same (consensus) model.
        average = self.hvd.allreduce(tf.constant(flat), op=self.hvd.Average, name="gossip.consensus").numpy()
        self.weights.assign(average)  # exactly the average (adding a difference would round differently per rank)
        return {
            "consensus_distance_before_final_average": before,
            "gossip_rounds": self.rounds_done,
            "gossip_hosts": len(self.groups),
            "gossip_ranks_per_host": len(self.my_group),
            "gossip_exchange_ms": 1000 * self.exchange_seconds / max(1, self.rounds_done),
            **({"gossip_rounds_before_merge": self.delayed_merge.rounds_before_merge} if self.delayed_merge else {}),
        }

    def close(self) -> None:
        """Stops the thread (after an error in training); it may be blocked in an exchange with a
        partner that will never come, so it is a daemon and is left behind after a short wait."""
        self.stop.set()
        with self.step_ready:
            self.step_ready.notify_all()
        if self.thread.is_alive():
            self.thread.join(timeout=2.0)
            if self.thread.is_alive():
                log.warning(
                    "rank %d: gossip thread still in an exchange; leaving it to exit with the process", self.rank
                )

    # -- the communication thread ----------------------------------------------------------------

    def _run(self) -> None:
        try:
            round_index, last_step = 0, 0
            while True:
                with self.step_ready:
                    while self.steps_done == last_step and not self.training_done and not self.stop.is_set():
                        self.step_ready.wait(timeout=1.0)
                    if self.stop.is_set():
                        return
                    last_step, done = self.steps_done, self.training_done
                self._round(round_index)
                # Horovod: every rank's steps and whether it has finished, summed over all ranks.
                totals = self.hvd.allreduce(
                    tf.constant([last_step, int(done)], tf.int64),
                    op=self.hvd.Sum,
                    name=f"gossip.progress.{round_index}",
                ).numpy()
                self.global_steps = int(totals[0])
                round_index += 1
                self.rounds_done = round_index
                if totals[1] == self.size:
                    return
        except BaseException as err:  # handed to the training thread, which raises it
            self.error = err
            log.error("rank %d: gossip round failed: %s", self.rank, err)

    def _round(self, round_index: int) -> None:
        if self.delayed:
            snapshot = self.delayed_merge.snapshot()
        else:
            with self.lock:
                snapshot = self.weights.flatten()
        start = time.perf_counter()
        average = self._exchange(snapshot, round_index)
        self.exchange_seconds += time.perf_counter() - start
        if self.delayed:
            self.delayed_merge.add(average, snapshot)
        else:
            with self.lock:
                self.weights.assign_delta(average - snapshot)
        every = self.config.consensus_every
        if every and (round_index + 1) % every == 0:
            self.consensus_distance = self._distance_from_average(snapshot, name=f"gossip.distance.{round_index}")

    def _exchange(self, weights: np.ndarray, round_index: int) -> np.ndarray:
        """This round's average for this rank (its pair's, or its host's and then its leader pair's)."""
        hvd = self.hvd
        compress = self.config.gossip_compression == "fp16"
        payload = weights.astype(np.float16) if compress else weights
        result = payload
        if len(self.my_group) > 1:
            # Horovod: the host's ranks average first (H-ADPSGD's super-learner).
            result = hvd.allreduce(
                tf.constant(result),
                op=hvd.Average,
                process_set=self._set_for(tuple(self.my_group)),
                name=f"gossip.host.{round_index}",
            ).numpy()
        if len(self.groups) > 1:
            leader = self.my_group[0]
            pairs = gossip_schedule.hierarchical_matching(self.hosts, round_index, self.scheme, self.config.seed)
            mine = next((pair for pair in pairs if leader in pair), None)
            if mine is not None and self.rank == leader:
                # Horovod: a pairwise average is a 2-rank allreduce on the pair's process set.
                result = hvd.allreduce(
                    tf.constant(result),
                    op=hvd.Average,
                    process_set=self._set_for(mine),
                    name=f"gossip.pair.{round_index}.{mine[0]}-{mine[1]}",
                ).numpy()
            if len(self.my_group) > 1:
                # Horovod: the leader hands the pair's average to the rest of its host.
                result = hvd.broadcast(
                    tf.constant(result),
                    root_rank=leader,
                    process_set=self._set_for(tuple(self.my_group)),
                    name=f"gossip.bcast.{round_index}",
                ).numpy()
        if compress:
            # Only the change travels in fp16; the local copy stays float32: w + (avg16 - w16).
            return weights + (np.asarray(result, np.float32) - payload.astype(np.float32))
        return np.asarray(result, np.float32)

    def _distance_from_average(self, weights: np.ndarray, name: str) -> float:
        """Mean over ranks of ||w_rank - mean_rank w|| (a global collective, same round on all ranks)."""
        hvd = self.hvd
        average = hvd.allreduce(tf.constant(weights), op=hvd.Average, name=f"{name}.mean").numpy()
        mine = tf.constant([np.linalg.norm(weights - average)], tf.float32)
        return float(hvd.allreduce(mine, op=hvd.Average, name=f"{name}.dist").numpy()[0])
