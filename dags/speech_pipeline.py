"""speech_pipeline: Kaldi data directories (or the demo corpus) to trained, evaluated, registered models.

    plan -> start_mlflow_run -> prepare_corpus -> features_{train,dev,test,...,dev_engine} -> make_shards
                                               -> augment_train -> features_train_aug ----------->
                                               -> lm_text -> lexicon ---------------------------->
         -> build_lm -> build_graph ------------------------------>
         -> train_asr ------> tune_lm_asr -> evaluate_asr ---------------> register_asr -> finish_mlflow_run
         -> train_tts -> evaluate_tts (with the new acoustic model) ------> register_tts ->

`prepare_corpus` runs only when `data_dir` is empty; `augment_train` (pipeline/augment.py: speed,
reverberation, noise and telephone copies of the training audio) and `features_train_aug` only when
a selected model's training config asks for copies (`asr.augment.copies.*`, in the file or the
form's overrides), and that model then trains on `train_aug`; the synthesis model reads clean
`train`. `build_lm` (pipeline/lm.py) makes a word n-gram of the training transcripts (or of the
form's `lm_text`) while the models train, and `tune_lm_asr` (models/tune_lm.py) chooses its weight
and word bonus on `dev_engine` (new sentences in held-out voices; `dev` where there is none) and
attaches it to the trained acoustic model, which is then evaluated, registered and served with it;
`word_lm` off skips both. An acoustic model that trains on phones (`asr.targets: phones`) spells words
only through a decoding graph: `lm_text` (pipeline/lm_text.py) writes the LM's text of general English,
which holds no held-out sentence, and `lexicon` (pipeline/cmudict_lexicon.py, or text_lexicon.py) its
words' pronunciations; the shards store each transcript's phones over the lexicon's phone table,
`build_lm` reads that text, `build_graph` (pipeline/lang.py) makes HLG of the lexicon and the LM, and
`tune_lm_asr` chooses its acoustic scale and word penalty and attaches it; a character model skips the
three. Each task runs
one stage's command line, from the training environment (`execution_mode=local`; training under
`horovodrun -np num_workers`) or as a pod of the training image (`kubernetes`; training as an MPIJob).
With `data_service_workers`, training reads its batches from a tf.data service started beside it.
Every stage skips work that is already done, so a retried or cleared task picks up where it stopped.
MLflow: one parent run per DAG run, a child run per stage; the registry's alias `champion` moves only
to a better model.
What the tasks do lives in the `workflow` package (the form in workflow/form.py, each task's body in
workflow/tasks.py, the plan, the command lines, the runners); this file wires.
"""

from __future__ import annotations

from datetime import timedelta

import pendulum
from airflow.sdk import Asset, Param, dag, get_current_context, setup, task, teardown

from common import catalog
from workflow import form, tasks
from workflow.plan import AUGMENTED_SPLIT, MODELS, SPLITS

# What the pipeline produces, for DAGs scheduled on them; each event's `extra` holds the paths.
CORPUS = Asset(name="speechflow.corpus", uri="x-speechflow://corpus", group="speechflow")
FEATURES = Asset(name="speechflow.features", uri="x-speechflow://features", group="speechflow")
SHARDS = Asset(name="speechflow.shards", uri="x-speechflow://shards", group="speechflow")
TRAINED = {m: Asset(name=f"speechflow.model.{m}", uri=f"x-speechflow://model/{m}", group="speechflow") for m in MODELS}
REGISTERED = {
    m: Asset(name=f"speechflow.registered.{m}", uri=f"x-speechflow://registered/{m}", group="speechflow")
    for m in MODELS
}

# The trigger form (workflow/form.py states each param's rules, which the plan checks too).
PARAMS = {f.name: Param(f.initial(), description=f.description, **form.json_schema(f)) for f in form.FIELDS}

RETRIES = dict(
    retries=2,
    retry_delay=timedelta(seconds=30),
    retry_exponential_backoff=2.0,
    max_retry_delay=timedelta(minutes=10),
    execution_timeout=timedelta(hours=2),
)


# The tasks: each one's body is the function of the same name in workflow/tasks.py.
@task(retries=0)
def plan() -> dict:
    return tasks.plan(get_current_context())


