"""Where each CTC output lands in time: the best path of a transcript through the acoustic model's
outputs, and each word's start and duration from it (models.transcribe's CTM)."""

from __future__ import annotations

import numpy as np


def ctc_forced_alignment(log_probs: np.ndarray, labels: list[int]) -> np.ndarray:
    """The most likely CTC path of `labels` (ids, blank = 0) through log_probs [T, V]: for each of the
    T frames, the index into `labels` it emits, or -1 for a blank. Viterbi over the label sequence
    with blanks between (Graves et al. 2006). Written here because neither TensorFlow nor a library
    of this project's gives the path (torchaudio's forced_align does, for PyTorch)."""
    frames = len(log_probs)
    if not labels:
        return np.full(frames, -1, np.int64)
    ext = np.zeros(2 * len(labels) + 1, np.int64)  # blank, l1, blank, l2, ..., blank
    ext[1::2] = labels
    states = len(ext)
    if frames < len(labels):
        raise ValueError(f"{len(labels)} labels cannot be aligned to {frames} frames")
    score = np.full(states, -np.inf)
    score[0], score[1] = log_probs[0, ext[0]], log_probs[0, ext[1]]
    back = np.zeros((frames, states), np.int8)  # 0, 1 or 2 states moved to reach each state
    # A label may be reached from two back (skipping the blank) unless it repeats the one before.
    skip = np.zeros(states, bool)
    skip[3::2] = ext[3::2] != ext[1:-2:2]
    for t in range(1, frames):
        stay = score
        step = np.concatenate([[-np.inf], score[:-1]])
        jump = np.where(skip, np.concatenate([[-np.inf, -np.inf], score[:-2]]), -np.inf)
        options = np.stack([stay, step, jump])  # [3, S]
        back[t] = options.argmax(0)
        score = options.max(0) + log_probs[t, ext]
    state = states - 1 if score[-1] >= score[-2] else states - 2
    path = np.full(frames, -1, np.int64)
    for t in range(frames - 1, -1, -1):
        if state % 2 == 1:
            path[t] = state // 2
        state -= int(back[t, state])
    return path


def word_times(text: str, path: np.ndarray, frame_seconds: float) -> list[tuple[str, float, float]]:
    """(word, start s, duration s) of each word of `text`, whose characters are the labels that
    `path` (per frame: the character's index, -1 none) places: a word spans from the first frame of
    its first character to the end of the last frame of its last."""
    frames_of: dict[int, list[int]] = {}
    for t, index in enumerate(path):
        if index >= 0:
            frames_of.setdefault(int(index), []).append(t)
    words, position = [], 0
    for word in text.split(" "):
        if word:
            first, last = position, position + len(word) - 1
            start = min(frames_of.get(first, [0]))
            end = max(frames_of.get(last, [start])) + 1
            words.append((word, start * frame_seconds, max(end - start, 1) * frame_seconds))
        position += len(word) + 1
    return words
