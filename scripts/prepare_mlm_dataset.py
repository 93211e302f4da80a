"""Prepare MLM shards from text: pack whole words into segments of at most m-2 word pieces.

Example:
    python scripts/prepare_mlm_dataset.py -i demo/input/*.txt -l imdb -o demo/datasets -m 128 -v demo/vocab
    python scripts/prepare_mlm_dataset.py -i wiki/input/*.json.gz -l wiki -o wiki/datasets -m 128 \
        -v wiki/vocab --part 3/8

Reads text (compressed or not), JSON lines, parquet or a datasets folder (src/corpus/input_files.py), a
document a record, in chunks, so corpora larger than memory work; -n processes tokenize. Segments
run on across documents (with --documents apart, each document is closed by [SEP] and attends only
within itself); each becomes [CLS] segment [SEP] in the train, val or test shard (80/10/10
by a hash of the seed and sample index; --val-share, --test-share). The corpus is cut into units of
about --shard-tokens tokens, each packed on its own into its numbered shards:
OUTDIR/{train,val,test}_LABEL_m_SEED-NNNNN.msgpack.gz (a corpus of one unit: without -NNNNN). Run
the same command again after an interruption and it makes only the units not yet finished; --part
K/N makes part K's units. With --masking static the masks are stored in the shards (and --copies K
gives K masked train copies; --mask-rate, --whole-word-masking and --mask-replace-* say how); by
default the trainer masks each batch afresh.

With --pairs nsp or sop, samples are sentence pairs [CLS] A [SEP] B [SEP] with a label, built per
document (one a line) as Google BERT does (see src/corpus/sentence_pairs.py); documents, not samples,
go to train, val or test.

Documents longer than 65,536 characters are cut at spaces (a one-line corpus such as text8 is read
in bounded memory); with --pairs each piece is a document.
"""
import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))
from config import SENTENCE_OBJECTIVES  # noqa: E402
from errors import UserError, exit_on_user_error  # noqa: E402
from shards import DOCUMENTS  # noqa: E402
from vocab import load_vocab  # noqa: E402
from corpus.corpus_units import document_pieces, parse_part, prepare, print_made, unit_chars_for  # noqa: E402
from corpus.input_files import BadRecords, add_input_arguments, find_inputs, read_documents  # noqa: E402
from corpus.preparation import (SPLITS, SplitWriter, add_shared_arguments, check_shared_arguments,  # noqa: E402
                                output_dir, split_summary)
from corpus.sentence_pairs import PairMaker, pair_sample  # noqa: E402
from corpus.tokenizing import Tokenizing  # noqa: E402

# ---------------------------------------------------------------------------------------------
# Packing words


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
    """Packs chunk after chunk, carrying the open segment, so chunking never changes the result.
    With documents apart, each document ends in a [SEP] that closes it (kept with its last word), so
    a segment holds whole documents and pieces of them, told apart by those [SEP]s."""

    def __init__(self, vocab, max_pieces: int, documents: str = "joined"):
        self.is_continuation = vocab.is_continuation  # a segment may not start at `##ing`
        self.unk_id, self.cls_id, self.sep_id = vocab.unk_id, vocab.cls_id, vocab.sep_id
        self.max_pieces = max_pieces
        self.apart = documents == "apart"
        self.carry_ids = np.empty(0, dtype=np.int64)
        self.carry_breaks = np.empty(0, dtype=bool)
        self.pieces = self.words_cut = self.short = self.unknown = 0

    def pack(self, encoded, final: bool = False) -> list[np.ndarray]:
        """Segments closed by this chunk's ids (whole documents; with documents apart, the ids and
        each document's count of them), each an array of word pieces."""
        ids, lengths = encoded if self.apart else (encoded, None)
        ids = ids.astype(np.int64)
        word_starts = ~self.is_continuation[ids]
        word_starts[:1] = True  # a chunk starts at the start of a document
        self.pieces += len(ids)
        self.unknown += int(np.count_nonzero(ids == self.unk_id))
        if lengths is not None:
            ends = np.cumsum(lengths[lengths > 0])
            ids, word_starts = np.insert(ids, ends, self.sep_id), np.insert(word_starts, ends, False)
        breaks, cut = cut_long_words(word_starts, self.max_pieces)
        self.words_cut += cut
        ids = np.concatenate([self.carry_ids, ids])
        breaks = np.concatenate([self.carry_breaks, breaks])
        spans, rest = pack_segments(breaks, self.max_pieces, final)
        self.carry_ids, self.carry_breaks = ids[rest:], breaks[rest:]
        self.short += sum(end - begin < self.max_pieces / 2 for begin, end in spans)
        return [ids[begin:end] for begin, end in spans]

    def add(self, writer: SplitWriter, encoded) -> None:
        writer.add(self.samples(self.pack(encoded)))

    def finish(self, writer: SplitWriter) -> None:
        nothing = np.empty(0, dtype=np.int64)
        writer.add(self.samples(self.pack((nothing, nothing) if self.apart else nothing, final=True)))

    def samples(self, segments: list[np.ndarray]) -> list[np.ndarray]:
        """[CLS] segment [SEP]; a segment that ends with its document's [SEP] (documents apart) keeps one."""
        closed = [self.apart and len(segment) and segment[-1] == self.sep_id for segment in segments]
        return [np.concatenate(([self.cls_id], segment, [] if ends else [self.sep_id]))
                for segment, ends in zip(segments, closed)]


