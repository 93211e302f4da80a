"""The corpus cut into units, each made into its own shards (one per split) apart from the others:
runs of whole documents of about --shard-tokens tokens (or, from a token-id stream, exactly that
many ids). Where a unit ends depends on the input alone, so N worker processes, N machines each
making its --part, and a rerun after an interruption all give the files of one uninterrupted run.
"""
import ctypes
import hashlib
import itertools
import json
import re
from dataclasses import dataclass, field
from typing import Callable, Iterator, NamedTuple, Protocol

import numpy as np

from tqdm import tqdm

from errors import UserError
from packed_files import is_whole, read_header
from corpus.input_files import content_hashes
from corpus.preparation import SPLITS, SplitWriter, masking_rule
from corpus.tokenizing import document_ids

ESTIMATE_CHARS = 1 << 20  # the text whose tokens per character sizes the units
try:
    LIBC = ctypes.CDLL(None)  # the symbols of this process, the C library's among them
except (OSError, TypeError):  # not on Windows
    LIBC = None


class Part(NamedTuple):
    """Part `index` (from 0) of `count`: it makes the units whose number is index modulo count."""
    index: int
    count: int

    def holds(self, unit: int) -> bool:
        return unit % self.count == self.index


def parse_part(text: str) -> Part:
    match = re.fullmatch(r"(\d+)/(\d+)", text.strip())
    if not match or not 1 <= int(match.group(1)) <= int(match.group(2)):
        raise UserError(f"--part {text}: expected K/N, part K of N with 1 <= K <= N (e.g. 3/8)")
    return Part(int(match.group(1)) - 1, int(match.group(2)))


class Piece(NamedTuple):
    """Consecutive documents (or ids) of one unit."""
    unit: int
    payload: list | np.ndarray
    first_document: int  # of the whole input, counting from 0
    ends: bool  # the unit ends with this piece
    last: bool  # and no unit follows


def with_lookahead(items) -> Iterator[tuple[object, bool]]:
    """(item, whether it is the last one)."""
    iterator = iter(items)
    current = next(iterator, None)
    while current is not None:
        following = next(iterator, None)
        yield current, following is None
        current = following


def unit_pieces(batches, unit_size: int, size_of: Callable[[object], np.ndarray]) -> Iterator[Piece]:
    """The batches (lists of documents, or id arrays) re-cut so that a unit ends with the first
    document (or id) that brings it to unit_size; size_of gives each item's size."""
    unit = used = documents = 0
    for batch, final in with_lookahead(batch for batch in batches if len(batch)):
        cumulative = np.cumsum(size_of(batch))
        start = 0
        while start < len(batch):
            base = cumulative[start - 1] if start else 0
            end = int(np.searchsorted(cumulative, base + unit_size - used, side="left")) + 1
            full = end <= len(batch)
            end = min(end, len(batch))
            last = final and end == len(batch)
            yield Piece(unit, batch[start:end], documents, full or last, last)
            documents += end - start
            unit, used = (unit + 1, 0) if full else (unit, used + int(cumulative[end - 1] - base))
            start = end


def document_pieces(batches, unit_chars: int) -> Iterator[Piece]:
    return unit_pieces(batches, unit_chars, lambda documents: np.fromiter(map(len, documents), np.int64,
                                                                          len(documents)))


def id_pieces(blocks, unit_ids: int) -> Iterator[Piece]:
    return unit_pieces(blocks, unit_ids, lambda ids: np.ones(len(ids), dtype=np.int64))


def unit_chars_for(vocab, batches, shard_tokens: int) -> tuple[int, Iterator[list[str]]]:
    """Characters per unit, so that a unit holds about shard_tokens tokens as the first MiB of
    documents tokenizes; and the batches, those read for it put back."""
    batches = iter(batches)
    head, chars = [], 0
    for batch in batches:
        head.append(batch)
        chars += sum(map(len, batch))
        if chars >= ESTIMATE_CHARS:
            break
    sample, sample_chars = [], 0
    for document in itertools.chain.from_iterable(head):
        if sample_chars >= ESTIMATE_CHARS:
            break
        sample.append(document)
        sample_chars += len(document)
    tokens = len(document_ids(vocab, sample)[0])
    return max(1, round(shard_tokens * sample_chars / max(tokens, 1))), itertools.chain(head, batches)


