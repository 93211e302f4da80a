"""Tokenize text files once into a token-id stream file, in parallel, in bounded memory.

Example:
    python scripts/tokenize_text.py -i demo/input/imdb.txt -o demo/imdb.ids -v demo/vocab -n 4

Each line is encoded without [CLS]/[SEP] and the ids of all lines, in input order, are written
as one stream (src/token_stream.py, TokenStreamWriter). The text is read in chunks of whole lines of
about --chunk-mb each, so memory stays bounded whatever the corpus size; with -n workers at most
2*n chunks are in flight. The output file does not depend on -n or --chunk-mb, byte for byte.
"""
import argparse
import collections
import contextlib
import itertools
import multiprocessing
import os
import sys
import time
from pathlib import Path

import numpy as np
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))
from atomic import remove_stale_temps  # noqa: E402
from errors import UserError, exit_on_user_error  # noqa: E402
from input_files import expand_inputs, read_chunks, short_lines  # noqa: E402
from token_stream import TOKENS_PER_STREAM_BLOCK, TokenStreamWriter  # noqa: E402
from vocab import Vocab, load_vocab  # noqa: E402

ENCODE_BATCH_CHARS = 1 << 20


def read_line_chunks(file: Path, chunk_bytes: int):
    """Yield (offset, chunk): the file's bytes about chunk_bytes at a time, ending at line ends
    (input_files.read_chunks)."""
    offset = 0
    with file.open("rb") as stream:
        for chunk in read_chunks(stream, chunk_bytes):
            yield offset, chunk
            offset += len(chunk)


def line_batches(lines: list[str], batch_chars: int = ENCODE_BATCH_CHARS):
    """Consecutive lines in groups of about batch_chars characters."""
    batch, size = [], 0
    for line in lines:
        batch.append(line)
        size += len(line)
        if size >= batch_chars:
            yield batch
            batch, size = [], 0
    if batch:
        yield batch


def encode_chunk(vocab: Vocab, file_name: str, offset: int, chunk: bytes) -> np.ndarray:
    """The ids of every line in the chunk (at offset in the file), concatenated, as id dtype."""
    try:
        lines = short_lines(chunk.decode("utf-8").split("\n"))
    except UnicodeDecodeError as error:
        raise UserError(f"{file_name}: not UTF-8 text ({error.reason} at byte {offset + error.start})") from None
    # The tokenizer's Encoding objects take ~150 bytes a token: encoding the chunk in batches of
    # about a megabyte keeps them small (and is faster than one huge batch).
    arrays = [ids_array(vocab.encode(batch), vocab.id_dtype) for batch in line_batches(lines)]
    return np.concatenate(arrays) if arrays else np.empty(0, dtype=vocab.id_dtype)


def ids_array(ids_per_line: list[list[int]], dtype) -> np.ndarray:
    total = sum(len(ids) for ids in ids_per_line)
    return np.fromiter(itertools.chain.from_iterable(ids_per_line), dtype=dtype, count=total)


worker_vocab: Vocab | None = None  # one per worker process, loaded once by load_worker_vocab


def load_worker_vocab(vocab_path: Path):
    # Workers are already parallel: one tokenizer thread each avoids oversubscribing the cores.
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    global worker_vocab
    worker_vocab = load_vocab(vocab_path)


def encode_chunk_in_worker(file_name: str, offset: int, chunk: bytes) -> np.ndarray:
    return encode_chunk(worker_vocab, file_name, offset, chunk)


def encoded_chunks_serial(vocab: Vocab, chunks):
    """Yield (chunk size in bytes, ids) for each (file name, offset, chunk), in this process."""
    for file_name, offset, chunk in chunks:
        yield len(chunk), encode_chunk(vocab, file_name, offset, chunk)


def encoded_chunks_parallel(vocab: Vocab, chunks, nproc: int):
    """Yield (chunk size in bytes, ids) in input order, encoded by nproc workers.

    Pool.imap would read the whole input ahead of the workers; submitting at most 2*nproc
    chunks at a time keeps memory bounded while every worker always has a chunk queued.
    """
    # spawn, not fork: a forked child of a process that already used the tokenizers thread pool
    # gets its parallelism disabled with a warning, and spawn is the same on every platform.
    context = multiprocessing.get_context("spawn")
    with context.Pool(nproc, initializer=load_worker_vocab, initargs=(vocab.path,)) as pool:
        in_flight = collections.deque()
        for file_name, offset, chunk in chunks:
            task = pool.apply_async(encode_chunk_in_worker, (file_name, offset, chunk))
            in_flight.append((len(chunk), task))
            if len(in_flight) >= 2 * nproc:
                size, result = in_flight.popleft()
                yield size, result.get()
        while in_flight:
            size, result = in_flight.popleft()
            yield size, result.get()


