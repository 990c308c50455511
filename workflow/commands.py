"""Every stage's command line, built in this one place.

The DAG's tasks (through workflow/runner.py), the cluster manifests and the benchmarks all take
their argv from here, so a flag renamed in a stage is renamed once. Functions return the
arguments after `python -m MODULE`; `module_command` and `horovodrun_local` put a launcher in front.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path

from common import catalog
from common.splits import AUGMENTED_SPLIT, CLEAN_SPLIT
from workflow.plan import POD_XCOM_FILE, Plan

CORPUS, AUGMENT, FEATURES, SHARDS = "pipeline.corpus", "pipeline.augment", "pipeline.features", "pipeline.shards"
TRAIN, EVALUATE, REGISTRY = "models.train", "models.evaluate", "models.registry"
LM, TUNE_LM = "pipeline.lm", "models.tune_lm"
# A phone model's decoding graph: its LM text, the text's lexicon, and the lang dir with HLG.fst
LM_TEXT, LANG = "pipeline.lm_text", "pipeline.lang"
# The form's `lexicon` -> the stage that writes the lexicon. CMUdict's is the demo's: it read dev and dev_engine
# at the lower WER through HLG, two seeds a lexicon (the commit that made it the default gives the figures).
LEXICON_MODULES = {"cmudict": "pipeline.cmudict_lexicon", "espeak": "pipeline.text_lexicon"}
# What pipeline/lm_text.py and pipeline/lm.py write into their directories, which the next stage reads
LM_TEXT_FILE, ARPA_FILE = "lm_text.txt", "lm.arpa"
# espeak-ng's voice where the form names none: pipeline/phonemes.py DEFAULT_VOICE, written out because the
# Airflow image holds only `workflow` and `common` (tests/test_dag.py checks that the two agree)
DEFAULT_VOICE = "en-us"
DATA_SERVICE = "pipeline.data_service"


def module_command(python: str, module: str, args: Sequence[str]) -> list[str]:
    return [python, "-m", module, *args]


def horovodrun_local(python: str, np: int, module: str, args: Sequence[str], hosts: str | None = None) -> list[str]:
    """`horovodrun -np N -H localhost:N --gloo PYTHON -m MODULE ARGS` of `python`'s environment;
    `hosts` replaces `localhost:N` (e.g. two "hosts" on one machine: `localhost:2,127.0.0.1:2`)."""
    horovodrun = str(Path(python).with_name("horovodrun"))
    return [horovodrun, "-np", str(np), "-H", hosts or f"localhost:{np}", "--gloo", python, "-m", module, *args]


# ---- data stages ---------------------------------------------------------------------------------


def corpus_args(plan: Plan) -> list[str]:
    args = ["--out", plan.data_root, "--num-utterances", str(plan.demo_utterances), "--text", plan.demo_text]
    args += ["--engines", *plan.demo_engines]
    for group, specs in plan.demo_voices.items():
        args += [f"--{group.replace('_', '-')}-voices", *specs]
    return args


def augment_args(plan: Plan) -> list[str]:
    """`pipeline.augment`: the clean training split and the copies the plan's training configs ask for
    (`plan.augment`, each setting a `--set KEY=VALUE` in JSON, which the stage reads as YAML)."""
    args = ["--data", plan.data_dir(CLEAN_SPLIT), "--out", plan.data_dir(AUGMENTED_SPLIT)]
    for key, value in plan.augment.items():
        args += ["--set", f"{key}={json.dumps(value)}"]
    if plan.allow_pipes:
        args.append("--allow-pipes")
    return [*args, "--no-progress"]


def features_args(plan: Plan, split: str) -> list[str]:
    args = ["--data-dir", plan.data_dir(split)]
    if plan.features_dir(split) != args[1]:
        args += ["--out-dir", plan.features_dir(split)]
    if plan.allow_pipes:
        args.append("--allow-pipes")
    return [*args, "--no-progress"]


def phonemes_voice(plan: Plan) -> str:
    """The espeak-ng voice of the shards' phonemes (the form's `phonemes`) and of a phone model's lexicon;
    a phone model's targets are espeak-ng's phonemes in context, so it has espeak-ng's default voice where
    the form gives none. "": no phonemes."""
    return plan.phonemes or (DEFAULT_VOICE if plan.lexicon_dir else "")


def shards_args(plan: Plan) -> list[str]:
    """`pipeline.shards` of the plan's splits; with a phone model's lexicon (`lexicon_dir`), every
    transcript's phone targets over its phone table too, from espeak-ng's phonemes of the sentence."""
    args = [a for s in plan.splits for a in ("--split", f"{s}={plan.features_dir(s)}")]
    if plan.allow_pipes:
        args.append("--allow-pipes")
    if phonemes_voice(plan):
        args += ["--phonemes", phonemes_voice(plan)]
    if plan.lexicon_dir and plan.lexicon == "espeak":
        args += ["--phones-from", plan.lexicon_dir, "--phone-source", "espeak"]
    elif plan.lexicon_dir:  # each word's pronunciation; a transcript word CMUdict lacks: espeak-ng's, mapped
        args += ["--phones-from", plan.lexicon_dir, "--phone-source", "lexicon", "--g2p"]
    return [*args, "--out", plan.shards_dir, "--num-shards", str(plan.num_shards), "--no-progress"]


def lm_text_file(plan: Plan) -> str:
    """The phone model's LM text (pipeline.lm_text writes it, pipeline.text_lexicon and pipeline.lm read it)."""
    return f"{plan.lm_text_dir}/{LM_TEXT_FILE}"


