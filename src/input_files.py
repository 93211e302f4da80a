"""Input files named on a command line (train_vocab.py, tokenize_text.py, the shard preparers): globs
expanded, each checked to exist and hold something, before any work starts; their text read in
chunks of whole lines, and lines of bounded length.
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


# The tokenizer needs ~150 bytes a token of a string it encodes: a longer line is cut at a space,
# so a one-line corpus (text8, 100 MB) is tokenized in bounded memory. Words do not cross spaces,
# so the ids are the same.
MAX_LINE_CHARS = 1 << 16


def read_chunks(stream, chunk_bytes: int):
    """The stream's bytes about chunk_bytes at a time, each ending at a line end; where a line runs
    on for more than chunk_bytes past the chunk, the chunk ends at its last space instead."""
    while chunk := stream.read(chunk_bytes):
        rest = stream.readline(chunk_bytes)  # finish the line the chunk ends in
        chunk += rest
        if len(rest) == chunk_bytes and not rest.endswith(b"\n"):
            cut = chunk.rfind(b" ") + 1  # a space byte is never part of a multi-byte UTF-8 character
            if cut > 0:
                stream.seek(cut - len(chunk), 1)  # the rest starts the next chunk
                chunk = chunk[:cut]
        yield chunk


def short_lines(lines: list[str], limit: int = MAX_LINE_CHARS) -> list[str]:
    """The lines, each longer than limit cut at spaces (or at limit where it has none)."""
    if all(len(line) <= limit for line in lines):
        return lines
    result = []
    for line in lines:
        while len(line) > limit:
            cut = line.rfind(" ", 0, limit) + 1 or limit
            result.append(line[:cut])
            line = line[cut:]
        result.append(line)
    return result
