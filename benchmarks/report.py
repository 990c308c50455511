"""docs/benchmarks.md from benchmarks/results/*.json: every table, its provenance and its plots.

    python benchmarks/report.py [--results benchmarks/results] [--out docs/benchmarks.md]

(`make bench-report`.) Every figure on the page comes from a JSON file; the short texts under the
tables, kept here, hold no figures. tests/test_docs.py fails when the committed page differs from
what this program makes of the committed JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.report_format import provenance  # noqa: E402
from benchmarks.report_levers import levers  # noqa: E402
from benchmarks.report_runs import (  # noqa: E402
    convergence,
    demo,
    faults,
    lm_decoding,
    reference_asr,
    targets,
    text_levers,
    time_to_accuracy,
    voice_levers,
    voice_warp,
)
from benchmarks.report_speed import input_pipeline, serving, speedup_model, straggler, throughput  # noqa: E402
from benchmarks.report_tts import tts_durations, tts_levers, tts_seed_levers, tts_seeds  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
PAGE = ROOT / "docs" / "benchmarks.md"


# ---- the page: one section per results file, its renderer in report_runs.py or report_speed.py ----

# Per results file: its section's title, what it measures (no figures), its renderer, and what
# to read from the table (no figures: they are in the table).
Section = tuple[str, str, Callable[[dict], list[str]], str]
SECTIONS: dict[str, Section] = {
    "demo.json": (
        "The demo",
        "`benchmarks/demo.py`: `make demo`'s script (the whole DAG under `airflow dags test` on the synthesized "
        "demo corpus, both models, allreduce, two workers) timed from launch to exit, each task's minutes as "
        "Airflow recorded them, both trainings and both evaluations, and the calibration of the machine taken "
        "just before (`benchmarks/calibrate.py`), which the demo scales this run's minutes by on another machine.",
        demo,
        "Waiting for input is a small share of the step for both models. The synthesis model's "
        "intelligibility is what the demo's own acoustic model hears: free-running (what a listener "
        "hears), teacher-forced (the recording's timing, so free-running drift is left out) and on the "
        "recordings themselves (the listener's own errors). The filterbank cepstral distance is the "
        "formula of mel-cepstral distortion applied to the predicted filterbank; it does not compare with "
        "the MCD that papers report.",
    ),
    "reference_asr.json": (
        "An off-the-shelf recognizer beside ours",
        "`benchmarks/reference_asr.py` (in `.venv-benchmarks`): pocketsphinx with the acoustic model, language "
        "model and dictionary it ships, never trained on our data, decoding each utterance of the demo corpus' "
        "test splits whole, scored as our acoustic model is scored (the same transcript normalization, Kaldi's "
        "alignment); beside it, the demo's acoustic model on the same split.",
        reference_asr,
        "Ours are the evaluation the line above the table names, on a corpus of the same code and seed. Our "
        "model hears only this corpus' synthesizers; pocketsphinx learned from recorded speech and knows "
        "none of them, and its language model knows English at large, not our grammar. Ours per voice on "
        "`test_engine` is in [Held-out voices: vocal-tract length](#held-out-voices-vocal-tract-length) (warp "
        "`1.0`).",
    ),
    "voice_levers.json": (
        "Held-out speakers: the corpus' natural share and the augmentations",
        "`benchmarks/voice_levers.py`: each arm builds its corpus through the real stages (corpus, "
        "`pipeline.augment`'s copies of the training split where the arm has them, features, shards) and "
        "trains the demo's acoustic config at `horovodrun -np 2` once per seed; an arm with copies trains "
        "the base arm's number of steps over `train_aug`. Greedy CER on `test` (espeak-ng voices never "
        "heard) and on `test_engine` (the held-out speakers slt and kal in every rendering flite and "
        "Festival have), each seed's in brackets, and per held-out voice the seeds' mean.",
        voice_levers,
        "A lever is kept when its seeds' mean on the held-out speakers improves on the base arm's by more "
        "than the seeds' spread and `test` stays within the issue's ceiling (the verdict names it); the kept "
        "ones are the demo's defaults.",
    ),
    "text_levers.json": (
        "Open English: the acoustic recipe on sentences no grammar made",
        "`benchmarks/voice_levers.py --text open`: as the section above, on a corpus whose sentences are WordNet's "
        "examples spelled out as spoken (`pipeline.corpus --text open`, the demo's default): greedy CER on `test` "
        "(espeak-ng voices never heard) and on `test_engine` (the held-out speakers), each seed's in brackets; "
        "the share of test's word tokens that no training sentence has, and the CER of those words alone "
        "(`models/asr/scoring.py` `oov_figures`).",
        text_levers,
        "Test sentences share no sentence with training and many of their words are new to the model: the "
        "unheard words' CER says how well it spells a word from its sound alone. The issue's ceiling for test is "
        "the verdict column's.",
    ),
    "lm_decoding.json": (
        "Decoding with a word LM",
        "`benchmarks/lm_decoding.py`: the demo run's acoustic model decoding every split greedily, by beam search "
        "and by beam search with a word n-gram (`pipeline.lm`, KenLM's lmplz; pyctcdecode's beam search with "
        "`kenlm`), its weight and word bonus chosen by `models.tune_lm` on the split the table names (`dev_engine`: "
        "new sentences in the held-out voices, decoding settings only) and then fixed for the others. Two LM texts: the training split's transcripts (`corpus`), and WordNet's example sentences that "
        "no split of the corpus holds (`general`); `_oN` is the n-gram's order.",
        lm_decoding,
        "The split that chose the settings is named in the weights' column; when it is `dev`, that row is not a "
        "held-out figure. `dev_engine` speaks the voices of `test_engine` in other sentences, so the LM rows of "
        "`test_engine` are held out in their sentences, not in their voices. The last two columns say how well the LM's "
        "text knows the split: the share of its words the LM never saw, and of its word trigrams the text had.",
    ),
    "targets.json": (
        "Characters against phones",
        "`benchmarks/targets.py`: the demo's acoustic config trained at `horovodrun -np 2` on the demo run's "
        "shards once per seed with each kind of CTC target (`asr.targets`): characters, and the phones of the "
        "run's lexicon. Both arms hear the same audio and are scored on the same transcripts. Each model decodes "
        "greedily and through its word LM, both made from the run's LM text of general English: the char model "
        "by beam search with its n-gram, the phone model through the decoding graph (HLG) of that n-gram and "
        "the text's lexicon, which is the only way it spells words. Each model's own copy of its LM is tuned "
        "with `models.tune_lm` on the split the second table names (`dev_engine`: new sentences in the held-out "
        "voices), attached, and then fixed for every split. The demo run's own phone model is the seed its config "
        "names (the second table's `model`).",
        targets,
        "Each figure is the mean of the seeds, each seed's in brackets. The phone model's greedy figure is a "
        "phone error rate, against the phone targets it trains on; its words exist only through the graph, so "
        "its WER and CER compare with the char model's rows through the n-gram. The words an LM lacks cap what "
        "its rows can reach.",
    ),
    "tts_seeds.json": (
        "Synthesis: the mean of its seeds",
        "`benchmarks/tts_seeds.py`: the demo's synthesis config trained alone at `horovodrun -np 2` with each "
        "seed on the demo run's shards, each evaluated as the DAG evaluates it (dev: held-out sentences in "
        "training voices; test: voices never heard in training), every seed heard by one pinned listener (the "
        "line above the table names its weights): the demo run's acoustic model unless another is named. The "
        "demo run's own synthesis model is the first seed when the demo trained this config (the table's `from`).",
        tts_seeds,
        "The model's figure is the mean; one seed is not the model's figure.",
    ),
    "tts_seed_levers.json": (
        "Synthesis: levers, three seeds each",
        "`benchmarks/tts_seeds.py --lever NAME --levers-json benchmarks/results/tts_seed_levers.json`: the demo's "
        "synthesis config with one lever (its overrides) trained alone at `horovodrun -np 2` with each seed on the "
        "same demo run's shards and evaluated as the DAG evaluates it, heard by that run's acoustic model; every "
        "lever tried is here, kept or rejected. A record of the levers that chose the synthesis config, each on the "
        "code, corpus and listener of its day (the row's commit) and not measured again; the config they chose is "
        "measured at today's code in [Synthesis: the mean of its seeds](#synthesis-the-mean-of-its-seeds).",
        tts_seed_levers,
        "A lever counts by its mean over the seeds; the spread says how far one seed's figure can be from it.",
    ),
    "tts_durations.json": (
        "Synthesis: what each part costs",
        "`benchmarks/tts_durations.py` (inference only): the same dev sentences spoken by a trained synthesis "
        "model with the alignment search's own durations (the frames teacher forcing gives), with those "
        "durations disturbed by noise, with the durations it predicts, and that speech through Griffin-Lim "
        "and the feature stage; each heard by the demo run's acoustic model.",
        tts_durations,
        "The step from `searched` to `predicted` is what the duration predictor costs; the noise rows say how "
        "much a predictor of that error per character would cost; `teacher_forced` is what the decoder costs "
        "with perfect durations.",
    ),
    "time_to_accuracy.json": (
        "Time to accuracy",
        "`benchmarks/time_to_accuracy.py`: the demo corpus through the real stages, the demo acoustic model "
        "at `horovodrun -np 2` with two configs in one run, each the file named as of the commit named below "
        "(its first comment lines say what it is; by default `before` is the demo's model on Keras' LSTM path "
        "and `after` the demo's config); dev CER against minutes from launching horovodrun (start-up, input, "
        "evaluations and checkpoints included); test CER greedy on the espeak-ng voices never heard in training "
        "and on flite's (`test_engine`), of the model each run saved. A record of the recipe change of its day, "
        "on the demo corpus of its commit (the grammar's sentences, espeak-ng and flite) and not measured again; "
        "today's recipe's dev CER against minutes is [Convergence](#convergence)'s allreduce row.",
        time_to_accuracy,
        "Both arms evaluate on dev the same number of times. The minutes to a target are those of the first "
        "evaluation at or below it, so they are as coarse as the evaluations are apart. The dev split holds new "
        "sentences in the training voices of both engines, espeak-ng's and flite's.",
    ),
    "levers.json": (
        "Levers: what chose the demo configs",
        "Every lever measured on the demo's acoustic config (`configs/demo_asr.yaml`), kept and rejected: one "
        "row per arm, its settings on the base config of its run (the runs table names it), each at "
        "`horovodrun -np 2` on the demo corpus's shards. Test CER greedy on the espeak-ng voices never heard in "
        "training, `test_engine` on flite's, dev of the model the run saved; with several seeds, their mean and "
        "each seed's in brackets. Most runs predate the benchmarks' results files: their figures, commit and "
        "machine are as the commit message that recorded them states them. The synthesis config's levers are "
        "[Synthesis: levers, three seeds each](#synthesis-levers-three-seeds-each) and "
        "[Synthesis: what limits intelligibility](#synthesis-what-limits-intelligibility).",
        levers,
        "Rows compare within a lever only: levers ran on the config of their day, some on other shards, and job "
        "minutes of time-to-accuracy runs include their dev evaluations. `kept` is the value the config holds "
        "now; `replaced later`, one it held until a later lever replaced it. A row that a lever compares against "
        "repeats the runs of another lever's row.",
    ),
    "voice_warp.json": (
        "Held-out voices: vocal-tract length",
        "`benchmarks/voice_warp.py` (inference only): the demo run's acoustic model hears the test sentences in "
        "the held-out espeak-ng voices (`test`) and in the held-out speakers of every rendering flite and Festival have "
        "(`test_engine`) with every "
        "utterance's mel axis warped by one factor (the training step's vocal tract length perturbation, its "
        "factor fixed); below one a voice's formants are lowered.",
        voice_warp,
        "A voice whose CER falls far at some warp speaks with formants that training did not cover, and a "
        "perturbation in training that reaches that warp is the lever; what is left at a voice's best warp is "
        "not a matter of vocal-tract length, and no warp brings the held-out speakers near the espeak-ng voices. "
        "The demo's model trains with that perturbation (`asr.augment.vtlp_range` in `configs/demo_asr.yaml`), so a "
        "warp here is heard on top of the ones training drew.",
    ),
    "input_pipeline.json": (
        "Input pipeline",
        "`benchmarks/input_pipeline.py`: one process, reading shards from the page cache, against a "
        "seed-style loader (read everything, sort each epoch, pad with numpy); consumers sized from a GPU "
        "calibration and from this machine's CPU step.",
        input_pipeline,
        "What keeps utilization below one is the fixed cost of an eager `next()` on the iterator, not the "
        "pipeline's rate. A GPU host whose cores cannot feed its batch shape reads from a tf.data service "
        "(`--data-service`).",
    ),
    "throughput.json": (
        "Training throughput",
        "`benchmarks/throughput.py`: the demo models on synthetic demo-shaped shards, alone and on two ranks, "
        "float32 and mixed bfloat16; the share of each step spent on input and communication; then the "
        "synthesis (attention) model at the GPU calibration's shapes, its decoder loop as a graph and with XLA.",
        throughput,
        "bfloat16 (`--set precision=mixed_bfloat16`) is off by default: on these CPUs it makes the LSTM "
        "step slower, and on two ranks its input share rises (not investigated). Synthesis: on a CPU the step "
        "is mostly arithmetic, so frames per second stop growing after a small batch; on the calibration GPU "
        "the decoder's time does not move with the batch, so there the lever is the batch size "
        "(`input.max_batch_size`, `input.frames_per_batch`), not more workers. XLA (`tts.xla`) is off by "
        "default: its backward pass by recomputation is slower on a CPU; it is meant for GPUs and not measured "
        "on one.",
    ),
    "lstm_paths.json": (
        "The acoustic model's LSTM path on a CPU",
        "`benchmarks/throughput.py --only asr --np 2 --precision float32`: the demo's acoustic model on "
        "synthetic demo-shaped shards at two ranks, the same batches on the paths a CPU can take: the default "
        "(`models/layers/lstm.py`'s LSTMs, the C++ CTC kernel, and the two large gradient matmuls of each LSTM "
        "direction in bfloat16 where the CPU has `avx512_bf16` or `amx_bf16`), the same with those matmuls in "
        "float32 (`_fp32_grads`), Keras' LSTM loop with the CTC loss from dense labels (`_keras`: the path "
        "before `models/layers/lstm.py`), and Keras' loop with the C++ CTC kernel (`_keras_sparse_ctc`). "
        "Threads per rank: the trainer's default, its share of the cores, each rank bound to its own (`bind_cores`).",
        throughput,
        "The float32 paths compute the same loss and gradients (`tests/test_lstm.py`; the bfloat16 matmuls "
        "round the gradients to about three significant digits). The difference between the last two rows "
        "is the CTC kernel's; between `_fp32_grads` and `_keras`, both levers' of the float32 path.",
    ),
    "speedup_model.json": (
        "Speedup model",
        "`benchmarks/speedup_model.py` (model in `benchmarks/speedup_theory.py`): one step's compute, the "
        "weights' transfer and the merge, measured, then the ring model's predicted speedups beside the "
        "measured ones against one single-threaded process.",
        speedup_model,
        "The model assumes independent workers; two ranks on a two-core machine each run slower than one "
        "rank alone, which is why the measured speedup falls short of the prediction. It predicts samples a "
        "second, not time to accuracy: the research's reported speedups are times to accuracy, which also "
        "count any extra epochs more workers need.",
    ),
    "straggler.json": (
        "Straggler",
        "`benchmarks/straggler.py`: synthetic demo-shaped utterances, the demo acoustic model, the same "
        "budget in data for every strategy, one rank made slower by computing each of its steps again, each "
        "rank on its own core. Job ratio: frames trained over the seconds from launch to exit, slowed over "
        "undisturbed; ideal: what a job gets when the fast rank keeps its speed; fast rank: its own "
        "throughput, slowed over undisturbed.",
        straggler,
        "Under AD-PSGD the fast rank takes most of the batches and the job no longer runs at the slow "
        "rank's pace; under allreduce every rank takes the same batches and waits. The undisturbed job runs "
        "twice and the faster is kept; its two runs are in the file, and on a shared two-core machine they "
        "can differ by more than a third. A job has fixed parts that do not slow down (start-up, saving and "
        "logging), which lift every job ratio towards one: allreduce stays above the pace of its slow rank, "
        "and a gossip variant can land a little above the ideal. A ratio far above it comes from a slow "
        "undisturbed job: compare the jobs' seconds across strategies. At two ranks the fixed and the random ring are one schedule, so "
        "one of them runs.",
    ),
    "straggler_repeat.json": (
        "Straggler: the gossip variants again",
        "`benchmarks/straggler.py --variants random-ring`, then `--variants delay-by-one`: the section above's "
        "benchmark for its gossip variants, at a later sitting on the same machine type.",
        straggler,
        "Set beside the section above, it says how much of a job ratio is the machine's. Here every undisturbed "
        "job ran at the pace of the slower of the section above's two random-ring jobs, delay-by-one's as well "
        "(there a third slower than random-ring's faster job), and a fast rank ran faster beside a slowed partner "
        "than beside an undisturbed one. On two cores a gossip job's ratio moves with its undisturbed job's pace "
        "by more than the target's margin; only the runs of one sitting compare.",
    ),
    "convergence.json": (
        "Convergence",
        "`benchmarks/convergence.py`: the demo corpus through the real stages, the demo acoustic model "
        "under each strategy for the same budget in data, test CER on voices never heard in training; "
        'hierarchical gossip on two "hosts" of two ranks. Time to accuracy: each run\'s dev CER at the '
        "config's evaluations against minutes from launching horovodrun (plot). The second part: one rank at "
        "half speed, the minutes until the dev CER reaches undisturbed allreduce's final one.",
        convergence,
        "The goal is every gossip variant within a tenth of allreduce's CER. Hierarchical gossip runs "
        "twice the ranks for the same budget in data, so each rank takes half as many batches: a different "
        "optimisation, not only a different exchange; its four ranks share the two cores, so it stays out of the "
        "time to accuracy. With two ranks the fixed and random rings pair the "
        "same ranks every round: one of them runs. The demo's schedule ends while the dev CER still falls, "
        "so a run's minutes to a level near the end follow its last evaluations, and a gossip run that "
        "ends a little above allreduce reaches that level later: the minutes compare runs at a level "
        "every run reached, not at a level where training has levelled off. Job minutes compare only "
        "within one run of the benchmark. In the second part, where it ran, the fast rank is also the one "
        "that evaluates on dev; under gossip it takes more than its share of the batches, and its dev "
        "evaluations and its learning-rate schedule end at the step count planned for its share: after that "
        "step its one evaluation is the final model's, so its minutes to a level are an upper bound.",
    ),
    "faults.json": (
        "Faults",
        "`benchmarks/faults.py`: a small demo corpus through the real stages, the demo acoustic model on "
        "two ranks, each fault injected into a real run; test CER greedy on voices never heard in training.",
        faults,
        "Without `--elastic` a killed worker ends the job with a non-zero exit naming the rank, and the "
        "same command again resumes from the last checkpoint. The elastic job loses no steps but trains the "
        "rest of its budget on one worker, with the learning rate scaled for one; its final CER is one run "
        "and not separated from run-to-run noise. The reset's seconds are spent in Horovod's elastic driver "
        "and its new rendezvous.",
    ),
    "serving.json": (
        "Serving under load",
        "`benchmarks/serving.py`: `mlflow models serve` of the demo run's trained acoustic model with its word "
        "LM, posted utterances of held-out voices (`test_engine`), under concurrent clients, and one request of "
        "many rows, as served (beam search with the LM) and with the request param `lm: false` (greedy); "
        "latency from post to answer, real-time factor = latency / seconds of audio.",
        serving,
        "One worker serves a two-core machine best: concurrent requests run in threads that share "
        "TensorFlow's thread pools, while two worker processes compete for the same cores. The model runs "
        "as one traced graph for every input length; the LM's beam search runs in Python after it, one utterance "
        "at a time.",
    ),
    "tts_levers.json": (
        "Synthesis: what limits intelligibility",
        "Each run trains the synthesis model on two ranks with one lever changed, then evaluates it on dev "
        "sentences (held-out sentences in training voices), heard by an acoustic model. A record of the levers "
        "tried on the first synthesis model (an attention decoder), on the code, corpus and listener of their day "
        "and not measured again: they are why the demo's model is the one with durations, measured at today's "
        "code in [Synthesis: the mean of its seeds](#synthesis-the-mean-of-its-seeds).",
        tts_levers,
        "No lever moves the attention model's free-running intelligibility, and more steps do not either, "
        "while its teacher-forced frames are understood far better: without the recording's frames it "
        "learns the voice's average spectrum and the sentence's length, and its attention moves down the "
        "diagonal at an almost constant rate where speech spends a different time on every character. "
        "Durations from a monotonic alignment search (as in Glow-TTS) driving a decoder without feedback "
        "(as in FastSpeech) remove that problem; what remains between free-running and teacher-forced is "
        "where within the sentence each character falls. The demo trains this model with a convolutional "
        "decoder. Training on a CPU is deterministic, so the spread between runs comes from the seed.",
    ),
}


def slug(title: str) -> str:
    """GitHub's anchor for a heading."""
    text = title.strip().lower().replace("`", "")
    return "".join(c for c in text if c.isalnum() or c in " -_").replace(" ", "-")


