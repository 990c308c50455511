"""The plugin catalog: which models the trainer can train and which strategies combine its workers.

An entry names the module that holds the code ("module:attribute", imported only when a model is
built or a strategy started) and declares what the layers above need to know without importing
it: the DAG form's label, the default config, whether the model's evaluation listens to its output
with an acoustic model, whether its input can come from the tf.data service, whether a strategy
counts its budget in data or survives lost workers. Nothing here imports TensorFlow, so the DAG
parser, the plan and the command lines read the same catalog as the trainer. (models/registry.py is
another thing: the MLflow model registry.)

The code behind an entry implements models/interfaces.py `Task`, `Evaluation`, `Server`, `Strategy`;
an entry also names the frozen dataclasses of its settings (a model's section of the training
config and its evaluation options, a strategy's options), in modules without TensorFlow, so a
run's settings are checked against them before any work starts (workflow/plan.py).

Extensions: every process that reads the catalog (training ranks, `models.evaluate`, the pyfunc
server, the DAG parser) first imports the modules named in the environment variable
SPEECHFLOW_EXTENSIONS (comma-separated), which call `register_model` / `register_strategy`. Such a
module keeps TensorFlow out of its top level (the DAG parser imports it too).
"""

from __future__ import annotations

import dataclasses
import importlib
import os
from typing import Any

EXTENSIONS_ENV = "SPEECHFLOW_EXTENSIONS"
# "module:attribute" of what logs a trained model directory to MLflow as the served pyfunc model:
# (model_dir, TrainConfig, data.json dict) -> MLflow's ModelInfo. Training calls it at its end
# (TrainConfig.log_model); named here so that no module under models/ imports the serving layer.
PYFUNC_LOGGER = "models.serving.pyfunc:log_model"


@dataclasses.dataclass(frozen=True)
class ModelEntry:
    name: str  # what --model, the DAG form and config.yaml's `model` say
    task: str  # "module:attribute" of its Task class (models/interfaces.py)
    # "module:attribute" of models.evaluate's evaluation of it: (model, TrainConfig, data.json,
    # batches(split, frames_per_batch), splits, its evaluation options (EvalConfig.options), out_dir,
    # listener) -> metrics with `primary_metric` (the champion's)
    evaluation: str
    server: str  # "module:attribute" of its server class (models/interfaces.py `Server` says what one has)
    title: str  # the DAG form's label
    config_file: str  # the DAG form's default training config (a YAML file of TrainConfig fields)
    # "module:attribute" of its settings' frozen dataclass (a module without TensorFlow): the section
    # of a training config named after the model (`asr:`), TrainConfig.settings; saved with the model
    settings: str = ""
    # "module:attribute" of its evaluation options' frozen dataclass (TF-free too): models.evaluate's
    # EvalConfig.options, given beside `splits`
    eval_settings: str = ""
    # the model whose trained copy listens to what this one makes in its evaluation (`--asr-model`;
    # the synthesis model's: "asr"); empty: none
    listener: str = ""
    # a rank's own batches may come from the tf.data service (pipeline/data_service.py makes them)
    data_service: bool = False
    eval_splits: tuple[str, ...] = ("dev", "test")  # what models.evaluate evaluates, of those the shards have
    # it transcribes, and decodes with a word LM of its training transcripts (or a given text) once
    # one is attached: the DAG builds one (pipeline.lm) and chooses its weights (models.tune_lm --attach)
    # between its training and its evaluation
    word_lm: bool = False


@dataclasses.dataclass(frozen=True)
class StrategyEntry:
    name: str  # what --strategy, the DAG form and `strategy.name` say
    strategy: str  # "module:attribute" of its Strategy class (models/interfaces.py)
    title: str  # the DAG form's label
    # the ranks share the epochs' batches and stop when they are used up (a faster rank takes more);
    # otherwise every rank steps through exact epochs of its own shards
    budget_in_data: bool = False
    supports_elastic: bool = False  # survives lost workers under Horovod elastic (`--elastic`)
    # every rank holds the same weights after each step, so the ranks share the dev evaluation
    replicas_equal: bool = False
    dynamic_process_sets: bool = False  # Horovod: registers process sets at run time
    # "module:attribute" of its options' frozen dataclass (TF-free), given beside `strategy.name`
    # (StrategyConfig.options); empty: it has none
    options: str = ""


_MODELS: dict[str, ModelEntry] = {}
_STRATEGIES: dict[str, StrategyEntry] = {}
_IMPORTED_EXTENSIONS: set[str] = set()


