"""A DAG run's plan: every path and choice of the run, resolved once from the DAG's params.

`make_plan` checks the params against the form's rules (workflow/form.py) and how they fit together
(naming the param that does not), and each model's training config
with the form's overrides (an unknown key fails the run here, before any work starts), and fixes
the run directory, the splits, the shards, each model's workdir and config, and for a model of phone
targets the directories of its LM text, lexicon and decoding graph; the tasks pass the plan along as XCom and
workflow/commands.py turns it into each stage's command line.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from common import catalog, voices
from common.fsutil import slug
from common.splits import AUGMENTED_SPLIT
from workflow import form
from workflow.local import REPO, training_python

# Of the demo corpus (test_engine and dev_engine only when an engine in use has voices for them); train and
# test are required. dev_engine is for choosing decoding settings (models.tune_lm) only.
SPLITS = ("train", "dev", "test", "test_noisy", "test_engine", "dev_engine")
ENGINE_SPLITS = ("test_engine", "dev_engine")
# The demo corpus' voice groups: the DAG param demo_{group}_voices -> `pipeline.corpus --{group}-voices`.
VOICE_GROUPS = ("train", "test", "test_engine")
REQUIRED_SPLITS = ("train", "test")
MODELS = tuple(catalog.models())  # the registered models (common/catalog.py), extensions' included
# Cluster mode: where the training image keeps the project's files (configs/ of relative paths)
# and the file the KubernetesPodOperator reads a pod's XCom from.
IMAGE_PROJECT_DIR = "/opt/speechflow"
POD_XCOM_FILE = "/airflow/xcom/return.json"


@dataclasses.dataclass(frozen=True)
class Plan:
    """Everything a DAG run does, resolved from its params: paths, models and how to run them."""

    dag_id: str  # Airflow DAG id (MLflow tag of the parent run)
    dag_run_id: str  # Airflow run id (MLflow tag; the run directory is named after it)
    mode: str  # "local" (child processes) or "kubernetes" (pods and an MPIJob)
    run_dir: str  # run-scoped work directory: shards/, asr/, tts/, summary.json (corpus/ for the demo)
    make_corpus: bool  # no data_dir given: build the demo corpus into data_root first
    data_root: str  # the Kaldi data root: one directory per split
    demo_utterances: int  # size of the demo corpus
    splits: tuple[str, ...]  # the splits to featurize and shard
    shards_dir: str  # TFRecord shards and manifest.json
    num_shards: int  # shards per split (>= num_workers)
    models: tuple[str, ...]  # which models to train, of MODELS
    workdirs: dict[str, str]  # model -> its training workdir
    configs: dict[str, str]  # model -> its training config file
    strategy: str  # a registered strategy (common/catalog.py): allreduce, adpsgd, ...; its options: train_overrides
    num_workers: int  # Horovod processes (local) or worker pods (cluster)
    gpus_per_worker: int | None  # cluster: GPUs per worker pod; None: the cluster settings' value
    epochs: int | None  # None: the config file's value
    max_steps: int | None  # None: the config file's value
    eval_utterances: int  # tts: utterances to synthesize in the evaluation
    experiment: str  # MLflow experiment; registered models are named EXPERIMENT-MODEL
    python: str  # local: the training environment's python
    # Where the feature stage writes each split's features (a data directory per split, read by
    # the shard stage): data_root itself, or a directory of its own for read-only corpora
    features_root: str = ""
    allow_pipes: bool = False  # run wav.scp/feats.scp commands other than the recognized decoders
    # the espeak-ng voice whose phonemes the shards hold beside the characters; "": none
    phonemes: str = ""
    # tf.data service input workers for training (commands.uses_data_service says which models);
    # 0: every rank runs its own input pipeline
    data_service_workers: int = 0
    # `models.train --set` items (KEY=VALUE of TrainConfig) for every model's training
    train_overrides: tuple[str, ...] = ()
    # where the demo corpus' sentences come from: "open" English text or the "grammar" (pipeline/corpus.py TEXTS)
    demo_text: str = "open"
    # the demo corpus' synthesizers (common/voices.py ENGINES)
    demo_engines: tuple[str, ...] = voices.ENGINES
    # the demo corpus' ENGINE:VOICE specs of a group (VOICE_GROUPS) where the form names them;
    # a group left out: the corpus' own (common/voices.py)
    demo_voices: dict[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)
    # The copies of the training audio a model's training config asks for (pipeline/augment_config.py
    # CopiesConfig as a dict: `asr.augment.copies`), which the augment stage makes into the split
    # AUGMENTED_SPLIT (then among `splits`); empty: no stage, no such split
    augment: dict[str, Any] = dataclasses.field(default_factory=dict)
    # where the word LM goes (pipeline.lm), for the selected models that decode with one (common/catalog.py
    # ModelEntry.word_lm); "": none is built
    lm_dir: str = ""
    # the LM's text, one sentence per line; "": the training split's transcripts (a phone model: the
    # source of the LM text stage in place of the open-text source's sentences)
    lm_text: str = ""
    # A selected model trains on phone targets (its settings' `targets: phones`) and spells words only
    # through a decoding graph: where the leak-free LM text (pipeline.lm_text), its lexicon
    # (pipeline.text_lexicon, a Kaldi dict dir) and the graph (pipeline.lang, a lang dir with HLG.fst) go;
    # "": none of the three stages runs
    lm_text_dir: str = ""
    lexicon_dir: str = ""
    lang_dir: str = ""
    # what spells that lexicon (the form's `lexicon`): "cmudict" (pipeline.cmudict_lexicon) or "espeak"
    lexicon: str = "cmudict"

    def to_xcom(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_xcom(cls, value: Mapping[str, Any]) -> Plan:
        """The Plan of `to_xcom`'s dict, after a round trip through JSON (which makes tuples lists)."""
        value = dict(value)
        for name in ("splits", "models", "train_overrides", "demo_engines"):
            value[name] = tuple(value[name])
        value["demo_voices"] = {group: tuple(specs) for group, specs in value["demo_voices"].items()}
        return cls(**value)

    def model_name(self, model: str) -> str:
        return f"{self.experiment}-{model}"

    def features_dir(self, split: str) -> str:
        """The data directory the feature stage writes for `split` and the shard stage reads."""
        return f"{self.features_root or self.data_root}/{split}"

    def data_dir(self, split: str) -> str:
        """The Kaldi data directory the feature stage reads for `split`: the corpus' own, or for the
        augmented split the one the augment stage writes, beside the features (the corpus may be
        read-only; runs that name the same features_dir share the copies)."""
        return self.features_dir(split) if split == AUGMENTED_SPLIT else f"{self.data_root}/{split}"


