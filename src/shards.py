"""The MLM shard format: its writer and its reader.

A shard is a gzip stream of msgpack objects:
1. a header map: `format` ("bert-mlm-shard"), `version` (1), `seq_len`, `vocab_size`,
   `vocab_checksum` (sha256 of the vocabulary's tokens, 16 hex digits), `samples`, `tokens`,
   `masking` ("static" or "none"), how static masks were made (`mask_rate`, `whole_word_masking`,
   `mask_replace_mask`, `mask_replace_random`; null otherwise), `split`, `seed`, `copy`,
   `source_files`, `dtype` ("uint16" when the vocabulary fits, else "int32"), `created_by`,
   `pairs` ("none", "nsp" or "sop"; absent means none), `documents` ("apart": a sample packs whole
   documents and pieces of them, each closed by [SEP], which attend only within themselves;
   "joined" or absent: one segment that runs on across documents), `body_bytes` (the size of what follows the
   header, so a cut copy is told from a whole one); numbered shards add `shard` (the unit),
   `last_shard` and `preparation` (a hash of what made the set);
2. blocks of up to 4,096 samples, each a map of raw little-endian arrays: `lengths` (uint16 per
   sample), `tokens` (the samples' ids, [CLS] ... [SEP], no padding), and for static shards
   `mask_counts` (uint16 per sample), `mask_positions` (uint16, within the sample) and
   `mask_labels` (the original ids there; `tokens` then hold the masked inputs); for pair shards
   `pair_labels` (uint8 per sample: NSP 1 = random B, SOP 1 = swapped). Segment ids are not
   stored: they follow from the first [SEP].
Loaded, a uint16 shard takes about 2.06 bytes a token.
"""
import glob
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, NamedTuple, Protocol

import numpy as np

from errors import UserError, full_path, script_command
from packed_files import DTYPES, HeaderFirstFile, ShardError, corrupt, dtype_name, guarded, open_stream, unpacker

SHARD_FORMAT = "bert-mlm-shard"
FORMAT_VERSION = 1
SHOWN_FILES = 3  # the shard files an error line names, the closest to the pattern first
PAIRS = ("none", "nsp", "sop")  # a shard's `pairs`: what its sentence pairs are labelled for
DOCUMENTS = ("joined", "apart")  # a shard's `documents`: whether its samples' documents see each other
SAMPLES_PER_BLOCK = 4096


class MaskedSample(NamedTuple):
    inputs: np.ndarray  # ids with [MASK]/random/kept replacements
    positions: np.ndarray  # masked positions within the sample, ascending
    labels: np.ndarray  # the original ids at those positions


class BlockMasker(Protocol):
    """What ShardWriter needs of a masker (preparation.StaticMasker)."""
    rule: Any  # the masking.MaskingRule, recorded in the header

    def __call__(self, samples: list[np.ndarray], block_index: int) -> list[MaskedSample]: ...


# ---------------------------------------------------------------------------------------------
# Writing


