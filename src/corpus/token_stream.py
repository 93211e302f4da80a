"""The token-id stream (tokenize_text.py's output, prepare_mlm_fixed_len_dataset_from_ids.py's input):
a header, then blocks of raw ids; its writer and its reader.
"""
from pathlib import Path
from typing import Iterator

import numpy as np

from packed_files import DTYPES, HeaderFirstFile, ShardError, corrupt, dtype_name, guarded, open_stream, unpacker

TOKEN_STREAM_FORMAT = "bert-token-ids"
FORMAT_VERSION = 1
TOKENS_PER_STREAM_BLOCK = 1 << 20


class TokenStreamWriter:
    """Write a token-id stream as a context manager: finalised on clean exit, removed on error.

    Example:
        with TokenStreamWriter("ids.msgpack.gz", vocab, ["corpus.txt"]) as stream:
            stream.write(np.array(ids))
    """

    def __init__(self, path, vocab, source_files=()):
        self.path = Path(path)
        self.vocab = vocab
        self.dtype = vocab.id_dtype
        self.source_files = [str(file) for file in source_files]
        self.tokens = 0
        self.pending: list[np.ndarray] = []
        self.pending_tokens = 0
        self.file: HeaderFirstFile | None = None

    def __enter__(self):
        self.file = HeaderFirstFile(self.path)
        return self

    def write(self, ids) -> None:
        """Append ids; small writes are gathered into blocks of about a million tokens."""
        ids = np.asarray(ids)
        if ids.size and (ids.min() < 0 or ids.max() >= self.vocab.size):
            raise ValueError(f"token ids outside 0..{self.vocab.size - 1}")
        self.pending.append(ids.astype(self.dtype, copy=False).ravel())
        self.pending_tokens += ids.size
        self.tokens += ids.size
        if self.pending_tokens >= TOKENS_PER_STREAM_BLOCK:
            self._flush()

    def _flush(self) -> None:
        if self.pending_tokens:
            self.file.write(np.concatenate(self.pending).tobytes())
        self.pending, self.pending_tokens = [], 0

    def header(self) -> dict:
        return {"format": TOKEN_STREAM_FORMAT, "version": FORMAT_VERSION, "vocab_size": self.vocab.size,
                "vocab_checksum": self.vocab.checksum, "dtype": dtype_name(self.dtype),
                "source_files": self.source_files, "tokens": self.tokens}

    def __exit__(self, kind, error, traceback):
        try:
            if kind is None:
                self._flush()
                self.file.finish(self.header())
        finally:
            self.file.abort()  # the temporary file, whatever failed; nothing is left after finish()
        return False


def read_token_stream(path) -> tuple[dict, Iterator[np.ndarray]]:
    """Header and an iterator over the id blocks of a token stream."""
    path = Path(path)
    stream = open_stream(path)
    try:
        blocks = unpacker(stream)
        header = guarded(path, next, blocks, None)
        if not isinstance(header, dict) or header.get("format") != TOKEN_STREAM_FORMAT:
            raise ShardError(f"{path}: not a token-id stream ({TOKEN_STREAM_FORMAT}); was it written by "
                             f"tokenize_text.py?")
        if header.get("dtype") not in DTYPES or not isinstance(header.get("tokens"), int):
            raise corrupt(path, f"header dtype {header.get('dtype')!r}, tokens {header.get('tokens')!r}")
    except BaseException:
        stream.close()
        raise
    return header, _token_blocks(path, stream, blocks, header)


def _token_blocks(path, stream, blocks, header) -> Iterator[np.ndarray]:
    dtype = DTYPES[header["dtype"]]
    seen = 0
    with stream:
        while True:
            block = guarded(path, next, blocks, None)
            if block is None:
                break
            ids = guarded(path, np.frombuffer, block, dtype)
            seen += len(ids)
            if seen > header["tokens"]:
                raise corrupt(path, f"more tokens than the header's {header['tokens']}")
            yield ids
    if seen != header["tokens"]:
        raise corrupt(path, f"{seen} tokens but the header counts {header['tokens']}")
