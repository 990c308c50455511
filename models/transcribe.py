"""The command `python -m models.transcribe`; models/asr/transcribe.py holds what it runs and says what
it reads and writes."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from common import cli
from models.asr import transcribe as batch


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m models.transcribe", description=batch.__doc__.split("\n\n")[0])
    parser.add_argument(
        "--model",
        required=True,
        help="a training workdir (runs/asr), its model/ or a registry URI (models:/NAME@ALIAS, models:/NAME/VERSION)",
    )
    parser.add_argument("--data-dir", type=Path, help="a Kaldi data directory (wav.scp, utt2spk, [segments])")
    parser.add_argument("files", nargs="*", type=Path, help="audio files (instead of --data-dir)")
    parser.add_argument("--out", type=Path, required=True, help="directory for text, ctm and rejected.tsv")
    parser.add_argument(
        "--beam-width", type=int, default=0, help="CTC beam search of this width (0: greedy); a char model only"
    )
    parser.add_argument(
        "--lm",
        type=Path,
        help="a word LM's directory (python -m pipeline.lm): beam search with it; for a phone model a lang dir "
        "(python -m pipeline.lang), the graph it spells words through (default: the model's attached one)",
    )
    parser.add_argument(
        "--no-lm", action="store_true", help="decode without an LM, even the model's attached one; a char model only"
    )
    parser.add_argument("--allow-pipes", action="store_true", help="run wav.scp commands that are not decoders")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    args = parser.parse_args(argv)
    if (args.data_dir is None) == (not args.files):
        parser.error("give either --data-dir or audio files")
    cfg = batch.TranscribeConfig(
        beam_width=args.beam_width,
        lm=str(args.lm or ""),
        no_lm=args.no_lm,
        allow_pipes=args.allow_pipes,
        progress=not args.no_progress,
    )
    return cli.run(lambda: _run(args, cfg))


def _run(args: argparse.Namespace, cfg) -> None:
    summary = batch.transcribe(args.model, args.out, cfg, args.data_dir, args.files)
    print(f"{summary['transcribed']} utterances transcribed ({summary['rejected']} rejected): {summary['text']}")


if __name__ == "__main__":
    sys.exit(main())
