"""On-disk formats of prepared data in one place: MLM shards, token-id streams, the original project's
shards; their writers (atomic, header first) and readers (clear errors), the data split and static masking.
"""
import glob
import gzip
import os
import shutil
import secrets
import zlib
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, NamedTuple

import msgpack
import numpy as np

from config import SENTENCE_OBJECTIVES
from errors import UserError

SHARD_FORMAT = "bert-mlm-shard"
TOKEN_STREAM_FORMAT = "bert-token-ids"
LEGACY_FORMAT = "legacy"
FORMAT_VERSION = 1
SAMPLES_PER_BLOCK = 4096
TOKENS_PER_STREAM_BLOCK = 1 << 20
SPLITS = ("train", "val", "test")
SPLIT_SHARES = (0.8, 0.1, 0.1)
DTYPES = {"uint16": np.uint16, "int32": np.int32}
GZIP_MAGIC = b"\x1f\x8b"
COMPRESS_LEVEL = 6  # zlib's default: level 9 is much slower for a few percent
# Header fields saying how a static shard was masked (None when unknown or unmasked).
MASKING_FIELDS = ("mask_rate", "whole_word_masking", "mask_replace_mask", "mask_replace_random")


class ShardError(UserError):
    """A shard or token stream that is truncated, corrupt, or made for another config."""


def dtype_name(dtype) -> str:
    return np.dtype(dtype).name


# ---------------------------------------------------------------------------------------------
# Writing: header last, file complete or absent


class _HeaderFirstFile:
    """A gzip msgpack file whose header is written last but stored first, renamed into place whole.

    Objects go to a temporary gzip file next to the target; finish(header) writes a second
    temporary file holding a gzip member with the header followed by the first file's bytes, then
    renames it onto the target. abort() removes both, so an interrupted run leaves nothing.
    """

    def __init__(self, path):
        self.path = Path(path)
        self.body_path = self._temp_path(".body")
        self.body_raw = self.body_path.open("wb")
        # mtime=0 and no file name in the gzip header: equal inputs give byte-identical files.
        self.body = gzip.GzipFile(filename="", fileobj=self.body_raw, mode="wb",
                                  compresslevel=COMPRESS_LEVEL, mtime=0)
        self.packer = msgpack.Packer(use_bin_type=True)

    def _temp_path(self, suffix: str) -> Path:
        """A new hidden file next to the target (so `*` globs skip it), with the umask's permissions."""
        while True:
            path = self.path.parent / f".{self.path.name}.{secrets.token_hex(6)}{suffix}.tmp"
            try:
                os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
                return path
            except FileExistsError:
                continue

    def write(self, obj) -> None:
        self.body.write(self.packer.pack(obj))

    def finish(self, header: dict) -> None:
        self.body.close()
        self.body_raw.close()
        final_temp = self._temp_path("")
        try:
            with final_temp.open("wb") as out:
                with gzip.GzipFile(filename="", fileobj=out, mode="wb", compresslevel=COMPRESS_LEVEL, mtime=0) as head:
                    head.write(self.packer.pack(header))
                with self.body_path.open("rb") as body:
                    shutil.copyfileobj(body, out, 1 << 20)
            os.replace(final_temp, self.path)
        finally:
            final_temp.unlink(missing_ok=True)
            self.body_path.unlink(missing_ok=True)

    def abort(self) -> None:
        self.body.close()
        self.body_raw.close()
        self.body_path.unlink(missing_ok=True)


