"""What the original BERT project (the one this program re-imagines) left on its users' disks, read here
and nowhere else: its other key and value names and the keys it had that mean nothing now
(current_name, current_value: config.py's), its msgpack shards and its GPT article arrays
(article_files and read: tasks/lm_data.py's, as the flat arrays shards.from_arrays makes a Shard of).
Imported only where one of them is met, so a run on this program's own files never reads it."""
import glob
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from errors import UserError
from packed_files import ShardError, corrupt, dtype_name, guarded, open_stream, unpacker

# A shard as flat arrays: (header, sample lengths, their tokens one after another, and for masked
# samples the masked positions in those tokens and their original ids, else None and None).
Arrays = tuple[dict, np.ndarray, np.ndarray, np.ndarray | None, np.ndarray | None]

# Its other spellings of keys and values.
KEY_ALIASES = {"n_layers": "n_layer", "t": "task_type"}
VALUE_ALIASES = {"task_type": {"gpt": "clm"}}
# Its keys that mean nothing here: accepted so its files load, then ignored.
IGNORED_KEYS = {
    "case": "`case = dickens` chose MLM pre-training; task-type decides what runs",
    "flash": "attention always runs PyTorch's fused kernels (scaled_dot_product_attention)",
}


def current_name(name: str) -> str | None:
    """The field name (lower case, '_') of a key as this program names it; None for one of its keys
    that mean nothing here."""
    return None if name in IGNORED_KEYS else KEY_ALIASES.get(name, name)


def current_value(name: str, text: str) -> str:
    """A value as this program spells it."""
    return VALUE_ALIASES.get(name, {}).get(text.strip().lower(), text)


SHARD_FORMAT = "legacy"
ARTICLES_FORMAT = "article-arrays"
SAMPLES_PER_CHUNK = 4096


def read(path, expect: dict) -> Arrays | None:
    """Its file at `path` (an MLM shard, or an ArticleFiles pair), checked against `expect` (seq_len,
    vocab_size); None for a file of ours."""
    if isinstance(path, ArticleFiles):
        return read_articles(path, expect["seq_len"], expect["vocab_size"])
    with open_stream(path) as stream:
        if not starts_like_a_shard(guarded(path, stream.read, 1)):
            return None
    arrays = guarded(path, read_shard_arrays, Path(path))
    check_fits(path, arrays, expect)
    return arrays


# ---------------------------------------------------------------------------------------------
# Its MLM shards: one msgpack array alternating id lists and label lists (label 0 where not
# masked, else the original id).


def starts_like_a_shard(first_byte: bytes) -> bool:
    """A msgpack array: ours start with a map (the header)."""
    return bool(first_byte) and (0x90 <= first_byte[0] <= 0x9F or first_byte[0] in (0xDC, 0xDD))


def check_fits(path, arrays: Arrays, expect: dict) -> None:
    """Its shards record neither a vocabulary nor a seq-len: the longest sample and the largest id tell."""
    header, _, tokens, _, labels = arrays
    if expect.get("seq_len") is not None and header["seq_len"] > expect["seq_len"]:
        raise ShardError(f"{path}: longest sample has {header['seq_len']} tokens in the shard "
                         f"but seq-len = {expect['seq_len']} in the config")
    if expect.get("vocab_size") is None or not len(tokens):
        return
    largest = max(int(tokens.max()), int(labels.max()) if len(labels) else -1)
    if largest >= expect["vocab_size"]:
        raise ShardError(f"{path}: token id {largest} in the shard but the vocabulary has {expect['vocab_size']} "
                         f"tokens")


