"""Turning samples into a prepared data set: the train/val/test split, static masking, the shards of
one unit of the corpus (SplitWriter), and what the two shard preparers share (arguments, checks,
output). corpus_units.py cuts the corpus into those units and makes them.

torch (masking.py) is imported only for static masking: the preparers start without its ~190 MB.
"""
from __future__ import annotations

import argparse
import re
import tempfile
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from atomic import remove_stale_temps
from config import DEFAULTS, RULES, validate
from cores import available_cores
from errors import UserError
from shards import MaskedSample, ShardWriter
from corpus.input_files import DEFAULT_CHUNK_MB

if TYPE_CHECKING:
    from masking import MaskingRule

SPLITS = ("train", "val", "test")
DEFAULT_SHARES = (0.1, 0.1)  # of val and test; train has the rest
UNIT_BITS = 40  # a sample's hash key: its unit above these bits, its index in the unit below


# ---------------------------------------------------------------------------------------------
# Data split and static masking: pure functions of (seed, sample index), not of input chunking


def splitmix64(values: np.ndarray) -> np.ndarray:
    """A stateless 64-bit hash (splitmix64's finaliser), vectorised over uint64 values."""
    with np.errstate(over="ignore"):
        z = values.astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def combine_seed(*parts: int) -> int:
    """One 63-bit seed from several integers, each mixed in through splitmix64."""
    state = np.array([0], dtype=np.uint64)
    for part in parts:
        state = splitmix64(state ^ np.array([part & 0xFFFFFFFFFFFFFFFF], dtype=np.uint64))
    return int(state[0]) & 0x7FFFFFFFFFFFFFFF


def assign_splits(seed: int, sample_indices: np.ndarray, shares: tuple[float, float] = DEFAULT_SHARES) -> np.ndarray:
    """Split code per sample (0 train, 1 val, 2 test) from a hash of (seed, index); shares: val's and
    test's (80/10/10 by default)."""
    base = np.uint64(combine_seed(seed))
    with np.errstate(over="ignore"):
        hashed = splitmix64(np.asarray(sample_indices, dtype=np.uint64) ^ base)
    uniform = (hashed >> np.uint64(11)).astype(np.float64) / float(1 << 53)
    val_share, test_share = shares
    bounds = np.array([1 - val_share - test_share, 1 - test_share])
    return np.searchsorted(bounds, uniform, side="right").astype(np.uint8)


def shard_name(split: str, label: str, seq_len: int, seed: int, copy: int | None = None,
               shard: int | None = None) -> str:
    """SPLIT_LABEL_SEQLEN_SEED[-SHARD][_COPY].msgpack.gz: a corpus of one unit has no shard number."""
    number = "" if shard is None else f"-{shard:05d}"
    suffix = "" if copy is None else f"_{copy}"
    return f"{split}_{label}_{seq_len}_{seed}{number}{suffix}.msgpack.gz"


class StaticMasker:
    """Masks whole blocks with masking.mask_tokens, seeded by (seed, copy, split, unit, block index)."""

    def __init__(self, vocab, rule: MaskingRule | None, seed: int, split: str, copy: int | None = None,
                 unit: int = 0):
        import torch
        from masking import MaskingRule
        self.vocab, self.rule = vocab, rule or MaskingRule()
        self.seed, self.split_code, self.copy, self.unit = seed, SPLITS.index(split), copy, unit
        self.special_ids = torch.tensor(vocab.special_ids)
        self.is_continuation = torch.from_numpy(vocab.is_continuation)

    def __call__(self, samples: list[np.ndarray], block_index: int) -> list[MaskedSample]:
        import torch
        from masking import mask_tokens
        from architecture import IGNORE_INDEX
        lengths = np.array([len(sample) for sample in samples])
        # Pad to the block's longest sample with [PAD], which mask_tokens never picks.
        padded = np.full((len(samples), lengths.max()), self.vocab.pad_id, dtype=np.int64)
        padded[np.arange(lengths.max()) < lengths[:, None]] = np.concatenate(samples)
        generator = torch.Generator().manual_seed(
            combine_seed(self.seed, -1 if self.copy is None else self.copy, self.split_code, self.unit, block_index))
        inputs, positions, labels = mask_tokens(torch.from_numpy(padded), self.special_ids, self.vocab.mask_id,
                                                self.vocab.size, self.rule, generator, self.is_continuation)
        # Store each sample's masked positions in ascending order.
        used = labels != IGNORE_INDEX
        order = torch.where(used, positions, padded.shape[1]).argsort(dim=1)
        positions, labels = positions.gather(1, order).numpy(), labels.gather(1, order).numpy()
        inputs, counts = inputs.numpy(), used.sum(1).numpy()
        return [MaskedSample(inputs[i, :lengths[i]], positions[i, :counts[i]], labels[i, :counts[i]])
                for i in range(len(samples))]