def lm_text_args(plan: Plan) -> list[str]:
    """`pipeline.lm_text`: a phone model's LM text, with no sentence of a held-out split of the data
    root in it: the open-text source's sentences (the form's `lm_text` in their place, when given; as
    JSON, which the stage reads as YAML) that no split holds, then the training transcripts."""
    args = ["--data", plan.data_root, "--out", plan.lm_text_dir]
    return [*args, "--set", f"text_file={json.dumps(plan.lm_text)}"] if plan.lm_text else args


def lexicon_module(plan: Plan) -> str:
    """The stage that writes the plan's lexicon (LEXICON_MODULES)."""
    return LEXICON_MODULES[plan.lexicon]


def lexicon_args(plan: Plan) -> list[str]:
    """`lexicon_module(plan)`: a Kaldi dict dir of the LM text's words, stress folded, espeak-ng's in the accent
    of the shards' phonemes (CMUdict's: for the words CMUdict lacks). With espeak-ng's lexicon, folded stress read
    dev and dev_engine at the lower WER through HLG than stress kept."""
    args = ["--text", lm_text_file(plan), "--out", plan.lexicon_dir, "--set", f"voice={phonemes_voice(plan)}"]
    args += ["--set", "fold_stress=true"]
    return args if plan.lexicon == "cmudict" else [*args, "--no-progress"]  # cmudict_lexicon takes 6 s, no bar


def graph_args(plan: Plan) -> list[str]:
    """`pipeline.lang`: the decoding graph (a lang dir with HLG.fst) of the lexicon and the word LM."""
    return ["--dict", plan.lexicon_dir, "--arpa", f"{plan.lm_dir}/{ARPA_FILE}", "--out", plan.lang_dir]


# ---- training and evaluation ---------------------------------------------------------------------


