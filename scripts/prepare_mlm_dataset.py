"""Prepare MLM shards from text: pack whole words into segments of at most m-2 word pieces.

Example:
    python scripts/prepare_mlm_dataset.py -i demo/input/*.txt -l imdb -o demo/data -m 128 -v demo/vocab

Streams the input in chunks of whole lines, so corpora larger than memory work. Segments run on
across lines and reviews; each becomes [CLS] segment [SEP] in the train, val or test shard
(80/10/10 by a hash of the seed and sample index): OUTDIR/{train,val,test}_LABEL_m_SEED.msgpack.gz.
With --masking static the masks are stored in the shards (and --copies K gives K masked train
copies; --mask-rate, --whole-word-masking and --mask-replace-* say how); by default the trainer
masks each batch afresh.

With --pairs nsp or sop, samples are sentence pairs [CLS] A [SEP] B [SEP] with a label, built per
document (one a line) as Google BERT does (see src/sentence_pairs.py); documents, not samples,
go to train, val or test.

Lines longer than 65,536 characters are cut at spaces (a one-line corpus such as text8 is read
in bounded memory); with --pairs each piece is a document.
"""
import argparse
import itertools
import sys
from pathlib import Path

import numpy as np
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))
from config import SENTENCE_OBJECTIVES  # noqa: E402
from errors import UserError, exit_on_user_error  # noqa: E402
from input_files import expand_inputs, read_chunks, short_lines  # noqa: E402
from preparation import (SPLITS, SplitWriter, add_shared_arguments, check_shared_arguments,  # noqa: E402
                         masking_rule, output_dir, print_written, split_summary)
from sentence_pairs import PairMaker, encode_documents, pair_sample  # noqa: E402
from vocab import load_vocab  # noqa: E402

# ---------------------------------------------------------------------------------------------
# Reading text and packing words


def read_line_chunks(files: list[Path], chunk_bytes: int, progress) -> iter:
    """Lists of whole lines, about chunk_bytes of text each, file after file."""
    for file in files:
        with file.open("rb") as stream:
            offset = 0
            for data in read_chunks(stream, chunk_bytes):
                try:
                    text = data.decode("utf-8")
                except UnicodeDecodeError as error:
                    raise UserError(f"{file}: not UTF-8 text (byte {offset + error.start})") from None
                offset += len(data)
                progress.update(len(data))
                yield short_lines([line for line in text.split("\n") if line.strip()])


def encode_lines(vocab, lines: list[str]) -> np.ndarray:
    encoded = vocab.encode(lines)
    return np.fromiter(itertools.chain.from_iterable(encoded), dtype=np.int64, count=sum(map(len, encoded)))


def cut_long_words(word_starts: np.ndarray, max_pieces: int) -> tuple[np.ndarray, int]:
    """Allow a segment break every max_pieces pieces inside words longer than that.

    Returns the new break flags and how many words were cut.
    """
    starts = np.flatnonzero(word_starts)
    lengths = np.diff(np.append(starts, len(word_starts)))
    long_words = lengths > max_pieces
    extra_breaks = (lengths[long_words] - 1) // max_pieces
    first_piece = np.repeat(starts[long_words], extra_breaks)
    rank = np.arange(extra_breaks.sum()) - np.repeat(np.cumsum(extra_breaks) - extra_breaks, extra_breaks) + 1
    breaks = word_starts.copy()
    breaks[first_piece + rank * max_pieces] = True
    return breaks, int(long_words.sum())


def pack_segments(breaks: np.ndarray, max_pieces: int, final: bool) -> tuple[list[tuple[int, int]], int]:
    """Greedy packing: each segment takes whole words while it holds at most max_pieces pieces.

    breaks[i] says a segment may start at piece i (breaks[0] must be True). A segment whose end
    could still move with more input is left open unless final; returns the closed segments as
    (begin, end) and where the open rest begins.
    """
    total = len(breaks)
    boundaries = np.append(np.flatnonzero(breaks), total)
    segments, begin = [], 0
    while begin + max_pieces < total:
        end = int(boundaries[np.searchsorted(boundaries, begin + max_pieces, side="right") - 1])
        segments.append((begin, end))
        begin = end
    if final and begin < total:
        segments.append((begin, total))
        begin = total
    return segments, begin


class SegmentPacker:
    """Packs chunk after chunk, carrying the open segment, so chunking never changes the result."""

    def __init__(self, vocab, max_pieces: int):
        self.is_continuation = vocab.is_continuation  # a segment may not start at `##ing`
        self.unk_id = vocab.unk_id
        self.max_pieces = max_pieces
        self.carry_ids = np.empty(0, dtype=np.int64)
        self.carry_breaks = np.empty(0, dtype=bool)
        self.pieces = self.words_cut = self.short = self.unknown = 0

    def pack(self, ids: np.ndarray, final: bool = False) -> list[np.ndarray]:
        """Segments closed by this chunk's ids (whole lines), each an array of word pieces."""
        word_starts = ~self.is_continuation[ids]
        word_starts[:1] = True  # a chunk starts at the start of a line
        breaks, cut = cut_long_words(word_starts, self.max_pieces)
        self.words_cut += cut
        self.pieces += len(ids)
        self.unknown += int(np.count_nonzero(ids == self.unk_id))
        ids = np.concatenate([self.carry_ids, ids])
        breaks = np.concatenate([self.carry_breaks, breaks])
        spans, rest = pack_segments(breaks, self.max_pieces, final)
        self.carry_ids, self.carry_breaks = ids[rest:], breaks[rest:]
        self.short += sum(end - begin < self.max_pieces / 2 for begin, end in spans)
        return [ids[begin:end] for begin, end in spans]