# ---------------------------------------------------------------------------------------------
# The shards of one data set


class SplitWriter:
    """The shards of one unit of a prepared data set: each sample goes to train, val or test by
    assign_splits on its key (the unit, its index in the unit); with static masking, train may get
    several copies. A split whose share is 0 gets no file.

    Files: OUTDIR/{split}_{label}_{seq_len}_{seed}-{unit:05d}.msgpack.gz, train copies ending
    _{copy}; a corpus of one unit (close with last True on unit 0) has no unit number in its names.
    """

    def __init__(self, out_dir, label: str, vocab, *, seq_len: int, seed: int, masking: str = "none",
                 copies: int = 1, rule: MaskingRule | None = None, source_files=(), created_by: str = "",
                 pairs: str = "none", documents: str = "joined", shares: tuple[float, float] = DEFAULT_SHARES,
                 unit: int = 0, preparation: str | None = None):
        self.out_dir, self.label, self.vocab = Path(out_dir), label, vocab
        self.seq_len, self.seed, self.masking, self.copies = seq_len, seed, masking, copies
        self.rule = rule  # with static masking
        self.shares, self.unit = shares, unit
        self.common = {"source_files": source_files, "created_by": created_by, "pairs": pairs,
                       "documents": documents, "shard": unit, "preparation": preparation}
        self.samples = np.zeros(len(SPLITS), dtype=np.int64)
        self.tokens = 0
        self.last = False  # set before closing: no unit follows this one
        self.writers: dict[str, list[ShardWriter]] = {split: [] for split in SPLITS}
        self.stack = ExitStack()

    @property
    def paths(self) -> list[Path]:
        return [writer.path for writers in self.writers.values() for writer in writers]

    def name(self, split: str, copy: int | None, numbered: bool) -> Path:
        return self.out_dir / shard_name(split, self.label, self.seq_len, self.seed, copy,
                                         self.unit if numbered else None)

    def expected_paths(self, numbered: bool) -> list[Path]:
        """The files of the unit, before it is written."""
        return [self.name(split, copy, numbered) for split, share in self.split_shares().items() if share > 0
                for copy in self.copies_of(split)]

    def copies_of(self, split: str) -> list[int | None]:
        return list(range(self.copies)) if split == "train" and self.copies > 1 else [None]

    def split_shares(self) -> dict[str, float]:
        val, test = self.shares
        return {"train": 1 - val - test, "val": val, "test": test}

    def _writer(self, split: str, copy: int | None) -> ShardWriter:
        masker = StaticMasker(self.vocab, self.rule, self.seed, split, copy, self.unit) \
            if self.masking == "static" else None
        return ShardWriter(self.name(split, copy, numbered=True), self.vocab, seq_len=self.seq_len, split=split,
                           seed=self.seed, masker=masker, copy=copy, **self.common)

    def __enter__(self):
        with ExitStack() as stack:
            for split, share in self.split_shares().items():
                if share > 0:
                    self.writers[split] = [stack.enter_context(self._writer(split, copy))
                                           for copy in self.copies_of(split)]
            self.stack = stack.pop_all()
        return self

    def add(self, samples) -> None:
        """Append samples (1-D id arrays, [CLS] ... [SEP]) in their data set order."""
        start = (self.unit << UNIT_BITS) + int(self.samples.sum())
        codes = assign_splits(self.seed, np.arange(start, start + len(samples), dtype=np.uint64), self.shares)
        for code, split in enumerate(SPLITS):
            chosen = [samples[i] for i in np.flatnonzero(codes == code)]
            for writer in self.writers[split]:
                writer.add(chosen)
            self.samples[code] += len(chosen)
        self.tokens += sum(len(sample) for sample in samples)

    def add_to_split(self, split: str, samples, pair_labels=None) -> None:
        """Append samples to one split: sentence pairs are split by document, not by sample."""
        for writer in self.writers[split]:
            writer.add(samples, pair_labels)
        self.samples[SPLITS.index(split)] += len(samples)
        self.tokens += sum(len(sample) for sample in samples)

    def __exit__(self, kind, error, traceback):
        """Name and finish every file; if anything failed, remove those already finished too: a
        unit is written whole or not at all."""
        numbered = not (self.unit == 0 and self.last)
        for split, writers in self.writers.items():
            for writer in writers:
                writer.path = self.name(split, writer.header_fields["copy"], numbered)
                writer.numbering["last_shard"] = self.last
        try:
            self.stack.__exit__(kind, error, traceback)
        except BaseException:
            self.remove_finished()
            raise
        if kind is not None:
            self.remove_finished()
        return False

    def remove_finished(self):
        for writers in self.writers.values():
            for writer in writers:
                if writer.finished:
                    writer.path.unlink(missing_ok=True)


