"""What the trainer, evaluation and serving may ask of a model's task and of a strategy.

A model is a `Task` class, an `Evaluation` and a `Server`, named by one entry in common/catalog.py;
a strategy is a `Strategy` class named there.
The declared properties the layers above need without importing TensorFlow (the DAG form's label,
whether a strategy counts its budget in data or survives lost workers, ...) are the catalog
entry's fields; these protocols are what the code behind an entry does.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol


class Task(Protocol):
    """One model as the trainer sees it. Batches are dicts of tensors; `config` is the model's own
    frozen dataclass, with the sizes that come from the data filled in."""

    # Class attributes (`name = "asr"`), read on the task. Not ClassVar: mypy would then want each
    # class to annotate them ClassVar too, which none needs (tests/typecheck/registered.py).
    name: str
    config: Any
    selection_metric: str  # the dev metric training keeps the best weights by (lower is better)
    # the keys `dev_counts` returns: every rank sums them in one collective, a rank without dev batches too
    dev_count_names: tuple[str, ...]
    profile_every: bool  # True: the trainer times its modules every TrainConfig.profile_every steps

    @classmethod
    def create(cls, config, shards, eval_config=None) -> Task:
        """The task of a TrainConfig `config` (its own settings: `config.settings`), sized from `shards`
        (a records.ShardSet, or what a served model recorded of one); `eval_config`: the model's
        evaluation options (EvalConfig.options) when evaluating."""

    def resolved(self, config):
        """`config` (a TrainConfig) with this task's data-sized settings in place (saved with the model)."""

    def build(self):
        """A new Keras model (its weights named after `model.name`)."""

    def dataset(self, shards, split: str, cfg, rank: int, size: int, epoch: int, training: bool):
        """(batches of `split` for `rank` of `size`, number of batches)."""

    def input_pipeline(self):
        """The reader of its batches from the shards (pipeline/dataset.py `Pipeline`), which
        `dataset` runs and which the tf.data service runs for asynchronous training."""

    def prepare(self, batches, shards, split: str):
        """Batches that came from elsewhere (the tf.data service) completed as `dataset` makes them."""

    def frames(self, batch):
        """Input frames in a batch (what frames/s counts): a scalar tensor."""

    def loss(self, model, batch, training: bool, seed=None) -> tuple[Any, dict]:
        """(scalar loss, auxiliary metrics); `seed` int64 [2]: this step's stateless augmentation seed
        (the rank's stream, then the step, 1-based)."""

    def dev_counts(self, model, batch) -> dict[str, float]:
        """What one dev batch adds to the dev metrics: sums (a loss' sum, errors, lengths), which the
        trainer adds over the batches and the ranks; keys `dev_count_names`."""

    def dev_metrics(self, counts: dict[str, float]) -> dict[str, float]:
        """The dev metrics (named `dev_*`, `selection_metric` among them) of `counts` summed over
        the split."""

    def finish(self, model, shards, config) -> dict[str, Any]:
        """After the last step, on the weights that are saved (rank 0's, the best on dev): what the
        model fits after training (the durations model's duration predictor), on `shards` with
        TrainConfig `config`; returns figures for the training summary ({} for nothing)."""

    def flops_per_frame(self) -> float: ...

    def profile(self, model, batch) -> dict[str, float]: ...

    def model_data(self) -> dict[str, Any]:
        """What the saved model's data.json records for serving besides the shards' sizes."""


class DevLoss:
    """Defaults for a task whose dev metric is its loss (the synthesis model's, an extension's): a base
    class to inherit `dev_counts` and `dev_metrics` from, as Lightning's hooks have no-op defaults."""

    selection_metric = "dev_loss"
    dev_count_names: tuple[str, ...] = ("loss_sum", "batches")

    def dev_counts(self, model, batch) -> dict[str, float]:
        loss, _ = self.loss(model, batch, training=False)  # type: ignore[attr-defined]
        return {"loss_sum": float(loss), "batches": 1.0}

    def dev_metrics(self, counts: dict[str, float]) -> dict[str, float]:
        return {"dev_loss": counts["loss_sum"] / max(1.0, counts["batches"])}


class Evaluation(Protocol):
    """models.evaluate's evaluation of one model (common/catalog.py `ModelEntry.evaluation`)."""

    def __call__(
        self, model, config, data: dict, batches, splits: list[str], cfg, out_dir: Path, listener=None
    ) -> dict:
        """Metrics of the trained `model` (its TrainConfig `config`, its data.json `data`) on `splits`;
        `batches(split, frames_per_batch)`: a split's batches in order; `cfg`: the model's evaluation
        options (its catalog entry's `eval_settings`, EvalConfig.options); files
        go to `out_dir`; `listener`: the workdir of the model that listens to this one's output.
        Among the metrics `primary_metric`: the name of the one the champion is chosen by (lower wins)."""


class Server(Protocol):
    """What answers a served model's requests (common/catalog.py `ModelEntry.server`)."""

    # mypy leaves `__init__` out of a protocol's structural check: tests/typecheck/registered.py
    # checks each server class as a callable of these arguments instead.
    def __init__(self, model, config, data: dict): ...

    def predict(self, model_input, params: dict, settings) -> Any:
        """The answer to a request (rows of a pandas DataFrame); `settings`: the operator's limits
        (models/serving/request_policy.py `ServingConfig`); RequestError for a request it refuses."""

    @classmethod
    def signature(cls, config, data: dict):
        """Its MLflow ModelSignature."""

    @classmethod
    def example(cls, config, data: dict) -> dict:
        """A small valid request (MLflow's input example)."""


class Strategy(Protocol):
    """How the workers combine. It sees the model's variables and the optimizer, never the model."""

    # As Server's: tests/typecheck/registered.py checks the constructor as a callable.
    def __init__(self, config, model_vars: list, optimizer): ...

    fused_step: bool  # the trainer computes and averages gradients in one step (True: a `FusedStrategy`)

    def start(self) -> None:
        """Before the first step: every rank takes rank 0's weights (and optimizer state)."""

    def reduce(self, grads): ...

    def step_lock(self): ...

    def after_step(self, step: int) -> float:
        """Seconds spent communicating between steps."""

    def lr_workers(self, size: int) -> int:
        """The number of workers the learning rate scales with."""

    def training_finished(self) -> None: ...

    def metrics(self) -> dict: ...

    def finish(self) -> dict:
        """All ranks end with the same weights; returns figures for the summary."""

    def close(self) -> None: ...


class FusedStrategy(Strategy, Protocol):
    """A strategy whose `fused_step` may be True: the trainer's fused step asks it for the tape (only
    such a strategy has `distributed_tape`, so it is not part of `Strategy`)."""

    def distributed_tape(self, tape):
        """`tape` (a tf.GradientTape) made to average each gradient over the ranks as it is computed."""
