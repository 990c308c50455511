"""Evaluation: `python -m models.evaluate --model-dir W --shards OUT [--split test]`.

Acoustic model: CER and WER with greedy and beam-search decoding, and a file of hypotheses next
to the references, for the test split and, when the shards have it, the noisy test. Synthesis
model: mel L1 (teacher-forced) and mel cepstral distortion (free-running, DTW-aligned) against
the references, attention plots and a monotonicity measure, predicted-versus-reference mel
plots, Griffin-Lim audio for a few sentences, and intelligibility: an acoustic model
(`--asr-model-dir`) transcribes the synthesized mels and we report its CER. Everything goes to
`W/eval.json`, `W/eval/`, and the MLflow run that trained the model.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

import numpy as np

from pipeline.fsutil import atomic_write_json

EVAL_INPUT = dict(frames_per_batch=40000, max_batch_size=64, deterministic=True, shuffle_buffer=1)


def error_rates(references: list[str], hypotheses: list[str]) -> dict:
    """Corpus-level CER and WER: total edits over total reference characters / words.

    Edit distances come from `tf.edit_distance` over character and word sequences.
    """
    import tensorflow as tf

    def edits(split_fn):
        ref = split_fn(tf.constant(references)).to_sparse()
        hyp = split_fn(tf.constant(hypotheses)).to_sparse()
        distance = tf.edit_distance(hyp, ref, normalize=False).numpy()
        return float(distance.sum()), int(
            tf.reduce_sum(tf.cast(split_fn(tf.constant(references)).row_lengths(), tf.int64))
        )

    char_edits, chars = edits(lambda t: tf.strings.unicode_split(t, "UTF-8"))
    word_edits, words = edits(lambda t: tf.strings.split(t))
    return {"cer": char_edits / max(chars, 1), "wer": word_edits / max(words, 1), "utterances": len(references)}


def transcribe(model, feats: np.ndarray, lengths: np.ndarray, vocabulary: list[str], beam_width: int = 0) -> list[str]:
    from models import asr

    logits, out_lengths = model(feats, lengths)
    if beam_width:
        ids = asr.beam_decode(logits, out_lengths, beam_width)
    else:
        ids = asr.greedy_decode(logits.numpy(), out_lengths.numpy())
    return [asr.ids_to_text(h, vocabulary) for h in ids]


def evaluate_asr(model, config, data: dict, shards: Path, split: str, out_dir: Path, beam_width: int) -> dict:
    from models.tasks import AsrTask
    from pipeline.shards import load_manifest

    manifest = load_manifest(shards)
    cfg = dataclasses.replace(config.input, **EVAL_INPUT)
    dataset, _ = AsrTask(config.asr).dataset(shards, split, cfg, 0, 1, 0, False, manifest)
    vocabulary = data["vocabulary"]
    rows = []
    for batch in dataset:
        feats, lengths = batch["feats"], batch["feat_lengths"]
        greedy = transcribe(model, feats, lengths, vocabulary)
        beam = transcribe(model, feats, lengths, vocabulary, beam_width)
        tokens, token_lengths = batch["tokens"].numpy(), batch["token_lengths"].numpy()
        for i, utt in enumerate(batch["utt_id"].numpy()):
            reference = "".join(vocabulary[t] for t in tokens[i, : token_lengths[i]])
            rows.append((utt.decode(), reference, greedy[i], beam[i]))
    rows.sort()
    refs = [r[1] for r in rows]
    greedy_rates = error_rates(refs, [r[2] for r in rows])
    beam_rates = error_rates(refs, [r[3] for r in rows])
    hyp_file = out_dir / f"{split}_hypotheses.tsv"
    lines = ["utt_id\treference\tgreedy\tbeam"] + ["\t".join(r) for r in rows]
    hyp_file.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return {
        f"{split}_cer": greedy_rates["cer"],
        f"{split}_wer": greedy_rates["wer"],
        f"{split}_cer_beam": beam_rates["cer"],
        f"{split}_wer_beam": beam_rates["wer"],
        f"{split}_utterances": greedy_rates["utterances"],
    }


def evaluate_tts(
    model,
    config,
    data: dict,
    shards: Path,
    split: str,
    out_dir: Path,
    asr_model_dir: Path | None,
    max_utterances: int,
    num_audio: int,
    num_plots: int,
) -> dict:
    import tensorflow as tf

    from models import audio, tts
    from models.tasks import TtsTask
    from pipeline.shards import load_manifest

    manifest = load_manifest(shards)
    cfg = dataclasses.replace(config.input, **{**EVAL_INPUT, "frames_per_batch": 12000})
    dataset, _ = TtsTask(config.tts).dataset(shards, split, cfg, 0, 1, 0, False, manifest)
    mean, std = np.asarray(data["mel_mean"], np.float32), np.asarray(data["mel_std"], np.float32)
    r = config.tts.reduction_factor
    infer = tf.function(model.infer, reduce_retracing=True)
    l1_sum = l1_frames = 0.0
    mcds, monotonic_tf, monotonic_free, diagonal = [], [], [], []
    synthesized, references, utt_ids = [], [], []
    for batch in dataset:
        if len(utt_ids) >= max_utterances:
            break
        forced = model.teacher_forced(batch, training=False)
        ref = batch["mels"].numpy() * std + mean  # [B, T, D] log-mel
        lengths = batch["mel_lengths"].numpy()
        pred = forced["mel_after"].numpy() * std + mean
        mask = np.arange(ref.shape[1])[None, :] < lengths[:, None]
        l1_sum += float(np.sum(np.abs(pred - ref) * mask[..., None]))
        l1_frames += float(mask.sum() * ref.shape[-1])
        token_lengths = batch["token_lengths"].numpy()
        steps = (lengths + r - 1) // r
        monotonic_tf.append(tts.attention_monotonicity(forced["alignments"].numpy(), token_lengths, steps))
        free = infer(batch["tokens"], batch["token_lengths"], int(1.5 * ref.shape[1] / r) + 10)
        free_mels = free["mels"].numpy() * std + mean
        free_lengths = free["lengths"].numpy()
        free_steps = (free_lengths + r - 1) // r
        monotonic_free.append(tts.attention_monotonicity(free["alignments"].numpy(), token_lengths, free_steps))
        diagonal.append(tts.attention_diagonality(forced["alignments"].numpy(), token_lengths, steps))
        for i, utt in enumerate(batch["utt_id"].numpy()):
            utt = utt.decode()
            synth = free_mels[i, : max(free_lengths[i], 1)]
            mcds.append(audio.mel_cepstral_distortion(synth, ref[i, : lengths[i]]))
            if len(utt_ids) < num_plots:
                audio.plot_alignment(
                    forced["alignments"][i, : steps[i], : token_lengths[i]].numpy(),
                    out_dir / f"{utt}_attention_teacher_forced.png",
                    f"{utt}: teacher-forced attention",
                )
                audio.plot_alignment(
                    free["alignments"][i, : free_steps[i], : token_lengths[i]].numpy(),
                    out_dir / f"{utt}_attention_synthesis.png",
                    f"{utt}: attention while synthesizing",
                )
                audio.plot_mels(synth, ref[i, : lengths[i]], out_dir / f"{utt}_mels.png", utt)
            if len(utt_ids) < num_audio:
                audio.write_wav(out_dir / f"{utt}_synthesized.wav", audio.griffin_lim(synth))
                audio.write_wav(out_dir / f"{utt}_reference_griffin_lim.wav", audio.griffin_lim(ref[i, : lengths[i]]))
            synthesized.append(synth)
            references.append(batch["tokens"][i, : token_lengths[i]].numpy())
            utt_ids.append(utt)
    metrics = {
        f"{split}_mel_l1": l1_sum / max(l1_frames, 1),
        f"{split}_mcd_db": float(np.mean(mcds)),
        f"{split}_attention_monotonicity": float(np.nanmean(monotonic_free)),
        f"{split}_attention_monotonicity_teacher_forced": float(np.nanmean(monotonic_tf)),
        f"{split}_attention_diagonality_teacher_forced": float(np.nanmean(diagonal)),
        f"{split}_utterances": len(utt_ids),
    }
    if asr_model_dir is not None:
        metrics.update(
            intelligibility(synthesized, references, utt_ids, data["vocabulary"], asr_model_dir, split, out_dir)
        )
    return metrics


def intelligibility(
    mels: list[np.ndarray],
    token_ids: list[np.ndarray],
    utt_ids: list[str],
    vocabulary: list[str],
    asr_model_dir: Path,
    split: str,
    out_dir: Path,
) -> dict:
    """CER of an acoustic model on synthesized log-mels.

    The synthesizer is treated as one more speaker: its utterances are normalized with the mean and
    variance of all of them (speaker CMVN, as the acoustic model was trained with)."""
    from models.serving import load_model_dir

    asr_model, _, asr_data = load_model_dir(Path(asr_model_dir) / "model")
    frames = np.concatenate(mels)
    mean, std = frames.mean(0), np.maximum(frames.std(0), 1e-4)
    refs = ["".join(vocabulary[t] for t in ids) for ids in token_ids]
    hyps = []
    for start in range(0, len(mels), 16):
        chunk = mels[start : start + 16]
        lengths = np.asarray([len(m) for m in chunk], np.int32)
        feats = np.zeros([len(chunk), lengths.max(), frames.shape[1]], np.float32)
        for i, m in enumerate(chunk):
            feats[i, : len(m)] = (m - mean) / std
        hyps += transcribe(asr_model, feats, lengths, asr_data["vocabulary"])
    rates = error_rates(refs, hyps)
    rows = ["utt_id\treference\tasr_on_synthesis"] + [f"{u}\t{r}\t{h}" for u, r, h in zip(utt_ids, refs, hyps)]
    (out_dir / f"{split}_intelligibility.tsv").write_text("\n".join(rows) + "\n", encoding="utf-8")
    return {f"{split}_intelligibility_cer": rates["cer"], f"{split}_intelligibility_wer": rates["wer"]}


def evaluate(
    model_dir: Path,
    shards: Path,
    splits: list[str],
    asr_model_dir: Path | None = None,
    beam_width: int = 16,
    max_utterances: int = 100,
    num_audio: int = 3,
    num_plots: int = 4,
) -> dict:
    """Evaluates the model trained in `model_dir` (a training workdir). Returns the metrics."""
    from models.serving import load_model_dir
    from pipeline.shards import load_manifest

    model_dir = Path(model_dir)
    model, config, data = load_model_dir(model_dir / "model")
    manifest = load_manifest(shards)
    if not splits:
        splits = [s for s in ("test", "test_noisy") if s in manifest["splits"]] if config.model == "asr" else ["test"]
    out_dir = model_dir / "eval"
    out_dir.mkdir(exist_ok=True)
    metrics = {"model": config.model}
    for split in splits:
        if config.model == "asr":
            metrics.update(evaluate_asr(model, config, data, shards, split, out_dir, beam_width))
        else:
            metrics.update(
                evaluate_tts(
                    model, config, data, shards, split, out_dir, asr_model_dir, max_utterances, num_audio, num_plots
                )
            )
    metrics["primary_metric"] = (
        f"{splits[0]}_cer"
        if config.model == "asr"
        else (f"{splits[0]}_intelligibility_cer" if asr_model_dir else f"{splits[0]}_mcd_db")
    )
    atomic_write_json(model_dir / "eval.json", metrics)
    return metrics


def log_to_mlflow(model_dir: Path, metrics: dict, parent_run_id: str | None) -> str | None:
    """Logs metrics to the training run; with a parent (the DAG), also to an evaluation child run
    that holds the artifacts. Returns the run id that holds the artifacts."""
    from models import tracking

    trained = tracking.load_run_file(model_dir)
    numbers = {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float))}
    import mlflow

    artifact_run = None
    if trained:
        with tracking.start_run(trained["experiment"], run_id=trained["run_id"]) as run:
            mlflow.log_metrics(numbers)
            mlflow.set_tag("speechflow.primary_metric", metrics["primary_metric"])
            if not parent_run_id:
                mlflow.log_artifacts(str(model_dir / "eval"), artifact_path="eval")
                mlflow.log_artifact(str(model_dir / "eval.json"))
                artifact_run = run.info.run_id
        experiment = trained["experiment"]
    else:
        experiment = "speechflow"
    if parent_run_id:
        stage = f"evaluate_{metrics['model']}"
        tags = {"speechflow.stage": stage, "speechflow.trained_run": (trained or {}).get("run_id", "")}
        # A retried evaluation logs into the child run of the first attempt instead of adding one.
        earlier = mlflow.search_runs(
            experiment_ids=[tracking.ensure_experiment(experiment)],
            output_format="list",
            filter_string=f"tags.mlflow.parentRunId = '{parent_run_id}' and tags.`speechflow.stage` = '{stage}'",
        )
        run_id = earlier[0].info.run_id if earlier else None
        with tracking.start_run(
            experiment, f"evaluate-{metrics['model']}", parent_run_id, run_id=run_id, tags=tags
        ) as run:
            mlflow.log_metrics(numbers)
            mlflow.log_artifacts(str(model_dir / "eval"), artifact_path="eval")
            mlflow.log_artifact(str(model_dir / "eval.json"))
            artifact_run = run.info.run_id
    return artifact_run


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model-dir", required=True, type=Path, help="the training workdir (holds model/)")
    p.add_argument("--shards", required=True, type=Path, help="directory with manifest.json and the shards")
    p.add_argument(
        "--split", action="append", default=[], help="split(s) to evaluate (default: test, and test_noisy for asr)"
    )
    p.add_argument("--asr-model-dir", type=Path, help="tts: a trained acoustic model's workdir, for intelligibility")
    p.add_argument("--beam-width", type=int, default=16, help="asr: beam search width")
    p.add_argument("--max-utterances", type=int, default=100, help="tts: utterances to synthesize")
    p.add_argument("--num-audio", type=int, default=3, help="tts: sentences to render as audio with Griffin-Lim")
    p.add_argument("--mlflow-parent-run-id", help="also log to a child run of this MLflow run (the DAG's)")
    p.add_argument("--no-mlflow", action="store_true", help="only write eval.json")
    args = p.parse_args(argv)
    from pipeline.runtime import configure_tensorflow

    configure_tensorflow()
    try:
        metrics = evaluate(
            args.model_dir,
            args.shards,
            args.split,
            args.asr_model_dir,
            args.beam_width,
            args.max_utterances,
            args.num_audio,
        )
        if not args.no_mlflow:
            metrics["mlflow_run_id"] = log_to_mlflow(args.model_dir, metrics, args.mlflow_parent_run_id)
            atomic_write_json(args.model_dir / "eval.json", metrics)
    except (ValueError, FileNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    print(json.dumps(metrics, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