def default_work_root(mode: str) -> str:
    """SPEECHFLOW_WORK_ROOT, else `.runs/pipeline` in the repository (local) or `/data/runs` (cluster)."""
    if os.environ.get("SPEECHFLOW_WORK_ROOT"):
        return os.environ["SPEECHFLOW_WORK_ROOT"]
    if mode == "local":
        return str(REPO / ".runs" / "pipeline")
    return f"{cluster_settings().data_mount}/runs"


def cluster_settings():
    """ClusterSettings from the file named by SPEECHFLOW_CLUSTER_SETTINGS (the Airflow image sets it)."""
    from workflow import cluster

    return cluster.load_settings(os.environ.get("SPEECHFLOW_CLUSTER_SETTINGS") or None)


def _resolve(path: str, mode: str) -> str:
    """Relative paths are the repository's (local) or the training image's project files (cluster)."""
    if not path or Path(path).is_absolute() or "://" in path:
        return path
    return str(REPO / path) if mode == "local" else f"{IMAGE_PROJECT_DIR}/{path}"


def _has_data(split_dir: Path) -> bool:
    return (split_dir / "wav.scp").is_file() or (split_dir / "feats.scp").is_file()


def make_plan(params: Mapping[str, Any], dag_id: str, dag_run_id: str) -> Plan:
    """The run's Plan from the DAG params (the form's default for a param left out); ValueError naming the
    param when one is not the form's, breaks its rule there (workflow/form.py) or they do not fit together."""
    params = form.with_defaults(params)
    form.check(params)
    mode = params["execution_mode"]
    models = tuple(m for m in MODELS if m in params["models"])
    overrides = _train_overrides(params)
    run_dir = _run_dir(params, mode, dag_run_id)
    configs = {m: _resolve(params[f"{m}_config"], mode) for m in MODELS}
    loaded = _load_configs(params, models, configs, overrides, mode)
    augment = _augment(loaded)
    lm_dir, lm_text = _word_lm(params, models, run_dir, mode)
    return Plan(
        dag_id=dag_id,
        dag_run_id=dag_run_id,
        mode=mode,
        run_dir=run_dir,
        **_data(params, mode, run_dir, augmented=bool(augment)),
        shards_dir=f"{run_dir}/shards",
        **_worker_counts(params),
        models=models,
        workdirs={m: f"{run_dir}/{m}" for m in MODELS},
        configs=configs,
        strategy=params["strategy"],
        gpus_per_worker=params["gpus_per_worker"],
        epochs=params["epochs"],
        max_steps=params["max_steps"],
        eval_utterances=params["eval_utterances"],
        experiment=params["experiment"],
        python=training_python(),
        train_overrides=overrides,
        augment=augment,
        lm_dir=lm_dir,
        lm_text=lm_text,
        **_decoding_graph(params, _phone_models(loaded), run_dir),
        lexicon=params["lexicon"],
    )


