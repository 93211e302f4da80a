"""The data of the language-modelling tasks (MLM, causal LM, ELECTRA): each split's shards, read in a
seeded order per epoch, train shards round-robin by epoch, batches as dicts of numpy arrays padded
to seq-len.

With masking = static the shards bring their stored masks; with masking = dynamic the task masks
each batch on the device. Shards of sentence pairs add segment ids and pair labels.
"""
import dataclasses
from pathlib import Path
from typing import Iterator

import numpy as np

import legacy
from batching import BatchOrder, gather_padded, kept_rows
from config import ini_text
from errors import UserError
from masking import IGNORE_INDEX, MaskingRule, predictions_per_sequence
from sentence_pairs import segment_ids
from shards import Shard, find_shards, read_articles, read_shard

# The Config fields that decide which samples a run sees: a resumed run keeps them.
DATA_KEYS = ("seq_len", "dataset_pattern", "val_dataset_pattern", "dataset_percentage", "val_dataset_percentage")
PATTERN_KEYS = {"train": "dataset_pattern", "val": "val_dataset_pattern", "test": "test_dataset_pattern"}


def split_pattern(config, split: str) -> str:
    """The split's file pattern; `{split}` in it stands for train, val or test, and a
    dataset-pattern with `{split}` serves the splits whose own pattern the config leaves out."""
    key = PATTERN_KEYS[split]
    if "{split}" in config.dataset_pattern and key not in config.given:
        key = "dataset_pattern"
    return getattr(config, key).replace("{split}", split)


def with_masking(shard: Shard, rule: MaskingRule | None) -> Shard:
    """The shard as the run uses it.

    With a rule (masking = static): the stored masks, which must have been made by that rule
    (checked where the header records it; the original project's shards do not). Without: the
    original ids, which a static shard keeps too (its inputs with the labels put back), to be
    masked afresh or read unmasked.
    """
    if rule is None:
        if shard.masking == "none":
            return shard
        return dataclasses.replace(shard, header=shard.header | {"masking": "none"}, tokens=shard.unmasked_tokens(),
                                   mask_offsets=None, mask_positions=None, mask_labels=None)
    if shard.masking != "static":
        raise UserError(f"{shard.path}: the shard holds no masks but the config has masking = static "
                        f"(prepare it with --masking static, or set masking = dynamic)")
    for field, value in dataclasses.asdict(rule).items():
        stored = shard.header.get(field)
        if stored is not None and stored != value:
            key = field.replace("_", "-")
            raise UserError(f"{shard.path}: masked with {key} = {ini_text(stored)} but the config has "
                            f"{key} = {ini_text(value)} and masking = static")
    return shard


def make_batch(shard: Shard, rows: np.ndarray, seq_len: int, pad_id: int, sep_id: int, mask_rate: float) -> dict:
    """Samples `rows` of a shard, padded to seq_len; with stored masks and sentence pairs when the
    shard has them."""
    input_ids, real = gather_padded(shard.tokens, shard.offsets, rows, seq_len, pad_id)
    batch = {"input_ids": input_ids, "attention_mask": None if real.all() else real}
    if shard.mask_offsets is not None:
        counts = shard.mask_offsets[rows + 1] - shard.mask_offsets[rows]
        slots = max(predictions_per_sequence(seq_len, mask_rate), int(counts.max(initial=0)))
        batch["positions"], _ = gather_padded(shard.mask_positions, shard.mask_offsets, rows, slots, 0)
        batch["labels"], _ = gather_padded(shard.mask_labels, shard.mask_offsets, rows, slots, IGNORE_INDEX)
    if shard.pair_labels is not None:
        batch["segment_ids"] = segment_ids(unmasked_ids(batch), real, sep_id)
        batch["sentence_labels"] = shard.pair_labels[rows].astype(np.int64)
    return batch


def unmasked_ids(batch: dict) -> np.ndarray:
    """The batch's ids with stored masks undone: a random replacement may itself be a [SEP]."""
    if "labels" not in batch:
        return batch["input_ids"]
    ids, used = batch["input_ids"].copy(), batch["labels"] != IGNORE_INDEX
    ids[np.nonzero(used)[0], batch["positions"][used]] = batch["labels"][used]
    return ids


@dataclasses.dataclass(frozen=True)
class ShardRules:
    """What every shard of a run must agree with."""
    seq_len: int
    vocab_size: int
    vocab_checksum: str
    pad_id: int
    sep_id: int
    static_rule: MaskingRule | None  # masking = static: the rule the stored masks must follow
    pairs: str | None  # the sentence pairs the shards must hold; None: any
    mask_rate: float  # sizes the slots of stored masks

    @property
    def expect(self) -> dict:
        """The header fields shards.read_shard checks."""
        return {"seq_len": self.seq_len, "vocab_size": self.vocab_size, "vocab_checksum": self.vocab_checksum}