class TokenStreamWriter:
    """Write a token-id stream (tokenize_text.py's output) as a context manager.

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
        self.file: _HeaderFirstFile | None = None

    def __enter__(self):
        self.file = _HeaderFirstFile(self.path)
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
        if kind is None:
            self._flush()
            self.file.finish(self.header())
        else:
            self.file.abort()
        return False


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


def assign_splits(seed: int, sample_indices: np.ndarray) -> np.ndarray:
    """Split code per sample (0 train, 1 val, 2 test; 80/10/10) from a hash of (seed, index)."""
    base = np.uint64(combine_seed(seed))
    with np.errstate(over="ignore"):
        hashed = splitmix64(np.asarray(sample_indices, dtype=np.uint64) ^ base)
    uniform = (hashed >> np.uint64(11)).astype(np.float64) / float(1 << 53)
    return np.searchsorted(np.cumsum(SPLIT_SHARES)[:-1], uniform, side="right").astype(np.uint8)


def shard_name(split: str, label: str, seq_len: int, seed: int, copy: int | None = None) -> str:
    suffix = "" if copy is None else f"_{copy}"
    return f"{split}_{label}_{seq_len}_{seed}{suffix}.msgpack.gz"


class MaskedSample(NamedTuple):
    inputs: np.ndarray  # ids with [MASK]/random/kept replacements
    positions: np.ndarray  # masked positions within the sample, ascending
    labels: np.ndarray  # the original ids at those positions


class StaticMasker:
    """Masks whole blocks with masking.mask_tokens, seeded by (seed, copy, split, block index)."""

    def __init__(self, vocab, rule, seed: int, split: str, copy: int | None = None):
        import torch  # here, not at the top: readers and tokenize_text.py need no torch
        self.vocab, self.rule = vocab, rule  # rule: a masking.MaskingRule
        self.seed, self.split_code, self.copy = seed, SPLITS.index(split), copy
        self.special_ids = torch.tensor(vocab.special_ids)
        self.is_continuation = torch.from_numpy(vocab.is_continuation)

    def __call__(self, samples: list[np.ndarray], block_index: int) -> list[MaskedSample]:
        import torch
        from masking import IGNORE_INDEX, mask_tokens
        lengths = np.array([len(sample) for sample in samples])
        # Pad to the block's longest sample with [PAD], which mask_tokens never picks.
        padded = np.full((len(samples), lengths.max()), self.vocab.pad_id, dtype=np.int64)
        padded[np.arange(lengths.max()) < lengths[:, None]] = np.concatenate(samples)
        generator = torch.Generator().manual_seed(
            combine_seed(self.seed, -1 if self.copy is None else self.copy, self.split_code, block_index))
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
# Shard writer


class ShardWriter:
    """Write one MLM shard as a context manager: finalised on clean exit, removed on error.

    add() takes 1-D id arrays ([CLS] ... [SEP]) that the masker (if any) masks per block of
    4,096 samples. Shards of sentence pairs ([CLS] A [SEP] B [SEP], pairs nsp or sop) take a
    pair label per sample too.
    """

    def __init__(self, path, vocab, *, seq_len: int, split: str, seed: int, masker: StaticMasker | None = None,
                 copy: int | None = None, source_files=(), created_by: str = "", pairs: str = "none"):
        self.path = Path(path)
        self.vocab, self.dtype, self.masker, self.pairs = vocab, vocab.id_dtype, masker, pairs
        self.header_fields = {
            "seq_len": seq_len, "vocab_size": vocab.size, "vocab_checksum": vocab.checksum,
            "split": split, "seed": seed, "copy": copy, "source_files": [str(file) for file in source_files],
            "dtype": dtype_name(self.dtype), "created_by": created_by,
            "mask_rate": masker.rule.mask_rate if masker else None,
            "whole_word_masking": masker.rule.whole_word if masker else None,
            "mask_replace_mask": masker.rule.replace_with_mask if masker else None,
            "mask_replace_random": masker.rule.replace_with_random if masker else None}
        self.samples = self.tokens = self.blocks = 0
        self.pending: list = []
        self.pending_pair_labels: list[int] = []
        self.file: _HeaderFirstFile | None = None

    def __enter__(self):
        self.file = _HeaderFirstFile(self.path)
        return self

    def add(self, samples, pair_labels=None) -> None:
        labelled = pair_labels is not None
        if labelled != (self.pairs != "none") or (labelled and len(pair_labels) != len(samples)):
            raise ValueError(f"a shard with pairs {self.pairs} takes "
                             f"{'one pair label per sample' if self.pairs != 'none' else 'no pair labels'}")
        for index, sample in enumerate(samples):
            self._check_sample(sample)
            self.pending.append(sample)
            if pair_labels is not None:
                self.pending_pair_labels.append(pair_labels[index])
            if len(self.pending) == SAMPLES_PER_BLOCK:
                self._write_block()

    def _check_sample(self, sample) -> None:
        length = len(sample)
        if not 0 < length <= self.header_fields["seq_len"]:
            raise ValueError(f"sample of {length} tokens, expected 1..{self.header_fields['seq_len']}")

    @property
    def masking(self) -> str:
        return "static" if self.masker else "none"

    def _write_block(self) -> None:
        samples, self.pending = self.pending, []
        if self.masker:
            samples = self.masker(samples, self.blocks)
        inputs = [sample.inputs for sample in samples] if self.masking == "static" else samples
        block = {"lengths": np.array([len(ids) for ids in inputs], dtype=np.uint16).tobytes(),
                 "tokens": np.concatenate(inputs).astype(self.dtype).tobytes()}
        if self.masking == "static":
            block["mask_counts"] = np.array([len(s.positions) for s in samples], dtype=np.uint16).tobytes()
            block["mask_positions"] = np.concatenate([s.positions for s in samples]).astype(np.uint16).tobytes()
            block["mask_labels"] = np.concatenate([s.labels for s in samples]).astype(self.dtype).tobytes()
        if self.pairs != "none":
            block["pair_labels"] = np.array(self.pending_pair_labels, dtype=np.uint8).tobytes()
            self.pending_pair_labels = []
        self.file.write(block)
        self.samples += len(samples)
        self.tokens += sum(len(ids) for ids in inputs)
        self.blocks += 1

    def header(self) -> dict:
        fields = self.header_fields
        static = self.masking == "static"
        return {"format": SHARD_FORMAT, "version": FORMAT_VERSION, "seq_len": fields["seq_len"],
                "vocab_size": fields["vocab_size"], "vocab_checksum": fields["vocab_checksum"],
                "samples": self.samples, "tokens": self.tokens, "masking": self.masking,
                **{field: fields[field] if static else None for field in MASKING_FIELDS},
                "split": fields["split"], "seed": fields["seed"], "copy": fields["copy"],
                "source_files": fields["source_files"], "dtype": fields["dtype"], "created_by": fields["created_by"],
                "pairs": self.pairs}

    def __exit__(self, kind, error, traceback):
        if kind is None:
            if self.pending:
                self._write_block()
            self.file.finish(self.header())
        else:
            self.file.abort()
        return False


class SplitWriter:
    """The shards of one prepared data set: each sample goes to train, val or test by
    assign_splits on its running index; with static masking, train may get several copies.

    Files: OUTDIR/{split}_{label}_{seq_len}_{seed}.msgpack.gz, train copies ending _{copy}.
    """

    def __init__(self, out_dir, label: str, vocab, *, seq_len: int, seed: int, masking: str = "none",
                 copies: int = 1, rule=None, source_files=(), created_by: str = "", pairs: str = "none"):
        self.out_dir, self.label, self.vocab = Path(out_dir), label, vocab
        self.seq_len, self.seed, self.masking, self.copies = seq_len, seed, masking, copies
        if masking == "static" and rule is None:
            from masking import MaskingRule
            rule = MaskingRule()
        self.rule = rule  # a masking.MaskingRule, used with static masking
        self.common = {"source_files": source_files, "created_by": created_by, "pairs": pairs}
        self.samples = np.zeros(len(SPLITS), dtype=np.int64)
        self.tokens = 0
        self.writers: dict[str, list[ShardWriter]] = {}
        self.stack = ExitStack()

    @property
    def paths(self) -> list[Path]:
        return [writer.path for writers in self.writers.values() for writer in writers]

    def _writer(self, split: str, copy: int | None) -> ShardWriter:
        masker = StaticMasker(self.vocab, self.rule, self.seed, split, copy) if self.masking == "static" else None
        path = self.out_dir / shard_name(split, self.label, self.seq_len, self.seed, copy)
        return ShardWriter(path, self.vocab, seq_len=self.seq_len, split=split, seed=self.seed, masker=masker,
                           copy=copy, **self.common)

    def __enter__(self):
        with ExitStack() as stack:
            for split in SPLITS:
                copies = range(self.copies) if split == "train" and self.copies > 1 else [None]
                self.writers[split] = [stack.enter_context(self._writer(split, copy)) for copy in copies]
            self.stack = stack.pop_all()
        return self

    def add(self, samples) -> None:
        """Append samples (1-D id arrays, [CLS] ... [SEP]) in their data set order."""
        start = int(self.samples.sum())
        codes = assign_splits(self.seed, np.arange(start, start + len(samples)))
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
        return self.stack.__exit__(kind, error, traceback)


# ---------------------------------------------------------------------------------------------
# Reading


@dataclass
class Shard:
    """A loaded shard: sample i is tokens[offsets[i]:offsets[i+1]] ([CLS] ... [SEP]).

    For static shards tokens hold the masked inputs; sample i's masked positions (within the
    sample) and original ids are mask_positions/mask_labels[mask_offsets[i]:mask_offsets[i+1]].
    Shards of sentence pairs ([CLS] A [SEP] B [SEP]) hold a label per sample in pair_labels.
    """
    path: Path
    header: dict
    tokens: np.ndarray
    offsets: np.ndarray
    mask_offsets: np.ndarray | None = None
    mask_positions: np.ndarray | None = None
    mask_labels: np.ndarray | None = None
    pair_labels: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.offsets) - 1

    @property
    def masking(self) -> str:
        return self.header["masking"]

    @property
    def pairs(self) -> str:
        return self.header.get("pairs", "none")  # shards written before pairs existed hold none

    @property
    def seq_len(self) -> int:
        return self.header["seq_len"]

    def sample(self, index: int) -> np.ndarray:
        return self.tokens[self.offsets[index]:self.offsets[index + 1]]

    def unmasked_tokens(self) -> np.ndarray:
        """The original ids of all samples (a copy with the mask labels put back)."""
        tokens = self.tokens.copy()
        if self.masking == "static":
            tokens[self.mask_flat_positions()] = self.mask_labels
        return tokens

    def mask_flat_positions(self) -> np.ndarray:
        """Positions of the masked tokens in the flat tokens array."""
        sample_of_mask = np.repeat(np.arange(len(self)), np.diff(self.mask_offsets))
        return self.offsets[sample_of_mask] + self.mask_positions

    def resident_bytes(self) -> int:
        arrays = (self.tokens, self.offsets, self.mask_offsets, self.mask_positions, self.mask_labels,
                  self.pair_labels)
        return sum(array.nbytes for array in arrays if array is not None)


CORRUPT_ERRORS = (EOFError, zlib.error, gzip.BadGzipFile, msgpack.UnpackException, msgpack.ExtraData,
                  msgpack.FormatError, msgpack.StackError, KeyError, TypeError, ValueError, IndexError)


def corrupt(path, detail) -> ShardError:
    return ShardError(f"{path}: truncated or corrupt file ({detail})")


def _open_stream(path):
    """Binary reader over the file's msgpack bytes, gunzipping when it starts with gzip magic."""
    try:
        with open(path, "rb") as probe:
            gzipped = probe.read(2) == GZIP_MAGIC
        return gzip.open(path, "rb") if gzipped else open(path, "rb")
    except OSError as error:
        raise ShardError(f"{path}: cannot read ({error.strerror or error})") from None


