"""What each task of the `speech_pipeline` DAG does, one function a task: dags/speech_pipeline.py only wires them.

Each takes the task's Airflow context (and what its upstream tasks returned), reads the run's plan from
the `plan` task's XCom, runs its stage through workflow/runner.py, and returns the task's XCom. A task
with an outlet gets its Asset and sets the event's `extra` (the paths it made). A task that has nothing
to do in this run is skipped with the reason. Airflow is imported only where a task is skipped or
failed, so this module loads without it.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, NoReturn

from workflow import commands, runner
from workflow.plan import AUGMENTED_SPLIT, Plan, make_plan

log = logging.getLogger("speechflow.dag")  # shown by scripts/demo.sh

Context = Mapping[str, Any]


def skip(reason: str) -> NoReturn:
    """Skips the running task, saying why."""
    from airflow.sdk.exceptions import AirflowSkipException

    raise AirflowSkipException(reason)


def plan_of(context: Context) -> Plan:
    """The run's plan, as the `plan` task left it."""
    return Plan.from_xcom(context["ti"].xcom_pull(task_ids="plan"))


def parent_run_id(context: Context) -> str:
    """The MLflow parent run of this DAG run."""
    # Pulled rather than passed: a setup task's direct downstreams must use the trigger rule
    # all_success, and several stages here must run after a skipped one.
    return context["ti"].xcom_pull(task_ids="start_mlflow_run")


def plan(context: Context) -> dict:
    """Checks the params and fixes every path of this run; fails the run, without retries, when they do not fit."""
    try:
        return make_plan(context["params"], context["dag"].dag_id, context["run_id"]).to_xcom()
    except ValueError as err:
        from airflow.sdk.exceptions import AirflowFailException

        raise AirflowFailException(f"invalid params: {err}") from err


def start_mlflow_run(context: Context, planned: dict) -> str:
    """The MLflow parent run of this DAG run (the same one again on a retry)."""
    p = Plan.from_xcom(planned)
    return runner.run_mlflow_step(p, context, "mlflow-start", commands.start_parent_args(p))["parent_run_id"]


def prepare_corpus(context: Context, asset) -> dict:
    """The demo corpus, when the form names no data_dir."""
    p = plan_of(context)
    if not p.make_corpus:
        skip(f"data_dir is given ({p.data_root}): no demo corpus")
    runner.run_stage(p, context, "corpus", commands.CORPUS, commands.corpus_args(p))
    context["outlet_events"][asset].extra = {"data_root": p.data_root, "dag_run_id": p.dag_run_id}
    return {"data_root": p.data_root}


def augment_train(context: Context) -> dict:
    """Copies of the training audio (speed, reverberation, noise, telephone) beside it, as the split
    train_aug, when a model's training config asks for them."""
    p = plan_of(context)
    if not p.augment:
        skip("no selected model's training config asks for copies of the training audio")
    runner.run_stage(p, context, "augment", commands.AUGMENT, commands.augment_args(p))
    return {"data_dir": p.data_dir(AUGMENTED_SPLIT)}


def features(context: Context, split: str, asset) -> dict:
    """The features of `split`, when the corpus has it."""
    p = plan_of(context)
    if split not in p.splits:
        skip(
            "no model asks for copies of the training audio"
            if split == AUGMENTED_SPLIT
            else f"{p.data_root} has no {split} split"
        )
    data_dir = p.features_dir(split)
    runner.run_stage(p, context, f"features-{split}", commands.FEATURES, commands.features_args(p, split))
    context["outlet_events"][asset].extra = {"split": split, "data_dir": data_dir}
    return {"split": split, "data_dir": data_dir}


def _record(context: Context, plan: Plan, records: list[dict]) -> dict[str, dict]:
    """Child runs of the data stages in `records` (`commands.stage_record`), by name."""
    args = commands.record_stages_args(parent_run_id(context), records)
    recorded = runner.run_mlflow_step(plan, context, "record-stages", args)["records"]
    return {r["name"]: r for r in recorded}


def make_shards(context: Context, featurized: list[dict | None], asset) -> dict:
    """Shards of the featurized splits; records the corpus, the features and the shards in MLflow
    (one child run each), all in one process: see `commands.stage_record`."""
    p = plan_of(context)
    made = [commands.stage_record("corpus", p.data_root, "corpus")] if p.make_corpus else []
    if p.augment:
        made.append(commands.stage_record("augment", p.data_dir(AUGMENTED_SPLIT), "augment"))
    made += [
        commands.stage_record("features", f["data_dir"], f"features-{f['split']}", split=f["split"])
        for f in featurized
        if f
    ]
    try:
        runner.run_stage(p, context, "shards", commands.SHARDS, commands.shards_args(p))
    except Exception:
        _record(context, p, made)  # what the stages before made is in MLflow even when the shards fail
        raise
    recorded = _record(context, p, [*made, commands.stage_record("shards", p.shards_dir, "shards")])
    manifest = f"{p.shards_dir}/manifest.json"
    context["outlet_events"][asset].extra = {"shards_dir": p.shards_dir, "manifest": manifest}
    return {
        "shards_dir": p.shards_dir,
        "manifest": manifest,
        "mlflow_run_id": recorded["shards"]["run_id"],
        "counts": {name: r["metrics"] for name, r in recorded.items()},
        "data_dirs": {f["split"]: f["data_dir"] for f in featurized if f},
    }