@setup
def start_mlflow_run(plan: dict) -> str:
    return tasks.start_mlflow_run(get_current_context(), plan)


@task(outlets=[CORPUS])
def prepare_corpus() -> dict:
    return tasks.prepare_corpus(get_current_context(), CORPUS)


@task(trigger_rule="none_failed")
def augment_train() -> dict:
    return tasks.augment_train(get_current_context())


@task(trigger_rule="none_failed", outlets=[FEATURES])
def features(split: str) -> dict:
    return tasks.features(get_current_context(), split, FEATURES)


@task(trigger_rule="none_failed", outlets=[SHARDS])
def make_shards(featurized: list[dict | None]) -> dict:
    return tasks.make_shards(get_current_context(), featurized, SHARDS)


@task(execution_timeout=timedelta(hours=12))
def train(model: str, shards: dict) -> dict:
    return tasks.train(get_current_context(), model, TRAINED[model])


@task(trigger_rule="none_failed")
def build_lm(shards: dict) -> dict:
    return tasks.build_lm(get_current_context())


@task(trigger_rule="none_failed")
def graph_stage(stage: str) -> dict:
    return tasks.graph_stage(get_current_context(), stage)


@task(trigger_rule="none_failed")
def tune_lm(model: str, trained: dict | None, lm: dict | None, graph: dict | None) -> dict:
    return tasks.tune_lm(get_current_context(), model, trained, lm, graph)


@task(trigger_rule="none_failed")
def evaluate(model: str, trained: dict | None, acoustic: dict | None = None) -> dict:
    return tasks.evaluate(get_current_context(), model, trained, acoustic)


@task
def register(model: str, evaluated: dict) -> dict:
    return tasks.register(get_current_context(), model, REGISTERED[model])


@teardown
def finish_mlflow_run(parent_run_id: str) -> dict:
    return tasks.finish_mlflow_run(get_current_context(), parent_run_id)


@dag(
    dag_id="speech_pipeline",
    schedule=None,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    params=PARAMS,
    default_args=RETRIES,
    doc_md=__doc__,
    tags=["speechflow", "mlflow", "horovod"],
    dag_display_name="Speech pipeline: Kaldi data to registered models",
)
def speech_pipeline():
    parent = start_mlflow_run(plan())
    corpus = prepare_corpus()
    parent >> corpus
    featurized = [features.override(task_id=f"features_{s}")(s) for s in SPLITS]
    corpus >> featurized
    augmented = features.override(task_id=f"features_{AUGMENTED_SPLIT}")(AUGMENTED_SPLIT)
    corpus >> augment_train() >> augmented
    featurized.append(augmented)
    # A phone model's LM text and lexicon, beside the features: the shards store phones of its phone table.
    lm_text = graph_stage.override(task_id="lm_text")("lm_text")
    lexicon = graph_stage.override(task_id="lexicon")("lexicon")
    corpus >> lm_text >> lexicon
    shards = make_shards(featurized)
    lexicon >> shards
    trained = {m: train.override(task_id=f"train_{m}", outlets=[TRAINED[m]])(m, shards) for m in MODELS}
    lm = build_lm(shards)
    lm_text >> lm
    graph = graph_stage.override(task_id="build_graph")("graph")
    lm >> graph
    # A model that decodes with a word LM is evaluated (and registered) with the one chosen for it.
    decoding = {
        m: tune_lm.override(task_id=f"tune_lm_{m}")(m, trained[m], lm, graph)
        if catalog.model(m).word_lm
        else trained[m]
        for m in MODELS
    }
    # Intelligibility: a model whose output is heard (the synthesis model) is evaluated with its
    # listener (the acoustic model) transcribing what it made, once its word LM or graph is attached.
    listeners = {m: catalog.model(m).listener for m in MODELS}
    evaluated = {
        m: evaluate.override(task_id=f"evaluate_{m}")(
            m, decoding[m], *([decoding[listeners[m]]] if listeners[m] else [])
        )
        for m in MODELS
    }
    registered = [register.override(task_id=f"register_{m}", outlets=[REGISTERED[m]])(m, evaluated[m]) for m in MODELS]
    registered >> finish_mlflow_run(parent)


speech_pipeline()