def _first_byte(path) -> bytes:
    with _open_stream(path) as stream:
        try:
            return stream.read(1)
        except CORRUPT_ERRORS as error:
            raise corrupt(path, f"{error.__class__.__name__}: {error}") from None


def _is_map_start(byte: bytes) -> bool:
    return bool(byte) and (0x80 <= byte[0] <= 0x8F or byte[0] in (0xDE, 0xDF))


def _is_array_start(byte: bytes) -> bool:
    return bool(byte) and (0x90 <= byte[0] <= 0x9F or byte[0] in (0xDC, 0xDD))


def _unpacker(stream) -> msgpack.Unpacker:
    return msgpack.Unpacker(stream, raw=False, max_buffer_size=256 << 20, read_size=1 << 20)


def read_shard(path, expect: dict | None = None) -> Shard:
    """Load a shard (ours or the original project's), checking it against `expect`.

    expect may hold seq_len, vocab_size and vocab_checksum; a mismatch raises ShardError naming
    the field and both values. Truncated or corrupt files raise ShardError too.
    """
    path = Path(path)
    first = _first_byte(path)
    if _is_map_start(first):
        shard = _guarded(path, _read_blocks, path)
    elif _is_array_start(first):
        shard = _guarded(path, _read_legacy, path)
    else:
        raise corrupt(path, "not a shard: it starts with neither a header nor a sample list")
    check_header(path, shard.header, expect or {}, max_id=_max_id(shard))
    return shard


