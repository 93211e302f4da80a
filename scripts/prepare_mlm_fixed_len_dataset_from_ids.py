"""Prepare MLM shards of exact length: ids cut into pieces of m-2, each [CLS] piece [SEP].

Example:
    python scripts/prepare_mlm_fixed_len_dataset_from_ids.py -i demo/ids/imdb.ids.msgpack.gz -l imdb \\
        -o demo/data -m 128 -v demo/vocab
    python scripts/prepare_mlm_fixed_len_dataset_from_ids.py -i wiki/parquet/ -l wiki -o wiki/datasets -m 128 \\
        -v wiki/vocab   # text straight away: tokenized on -n processes, then cut

Reads what tokenize_text.py wrote (several streams continue one another), or any input the other
preparer reads (text, JSON lines, parquet, a datasets folder), tokenized on the way. Pieces ignore
word boundaries; the last, shorter piece of each unit is kept and reported. Units, splits, shard
names, resume, --part and masking options are those of prepare_mlm_dataset.py; from a token
stream a unit is exactly the ids of --shard-tokens tokens, so only the corpus's last piece is short.
"""
import argparse
import contextlib
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))
from errors import UserError, exit_on_user_error  # noqa: E402
from packed_files import read_header  # noqa: E402
from vocab import load_vocab  # noqa: E402
from corpus.corpus_units import document_pieces, id_pieces, parse_part, prepare, print_made, unit_chars_for  # noqa: E402
from corpus.input_files import BadRecords, InputFile, add_input_arguments, find_inputs, read_documents  # noqa: E402
from corpus.preparation import SplitWriter, add_shared_arguments, check_shared_arguments, output_dir, split_summary  # noqa: E402
from corpus.token_stream import TOKEN_STREAM_FORMAT, read_token_stream  # noqa: E402
from corpus.tokenizing import Tokenizing  # noqa: E402


def is_token_stream(each: InputFile) -> bool:
    header = read_header(each.path) if each.path is not None else None
    return header is not None and header.get("format") == TOKEN_STREAM_FORMAT


def stream_blocks(inputs: list[InputFile], vocab):
    """The id blocks of the streams, one after another, each stream checked against the vocabulary."""
    for each in inputs:
        header, blocks = read_token_stream(each.path)
        if header.get("vocab_checksum") != vocab.checksum or header.get("vocab_size") != vocab.size:
            raise UserError(f"{each}: made with vocabulary checksum {header.get('vocab_checksum')} "
                            f"({header.get('vocab_size')} tokens) but {vocab.path} has checksum {vocab.checksum} "
                            f"({vocab.size} tokens)")
        yield from blocks


class PieceCutter:
    """One unit's ids cut into pieces of piece_len, carrying the rest from chunk to chunk."""

    def __init__(self, vocab, piece_len: int):
        self.cls_id, self.sep_id, self.piece_len = vocab.cls_id, vocab.sep_id, piece_len
        self.rest = np.empty(0, dtype=np.int64)
        self.ids = 0
        self.short_piece = 0  # the length of the unit's last piece, when it is short

    def add(self, writer: SplitWriter, ids: np.ndarray) -> None:
        self.ids += len(ids)
        ids = np.concatenate([self.rest, ids.astype(np.int64)])
        full = len(ids) // self.piece_len
        writer.add(self.with_cls_sep(ids[:full * self.piece_len].reshape(full, self.piece_len)))
        self.rest = ids[full * self.piece_len:]

    def finish(self, writer: SplitWriter) -> None:
        if len(self.rest):
            writer.add(self.with_cls_sep(self.rest[None, :]))
            self.short_piece = len(self.rest)

    def with_cls_sep(self, pieces: np.ndarray) -> list[np.ndarray]:
        column = np.ones((len(pieces), 1), dtype=np.int64)
        return list(np.hstack([column * self.cls_id, pieces, column * self.sep_id]))


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_input_arguments(parser, "token-id streams from tokenize_text.py, or documents")
    parser.add_argument("-v", "--vocab", required=True,
                        help="the vocabulary the ids were made with (directory holding vocab.txt, or the file)")
    add_shared_arguments(parser)
    return parser.parse_args(argv)


def pieces_and_encoder(args, inputs: list[InputFile], vocab, bad: BadRecords, stack):
    """(pieces, unit size, encode): the streams' ids as they are, or the documents tokenized."""
    streams = [is_token_stream(each) for each in inputs]
    if all(streams):
        unit_ids = max(1, args.shard_tokens // args.seq_len) * (args.seq_len - 2)  # whole pieces: no short one
        return id_pieces(stream_blocks(inputs, vocab), unit_ids), unit_ids, lambda jobs: jobs
    if any(streams):
        raise UserError(f"{inputs[streams.index(True)]}: a token-id stream among documents; give one kind")
    batches = read_documents(inputs, args.text_field, bad, max(1, int(args.chunk_mb * 2**20)))
    unit_chars, batches = unit_chars_for(vocab, batches, args.shard_tokens)
    tokenizing = stack.enter_context(Tokenizing(vocab, args.nproc, "ids"))
    return document_pieces(batches, unit_chars), unit_chars, tokenizing.map


@exit_on_user_error
def main(argv=None):
    args = parse_args(argv)
    check_shared_arguments(args)
    parse_part(args.part)
    inputs = find_inputs(args.input, args.format)
    vocab = load_vocab(args.vocab)
    bad = BadRecords(args.skip_bad_records)
    with output_dir(args.output), contextlib.ExitStack() as stack:  # the directory goes again if nothing is written
        pieces, unit_size, encode = pieces_and_encoder(args, inputs, vocab, bad, stack)
        made, plan = prepare(args, vocab, inputs, pieces, unit_size, encode,
                             lambda piece: PieceCutter(vocab, args.seq_len - 2),
                             "prepare_mlm_fixed_len_dataset_from_ids.py")
        if not plan.decided:
            raise UserError(f"{', '.join(map(str, inputs))}: the inputs hold no ids")
    print_made(made, plan, bad)
    ids = sum(cutter.ids for cutter in made.makers)
    print(f"{made.samples.sum():,} samples ({split_summary(made.samples)}), {made.tokens:,} tokens "
          f"({ids:,} ids + [CLS]/[SEP])")
    short = [cutter.short_piece for cutter in made.makers if cutter.short_piece]
    if short:
        print(f"{len(short)} short sample(s), the last of a unit: {short[-1]} ids instead of {args.seq_len - 2} "
              f"(kept)")


if __name__ == "__main__":
    main()