class ShardWriter:
    """Write one MLM shard as a context manager: finalised on clean exit, removed on error.

    add() takes 1-D id arrays ([CLS] ... [SEP]) that the masker (if any) masks per block of
    4,096 samples. Shards of sentence pairs ([CLS] A [SEP] B [SEP], pairs nsp or sop) take a
    pair label per sample too. A shard of a numbered set records its number (shard), whether it is
    the set's last (last_shard) and the preparation that made the set; the final name (path) and
    last_shard may be set until the writer closes.
    """

    def __init__(self, path, vocab, *, seq_len: int, split: str, seed: int, masker: BlockMasker | None = None,
                 copy: int | None = None, source_files=(), created_by: str = "", pairs: str = "none",
                 documents: str = "joined", shard: int | None = None, preparation: str | None = None):
        self.path = Path(path)
        self.numbering = {"shard": shard, "last_shard": None, "preparation": preparation}
        self.vocab, self.dtype, self.masker, self.pairs = vocab, vocab.id_dtype, masker, pairs
        rule = masker.rule if masker else None
        self.header_fields = {
            "seq_len": seq_len, "vocab_size": vocab.size, "vocab_checksum": vocab.checksum,
            "split": split, "seed": seed, "copy": copy, "source_files": [str(file) for file in source_files],
            "dtype": dtype_name(self.dtype), "created_by": created_by, "documents": documents}
        self.masking_fields = asdict(rule) if rule else {}  # how a static shard was masked
        self.samples = self.tokens = self.blocks = 0
        self.pending: list = []
        self.pending_pair_labels: list[int] = []
        self.file: HeaderFirstFile | None = None
        self.finished = False  # the file is in place

    def __enter__(self):
        self.file = HeaderFirstFile(self.path)
        return self

    def add(self, samples, pair_labels=None) -> None:
        labelled = pair_labels is not None
        if labelled != (self.pairs != "none") or (labelled and len(pair_labels) != len(samples)):
            raise ValueError(f"a shard with pairs {self.pairs} takes "
                             f"{'one pair label per sample' if self.pairs != 'none' else 'no pair labels'}")
        seq_len = self.header_fields["seq_len"]
        for index, sample in enumerate(samples):
            if not 0 < len(sample) <= seq_len:
                raise ValueError(f"sample of {len(sample)} tokens, expected 1..{seq_len}")
            self.pending.append(sample)
            if pair_labels is not None:
                self.pending_pair_labels.append(pair_labels[index])
            if len(self.pending) == SAMPLES_PER_BLOCK:
                self._write_block()

    @property
    def masking(self) -> str:
        return "static" if self.masker else "none"

    def _write_block(self) -> None:
        samples, self.pending = self.pending, []
        if self.masker:
            samples = self.masker(samples, self.blocks)
        inputs = [sample.inputs for sample in samples] if self.masker else samples
        block = {"lengths": np.array([len(ids) for ids in inputs], dtype=np.uint16).tobytes(),
                 "tokens": np.concatenate(inputs).astype(self.dtype).tobytes()}
        if self.masker:
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
        return {"format": SHARD_FORMAT, "version": FORMAT_VERSION, "seq_len": fields["seq_len"],
                "vocab_size": fields["vocab_size"], "vocab_checksum": fields["vocab_checksum"],
                "samples": self.samples, "tokens": self.tokens, "masking": self.masking,
                **self.masking_fields,
                "split": fields["split"], "seed": fields["seed"], "copy": fields["copy"],
                "source_files": fields["source_files"], "dtype": fields["dtype"], "created_by": fields["created_by"],
                "pairs": self.pairs, "documents": fields["documents"], **self.numbering}

    def __exit__(self, kind, error, traceback):
        try:
            if kind is None:
                if self.pending:
                    self._write_block()
                self.file.path = self.path  # the name may have been decided since the writer opened
                self.file.finish(self.header())
                self.finished = True
        finally:
            self.file.abort()  # the temporary file, whatever failed; nothing is left after finish()
        return False


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
        return self.header.get("pairs", "none")  # a header without the field: no pairs

    @property
    def documents(self) -> str:
        return self.header.get("documents", "joined")  # a header without the field: joined

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


def _first_byte(path) -> bytes:
    with open_stream(path) as stream:
        return guarded(path, stream.read, 1)


def _is_map_start(byte: bytes) -> bool:
    return bool(byte) and (0x80 <= byte[0] <= 0x8F or byte[0] in (0xDE, 0xDF))


def read_shard(path, expect: dict | None = None, rows: np.ndarray | None = None) -> Shard:
    """Load a shard, checking it against `expect`; with rows
    (ascending), only those samples, in that order, each block read and dropped in turn.

    expect may hold seq_len, vocab_size and vocab_checksum; a mismatch raises ShardError naming
    the field and both values. Truncated or corrupt files raise ShardError too.
    """
    path = Path(path)
    first = _first_byte(path)
    if _is_map_start(first):
        shard = guarded(path, _read_blocks, path) if rows is None else guarded(path, _read_rows, path, rows)
    else:
        raise corrupt(path, "not a shard: it does not start with a header")
    check_header(path, shard.header, expect or {})
    return shard