def render(results_dir: Path, page: Path) -> str:
    """The page for the JSON files in `results_dir`; links are relative to `page`'s directory."""
    files = sorted(results_dir.glob("*.json"))
    unknown = [f.name for f in files if f.name not in SECTIONS]
    if unknown:
        raise ValueError(f"{', '.join(unknown)}: add a section for each to SECTIONS in benchmarks/report.py")
    order = [name for name in SECTIONS if (results_dir / name).is_file()]
    lines = [
        "# Benchmarks",
        "",
        "<!-- Generated by `make bench-report` (benchmarks/report.py) from benchmarks/results/*.json: edit those, "
        "not this page. -->",
        "",
        "Every figure here comes from a JSON file in [benchmarks/results/]"
        f"({os.path.relpath(results_dir, page.parent)}/), written by the benchmark that measured it; each "
        "section says which commit, date, machine, command and seeds produced it. `make bench` runs the "
        "benchmarks at full size (CPU only; figures from different machines do not compare), `make "
        "bench-report` rewrites this page. Training figures are at `horovodrun -np 2 -H localhost:2 --gloo` "
        "unless a section says otherwise.",
        "",
    ]
    lines += [f"- [{SECTIONS[name][0]}](#{slug(SECTIONS[name][0])})" for name in order] + [""]
    for name in order:
        title, what, renderer, analysis = SECTIONS[name]
        data = json.loads((results_dir / name).read_text())
        lines += [f"## {title}", "", what, ""]
        lines += provenance(data.get("meta"), data)
        lines += renderer(data)
        for plot in (results_dir / f"{Path(name).stem}{suffix}.png" for suffix in ("", "_dev")):
            if plot.is_file():
                lines += [f"![{title}]({os.path.relpath(plot, page.parent)})", ""]
        if analysis:
            lines += [analysis, ""]
    return "\n".join(lines).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--results", type=Path, default=RESULTS, help="the benchmarks' JSON files")
    parser.add_argument("--out", type=Path, default=PAGE, help="the page to write")
    args = parser.parse_args(argv)
    # Links are made relative to the committed page's place, wherever this copy is written.
    text = render(args.results.resolve(), PAGE)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
