"""What each part of synthesis costs a listener: the same sentences spoken by the durations model with
the durations it was trained on, with those durations disturbed, and with the durations it predicts
(benchmarks/tts_durations.py prints the table; inference only, minutes).

Arms, each a list of log-mels [T, 80] heard by the same acoustic model:
- `teacher_forced`: the decoder over the alignment search's path (`teacher_forced`, as evaluation's
  `..._cer_teacher_forced`);
- `searched`: the search's durations [N] through `infer_with_durations` (the same path, so the same
  frames: a check that synthesis runs the computation training ran);
- `searched_noise_S`: those durations plus Gaussian noise of S decoder steps per character (the running
  sum is rounded, as for predicted durations): what a duration predictor of that error would cost;
- `predicted`: the predicted durations (what `infer` speaks; evaluation's free-running figure);
- `predicted_rescaled`: the predicted durations scaled to the searched total (each sentence as long as
  its recording): what of `predicted`'s cost is the sentence's length and what the distribution;
- `predicted_vocoded`: `predicted` through Griffin-Lim and the feature stage (`audio.vocoded`), what a
  person hears.
"""

from __future__ import annotations

import numpy as np

from models.tts import audio

NOISE_STEPS = (0.25, 0.5)


def arm_names(noise: tuple[float, ...] = NOISE_STEPS) -> list[str]:
    return [
        "teacher_forced",
        "searched",
        *[f"searched_noise_{s:g}" for s in noise],
        "predicted",
        "predicted_rescaled",
        "predicted_vocoded",
    ]


def speak_arms(model, config, data: dict, dataset, max_utterances: int, noise=NOISE_STEPS, seed: int = 0) -> dict:
    """The arms' log-mels for the first `max_utterances` sentences of `dataset` (evaluation batches of
    the durations model), with what the listener needs and the durations' own figures. Returns
    {"mels": {arm: [T, 80] list}, "voices": [...], "tokens": [[L] character ids], "durations": {figure: value}}."""
    import tensorflow as tf

    mean, std = np.asarray(data["mel_mean"], np.float32), np.asarray(data["mel_std"], np.float32)
    voices = list(config.settings.speakers) if config.settings.multi_speaker else [""]
    forced_pass = tf.function(lambda b: model.teacher_forced(b, training=False), reduce_retracing=True)
    given = tf.function(model.infer_with_durations, reduce_retracing=True)
    rng = np.random.default_rng(seed)
    names = [n for n in arm_names(noise) if n != "predicted_vocoded"]
    mels: dict[str, list] = {name: [] for name in names}
    out = {"mels": mels, "voices": [], "tokens": []}
    searched_all, predicted_all, lasts = [], [], []
    for batch in dataset:
        forced = forced_pass(batch)
        lengths = batch["token_lengths"].numpy()
        n_mask = np.arange(batch["tokens"].shape[1])[None, :] < lengths[:, None]  # [B, N]
        searched = forced["durations"].numpy()  # [B, N] decoder steps, integers
        predicted = np.maximum(forced["predicted_durations"].numpy(), 0.0) * n_mask
        ids = batch.get("speaker_ids", tf.zeros_like(batch["token_lengths"]))
        durations = {"searched": searched, "predicted": predicted}
        for s in noise:
            durations[f"searched_noise_{s:g}"] = np.maximum(searched + rng.normal(0, s, searched.shape), 0) * n_mask
        totals = predicted.sum(1, keepdims=True)
        durations["predicted_rescaled"] = predicted * searched.sum(1, keepdims=True) / np.maximum(totals, 1e-6)
        spoken = {"teacher_forced": (forced["mel_after"].numpy(), batch["mel_lengths"].numpy())}
        for name, d in durations.items():
            result = given(batch["tokens"], batch["token_lengths"], tf.constant(d, tf.float32), ids)
            spoken[name] = (result["mels"].numpy(), result["lengths"].numpy())
        for i in range(len(lengths)):
            if len(out["voices"]) >= max_utterances:
                break
            n = int(lengths[i])
            for name in names:
                frames, frame_lengths = spoken[name]
                mels[name].append(frames[i, : max(int(frame_lengths[i]), 1)] * std + mean)
            out["voices"].append(voices[int(ids[i])])
            out["tokens"].append(batch["text_tokens"][i, : batch["text_token_lengths"][i]].numpy())
            searched_all.append(searched[i, :n])
            predicted_all.append(predicted[i, :n])
            lasts.append((searched[i, n - 1], predicted[i, n - 1]))
        if len(out["voices"]) >= max_utterances:
            break
    mels["predicted_vocoded"] = audio.vocoded(mels["predicted"])
    out["durations"] = duration_figures(searched_all, predicted_all, lasts)
    return out


def duration_figures(searched: list[np.ndarray], predicted: list[np.ndarray], lasts: list[tuple]) -> dict:
    """How the predicted durations [N] differ from the searched ones, in decoder steps."""
    s, p = np.concatenate(searched), np.concatenate(predicted)
    last = np.asarray(lasts, np.float64).reshape(-1, 2)
    return {
        "characters": int(s.size),
        "mean_abs_error_steps": float(np.mean(np.abs(p - s))),
        "searched_zero_step_share": float(np.mean(s == 0)),
        "predicted_below_half_share": float(np.mean(p < 0.5)),
        "length_ratio": float(np.sum(p) / max(np.sum(s), 1.0)),  # predicted over searched steps, all sentences
        "last_character_searched_steps": float(last[:, 0].mean()) if last.size else 0.0,
        "last_character_predicted_steps": float(last[:, 1].mean()) if last.size else 0.0,
    }


def heard(arms: dict, vocabulary: list[str], listener) -> dict:
    """Each arm's figures by `listener` (models/tts/evaluation.py `Listener`): `error_rates` of its
    words (`cer`, `wer` and their counts), and for a phone listener `per` and `phones` of its greedy
    phones against the targets it trains on (evaluation's `heard_rates`). The teacher-forced frames
    are normalized by the recording's voice as evaluation does (on dev the same voice)."""
    from models.tts.evaluation import heard_rates
    from pipeline import text

    refs = ["".join(vocabulary[t] for t in tokens) for tokens in arms["tokens"]]
    said = None
    if listener.phones:
        keys = [("diagnosis", f"sentence {i}") for i in range(len(refs))]
        found = listener.references({k: text.decode(t, vocabulary) for k, t in zip(keys, arms["tokens"])})
        said = [found[k] for k in keys]
    return {name: heard_rates(refs, said, listener.hear(mels, arms["voices"])) for name, mels in arms["mels"].items()}