def preparation_id(settings: dict) -> str:
    """What shards of one preparation share: a hash of everything that decides their bytes."""
    text = json.dumps(settings, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


# ---------------------------------------------------------------------------------------------
# Which units a run makes, and making them


class UnitPlan:
    """The units this run makes: those of its part whose shards an earlier run of the same
    preparation did not finish (each file there, its header naming the preparation and the
    unit, its size the header's). new_writer(unit) gives the unit's SplitWriter, not yet open."""

    def __init__(self, new_writer: Callable[[int], SplitWriter], preparation: str, part: Part):
        self.new_writer, self.preparation, self.part = new_writer, preparation, part
        self.decided: dict[int, bool] = {}
        self.kept = 0  # units an earlier run finished

    def makes(self, unit: int) -> bool:
        if unit not in self.decided:
            finished = self.part.holds(unit) and self.finished(unit)
            self.kept += finished
            self.decided[unit] = self.part.holds(unit) and not finished
        return self.decided[unit]

    def finished(self, unit: int) -> bool:
        writer = self.new_writer(unit)
        layouts = (True, False) if unit == 0 else (True,)  # unit 0 of a one-unit corpus: no number
        return any(all(self.whole(path, unit) for path in writer.expected_paths(numbered)) for numbered in layouts)

    def whole(self, path, unit: int) -> bool:
        header = read_header(path) if path.is_file() else None
        return (header is not None and header.get("preparation") == self.preparation
                and header.get("shard") == unit and is_whole(path, header))


class UnitMaker(Protocol):
    """Samples from one unit's encoded pieces (packed segments, fixed-length pieces, sentence pairs)."""

    def add(self, writer: SplitWriter, encoded) -> None: ...

    def finish(self, writer: SplitWriter) -> None: ...


@dataclass
class Made:
    """What a run made: samples per split, tokens, units, and each unit's maker (for its counts)."""
    samples: np.ndarray = field(default_factory=lambda: np.zeros(len(SPLITS), dtype=np.int64))
    tokens: int = 0
    paths: list = field(default_factory=list)
    makers: list = field(default_factory=list)

    def record(self, writer: SplitWriter, maker) -> None:
        self.samples += writer.samples
        self.tokens += writer.tokens
        self.paths += writer.paths
        self.makers.append(maker)

    def remove(self) -> None:
        for path in self.paths:
            path.unlink(missing_ok=True)


def release_free_memory() -> None:
    """Give the heap's free pages back to the system where the C library can (glibc's malloc_trim).
    Without it the freed arrays of each unit fragment the heap and the preparer's memory creeps up
    unit after unit: +18 MiB over 126 units of the demo corpus x 16, flat with it."""
    if hasattr(LIBC, "malloc_trim"):
        LIBC.malloc_trim(0)


def make_units(pieces: Iterator[Piece], encode: Callable, plan: UnitPlan, new_maker: Callable[[Piece], UnitMaker],
               on_piece: Callable[[Piece, object], None]) -> Made:
    """Write the units plan.makes, unit after unit; encode maps (piece, payload) pairs to (piece,
    encoded) in order. On a user error (a bad record, a full disk) every file this run wrote is
    removed: nothing half-written; an interruption keeps the finished units for the next run."""
    made, writer = Made(), None
    try:
        for piece, encoded in encode((piece, piece.payload) for piece in pieces if plan.makes(piece.unit)):
            if writer is None:
                writer, maker = plan.new_writer(piece.unit).__enter__(), new_maker(piece)
            maker.add(writer, encoded)
            on_piece(piece, encoded)
            if piece.ends:
                maker.finish(writer)
                finished, writer = writer, None
                finished.last = piece.last
                finished.__exit__(None, None, None)
                made.record(finished, maker)
                release_free_memory()
    except BaseException as error:
        if writer is not None:
            writer.__exit__(type(error), error, error.__traceback__)
        if isinstance(error, UserError):
            made.remove()
        raise
    return made


# The options that never change the files (the inputs count by their contents' hashes, the
# vocabulary by its checksum).
NOT_DECIDING = ("input", "vocab", "output", "nproc", "chunk_mb", "part", "skip_bad_records")


def prepare(args, vocab, inputs, pieces: Iterator[Piece], unit_size: int, encode: Callable,
            new_maker: Callable[[Piece], UnitMaker], created_by: str) -> tuple[Made, UnitPlan]:
    """Make the units of `pieces` that this run makes (args.part, resume) into shards in args.output,
    with a progress bar of documents, tokens and tokens/s."""
    settings = {name: value for name, value in vars(args).items() if name not in NOT_DECIDING}
    settings |= {"created_by": created_by, "vocab_checksum": vocab.checksum, "unit_size": unit_size,
                 "inputs": content_hashes(inputs)}
    preparation, rule = preparation_id(settings), masking_rule(args)

    def new_writer(unit: int) -> SplitWriter:
        return SplitWriter(args.output, args.label, vocab, seq_len=args.seq_len, seed=args.seed, masking=args.masking,
                           copies=args.copies, rule=rule, source_files=inputs, created_by=created_by,
                           pairs=getattr(args, "pairs", "none"), documents=getattr(args, "documents", "joined"),
                           shares=(args.val_share, args.test_share), unit=unit, preparation=preparation)

    plan = UnitPlan(new_writer, preparation, parse_part(args.part))
    with tqdm(unit="tok", unit_scale=True, desc=created_by.removesuffix(".py")) as bar:
        made = make_units(pieces, encode, plan, new_maker, counting_progress(bar))
    return made, plan


def counting_progress(bar) -> Callable[[Piece, object], None]:
    """on_piece for make_units: the bar counts tokens (and tokens/s), its postfix documents."""
    documents = 0

    def count(piece: Piece, encoded) -> None:
        nonlocal documents
        if isinstance(encoded, np.ndarray):
            bar.update(len(encoded))
        elif isinstance(encoded, tuple):  # ids and each document's count of them
            bar.update(len(encoded[0]))
        else:  # documents as sentences
            bar.update(sum(len(sentence) for document in encoded for sentence in document))
        if isinstance(piece.payload, list):
            documents += len(piece.payload)
            bar.set_postfix(documents=f"{documents:,}", refresh=False)
    return count


def print_made(made: Made, plan: UnitPlan, bad) -> None:
    """The files written, those an earlier run had finished, the bad records skipped."""
    for path in made.paths:
        print(f"wrote {path}")
    if plan.kept:
        print(f"kept the shards of {plan.kept:,} unit(s) an earlier run of this preparation finished")
    if not any(plan.decided.values()) and not plan.kept:
        print(f"part {plan.part.index + 1}/{plan.part.count} has no unit to make: the corpus has "
              f"{len(plan.decided)} unit(s)")
    if bad is not None and bad.count:
        print(bad.summary())
