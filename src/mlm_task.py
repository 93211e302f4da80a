"""The masked and causal language-modelling tasks (trainer.Task): batches from precached shards
in a seeded order per epoch, train shards round-robin by epoch, the loss and a look at predictions.

A batch is a dict of numpy arrays padded to seq-len. With masking = static the shards bring their
stored masks; with masking = dynamic the trainer masks each batch on the device, fresh each epoch.
Shards of sentence pairs add segment ids and pair labels, for next-sentence or sentence-order
prediction.
"""
import dataclasses
from pathlib import Path
from typing import Iterator

import numpy as np
import torch

from article_arrays import ArticleFiles, find_article_files, read_articles
from batching import BatchOrder, gather_padded, kept_rows
from config import ini_text
from errors import UserError
from hardware import to_device
from masking import IGNORE_INDEX, MaskingRule, mask_tokens, predictions_per_sequence
from model import BertForCausalLM, BertForMaskedLM, BertForPreTraining, model_config, token_hits
from sentence_pairs import segment_ids
from shards import MASKING_FIELDS, Shard, find_shards, read_shard

PAIR_LABEL_NAMES = {"nsp": ("next", "random"), "sop": ("in order", "swapped")}

def masking_rule(config) -> MaskingRule:
    return MaskingRule(mask_rate=config.mask_rate, replace_with_mask=config.mask_replace_mask,
                       replace_with_random=config.mask_replace_random, whole_word=config.whole_word_masking)


def with_masking(shard: Shard, masking: str, rule: MaskingRule) -> Shard:
    """The shard as the config's `masking` uses it.

    static: the stored masks, which must have been made as the config says (checked where the
    header records it; legacy shards do not). dynamic: the original ids, which
    a static shard keeps too (its inputs with the labels put back), to be masked afresh.
    """
    if masking == "dynamic":
        if shard.masking == "none":
            return shard
        return dataclasses.replace(shard, header=shard.header | {"masking": "none"}, tokens=shard.unmasked_tokens(),
                                   mask_offsets=None, mask_positions=None, mask_labels=None)
    if shard.masking != "static":
        raise UserError(f"{shard.path}: the shard holds no masks but the config has masking = static "
                        f"(prepare it with --masking static, or set masking = dynamic)")
    configured = dict(zip(MASKING_FIELDS, (rule.mask_rate, rule.whole_word, rule.replace_with_mask,
                                           rule.replace_with_random)))
    for field, value in configured.items():
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


PATTERN_KEYS = {"train": "dataset_pattern", "val": "val_dataset_pattern", "test": "test_dataset_pattern"}


def split_pattern(config, split: str) -> str:
    """The split's file pattern; `{split}` in it stands for train, val or test, and a
    dataset-pattern with `{split}` serves the splits whose own pattern the config leaves out."""
    key = PATTERN_KEYS[split]
    if "{split}" in config.dataset_pattern and key not in config.given:
        key = "dataset_pattern"
    return getattr(config, key).replace("{split}", split)


class MaskedLMData:
    """Batches of one split; train shards take turns by epoch (K static copies: K masks)."""

    def __init__(self, paths: list[Path], expect: dict, seq_len: int, pad_id: int, sep_id: int, masking: str,
                 rule: MaskingRule, order: BatchOrder, pairs: str | None = None, share: float = 1.0):
        self.paths = paths
        self.expect = expect
        self.seq_len = seq_len
        self.pad_id = pad_id
        self.sep_id = sep_id
        self.pairs = pairs  # the sentence pairs the shards must hold; None: any
        self.masking = masking
        self.rule = rule
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
            shard = (read_articles(path, self.seq_len, self.expect["vocab_size"]) if isinstance(path, ArticleFiles)
                     else read_shard(path, self.expect))
            shard = with_masking(shard, self.masking, self.rule)
            if shard.seq_len > self.seq_len:
                raise UserError(f"{path}: samples of {shard.seq_len} tokens do not fit seq-len {self.seq_len}")
            if self.pairs is not None and shard.pairs != self.pairs:
                raise UserError(f"{path}: pairs is {shard.pairs} in the shard but sentence-objective = {self.pairs} "
                                f"(prepare_mlm_dataset.py --pairs {self.pairs})")
            if len(shard) and np.diff(shard.offsets).max() <= 2:
                raise UserError(f"{path}: no sample has room for a mask: every one is [CLS] [SEP] alone")
            kept = kept_rows(len(shard), self.share, self.order.seed)
            if len(kept) < self.order.batch_size * self.order.world_size:
                share = f" (the {self.share:g} share kept)" if self.share < 1 else ""
                raise UserError(f"{path}: {len(kept)} samples{share} are fewer than one batch "
                                f"(batch-size {self.order.batch_size} x {self.order.world_size} processes)")
            self._loaded = (path, shard, kept)
        return self._loaded

    def batches(self, position: dict | None) -> Iterator[tuple[dict, dict]]:
        return self.order.batches(
            position, lambda epoch: len(self.rows_for_epoch(epoch)),
            lambda epoch, rows: make_batch(self.shard_for_epoch(epoch), self.rows_for_epoch(epoch)[rows],
                                           self.seq_len, self.pad_id, self.sep_id, self.rule.mask_rate))

    def fixed_batches(self, count: int | None) -> Iterator[dict]:
        shard, kept = self.shard_for_epoch(0), self.rows_for_epoch(0)
        return self.order.fixed_batches(
            count, len(kept), lambda rows: make_batch(shard, kept[rows], self.seq_len, self.pad_id, self.sep_id,
                                                      self.rule.mask_rate))


