"""Masked language modelling (task.Task): the shards of lm_data.py, masked as masking.py says,
the loss at the masked positions, and a look at the predictions. With sentence-objective nsp or
sop, the model also classifies each sentence pair from the pooled [CLS].

Masker is shared with the ELECTRA task, which masks the same way.
"""
import dataclasses

import torch

from config import model_config
from hardware import to_device
from tasks.lm_data import DATA_KEYS, CorpusTask, LanguageModelData
from masking import MaskingRule, mask_tokens, predictions_per_sequence
from model import IGNORE_INDEX, BertForMaskedLM, BertForPreTraining, ModelConfig, token_hits
from run_plan import Progress, mask_rate

PAIR_LABEL_NAMES = {"nsp": ("next", "random"), "sop": ("in order", "swapped")}
# The Config fields that decide how tokens are masked: a resumed run keeps them.
MASKING_KEYS = ("masking", *(field.name for field in dataclasses.fields(MaskingRule)))


class Masker:
    """Masks device batches by the config's MaskingRule: a training batch at its step's mask rate
    (mask-rate's schedule over the run's course), with this rank's own generator, which the run's
    checkpoints keep (random_generator); evaluation batches at the schedule's end with a fixed seed, so
    that validations compare. A batch with stored masks (masking = static) passes."""

    def __init__(self, config, vocab, device: torch.device, rank: int = 0):
        self.config = config
        self.rule = MaskingRule.from_config(config)  # at the schedule's highest rate, which sizes the slots
        self.evaluation_rate = config.mask_rate.end
        self.step_rate = self.rule.mask_rate  # of the last training batch masked here
        self.generator = torch.Generator(device=device).manual_seed(config.seed + 1000 + rank)
        self.vocab = vocab
        self.special_ids = torch.tensor(vocab.special_ids, device=device)
        self.is_continuation = torch.from_numpy(vocab.is_continuation).to(device)

    def with_masks(self, batch: dict, generator: torch.Generator, rate: float) -> dict:
        """The batch with masks drawn at `rate`, the unmasked ids kept as original_ids; a batch with
        stored masks (masking = static) as it is."""
        if "positions" in batch:
            return batch
        input_ids = batch["input_ids"]
        slots = predictions_per_sequence(input_ids.shape[1], self.rule.mask_rate)
        inputs, positions, labels = mask_tokens(input_ids, self.special_ids, self.vocab.mask_id, self.vocab.size,
                                                dataclasses.replace(self.rule, mask_rate=rate), generator,
                                                self.is_continuation, slots)
        return {**batch, "original_ids": input_ids, "input_ids": inputs, "positions": positions, "labels": labels}

    def masked(self, batch: dict, progress: Progress | None) -> dict:
        """A training batch (progress: its step's place in the run) masked at the step's rate; a batch
        masked already (evaluation's, by eval_batches; stored masks) as it is."""
        if progress is not None:
            self.step_rate = mask_rate(progress.step, progress.budget_share, self.config)
        return self.with_masks(batch, self.generator, self.step_rate)

    def progress_metrics(self) -> dict[str, float]:
        """The last training step's mask rate, where mask-rate falls along the run."""
        return {"mask_rate": self.step_rate} if self.config.mask_rate.falls else {}

    def eval_batches(self, data: LanguageModelData, split: str, count: int | None, seed: int, device):
        """Fixed batches, masked the same way at every evaluation, so scores compare."""
        generator = torch.Generator(device=device)
        generator.manual_seed(seed)
        for batch in data.fixed_batches(split, count):
            yield self.with_masks(to_device(batch, device, non_blocking=False), generator, self.evaluation_rate)


