"""Batch synthesis: a file of sentences -> one WAV per sentence, and a table of what was written.

    python -m models.synthesize --model models:/speechflow-tts@champion --text-file sentences.txt --out-dir wavs/
    python -m models.synthesize --model runs/tts/model --text-file s.txt --voice en-029-f1 --out-dir wavs/

Each non-empty line of the text file is one sentence, spoken in `--voice` (a training voice; the
model's voices are listed when the name is not one of them; none: the first) and written to
`OUT/line-NNNN.wav` (NNNN: its line number), 16-bit PCM at 16 kHz, Griffin-Lim from the predicted
log-mels, as the served model answers. `OUT/index.tsv` lists each file with its line, voice,
seconds and text; blank lines are skipped and counted on stderr.
"""

from __future__ import annotations

import csv
import dataclasses
import sys
from pathlib import Path

from common.progress import progress as progress_bar
from models import trained_model

BATCH_SENTENCES = 16  # sentences synthesized together


@dataclasses.dataclass(frozen=True)
class SynthesizeConfig:
    voice: str = ""  # a training voice of the model; empty: its first
    max_steps: int = 400  # decoder steps per sentence at most (reduction_factor frames each)
    griffin_lim_iters: int = 48  # vocoder iterations; more: cleaner phase, slower
    progress: bool = True  # a progress bar on stderr


def read_sentences(path: Path) -> list[tuple[int, str]]:
    """(line number from 1, sentence) of each non-empty line of `path` (UTF-8)."""
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    return [(i, line.strip()) for i, line in enumerate(lines, 1) if line.strip()]


def synthesize(model_spec: str, text_file: Path, out_dir: Path, cfg: SynthesizeConfig) -> list[dict]:
    """Writes one WAV per sentence of `text_file` and `index.tsv` into `out_dir`; returns the rows."""
    from models.tts import audio
    from models.tts.task import speak

    model, config, data = trained_model.open_model(model_spec)
    if config.model != "tts":
        raise ValueError(f"{model_spec} is an {config.model} model; synthesis needs a synthesis model")
    sentences = read_sentences(text_file)
    blank = len(Path(text_file).read_text(encoding="utf-8").splitlines()) - len(sentences)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = []
    bar = progress_bar(total=len(sentences), desc="synthesize", unit="sentence", disable=not cfg.progress)
    for start in range(0, len(sentences), BATCH_SENTENCES):
        chunk = sentences[start : start + BATCH_SENTENCES]
        texts = [s for _, s in chunk]
        # ValueError naming the model's voices for one it lacks
        out = speak(model, data, texts, [cfg.voice] * len(texts), max_steps=cfg.max_steps)
        mels = [mel[:length] for mel, length in zip(out["mels"], out["lengths"])]
        waves = audio.griffin_lim_batch(mels, n_iter=cfg.griffin_lim_iters)  # one batch, each as alone
        for (line, sentence), wave, voice in zip(chunk, waves, out["voices"]):
            path = out_dir / f"line-{line:04d}.wav"
            audio.write_wav(path, wave)
            rows.append(
                {
                    "file": path.name,
                    "line": line,
                    "voice": voice,
                    "seconds": round(len(wave) / audio.SAMPLE_RATE, 3),
                    "text": sentence,
                }
            )
        bar.update(len(chunk))
    bar.close()
    with open(out_dir / "index.tsv", "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, ["file", "line", "voice", "seconds", "text"], delimiter="\t")
        writer.writeheader()
        writer.writerows(rows)
    if blank:
        print(f"{blank} blank lines of {text_file} skipped", file=sys.stderr)
    return rows