class MaskedLMTask:
    """MLM pre-training as the trainer sees it: model, batches, loss, and a look at predictions.

    With sentence-objective nsp or sop, the model also classifies each sentence pair from the
    pooled [CLS]; shards of pairs train plain MLM too (their labels unused).
    """
    name = "mlm"
    best_metric = "loss"
    lower_is_better = True
    measuring_keys = ("seq-len", "dataset-pattern", "val-dataset-pattern", "dataset-percentage",
                      "val-dataset-percentage", "masking", "mask-rate", "whole-word-masking", "mask-replace-mask",
                      "mask-replace-random")

    def __init__(self, config, vocab, device: torch.device, rank: int = 0, world_size: int = 1):
        self.config = config
        self.vocab = vocab
        self.device = device
        self.rule = masking_rule(config)
        self.special_ids = torch.tensor(vocab.special_ids, device=device)
        self.is_continuation = torch.from_numpy(vocab.is_continuation).to(device)
        self.expect = {"seq_len": config.seq_len, "vocab_size": vocab.size, "vocab_checksum": vocab.checksum}
        self.patterns = {split: split_pattern(config, split) for split in ("train", "val", "test")}
        self.rank, self.world_size = rank, world_size
        self.objective = config.sentence_objective
        self.splits: dict[str, MaskedLMData] = {}
        self.data("train")  # fail early on a missing train split
        if self.objective != "none":
            self.data("train").shard_for_epoch(0)  # and on shards without the sentence pairs

    @property
    def predictions_per_token(self) -> float:
        return predictions_per_sequence(self.config.seq_len, self.config.mask_rate) / self.config.seq_len

    def data(self, split: str) -> MaskedLMData:
        if split not in self.splits:
            config = self.config
            pattern = self.patterns[split]
            paths = (find_article_files(config.datasets_path, pattern) if "{which}" in pattern
                     else find_shards(config.datasets_path, pattern))
            order = BatchOrder(config.batch_size, config.seed, self.rank, self.world_size)
            self.splits[split] = MaskedLMData(paths, self.expect, config.seq_len, self.vocab.pad_id,
                                              self.vocab.sep_id, config.masking, self.rule, order,
                                              None if self.objective == "none" else self.objective,
                                              config.share_of(split))
        return self.splits[split]

    def check_data(self, splits: tuple[str, ...]):
        for split in splits:
            self.data(split).shard_for_epoch(0)

    def build_model(self, max_len: int | None = None) -> BertForMaskedLM:
        model = BertForMaskedLM if self.objective == "none" else BertForPreTraining
        return model(model_config(self.config, self.vocab, max_len))

    def submission(self, model, split: str, autocast) -> None:
        return None  # every MLM split has its labels: the masked tokens

    def train_batches(self, position: dict | None):
        return self.data("train").batches(position)

    def eval_batches(self, split: str, count: int | None):
        """Fixed batches, masked the same way at every evaluation, so scores compare."""
        generator = torch.Generator(device=self.device)
        generator.manual_seed(self.config.seed)
        for batch in self.data(split).fixed_batches(count):
            yield self.masked(to_device(batch, self.device, non_blocking=False), generator)

    def masked(self, batch: dict, generator: torch.Generator) -> dict:
        """The batch with its masks: static shards bring them; otherwise fresh ones, the unmasked
        ids kept as original_ids."""
        if "positions" in batch:
            return batch
        return {**batch, "original_ids": batch["input_ids"], **self.mask(batch["input_ids"], generator)}

    def mask(self, input_ids: torch.Tensor, generator: torch.Generator) -> dict:
        inputs, positions, labels = mask_tokens(input_ids, self.special_ids, self.vocab.mask_id,
                                                self.vocab.size, self.rule, generator, self.is_continuation)
        return {"input_ids": inputs, "positions": positions, "labels": labels}

    def loss(self, model, batch: dict, generator: torch.Generator | None = None):
        """Mean loss over masked positions (plus the sentence loss), and [count, hits] for accuracy
        (then [pairs, pair hits]); no host sync."""
        batch = self.masked(batch, generator)
        if self.objective != "none":
            return self.pair_loss(model, batch)
        logits, loss = model(batch["input_ids"], batch["positions"], batch["labels"],
                             attention_mask=batch["attention_mask"], segment_ids=batch.get("segment_ids"))
        return loss, self.token_statistics(logits, batch["labels"])

    def pair_loss(self, model, batch: dict):
        logits, sentence_logits, loss = model(
            batch["input_ids"], batch["positions"], batch["labels"], attention_mask=batch["attention_mask"],
            segment_ids=batch["segment_ids"], sentence_labels=batch["sentence_labels"])
        labels = batch["sentence_labels"]
        sentence_hits = (sentence_logits.argmax(-1) == labels).sum()
        pairs = torch.full_like(sentence_hits, labels.numel())
        return loss, torch.cat([self.token_statistics(logits, batch["labels"]), torch.stack([pairs, sentence_hits])])

    @staticmethod
    def token_statistics(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """[labelled tokens, correctly predicted ones]."""
        return torch.stack([(labels != IGNORE_INDEX).sum(), token_hits(logits, labels)])

    def metrics(self, loss: float, statistics: torch.Tensor) -> dict:
        count, hits, *pairs = statistics.tolist()
        metrics = {"loss": loss, "accuracy": hits / count}
        if pairs:
            metrics["sentence_accuracy"] = pairs[1] / pairs[0]
        return metrics

    @torch.no_grad()
    def show_predictions(self, model, autocast) -> str:
        """The first validation sample with predictions /between slashes/, then the original."""
        batch = next(self.eval_batches("val", 1))
        batch = {name: value[:1] if value is not None else None for name, value in batch.items()}
        model.eval()
        with autocast:
            outputs = model(batch["input_ids"], batch["positions"], attention_mask=batch["attention_mask"],
                            segment_ids=batch.get("segment_ids"))
        model.train()
        logits = outputs[0]
        scored = (batch["labels"][0] != IGNORE_INDEX).tolist()
        positions = batch["positions"][0].tolist()
        predicted = dict((p, t) for p, t, s in zip(positions, logits[0].argmax(-1).tolist(), scored) if s)
        original = dict((p, t) for p, t, s in zip(positions, batch["labels"][0].tolist(), scored) if s)
        ids = batch["input_ids"][0].tolist()
        shown = (f"predicted: {self.render(ids, predicted)}\n"
                 f"original:  {self.render(ids, original)}")
        if self.objective != "none":
            names = PAIR_LABEL_NAMES[self.objective]
            shown += (f"\nsentence pair: predicted {names[outputs[1][0].argmax().item()]}, "
                      f"actual {names[batch['sentence_labels'][0].item()]}")
        return shown

    def render(self, ids: list[int], at_masks: dict[int, int]) -> str:
        """Tokens as text, word pieces joined, masked positions shown as /token/."""
        words = []
        for position, token_id in enumerate(ids):
            if token_id == self.vocab.pad_id:
                break
            if token_id == self.vocab.sep_id and ids[position + 1:position + 2] not in ([], [self.vocab.pad_id]):
                words.append("|")  # between the sentences of a pair
                continue
            if token_id in (self.vocab.cls_id, self.vocab.sep_id):
                continue
            if position in at_masks:
                words.append(f"/{self.vocab.tokens[at_masks[position]]}/")
                continue
            token = self.vocab.tokens[token_id]
            if token.startswith("##") and words:
                words[-1] += token[2:]
            else:
                words.append(token)
        return " ".join(words)


class CausalLMTask(MaskedLMTask):
    """Causal language modelling on the same shards (a static shard's original ids): the encoder
    with a causal mask, each position predicting the next token; loss and accuracy over every
    real next token."""
    name = "clm"
    predictions_per_token = 1.0  # the head scores every position

    def build_model(self, max_len: int | None = None) -> BertForCausalLM:
        return BertForCausalLM(model_config(self.config, self.vocab, max_len))

    def eval_batches(self, split: str, count: int | None):
        for batch in self.data(split).fixed_batches(count):
            yield to_device(batch, self.device, non_blocking=False)

    def next_tokens(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Labels: the token after each position; IGNORE_INDEX after the last and before padding."""
        following = torch.cat([input_ids[:, 1:], torch.full_like(input_ids[:, :1], self.vocab.pad_id)], dim=1)
        return following.masked_fill(following == self.vocab.pad_id, IGNORE_INDEX)

    def loss(self, model, batch: dict, generator: torch.Generator | None = None):
        labels = self.next_tokens(batch["input_ids"])
        logits, loss = model(batch["input_ids"], labels, attention_mask=batch["attention_mask"])
        return loss, self.token_statistics(logits, labels)

    @torch.no_grad()
    def show_predictions(self, model, autocast) -> str:
        """The first validation sample's opening, and the model's guess for each next token."""
        batch = next(self.eval_batches("val", 1))
        ids = batch["input_ids"][:1, :24]
        model.eval()
        with autocast:
            logits, _ = model(ids)
        model.train()
        guesses = [self.vocab.cls_id] + logits[0, :-1].argmax(-1).tolist()
        return (f"next-token guesses: {self.render(guesses, {})}\n"
                f"original:           {self.render(ids[0].tolist(), {})}")
