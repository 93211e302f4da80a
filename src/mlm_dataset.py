"""MLM batches from precached shards: seeded order per epoch, train shards round-robin by epoch.

A batch is a dict of numpy arrays padded to seq-len. Static shards bring their stored masks;
unmasked shards leave masking to the trainer, on the device, fresh each epoch.
"""
from pathlib import Path
from typing import Iterator

import numpy as np
import torch

from errors import UserError
from masking import IGNORE_INDEX, MaskingRule, mask_tokens, predictions_per_sequence
from model import BertForMaskedLM, ModelConfig
from shards import Shard, find_shards, read_shard
from trainer import check_architecture, to_device


def gather_padded(values: np.ndarray, offsets: np.ndarray, rows: np.ndarray, width: int,
                  fill: int) -> tuple[np.ndarray, np.ndarray]:
    """Rows of a ragged array (values split at offsets) as a [len(rows), width] int64 array.

    Returns the array and a bool array, True where a row had a value.
    """
    starts = offsets[rows]
    lengths = offsets[rows + 1] - starts
    columns = np.arange(width)
    present = columns < lengths[:, None]
    index = np.where(present, starts[:, None] + columns, 0)
    gathered = values[index].astype(np.int64) if len(values) else np.zeros(index.shape, np.int64)
    return np.where(present, gathered, fill), present


def make_batch(shard: Shard, rows: np.ndarray, seq_len: int, pad_id: int, mask_rate: float) -> dict:
    """Samples `rows` of a shard, padded to seq_len; with stored masks when the shard has them."""
    input_ids, real = gather_padded(shard.tokens, shard.offsets, rows, seq_len, pad_id)
    batch = {"input_ids": input_ids, "attention_mask": None if real.all() else real}
    if shard.mask_offsets is not None:
        counts = shard.mask_offsets[rows + 1] - shard.mask_offsets[rows]
        slots = max(predictions_per_sequence(seq_len, mask_rate), int(counts.max(initial=0)))
        batch["positions"], _ = gather_padded(shard.mask_positions, shard.mask_offsets, rows, slots, 0)
        batch["labels"], _ = gather_padded(shard.mask_labels, shard.mask_offsets, rows, slots, IGNORE_INDEX)
    return batch


class MaskedLMData:
    """Batches of one split, each rank reading its own disjoint part of every shard."""

    def __init__(self, paths: list[Path], expect: dict, seq_len: int, batch_size: int, pad_id: int,
                 mask_rate: float, seed: int, rank: int = 0, world_size: int = 1):
        self.paths = paths
        self.expect = expect
        self.seq_len = seq_len
        self.batch_size = batch_size
        self.pad_id = pad_id
        self.mask_rate = mask_rate
        self.seed = seed
        self.rank = rank
        self.world_size = world_size
        self._loaded: tuple[Path, Shard] | None = None

    def shard_for_epoch(self, epoch: int) -> Shard:
        """Shards take turns by epoch (static masking with K copies: a new mask each epoch)."""
        path = self.paths[epoch % len(self.paths)]
        if self._loaded is None or self._loaded[0] != path:
            self._loaded = None  # free the old shard before reading the next
            shard = read_shard(path, self.expect)
            if shard.seq_len > self.seq_len:
                raise UserError(f"{path}: samples of {shard.seq_len} tokens do not fit seq-len {self.seq_len}")
            if len(shard) < self.batch_size * self.world_size:
                raise UserError(f"{path}: {len(shard)} samples are fewer than one batch "
                                f"(batch-size {self.batch_size} x {self.world_size} processes)")
            self._loaded = (path, shard)
        return self._loaded[1]

    def epoch_order(self, epoch: int, samples: int) -> np.ndarray:
        """This rank's samples for an epoch: a seeded permutation, dealt out across ranks."""
        order = np.random.default_rng([self.seed, epoch]).permutation(samples)
        usable = samples // self.world_size * self.world_size  # every rank gets as many batches
        return order[:usable][self.rank::self.world_size]

    def batches(self, position: dict | None) -> Iterator[tuple[dict, dict]]:
        """Endless batches from `position` on; each comes with the position after it.

        A position is {"epoch": e, "batch": b}, the next batch to read; checkpoints keep it.
        """
        epoch, start = (position["epoch"], position["batch"]) if position else (0, 0)
        while True:
            shard = self.shard_for_epoch(epoch)
            order = self.epoch_order(epoch, len(shard))
            count = len(order) // self.batch_size
            for index in range(start, count):
                rows = order[index * self.batch_size:(index + 1) * self.batch_size]
                batch = make_batch(shard, rows, self.seq_len, self.pad_id, self.mask_rate)
                after = {"epoch": epoch, "batch": index + 1} if index + 1 < count else {"epoch": epoch + 1, "batch": 0}
                yield after, batch
            epoch, start = epoch + 1, 0

    def fixed_batches(self, count: int | None) -> Iterator[dict]:
        """The same first `count` batches every time (all of them for None): for evaluation."""
        shard = self.shard_for_epoch(0)
        order = self.epoch_order(0, len(shard))
        available = len(order) // self.batch_size
        for index in range(available if count is None else min(count, available)):
            rows = order[index * self.batch_size:(index + 1) * self.batch_size]
            yield make_batch(shard, rows, self.seq_len, self.pad_id, self.mask_rate)


