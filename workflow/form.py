"""The trigger form of the `speech_pipeline` DAG: one `Field` per param, in the form's order.

Each field states its rules once (type, bounds, choices, pattern) with its default, title, section and
description. The DAG turns every field into an Airflow `Param` (`json_schema` gives its keywords), so the
form checks a value as it is typed; `workflow/plan.py` checks the same rules with `check` before it reads
the params, so a run started any other way (the REST API, `airflow dags test -c`) meets them too.
Plain data: nothing here imports Airflow.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
from collections.abc import Mapping
from typing import Any

from common import catalog, voices

DATA, TRAINING, TRACKING, EXECUTION = "Data", "Training", "Tracking", "Execution"
EXECUTION_MODES = ("local", "kubernetes")
DEMO_TEXTS = ("open", "grammar")  # pipeline/corpus.py TEXTS
LEXICONS = ("cmudict", "espeak")  # workflow/commands.py LEXICON_MODULES (tests/test_dag.py checks they agree)
VOICE_PATTERN = rf"^({'|'.join(voices.ENGINES)}):[A-Za-z0-9_+-]+$"
OVERRIDE_PATTERN = r"^[A-Za-z_][A-Za-z0-9_.]*=.*$"  # KEY=VALUE of `models.train --set`


@dataclasses.dataclass(frozen=True)
class Field:
    """One param of the form and its rules, in JSON Schema's terms (which the Airflow form speaks)."""

    name: str  # the param's name: what the run's conf and the REST API say
    default: Any  # what the form holds when left as it is (a tuple for an array)
    type: str | tuple[str, ...]  # JSON Schema type; ("null", "integer"): an integer or empty
    title: str  # the form's label
    section: str  # the form's section (DATA, TRAINING, TRACKING, EXECUTION)
    description: str  # the form's help text
    minimum: int | None = None  # integers: the least value
    maximum: int | None = None  # integers: the greatest value
    min_length: int | None = None  # strings: the fewest characters
    # strings: the value's choices; arrays: every item's (then the form offers them as a multi-select)
    enum: tuple[str, ...] | None = None
    pattern: str | None = None  # strings: a regular expression the value matches; arrays: every item
    min_items: int | None = None  # arrays: the fewest items
    unique_items: bool = False  # arrays: no item twice
    values_display: Mapping[str, str] | None = None  # the form's label of each choice of `enum`

    def initial(self) -> Any:
        """The default as the form holds it (a list for an array)."""
        return list(self.default) if self.type == "array" else self.default


def json_schema(field: Field) -> dict[str, Any]:
    """The JSON Schema keywords of `field` (with Airflow's `title`, `section` and `values_display`), as
    `Param(default, description=..., **json_schema(field))` takes them."""
    schema: dict[str, Any] = {"type": list(field.type) if isinstance(field.type, tuple) else field.type}
    if field.type == "array":
        items: dict[str, Any] = {"type": "string"}
        if field.enum is not None:
            items["enum"] = list(field.enum)
        if field.pattern is not None:
            items["pattern"] = field.pattern
        schema["items"] = items
        if field.min_items is not None:
            schema["minItems"] = field.min_items
        if field.unique_items:
            schema["uniqueItems"] = True
        if field.enum is not None:
            schema["examples"] = list(field.enum)  # the options of the form's multi-select
    else:
        keywords = (("minimum", field.minimum), ("maximum", field.maximum), ("minLength", field.min_length))
        schema.update({k: v for k, v in keywords if v is not None})
        if field.enum is not None:
            schema["enum"] = list(field.enum)
        if field.pattern is not None:
            schema["pattern"] = field.pattern
    schema.update(title=field.title, section=field.section)
    if field.values_display is not None:
        schema["values_display"] = dict(field.values_display)
    return schema


def with_defaults(params: Mapping[str, Any]) -> dict[str, Any]:
    """`params` with the form's default of each param they leave out."""
    return {**{f.name: f.initial() for f in FIELDS}, **params}