def _guarded(path, reader, *args):
    try:
        return reader(*args)
    except ShardError:
        raise
    except CORRUPT_ERRORS as error:
        raise corrupt(path, f"{error.__class__.__name__}: {error}") from None


def _max_id(shard: Shard) -> int:
    """Largest id, only computed for legacy shards (ours carry a vocabulary checksum)."""
    if shard.header["format"] != LEGACY_FORMAT or not len(shard.tokens):
        return -1
    labels_max = int(shard.mask_labels.max()) if len(shard.mask_labels) else -1
    return max(int(shard.tokens.max()), labels_max)


def check_header(path, header: dict, expect: dict, max_id: int = -1) -> None:
    """Raise ShardError when the header disagrees with what the config expects."""
    legacy = header["format"] == LEGACY_FORMAT
    for field in ("seq_len", "vocab_size", "vocab_checksum"):
        if expect.get(field) is None or header.get(field) is None:
            continue
        if legacy and field == "seq_len":
            if header[field] > expect[field]:
                raise ShardError(f"{path}: longest sample has {header[field]} tokens in the shard "
                                 f"but seq_len is {expect[field]} in the config")
        elif header[field] != expect[field]:
            raise ShardError(f"{path}: {field} is {header[field]} in the shard but {expect[field]} in the config")
    if legacy and expect.get("vocab_size") is not None and max_id >= expect["vocab_size"]:
        raise ShardError(f"{path}: token id {max_id} in the shard but vocab_size is {expect['vocab_size']} "
                         f"in the config")