def train(context: Context, model: str, asset) -> dict:
    """Trains `model`, when it is among the run's models."""
    p = plan_of(context)
    if model not in p.models:
        skip(f"{model} is not among the models to train ({', '.join(p.models)})")
    trained = runner.run_training(p, context, model, parent_run_id(context))
    context["outlet_events"][asset].extra = {"workdir": trained["workdir"], "run_id": trained.get("run_id")}
    return trained


def build_lm(context: Context) -> dict:
    """The word LM (pipeline.lm), in the shards' alphabet, of a phone model's LM text, else of the
    training transcripts or of `lm_text`."""
    p = plan_of(context)
    if not p.lm_dir:
        skip("no word LM: word_lm is off, or no selected model decodes with one")
    return {"lm_dir": p.lm_dir, **runner.run_recorded_stage(p, context, "lm")}


def graph_stage(context: Context, stage: str) -> dict:
    """A stage of a phone model's decoding graph (workflow/runner.py RECORDED_STAGES): `lm_text`, the
    LM's text; `lexicon`, its words' pronunciations; `graph`, HLG of the lexicon and the word LM."""
    p = plan_of(context)
    if not p.lang_dir:
        skip(commands.graph_skip_reason(p))
    return runner.run_recorded_stage(p, context, stage)


def tune_lm(context: Context, model: str, trained: dict | None, lm: dict | None, graph: dict | None) -> dict:
    """Chooses the decoding settings for the trained model on a dev split in held-out voices and attaches
    what it decodes with (models.tune_lm --attach): a phone model's graph (acoustic scale, word penalty),
    else the LM (weight, word bonus); without an LM the model goes on as trained."""
    p = plan_of(context)
    if trained is None:
        skip(f"{model} was not trained in this run")
    if lm is None:
        log.info("%s: no word LM in this run; it is evaluated and registered without one", model)
        return trained
    args = commands.tune_lm_args(p, model)
    runner.run_stage(p, context, f"tune-lm-{model}", commands.TUNE_LM, args, gpus=runner.evaluation_gpus(p))
    return {**trained, "lm_dir": lm["lm_dir"], **({"lang_dir": graph["dir"]} if graph else {})}


def evaluate(context: Context, model: str, trained: dict | None, acoustic: dict | None = None) -> dict:
    """Evaluates the trained `model` (a synthesis model with `acoustic`, its listener) and reads its metrics."""
    p = plan_of(context)
    if trained is None:
        skip(f"{model} was not trained in this run")
    args = commands.evaluate_args(p, model, parent_run_id(context), with_asr=acoustic is not None)
    runner.run_stage(p, context, f"evaluate-{model}", commands.EVALUATE, args, gpus=runner.evaluation_gpus(p))
    metrics = runner.read_eval(p, model)
    return {
        "model": model,
        "workdir": p.workdirs[model],
        "primary_metric": metrics.get("primary_metric"),
        "value": metrics.get(metrics.get("primary_metric", ""), None),
        "metrics": metrics,
    }


def register(context: Context, model: str, asset) -> dict:
    """Registers the evaluated `model`; the alias `champion` moves to it only when it is better."""
    p = plan_of(context)
    args = commands.register_args(p, model, parent_run_id(context))
    result = runner.run_mlflow_step(p, context, f"register-{model}", args)
    keys = ("name", "version", "promoted", "champion_version", "metric", "value")
    context["outlet_events"][asset].extra = {k: result[k] for k in keys}
    return result


def finish_mlflow_run(context: Context, parent: str) -> dict:
    """Ends the parent run (FAILED if any task failed) and writes RUN_DIR/summary.json; logs its figures."""
    p = plan_of(context)
    ti = context["ti"]
    states = ti.get_task_states(dag_id=p.dag_id, run_ids=[p.dag_run_id]).get(p.dag_run_id, {})
    states.pop(ti.task_id, None)
    failed = runner.failed_tasks(states)
    summary = runner.run_mlflow_step(p, context, "mlflow-finish", commands.finish_args(p, parent, bool(failed)))
    done = [ti.xcom_pull(task_ids=t) for t in ("lm_text", "lexicon", "build_lm", "build_graph")]
    summary["stages"] = runner.add_stages_to_summary(p, done)
    _log_summary(summary)
    log.info("summary: %s; failed tasks: %s", f"{p.run_dir}/summary.json", failed or "none")
    return summary


def _log_summary(summary: Mapping[str, Any]) -> None:
    for stage, info in summary["stages"].items():
        log.info("%s: %s s, %s", stage, info["seconds"], info["figures"])
    for model, info in summary["models"].items():
        registered = info.get("registered") or {}
        metric = info.get("primary_metric")
        log.info(
            "%s: %s=%s, %s version %s (%s)",
            model,
            metric,
            info["metrics"].get(metric),
            registered.get("name"),
            registered.get("version"),
            registered.get("reason"),
        )