def check(params: Mapping[str, Any]) -> None:
    """Checks `params` against the form: ValueError naming a param the form does not have (and the nearest
    one it has), or a param, its value and the rule of its field it breaks. A param left out is not checked."""
    names = [f.name for f in FIELDS]
    for name in params:
        if name not in names:
            near = difflib.get_close_matches(name, names, n=1)
            raise ValueError(f"unknown param {name!r}" + (f" (did you mean {near[0]!r}?)" if near else ""))
    for field in FIELDS:
        if field.name in params:
            _check_value(field, params[field.name])


def _check_value(field: Field, value: Any) -> None:
    types = field.type if isinstance(field.type, tuple) else (field.type,)
    if value is None and "null" in types:
        return
    kind = next((t for t in types if t != "null"), "null")
    if not _is_of(kind, value):
        raise ValueError(f"{field.name}: expected {_KINDS[kind]}, got {value!r}")
    if kind == "array":
        _check_items(field, list(value))
        return
    name = field.name
    if field.minimum is not None and value < field.minimum:
        raise ValueError(f"{name} must be at least {field.minimum}, got {value}")
    if field.maximum is not None and value > field.maximum:
        raise ValueError(f"{name} must be at most {field.maximum}, got {value}")
    if field.min_length is not None and len(value) < field.min_length:
        raise ValueError(f"{name} must have at least {field.min_length} character(s), got {value!r}")
    _check_item(field, value)


def _check_items(field: Field, items: list) -> None:
    if field.min_items is not None and len(items) < field.min_items:
        raise ValueError(f"{field.name}: choose at least {field.min_items} of {list(field.enum or ())}, got {items}")
    if field.unique_items and len(set(map(repr, items))) < len(items):
        raise ValueError(f"{field.name}: each item at most once, got {items}")
    for item in items:
        if not isinstance(item, str):
            raise ValueError(f"{field.name}: expected strings, got {item!r}")
        _check_item(field, item)


def _check_item(field: Field, value: str) -> None:
    """A string value (or an array's item) against the field's choices and pattern."""
    if field.enum is not None and value not in field.enum:
        choices = [repr(c) for c in field.enum]
        names = f"neither {choices[0]} nor {choices[1]}" if len(choices) == 2 else f"none of {', '.join(choices)}"
        raise ValueError(f"{field.name}: {value!r} is {names}")
    if field.pattern is not None and not re.search(field.pattern, value):
        raise ValueError(f"{field.name}: {value!r} does not match {field.pattern}")


_KINDS = {"string": "a string", "integer": "an integer", "boolean": "true or false", "array": "a list"}


def _is_of(kind: str, value: Any) -> bool:
    if kind == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "array":
        return isinstance(value, (list, tuple))
    return isinstance(value, {"string": str, "boolean": bool}[kind])


def _data_fields() -> tuple[Field, ...]:
    return (
        Field(
            "data_dir",
            "",
            "string",
            "Kaldi data root",
            DATA,
            "Directory holding one Kaldi data directory per split (train/ and test/ required, "
            "dev/, test_noisy/ and test_engine/ used when present). Empty: make the demo corpus. "
            "Relative paths are the repository's (local mode).",
        ),
        Field(
            "features_dir",
            "",
            "string",
            "Features directory",
            DATA,
            "Where the features go, one Kaldi data directory per split (FEATURES_DIR/train, ...) "
            "with copies of the corpus' tables. Empty: into the corpus' own data directories. Set it for "
            "a read-only corpus; runs that name the same directory reuse its features.",
        ),
        Field(
            "allow_pipes",
            False,
            "boolean",
            "Run wav.scp commands",
            DATA,
            "Run wav.scp (and feats.scp) entries of the form `command |` in a shell. Off: the "
            "decoders of Kaldi recipes (flac -c -d -s, sph2pipe, sox to wav) are read without running "
            "them and any other command is rejected, with the reason, in feats_rejected.tsv.",
        ),
        Field(
            "phonemes",
            "en-us",
            "string",
            "Phonemes' accent",
            DATA,
            "An espeak-ng voice (en-us, en-gb, ...): the shards also hold every transcript's "
            "phonemes in its accent, for a synthesis model that reads phonemes (tts.input: phonemes, "
            "as the demo's does). Empty: characters only.",
        ),
    )


