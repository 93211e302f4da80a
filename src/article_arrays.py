"""The GPT data of the project this one replaces: per split, two .npy files named by one pattern,
`{split}_article_128_{which}.npy`, where {which} tells them apart: the token ids of every article
one after another (uint16) and the offsets where the articles start (an integer array, with or
without the end as its last entry). Samples are each article cut into pieces of seq-len tokens,
read as a Shard, so the causal LM (and MLM) tasks train on them as on shards.
"""
import glob
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from errors import UserError
from shards import Shard

ARTICLES_FORMAT = "article-arrays"


@dataclass(frozen=True)
class ArticleFiles:
    """The two files of one split; `path` (the ids) names the pair in messages."""
    path: Path
    offsets: Path

    def __str__(self) -> str:
        return str(self.path)


def find_article_files(directory: Path, pattern: str) -> list[ArticleFiles]:
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


def read_articles(files: ArticleFiles, seq_len: int, vocab_size: int) -> Shard:
    """Every article cut into samples of seq_len tokens (the last piece shorter, a lone token dropped)."""
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
    keep = lengths >= 2  # a next token to predict
    starts, lengths = starts[keep], lengths[keep]
    flat = np.repeat(starts - (np.cumsum(lengths) - lengths), lengths) + np.arange(lengths.sum())
    tokens = ids[flat]
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    header = {"format": ARTICLES_FORMAT, "seq_len": seq_len, "masking": "none", "samples": len(offsets) - 1}
    return Shard(files.path, header, tokens, offsets)
