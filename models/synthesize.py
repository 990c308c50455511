"""The command `python -m models.synthesize`; models/tts/synthesize.py holds what it runs and says what
it reads and writes."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from models.tts import synthesize as batch


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m models.synthesize", description=batch.__doc__.split("\n\n")[0])
    parser.add_argument(
        "--model",
        required=True,
        help="a training workdir (runs/tts), its model/ or a registry URI (models:/NAME@ALIAS, models:/NAME/VERSION)",
    )
    parser.add_argument("--text-file", type=Path, required=True, help="one sentence per line (UTF-8)")
    parser.add_argument("--out-dir", type=Path, required=True, help="where the WAVs and index.tsv go")
    parser.add_argument("--voice", default="", help="a training voice of the model (default: its first)")
    parser.add_argument("--max-steps", type=int, default=400, help="decoder steps per sentence at most")
    parser.add_argument("--griffin-lim-iters", type=int, default=48, help="vocoder iterations")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    args = parser.parse_args(argv)
    cfg = batch.SynthesizeConfig(args.voice, args.max_steps, args.griffin_lim_iters, not args.no_progress)
    rows = batch.synthesize(args.model, args.text_file, args.out_dir, cfg)
    print(f"{len(rows)} WAV files written to {args.out_dir} (index.tsv lists them)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