def token_statistics(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """[labelled tokens, correctly predicted ones]; no host sync."""
    return torch.stack([(labels != IGNORE_INDEX).sum(), token_hits(logits, labels)])


def masked_share(config) -> float:
    """The share of the input tokens an MLM head scores: its slots per sequence."""
    return predictions_per_sequence(config.seq_len, MaskingRule.from_config(config).mask_rate) / config.seq_len


def first_sample(batches) -> dict:
    return {name: value[:1] if value is not None else None for name, value in next(batches).items()}


class MaskedLMTask(CorpusTask):
    name = "mlm"
    measuring_keys = (*DATA_KEYS, *MASKING_KEYS)

    def __init__(self, config, vocab, device: torch.device, rank: int = 0, world_size: int = 1):
        self.objective = config.sentence_objective
        self.masker = Masker(config, vocab, device, rank)
        super().__init__(config, vocab, device, LanguageModelData(
            config, vocab, rank, world_size, static_rule=self.masker.rule if config.masking == "static" else None,
            pairs=None if self.objective == "none" else self.objective))
        self.predictions_per_token = masked_share(config)
        # the last layer computes the masked slots, and [CLS] for a sentence objective
        self.last_layer_share = self.predictions_per_token + (self.objective != "none") / config.seq_len
        if self.objective != "none":
            self.data.check(("train",))  # fail early on shards without the sentence pairs

    def model_config(self, max_len: int | None = None) -> ModelConfig:
        """BERT's encoder and MLM head; with NSP or SOP, the two-class sentence head too."""
        return model_config(self.config, self.vocab, max_len, sentence_classes=0 if self.objective == "none" else 2)

    def build_model(self, max_len: int | None = None) -> BertForMaskedLM:
        model = BertForMaskedLM if self.objective == "none" else BertForPreTraining
        return model(self.model_config(max_len))

    def eval_batches(self, split: str, count: int | None):
        return self.masker.eval_batches(self.data, split, count, self.config.seed, self.device)

    def loss(self, model, batch: dict, progress: Progress | None = None):
        """Mean loss over masked positions (plus the sentence loss), and [count, hits] for accuracy
        (then [pairs, pair hits]); no host sync."""
        batch = self.masker.masked(batch, progress)
        if self.objective != "none":
            return self.pair_loss(model, batch)
        logits, loss = model(batch["input_ids"], batch["positions"], batch["labels"],
                             attention_mask=batch["attention_mask"], segment_ids=batch.get("segment_ids"),
                             document_ids=batch.get("document_ids"))
        return loss, token_statistics(logits, batch["labels"])

    def pair_loss(self, model, batch: dict):
        logits, sentence_logits, loss = model(
            batch["input_ids"], batch["positions"], batch["labels"], attention_mask=batch["attention_mask"],
            segment_ids=batch["segment_ids"], sentence_labels=batch["sentence_labels"])
        labels = batch["sentence_labels"]
        sentence_hits = (sentence_logits.argmax(-1) == labels).sum()
        pairs = torch.full_like(sentence_hits, labels.numel())
        return loss, torch.cat([token_statistics(logits, batch["labels"]), torch.stack([pairs, sentence_hits])])

    def metrics(self, loss: float, statistics: torch.Tensor) -> dict:
        count, hits, *pairs = statistics.tolist()
        metrics = {"loss": loss, "accuracy": hits / count}
        if pairs:
            metrics["sentence_accuracy"] = pairs[1] / pairs[0]
        return metrics

    @torch.no_grad()
    def show_predictions(self, model, autocast) -> str:
        """The first validation sample with predictions /between slashes/, then the original."""
        batch = first_sample(self.eval_batches("val", 1))
        model.eval()
        with autocast:
            outputs = model(batch["input_ids"], batch["positions"], attention_mask=batch["attention_mask"],
                            segment_ids=batch.get("segment_ids"), document_ids=batch.get("document_ids"))
        model.train()
        scored = (batch["labels"][0] != IGNORE_INDEX).tolist()
        positions = batch["positions"][0].tolist()
        predicted = {p: t for p, t, s in zip(positions, outputs[0][0].argmax(-1).tolist(), scored) if s}
        original = {p: t for p, t, s in zip(positions, batch["labels"][0].tolist(), scored) if s}
        ids = batch["input_ids"][0].tolist()
        shown = (f"predicted: {self.vocab.render(ids, predicted)}\n"
                 f"original:  {self.vocab.render(ids, original)}")
        if self.objective != "none":
            names = PAIR_LABEL_NAMES[self.objective]
            shown += (f"\nsentence pair: predicted {names[outputs[1][0].argmax().item()]}, "
                      f"actual {names[batch['sentence_labels'][0].item()]}")
        return shown
