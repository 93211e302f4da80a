"""BERT and the variants the experiments compare, in one file read top to bottom.

BERT as published is the default: learned positions, post-LayerNorm layers, GELU feed-forward.
ModelConfig switches each part: norm (preln, rmsnorm), position (rope, sinusoidal), feed_forward (geglu),
causal attention (for causal LM). Then the models: BertForMaskedLM, BertForPreTraining (MLM +
a next-sentence or sentence-order head), BertForCausalLM, ElectraForPreTraining (replaced-token
detection), BertForSequenceClassification, BertForEmbedding (sentence embeddings),
BertForTokenClassification and BertForQuestionAnswering. flops_per_token and estimated_parameters
measure a model from its shape (MFU; hardware.py's memory check).
It imports torch, architecture.py (ModelConfig, torch-free) and cpu_kernels.py alone, so that an
export ships the three files as they are (hf_export.py); config.py builds a ModelConfig from the
run's Config.
"""
import functools
import math
from dataclasses import replace

import torch
import torch.nn.functional as F
from torch import nn

# Exported (hf_export.py), this file is a module of transformers' package of remote code, which
# copies the files a module imports relatively (architecture.py, cpu_kernels.py); in src/ it is a
# top-level module.
try:
    from .architecture import IGNORE_INDEX, ModelConfig
    from .cpu_kernels import Dropout, attention as cpu_attention, token_cross_entropy
except ImportError:
    from architecture import IGNORE_INDEX, ModelConfig
    from cpu_kernels import Dropout, attention as cpu_attention, token_cross_entropy

INIT_STD = 0.02  # BERT's: the spread of every initial weight


def make_norm(config: ModelConfig) -> nn.Module:
    if config.norm == "rmsnorm":
        return nn.RMSNorm(config.d_model, eps=config.layer_norm_eps)
    return nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)


