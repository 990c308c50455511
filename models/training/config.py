"""The training configuration: one frozen dataclass per part, and what is derived from them.

`TrainConfig` is what `models.train` resolves from its defaults, `--config FILE.yaml` and
`--set key=value`; it is saved beside the checkpoints, logged to MLflow as params and read back
by evaluation and serving. It holds what every model and strategy shares; the chosen model's own
settings are its section (`asr:`, `tts:`, the dataclass its catalog entry names), the chosen
strategy's options sit beside `strategy.name`. No TensorFlow or numpy is imported here: the DAG's
plan loads a run's config to reject an unknown key before any work starts. Benchmarks' and tests'
knobs (a straggler's delay, an injected fault) are not here: they are
`models.training.faults.Faults`, installed from the command line's testing flags.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

from common import catalog
from common import config as configlib
from models.distributed.strategies import StrategyConfig
from pipeline.augment_config import AUGMENTED_SPLIT, CLEAN_SPLIT
from pipeline.input_config import InputConfig


@dataclasses.dataclass(frozen=True)
class OptimConfig:
    learning_rate: float = 1e-3  # per worker; allreduce scales it by the number of workers
    scale_with_workers: bool = True  # allreduce: peak rate = learning_rate x workers (Goyal et al. 2017)
    warmup_steps: int = 100  # linear ramp from learning_rate to the peak (large-batch recipe)
    decay: str = "cosine"  # after warm-up: "cosine" to final_fraction of the peak at the last step, or "none"
    final_fraction: float = 0.1  # where the cosine decay ends
    clip_norm: float = 5.0  # global gradient-norm clipping (LSTMs and CTC spike without it)


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    model: str = "asr"  # a model of common/catalog.py: "asr" (acoustic model), "tts" (synthesis), ...
    # the model's own settings (its catalog entry's `settings` class), in YAML the section named after it
    settings: Any = configlib.registered_field(lambda c: catalog.settings_class(c.model), key=lambda c: c.model)
    input: InputConfig = InputConfig()  # batching, normalization, shuffling
    optim: OptimConfig = OptimConfig()  # optimizer and learning-rate schedule
    strategy: StrategyConfig = StrategyConfig()  # how the workers combine
    epochs: int = 20  # passes over the training split (training stops at epochs or max_steps)
    # grpc://HOST:PORT of a tf.data service dispatcher (pipeline/data_service.py) whose workers make
    # the batches; empty: each rank runs its own input pipeline. A deployment setting: not saved as
    # part of the architecture and free to change between runs.
    data_service: str = ""
    max_steps: int = 0  # 0: no step limit
    checkpoint_every: int = 200  # steps between checkpoints (and one at the end)
    # Horovod elastic (`--elastic`, allreduce): the job survives lost workers and takes new ones;
    # every rank commits its state (weights, optimizer, position) every commit_every steps, and a
    # reset goes back to the last commit
    elastic: bool = False
    commit_every: int = 20
    log_every: int = 10  # steps between metric logs
    # steps between evaluations on the dev split (loss; CER for the acoustic model), which keep the
    # best weights as the saved model (models/training/dev_selection.py); 0: none, the last weights are saved
    eval_every: int = 0
    profile_every: int = 50  # tts: steps between per-module timings (0: never)
    warmup_exclude: int = 5  # first steps left out of throughput figures (compilation, caches)
    precision: str = "float32"  # "float32" or "mixed_bfloat16"
    seed: int = 0  # weight initialization and data order, the same on every rank
    intra_op_threads: int = 0  # 0: this rank's share of the host's cores
    inter_op_threads: int = 0  # 0: 1
    # CPU ranks: bind each to its own share of the host's cores (common/runtime.py), as
    # `mpirun --bind-to core` does: its threads keep their core and caches, and a slow or waiting rank
    # does not lend its cores to the others (the straggler benchmark's ranks). Not with more ranks than
    # cores, nor on a GPU. A deployment setting, free to change between runs.
    bind_cores: bool = True
    experiment: str = "speechflow"  # MLflow experiment
    log_model: bool = True  # log the final model to MLflow (benchmarks turn it off)

    def __post_init__(self):
        catalog.model(self.model)  # ValueError naming the registered models
        configlib.fill_registered(self)
        if self.precision not in ("float32", "mixed_bfloat16"):
            raise ValueError(f"precision must be 'float32' or 'mixed_bfloat16', got {self.precision!r}")

    @property
    def audio_copies(self):
        """The offline copies of the training audio the model's settings ask for (pipeline/augment_config.py
        `CopiesConfig`, made by pipeline/augment.py), or None. A model's settings class may declare
        them as a property `audio_copies` (the acoustic model's: `asr.augment.copies`)."""
        return getattr(self.settings, "audio_copies", None)

    @property
    def train_split(self) -> str:
        """The split of the shards this model trains on, decided here only: `train_aug` (the clean
        utterances and their copies) when it asks for `audio_copies`, else the clean `train`. The
        trainer reads it once (models/training/setup.py); a model trained with split-wide CMVN is
        served with this split's statistics (models/training/persistence.py), as it trained."""
        return AUGMENTED_SPLIT if self.audio_copies is not None else CLEAN_SPLIT

    @classmethod
    def ignored_keys(cls, config) -> dict[str, str]:
        """Sections of the other registered models, ignored silently: a config file may hold several
        models' settings; only the chosen model's are read."""
        return {name: "" for name in catalog.models() if name != config.model}


def learning_rate(step: int, cfg: OptimConfig, workers: int, total_steps: int) -> float:
    """The rate for `step` (1-based): warm-up from the base rate to the peak, then optional cosine decay."""
    peak = cfg.learning_rate * (workers if cfg.scale_with_workers else 1)
    if step <= cfg.warmup_steps:
        return cfg.learning_rate + (peak - cfg.learning_rate) * step / max(1, cfg.warmup_steps)
    if cfg.decay == "none" or total_steps <= cfg.warmup_steps:
        return peak
    progress = min(1.0, (step - cfg.warmup_steps) / max(1, total_steps - cfg.warmup_steps))
    return peak * (cfg.final_fraction + (1 - cfg.final_fraction) * 0.5 * (1 + math.cos(math.pi * progress)))


def architecture(config: TrainConfig) -> dict:
    """The part of a config that fixes the shapes of the weights."""
    return {"model": config.model, config.model: configlib.architecture_dict(config.settings)}


def check_workdir(workdir: Path, config: TrainConfig) -> None:
    """Refuses to resume a workdir trained with another architecture, naming what differs."""
    saved_path = Path(workdir) / "config.yaml"
    if not saved_path.is_file():
        return
    saved = configlib.load(TrainConfig, saved_path)
    old, new = configlib.flatten(architecture(saved)), configlib.flatten(architecture(config))
    diff = {k: (old.get(k), new.get(k)) for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k)}
    if diff:
        details = ", ".join(f"{k}: {a} -> {b}" for k, (a, b) in list(diff.items())[:6])
        raise ValueError(f"{workdir} holds a model with another architecture ({details}); use a new --workdir")