def train_args(
    shards: str | Path,
    workdir: str | Path,
    *,
    model: str | None = None,
    strategy: str | None = None,
    config: str | Path | None = None,
    epochs: int | None = None,
    max_steps: int | None = None,
    sets: Sequence[str] = (),
    experiment: str | None = None,
    parent_run_id: str | None = None,
    run_name: str | None = None,
    data_service: str | None = None,
    extra: Sequence[str] = (),
) -> list[str]:
    """Arguments of `python -m models.train`; None leaves a flag out (the config's value holds).
    `data_service` is a tf.data service dispatcher (grpc://HOST:PORT) the ranks read their batches from."""
    args: list[str] = []
    for flag, value in (("--model", model), ("--strategy", strategy)):
        if value is not None:
            args += [flag, value]
    args += ["--shards", str(shards), "--workdir", str(workdir)]
    for flag, value in (
        ("--config", config),
        ("--epochs", epochs),
        ("--max-steps", max_steps),
        ("--experiment", experiment),
        ("--mlflow-parent-run-id", parent_run_id),
        ("--run-name", run_name),
        ("--data-service", data_service),
    ):
        if value is not None:
            args += [flag, str(value)]
    for item in sets:
        args += ["--set", item]
    return [*args, *extra]


def uses_data_service(plan: Plan, model: str) -> bool:
    """Whether `model` reads its batches from a tf.data service in this run: with data_service_workers,
    a model whose batches the service makes (the acoustic model) always; another only under a strategy
    that shares the epochs' batches (adpsgd; models/training/schedule.py serves it only those)."""
    declared = catalog.model(model).data_service or catalog.strategy(plan.strategy).budget_in_data
    return plan.data_service_workers > 0 and declared


def plan_train_args(plan: Plan, model: str, parent_run_id: str, data_service: str | None = None) -> list[str]:
    """`models.train` for one model of a DAG run (local horovodrun or the MPIJob's launcher);
    `data_service`: the dispatcher's grpc://HOST:PORT when `uses_data_service`."""
    return train_args(
        plan.shards_dir,
        plan.workdirs[model],
        model=model,
        strategy=plan.strategy,
        config=plan.configs[model],
        epochs=plan.epochs,
        max_steps=plan.max_steps,
        experiment=plan.experiment,
        parent_run_id=parent_run_id,
        run_name=f"train-{model}",
        data_service=data_service,
        sets=plan.train_overrides,
    )


def dispatcher_args(port: int, work_dir: str | None = None, port_file: str | None = None) -> list[str]:
    """`pipeline.data_service dispatcher`: serves on `port`; with `work_dir` it journals its state there
    and picks it up again after a restart (fault-tolerant mode). Port 0 with `port_file`: it picks a
    free port and writes it there."""
    args = ["dispatcher", "--port", str(port)]
    args += ["--work-dir", work_dir] if work_dir else []
    return [*args, "--port-file", port_file] if port_file else args


def worker_args(dispatcher: str, port: int, address: str, port_file: str | None = None) -> list[str]:
    """`pipeline.data_service worker`: registers with `dispatcher` (HOST:PORT), serves on `port`, and
    tells the trainers to reach it at `address` (HOST:PORT as seen from the training ranks; `%port%`
    stands for its port). Port 0 with `port_file`: it picks a free port and writes it there."""
    args = ["worker", "--dispatcher", dispatcher, "--port", str(port), "--address", address]
    return [*args, "--port-file", port_file] if port_file else args


def evaluate_args(plan: Plan, model: str, parent_run_id: str, with_asr: bool) -> list[str]:
    """`models.evaluate` of `model`; `with_asr`: the model that listens to it (its catalog entry's
    `listener`, the acoustic model) was trained in this run and transcribes what it makes."""
    args = ["--model", plan.workdirs[model], "--shards", plan.shards_dir, "--mlflow-parent-run-id", parent_run_id]
    listener = catalog.model(model).listener
    if listener:  # a model whose output is heard: a synthesis model
        args += ["--max-utterances", str(plan.eval_utterances)]
        if with_asr:
            args += ["--asr-model", plan.workdirs[listener]]
    return args