def _validate_shard_header(path, header) -> None:
    if not isinstance(header, dict) or header.get("format") != SHARD_FORMAT:
        raise ShardError(f"{path}: not a {SHARD_FORMAT} file (format {header.get('format')!r})"
                         if isinstance(header, dict) else f"{path}: not a {SHARD_FORMAT} file")
    if header.get("version") != FORMAT_VERSION:
        raise ShardError(f"{path}: shard format version {header.get('version')} but this program reads "
                         f"version {FORMAT_VERSION}")
    if header.get("dtype") not in DTYPES or header.get("masking") not in ("static", "none"):
        raise corrupt(path, f"dtype {header.get('dtype')!r}, masking {header.get('masking')!r}")
    if header.get("pairs", "none") not in SENTENCE_OBJECTIVES:
        raise corrupt(path, f"pairs {header.get('pairs')!r}")
    for field in ("samples", "tokens", "seq_len"):
        if not isinstance(header.get(field), int) or header[field] < 0:
            raise corrupt(path, f"header field {field} is {header.get(field)!r}")


class _ArrayFiller:
    """A preallocated array filled block by block, so peak memory stays near the final size."""

    def __init__(self, path, name: str, size: int, dtype):
        self.path, self.name = path, name
        self.array = np.empty(size, dtype=dtype)
        self.filled = 0

    def append(self, raw: bytes) -> np.ndarray:
        values = np.frombuffer(raw, dtype=self.array.dtype)
        if self.filled + len(values) > len(self.array):
            raise corrupt(self.path, f"more {self.name} than the header counts")
        self.array[self.filled:self.filled + len(values)] = values
        self.filled += len(values)
        return values

    def finish(self) -> np.ndarray:
        if self.filled != len(self.array):
            raise corrupt(self.path, f"{self.filled} {self.name} but the header counts {len(self.array)}")
        return self.array


