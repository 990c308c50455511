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
which holds no held-out sentence, and `lexicon` (pipeline/text_lexicon.py) its words' pronunciations;
the shards store each transcript's phones over the lexicon's phone table, `build_lm` reads that text,
`build_graph` (pipeline/lang.py) makes HLG of the lexicon and the LM, and `tune_lm_asr` chooses its
acoustic scale and word penalty and attaches it; a character model skips the three. Each task runs
one stage's command line, from the training environment (`execution_mode=local`; training under
`horovodrun -np num_workers`) or as a pod of the training image (`kubernetes`; training as an MPIJob). With `data_service_workers`, training reads its
batches from a tf.data service started beside it. Every stage skips work that
is already done, so a retried or cleared task picks up where it stopped. MLflow: one parent run per
DAG run, a child run per stage; the registry's alias `champion` moves only to a better model.
What the tasks run lives in the `workflow` package (plan, command lines, runners); this file wires.
"""

from __future__ import annotations

import logging
from datetime import timedelta

import pendulum
from airflow.sdk import Asset, Param, dag, get_current_context, setup, task, teardown
from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException

from common import catalog, voices
from workflow import commands, runner
from workflow.plan import AUGMENTED_SPLIT, MODELS, SPLITS, Plan, make_plan

log = logging.getLogger("speechflow.dag")  # shown by scripts/demo.sh

# What the pipeline produces, for DAGs scheduled on them; each event's `extra` holds the paths.
CORPUS = Asset(name="speechflow.corpus", uri="x-speechflow://corpus", group="speechflow")
FEATURES = Asset(name="speechflow.features", uri="x-speechflow://features", group="speechflow")
SHARDS = Asset(name="speechflow.shards", uri="x-speechflow://shards", group="speechflow")
TRAINED = {m: Asset(name=f"speechflow.model.{m}", uri=f"x-speechflow://model/{m}", group="speechflow") for m in MODELS}
REGISTERED = {
    m: Asset(name=f"speechflow.registered.{m}", uri=f"x-speechflow://registered/{m}", group="speechflow")
    for m in MODELS
}

DATA, TRAINING, TRACKING, EXECUTION = "Data", "Training", "Tracking", "Execution"
VOICE_PATTERN = rf"^({'|'.join(voices.ENGINES)}):[A-Za-z0-9_+-]+$"
PARAMS = {
    "data_dir": Param(
        "",
        type="string",
        title="Kaldi data root",
        section=DATA,
        description="Directory holding one Kaldi data directory per split (train/ and test/ required, "
        "dev/, test_noisy/ and test_engine/ used when present). Empty: make the demo corpus. "
        "Relative paths are the repository's (local mode).",
    ),
    "features_dir": Param(
        "",
        type="string",
        title="Features directory",
        section=DATA,
        description="Where the features go, one Kaldi data directory per split (FEATURES_DIR/train, ...) "
        "with copies of the corpus' tables. Empty: into the corpus' own data directories. Set it for "
        "a read-only corpus; runs that name the same directory reuse its features.",
    ),
    "allow_pipes": Param(
        False,
        type="boolean",
        title="Run wav.scp commands",
        section=DATA,
        description="Run wav.scp (and feats.scp) entries of the form `command |` in a shell. Off: the "
        "decoders of Kaldi recipes (flac -c -d -s, sph2pipe, sox to wav) are read without running "
        "them and any other command is rejected, with the reason, in feats_rejected.tsv.",
    ),
    "phonemes": Param(
        "en-us",
        type="string",
        title="Phonemes' accent",
        section=DATA,
        description="An espeak-ng voice (en-us, en-gb, ...): the shards also hold every transcript's "
        "phonemes in its accent, for a synthesis model that reads phonemes (tts.input: phonemes, "
        "as the demo's does). Empty: characters only.",
    ),
    "demo_utterances": Param(
        2500,
        type="integer",
        minimum=20,
        maximum=100000,
        title="Demo corpus size",
        section=DATA,
        description="Utterances of the demo corpus (train, dev and test together); only used when data_dir is empty.",
    ),
    "demo_text": Param(
        "open",
        type="string",
        enum=["open", "grammar"],
        title="Demo corpus sentences",
        section=DATA,
        description="open: sentences of open English (WordNet's examples, spelled out as spoken); grammar: the "
        "small grammar of commands, numbers and times. Only used when data_dir is empty.",
    ),
    "demo_engines": Param(
        list(voices.ENGINES),
        type="array",
        items={"type": "string", "enum": list(voices.ENGINES)},
        minItems=1,
        uniqueItems=True,
        examples=list(voices.ENGINES),
        title="Demo corpus engines",
        section=DATA,
        description="Synthesizers whose voices the demo corpus speaks in; the voices below of another "
        "engine are left out (and with them test_engine, when none of its voices is left).",
    ),
    **{
        f"demo_{group}_voices": Param(
            [],
            type="array",
            items={"type": "string", "pattern": VOICE_PATTERN},
            title=f"Demo corpus voices: {title}",
            section=DATA,
            description=f"{what}, one ENGINE:VOICE a line (espeak-ng:en-us+f2, flite:awb, festival:ked_diphone). Empty: "
            f"{voices.describe(default, most=8)}.",
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
    },
    "num_shards": Param(
        8,
        type="integer",
        minimum=1,
        maximum=1024,
        title="Shards per split",
        section=DATA,
        description="TFRecord shards per split; at least num_workers (each worker reads its own).",
    ),
    "models": Param(
        list(MODELS),
        type="array",
        items={"type": "string", "enum": list(MODELS)},
        minItems=1,
        uniqueItems=True,
        examples=list(MODELS),
        section=TRAINING,
        values_display={name: entry.title for name, entry in catalog.models().items()},
        title="Models",
        description="Which models to train, evaluate and register.",
    ),
    "strategy": Param(
        "allreduce",
        type="string",
        enum=list(catalog.strategies()),
        title="Distributed strategy",
        section=TRAINING,
        values_display={name: entry.title for name, entry in catalog.strategies().items()},
        description="How the Horovod workers combine their updates.",
    ),
    "num_workers": Param(
        2,
        type="integer",
        minimum=1,
        maximum=512,
        title="Training workers",
        section=TRAINING,
        description="Horovod processes (local: horovodrun -np N on this machine) or MPI "
        "worker pods (kubernetes: one per GPU node).",
    ),
    "data_service_workers": Param(
        0,
        type="integer",
        minimum=0,
        maximum=256,
        title="tf.data service workers",
        section=TRAINING,
        description="Input workers of a tf.data service that makes the training batches for the ranks, "
        "started for each training and stopped after it (local: processes on 127.0.0.1; kubernetes: a "
        "dispatcher and a Deployment of CPU worker pods beside the MPIJob). 0: off, each rank reads its "
        "own shards. Feeds the acoustic model, and the synthesis model under adpsgd.",
    ),
    "epochs": Param(
        None,
        type=["null", "integer"],
        minimum=1,
        title="Epochs",
        section=TRAINING,
        description="Passes over the training split; empty: the config file's value.",
    ),
    "max_steps": Param(
        None,
        type=["null", "integer"],
        minimum=1,
        title="Maximum steps",
        section=TRAINING,
        description="Stop training after this many steps; empty: the config file's value.",
    ),
    **{
        f"{name}_config": Param(
            entry.config_file,
            type="string",
            minLength=1,
            title=f"Training config: {name}",
            section=TRAINING,
            description=f"YAML file of TrainConfig fields for {entry.title}.",
        )
        for name, entry in catalog.models().items()
    },
    "train_overrides": Param(
        [],
        type="array",
        items={"type": "string", "pattern": r"^[A-Za-z_][A-Za-z0-9_.]*=.*$"},
        title="Training overrides",
        section=TRAINING,
        description="KEY=VALUE settings of the training config for every model, passed on as "
        "`models.train --set KEY=VALUE`: optim.learning_rate=0.002, a strategy's options "
        "(strategy.gossip=random-ring for adpsgd), a model's own (asr.units=256). Checked by `plan` "
        "before any work starts.",
    ),
    "word_lm": Param(
        True,
        type="boolean",
        title="Word language model",
        section=TRAINING,
        description="Build a word n-gram (pipeline.lm) beside training, choose its weights on a dev split "
        "in held-out voices and decode the acoustic model with it in evaluation, the registry and serving. "
        "Off: greedy and character beam search only; an error for a model of phone targets (asr.targets: "
        "phones), which spells words only through the decoding graph built from the LM.",
    ),
    "lm_text": Param(
        "",
        type="string",
        title="Word LM text",
        section=TRAINING,
        description="A text of the domain, one sentence per line (normalized as the transcripts are), for the "
        "word LM. Empty: the training split's transcripts. A phone model's LM text is this text in place of "
        "the open-text source's, less the held-out splits' sentences, with the training transcripts. "
        "Relative paths are the repository's (local mode).",
    ),
    "eval_utterances": Param(
        100,
        type="integer",
        minimum=1,
        title="Synthesis evaluation utterances",
        section=TRAINING,
        description="Test sentences the synthesis model speaks in its evaluation (mel distortion, intelligibility).",
    ),
    "experiment": Param(
        "speechflow",
        type="string",
        minLength=1,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$",
        title="MLflow experiment",
        section=TRACKING,
        description="MLflow experiment of the runs; the models are registered as "
        "EXPERIMENT-asr and EXPERIMENT-tts. MLFLOW_TRACKING_URI names the store.",
    ),
    "execution_mode": Param(
        "local",
        type="string",
        enum=["local", "kubernetes"],
        title="Execution mode",
        section=EXECUTION,
        values_display={
            "local": "local (child processes on the Airflow worker)",
            "kubernetes": "kubernetes (pods and an MPIJob)",
        },
        description="Where the stages run.",
    ),
    "gpus_per_worker": Param(
        None,
        type=["null", "integer"],
        minimum=0,
        title="GPUs per worker pod",
        section=EXECUTION,
        description="kubernetes only: GPUs (MPI slots) per worker pod; empty: the cluster settings' value.",
    ),
    "work_root": Param(
        "",
        type="string",
        title="Work root",
        section=EXECUTION,
        description="Where each run's directory (shards, models, summary) goes. Empty: "
        "SPEECHFLOW_WORK_ROOT, else .runs/pipeline (local) or /data/runs (kubernetes).",
    ),
}

RETRIES = dict(
    retries=2,
    retry_delay=timedelta(seconds=30),
    retry_exponential_backoff=2.0,
    max_retry_delay=timedelta(minutes=10),
    execution_timeout=timedelta(hours=2),
)


def _plan() -> Plan:
    return Plan.from_xcom(get_current_context()["ti"].xcom_pull(task_ids="plan"))


def _parent_run_id() -> str:
    # Pulled rather than passed: a setup task's direct downstreams must use the trigger rule
    # all_success, and several stages here must run after a skipped one.
    return get_current_context()["ti"].xcom_pull(task_ids="start_mlflow_run")


def _record(plan: Plan, records: list[dict]) -> dict[str, dict]:
    """Child runs of the data stages in `records` (`commands.stage_record`), by name."""
    args = commands.record_stages_args(_parent_run_id(), records)
    recorded = runner.registry(plan, get_current_context(), "record-stages", args)["records"]
    return {r["name"]: r for r in recorded}


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
    @task(retries=0)
    def plan() -> dict:
        """Checks the params and fixes every path of this run."""
        context = get_current_context()
        try:
            return make_plan(context["params"], context["dag"].dag_id, context["run_id"]).to_xcom()
        except ValueError as err:
            raise AirflowFailException(f"invalid params: {err}") from err

    @setup
    def start_mlflow_run(plan: dict) -> str:
        """The MLflow parent run of this DAG run (the same one again on a retry)."""
        p = Plan.from_xcom(plan)
        return runner.registry(p, get_current_context(), "mlflow-start", commands.start_parent_args(p))["parent_run_id"]

    @task(outlets=[CORPUS])
    def prepare_corpus() -> dict:
        p = _plan()
        if not p.make_corpus:
            raise AirflowSkipException(f"data_dir is given ({p.data_root}): no demo corpus")
        runner.run_stage(p, get_current_context(), "corpus", commands.CORPUS, commands.corpus_args(p))
        get_current_context()["outlet_events"][CORPUS].extra = {
            "data_root": p.data_root,
            "dag_run_id": p.dag_run_id,
        }
        return {"data_root": p.data_root}

    @task(trigger_rule="none_failed")
    def augment_train() -> dict:
        """Copies of the training audio (speed, reverberation, noise, telephone) beside it, as the
        split train_aug, when a model's training config asks for them."""
        p = _plan()
        if not p.augment:
            raise AirflowSkipException("no selected model's training config asks for copies of the training audio")
        runner.run_stage(p, get_current_context(), "augment", commands.AUGMENT, commands.augment_args(p))
        return {"data_dir": p.data_dir(AUGMENTED_SPLIT)}

    @task(trigger_rule="none_failed", outlets=[FEATURES])
    def features(split: str) -> dict:
        p = _plan()
        if split not in p.splits:
            raise AirflowSkipException(
                "no model asks for copies of the training audio"
                if split == AUGMENTED_SPLIT
                else f"{p.data_root} has no {split} split"
            )
        context = get_current_context()
        data_dir = p.features_dir(split)
        runner.run_stage(p, context, f"features-{split}", commands.FEATURES, commands.features_args(p, split))
        context["outlet_events"][FEATURES].extra = {"split": split, "data_dir": data_dir}
        return {"split": split, "data_dir": data_dir}

    @task(trigger_rule="none_failed", outlets=[SHARDS])
    def make_shards(featurized: list[dict | None]) -> dict:
        """Shards of the featurized splits; records the corpus, the features and the shards in MLflow
        (one child run each), all in one process: see `commands.stage_record`."""
        p = _plan()
        context = get_current_context()
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
            _record(p, made)  # what the stages before made is in MLflow even when the shards fail
            raise
        recorded = _record(p, [*made, commands.stage_record("shards", p.shards_dir, "shards")])
        manifest = f"{p.shards_dir}/manifest.json"
        context["outlet_events"][SHARDS].extra = {"shards_dir": p.shards_dir, "manifest": manifest}
        return {
            "shards_dir": p.shards_dir,
            "manifest": manifest,
            "mlflow_run_id": recorded["shards"]["run_id"],
            "counts": {name: r["metrics"] for name, r in recorded.items()},
            "data_dirs": {f["split"]: f["data_dir"] for f in featurized if f},
        }

    @task(execution_timeout=timedelta(hours=12))
    def train(model: str, shards: dict) -> dict:
        p = _plan()
        if model not in p.models:
            raise AirflowSkipException(f"{model} is not among the models to train ({', '.join(p.models)})")
        context = get_current_context()
        trained = runner.run_training(p, context, model, _parent_run_id())
        context["outlet_events"][TRAINED[model]].extra = {
            "workdir": trained["workdir"],
            "run_id": trained.get("run_id"),
        }
        return trained

    @task(trigger_rule="none_failed")
    def build_lm(shards: dict) -> dict:
        """The word LM (pipeline.lm), in the shards' alphabet, of a phone model's LM text, else of the
        training transcripts or of `lm_text`."""
        p = _plan()
        if not p.lm_dir:
            raise AirflowSkipException("no word LM: word_lm is off, or no selected model decodes with one")
        return {"lm_dir": p.lm_dir, **runner.run_recorded_stage(p, get_current_context(), "lm")}

    @task(trigger_rule="none_failed")
    def graph_stage(stage: str) -> dict:
        """A stage of a phone model's decoding graph (workflow/runner.py RECORDED_STAGES): `lm_text`, the
        LM's text; `lexicon`, its words' pronunciations; `graph`, HLG of the lexicon and the word LM."""
        p = _plan()
        if not p.lang_dir:
            raise AirflowSkipException(commands.graph_skip_reason(p))
        return runner.run_recorded_stage(p, get_current_context(), stage)

    @task(trigger_rule="none_failed")
    def tune_lm(model: str, trained: dict | None, lm: dict | None, graph: dict | None) -> dict:
        """Chooses the decoding settings for the trained model on a dev split in held-out voices and attaches
        what it decodes with (models.tune_lm --attach): a phone model's graph (acoustic scale, word penalty),
        else the LM (weight, word bonus); without an LM the model goes on as trained."""
        p = _plan()
        if trained is None:
            raise AirflowSkipException(f"{model} was not trained in this run")
        if lm is None:
            log.info("%s: no word LM in this run; it is evaluated and registered without one", model)
            return trained
        args = commands.tune_lm_args(p, model)
        runner.run_stage(
            p, get_current_context(), f"tune-lm-{model}", commands.TUNE_LM, args, gpus=runner.evaluation_gpus(p)
        )
        return {**trained, "lm_dir": lm["lm_dir"], **({"lang_dir": graph["dir"]} if graph else {})}

    @task(trigger_rule="none_failed")
    def evaluate(model: str, trained: dict | None, acoustic: dict | None = None) -> dict:
        p = _plan()
        if trained is None:
            raise AirflowSkipException(f"{model} was not trained in this run")
        args = commands.evaluate_args(p, model, _parent_run_id(), with_asr=acoustic is not None)
        gpus = runner.evaluation_gpus(p)
        runner.run_stage(p, get_current_context(), f"evaluate-{model}", commands.EVALUATE, args, gpus=gpus)
        metrics = runner.read_eval(p, model)
        return {
            "model": model,
            "workdir": p.workdirs[model],
            "primary_metric": metrics.get("primary_metric"),
            "value": metrics.get(metrics.get("primary_metric", ""), None),
            "metrics": metrics,
        }

    @task
    def register(model: str, evaluated: dict) -> dict:
        p = _plan()
        context = get_current_context()
        result = runner.registry(p, context, f"register-{model}", commands.register_args(p, model, _parent_run_id()))
        context["outlet_events"][REGISTERED[model]].extra = {
            k: result[k] for k in ("name", "version", "promoted", "champion_version", "metric", "value")
        }
        return result

    @teardown
    def finish_mlflow_run(parent_run_id: str) -> dict:
        """Ends the parent run (FAILED if any task failed) and writes RUN_DIR/summary.json."""
        p = _plan()
        context = get_current_context()
        states = context["ti"].get_task_states(dag_id=p.dag_id, run_ids=[p.dag_run_id]).get(p.dag_run_id, {})
        states.pop(context["ti"].task_id, None)
        failed = runner.failed_tasks(states)
        summary = runner.registry(p, context, "mlflow-finish", commands.finish_args(p, parent_run_id, bool(failed)))
        done = [context["ti"].xcom_pull(task_ids=t) for t in ("lm_text", "lexicon", "build_lm", "build_graph")]
        summary["stages"] = runner.add_stages_to_summary(p, done)
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
        log.info("summary: %s; failed tasks: %s", f"{p.run_dir}/summary.json", failed or "none")
        return summary

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
