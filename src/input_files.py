"""Input files named on a command line (train_vocab.py, tokenize_text.py, the shard preparers): globs
expanded, each checked to exist and hold something, before any work starts.
"""
import glob
from pathlib import Path

from errors import UserError


def expand_inputs(patterns) -> list[Path]:
    """Files named on the command line, globs expanded; each must exist and hold text."""
    files = []
    for pattern in patterns:
        matches = sorted(glob.glob(pattern)) if glob.has_magic(pattern) else [pattern]
        if not matches:
            raise UserError(f"{pattern}: no file matches this pattern")
        files.extend(Path(match) for match in matches)
    for file in files:
        if not file.is_file():
            raise UserError(f"{file}: input file not found")
        if file.stat().st_size == 0:
            raise UserError(f"{file}: input file is empty")
    return files