def _read_blocks(path: Path) -> Shard:
    with _open_stream(path) as stream:
        unpacker = _unpacker(stream)
        header = next(unpacker, None)
        _validate_shard_header(path, header)
        dtype = DTYPES[header["dtype"]]
        static = header["masking"] == "static"
        paired = header.get("pairs", "none") != "none"
        lengths = _ArrayFiller(path, "samples", header["samples"], np.uint16)
        tokens = _ArrayFiller(path, "tokens", header["tokens"], dtype)
        pair_labels = _ArrayFiller(path, "pair labels", header["samples"] if paired else 0, np.uint8)
        counts, positions, labels = [], [], []  # masks are ~15% of tokens: lists are cheap enough
        for block in unpacker:
            block_lengths = lengths.append(block["lengths"])
            block_tokens = tokens.append(block["tokens"])
            if int(block_lengths.sum(dtype=np.int64)) != len(block_tokens):
                raise corrupt(path, "block lengths do not add up to its tokens")
            if paired and len(pair_labels.append(block["pair_labels"])) != len(block_lengths):
                raise corrupt(path, "a block has not one pair label per sample")
            if static:
                counts.append(np.frombuffer(block["mask_counts"], dtype=np.uint16))
                positions.append(np.frombuffer(block["mask_positions"], dtype=np.uint16))
                labels.append(np.frombuffer(block["mask_labels"], dtype=dtype))
        offsets = _offsets(lengths.finish())
        tokens = tokens.finish()
    if len(offsets) > 1 and np.diff(offsets).max() > header["seq_len"]:
        raise corrupt(path, f"a sample is longer than seq_len {header['seq_len']}")
    shard = _static_shard(path, header, tokens, offsets, counts, positions, labels) if static \
        else Shard(path, header, tokens, offsets)
    if paired:
        shard.pair_labels = _checked_pair_labels(path, pair_labels.finish())
    return shard


def _checked_pair_labels(path, pair_labels: np.ndarray) -> np.ndarray:
    if len(pair_labels) and pair_labels.max() > 1:
        raise corrupt(path, f"pair label {pair_labels.max()}, expected 0 or 1")
    return pair_labels


def _offsets(lengths: np.ndarray) -> np.ndarray:
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    return offsets


def _concatenate(arrays: list[np.ndarray], dtype) -> np.ndarray:
    return np.concatenate(arrays) if arrays else np.empty(0, dtype=dtype)


def _static_shard(path, header, tokens, offsets, counts, positions, labels) -> Shard:
    counts = _concatenate(counts, np.uint16)
    positions = _concatenate(positions, np.uint16)
    labels = _concatenate(labels, tokens.dtype)
    mask_offsets = _offsets(counts)
    if len(counts) != len(offsets) - 1 or mask_offsets[-1] != len(positions) or len(positions) != len(labels):
        raise corrupt(path, "mask counts do not match the samples and mask arrays")
    shard = Shard(path, header, tokens, offsets, mask_offsets, positions, labels)
    sample_lengths = np.diff(offsets)
    if len(positions) and (positions >= np.repeat(sample_lengths, counts)).any():
        raise corrupt(path, "a masked position lies outside its sample")
    return shard


