"""The shards of one split as a process reads them, in memory that does not grow with the corpus:
each file known by its header first; an epoch one pass over a numbered set (shard order and sample
order shuffled by the seed), or over one file alone; each process loading only the
samples it trains on, of the shard it reads and, in the background, of the next.
"""
import hashlib
import json
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from batching import kept_rows
from errors import UserError
from packed_files import is_whole, read_header
from shards import SHARD_FORMAT, check_header


@dataclass(frozen=True)
class ShardFile:
    """A shard known by its header, not loaded; samples None: a file without one (legacy.py's),
    whose count is known only by loading it."""
    path: Path | object  # or the files read together as one (legacy.ArticleFiles)
    samples: int | None = None
    shard: int | None = None  # its number in a numbered set
    copy: int | None = None
    preparation: str | None = None  # None: a file that does not say
    fingerprint: str = ""  # tells this file from another of its name (fingerprint_of)


@dataclass(frozen=True)
class NumberedFile(ShardFile):
    """A shard of a numbered set, and whether it is the set's last."""
    last: bool = False


def scan(paths: list, expect: dict) -> list[ShardFile]:
    """The files with what their headers say, checked against the run (seq-len, vocabulary) and
    for their size: a cut copy or a killed writer's file is one line naming it."""
    files = []
    for path in paths:
        header = read_header(path) if isinstance(path, Path) else None
        if header is None or header.get("format") != SHARD_FORMAT:
            # a file without our header: reading it says what is wrong
            files.append(ShardFile(path, fingerprint=fingerprint_of(path, None)))
            continue
        check_header(path, header, expect)
        if not is_whole(path, header):
            raise UserError(f"{path}: {Path(path).stat().st_size:,} bytes, not the size its header says: a partial "
                            f"copy or a file left by a killed process (prepare it again)")
        known = {"samples": header["samples"], "copy": header.get("copy"), "preparation": header.get("preparation"),
                 "fingerprint": fingerprint_of(path, header)}
        files.append(ShardFile(path, **known) if header.get("shard") is None
                     else NumberedFile(path, shard=header["shard"], last=bool(header.get("last_shard")), **known))
    return files


def fingerprint_of(path, header: dict | None) -> str:
    """A digest of a shard's header, whose preparation, counts and body size tell it from another
    file of its name; of a file without one, the size."""
    if header is None:
        return f"{Path(str(path)).stat().st_size} bytes"
    return hashlib.sha256(json.dumps(header, sort_keys=True, default=str).encode()).hexdigest()[:16]


def epoch_sets(files: list[ShardFile]) -> list[list[ShardFile]]:
    """What each epoch reads, in turn: a numbered set of several shards whole (one list per static
    copy), or each whole file alone (a corpus of one shard, static copies, files without a number)."""
    check_one_preparation(files)
    sets = [file for file in files if isinstance(file, NumberedFile) and not (file.shard == 0 and file.last)]
    if not sets:
        return [[file] for file in files]
    copies = sorted({file.copy for file in sets}, key=lambda copy: -1 if copy is None else copy)
    return [complete_set([file for file in sets if file.copy == copy]) for copy in copies]


def check_one_preparation(files: list[ShardFile]) -> None:
    """The files come from one preparation (files that do not say count as one): two preparations
    of one corpus, of another seed say, split it differently, so each one's val samples are among
    the other's train samples."""
    first_of = {}
    for file in files:
        first_of.setdefault(file.preparation, file)
    if len(first_of) > 1:
        first, second = list(first_of.values())[:2]
        raise UserError(f"{first.path} and {second.path}: shards of two preparations matched by one pattern; "
                        f"narrow the pattern to one of them")


def complete_set(files: list["NumberedFile"]) -> list["NumberedFile"]:
    """A numbered set in order, every number from 0 to its last there, once."""
    files = sorted(files, key=lambda file: file.shard)
    for number, file in enumerate(files):
        if file.shard != number:
            name = Path(file.path).name
            problem = "twice" if file.shard < number else f"missing (the set has {name})"
            raise UserError(f"{Path(file.path).parent}: shard {min(number, file.shard)} of this set is {problem}")
    if not files[-1].last:
        raise UserError(f"{files[-1].path}: the set's shards after this one are missing (it is not the last)")
    return files


# ---------------------------------------------------------------------------------------------
# An epoch's order and a process's share of it


class EpochPlan:
    """Where every sample of an epoch comes in the epoch's order: the shards in a seeded order, the
    kept samples of each in a seeded order, one after another. Samples of a shard can only mix with
    those of its neighbours in this order; one shard: the permutation of BatchOrder."""

    def __init__(self, files: list[ShardFile], counts: list[int], epoch: int, seed: int, share: float):
        single = len(files) == 1
        self.order = [0] if single else np.random.default_rng([seed, epoch, 1]).permutation(len(files)).tolist()
        self.files = [files[index] for index in self.order]
        self.counts = [counts[index] for index in self.order]
        self.starts = np.concatenate([[0], np.cumsum([len(kept_rows(count, share, seed)) for count in self.counts])])
        self.epoch, self.seed, self.share, self.single = epoch, seed, share, single

    @property
    def total(self) -> int:
        return int(self.starts[-1])

    def rows(self, k: int) -> np.ndarray:
        """The samples of the k-th shard in order, as rows of its file."""
        kept = kept_rows(self.counts[k], self.share, self.seed)
        key = [self.seed, self.epoch] if self.single else [self.seed, self.epoch, 2, self.order[k]]
        return kept[np.random.default_rng(key).permutation(len(kept))]

    def shards_of(self, positions: np.ndarray) -> np.ndarray:
        return np.searchsorted(self.starts, positions, side="right") - 1


def rank_positions(total: int, start: int, global_batch: int, rank: int, world_size: int) -> range:
    """This rank's positions in the epoch's order from `start` on, batch after batch: every
    world-size-th of each global batch, full global batches only. A range, not an array: an epoch of
    a 100 GB corpus has hundreds of millions of positions."""
    end = start + (total - start) // global_batch * global_batch
    return range(start + rank, end, world_size)


def positions_between(positions: range, low: int, high: int) -> np.ndarray:
    """The positions p with low <= p < high, found by arithmetic on the range."""
    first = max(0, -(-(low - positions.start) // positions.step))
    last = max(first, -(-(high - positions.start) // positions.step))
    return as_array(positions[first:last])


def as_array(positions: range) -> np.ndarray:
    return np.arange(positions.start, positions.stop, positions.step, dtype=np.int64)


# ---------------------------------------------------------------------------------------------
# Loading in the background


class Background:
    """load(key) in a daemon thread (the process may end while it runs); result() waits."""

    def __init__(self, load: Callable, key):
        self.value, self.error = None, None
        self.thread = threading.Thread(target=self._run, args=(load, key), daemon=True)
        self.thread.start()

    def _run(self, load, key):
        try:
            self.value = load(key)
        except BaseException as error:  # handed to the reader
            self.error = error

    def result(self):
        self.thread.join()
        if self.error is not None:
            raise self.error
        return self.value


class ShardLoader:
    """The shards a process reads: those a batch needs, and, while it reads one, the next loading in
    the background. At most two are held."""

    def __init__(self, load: Callable):
        self.load = load
        self.held: dict = {}

    def get(self, keys: list, following=None) -> list:
        for key in [key for key in self.held if key not in keys and key != following]:
            del self.held[key]
        for key in keys:
            if key not in self.held:
                self.held[key] = Background(self.load, key)
        if following is not None and len(keys) == 1 and following not in self.held:
            self.held[following] = Background(self.load, following)
        return [self.held[key].result() for key in keys]
