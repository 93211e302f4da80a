"""Distillation (task.Task, task-type = distill): MiniLMv2's self-attention relations (Wang et al.
2021) of one teacher layer taught to the student's last layer, on the MLM shards read unmasked; with
logit-weight, also the teacher's MLM predictions at masked tokens (DistilBERT's soft targets), both
sides then reading the masked input.

The teacher (a transformers or sentence-transformers directory, converted in memory by hf_import.py,
or a checkpoint of ours) runs beside the student, without gradients; the student is an encoder of
the run's architecture keys, so its checkpoint starts a fine-tuning as a pre-trained one does.
"""
import math
from pathlib import Path

import torch
from torch import nn

from config import model_config
from errors import UserError
from tasks.lm_data import DATA_KEYS, CorpusTask, LanguageModelData
from model import IGNORE_INDEX, Encoder, MaskedLMHead, ModelConfig, at_positions, init_weights, token_hits
from run_plan import Progress
from tasks.mlm_task import MASKING_KEYS, Masker, masked_share
from tasks.teacher import frozen, read_teacher

RELATIONS = ("query", "key", "value")  # SelfAttention.projections' order
# The Config fields that decide what the loss measures: a resumed run keeps them.
TEACHER_KEYS = ("teacher", "teacher_layer", "relation_heads", "logit_weight")


class RelationEncoder(nn.Module):
    """An encoder whose output is one layer's q, k and v before rotary positions: the student's (its
    last layer) or the teacher's; with an MLM head (BertForMaskedLM's weight names), also its
    predictions at the masked positions."""

    def __init__(self, config: ModelConfig, mlm_head: bool = False):
        super().__init__()
        self.config = config
        self.encoder = Encoder(config)
        self.head = MaskedLMHead(config, self.encoder.embeddings.token) if mlm_head else None
        self.apply(init_weights)
        if mlm_head:
            return
        last = self.encoder.layers[-1]
        # Without a head, what comes after the last layer's q, k and v learns nothing (MiniLMv2's
        # student neither): frozen, so that DistributedDataParallel waits for no gradient of it.
        after = [last.attention.out, last.feed_forward, last.feed_forward_norm, self.encoder.final_norm,
                 None if config.pre_norm else last.attention_norm]
        for module in filter(None, after):
            module.requires_grad_(False)

    def forward(self, input_ids, attention_mask=None, document_ids=None, layer: int = -1, positions=None):
        """[3, batch, heads, length, head_width]; layer counts from 0, -1 the last. With the head and
        the masked positions [batch, P]: (those, the logits at the positions [batch, P, vocab])."""
        index = layer % self.config.n_layer
        if positions is None:
            return self.encoder.layer_projections(index, input_ids, attention_mask, document_ids)
        projections, hidden = self.encoder.layer_projections(index, input_ids, attention_mask, document_ids,
                                                             with_output=True)
        return projections, self.head(at_positions(hidden, positions))


def relations(states: torch.Tensor, visible: torch.Tensor, relation_heads: int) -> torch.Tensor:
    """Log-probabilities [batch, relation heads, queries, keys] of softmax(A Aᵀ / sqrt(width / R)) in
    fp32: states [batch, heads, length, head_width] joined into [batch, length, width] and re-split
    into R = relation_heads; a key a query may not see (visible [batch, queries, keys] False) gets none."""
    batch, heads, length, head_width = states.shape
    width = heads * head_width // relation_heads
    with torch.autocast(states.device.type, enabled=False):  # a KL of bf16 probabilities is mostly rounding
        split = states.float().transpose(1, 2).reshape(batch, length, relation_heads, width).transpose(1, 2)
        scores = split @ split.transpose(-1, -2) / math.sqrt(width)
        # A finite floor, not -inf: a hidden key's KL term is then 0 x 0 rather than nan.
        return scores.masked_fill(~visible[:, None], torch.finfo(scores.dtype).min).log_softmax(-1)


def relation_losses(teacher: torch.Tensor, student: torch.Tensor, visible: torch.Tensor, real: torch.Tensor,
                    relation_heads: int) -> torch.Tensor:
    """[3]: KL(teacher's relation || student's) for q-q, k-k and v-v (teacher and student stacked as
    SelfAttention.projections gives them), each summed over keys and averaged over the real query
    positions (real [batch, length]) and the relation heads."""
    weights = real[:, None, :].float() / (real.sum() * relation_heads)
    losses = []
    for taught, learning in zip(teacher, student):
        target, predicted = relations(taught, visible, relation_heads), relations(learning, visible, relation_heads)
        losses.append(((target.exp() * (target - predicted)).sum(-1) * weights).sum())
    return torch.stack(losses)


def prediction_kl(teacher: torch.Tensor, student: torch.Tensor, labelled: torch.Tensor) -> torch.Tensor:
    """KL(teacher's predictions || student's) at the masked slots (labelled [batch, P]), in fp32, summed
    over the vocabulary and averaged over the labelled slots."""
    with torch.autocast(teacher.device.type, enabled=False):
        target, predicted = teacher.float().log_softmax(-1), student.float().log_softmax(-1)
        per_slot = (target.exp() * (target - predicted)).sum(-1)
        return (per_slot * labelled).sum() / labelled.sum().clamp_min(1)


def visibility(real: torch.Tensor, document_ids: torch.Tensor | None) -> torch.Tensor:
    """[batch, queries, keys]: the keys a query's relations cover, as its attention sees them: the
    real ones, of its own document where documents are packed apart."""
    visible = real[:, None, :].expand(-1, real.shape[1], -1)
    if document_ids is not None:
        visible = visible & (document_ids[:, :, None] == document_ids[:, None, :])
    return visible


