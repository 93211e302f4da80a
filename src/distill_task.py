"""Distillation (task.Task, task-type = distill): MiniLMv2's self-attention relations (Wang et al.
2021) of one teacher layer taught to the student's last layer, on the MLM shards read unmasked.

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
from lm_data import DATA_KEYS, CorpusTask, LanguageModelData
from model import Encoder, ModelConfig, init_weights
from teacher import load_teacher

RELATIONS = ("query", "key", "value")  # SelfAttention.projections' order
# The Config fields that decide what the loss measures: a resumed run keeps them.
TEACHER_KEYS = ("teacher", "teacher_layer", "relation_heads")


class RelationEncoder(nn.Module):
    """An encoder whose output is one layer's q, k and v before rotary positions: the student's (its
    last layer) or the teacher's. Its weights are the encoder's alone."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        self.encoder = Encoder(config)
        self.apply(init_weights)
        last = self.encoder.layers[-1]
        # What comes after the last layer's q, k and v learns nothing (MiniLMv2's student neither):
        # frozen, so that DistributedDataParallel waits for no gradient of it.
        after = [last.attention.out, last.feed_forward, last.feed_forward_norm, self.encoder.final_norm,
                 None if config.pre_norm else last.attention_norm]
        for module in filter(None, after):
            module.requires_grad_(False)

    def forward(self, input_ids, attention_mask=None, document_ids=None, layer: int = -1) -> torch.Tensor:
        """[3, batch, heads, length, head_width]; layer counts from 0, -1 the last."""
        return self.encoder.layer_projections(layer % self.config.n_layer, input_ids, attention_mask, document_ids)


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
    predictions_per_token = 0.0  # no output head: the loss reads the last layer's projections
    measuring_keys = (*DATA_KEYS, *TEACHER_KEYS)

    def __init__(self, config, vocab, device: torch.device, rank: int = 0, world_size: int = 1):
        # no masking rule: the unmasked ids
        super().__init__(config, vocab, device, LanguageModelData(config, vocab, rank, world_size))
        self.teacher = load_teacher(Path(config.teacher), vocab, config.seq_len, device, RelationEncoder)
        self.teacher_layer = (config.teacher_layer or self.teacher.config.n_layer) - 1
        if self.teacher_layer >= self.teacher.config.n_layer:
            raise UserError(f"teacher-layer = {config.teacher_layer}: teacher = {config.teacher} has "
                            f"{self.teacher.config.n_layer} layers")
        self.relation_heads = config.relation_heads or self.teacher.config.heads
        check_relation_heads(self.relation_heads, self.teacher.config, self.model_config())

    def model_config(self, max_len: int | None = None) -> ModelConfig:
        return model_config(self.config, self.vocab, max_len)

    def build_model(self, max_len: int | None = None) -> RelationEncoder:
        return RelationEncoder(self.model_config(max_len))

    def loss(self, model, batch: dict, generator: torch.Generator | None = None, mask_rate: float | None = None):
        """The q-q, k-k and v-v KLs summed, and [real query positions, each KL times them]; no host sync."""
        input_ids, mask, documents = batch["input_ids"], batch["attention_mask"], batch.get("document_ids")
        real = torch.ones_like(input_ids, dtype=torch.bool) if mask is None else mask
        with torch.no_grad():
            teacher = self.teacher(input_ids, mask, documents, layer=self.teacher_layer)
        student = model(input_ids, mask, documents)
        losses = relation_losses(teacher, student, visibility(real, documents), real, self.relation_heads)
        count = real.sum().float()
        return losses.sum(), torch.cat([count[None], losses.detach() * count])

    def metrics(self, loss: float, statistics: torch.Tensor) -> dict:
        count, *sums = statistics.tolist()
        return {"loss": loss} | {f"{name}_kl": total / count for name, total in zip(RELATIONS, sums)}

    @torch.no_grad()
    def show_predictions(self, model, autocast) -> str:
        """Each relation's KL on the first validation batch: which one the student learns slowest. On
        this rank alone (rank 0 shows it): no all-reduce."""
        model.eval()
        with autocast:
            _, statistics = self.loss(model, next(self.eval_batches("val", 1)))
        model.train()
        count, *sums = statistics.tolist()
        kls = ", ".join(f"{name}-{name} {total / count:.4f}" for name, total in zip(RELATIONS, sums))
        return (f"teacher layer {self.teacher_layer + 1} -> student layer {self.config.n_layer}, "
                f"{self.relation_heads} relation heads; KL on one validation batch: {kls}")