class MaskedLMTask:
    """MLM pre-training as the trainer sees it: model, batches, loss, and a look at predictions."""
    name = "mlm"
    best_metric = "loss"
    lower_is_better = True

    def __init__(self, config, vocab, device: torch.device, rank: int = 0, world_size: int = 1):
        self.config = config
        self.vocab = vocab
        self.device = device
        self.rule = MaskingRule(mask_rate=config.mask_rate)
        self.special_ids = torch.tensor(vocab.special_ids, device=device)
        self.expect = {"seq_len": config.seq_len, "vocab_size": vocab.size, "vocab_checksum": vocab.checksum}
        self.patterns = {"train": config.dataset_pattern, "val": config.val_dataset_pattern,
                         "test": config.test_dataset_pattern}
        self.rank, self.world_size = rank, world_size
        self.splits: dict[str, MaskedLMData] = {}
        self.data("train")  # fail early on a missing train split

    @property
    def predictions_per_token(self) -> float:
        return predictions_per_sequence(self.config.seq_len, self.config.mask_rate) / self.config.seq_len

    def data(self, split: str) -> MaskedLMData:
        if split not in self.splits:
            config = self.config
            paths = find_shards(Path(config.datasets_dir), self.patterns[split])
            self.splits[split] = MaskedLMData(paths, self.expect, config.seq_len, config.batch_size,
                                              self.vocab.pad_id, config.mask_rate, config.seed,
                                              self.rank, self.world_size)
        return self.splits[split]

    def model_config(self) -> ModelConfig:
        config = self.config
        return ModelConfig(vocab_size=self.vocab.size, max_len=config.seq_len, d_model=config.d_model,
                           heads=config.heads, n_layer=config.n_layer, d_ff=config.feed_forward_size,
                           dropout=config.dropout, pad_id=self.vocab.pad_id, num_labels=config.num_labels)

    def build_model(self) -> BertForMaskedLM:
        return BertForMaskedLM(self.model_config())

    def load_weights(self, model, checkpoint: dict, path: Path, resuming: bool):
        if checkpoint.get("vocab_checksum") != self.vocab.checksum:
            raise UserError(f"{path}: made with another vocabulary than {self.vocab.path} (checksum differs)")
        check_architecture(path, checkpoint["model_config"], model.config)
        if checkpoint["task"] != self.name:
            raise UserError(f"{path}: a {checkpoint['task']} checkpoint; MLM pre-training resumes "
                            f"from an mlm checkpoint")
        model.load_state_dict(checkpoint["model"])

    def train_batches(self, position: dict | None):
        return self.data("train").batches(position)

    def eval_batches(self, split: str, count: int | None):
        """Fixed batches, masked the same way at every evaluation, so scores compare."""
        generator = torch.Generator(device=self.device)
        generator.manual_seed(self.config.seed)
        for batch in self.data(split).fixed_batches(count):
            batch = to_device(batch, self.device, non_blocking=False)
            if "positions" not in batch:
                batch.update(self.mask(batch["input_ids"], generator))
            yield batch

    def mask(self, input_ids: torch.Tensor, generator: torch.Generator) -> dict:
        inputs, positions, labels = mask_tokens(input_ids, self.special_ids, self.vocab.mask_id,
                                                self.vocab.size, self.rule, generator)
        return {"input_ids": inputs, "positions": positions, "labels": labels}

    def loss(self, model, batch: dict, training: bool, generator: torch.Generator | None = None):
        """Mean loss over masked positions, and (hits, count) for accuracy; no host sync."""
        if "positions" not in batch:
            batch = {**batch, **self.mask(batch["input_ids"], generator)}
        logits, loss = model(batch["input_ids"], batch["positions"], batch["labels"],
                             attention_mask=batch["attention_mask"])
        scored = batch["labels"] != IGNORE_INDEX
        hits = ((logits.argmax(-1) == batch["labels"]) & scored).sum()
        return loss, hits, scored.sum()

    @torch.no_grad()
    def show_predictions(self, model, autocast) -> str:
        """The first validation sample with predictions /between slashes/, then the original."""
        batch = next(self.eval_batches("val", 1))
        batch = {name: value[:1] if value is not None else None for name, value in batch.items()}
        model.eval()
        with autocast:
            logits, _ = model(batch["input_ids"], batch["positions"], attention_mask=batch["attention_mask"])
        model.train()
        scored = (batch["labels"][0] != IGNORE_INDEX).tolist()
        positions = batch["positions"][0].tolist()
        predicted = dict((p, t) for p, t, s in zip(positions, logits[0].argmax(-1).tolist(), scored) if s)
        original = dict((p, t) for p, t, s in zip(positions, batch["labels"][0].tolist(), scored) if s)
        ids = batch["input_ids"][0].tolist()
        return (f"predicted: {self.render(ids, predicted)}\n"
                f"original:  {self.render(ids, original)}")

    def render(self, ids: list[int], at_masks: dict[int, int]) -> str:
        """Tokens as text, word pieces joined, masked positions shown as /token/."""
        words = []
        for position, token_id in enumerate(ids):
            if token_id == self.vocab.pad_id:
                break
            if position in at_masks:
                words.append(f"/{self.vocab.tokens[at_masks[position]]}/")
                continue
            token = self.vocab.tokens[token_id]
            if token.startswith("##") and words:
                words[-1] += token[2:]
            else:
                words.append(token)
        return " ".join(words)