def lm_args(plan: Plan) -> list[str]:
    """`pipeline.lm`: the word LM of a phone model's LM text (pipeline.lm_text), its words spelled by
    the run's lexicon; else of the plan's text (`lm_text`) or of the training transcripts, in the
    alphabet of the run's shards."""
    if plan.lm_text_dir:
        return ["--text-file", lm_text_file(plan), "--lexicon", plan.lexicon_dir, "--out", plan.lm_dir]
    source = ["--text-file", plan.lm_text] if plan.lm_text else ["--data", plan.data_dir(CLEAN_SPLIT)]
    return [*source, "--vocabulary-from", plan.shards_dir, "--out", plan.lm_dir]


def tune_lm_args(plan: Plan, model: str) -> list[str]:
    """`models.tune_lm --attach`: the decoding settings chosen on the shards' dev split in held-out voices
    (dev_engine, else dev) for `model`'s trained weights, and what it decodes with attached to its model
    directory: a phone model's decoding graph (`lang_dir`: its acoustic scale and word penalty), else the
    word LM (its weight and word bonus)."""
    decoder = plan.lang_dir or plan.lm_dir
    return ["--model", plan.workdirs[model], "--shards", plan.shards_dir, "--lm", decoder, "--attach", "--no-progress"]


def graph_skip_reason(plan: Plan) -> str:
    """Why the run has no LM text, lexicon or decoding graph stage; "" when it has them."""
    if plan.lang_dir:
        return ""
    decoding = [m for m in plan.models if catalog.model(m).word_lm]
    if not plan.lm_dir:
        return "no word LM in this run (word_lm is off, or no selected model decodes words): no decoding graph"
    settings = ", ".join(f"{m}.targets: chars" for m in decoding)
    return f"no model trains on phones ({settings}): it decodes with the word LM alone, through no lexicon or graph"


# ---- MLflow bookkeeping (models.registry) --------------------------------------------------------


def registry_args(command: str, **options) -> list[str]:
    """`models.registry COMMAND --option value ...`; list values repeat the flag, None leaves it out."""
    args = [command]
    for name, value in options.items():
        flag = "--" + name.replace("_", "-")
        for item in value if isinstance(value, (list, tuple)) else [value]:
            if item is not None:
                args += [flag, str(item)]
    return args


def start_parent_args(plan: Plan) -> list[str]:
    return registry_args("start-parent", experiment=plan.experiment, dag_id=plan.dag_id, dag_run_id=plan.dag_run_id)


def stage_record(stage: str, path: str, name: str, **params: str) -> dict:
    """One data stage's output for `record-stages` (a child run of the DAG run's parent in MLflow).

    The DAG records the corpus, the features and the shards together, where the shards are made:
    `models.registry` imports MLflow, which takes seconds a process (about 4 s on a 2-core CPU),
    and a split's features take less than one."""
    return {"stage": stage, "path": path, "name": name, "params": params}


def record_stages_args(parent_run_id: str, records: Sequence[Mapping]) -> list[str]:
    """`record-stages`: each of `records` ({"stage", "path", "name", "params"}) as one `--record` JSON."""
    return registry_args(
        "record-stages", parent_run_id=parent_run_id, record=[json.dumps(dict(r), sort_keys=True) for r in records]
    )


def register_args(plan: Plan, model: str, parent_run_id: str) -> list[str]:
    return registry_args(
        "register", workdir=plan.workdirs[model], name=plan.model_name(model), parent_run_id=parent_run_id
    )


def finish_args(plan: Plan, parent_run_id: str, failed: bool) -> list[str]:
    return registry_args(
        "finish",
        parent_run_id=parent_run_id,
        status="FAILED" if failed else "FINISHED",
        summary=f"{plan.run_dir}/summary.json",
        workdir=[f"{m}={plan.workdirs[m]}" for m in plan.models],
    )


def with_json_file(args: Sequence[str], json_file: str = POD_XCOM_FILE) -> list[str]:
    """`models.registry` arguments that also write the JSON result to `json_file` (a pod's XCom file)."""
    return ["--json-file", json_file, *args]