def _demo_fields() -> tuple[Field, ...]:
    return (
        Field(
            "demo_utterances",
            2500,
            "integer",
            "Demo corpus size",
            DATA,
            "Utterances of the demo corpus (train, dev and test together); only used when data_dir is empty.",
            minimum=20,
            maximum=100000,
        ),
        Field(
            "demo_text",
            "open",
            "string",
            "Demo corpus sentences",
            DATA,
            "open: sentences of open English (WordNet's examples, spelled out as spoken); grammar: the "
            "small grammar of commands, numbers and times. Only used when data_dir is empty.",
            enum=DEMO_TEXTS,
        ),
        Field(
            "demo_engines",
            voices.ENGINES,
            "array",
            "Demo corpus engines",
            DATA,
            "Synthesizers whose voices the demo corpus speaks in; the voices below of another "
            "engine are left out (and with them test_engine, when none of its voices is left).",
            enum=voices.ENGINES,
            min_items=1,
            unique_items=True,
        ),
    )


def _voice_fields() -> tuple[Field, ...]:
    """The demo corpus' voices of each group (plan.VOICE_GROUPS), and the shards of the splits."""
    return (
        *(
            Field(
                f"demo_{group}_voices",
                (),
                "array",
                f"Demo corpus voices: {title}",
                DATA,
                f"{what}, one ENGINE:VOICE a line (espeak-ng:en-us+f2, flite:awb, festival:ked_diphone). "
                f"Empty: {voices.describe(default, most=8)}.",
                pattern=VOICE_PATTERN,
            )
            for group, title, what, default in (
                ("train", "training", "Voices heard in training (and dev)", voices.TRAIN_VOICES),
                ("test", "test", "Held-out voices of the test split", voices.TEST_VOICES),
                (
                    "test_engine",
                    "held-out engine",
                    "Voices of test_engine, the test sentences in an engine's voices never heard in training",
                    voices.TEST_ENGINE_VOICES,
                ),
            )
        ),
        Field(
            "num_shards",
            8,
            "integer",
            "Shards per split",
            DATA,
            "TFRecord shards per split; at least num_workers (each worker reads its own).",
            minimum=1,
            maximum=1024,
        ),
    )


def _model_fields() -> tuple[Field, ...]:
    """Which registered models train, and the registered strategy that combines their workers."""
    models, strategies = catalog.models(), catalog.strategies()
    return (
        Field(
            "models",
            tuple(models),
            "array",
            "Models",
            TRAINING,
            "Which models to train, evaluate and register.",
            enum=tuple(models),
            min_items=1,
            unique_items=True,
            values_display={name: entry.title for name, entry in models.items()},
        ),
        Field(
            "strategy",
            "allreduce",
            "string",
            "Distributed strategy",
            TRAINING,
            "How the Horovod workers combine their updates.",
            enum=tuple(strategies),
            values_display={name: entry.title for name, entry in strategies.items()},
        ),
    )


def _worker_fields() -> tuple[Field, ...]:
    """How many workers train and feed the training, and how long it trains."""
    return (
        Field(
            "num_workers",
            2,
            "integer",
            "Training workers",
            TRAINING,
            "Horovod processes (local: horovodrun -np N on this machine) or MPI "
            "worker pods (kubernetes: one per GPU node).",
            minimum=1,
            maximum=512,
        ),
        Field(
            "data_service_workers",
            0,
            "integer",
            "tf.data service workers",
            TRAINING,
            "Input workers of a tf.data service that makes the training batches for the ranks, "
            "started for each training and stopped after it (local: processes on 127.0.0.1; kubernetes: a "
            "dispatcher and a Deployment of CPU worker pods beside the MPIJob). 0: off, each rank reads its "
            "own shards. Feeds the acoustic model, and the synthesis model under adpsgd.",
            minimum=0,
            maximum=256,
        ),
        *(
            Field(
                name,
                None,
                ("null", "integer"),
                title,
                TRAINING,
                f"{what}; empty: the config file's value.",
                minimum=1,
            )
            for name, title, what in (
                ("epochs", "Epochs", "Passes over the training split"),
                ("max_steps", "Maximum steps", "Stop training after this many steps"),
            )
        ),
    )