class ShardSplit:
    """Batches of one split; train shards take turns by epoch (K static copies: K masks)."""

    def __init__(self, paths: list, rules: ShardRules, order: BatchOrder, share: float = 1.0):
        self.paths = paths
        self.rules = rules
        self.order = order
        self.share = share  # of each shard's samples, a seeded fixed subset (dataset-percentage)
        self._loaded: tuple[Path, Shard, np.ndarray] | None = None

    def shard_for_epoch(self, epoch: int) -> Shard:
        return self.loaded(epoch)[1]

    def rows_for_epoch(self, epoch: int) -> np.ndarray:
        """The samples of the epoch's shard that the split uses."""
        return self.loaded(epoch)[2]

    def loaded(self, epoch: int) -> tuple[Path, Shard, np.ndarray]:
        path = self.paths[epoch % len(self.paths)]
        if self._loaded is None or self._loaded[0] != path:
            self._loaded = None  # free the old shard before reading the next
            shard = self.checked(path, self.read(path))
            kept = kept_rows(len(shard), self.share, self.order.seed)
            if len(kept) < self.order.batch_size * self.order.world_size:
                share = f" (the {self.share:g} share kept)" if self.share < 1 else ""
                raise UserError(f"{path}: {len(kept)} samples{share} are fewer than one batch "
                                f"(batch-size {self.order.batch_size} x {self.order.world_size} processes)")
            self._loaded = (path, shard, kept)
        return self._loaded

    def read(self, path) -> Shard:
        rules = self.rules
        if isinstance(path, legacy.ArticleFiles):
            return read_articles(path, rules.seq_len, rules.vocab_size)
        return with_masking(read_shard(path, rules.expect), rules.static_rule)

    def checked(self, path, shard: Shard) -> Shard:
        rules = self.rules
        if shard.seq_len > rules.seq_len:
            raise UserError(f"{path}: samples of {shard.seq_len} tokens do not fit seq-len {rules.seq_len}")
        if rules.pairs is not None and shard.pairs != rules.pairs:
            raise UserError(f"{path}: pairs is {shard.pairs} in the shard but sentence-objective = {rules.pairs} "
                            f"(prepare_mlm_dataset.py --pairs {rules.pairs})")
        if len(shard) and np.diff(shard.offsets).max() <= 2:
            raise UserError(f"{path}: no sample has room for a mask: every one is [CLS] [SEP] alone")
        return shard

    def batch(self, shard: Shard, rows: np.ndarray) -> dict:
        rules = self.rules
        return make_batch(shard, rows, rules.seq_len, rules.pad_id, rules.sep_id, rules.mask_rate)

    def batches(self, position: dict | None) -> Iterator[tuple[dict, dict]]:
        return self.order.batches(
            position, lambda epoch: len(self.rows_for_epoch(epoch)),
            lambda epoch, rows: self.batch(self.shard_for_epoch(epoch), self.rows_for_epoch(epoch)[rows]))

    def fixed_batches(self, count: int | None) -> Iterator[dict]:
        shard, kept = self.shard_for_epoch(0), self.rows_for_epoch(0)
        return self.order.fixed_batches(count, len(kept), lambda rows: self.batch(shard, kept[rows]))


class LanguageModelData:
    """The splits of a language-modelling run, opened when first asked for."""

    def __init__(self, config, vocab, rank: int, world_size: int, *, static_rule: MaskingRule | None = None,
                 pairs: str | None = None):
        self.config = config
        self.rules = ShardRules(config.seq_len, vocab.size, vocab.checksum, vocab.pad_id, vocab.sep_id, static_rule,
                                pairs, config.mask_rate)
        self.order = BatchOrder(config.batch_size, config.seed, rank, world_size)
        self.patterns = {split: split_pattern(config, split) for split in PATTERN_KEYS}
        self.splits: dict[str, ShardSplit] = {}
        self.split("train")  # fail early on a missing train split

    def split(self, name: str) -> ShardSplit:
        if name not in self.splits:
            directory, pattern = self.config.datasets_path, self.patterns[name]
            paths = (legacy.find_article_files(directory, pattern) if "{which}" in pattern
                     else find_shards(directory, pattern))
            self.splits[name] = ShardSplit(paths, self.rules, self.order, self.config.share_of(name))
        return self.splits[name]

    def check(self, splits: tuple[str, ...]):
        for name in splits:
            self.split(name).shard_for_epoch(0)

    def train_batches(self, position: dict | None):
        return self.split("train").batches(position)

    def fixed_batches(self, split: str, count: int | None) -> Iterator[dict]:
        return self.split(split).fixed_batches(count)