def sinusoidal_positions(length: int, width: int) -> torch.Tensor:
    """The fixed table of "Attention Is All You Need": feature 2i of position p is
    sin(p / 10000^(2i/width)), feature 2i+1 its cosine. Scaled by INIT_STD, the spread the token
    embeddings start with: at amplitude 1 the table outweighs them and the embeddings' norm sees
    positions only, so pre-training stays on the unigram plateau (etc/results/pretraining.md)."""
    position = torch.arange(length, dtype=torch.float32)[:, None]
    frequencies = torch.exp(torch.arange(0, width, 2, dtype=torch.float32) * (-math.log(10000.0) / width))
    table = torch.zeros(length, width)
    table[:, 0::2] = torch.sin(position * frequencies)
    table[:, 1::2] = torch.cos(position * frequencies[:width // 2])
    return INIT_STD * table


class Embeddings(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.token = nn.Embedding(config.vocab_size, config.d_model, padding_idx=config.pad_id)
        # With rotary positions, attention knows the order; the embeddings carry none.
        self.position = nn.Embedding(config.max_len, config.d_model) if config.position == "learned" else None
        fixed = sinusoidal_positions(config.max_len, config.d_model) if config.position == "sinusoidal" else None
        self.register_buffer("fixed_positions", fixed, persistent=False)  # computed, never saved
        self.segment = nn.Embedding(config.segments, config.d_model)
        self.norm = make_norm(config)
        self.dropout = Dropout(config.dropout)

    def forward(self, input_ids, segment_ids=None, positions=None):
        """positions: [batch, length] (token_positions), or None for 0 .. length - 1."""
        x = self.token(input_ids)
        if positions is None and (self.position is not None or self.fixed_positions is not None):
            positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        if self.position is not None:
            x = x + self.position(positions)
        if self.fixed_positions is not None:
            x = x + self.fixed_positions[positions].to(x.dtype)
        x = x + (self.segment.weight[0] if segment_ids is None else self.segment(segment_ids))
        return self.dropout(self.norm(x))


class Rotary(nn.Module):
    """Rotary position embedding (RoPE, Su et al. 2021): rotate each pair of query and key
    features by an angle proportional to the position, so scores depend on distance only."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        angles = rotary_angles(config)
        # Not in the state dict: they follow from the config.
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)

    def forward(self, length: int, positions=None) -> tuple[torch.Tensor, torch.Tensor]:
        """The cos and sin of the angles of positions 0 .. length - 1 ([length, head_width]), or of
        `positions` ([batch, length] -> [batch, 1, length, head_width]), for rotate."""
        if positions is None:
            return self.cos[:length], self.sin[:length]
        return self.cos[positions][:, None], self.sin[positions][:, None]


def rotate(x, angles: tuple[torch.Tensor, torch.Tensor]):
    """x [batch, heads, length, head_width] turned by Rotary's angles. x, a strided view of the q-k-v
    matmul's output, is copied whole first: on the CPU the rotation's elementwise ops take more than
    twice as long on the view (etc/results/speed.md, "The token loss in one softmax")."""
    x = x.contiguous()
    cos, sin = (angle.to(x.dtype) for angle in angles)
    first, second = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-second, first], dim=-1) * sin


def rotary_angles(config: ModelConfig) -> torch.Tensor:
    """[max_len, head_width]: position p turns feature pair i by p / rope_theta^(2i/head_width); the
    two halves of a head rotate together."""
    head_width = config.d_model // config.heads
    inverse_frequency = 1.0 / config.rope_theta ** (torch.arange(0, head_width, 2).float() / head_width)
    angles = torch.outer(torch.arange(config.max_len).float(), inverse_frequency)
    return torch.cat([angles, angles], dim=-1)


class SelfAttention(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.heads = config.heads
        self.qkv = nn.Linear(config.d_model, 3 * config.d_model)  # one matmul for q, k and v
        self.out = nn.Linear(config.d_model, config.d_model)
        self.dropout = config.dropout
        self.causal = config.causal

    def projections(self, x) -> torch.Tensor:
        """q, k and v stacked, [3, batch, heads, length, head_width], before rotary positions turn q
        and k: what relation distillation (distill_task.py) compares."""
        return self.by_head(self.qkv(x), 3)

    def row_projections(self, x, rows) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q at the rows' positions alone ([batch, heads, P, head_width]), k and v everywhere. One
        matmul for all three still (slices of the weight would keep an ONNX export's last layer from
        int8 quantization), its queries picked after."""
        width = x.shape[-1]
        qkv = self.qkv(x)
        return self.by_head(at_positions(qkv[..., :width], rows), 1)[0], *self.by_head(qkv[..., width:], 2)

    def by_head(self, y, parts: int) -> torch.Tensor:
        """[batch, length, parts x width] -> [parts, batch, heads, length, head_width]."""
        batch, length, _ = y.shape
        return y.view(batch, length, parts, self.heads, -1).permute(2, 0, 3, 1, 4)

    def forward(self, x, attention_mask=None, rotary=None, rows=None):
        """rows: [batch, P] positions whose queries alone are computed; the output is then [batch, P,
        width]. Not with a causal mask by SDPA's flag (Encoder.last_layer sees to that)."""
        batch, _, width = x.shape
        q, k, v = self.projections(x) if rows is None else self.row_projections(x, rows)
        if rotary is not None:
            query_angles = rotary if rows is None else tuple(at_query_rows(angles, rows) for angles in rotary)
            q, k = rotate(q, query_angles), rotate(k, rotary)
        if rows is not None and attention_mask is not None:
            attention_mask = at_query_rows(attention_mask, rows)
        dropout = self.dropout if self.training else 0.0
        # A padding mask is combined with causality in Encoder.attention_mask; alone, SDPA's flag is faster.
        causal = self.causal and attention_mask is None
        y = attend(q, k, v, attention_mask, dropout, causal)
        return self.out(y.transpose(1, 2).reshape(batch, q.shape[2], width))


def at_query_rows(per_query, rows):
    """A mask [batch, 1, queries, keys] or rotary's angles ([length, head_width], or [batch, 1, length,
    head_width]) at the rows' query positions; a mask shared by every query ([batch, 1, 1, keys]) as
    it is."""
    if per_query.dim() == 2:
        return per_query[rows][:, None]
    if per_query.shape[2] == 1:
        return per_query
    return per_query.gather(2, rows[:, None, :, None].expand(-1, 1, -1, per_query.shape[-1]))


def attend(q, k, v, attention_mask, dropout: float, causal: bool):
    """PyTorch's fused attention; on the CPU under bf16 autocast, the faster paths of cpu_kernels.py;
    FlexAttention's kernel for a block mask (Encoder.attention_mask)."""
    if attention_mask is not None and not torch.is_tensor(attention_mask):
        # Contiguous: inside a compiled model, inductor's CPU kernel misread v's strides (torch 2.13).
        return flex_attention()(q.contiguous(), k.contiguous(), v.contiguous(), block_mask=attention_mask)
    if q.device.type != "cpu" or q.dtype == torch.float32:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=attention_mask, dropout_p=dropout, is_causal=causal)
    return cpu_attention(q, k, v, attention_mask, dropout, causal)


@functools.cache
def flex_attention():
    """FlexAttention compiled, as it must be to run its fused kernel rather than a dense fallback
    (imported here: the torch a transformers user loads an export with may lack it)."""
    from torch.nn.attention.flex_attention import flex_attention as attention
    return torch.compile(attention, dynamic=False)


def earlier_or_same(length: int, device) -> torch.Tensor:
    """The causal mask [length, length]: True where a query may see the key (itself and earlier)."""
    return torch.ones(length, length, dtype=torch.bool, device=device).tril()


class FeedForward(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.gated = config.feed_forward == "geglu"
        self.up = nn.Linear(config.d_model, (2 if self.gated else 1) * config.d_ff)  # geglu: gate and value
        self.down = nn.Linear(config.d_ff, config.d_model)

    def forward(self, x):
        if self.gated:
            gate, value = self.up(x).chunk(2, dim=-1)
            return self.down(F.gelu(gate) * value)
        return self.down(F.gelu(self.up(x)))


class EncoderLayer(nn.Module):
    """Post-norm (BERT: normalise after each residual sum) or pre-norm (normalise each
    sublayer's input, keep the residual stream untouched: trains stably at higher rates)."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.pre_norm = config.pre_norm
        self.attention = SelfAttention(config)
        self.attention_norm = make_norm(config)
        self.feed_forward = FeedForward(config)
        self.feed_forward_norm = make_norm(config)
        self.dropout = Dropout(config.dropout)

    def attention_input(self, x):
        """What the attention reads: the layer's input, normalised first in a pre-norm layer."""
        return self.attention_norm(x) if self.pre_norm else x

    def forward(self, x, attention_mask=None, rotary=None, rows=None):
        """rows: [batch, P] positions whose states alone are computed (SelfAttention.forward)."""
        residual = x if rows is None else at_positions(x, rows)
        if self.pre_norm:
            x = residual + self.dropout(self.attention(self.attention_norm(x), attention_mask, rotary, rows))
            return x + self.dropout(self.feed_forward(self.feed_forward_norm(x)))
        x = self.attention_norm(residual + self.dropout(self.attention(x, attention_mask, rotary, rows)))
        return self.feed_forward_norm(x + self.dropout(self.feed_forward(x)))


class Encoder(nn.Module):
    def __init__(self, config: ModelConfig, embeddings: bool = True):
        """embeddings=False: layers only, for inputs embedded elsewhere (ELECTRA's generator)."""
        super().__init__()
        self.causal = config.causal
        self.attention_dropout = config.dropout
        self.embeddings = Embeddings(config) if embeddings else None
        self.rotary = Rotary(config) if config.position == "rope" else None
        self.layers = nn.ModuleList(EncoderLayer(config) for _ in range(config.n_layer))
        # Pre-norm leaves the residual stream unnormalised: one norm after the last layer.
        self.final_norm = make_norm(config) if config.pre_norm else None

    def forward(self, input_ids, attention_mask=None, segment_ids=None, embedded=None, document_ids=None,
                rows=None):
        """attention_mask: bool [batch, length], True for real tokens; None when nothing is padded.
        embedded: inputs already embedded, in place of input_ids. document_ids: [batch, length] for
        rows of documents packed apart: a token sees its own document only, at positions from 0.
        rows: [batch, P] positions whose states alone are wanted (an MLM's masked slots, [CLS]): the
        output is [batch, P, width], and the last layer computes those alone."""
        positions = token_positions(document_ids)
        attention_mask = self.attention_mask(attention_mask, document_ids)
        x = self.embeddings(input_ids, segment_ids, positions) if embedded is None else embedded
        rotary = None if self.rotary is None else self.rotary(x.shape[1], positions)
        for layer in self.layers[:-1]:
            x = layer(x, attention_mask, rotary)
        x = self.last_layer(x, attention_mask, rotary, rows)
        return x if self.final_norm is None else self.final_norm(x)

    def last_layer(self, x, attention_mask, rotary, rows):
        """The last layer, on the rows alone where asked (MosaicBERT's saving: its queries, output
        projection and feed-forward on about 15% of an MLM's tokens, one in a classifier's row); on
        every position under causality by SDPA's flag or FlexAttention's block mask, which want the
        whole square of queries, and then the rows picked."""
        last = self.layers[-1]
        if rows is None:
            return last(x, attention_mask, rotary)
        if self.causal or not (attention_mask is None or torch.is_tensor(attention_mask)):
            return at_positions(last(x, attention_mask, rotary), rows)
        return last(x, attention_mask, rotary, rows)

    def layer_projections(self, index: int, input_ids, attention_mask=None, document_ids=None,
                          with_output: bool = False):
        """Layer `index`'s (from 0) q, k and v before rotary positions, as SelfAttention.projections
        gives them, running only the layers below it; with_output: every layer, and (projections,
        the encoder's output). The other arguments as forward's."""
        positions = token_positions(document_ids)
        mask = self.attention_mask(attention_mask, document_ids)
        x = self.embeddings(input_ids, None, positions)
        rotary = None if self.rotary is None else self.rotary(x.shape[1], positions)
        for number, layer in enumerate(self.layers):
            if number == index:
                projections = layer.attention.projections(layer.attention_input(x))
                if not with_output:
                    return projections
            x = layer(x, mask, rotary)
        return projections, x if self.final_norm is None else self.final_norm(x)

    def attention_mask(self, real, document_ids=None):
        """Which keys each query may see: a bool [batch, 1, queries, keys] for SDPA, or None (every
        key, or causal alone: SDPA's is_causal). Documents packed apart on a GPU get a FlexAttention
        block mask instead, whose kernel skips the blocks where no query sees a key and never holds
        the dense mask (uses_block_mask says where)."""
        if real is None and document_ids is None:
            return None
        dropout = self.attention_dropout if self.training else 0.0
        if document_ids is not None and uses_block_mask(document_ids.device, dropout):
            return document_block_mask(document_ids, real, self.causal)
        mask = None if real is None else real[:, None, None, :]  # broadcast over heads and queries
        if document_ids is not None:
            same = document_ids[:, None, :, None] == document_ids[:, None, None, :]
            mask = same if mask is None else mask & same
        if self.causal:
            mask = mask & earlier_or_same(mask.shape[-1], mask.device)
        return mask


def uses_block_mask(device: torch.device, dropout: float) -> bool:
    """FlexAttention on CUDA only (it has no backward on the CPU), and without attention dropout (it has none)."""
    return device.type == "cuda" and not dropout


def document_block_mask(document_ids, real, causal: bool):
    """FlexAttention's block mask for documents packed apart: a query sees the keys of its own
    document, real ones (padding: `real` False), and with `causal` none after it."""
    from torch.nn.attention.flex_attention import create_block_mask

    def may_see(batch, head, query, key):
        seen = document_ids[batch, query] == document_ids[batch, key]
        if real is not None:
            seen = seen & real[batch, key]
        return seen & (key <= query) if causal else seen

    rows, length = document_ids.shape
    return create_block_mask(may_see, rows, None, length, length, device=document_ids.device)


def token_positions(document_ids):
    """Each token's position in its document ([batch, length]): every document starts again at 0,
    as it would alone (and as a fine-tuning input does); None (0 .. length - 1) without documents."""
    if document_ids is None:
        return None
    index = torch.arange(document_ids.shape[1], device=document_ids.device).expand_as(document_ids)
    starts = torch.ones_like(document_ids, dtype=torch.bool)
    starts[:, 1:] = document_ids[:, 1:] != document_ids[:, :-1]
    return index - torch.where(starts, index, 0).cummax(dim=1).values


def init_weights(module: nn.Module):
    """BERT's initialisation: normal(0, INIT_STD) weights, zero biases, unit norms."""
    if isinstance(module, (nn.Linear, nn.Embedding)):
        nn.init.normal_(module.weight, mean=0.0, std=INIT_STD)
    if isinstance(module, nn.Linear) and module.bias is not None:
        nn.init.zeros_(module.bias)
    if isinstance(module, nn.Embedding) and module.padding_idx is not None:
        nn.init.zeros_(module.weight[module.padding_idx])
    if isinstance(module, (nn.LayerNorm, nn.RMSNorm)):
        nn.init.ones_(module.weight)
    if isinstance(module, nn.LayerNorm):
        nn.init.zeros_(module.bias)


class MaskedLMHead(nn.Module):
    """Dense, GELU, LayerNorm, then a decoder tied to the token embedding, with its own bias.
    input_width: of the hidden states it reads, when not d-model (ELECTRA's generator)."""

    def __init__(self, config: ModelConfig, token_embedding: nn.Embedding, input_width: int | None = None):
        super().__init__()
        self.dense = nn.Linear(input_width or config.d_model, config.d_model)
        self.norm = make_norm(config)
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

    def forward(self, input_ids, positions, labels=None, attention_mask=None, segment_ids=None, document_ids=None):
        """Logits at the masked positions only, [batch, P, vocab], and their mean loss."""
        hidden = self.encoder(input_ids, attention_mask, segment_ids, document_ids=document_ids, rows=positions)
        logits = self.head(hidden)
        return logits, None if labels is None else token_loss(logits, labels)


def at_positions(hidden, positions):
    """The states [batch, P, width] at the masked positions [batch, P]: an MLM head runs on these alone
    (about 15% of the tokens), the same loss as scoring every position at a fraction of the work."""
    return hidden.gather(1, positions.unsqueeze(-1).expand(-1, -1, hidden.shape[-1]))


def token_loss(logits, labels):
    """Mean cross-entropy over the labelled tokens (IGNORE_INDEX elsewhere), in fp32. On the CPU in
    eager mode by cpu_kernels' one-softmax kernel; torch.compile fuses PyTorch's own better."""
    if logits.device.type == "cpu" and not torch.compiler.is_compiling():
        return token_cross_entropy(logits.flatten(0, 1), labels.flatten(), IGNORE_INDEX)
    return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(), ignore_index=IGNORE_INDEX)


def token_hits(logits, labels) -> torch.Tensor:
    """How many labelled tokens (IGNORE_INDEX elsewhere) get their label's logit as the largest,
    a tie included. Not argmax, which is many times slower than amax in bfloat16 on the CPU."""
    scored = labels != IGNORE_INDEX
    label_logits = logits.gather(-1, labels.clamp_min(0).unsqueeze(-1)).squeeze(-1)
    return ((label_logits >= logits.amax(-1)) & scored).sum()


class BertForPreTraining(BertForMaskedLM):
    """MLM plus a sentence-pair task on the pooled [CLS]: next-sentence prediction (BERT) or
    sentence-order prediction (ALBERT). The pooler is the one fine-tuning starts from."""

    def __init__(self, config: ModelConfig):
        super().__init__(config)
        self.pooler = nn.Linear(config.d_model, config.d_model)
        self.sentence_head = nn.Linear(config.d_model, config.sentence_classes)
        self.pooler.apply(init_weights)
        self.sentence_head.apply(init_weights)

    def forward(self, input_ids, positions, labels=None, attention_mask=None, segment_ids=None,
                sentence_labels=None, document_ids=None):
        """(masked logits, sentence logits [batch, classes], MLM loss + sentence loss)."""
        rows = torch.cat([first_rows(input_ids), positions], dim=1)  # [CLS] for the pair, then the masked
        hidden = self.encoder(input_ids, attention_mask, segment_ids, document_ids=document_ids, rows=rows)
        logits = self.head(hidden[:, 1:])
        sentence_logits = self.classify_pair(hidden)
        if labels is None:
            return logits, sentence_logits, None
        loss = token_loss(logits, labels) + F.cross_entropy(sentence_logits.float(), sentence_labels)
        return logits, sentence_logits, loss

    def classify_pair(self, hidden):
        """The sentence task's logits from the pooled [CLS] state."""
        return self.sentence_head(torch.tanh(self.pooler(hidden[:, 0])))


class BertForCausalLM(nn.Module):
    """The same encoder with causal attention and the MLM head on every position: each
    position predicts the next token."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        if not config.causal:
            raise ValueError("BertForCausalLM needs ModelConfig(causal=True)")
        self.config = config
        self.encoder = Encoder(config)
        self.head = MaskedLMHead(config, self.encoder.embeddings.token)
        self.apply(init_weights)

    def forward(self, input_ids, labels=None, attention_mask=None, document_ids=None):
        """labels: [batch, length], the next token at each position, IGNORE_INDEX where none."""
        logits = self.head(self.encoder(input_ids, attention_mask, document_ids=document_ids))
        return logits, None if labels is None else token_loss(logits, labels)


def generator_config(config: ModelConfig) -> ModelConfig:
    """ELECTRA's generator: the same depth and head width, generator_heads heads, a feed-forward
    scaled alike; no generator of its own."""
    head_width = config.d_model // config.heads
    return replace(config, d_model=config.generator_heads * head_width, heads=config.generator_heads,
                   d_ff=max(8, config.d_ff * config.generator_heads // config.heads), generator_heads=0)


class ElectraForPreTraining(nn.Module):
    """Replaced-token detection (ELECTRA, Clark et al. 2020). A small generator, an MLM reading our
    embeddings, fills the masked positions with its samples; the encoder, the discriminator that
    fine-tuning keeps, tells for every token whether it was replaced: every token teaches."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        if not config.generator_heads:
            raise ValueError("ElectraForPreTraining needs ModelConfig(generator_heads > 0)")
        self.config = config
        self.encoder = Encoder(config)
        self.detector = nn.Sequential(nn.Linear(config.d_model, config.d_model), nn.GELU(),
                                      nn.Linear(config.d_model, 1))
        generator = generator_config(config)
        self.generator_input = nn.Linear(config.d_model, generator.d_model)  # the shared embeddings, narrowed
        self.generator = Encoder(generator, embeddings=False)
        self.generator_head = MaskedLMHead(config, self.encoder.embeddings.token, input_width=generator.d_model)
        self.apply(init_weights)

    def forward(self, input_ids, positions, labels, original_ids, attention_mask=None, segment_ids=None,
                sampling: torch.Generator | None = None, document_ids=None):
        """input_ids: masked; labels: the original ids at `positions` (IGNORE_INDEX in unused slots).
        Returns the generator's logits at the masked positions [batch, P, vocab], the detector's
        logit per token [batch, length] and the discriminator's input: the originals with the
        generator's samples at the masked positions (a sample may be the original token)."""
        embedded = self.encoder.embeddings(input_ids, segment_ids, token_positions(document_ids))
        generated = self.generator(None, attention_mask, embedded=self.generator_input(embedded),
                                   document_ids=document_ids, rows=positions)
        generator_logits = self.generator_head(generated)
        with torch.no_grad():  # the discriminator's input is data, not a path for gradients
            noise = torch.rand(generator_logits.shape, generator=sampling, device=generator_logits.device)
            sampled = (generator_logits.float() - torch.log(-torch.log(noise.clamp_min(1e-20)))).argmax(-1)
            used = labels != IGNORE_INDEX
            fill = torch.where(used, sampled, original_ids.gather(1, positions))
            corrupted = original_ids.scatter(1, positions, fill)
        detector_logits = self.detector(self.encoder(corrupted, attention_mask, segment_ids,
                                                     document_ids=document_ids)).squeeze(-1)
        return generator_logits, detector_logits, corrupted


class BertForSequenceClassification(nn.Module):
    """BERT's pooler (dense + tanh) on [CLS], or on the mean of the real tokens' states; dropout,
    and a linear classifier (a regressor with num_labels = 1; multi_label: a sigmoid a class).

    Mean pooling reads every token: after a short pre-training the encoder may give nearly the
    same state at every position (the unigram plateau), and [CLS] alone then carries half the
    difference between sentences that it does at random weights; fine-tuning can stall there."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        self.encoder = Encoder(config)
        self.pooler = nn.Linear(config.d_model, config.d_model)
        self.dropout = Dropout(config.dropout)
        self.classifier = nn.Linear(config.d_model, config.num_labels)
        self.apply(init_weights)

    def forward(self, input_ids, labels=None, attention_mask=None, segment_ids=None):
        hidden = self.encoder(input_ids, attention_mask, segment_ids, rows=pooled_rows(input_ids, self.config.pooling))
        pooled = torch.tanh(self.pooler(pool(hidden, attention_mask, self.config.pooling)))
        logits = self.classifier(self.dropout(pooled))
        return logits, None if labels is None else self.loss(logits, labels)

    def loss(self, logits, labels):
        return sequence_loss(logits, labels, self.config.multi_label)


def sequence_loss(logits: torch.Tensor, labels: torch.Tensor, multi_label: bool) -> torch.Tensor:
    """A sequence classifier's loss, as transformers' problem_type has it: cross-entropy over the classes;
    with one output (STS-B's similarity, a regression) the mean squared error; multi-label, each class
    a yes or no of its own (labels 0 or 1 a class), the binary cross-entropy of every decision."""
    if logits.shape[-1] == 1:
        return F.mse_loss(logits[:, 0].float(), labels.float())
    if multi_label:
        return F.binary_cross_entropy_with_logits(logits.float(), labels.float())
    return F.cross_entropy(logits.float(), labels)


def pooled_rows(input_ids, pooling: str):
    """The rows `pool` reads, for Encoder.forward: [CLS] alone (cls), or None: every token (mean)."""
    return first_rows(input_ids) if pooling == "cls" else None


def first_rows(input_ids):
    """Position 0 of each row, [batch, 1]: [CLS]."""
    return input_ids.new_zeros(input_ids.shape[0], 1)


def pool(hidden, attention_mask, pooling: str):
    """One vector per sentence: [CLS]'s state (cls: the first of `hidden`, all of it when the encoder
    ran on pooled_rows), or the mean over real tokens (mean)."""
    if pooling == "cls":
        return hidden[:, 0]
    if attention_mask is None:
        return hidden.mean(1)
    real = attention_mask.unsqueeze(-1).to(hidden.dtype)
    return (hidden * real).sum(1) / real.sum(1)


class BertForEmbedding(nn.Module):
    """Sentence embeddings (task-type = embed): the encoder's states pooled ([CLS] or the mean of the
    real tokens) and scaled to length 1, so that a dot product is the cosine similarity. No weights
    beside the encoder's: sentence-transformers' Transformer, Pooling and Normalize modules."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        self.encoder = Encoder(config)
        self.apply(init_weights)

    def forward(self, input_ids, attention_mask=None, segment_ids=None):
        hidden = self.encoder(input_ids, attention_mask, segment_ids, rows=pooled_rows(input_ids, self.config.pooling))
        return F.normalize(pool(hidden, attention_mask, self.config.pooling).float(), dim=-1)


class BertForTokenClassification(nn.Module):
    """A label for every token (named entities): dropout and a linear classifier on each state.
    Labels of IGNORE_INDEX (special tokens, a word's pieces after its first) have no loss."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        self.encoder = Encoder(config)
        self.dropout = Dropout(config.dropout)
        self.classifier = nn.Linear(config.d_model, config.num_labels)
        self.apply(init_weights)

    def forward(self, input_ids, labels=None, attention_mask=None, segment_ids=None):
        logits = self.classifier(self.dropout(self.encoder(input_ids, attention_mask, segment_ids)))
        if labels is None:
            return logits, None
        return logits, token_loss(logits, labels)


class BertForQuestionAnswering(nn.Module):
    """Extractive question answering (SQuAD): a start and an end logit for every token, from one
    linear layer; the answer is the best span of the context (squad_task.py's best_spans)."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        self.encoder = Encoder(config)
        self.qa_outputs = nn.Linear(config.d_model, 2)
        self.apply(init_weights)

    def forward(self, input_ids, attention_mask=None, segment_ids=None, start_positions=None, end_positions=None):
        """Start and end logits [batch, length]; with the answer's positions ([CLS]'s 0 where the
        window holds none), the mean of the two cross-entropies."""
        logits = self.qa_outputs(self.encoder(input_ids, attention_mask, segment_ids)).float()
        start, end = logits.unbind(-1)
        if start_positions is None:
            return start, end, None
        return start, end, (F.cross_entropy(start, start_positions) + F.cross_entropy(end, end_positions)) / 2


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def flops_per_token(config: ModelConfig, seq_len: int, predictions_per_token: float,
                    last_layer_share: float = 1.0) -> float:
    """Training FLOPs per input token (forward + backward = 3x forward), for MFU: the work a step
    needs, not work done and thrown away.

    Encoder matmuls: 2 * (4 d^2 + 2 d d_ff) per layer (3 d d_ff with geglu's gate) plus attention
    scores and mixing (2 * 2 * seq_len * d, counted whole with a causal mask too); the last layer
    computes all but its keys and values on `last_layer_share` of the tokens (Encoder.forward's
    rows); the head runs on `predictions_per_token` of them.
    """
    d = config.d_model
    head = predictions_per_token * 2 * (d * d + d * config.vocab_size)
    forward = encoder_flops(config, seq_len, last_layer_share) + head
    if config.generator_heads:  # ELECTRA: the generator, on the masked rows at the last, with its head as
        generator = generator_config(config)  # input; the detector on every token
        g = generator.d_model
        forward += 2 * d * g + encoder_flops(generator, seq_len, predictions_per_token) + 2 * (d * d + d)
        forward += predictions_per_token * 2 * (g * d - d * d)  # its head reads g, not d, features
    return 3 * forward


def encoder_flops(config: ModelConfig, seq_len: int, last_layer_share: float = 1.0) -> float:
    """Forward matmul FLOPs per token of the encoder layers, the last on `last_layer_share` of the
    tokens but for its keys and values."""
    d = config.d_model
    feed_forward = (3 if config.feed_forward == "geglu" else 2) * d * config.d_ff
    keys_and_values = 2 * 2 * d * d
    rest = 2 * (2 * d * d + feed_forward) + 4 * seq_len * d  # q and out, feed-forward, attention
    return (config.n_layer - 1) * (keys_and_values + rest) + keys_and_values + last_layer_share * rest


# ----------------------------------------------------------------------------- size from the shape

def estimated_parameters(config: ModelConfig) -> int:
    """The weights of the encoder, a pre-training head and ELECTRA's generator: within a few per
    cent of any model built from the config (norms, small heads and biases are left out)."""
    width = config.d_model
    embeddings = (config.vocab_size + config.max_len + config.segments) * width
    up = (2 if config.feed_forward == "geglu" else 1) * config.d_ff
    layer = 4 * width * width + width * up + config.d_ff * width  # q, k, v, out; feed-forward up and down
    head = width * width + config.vocab_size  # dense and the bias per token (the decoder is the embedding)
    generator = 0
    if config.generator_heads:
        narrow = generator_config(config)
        shared = (config.vocab_size + config.max_len + config.segments) * narrow.d_model  # the embeddings it shares
        generator = estimated_parameters(narrow) - shared
    return embeddings + config.n_layer * layer + head + generator