class UnitPairs:
    """The sentence pairs of one unit's documents, each written to its document's split."""

    def __init__(self, vocab, objective: str, seq_len: int, seed: int, shares, first_document: int):
        self.vocab = vocab
        self.maker = PairMaker(objective, seq_len - 3, seed, shares=shares,  # room for [CLS] A [SEP] B [SEP]
                               first_document=first_document)

    def add(self, writer: SplitWriter, documents) -> None:
        write_pairs(writer, self.maker.add(documents), self.vocab)

    def finish(self, writer: SplitWriter) -> None:
        write_pairs(writer, self.maker.finish(), self.vocab)


def write_pairs(writer: SplitWriter, made: list, vocab) -> None:
    for code, split in enumerate(SPLITS):
        pairs = [pair for pair_code, pair in made if pair_code == code]
        writer.add_to_split(split, [pair_sample(pair, vocab.cls_id, vocab.sep_id) for pair in pairs],
                            [pair.label for pair in pairs])


def print_pair_summary(samples: np.ndarray, tokens: int, makers: list[UnitPairs], objective: str) -> None:
    documents = sum(each.maker.documents for each in makers)
    print(f"{samples.sum():,} {objective} pairs ({split_summary(samples)}), {tokens:,} tokens, "
          f"from {documents:,} documents")
    left_over = sum(each.maker.left_over_sentences for each in makers)
    lonely = sum(each.maker.lonely_documents for each in makers)
    print(f"{left_over:,} sentences without a partner (one-sentence documents, lone last sentences), "
          f"{lonely:,} documents alone in their split (no random next sentence)")


def print_segment_summary(samples: np.ndarray, tokens: int, packers: list[SegmentPacker], seq_len: int) -> None:
    pieces = sum(packer.pieces for packer in packers)
    print(f"{samples.sum():,} samples ({split_summary(samples)}), {tokens:,} tokens "
          f"({pieces:,} word pieces + [CLS]/[SEP])")
    print(f"{sum(packer.short for packer in packers):,} short samples (< {(seq_len - 2) / 2:g} pieces), "
          f"{sum(packer.words_cut for packer in packers):,} words longer than {seq_len - 2} pieces cut, "
          f"{sum(packer.unknown for packer in packers):,} [UNK] pieces (words the vocabulary cannot spell, "
          f"or longer than 100 characters)")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_input_arguments(parser, "documents (one a line in text files)")
    parser.add_argument("-v", "--vocab", required=True, help="directory holding vocab.txt, or the file")
    add_shared_arguments(parser)
    parser.add_argument("--pairs", choices=SENTENCE_OBJECTIVES, default="none",
                        help="none: pack words into segments (default); nsp or sop: sentence pairs labelled for "
                             "next-sentence or sentence-order prediction")
    parser.add_argument("--documents", choices=DOCUMENTS, default="joined",
                        help="joined: segments run on across documents (default); apart: each document closed by "
                             "[SEP], a sample packs several, and each attends only within itself")
    args = parser.parse_args(argv)
    if args.documents == "apart" and args.pairs != "none":
        raise UserError(f"--documents apart packs documents into samples; --pairs {args.pairs} makes sentence pairs "
                        f"of them: leave one out")
    return args


def unit_maker(args, vocab):
    """A new maker for each unit: segments, or sentence pairs."""
    if args.pairs == "none":
        return lambda piece: SegmentPacker(vocab, args.seq_len - 2, args.documents)
    shares = (args.val_share, args.test_share)
    return lambda piece: UnitPairs(vocab, args.pairs, args.seq_len, args.seed, shares, piece.first_document)


@exit_on_user_error
def main(argv=None):
    args = parse_args(argv)
    check_shared_arguments(args)
    parse_part(args.part)
    inputs = find_inputs(args.input, args.format)
    vocab = load_vocab(args.vocab)
    bad = BadRecords(args.skip_bad_records)
    batches = read_documents(inputs, args.text_field, bad, max(1, int(args.chunk_mb * 2**20)))
    with output_dir(args.output):  # removed again if nothing is written
        unit_chars, batches = unit_chars_for(vocab, batches, args.shard_tokens)
        kind = "sentences" if args.pairs != "none" else "documents" if args.documents == "apart" else "ids"
        with Tokenizing(vocab, args.nproc, kind) as tokenizing:
            made, plan = prepare(args, vocab, inputs, document_pieces(batches, unit_chars), unit_chars,
                                 tokenizing.map, unit_maker(args, vocab), "prepare_mlm_dataset.py")
        if not plan.decided:  # not one document
            raise UserError(f"{', '.join(map(str, inputs))}: no tokens in the input")
    print_made(made, plan, bad)
    if args.pairs != "none":
        print_pair_summary(made.samples, made.tokens, made.makers, args.pairs)
    else:
        print_segment_summary(made.samples, made.tokens, made.makers, args.seq_len)


if __name__ == "__main__":
    main()
