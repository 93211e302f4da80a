"""BERT as published: embeddings, post-LayerNorm encoder layers, MLM and classification heads.

One file, read top to bottom: Embeddings, SelfAttention, FeedForward, EncoderLayer, Encoder,
then the task models BertForMaskedLM and BertForSequenceClassification.
"""
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from masking import IGNORE_INDEX


@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int
    max_len: int = 512
    d_model: int = 768
    heads: int = 12
    n_layer: int = 12
    d_ff: int = 3072
    dropout: float = 0.1
    segments: int = 2  # token type vocabulary, as in BERT
    pad_id: int = 0
    num_labels: int = 2
    layer_norm_eps: float = 1e-12

    def __post_init__(self):
        if self.d_model % self.heads:
            raise ValueError(f"d_model {self.d_model} is not divisible by heads {self.heads}")


class Embeddings(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.token = nn.Embedding(config.vocab_size, config.d_model, padding_idx=config.pad_id)
        self.position = nn.Embedding(config.max_len, config.d_model)
        self.segment = nn.Embedding(config.segments, config.d_model)
        self.norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, input_ids, segment_ids=None):
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        x = self.token(input_ids) + self.position(positions)
        x = x + (self.segment.weight[0] if segment_ids is None else self.segment(segment_ids))
        return self.dropout(self.norm(x))


class SelfAttention(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.heads = config.heads
        self.qkv = nn.Linear(config.d_model, 3 * config.d_model)  # one matmul for q, k and v
        self.out = nn.Linear(config.d_model, config.d_model)
        self.dropout = config.dropout

    def forward(self, x, attention_mask=None):
        batch, length, width = x.shape
        q, k, v = self.qkv(x).view(batch, length, 3, self.heads, width // self.heads).permute(2, 0, 3, 1, 4)
        dropout = self.dropout if self.training else 0.0
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=attention_mask, dropout_p=dropout)
        return self.out(y.transpose(1, 2).reshape(batch, length, width))


class FeedForward(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.up = nn.Linear(config.d_model, config.d_ff)
        self.down = nn.Linear(config.d_ff, config.d_model)

    def forward(self, x):
        return self.down(F.gelu(self.up(x)))


class EncoderLayer(nn.Module):
    """Post-LayerNorm, as in the BERT paper: normalise after each residual sum."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.attention = SelfAttention(config)
        self.attention_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
        self.feed_forward = FeedForward(config)
        self.feed_forward_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x, attention_mask=None):
        x = self.attention_norm(x + self.dropout(self.attention(x, attention_mask)))
        return self.feed_forward_norm(x + self.dropout(self.feed_forward(x)))


class Encoder(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.embeddings = Embeddings(config)
        self.layers = nn.ModuleList(EncoderLayer(config) for _ in range(config.n_layer))

    def forward(self, input_ids, attention_mask=None, segment_ids=None):
        """attention_mask: bool [batch, length], True for real tokens; None when nothing is padded."""
        if attention_mask is not None:
            attention_mask = attention_mask[:, None, None, :]  # broadcast over heads and queries
        x = self.embeddings(input_ids, segment_ids)
        for layer in self.layers:
            x = layer(x, attention_mask)
        return x


def init_weights(module: nn.Module):
    """BERT's initialisation: normal(0, 0.02) weights, zero biases, unit LayerNorm."""
    if isinstance(module, (nn.Linear, nn.Embedding)):
        nn.init.normal_(module.weight, mean=0.0, std=0.02)
    if isinstance(module, nn.Linear) and module.bias is not None:
        nn.init.zeros_(module.bias)
    if isinstance(module, nn.Embedding) and module.padding_idx is not None:
        nn.init.zeros_(module.weight[module.padding_idx])
    if isinstance(module, nn.LayerNorm):
        nn.init.ones_(module.weight)
        nn.init.zeros_(module.bias)


class MaskedLMHead(nn.Module):
    """Dense, GELU, LayerNorm, then a decoder tied to the token embedding, with its own bias."""

    def __init__(self, config: ModelConfig, token_embedding: nn.Embedding):
        super().__init__()
        self.dense = nn.Linear(config.d_model, config.d_model)
        self.norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
        self.token_embedding = token_embedding
        self.bias = nn.Parameter(torch.zeros(config.vocab_size))

    def forward(self, hidden):
        hidden = self.norm(F.gelu(self.dense(hidden)))
        return F.linear(hidden, self.token_embedding.weight, self.bias)


class BertForMaskedLM(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        self.encoder = Encoder(config)
        self.head = MaskedLMHead(config, self.encoder.embeddings.token)
        self.apply(init_weights)

    def forward(self, input_ids, positions, labels=None, attention_mask=None, segment_ids=None):
        """Logits at the masked positions only, [batch, P, vocab], and their mean loss.

        The head runs on the gathered masked positions (about 15% of the tokens): the same
        loss as scoring every position, at a fraction of the work.
        """
        hidden = self.encoder(input_ids, attention_mask, segment_ids)
        index = positions.unsqueeze(-1).expand(-1, -1, hidden.shape[-1])
        logits = self.head(hidden.gather(1, index))
        if labels is None:
            return logits, None
        loss = F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(), ignore_index=IGNORE_INDEX)
        return logits, loss


class BertForSequenceClassification(nn.Module):
    """BERT's pooler (dense + tanh on [CLS]), dropout, and a linear classifier."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        self.encoder = Encoder(config)
        self.pooler = nn.Linear(config.d_model, config.d_model)
        self.dropout = nn.Dropout(config.dropout)
        self.classifier = nn.Linear(config.d_model, config.num_labels)
        self.apply(init_weights)

    def forward(self, input_ids, labels=None, attention_mask=None, segment_ids=None):
        hidden = self.encoder(input_ids, attention_mask, segment_ids)
        pooled = torch.tanh(self.pooler(hidden[:, 0]))
        logits = self.classifier(self.dropout(pooled))
        loss = None if labels is None else F.cross_entropy(logits.float(), labels)
        return logits, loss


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def flops_per_token(config: ModelConfig, seq_len: int, predictions_per_token: float) -> float:
    """Training FLOPs per input token (forward + backward = 3x forward), for MFU.

    Encoder matmuls: 2 * (4 d^2 + 2 d d_ff) per layer plus attention scores and mixing
    (2 * 2 * seq_len * d); the MLM head runs on `predictions_per_token` of the tokens.
    """
    d, layers = config.d_model, config.n_layer
    encoder = layers * (2 * (4 * d * d + 2 * d * config.d_ff) + 4 * seq_len * d)
    head = predictions_per_token * 2 * (d * d + d * config.vocab_size)
    return 3 * (encoder + head)