def with_cls_sep(segments: list[np.ndarray], vocab) -> list[np.ndarray]:
    return [np.concatenate(([vocab.cls_id], segment, [vocab.sep_id])) for segment in segments]


def prepare(files: list[Path], vocab, writer: SplitWriter, seq_len: int, chunk_bytes: int) -> SegmentPacker:
    packer = SegmentPacker(vocab, seq_len - 2)
    total = sum(file.stat().st_size for file in files)
    with tqdm(total=total, unit="B", unit_scale=True, desc="packing") as progress:
        for lines in read_line_chunks(files, chunk_bytes, progress):
            writer.add(with_cls_sep(packer.pack(encode_lines(vocab, lines)), vocab))
        writer.add(with_cls_sep(packer.pack(np.empty(0, dtype=np.int64), final=True), vocab))
    if packer.pieces == 0:
        raise UserError(f"{', '.join(map(str, files))}: no tokens in the input")
    return packer


def prepare_pairs(files: list[Path], vocab, writer: SplitWriter, seq_len: int, chunk_bytes: int,
                  objective: str, seed: int) -> PairMaker:
    """Sentence pairs of each document, written to the document's split."""
    maker = PairMaker(objective, seq_len - 3, seed)  # room for [CLS] A [SEP] B [SEP]
    total = sum(file.stat().st_size for file in files)
    with tqdm(total=total, unit="B", unit_scale=True, desc="pairing") as progress:
        for lines in read_line_chunks(files, chunk_bytes, progress):
            write_pairs(writer, maker.add(encode_documents(vocab, lines)), vocab)
        write_pairs(writer, maker.finish(), vocab)
    if maker.documents == 0:
        raise UserError(f"{', '.join(map(str, files))}: no tokens in the input")
    return maker


def write_pairs(writer: SplitWriter, made: list, vocab) -> None:
    for code, split in enumerate(SPLITS):
        pairs = [pair for pair_code, pair in made if pair_code == code]
        writer.add_to_split(split, [pair_sample(pair, vocab.cls_id, vocab.sep_id) for pair in pairs],
                            [pair.label for pair in pairs])


def print_pair_summary(writer: SplitWriter, maker: PairMaker) -> None:
    print(f"{writer.samples.sum():,} {maker.objective} pairs ({split_summary(writer)}), {writer.tokens:,} tokens, "
          f"from {maker.documents:,} documents")
    print(f"{maker.left_over_sentences:,} sentences without a partner (one-sentence documents, lone last "
          f"sentences), {maker.lonely_documents:,} documents alone in their split (no random next sentence)")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-i", "--input", nargs="+", required=True, help="text files or globs, one document a line")
    parser.add_argument("-v", "--vocab", required=True, help="directory holding vocab.txt, or the file")
    add_shared_arguments(parser)
    parser.add_argument("--chunk-mb", type=float, default=16, help="text read and tokenized at once (default 16)")
    parser.add_argument("--pairs", choices=SENTENCE_OBJECTIVES, default="none",
                        help="none: pack words into segments (default); nsp or sop: sentence pairs labelled for "
                             "next-sentence or sentence-order prediction")
    return parser.parse_args(argv)


@exit_on_user_error
def main(argv=None):
    args = parse_args(argv)
    check_shared_arguments(args)
    if args.chunk_mb <= 0:
        raise UserError(f"--chunk-mb {args.chunk_mb}: expected a positive size")
    files = expand_inputs(args.input)
    vocab = load_vocab(args.vocab)
    chunk_bytes = max(1, int(args.chunk_mb * 2**20))
    with output_dir(args.output):  # removed again if nothing is written
        with SplitWriter(args.output, args.label, vocab, seq_len=args.seq_len, seed=args.seed, masking=args.masking,
                         copies=args.copies, rule=masking_rule(args), source_files=files,
                         created_by="prepare_mlm_dataset.py", pairs=args.pairs) as writer:
            if args.pairs != "none":
                maker = prepare_pairs(files, vocab, writer, args.seq_len, chunk_bytes, args.pairs, args.seed)
            else:
                packer = prepare(files, vocab, writer, args.seq_len, chunk_bytes)
    print_written(writer)
    if args.pairs != "none":
        print_pair_summary(writer, maker)
        return
    print(f"{writer.samples.sum():,} samples ({split_summary(writer)}), {writer.tokens:,} tokens "
          f"({packer.pieces:,} word pieces + [CLS]/[SEP])")
    print(f"{packer.short:,} short samples (< {(args.seq_len - 2) / 2:g} pieces), "
          f"{packer.words_cut:,} words longer than {args.seq_len - 2} pieces cut, "
          f"{packer.unknown:,} [UNK] pieces (words the vocabulary cannot spell, or longer than 100 characters)")


if __name__ == "__main__":
    main()