def fixed_size_blocks(arrays, block_tokens: int):
    """Re-cut consecutive id arrays into blocks of exactly block_tokens ids (the last one shorter).

    The stream's blocks then do not depend on --chunk-mb or -n (equal files for equal input), and
    a reader never holds more than one block, however large the chunks were.
    """
    pending, pending_tokens = [], 0
    for ids in arrays:
        pending.append(ids)
        pending_tokens += len(ids)
        if pending_tokens >= block_tokens:
            joined = np.concatenate(pending)
            whole = len(joined) - len(joined) % block_tokens
            for start in range(0, whole, block_tokens):
                yield joined[start:start + block_tokens]
            pending, pending_tokens = [joined[whole:]], len(joined) - whole
    if pending_tokens:
        yield np.concatenate(pending)


def ids_counting_bytes(encoded, bar):
    """The ids of each encoded chunk, advancing the progress bar by the chunk's size in bytes."""
    for size, ids in encoded:
        yield ids
        bar.update(size)


def tokenize_files(files: list[Path], vocab_path, output: Path, nproc: int = 1,
                   chunk_bytes: int = 16 << 20, show_progress: bool = True) -> int:
    """Tokenize files into the token stream file output; returns the number of tokens written."""
    if nproc < 1:
        raise UserError(f"-n {nproc}: expected at least 1 process")
    if chunk_bytes < 1:
        raise UserError(f"chunk of {chunk_bytes} bytes: expected a positive size")
    vocab = load_vocab(vocab_path)
    check_output(output)
    chunks = ((str(file), offset, chunk) for file in files for offset, chunk in read_line_chunks(file, chunk_bytes))
    encoded = (encoded_chunks_serial(vocab, chunks) if nproc == 1
               else encoded_chunks_parallel(vocab, chunks, nproc))
    total_bytes = sum(file.stat().st_size for file in files)
    tokens = 0
    try:
        # The writer removes its temporary files unless the block completes: no half-written output.
        with contextlib.closing(encoded), TokenStreamWriter(output, vocab, [str(file) for file in files]) as writer, \
                tqdm(total=total_bytes, unit="B", unit_scale=True, desc="tokenize", disable=not show_progress) as bar:
            for block in fixed_size_blocks(ids_counting_bytes(encoded, bar), TOKENS_PER_STREAM_BLOCK):
                writer.write(block)
                tokens += len(block)
            if tokens == 0:  # the preparers could not use the stream
                raise UserError(f"{', '.join(map(str, files))}: no tokens in the input (only whitespace)")
    except OSError as error:
        raise UserError(f"{error.filename or output}: {error.strerror or error}") from None
    return tokens


def check_output(output: Path):
    """Fail before the slow part when the output cannot be written."""
    if output.is_dir():
        raise UserError(f"{output}: is a directory, expected a file name for the token ids")
    if not output.parent.is_dir():
        raise UserError(f"{output.parent}: output directory not found")
    if not os.access(output.parent, os.W_OK):
        raise UserError(f"{output.parent}: output directory is not writable")
    remove_stale_temps(output.parent)  # of an earlier run that was killed


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-i", "--input", nargs="+", required=True, help="text files or globs, one document a line")
    parser.add_argument("-o", "--output", required=True, type=Path, help="token stream file to write")
    parser.add_argument("-v", "--vocab", required=True, type=Path, help="vocabulary directory or vocab.txt")
    parser.add_argument("-n", "--nproc", type=int, default=os.cpu_count() or 1,
                        help="worker processes (default: all cores); 1 tokenizes in this process, "
                             "on the tokenizer library's own threads")
    parser.add_argument("--chunk-mb", type=float, default=16.0, help="text per chunk in MiB (default 16)")
    return parser.parse_args(argv)


@exit_on_user_error
def main(argv=None):
    args = parse_args(argv)
    if args.chunk_mb <= 0:
        raise UserError(f"--chunk-mb {args.chunk_mb:g}: expected a positive size")
    files = expand_inputs(args.input)
    started = time.perf_counter()
    tokens = tokenize_files(files, args.vocab, args.output, args.nproc, int(args.chunk_mb * (1 << 20)))
    seconds = time.perf_counter() - started
    print(f"wrote {args.output}: {tokens:,} tokens from {len(files)} file(s) "
          f"in {seconds:.1f} s ({tokens / seconds:,.0f} tokens/s)")


if __name__ == "__main__":
    main()