# ---------------------------------------------------------------------------------------------
# What the two shard preparers share: options, checks (all run before any file is written), output


DEFAULT_SHARD_TOKENS = 100_000_000  # ~200 MB of uint16 ids in memory


def add_shared_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-l", "--label", required=True, help="data set name used in the shard names, e.g. imdb")
    parser.add_argument("-o", "--output", required=True, type=Path, help="directory for the shards")
    parser.add_argument("-m", "--seq-len", type=int, default=128,
                        help=f"tokens per sample including [CLS] and [SEP], {RULES['seq_len'].text} (default 128)")
    parser.add_argument("-s", "--seed", type=int, default=123, help="seed of the split and masks (default 123)")
    parser.add_argument("--masking", choices=("none", "static"), default="none",
                        help="none: the trainer masks every batch afresh (default); static: store masks in the shards")
    parser.add_argument("--copies", type=int, default=1,
                        help="with --masking static: number of differently masked train shards (default 1)")
    parser.add_argument("-n", "--nproc", type=int, default=available_cores(),
                        help="processes tokenizing the text (default: the cores this process may use); the shards "
                             "are the same bytes for any -n")
    parser.add_argument("--chunk-mb", type=float, default=DEFAULT_CHUNK_MB,
                        help=f"text read and tokenized at once, in MiB (default {DEFAULT_CHUNK_MB:g})")
    parser.add_argument("--shard-tokens", type=int, default=DEFAULT_SHARD_TOKENS,
                        help="cut the corpus into units of about this many tokens, each a numbered shard of every "
                             f"split (default {DEFAULT_SHARD_TOKENS:,}: about 200 MB per shard in memory); a corpus "
                             "of one unit keeps unnumbered names")
    parser.add_argument("--val-share", type=float, default=DEFAULT_SHARES[0],
                        help=f"share of the samples in the val split (default {DEFAULT_SHARES[0]})")
    parser.add_argument("--test-share", type=float, default=DEFAULT_SHARES[1],
                        help=f"share of the samples in the test split (default {DEFAULT_SHARES[1]})")
    parser.add_argument("--part", default="1/1",
                        help="K/N: make only the units of part K of N (unit numbers equal to K-1 modulo N), so that "
                             "N machines together write the files of one (default 1/1)")
    for name, (kind, meaning) in STATIC_MASKING_FLAGS.items():
        flag = "--" + name.replace("_", "-")
        if kind is bool:
            parser.add_argument(flag, action="store_const", const=True, help=f"with --masking static: {meaning}")
        else:
            parser.add_argument(flag, type=kind, help=f"with --masking static: {meaning}")