def read_shard_arrays(path: Path) -> Arrays:
    """Its MLM shard, read one sample at a time; the header says what a shard of ours would, with
    None where it is not known."""
    chunks = []
    with open_stream(path) as stream:
        objects = unpacker(stream)
        items = objects.read_array_header()
        if items % 2:
            raise corrupt(path, f"odd number of lists ({items}): expected id and label lists in pairs")
        inputs, labels = [], []
        for _ in range(items // 2):
            inputs.append(objects.unpack())
            labels.append(objects.unpack())
            if len(inputs) == SAMPLES_PER_CHUNK:
                chunks.append(flat_chunk(inputs, labels))
                inputs, labels = [], []
        if inputs:
            chunks.append(flat_chunk(inputs, labels))
    lengths, tokens, label_ids = (concatenate([chunk[part] for chunk in chunks]) for part in range(3))
    if (tokens < 0).any() or (label_ids < 0).any():
        raise corrupt(path, "negative token id")
    dtype = np.uint16 if max(tokens.max(initial=0), label_ids.max(initial=0)) < 65536 else np.int32
    masked = np.flatnonzero(label_ids)
    header = {"format": SHARD_FORMAT, "version": 0, "seq_len": int(lengths.max(initial=0)), "vocab_size": None,
              "vocab_checksum": None, "samples": len(lengths), "tokens": len(tokens), "masking": "static",
              "mask_rate": None, "split": None, "seed": None, "copy": None, "source_files": [],
              "dtype": dtype_name(dtype), "created_by": "legacy shard"}
    return header, lengths, tokens.astype(dtype), masked, label_ids[masked].astype(dtype)


def flat_chunk(inputs: list, labels: list) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    lengths = np.array([len(ids) for ids in inputs], dtype=np.int64)
    if any(len(ids) != len(label) for ids, label in zip(inputs, labels)):
        raise ValueError("an id list and its label list differ in length")
    count = int(lengths.sum())
    flat_inputs = np.fromiter((i for ids in inputs for i in ids), dtype=np.int64, count=count)
    flat_labels = np.fromiter((i for label in labels for i in label), dtype=np.int64, count=count)
    return lengths, flat_inputs, flat_labels


def concatenate(arrays: list[np.ndarray]) -> np.ndarray:
    return np.concatenate(arrays) if arrays else np.empty(0, dtype=np.int64)


# ---------------------------------------------------------------------------------------------
# Its GPT data: per split, two .npy files named by one pattern, `{split}_article_128_{which}.npy`,
# where {which} tells them apart: the token ids of every article one after another (uint16) and
# the offsets where the articles start (an integer array, with or without the end as its last entry).


@dataclass(frozen=True)
class ArticleFiles:
    """The two files of one split; `path` (the ids) names the pair in messages."""
    path: Path
    offsets: Path

    def __str__(self) -> str:
        return str(self.path)


def article_files(directory: Path, pattern: str) -> list[ArticleFiles]:
    """The pair of files a pattern with {which} matches: the uint16 one holds the ids."""
    matches = sorted(glob.glob(os.path.join(glob.escape(str(directory)), pattern.replace("{which}", "*"))))
    if len(matches) != 2:
        raise UserError(f"{directory}: {pattern} matches {len(matches)} file(s); expected two, the token ids "
                        f"(uint16) and the article offsets")
    dtypes = {Path(match): load_array(Path(match)).dtype for match in matches}
    ids = [path for path, dtype in dtypes.items() if dtype == np.uint16]
    offsets = [path for path, dtype in dtypes.items() if dtype != np.uint16 and np.issubdtype(dtype, np.integer)]
    if len(ids) != 1 or len(offsets) != 1:
        kinds = ", ".join(f"{path.name}: {dtype}" for path, dtype in dtypes.items())
        raise UserError(f"{directory}: {pattern}: expected one uint16 file of token ids and one integer file of "
                        f"article offsets ({kinds})")
    return [ArticleFiles(ids[0], offsets[0])]


def load_array(path: Path, mmap_mode: str | None = "r") -> np.ndarray:
    try:
        return np.load(path, mmap_mode=mmap_mode, allow_pickle=False)
    except (OSError, ValueError) as error:
        raise UserError(f"{path}: not a readable .npy array ({error})") from None


def read_articles(files: ArticleFiles, seq_len: int, vocab_size: int) -> Arrays:
    """Unmasked samples: every article cut into samples of seq_len tokens (the last piece shorter, a
    lone token dropped: it has no next token to predict)."""
    ids = load_array(files.path, None)
    given = load_array(files.offsets, None).astype(np.int64)
    if given.ndim != 1 or ids.ndim != 1:
        raise UserError(f"{files.path}: expected one-dimensional arrays of ids and offsets")
    bounds = given if len(given) and given[-1] == len(ids) else np.append(given, len(ids))
    if len(bounds) < 2 or bounds[0] < 0 or np.any(np.diff(bounds) < 0) or bounds[-1] > len(ids):
        raise UserError(f"{files.offsets}: the offsets must rise from 0 to at most the {len(ids):,} ids")
    if len(ids) and int(ids.max()) >= vocab_size:
        raise UserError(f"{files.path}: ids up to {int(ids.max())}, but the vocabulary has {vocab_size} tokens "
                        f"(the data was made with another vocabulary)")
    counts = -(-np.diff(bounds) // seq_len)  # pieces per article
    article = np.repeat(np.arange(len(counts)), counts)
    index_in_article = np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts)
    starts = bounds[:-1][article] + index_in_article * seq_len
    lengths = np.minimum(starts + seq_len, bounds[1:][article]) - starts
    keep = lengths >= 2
    starts, lengths = starts[keep], lengths[keep]
    flat = np.repeat(starts - (np.cumsum(lengths) - lengths), lengths) + np.arange(lengths.sum())
    header = {"format": ARTICLES_FORMAT, "seq_len": seq_len, "masking": "none", "samples": len(lengths)}
    return header, lengths, ids[flat], None, None
