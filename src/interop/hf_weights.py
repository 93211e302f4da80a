"""Our weight names against Hugging Face transformers' BERT names: the one table, both ways.

Ours are shorter and attention keeps q, k and v in one matrix (one matmul); theirs
(`bert.encoder.layer.N.attention.self.query`) are the lingua franca of BERT checkpoints.
"""
import re

import torch

from errors import UserError

# Names outside the encoder layers. Theirs carry a "bert." prefix inside task models.
NAMES = {
    "encoder.embeddings.token.weight": "bert.embeddings.word_embeddings.weight",
    "encoder.embeddings.position.weight": "bert.embeddings.position_embeddings.weight",
    "encoder.embeddings.segment.weight": "bert.embeddings.token_type_embeddings.weight",
    "encoder.embeddings.norm.weight": "bert.embeddings.LayerNorm.weight",
    "encoder.embeddings.norm.bias": "bert.embeddings.LayerNorm.bias",
    "head.dense.weight": "cls.predictions.transform.dense.weight",
    "head.dense.bias": "cls.predictions.transform.dense.bias",
    "head.norm.weight": "cls.predictions.transform.LayerNorm.weight",
    "head.norm.bias": "cls.predictions.transform.LayerNorm.bias",
    "head.bias": "cls.predictions.bias",
    "pooler.weight": "bert.pooler.dense.weight",
    "pooler.bias": "bert.pooler.dense.bias",
    "sentence_head.weight": "cls.seq_relationship.weight",
    "sentence_head.bias": "cls.seq_relationship.bias",
    "classifier.weight": "classifier.weight",
    "classifier.bias": "classifier.bias",
    "qa_outputs.weight": "qa_outputs.weight",  # extractive question answering's start and end
    "qa_outputs.bias": "qa_outputs.bias",
    "detector.0.weight": "discriminator_predictions.dense.weight",  # ELECTRA's discriminator
    "detector.0.bias": "discriminator_predictions.dense.bias",
    "detector.2.weight": "discriminator_predictions.dense_prediction.weight",
    "detector.2.bias": "discriminator_predictions.dense_prediction.bias",
}
# Names inside encoder layer N: ours "encoder.layers.N.<key>", theirs "bert.encoder.layer.N.<value>".
LAYER_NAMES = {
    "attention.out.weight": "attention.output.dense.weight",
    "attention.out.bias": "attention.output.dense.bias",
    "attention_norm.weight": "attention.output.LayerNorm.weight",
    "attention_norm.bias": "attention.output.LayerNorm.bias",
    "feed_forward.up.weight": "intermediate.dense.weight",
    "feed_forward.up.bias": "intermediate.dense.bias",
    "feed_forward.down.weight": "output.dense.weight",
    "feed_forward.down.bias": "output.dense.bias",
    "feed_forward_norm.weight": "output.LayerNorm.weight",
    "feed_forward_norm.bias": "output.LayerNorm.bias",
}
QKV = ("query", "key", "value")  # the order of the three blocks in our attention.qkv
TIED = {"head.token_embedding.weight": "encoder.embeddings.token.weight"}  # our decoder is the embedding
THEIR_TIED = ("cls.predictions.decoder.weight", "cls.predictions.decoder.bias")  # theirs re-tie on load

OUR_LAYER = re.compile(r"encoder\.layers\.(\d+)\.(.+)")
THEIR_LAYER = re.compile(r"bert\.encoder\.layer\.(\d+)\.(.+)")
THEIR_QKV = re.compile(r"attention\.self\.(query|key|value)\.(weight|bias)")  # other attention.self weights: unused


def to_hf(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Our state dict under transformers' names (task-model layout, "bert." prefix)."""
    theirs = {}
    for name, tensor in state.items():
        layer = OUR_LAYER.fullmatch(name)
        if name in TIED:
            continue
        if layer and layer.group(2) in ("attention.qkv.weight", "attention.qkv.bias"):
            kind = layer.group(2).rsplit(".", 1)[1]
            for part, block in zip(QKV, tensor.chunk(3, dim=0)):
                theirs[f"bert.encoder.layer.{layer.group(1)}.attention.self.{part}.{kind}"] = block.contiguous()
        elif layer:
            theirs[f"bert.encoder.layer.{layer.group(1)}.{LAYER_NAMES[layer.group(2)]}"] = tensor
        else:
            theirs[NAMES[name]] = tensor
    return theirs


def from_hf(state: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], list[str]]:
    """A transformers BERT state dict (BertModel, a task model, or ELECTRA's discriminator) under our names, and the
    names we had no use for."""
    theirs = {their_name(name): tensor for name, tensor in state.items()}
    inverse = {value: key for key, value in NAMES.items()}
    inverse_layer = {value: key for key, value in LAYER_NAMES.items()}
    ours, unused, qkv = {}, [], {}
    for name, tensor in theirs.items():
        layer = THEIR_LAYER.fullmatch(name)
        if name in inverse:
            ours[inverse[name]] = tensor
        elif layer and (part := THEIR_QKV.fullmatch(layer.group(2))):
            qkv.setdefault((int(layer.group(1)), part.group(2)), {})[part.group(1)] = tensor
        elif layer and layer.group(2) in inverse_layer:
            ours[f"encoder.layers.{layer.group(1)}.{inverse_layer[layer.group(2)]}"] = tensor
        elif name not in THEIR_TIED and not name.endswith("position_ids"):
            unused.append(name)
    for (layer, kind), parts in qkv.items():
        if set(parts) != set(QKV):
            raise UserError(f"layer {layer}: attention {kind} needs query, key and value; found {sorted(parts)}")
        ours[f"encoder.layers.{layer}.attention.qkv.{kind}"] = torch.cat([parts[p] for p in QKV], dim=0)
    if "head.bias" in ours:
        ours["head.token_embedding.weight"] = ours["encoder.embeddings.token.weight"]
    return ours, unused


def their_name(name: str) -> str:
    """A name as a BERT task model has it: ELECTRA's "electra." read as "bert.", a BertModel's
    unprefixed names with "bert."."""
    if name.startswith("electra."):
        return "bert." + name.removeprefix("electra.")
    heads = ("bert.", "cls.", "classifier.", "qa_outputs.", "discriminator_predictions.")
    return name if name.startswith(heads) else f"bert.{name}"