# The static-masking flags: masking.MaskingRule's fields, which are the config keys that set them.
STATIC_MASKING_FLAGS = {
    "mask_rate": (float, "share of the tokens picked for prediction (default 0.15)"),
    "whole_word_masking": (bool, "pick whole words, a piece and the ## pieces after it"),
    "mask_replace_mask": (float, "share of the picked tokens shown as [MASK] (default 0.8)"),
    "mask_replace_random": (float, "share shown as a random token, the rest unchanged (default 0.1)"),
}


def check_shared_arguments(args) -> None:
    if not re.fullmatch(r"[A-Za-z0-9]+", args.label):
        raise UserError(f"--label {args.label!r}: use letters and digits only (it becomes part of file names)")
    if not RULES["seq_len"].check(args.seq_len):  # the samples must fit the config's seq-len
        raise UserError(f"-m {args.seq_len}: expected a sequence length {RULES['seq_len'].text}")
    if args.copies < 1:
        raise UserError(f"--copies {args.copies}: expected at least 1")
    if args.copies > 1 and args.masking != "static":
        raise UserError(f"--copies {args.copies} needs --masking static (unmasked copies would be identical)")
    if args.seed < 0:
        raise UserError(f"--seed {args.seed}: expected a non-negative integer")
    if args.nproc < 1:
        raise UserError(f"-n {args.nproc}: expected at least 1 process")
    if args.chunk_mb <= 0:
        raise UserError(f"--chunk-mb {args.chunk_mb:g}: expected a positive size")
    if args.shard_tokens < args.seq_len:
        raise UserError(f"--shard-tokens {args.shard_tokens}: expected at least the sequence length {args.seq_len}")
    check_shares(args.val_share, args.test_share)
    check_masking_arguments(args)


def check_shares(val_share: float, test_share: float) -> None:
    for option, share in (("--val-share", val_share), ("--test-share", test_share)):
        if not 0 <= share < 1:
            raise UserError(f"{option} {share:g}: expected a share in [0, 1)")
    if val_share + test_share >= 1:
        raise UserError(f"--val-share {val_share:g} plus --test-share {test_share:g} leave nothing to train on")


def masking_flags(args) -> dict:
    """The static-masking flags given, by the config keys they set."""
    return {name: getattr(args, name) for name in STATIC_MASKING_FLAGS if getattr(args, name) is not None}


def check_masking_arguments(args) -> None:
    """The static-masking flags: only with --masking static, checked by their config keys' rules
    (each in range, mask-replace-mask plus mask-replace-random at most 1)."""
    given = masking_flags(args)
    options = {field: "--" + field.replace("_", "-") for field in given}
    if given and args.masking != "static":
        raise UserError(f"{next(iter(options.values()))} needs --masking static (the trainer masks unmasked shards "
                        f"as its config says)")
    if "mask_rate" in given and not 0 < given["mask_rate"] < 1:  # one rate: stored masks are drawn once
        raise UserError(f"--mask-rate {given['mask_rate']:g}: expected a number in (0, 1)")
    validate(DEFAULTS | given | {"mask_rate": DEFAULTS["mask_rate"]}, options, "command line")


def masking_rule(args) -> MaskingRule | None:
    """The masking.MaskingRule of a static run: the flags given, the config's defaults for the rest."""
    if args.masking != "static":
        return None
    from masking import MaskingRule
    return MaskingRule(**masking_flags(args))


def prepare_output_dir(out_dir: Path) -> None:
    """Create the directory and prove we can write there, before any work is done; remove the
    temporary files of an earlier run that was killed."""
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=out_dir):
            pass
    except OSError as error:
        raise UserError(f"{out_dir}: cannot create or write the output directory ({error.strerror})") from None
    remove_stale_temps(out_dir)


@contextmanager
def output_dir(out_dir: Path):
    """prepare_output_dir(out_dir), whose new directories are removed again if the work in the
    block fails and leaves them empty: a failed run leaves nothing behind."""
    made = [directory for directory in (out_dir, *out_dir.parents) if not directory.exists()]
    prepare_output_dir(out_dir)
    try:
        yield
    except BaseException:
        for directory in made:  # the deepest first
            try:
                directory.rmdir()
            except OSError:  # not empty
                break
        raise


def split_summary(samples: np.ndarray) -> str:
    return ", ".join(f"{split} {count:,}" for split, count in zip(SPLITS, samples))