def flat_index(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """The positions of ragged rows (each from its start, of its length) one after another."""
    return np.repeat(starts - (np.cumsum(lengths) - lengths), lengths) + np.arange(int(lengths.sum()))


def select_rows(shard: Shard, rows: np.ndarray) -> Shard:
    """The shard with only the samples `rows`, in that order."""
    lengths = np.diff(shard.offsets)[rows]
    selected = Shard(shard.path, shard.header, shard.tokens[flat_index(shard.offsets[rows], lengths)],
                     offsets_of(lengths))
    if shard.mask_offsets is not None:
        counts = np.diff(shard.mask_offsets)[rows]
        masks = flat_index(shard.mask_offsets[rows], counts)
        selected.mask_offsets = offsets_of(counts)
        selected.mask_positions, selected.mask_labels = shard.mask_positions[masks], shard.mask_labels[masks]
    if shard.pair_labels is not None:
        selected.pair_labels = shard.pair_labels[rows]
    return selected


def join_shards(path, header: dict, parts: list[Shard], dtype) -> Shard:
    """Selected samples of several blocks as one shard."""
    if not parts:
        return Shard(path, header, np.empty(0, dtype=dtype), np.zeros(1, dtype=np.int64))
    joined = Shard(path, header, np.concatenate([part.tokens for part in parts]),
                   offsets_of(np.concatenate([np.diff(part.offsets) for part in parts])))
    if parts[0].mask_offsets is not None:
        joined.mask_offsets = offsets_of(np.concatenate([np.diff(part.mask_offsets) for part in parts]))
        joined.mask_positions = np.concatenate([part.mask_positions for part in parts])
        joined.mask_labels = np.concatenate([part.mask_labels for part in parts])
    if parts[0].pair_labels is not None:
        joined.pair_labels = np.concatenate([part.pair_labels for part in parts])
    return joined


def _read_rows(path: Path, rows: np.ndarray) -> Shard:
    """The samples `rows` of a shard of ours: each block read, its selected samples kept."""
    with open_stream(path) as stream:
        objects = unpacker(stream)
        header = next(objects, None)
        _validate_shard_header(path, header)
        dtype, parts, first = DTYPES[header["dtype"]], [], 0
        for block in objects:
            block_shard = _block_shard(path, header, block, dtype)
            count = len(block_shard)
            wanted = rows[(rows >= first) & (rows < first + count)] - first
            if len(wanted):
                parts.append(select_rows(block_shard, wanted))
            first += count
    if first != header["samples"]:
        raise corrupt(path, f"{first} samples but the header counts {header['samples']}")
    return join_shards(path, header, parts, dtype)


def _block_shard(path, header: dict, block: dict, dtype) -> Shard:
    """One block as a shard of its own samples."""
    lengths = np.frombuffer(block["lengths"], dtype=np.uint16)
    tokens = np.frombuffer(block["tokens"], dtype=dtype)
    offsets = offsets_of(lengths)
    if offsets[-1] != len(tokens) or (len(lengths) and lengths.max() > header["seq_len"]):
        raise corrupt(path, "block lengths do not add up to its tokens, or exceed the header's seq-len")
    shard = Shard(path, header, tokens, offsets)
    if header["masking"] == "static":
        shard.mask_offsets = offsets_of(np.frombuffer(block["mask_counts"], dtype=np.uint16))
        shard.mask_positions = np.frombuffer(block["mask_positions"], dtype=np.uint16)
        shard.mask_labels = np.frombuffer(block["mask_labels"], dtype=dtype)
    if header.get("pairs", "none") != "none":
        shard.pair_labels = _checked_pair_labels(path, np.frombuffer(block["pair_labels"], dtype=np.uint8))
    return shard


# The header fields a config sets, as users know them.
CHECKED_FIELDS = {"seq_len": "seq-len", "vocab_size": "vocabulary size", "vocab_checksum": "vocabulary checksum"}


def check_header(path, header: dict, expect: dict) -> None:
    """Raise ShardError when the header disagrees with what the config expects."""
    for field, name in CHECKED_FIELDS.items():
        if expect.get(field) is not None and header.get(field) != expect[field]:
            raise ShardError(f"{path}: {name} {header.get(field)} in the shard but {expect[field]} in the config")


def _validate_shard_header(path, header) -> None:
    if not isinstance(header, dict) or header.get("format") != SHARD_FORMAT:
        raise ShardError(f"{path}: not a {SHARD_FORMAT} file (format {header.get('format')!r})"
                         if isinstance(header, dict) else f"{path}: not a {SHARD_FORMAT} file")
    if header.get("version") != FORMAT_VERSION:
        raise ShardError(f"{path}: shard format version {header.get('version')} but this program reads "
                         f"version {FORMAT_VERSION}")
    if header.get("dtype") not in DTYPES or header.get("masking") not in ("static", "none"):
        raise corrupt(path, f"dtype {header.get('dtype')!r}, masking {header.get('masking')!r}")
    if header.get("pairs", "none") not in PAIRS or header.get("documents", "joined") not in DOCUMENTS:
        raise corrupt(path, f"pairs {header.get('pairs')!r}, documents {header.get('documents')!r}")
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
    with open_stream(path) as stream:
        objects = unpacker(stream)
        header = next(objects, None)
        _validate_shard_header(path, header)
        dtype = DTYPES[header["dtype"]]
        static = header["masking"] == "static"
        paired = header.get("pairs", "none") != "none"
        lengths = _ArrayFiller(path, "samples", header["samples"], np.uint16)
        tokens = _ArrayFiller(path, "tokens", header["tokens"], dtype)
        pair_labels = _ArrayFiller(path, "pair labels", header["samples"] if paired else 0, np.uint8)
        counts, positions, labels = [], [], []  # masks are ~15% of tokens: lists are cheap enough
        for block in objects:
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
        offsets = offsets_of(lengths.finish())
        tokens = tokens.finish()
    if len(offsets) > 1 and np.diff(offsets).max() > header["seq_len"]:
        raise corrupt(path, f"a sample is longer than the header's seq-len {header['seq_len']}")
    shard = _static_shard(path, header, tokens, offsets, counts, positions, labels) if static \
        else Shard(path, header, tokens, offsets)
    if paired:
        shard.pair_labels = _checked_pair_labels(path, pair_labels.finish())
    return shard


def _checked_pair_labels(path, pair_labels: np.ndarray) -> np.ndarray:
    if len(pair_labels) and pair_labels.max() > 1:
        raise corrupt(path, f"pair label {pair_labels.max()}, expected 0 or 1")
    return pair_labels


def offsets_of(lengths: np.ndarray) -> np.ndarray:
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    return offsets


def _concatenate(arrays: list[np.ndarray], dtype) -> np.ndarray:
    return np.concatenate(arrays) if arrays else np.empty(0, dtype=dtype)


def _static_shard(path, header, tokens, offsets, counts, positions, labels) -> Shard:
    counts = _concatenate(counts, np.uint16)
    positions = _concatenate(positions, np.uint16)
    labels = _concatenate(labels, tokens.dtype)
    mask_offsets = offsets_of(counts)
    if len(counts) != len(offsets) - 1 or mask_offsets[-1] != len(positions) or len(positions) != len(labels):
        raise corrupt(path, "mask counts do not match the samples and mask arrays")
    shard = Shard(path, header, tokens, offsets, mask_offsets, positions, labels)
    sample_lengths = np.diff(offsets)
    if len(positions) and (positions >= np.repeat(sample_lengths, counts)).any():
        raise corrupt(path, "a masked position lies outside its sample")
    return shard


def from_arrays(path, header: dict, lengths: np.ndarray, tokens: np.ndarray, masked: np.ndarray | None = None,
                labels: np.ndarray | None = None) -> Shard:
    """A shard of samples of these lengths, their tokens one after another; a static one's masked
    positions are in those flat tokens, `labels` their original ids (legacy.py's files come so)."""
    offsets = offsets_of(lengths)
    if masked is None:
        return Shard(path, header, tokens, offsets)
    sample_of_mask = np.repeat(np.arange(len(lengths)), lengths)[masked]
    return Shard(path, header, tokens, offsets,
                 mask_offsets=offsets_of(np.bincount(sample_of_mask, minlength=len(lengths))),
                 mask_positions=(masked - offsets[sample_of_mask]).astype(np.uint16), mask_labels=labels)


def find_shards(directory, pattern: str, split: str = "train", seq_len: int | str = "SEQ_LEN",
                vocab=None) -> list[Path]:
    """Shard files in directory matching a glob; `x_*.msgpack` also matches `x_*.msgpack.gz`. None
    is one line naming the directory's full path, the pattern, the shard files it holds and the
    command that makes the split's shards (making_shards: a sequence length or vocabulary not given
    left for the reader to fill in)."""
    base = glob.escape(str(directory))
    patterns = [pattern] if pattern.endswith(".gz") else [pattern, pattern + ".gz"]
    matches = {Path(match) for each in patterns for match in glob.glob(os.path.join(base, each))}
    files = sorted(match for match in matches if match.is_file())
    if not files:
        held = shard_files_held(Path(directory), pattern)
        raise UserError(f"{full_path(directory)}: no shard file matches {pattern} ({held}); "
                        f"{making_shards(directory, split, seq_len, vocab)}")
    return files


def shard_files_held(directory: Path, pattern: str) -> str:
    """What shard files (*.msgpack, *.msgpack.gz) a directory holds, a few by name."""
    if not directory.is_dir():
        return "not a directory" if directory.exists() else "no such directory"
    names = [path.name for path in directory.iterdir()
             if path.name.endswith((".msgpack", ".msgpack.gz")) and not path.name.startswith(".") and path.is_file()]
    if not names:
        return "shard files there: none"
    names.sort(key=lambda name: (-len(os.path.commonprefix([name, pattern])), name))
    more = f" and {len(names) - SHOWN_FILES} more" if len(names) > SHOWN_FILES else ""
    return f"shard files there: {', '.join(names[:SHOWN_FILES])}{more}"


def making_shards(directory, split: str = "train", seq_len: int | str = "SEQ_LEN", vocab=None) -> str:
    """The command that makes a split's shards in directory, and the names it gives them; a sequence
    length or vocabulary not given stays a placeholder for the reader to fill in."""
    vocab = full_path(vocab) if vocab else "VOCAB_DIR"
    return (f"make shards: {script_command('prepare_mlm_dataset.py')} -i INPUT -l LABEL -o {full_path(directory)} "
            f"-m {seq_len} -v {vocab}; the pattern must match the names it writes, "
            f"{split}_LABEL_{seq_len}_*.msgpack.gz")
