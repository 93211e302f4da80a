"""Prepare MLM shards from a token-id stream: cut it into exact pieces of m-2 ids, each [CLS] piece [SEP].

Example:
    python scripts/prepare_mlm_fixed_len_dataset_from_ids.py -i demo/ids/imdb.ids.msgpack.gz -l imdb \\
        -o demo/data -m 128 -v demo/vocab

Reads what tokenize_text.py wrote (several streams continue one another). Pieces ignore word
boundaries; the last, shorter piece is kept and reported. Splits, shard names and masking
options are those of prepare_mlm_dataset.py.
"""
import argparse
import sys
from pathlib import Path

import numpy as np
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))
from errors import UserError, exit_on_user_error  # noqa: E402
from input_files import expand_inputs  # noqa: E402
from preparation import (SplitWriter, add_shared_arguments, check_shared_arguments, masking_rule,  # noqa: E402
                         output_dir, print_written, split_summary)
from token_stream import read_token_stream  # noqa: E402
from vocab import load_vocab  # noqa: E402


def open_streams(files: list[Path], vocab) -> list[tuple[dict, iter]]:
    """Headers and block iterators of the streams, each checked against the vocabulary."""
    streams = []
    for file in files:
        header, blocks = read_token_stream(file)
        if header.get("vocab_checksum") != vocab.checksum or header.get("vocab_size") != vocab.size:
            raise UserError(f"{file}: made with vocabulary checksum {header.get('vocab_checksum')} "
                            f"({header.get('vocab_size')} tokens) but {vocab.path} has checksum {vocab.checksum} "
                            f"({vocab.size} tokens)")
        streams.append((header, blocks))
    return streams


def fixed_length_pieces(blocks, piece_len: int):
    """[pieces, piece_len] arrays of consecutive ids, then a final 1-row array with the short rest."""
    rest = np.empty(0, dtype=np.int64)
    for block in blocks:
        ids = np.concatenate([rest, block.astype(np.int64)])
        full = len(ids) // piece_len
        yield ids[:full * piece_len].reshape(full, piece_len)
        rest = ids[full * piece_len:]
    if len(rest):
        yield rest[None, :]


def with_cls_sep(pieces: np.ndarray, vocab) -> list[np.ndarray]:
    column = np.ones((len(pieces), 1), dtype=np.int64)
    return list(np.hstack([column * vocab.cls_id, pieces, column * vocab.sep_id]))


def all_blocks(streams, progress):
    for _, blocks in streams:
        for block in blocks:
            progress.update(len(block))
            yield block


def prepare(streams, vocab, writer: SplitWriter, seq_len: int) -> int:
    """Write all pieces; returns the length of the final piece when it is short, else 0."""
    short_piece = 0
    with tqdm(total=sum(header["tokens"] for header, _ in streams), unit="tok", unit_scale=True,
              desc="cutting") as progress:
        for pieces in fixed_length_pieces(all_blocks(streams, progress), seq_len - 2):
            if pieces.shape[1] < seq_len - 2:
                short_piece = pieces.shape[1]
            writer.add(with_cls_sep(pieces, vocab))
    return short_piece


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-i", "--input", nargs="+", required=True, help="token-id streams from tokenize_text.py")
    parser.add_argument("-v", "--vocab", required=True,
                        help="the vocabulary the ids were made with (directory holding vocab.txt, or the file)")
    add_shared_arguments(parser)
    return parser.parse_args(argv)


@exit_on_user_error
def main(argv=None):
    args = parse_args(argv)
    check_shared_arguments(args)
    files = expand_inputs(args.input)
    vocab = load_vocab(args.vocab)
    streams = open_streams(files, vocab)
    if sum(header["tokens"] for header, _ in streams) == 0:
        raise UserError(f"{', '.join(map(str, files))}: the token streams hold no ids")
    with output_dir(args.output):  # removed again if nothing is written
        with SplitWriter(args.output, args.label, vocab, seq_len=args.seq_len, seed=args.seed, masking=args.masking,
                         copies=args.copies, rule=masking_rule(args), source_files=files,
                         created_by="prepare_mlm_fixed_len_dataset_from_ids.py") as writer:
            short_piece = prepare(streams, vocab, writer, args.seq_len)
    print_written(writer)
    ids = writer.tokens - 2 * writer.samples.sum()
    print(f"{writer.samples.sum():,} samples ({split_summary(writer)}), {writer.tokens:,} tokens "
          f"({ids:,} ids + [CLS]/[SEP])")
    if short_piece:
        print(f"the last sample is short: {short_piece} ids instead of {args.seq_len - 2} (kept)")


if __name__ == "__main__":
    main()