def _data(params: Mapping[str, Any], mode: str, run_dir: str, augmented: bool) -> dict[str, Any]:
    """The plan's fields of the corpus, the demo corpus and the features: make_corpus, data_root, splits (with
    AUGMENTED_SPLIT last when `augmented`), features_root, allow_pipes, phonemes and the demo_* settings."""
    data_dir = params["data_dir"].strip()
    data_root, splits = _data_root(data_dir, mode, run_dir)
    demo_engines, demo_voices = _demo_voices(params)
    if not data_dir and not voices.of_engines(demo_voices.get("test_engine", voices.TEST_ENGINE_VOICES), demo_engines):
        splits = tuple(s for s in splits if s not in ENGINE_SPLITS)  # the corpus makes neither
    return {
        "make_corpus": not data_dir,
        "data_root": data_root,
        "splits": (*splits, AUGMENTED_SPLIT) if augmented else splits,
        "features_root": _features_root(params, mode, data_root),
        "allow_pipes": params["allow_pipes"],
        "phonemes": params["phonemes"].strip(),
        "demo_utterances": params["demo_utterances"],
        "demo_text": params["demo_text"],
        "demo_engines": demo_engines,
        "demo_voices": demo_voices,
    }


def _run_dir(params: Mapping[str, Any], mode: str, dag_run_id: str) -> str:
    """The run's directory: the work root's directory named after the DAG run."""
    # Short on purpose: the paths of the Kaldi directories under it end up in MLflow fields of limited length.
    run_dir = str(Path(params["work_root"] or default_work_root(mode)) / slug(dag_run_id, 37))
    return str(Path(_resolve(run_dir, mode)).resolve()) if mode == "local" else run_dir


def _load_configs(
    params: Mapping[str, Any],
    models: tuple[str, ...],
    configs: Mapping[str, str],
    overrides: tuple[str, ...],
    mode: str,
) -> dict[str, Any]:
    """model -> its TrainConfig (`check_training_config`) of the selected `models`; ValueError naming
    `MODEL_config` when its file is missing (local mode)."""
    if mode == "local":
        for model in models:
            if not Path(configs[model]).is_file():
                raise ValueError(f"{model}_config: {configs[model]} does not exist")
    return {m: check_training_config(m, params["strategy"], configs[m], overrides) for m in models}


def _worker_counts(params: Mapping[str, Any]) -> dict[str, int]:
    """The plan's num_workers, num_shards and data_service_workers; ValueError naming num_shards when
    there are fewer shards than workers."""
    num_workers, num_shards = params["num_workers"], params["num_shards"]
    if num_shards < num_workers:
        raise ValueError(
            f"num_shards ({num_shards}) must be at least num_workers ({num_workers}): "
            f"every training worker reads its own shards"
        )
    return {
        "num_workers": num_workers,
        "num_shards": num_shards,
        "data_service_workers": params["data_service_workers"],
    }


def _data_root(data_dir: str, mode: str, run_dir: str) -> tuple[str, tuple[str, ...]]:
    """(data root, the splits it has) of the form's `data_dir`; with none, the demo corpus' under the run
    directory and all of SPLITS. ValueError naming `data_dir` when a required split is missing (local mode)."""
    if not data_dir:
        return f"{run_dir}/corpus", SPLITS
    data_root = _resolve(data_dir, mode)
    if mode != "local":
        return data_root, ("train", "dev", "test")  # the Airflow pods do not mount the data: the standard three
    root = Path(data_root)
    missing = [s for s in REQUIRED_SPLITS if not _has_data(root / s)]
    if missing:
        raise ValueError(
            f"data_dir {root}: no Kaldi data directory (wav.scp or feats.scp) for split(s) "
            f"{missing}; it needs {list(REQUIRED_SPLITS)} and may have dev and test_noisy"
        )
    return data_root, tuple(s for s in SPLITS if _has_data(root / s))


def _features_root(params: Mapping[str, Any], mode: str, data_root: str) -> str:
    """Where the features go: the form's `features_dir`, or the data root itself (also when they are one)."""
    features_dir = params["features_dir"].strip()
    if not features_dir:
        return data_root
    features_root = _resolve(features_dir, mode)
    if mode == "local":
        features_root = str(Path(features_root).resolve())
        if Path(features_root).resolve() == Path(data_root).resolve():
            return data_root
    return features_root