def _config_fields() -> tuple[Field, ...]:
    """The training config file of each registered model."""
    return tuple(
        Field(
            f"{name}_config",
            entry.config_file,
            "string",
            f"Training config: {name}",
            TRAINING,
            f"YAML file of TrainConfig fields for {entry.title}.",
            min_length=1,
        )
        for name, entry in catalog.models().items()
    )


def _decoding_fields() -> tuple[Field, ...]:
    return (
        Field(
            "train_overrides",
            (),
            "array",
            "Training overrides",
            TRAINING,
            "KEY=VALUE settings of the training config for every model, passed on as "
            "`models.train --set KEY=VALUE`: optim.learning_rate=0.002, a strategy's options "
            "(strategy.gossip=random-ring for adpsgd), a model's own (asr.units=256). Checked by `plan` "
            "before any work starts.",
            pattern=OVERRIDE_PATTERN,
        ),
        Field(
            "word_lm",
            True,
            "boolean",
            "Word language model",
            TRAINING,
            "Build a word n-gram (pipeline.lm) beside training, choose its weights on a dev split "
            "in held-out voices and decode the acoustic model with it in evaluation, the registry and serving. "
            "Off: greedy and character beam search only; an error for a model of phone targets (asr.targets: "
            "phones), which spells words only through the decoding graph built from the LM.",
        ),
        Field(
            "lm_text",
            "",
            "string",
            "Word LM text",
            TRAINING,
            "A text of the domain, one sentence per line (normalized as the transcripts are), for the "
            "word LM. Empty: the training split's transcripts. A phone model's LM text is this text in place of "
            "the open-text source's, less the held-out splits' sentences, with the training transcripts. "
            "Relative paths are the repository's (local mode).",
        ),
        Field(
            "lexicon",
            "cmudict",
            "string",
            "Phone model's lexicon",
            TRAINING,
            "Where a phone model's lexicon of the LM text comes from, stress folded in both. cmudict: CMUdict's "
            "pronunciations (pipeline.cmudict_lexicon), espeak-ng's mapped to ARPAbet for the words it lacks; the "
            "shards' phone targets are each word's pronunciation in it. espeak: espeak-ng's phonemes "
            "(pipeline.text_lexicon), the targets espeak-ng's phonemes of each sentence in context.",
            enum=LEXICONS,
        ),
        Field(
            "eval_utterances",
            100,
            "integer",
            "Synthesis evaluation utterances",
            TRAINING,
            "Test sentences the synthesis model speaks in its evaluation (mel distortion, intelligibility).",
            minimum=1,
        ),
    )


def _run_fields() -> tuple[Field, ...]:
    return (
        Field(
            "experiment",
            "speechflow",
            "string",
            "MLflow experiment",
            TRACKING,
            "MLflow experiment of the runs; the models are registered as "
            "EXPERIMENT-asr and EXPERIMENT-tts. MLFLOW_TRACKING_URI names the store.",
            min_length=1,
            pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$",
        ),
        Field(
            "execution_mode",
            "local",
            "string",
            "Execution mode",
            EXECUTION,
            "Where the stages run.",
            enum=EXECUTION_MODES,
            values_display={
                "local": "local (child processes on the Airflow worker)",
                "kubernetes": "kubernetes (pods and an MPIJob)",
            },
        ),
        Field(
            "gpus_per_worker",
            None,
            ("null", "integer"),
            "GPUs per worker pod",
            EXECUTION,
            "kubernetes only: GPUs (MPI slots) per worker pod; empty: the cluster settings' value.",
            minimum=0,
        ),
        Field(
            "work_root",
            "",
            "string",
            "Work root",
            EXECUTION,
            "Where each run's directory (shards, models, summary) goes. Empty: "
            "SPEECHFLOW_WORK_ROOT, else .runs/pipeline (local) or /data/runs (kubernetes).",
        ),
    )


# The form's params in its order; the registered models (common/catalog.py), extensions' included.
FIELDS: tuple[Field, ...] = (
    *_data_fields(),
    *_demo_fields(),
    *_voice_fields(),
    *_model_fields(),
    *_worker_fields(),
    *_config_fields(),
    *_decoding_fields(),
    *_run_fields(),
)