def check_relation_heads(relation_heads: int, teacher: ModelConfig, student: ModelConfig):
    for side, width in (("teacher's width", teacher.d_model), ("student's d-model", student.d_model)):
        if width % relation_heads:
            raise UserError(f"relation-heads = {relation_heads} does not divide the {side} ({width})")


class DistillationTask(CorpusTask):
    name = "distill"

    def __init__(self, config, vocab, device: torch.device, rank: int = 0, world_size: int = 1):
        # no masking rule in the data: the unmasked ids, masked here where the predictions are taught
        super().__init__(config, vocab, device, LanguageModelData(config, vocab, rank, world_size))
        self.teaches_predictions = config.logit_weight > 0
        self.masker = Masker(config, vocab, device, rank) if self.teaches_predictions else None
        self.measuring_keys = (*DATA_KEYS, *TEACHER_KEYS, *(MASKING_KEYS if self.teaches_predictions else ()))
        # the student's MLM head scores the masked slots; without one the loss reads the last layer's projections
        self.predictions_per_token = masked_share(config) if self.teaches_predictions else 0.0
        self.teacher = self.load_teacher(Path(config.teacher), device)
        self.teacher_layer = (config.teacher_layer or self.teacher.config.n_layer) - 1
        if self.teacher_layer >= self.teacher.config.n_layer:
            raise UserError(f"teacher-layer = {config.teacher_layer}: teacher = {config.teacher} has "
                            f"{self.teacher.config.n_layer} layers")
        self.relation_heads = config.relation_heads or self.teacher.config.heads
        check_relation_heads(self.relation_heads, self.teacher.config, self.model_config())

    def load_teacher(self, path: Path, device: torch.device) -> RelationEncoder:
        state, teacher_config = read_teacher(path, self.vocab, self.config.seq_len)
        if self.teaches_predictions and "head.bias" not in state["model"]:
            raise UserError(f"logit-weight = {self.config.logit_weight:g}: teacher = {path} has no MLM head "
                            f"(a task-type = {state['task']} model); give a BertForMaskedLM directory or an mlm "
                            f"checkpoint, or logit-weight = 0")
        return frozen(RelationEncoder(teacher_config, self.teaches_predictions), state, path, device)

    def model_config(self, max_len: int | None = None) -> ModelConfig:
        return model_config(self.config, self.vocab, max_len)

    def build_model(self, max_len: int | None = None) -> RelationEncoder:
        return RelationEncoder(self.model_config(max_len), self.teaches_predictions)

    def eval_batches(self, split: str, count: int | None):
        if not self.teaches_predictions:
            return super().eval_batches(split, count)
        return self.masker.eval_batches(self.data, split, count, self.config.seed, self.device)

    def loss(self, model, batch: dict, progress: Progress | None = None):
        """The q-q, k-k and v-v KLs summed (plus logit-weight x the predictions' KL), and [real query
        positions, each KL times them] (then [masked slots, the predictions' KL times them, the
        student's right predictions]); no host sync."""
        if self.teaches_predictions:
            batch = self.masker.masked(batch, progress)
        input_ids, mask, documents = batch["input_ids"], batch["attention_mask"], batch.get("document_ids")
        positions = batch["positions"] if self.teaches_predictions else None
        real = torch.ones_like(input_ids, dtype=torch.bool) if mask is None else mask
        with torch.no_grad():
            teacher = self.teacher(input_ids, mask, documents, layer=self.teacher_layer, positions=positions)
        student = model(input_ids, mask, documents, positions=positions)
        if self.teaches_predictions:
            (teacher, teacher_logits), (student, student_logits) = teacher, student
        losses = relation_losses(teacher, student, visibility(real, documents), real, self.relation_heads)
        count = real.sum().float()
        statistics = torch.cat([count[None], losses.detach() * count])
        if not self.teaches_predictions:
            return losses.sum(), statistics
        labelled = batch["labels"] != IGNORE_INDEX
        kl, slots = prediction_kl(teacher_logits, student_logits, labelled), labelled.sum().float()
        hits = token_hits(student_logits, batch["labels"]).float()
        return losses.sum() + self.config.logit_weight * kl, torch.cat([statistics, torch.stack(
            [slots, kl.detach() * slots, hits])])

    def metrics(self, loss: float, statistics: torch.Tensor) -> dict:
        count, *sums = statistics.tolist()
        metrics = {"loss": loss} | {f"{name}_kl": total / count for name, total in zip(RELATIONS, sums)}
        if len(sums) > len(RELATIONS):
            slots, kl, hits = sums[len(RELATIONS):]
            metrics |= {"logit_kl": kl / slots, "accuracy": hits / slots}
        return metrics

    @torch.no_grad()
    def show_predictions(self, model, autocast) -> str:
        """Each KL on the first validation batch: which one the student learns slowest. On this rank
        alone (rank 0 shows it): no all-reduce."""
        model.eval()
        with autocast:
            loss, statistics = self.loss(model, next(self.eval_batches("val", 1)))
        model.train()
        metrics = self.metrics(loss.item(), statistics.cpu())
        kls = ", ".join(f"{name}-{name} {metrics[f'{name}_kl']:.4f}" for name in RELATIONS)
        if self.teaches_predictions:
            kls += f", predictions {metrics['logit_kl']:.4f} (the student's accuracy {metrics['accuracy']:.1%})"
        return (f"teacher layer {self.teacher_layer + 1} -> student layer {self.config.n_layer}, "
                f"{self.relation_heads} relation heads; KL on one validation batch: {kls}")