def _read_legacy(path: Path) -> Shard:
    """The original project's shard: one msgpack array alternating id lists and label lists
    (label 0 where not masked, else the original id); read one sample at a time."""
    with _open_stream(path) as stream:
        unpacker = _unpacker(stream)
        items = unpacker.read_array_header()
        if items % 2:
            raise corrupt(path, f"odd number of lists ({items}): expected id and label lists in pairs")
        inputs, labels = [], []
        chunks: list[tuple] = []
        for _ in range(items // 2):
            inputs.append(unpacker.unpack())
            labels.append(unpacker.unpack())
            if len(inputs) == SAMPLES_PER_BLOCK:
                chunks.append(_legacy_chunk(inputs, labels))
                inputs, labels = [], []
        if inputs:
            chunks.append(_legacy_chunk(inputs, labels))
    lengths = _concatenate([chunk[0] for chunk in chunks], np.int64)
    tokens = _concatenate([chunk[1] for chunk in chunks], np.int64)
    label_ids = _concatenate([chunk[2] for chunk in chunks], np.int64)
    if (tokens < 0).any() or (label_ids < 0).any():
        raise corrupt(path, "negative token id")
    dtype = np.uint16 if max(tokens.max(initial=0), label_ids.max(initial=0)) < 65536 else np.int32
    masked = label_ids != 0
    offsets = _offsets(lengths)
    sample_of_token = np.repeat(np.arange(len(lengths)), lengths)
    header = {"format": LEGACY_FORMAT, "version": 0, "seq_len": int(lengths.max(initial=0)), "vocab_size": None,
              "vocab_checksum": None, "samples": len(lengths), "tokens": len(tokens), "masking": "static",
              "mask_rate": None, "split": None, "seed": None, "copy": None, "source_files": [],
              "dtype": dtype_name(dtype), "created_by": "original project"}
    return Shard(path, header, tokens.astype(dtype), offsets,
                 mask_offsets=_offsets(np.bincount(sample_of_token[masked], minlength=len(lengths))),
                 mask_positions=(np.flatnonzero(masked) - offsets[sample_of_token[masked]]).astype(np.uint16),
                 mask_labels=label_ids[masked].astype(dtype))


def _legacy_chunk(inputs: list, labels: list) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    lengths = np.array([len(ids) for ids in inputs], dtype=np.int64)
    if any(len(ids) != len(label) for ids, label in zip(inputs, labels)):
        raise ValueError("an id list and its label list differ in length")
    flat_inputs = np.fromiter((i for ids in inputs for i in ids), dtype=np.int64, count=int(lengths.sum()))
    flat_labels = np.fromiter((i for label in labels for i in label), dtype=np.int64, count=int(lengths.sum()))
    return lengths, flat_inputs, flat_labels


def read_token_stream(path) -> tuple[dict, Iterator[np.ndarray]]:
    """Header and an iterator over the id blocks of a token stream (tokenize_text.py's output)."""
    path = Path(path)
    stream = _open_stream(path)
    try:
        unpacker = _unpacker(stream)
        header = _guarded(path, next, unpacker, None)
        if not isinstance(header, dict) or header.get("format") != TOKEN_STREAM_FORMAT:
            raise ShardError(f"{path}: not a token-id stream ({TOKEN_STREAM_FORMAT}); was it written by "
                             f"tokenize_text.py?")
        if header.get("dtype") not in DTYPES or not isinstance(header.get("tokens"), int):
            raise corrupt(path, f"header dtype {header.get('dtype')!r}, tokens {header.get('tokens')!r}")
    except BaseException:
        stream.close()
        raise
    return header, _token_blocks(path, stream, unpacker, header)


def _token_blocks(path, stream, unpacker, header) -> Iterator[np.ndarray]:
    dtype = DTYPES[header["dtype"]]
    seen = 0
    with stream:
        while True:
            block = _guarded(path, next, unpacker, None)
            if block is None:
                break
            ids = _guarded(path, np.frombuffer, block, dtype)
            seen += len(ids)
            if seen > header["tokens"]:
                raise corrupt(path, f"more tokens than the header's {header['tokens']}")
            yield ids
    if seen != header["tokens"]:
        raise corrupt(path, f"{seen} tokens but the header counts {header['tokens']}")


def find_shards(directory, pattern: str) -> list[Path]:
    """Shard files in directory matching a glob; `x_*.msgpack` also matches `x_*.msgpack.gz`."""
    base = glob.escape(str(directory))
    patterns = [pattern] if pattern.endswith(".gz") else [pattern, pattern + ".gz"]
    matches = {Path(match) for each in patterns for match in glob.glob(os.path.join(base, each))}
    files = sorted(match for match in matches if match.is_file())
    if not files:
        raise UserError(f"{directory}: no shard file matches {pattern}")
    return files
