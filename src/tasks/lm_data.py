"""The data of the tasks trained on the prepared shards (MLM, causal LM, ELECTRA, distillation): each
split's shards, an epoch one pass over a numbered set in a seeded order (shard_stream.py; the earlier
layout's files and static copies one an epoch, in turn), batches as dicts of numpy arrays padded to
seq-len; and CorpusTask, what those tasks share.

With masking = static the shards bring their stored masks; with masking = dynamic the task masks
each batch on the device. Shards of sentence pairs add segment ids and pair labels.
"""
import dataclasses
import functools
from pathlib import Path
from typing import Iterator

import numpy as np

from architecture import IGNORE_INDEX
from batching import BatchOrder, gather_padded
from config import ini_text
from errors import UserError
from hardware import to_device
from masking import MaskingRule, predictions_per_sequence
from shard_stream import (EpochPlan, ShardFile, ShardLoader, as_array, epoch_sets, positions_between, rank_positions,
                          scan)
from shards import Shard, find_shards, from_arrays, join_shards, read_shard, select_rows
from task import evaluate_by_sums

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
    (checked where the header records it; legacy.py's shards do not). Without: the
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
    if shard.documents == "apart":
        batch["document_ids"] = document_ids(unmasked_ids(batch), real, sep_id)
    return batch


def unmasked_ids(batch: dict) -> np.ndarray:
    """The batch's ids with stored masks undone: a random replacement may itself be a [SEP]."""
    if "labels" not in batch:
        return batch["input_ids"]
    ids, used = batch["input_ids"].copy(), batch["labels"] != IGNORE_INDEX
    ids[np.nonzero(used)[0], batch["positions"][used]] = batch["labels"][used]
    return ids


def segment_ids(input_ids: np.ndarray, real: np.ndarray, sep_id: int) -> np.ndarray:
    """Token types of [batch, length] pair samples: 0 up to and including the first [SEP],
    1 after it, 0 on padding."""
    is_sep = input_ids == sep_id
    after_first_sep = np.cumsum(is_sep, axis=1) - is_sep > 0
    return (after_first_sep & real).astype(np.int64)


def document_ids(input_ids: np.ndarray, real: np.ndarray, sep_id: int) -> np.ndarray:
    """Which document of its row each token of [batch, length] rows of documents apart is in: a
    [SEP] closes its document. Padding counts with the row's last document, so that every query
    has a key to attend to."""
    closes = (input_ids == sep_id) & real
    document = np.cumsum(closes, axis=1) - closes
    last = np.maximum(closes.sum(axis=1, keepdims=True) - 1, 0)
    return np.minimum(document, last).astype(np.int64)


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
    """Batches of one split, this process's share of each global batch. The process holds at most
    the shard it reads and the next (ShardLoader), and of each only the samples it trains on."""

    def __init__(self, paths: list, rules: ShardRules, order: BatchOrder, share: float = 1.0):
        self.rules = rules
        self.order = order
        self.share = share  # of each shard's samples, a seeded fixed subset (dataset-percentage)
        self.paths = paths
        self.counts: dict = {}  # samples of the files whose headers do not say
        self.plans: dict[int, EpochPlan] = {}
        self.kept_for_evaluation: dict = {}

    @functools.cached_property
    def epochs(self) -> list[list[ShardFile]]:
        """The files each epoch reads, their headers checked when first asked (a checkpoint that
        does not fit the config is the first thing to say)."""
        return epoch_sets(scan(self.paths, self.rules.expect))

    @functools.cached_property
    def identity(self) -> dict[str, str]:
        """Each file's name and fingerprint: the data a checkpoint's position is a position in."""
        return {Path(str(file.path)).name: file.fingerprint for files in self.epochs for file in files}

    def check_same_data(self, position: dict | None) -> None:
        """A resumed run reads the shards it trained on: on others (another corpus prepared under
        the same names, shards added or gone) its position means nothing."""
        trained = position["shards"] if position else self.identity
        if trained == self.identity:
            return
        directory = Path(str(self.paths[0])).parent
        changed = [name for name in self.identity if trained.get(name) != self.identity[name]]
        name = changed[0] if changed else next(name for name in trained if name not in self.identity)
        problem = ("gone, and the run trained on it" if name not in self.identity else
                   "not the shard of this name that the run trained on" if name in trained else
                   "a shard the run did not train on")
        raise UserError(f"{directory / name}: {problem}; a resumed run reads the data it trained on (to train on "
                        f"these shards from its weights in a new run, add --switch-training)")

    def plan(self, epoch: int) -> EpochPlan:
        if epoch not in self.plans:
            if len(self.plans) > 2:  # the epoch read and the next are enough
                del self.plans[min(self.plans)]
            files = self.epochs[epoch % len(self.epochs)]
            self.plans[epoch] = EpochPlan(files, [self.samples_in(file) for file in files], epoch, self.order.seed,
                                          self.share)
        return self.plans[epoch]

    def samples_in(self, file: ShardFile) -> int:
        if file.samples is not None:
            return file.samples
        if file.path not in self.counts:
            self.counts[file.path] = len(self.checked(file.path, self.read(file)))
        return self.counts[file.path]

    def load(self, key) -> tuple[Shard, np.ndarray]:
        """Shard k of an epoch whose reading starts at `start`, with only the samples of this
        process's first `limit` positions (all for None); and their rows, ascending."""
        epoch, k, start, limit = key
        plan, order = self.plan(epoch), self.order
        positions = rank_positions(plan.total, start, order.global_batch_size, order.rank, order.world_size)[:limit]
        mine = positions_between(positions, int(plan.starts[k]), int(plan.starts[k + 1]))
        rows = np.unique(plan.rows(k)[mine - plan.starts[k]])
        file = plan.files[k]
        return self.checked(file.path, self.read(file, rows)), rows

    def read(self, file: ShardFile, rows: np.ndarray | None = None) -> Shard:
        rules = self.rules
        arrays = None
        if file.samples is None:  # no header of ours
            import legacy  # read only for such a file: the original project's, or else read_shard says what it is
            arrays = legacy.read(file.path, rules.expect)
        if arrays is None:
            return with_masking(read_shard(file.path, rules.expect, rows), rules.static_rule)
        shard = from_arrays(Path(str(file.path)), *arrays)
        return with_masking(shard if rows is None else select_rows(shard, rows), rules.static_rule)

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

    def batch_at(self, plan: EpochPlan, positions: range, loader, start: int, limit: int | None) -> dict:
        """The samples at these positions of the epoch's order (from one shard, or two at a switch)."""
        positions = as_array(positions)
        shards = plan.shards_of(positions)
        numbers = [int(k) for k in np.unique(shards)]
        following = numbers[-1] + 1
        if following < len(plan.files):
            upcoming = (plan.epoch, following, start, limit)
        else:
            upcoming = (plan.epoch + 1, 0, 0, None) if limit is None else None
        loaded = loader.get([(plan.epoch, k, start, limit) for k in numbers], upcoming)
        parts = []
        for k, (shard, rows) in zip(numbers, loaded):
            wanted = plan.rows(k)[positions[shards == k] - plan.starts[k]]
            parts.append(select_rows(shard, np.searchsorted(rows, wanted)))
        joined = join_shards(parts[0].path, parts[0].header, parts, parts[0].tokens.dtype)
        rules = self.rules
        return make_batch(joined, np.arange(len(positions)), rules.seq_len, rules.pad_id, rules.sep_id,
                          rules.mask_rate)

    def batches(self, position: dict | None) -> Iterator[tuple[dict, dict]]:
        """Endless batches from `position` ({"epoch", "sample": where in the epoch's order, "shards":
        the identity of the data}), each with the position after it."""
        self.check_same_data(position)
        order, loader = self.order, ShardLoader(self.load)
        epoch, start = starting_point(position)
        while True:
            plan = self.plan(epoch)
            positions = rank_positions(plan.total, start, order.global_batch_size, order.rank, order.world_size)
            if start == 0 and not len(positions):
                raise UserError(self.too_few(plan))
            count = len(positions) // order.batch_size
            for index in range(count):
                rows = positions[index * order.batch_size:(index + 1) * order.batch_size]
                after = ({"epoch": epoch + 1, "sample": 0} if index + 1 == count else
                         {"epoch": epoch, "sample": start + (index + 1) * order.global_batch_size})
                after["shards"] = self.identity
                yield after, self.batch_at(plan, rows, loader, start, None)
            epoch, start = epoch + 1, 0

    def too_few(self, plan: EpochPlan) -> str:
        share = f" (the {self.share:g} share kept)" if self.share < 1 else ""
        return (f"{plan.files[0].path}{' ...' if len(plan.files) > 1 else ''}: {plan.total} samples{share} are fewer "
                f"than one batch (batch-size {self.order.batch_size} x {self.order.world_size} processes)")

    def fixed_batches(self, count: int | None) -> Iterator[dict]:
        """The first `count` batches of epoch 0's order (all for None), the same at every call; only
        their samples are loaded, and kept for the next call."""
        order, plan = self.order, self.plan(0)
        positions = rank_positions(plan.total, 0, order.global_batch_size, order.rank, order.world_size)
        limit = None if count is None else count * order.batch_size
        loader = ShardLoader(self.load) if count is None else KeptShards(self.load, self.kept_for_evaluation)
        positions = positions[:limit]
        for index in range(len(positions) // order.batch_size):
            rows = positions[index * order.batch_size:(index + 1) * order.batch_size]
            yield self.batch_at(plan, rows, loader, 0, limit)


def starting_point(position: dict | None) -> tuple[int, int]:
    """(epoch, sample) of a data position."""
    return (position["epoch"], position["sample"]) if position else (0, 0)


class KeptShards:
    """ShardLoader's get for evaluation: its few samples, loaded once and kept."""

    def __init__(self, load, kept: dict):
        self.load, self.kept = load, kept

    def get(self, keys: list, following=None) -> list:
        for key in keys:
            if key not in self.kept:
                self.kept[key] = self.load(key)
        return [self.kept[key] for key in keys]


class LanguageModelData:
    """The splits of a language-modelling run, opened when first asked for."""

    def __init__(self, config, vocab, rank: int, world_size: int, *, static_rule: MaskingRule | None = None,
                 pairs: str | None = None):
        self.config = config
        self.rules = ShardRules(config.seq_len, vocab.size, vocab.checksum, vocab.pad_id, vocab.sep_id, static_rule,
                                pairs, MaskingRule.from_config(config).mask_rate)
        self.order = BatchOrder(config.batch_size, config.seed, rank, world_size)
        self.patterns = {split: split_pattern(config, split) for split in PATTERN_KEYS}
        self.splits: dict[str, ShardSplit] = {}
        self.split("train")  # fail early on a missing train split

    @property
    def source(self) -> str:
        """What the run trains on, as its checkpoints' lineage tells it."""
        return f"{self.config.datasets_dir or 'datasets'}/{self.config.dataset_pattern}"

    def split(self, name: str) -> ShardSplit:
        if name not in self.splits:
            directory, pattern = self.config.datasets_path, self.patterns[name]
            if "{which}" in pattern:
                import legacy  # read only for the original project's GPT article arrays, which {which} names
                paths = legacy.article_files(directory, pattern)
            else:
                paths = find_shards(directory, pattern, name, self.config.seq_len, self.config.vocab_path)
            self.splits[name] = ShardSplit(paths, self.rules, self.order, self.config.share_of(name))
        return self.splits[name]

    def check(self, splits: tuple[str, ...]):
        """Each split's headers were checked when it opened; its first batch is read too."""
        for name in splits:
            next(self.split(name).fixed_batches(1), None)

    def train_examples(self) -> int:
        """The samples of one pass over the training split: its first epoch's files, their kept share."""
        return self.split("train").plan(0).total

    def train_batches(self, position: dict | None):
        return self.split("train").batches(position)

    def fixed_batches(self, split: str, count: int | None) -> Iterator[dict]:
        return self.split(split).fixed_batches(count)


class CorpusTask:
    """What the tasks trained on the prepared shards share (task.Task's data side): their data, a
    loss to lower, and every split's targets in the data itself (tokens, or the teacher's), so no
    labels to keep from a checkpoint and nothing to submit."""
    best_metric = "loss"
    last_layer_share = 1.0  # every token's state is read (an MLM's masked slots alone: MaskedLMTask)
    masker = None  # a task that masks as it trains (mlm, electra, distill's predictions): its Masker

    def __init__(self, config, vocab, device, data: LanguageModelData):
        self.config = config
        self.vocab = vocab
        self.device = device
        self.data = data
        self.data_source = data.source

    def check_data(self, splits: tuple[str, ...]):
        self.data.check(splits)

    def train_examples(self) -> int:
        return self.data.train_examples()

    def take_checkpoint_labels(self, names: tuple[str, ...], kept: bool):
        pass  # the targets are in the data: no label names

    @property
    def random_generator(self):
        """The masker's generator (task.Task's random_generator): its draws go on where a checkpoint left them."""
        return None if self.masker is None else self.masker.generator

    def progress_metrics(self) -> dict[str, float]:
        return {} if self.masker is None else self.masker.progress_metrics()

    def submission(self, model, split: str, autocast) -> None:
        return None  # every split has its targets

    def labels_known(self, split: str) -> bool:
        return True

    def train_batches(self, position: dict | None):
        return self.data.train_batches(position)

    def evaluate(self, model, batches, autocast) -> dict:
        return evaluate_by_sums(self, model, batches, autocast)

    def eval_batches(self, split: str, count: int | None):
        """The split's fixed batches on the device (a task that masks makes its own)."""
        for batch in self.data.fixed_batches(split, count):
            yield to_device(batch, self.device, non_blocking=False)
