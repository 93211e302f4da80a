"""Tokenize documents once into a token-id stream file, in parallel, in bounded memory.

Example:
    python scripts/tokenize_text.py -i demo/input/imdb.txt -o demo/imdb.ids -v demo/vocab -n 4
    python scripts/tokenize_text.py -i wiki/input/*.json.gz -o wiki/wiki.ids -v wiki/vocab  # JSON lines, field "text"

Each document (a line of text, a JSON line's or parquet row's text) is encoded without
[CLS]/[SEP] and the ids of all documents, in input order, are written as one stream
(src/corpus/token_stream.py, TokenStreamWriter). The input is read about --chunk-mb at a time, so memory
stays bounded whatever the corpus size; with -n workers at most 2*n chunks are in flight. The
output file does not depend on -n or --chunk-mb, byte for byte.
"""
import argparse
import contextlib
import os
import sys
import time
from pathlib import Path

import numpy as np
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))
from atomic import remove_stale_temps  # noqa: E402
from cores import available_cores  # noqa: E402
from errors import UserError, exit_on_user_error  # noqa: E402
from vocab import load_vocab  # noqa: E402
from corpus.input_files import (DEFAULT_CHUNK_MB, BadRecords, InputFile, add_input_arguments, find_inputs,  # noqa: E402
                                read_documents)
from corpus.token_stream import TOKENS_PER_STREAM_BLOCK, TokenStreamWriter  # noqa: E402
from corpus.tokenizing import Tokenizing  # noqa: E402


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


def counted_ids(encoded, bar):
    """The ids of each encoded batch, the progress bar counting its documents and tokens."""
    documents = 0
    for count, ids in encoded:
        yield ids
        documents += count
        bar.update(len(ids))
        bar.set_postfix(documents=f"{documents:,}", refresh=False)


def tokenize_files(inputs: list[InputFile], vocab_path, output: Path, nproc: int = 1,
                   chunk_bytes: int = int(DEFAULT_CHUNK_MB * 2**20), show_progress: bool = True,
                   text_field: str = "text", bad: BadRecords | None = None) -> int:
    """Tokenize the inputs' documents into the token stream file output; returns the number of tokens written."""
    if nproc < 1:
        raise UserError(f"-n {nproc}: expected at least 1 process")
    if chunk_bytes < 1:
        raise UserError(f"chunk of {chunk_bytes} bytes: expected a positive size")
    vocab = load_vocab(vocab_path)
    check_output(output)
    batches = read_documents(inputs, text_field, bad, chunk_bytes)
    tokens = 0
    try:
        # The writer removes its temporary files unless the block completes: no half-written output.
        with Tokenizing(vocab, nproc) as tokenizing, TokenStreamWriter(output, vocab, map(str, inputs)) as writer, \
                tqdm(unit="tok", unit_scale=True, desc="tokenize", disable=not show_progress) as bar:
            encoded = tokenizing.map((len(documents), documents) for documents in batches)
            with contextlib.closing(encoded):
                for block in fixed_size_blocks(counted_ids(encoded, bar), TOKENS_PER_STREAM_BLOCK):
                    writer.write(block)
                    tokens += len(block)
            if tokens == 0:  # the preparers could not use the stream
                raise UserError(f"{', '.join(map(str, inputs))}: no tokens in the input (only whitespace)")
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
    add_input_arguments(parser)
    parser.add_argument("-o", "--output", required=True, type=Path, help="token stream file to write")
    parser.add_argument("-v", "--vocab", required=True, type=Path, help="vocabulary directory or vocab.txt")
    parser.add_argument("-n", "--nproc", type=int, default=available_cores(),
                        help="worker processes (default: the cores this process may use); 1 tokenizes in this "
                             "process, on one core")
    parser.add_argument("--chunk-mb", type=float, default=DEFAULT_CHUNK_MB,
                        help=f"text per chunk in MiB (default {DEFAULT_CHUNK_MB:g})")
    return parser.parse_args(argv)


@exit_on_user_error
def main(argv=None):
    args = parse_args(argv)
    if args.chunk_mb <= 0:
        raise UserError(f"--chunk-mb {args.chunk_mb:g}: expected a positive size")
    inputs = find_inputs(args.input, args.format)
    bad = BadRecords(args.skip_bad_records)
    started = time.perf_counter()
    tokens = tokenize_files(inputs, args.vocab, args.output, args.nproc, int(args.chunk_mb * (1 << 20)),
                            text_field=args.text_field, bad=bad)
    seconds = time.perf_counter() - started
    print(f"wrote {args.output}: {tokens:,} tokens from {len(inputs)} input(s) "
          f"in {seconds:.1f} s ({tokens / seconds:,.0f} tokens/s)")
    if bad.count:
        print(bad.summary())


if __name__ == "__main__":
    main()