def register_model(entry: ModelEntry) -> ModelEntry:
    """Adds a model to the catalog (an extension module calls it at import); ValueError when the entry
    names no settings or evaluation options dataclass."""
    if not entry.settings or not entry.eval_settings:
        raise ValueError(
            f"model {entry.name!r} ({entry.task}): its ModelEntry names no settings dataclass; a model declares "
            f"its own: settings='module:Class' (its section of a training config) and eval_settings='module:Class' "
            f"(its evaluation options), frozen dataclasses in a module without TensorFlow, as models/asr/config.py"
        )
    _MODELS[entry.name] = entry
    return entry


def register_strategy(entry: StrategyEntry) -> StrategyEntry:
    """Adds a strategy to the catalog (an extension module calls it at import)."""
    if not isinstance(entry.options, str):
        raise ValueError(
            f"strategy {entry.name!r}: StrategyEntry.options names its options' frozen dataclass as "
            f"'module:Class' (given beside strategy.name), or is empty; got {entry.options!r}"
        )
    _STRATEGIES[entry.name] = entry
    return entry


register_model(
    ModelEntry(
        "asr",
        "models.asr.task:AsrTask",
        "models.asr.evaluation:evaluate",
        "models.asr.server:AsrServer",
        "asr: acoustic model (speech recognition)",
        "configs/demo_asr.yaml",
        "models.asr.config:AsrConfig",
        "models.asr.config:AsrEvalConfig",
        data_service=True,
        eval_splits=("dev", "test", "test_noisy", "test_engine"),
        word_lm=True,
    )
)
register_model(
    ModelEntry(
        "tts",
        "models.tts.task:TtsTask",
        "models.tts.evaluation:evaluate",
        "models.tts.server:TtsServer",
        "tts: synthesis model (text to speech)",
        "configs/demo_tts.yaml",
        "models.tts.config:TtsConfig",
        "models.tts.config:TtsEvalConfig",
        listener="asr",
    )
)
register_strategy(
    StrategyEntry(
        "allreduce",
        "models.distributed.strategies:Allreduce",
        "allreduce (synchronous ring-allreduce)",
        supports_elastic=True,
        replicas_equal=True,
        options="models.distributed.strategies:AllreduceOptions",
    )
)
register_strategy(
    StrategyEntry(
        "adpsgd",
        "models.distributed.gossip:GossipStrategy",
        "adpsgd (asynchronous decentralized gossip)",
        budget_in_data=True,
        dynamic_process_sets=True,
        options="models.distributed.gossip_config:GossipOptions",
    )
)


def load_extensions() -> None:
    """Imports the modules named in SPEECHFLOW_EXTENSIONS (once each); they register themselves."""
    for name in (n.strip() for n in os.environ.get(EXTENSIONS_ENV, "").split(",")):
        if name and name not in _IMPORTED_EXTENSIONS:
            _IMPORTED_EXTENSIONS.add(name)
            importlib.import_module(name)


def models() -> dict[str, ModelEntry]:
    load_extensions()
    return dict(_MODELS)


def strategies() -> dict[str, StrategyEntry]:
    load_extensions()
    return dict(_STRATEGIES)


def model(name: str) -> ModelEntry:
    known = models()
    if name not in known:
        raise ValueError(f"model must be one of {sorted(known)}, got {name!r} (an extension's: {EXTENSIONS_ENV})")
    return known[name]


def strategy(name: str) -> StrategyEntry:
    known = strategies()
    if name not in known:
        raise ValueError(f"strategy must be one of {sorted(known)}, got {name!r} (an extension's: {EXTENSIONS_ENV})")
    return known[name]


def resolve(target: str) -> Any:
    """The object a "module:attribute" string names (importing the module)."""
    module, _, attribute = target.partition(":")
    return getattr(importlib.import_module(module), attribute)


def settings_class(name: str) -> type:
    """The settings dataclass of model `name` (TF-free)."""
    return resolve(model(name).settings)


def eval_settings_class(name: str) -> type:
    """The evaluation options dataclass of model `name` (TF-free)."""
    return resolve(model(name).eval_settings)


def task_class(name: str):
    """The Task class of model `name` (imports its module, and TensorFlow)."""
    return resolve(model(name).task)


def strategy_class(name: str):
    """The Strategy class of strategy `name` (imports its module)."""
    return resolve(strategy(name).strategy)