def _word_lm(params: Mapping[str, Any], models: tuple[str, ...], run_dir: str, mode: str) -> tuple[str, str]:
    """(lm_dir, lm_text) of the run: ("", "") when the form turns the word LM off or no selected model
    decodes with one; ValueError naming `lm_text` when its file is missing (local mode)."""
    lm_text = _resolve(params["lm_text"].strip(), mode)
    if not params["word_lm"] or not any(catalog.model(m).word_lm for m in models):
        return "", ""
    if lm_text and mode == "local" and not Path(lm_text).is_file():
        raise ValueError(
            f"lm_text: {lm_text} does not exist (a text file of one sentence per line; empty: the training transcripts)"
        )
    return f"{run_dir}/lm", lm_text


def _phone_models(loaded: Mapping[str, Any]) -> tuple[str, ...]:
    """The models of `loaded` (model -> its TrainConfig) that decode words and train on phone targets:
    a word-LM model (common/catalog.py ModelEntry.word_lm) whose settings say `targets: phones`."""
    return tuple(
        m for m, c in loaded.items() if catalog.model(m).word_lm and getattr(c.settings, "targets", "chars") == "phones"
    )


def _decoding_graph(params: Mapping[str, Any], phones: tuple[str, ...], run_dir: str) -> dict[str, str]:
    """The plan's lm_text_dir, lexicon_dir and lang_dir: under the run directory when a selected model
    trains on phones (`phones`, of `_phone_models`), else ""; ValueError naming `word_lm` when the form
    turns the word LM off for a phone model, which spells words only through the graph built from it."""
    if not phones:
        return {"lm_text_dir": "", "lexicon_dir": "", "lang_dir": ""}
    if not params["word_lm"]:
        settings = ", ".join(f"{m}.targets: phones" for m in phones)
        raise ValueError(
            f"word_lm is off, but {settings}: a phone model spells words only through its decoding graph, "
            f"which is built from the word LM; turn word_lm on, or train on characters "
            f"(train_overrides {phones[0]}.targets=chars)"
        )
    return {"lm_text_dir": f"{run_dir}/lm_text", "lexicon_dir": f"{run_dir}/dict", "lang_dir": f"{run_dir}/lang"}


def _augment(loaded: Mapping[str, Any]) -> dict[str, Any]:
    """The copies of the training audio the models' configs (TrainConfig each) ask for, as a dict;
    {} for none. Every model that asks must ask for the same: they share the one augmented split."""
    from common import config as configlib

    asked = {m: configlib.to_dict(c.audio_copies) for m, c in loaded.items() if c.audio_copies is not None}
    if len({repr(v) for v in asked.values()}) > 1:
        raise ValueError(
            f"models {sorted(asked)} ask for different copies of the training audio ({asked}); they share one "
            f"augmented split ({AUGMENTED_SPLIT}): give them the same settings, or train them in runs of their own"
        )
    return next(iter(asked.values()), {})


def _train_overrides(params: Mapping[str, Any]) -> tuple[str, ...]:
    """The form's `train_overrides` (KEY=VALUE items, form.OVERRIDE_PATTERN), each stripped."""
    return tuple(item.strip() for item in params["train_overrides"])


def check_training_config(model: str, strategy: str, config_file: str, overrides: tuple[str, ...]):
    """Loads `model`'s training config as `models.train` will (its file where this process can read
    it, then `strategy` and the overrides) and returns it (a TrainConfig); ValueError naming the
    param and the key that does not fit: an unknown key (with the nearest valid one), a wrong type,
    a value out of range.
    Imports neither TensorFlow nor numpy: the settings are plain dataclasses (common/config.py)."""
    from common import config as configlib
    from models.training.config import TrainConfig

    readable = Path(config_file).is_file()  # cluster mode: the file is in the training image
    try:
        return configlib.load(
            TrainConfig,
            config_file if readable else None,
            overrides,
            flags={"model": model, "strategy": {"name": strategy}},
        )
    except (ValueError, FileNotFoundError) as err:
        source = f"{model}_config ({config_file}) with train_overrides" if readable else "train_overrides"
        raise ValueError(f"{source}: {err}") from err


def _demo_voices(params: Mapping[str, Any]) -> tuple[tuple[str, ...], dict[str, tuple[str, ...]]]:
    """(engines, {group: voices named by the form}) of the demo corpus; ValueError naming the param of a
    voice that is not its engine's (the form's pattern checks only the engine's name)."""
    engines = tuple(params["demo_engines"])
    chosen = {}
    for group in VOICE_GROUPS:
        specs = tuple(s.strip() for s in params[f"demo_{group}_voices"])
        for spec in specs:
            try:
                voices.parse(spec)
            except ValueError as err:
                raise ValueError(f"demo_{group}_voices: {err}") from err
        if specs:
            chosen[group] = specs
    return engines, chosen
