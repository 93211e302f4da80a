"""onnx/model.onnx in an exported directory (export_hf.py --onnx): our model as torch.onnx's exporter
(torch.export's graph) writes it for onnxruntime, batch and sequence axes free, under the names
optimum's ORTModel classes and sentence-transformers' ONNX backend read: input_ids, attention_mask
and token_type_ids in; logits (MLM, a classifier or regressor, token classification), start_logits
and end_logits (questions), or last_hidden_state (an encoder or an embedding model, pooled by the
directory's sentence-transformers modules) out.

The graph is checked before it is kept: onnxruntime runs it on sentences of many lengths, alone and
padded into one batch, longer than the example exported too (rotary tables are computed per length),
and every output must be finite and within TOLERANCE of our model's (of its scale, where its values
pass 1: a post-LN model's hidden states reach tens). A graph that is not is refused with where it
differs, and nothing is written.

--quantize int8 adds onnx/model_qint8.onnx (onnxruntime's dynamic quantization: int8 weights, the
activations' scale found per batch) and onnx/quantization.json: the size of each graph and the
task's validation scores through each, measured on the run's own validation split.
"""
import contextlib
import json
import logging
import warnings
from pathlib import Path
from typing import Callable

import numpy as np
import torch
from torch import nn

from architecture import ANSWERS, CLASSIFICATION, EMBEDDING, ENCODER, PRE_TRAINING, TOKENS, kind_of
from config import FINE_TUNING_TASKS
from errors import UserError
from model import (BertForEmbedding, BertForMaskedLM, BertForQuestionAnswering, BertForSequenceClassification,
                   BertForTokenClassification, ModelConfig)
from interop.onnx_model import INPUTS, INSTALL, onnx_class

TOLERANCE = 1e-4  # the largest difference a float32 output may have from ours, times its scale past 1
# torch.onnx's exporter (torch.export's graph, onnxscript's operators) writes opset 18: asked for 17 it
# converts down, and GeGLU's Split keeps opset 18's num_outputs, which onnxruntime refuses at 17.
OPSET = 18
# The batch and sequence axes of every input free; the exporter derives each output's from them (a
# classifier's logits: [batch, classes]; MLM's: [batch, sequence, vocabulary]).
BATCH, SEQUENCE = torch.export.Dim("batch"), torch.export.Dim("sequence")
DYNAMIC_SHAPES = {name: {0: BATCH, 1: SEQUENCE} for name in INPUTS}
# What the exporter says on every export that is torch's own business, not the user's: its torch.export
# calls a pytree API torch itself deprecates; the three inputs' shared axes are named once, not thrice.
EXPORTER_NOISE = (r"`isinstance\(treespec, LeafSpec\)` is deprecated", r"# The axis name: \w+ will not be used")
# The logger that names, on every export, the torchvision operators it skips (we use none).
REGISTRY_LOGGER = "torch.onnx._internal.exporter._registration"
QUANTIZED_FILE = "onnx/model_qint8.onnx"
QUANTIZATION_REPORT = "onnx/quantization.json"
# The pre-training whose graph a runtime's class takes (ORTModelForMaskedLM): MLM's.
GRAPH_PRE_TRAINING = ("mlm",)
# Our model class whose outputs a family's graph gives (their names: the onnx_model class that reads them).
GRAPH_MODELS = {PRE_TRAINING: BertForMaskedLM, CLASSIFICATION: BertForSequenceClassification,
                TOKENS: BertForTokenClassification, ANSWERS: BertForQuestionAnswering, EMBEDDING: BertForEmbedding,
                ENCODER: BertForEmbedding}

# The sentences the graph is checked on: lengths from a few pieces to many, plain and odd text.
CHECK_SENTENCES = (
    "Fine.",
    "A gorgeous, witty, seductive movie.",
    "The plot made no sense at all, and the acting was wooden from the first scene to the last.",
    "Ça coûte 5€ — très cher! 42 (forty-two) reasons; why?",
    "It was the best of times, it was the worst of times, it was the age of wisdom, it was the age of "
    "foolishness, it was the epoch of belief, it was the epoch of incredulity, it was the season of Light.",
)


def model_class(task: str) -> type:
    """Our model class whose outputs the task's graph gives."""
    return GRAPH_MODELS[kind_of(task).family]


def output_names(task: str) -> tuple[str, ...]:
    return tuple(onnx_class(task).OUTPUTS)


class DecomposedRMSNorm(nn.Module):
    """nn.RMSNorm in the operations opset 18 has (its own RMSNormalization came in opset 23)."""

    def __init__(self, norm: nn.RMSNorm):
        super().__init__()
        self.weight, self.eps = norm.weight, norm.eps

    def forward(self, x):
        eps = self.eps if self.eps is not None else torch.finfo(x.dtype).eps
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * self.weight


def decomposed(model: nn.Module) -> nn.Module:
    """The model with every nn.RMSNorm a DecomposedRMSNorm sharing its weight."""
    for name, child in model.named_children():
        setattr(model, name, DecomposedRMSNorm(child) if isinstance(child, nn.RMSNorm) else decomposed(child))
    return model


class Outputs(nn.Module):
    """Our model between transformers' input and output names (an int attention mask in)."""

    def __init__(self, model: nn.Module, task: str):
        super().__init__()
        self.model = model
        self.task = task

    def forward(self, input_ids, attention_mask, token_type_ids):
        model, real = self.model, attention_mask.bool()
        if self.task in ("embed", "encoder"):
            return model.encoder(input_ids, real, token_type_ids)
        if self.task == "mlm":
            return model.head(model.encoder(input_ids, real, token_type_ids))
        if isinstance(model, BertForQuestionAnswering):
            start, end, _ = model(input_ids, real, token_type_ids)
            return start, end
        return model(input_ids, attention_mask=real, segment_ids=token_type_ids)[0]


def exported_model(checkpoint: dict) -> Outputs:
    """The checkpoint's model (as export_hf.py exports it: a distilled student is an encoder) in eval mode."""
    task = checkpoint["task"]
    model = model_class(task)(ModelConfig(**checkpoint["model_config"]))
    model.load_state_dict(checkpoint["model"], strict=False)  # export_hf.py checked the encoder's weights
    return Outputs(decomposed(model).eval(), task).eval()


def check_batches(vocab, max_len: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """(input ids, attention mask) batches: each sentence alone, all of them padded into one, and one
    text as long as the position table allows."""
    pieces = [[vocab.cls_id, *ids[:max_len - 2], vocab.sep_id] for ids in vocab.encode(list(CHECK_SENTENCES))]
    longest = (pieces[-1][1:-1] * (max_len // len(pieces[-1]) + 1))[:max_len - 2]
    pieces.append([vocab.cls_id, *longest, vocab.sep_id])
    batches = [padded([one], vocab.pad_id) for one in pieces]
    return batches + [padded(pieces, vocab.pad_id)]


def padded(rows: list[list[int]], pad_id: int) -> tuple[np.ndarray, np.ndarray]:
    width = max(len(row) for row in rows)
    ids = np.full((len(rows), width), pad_id, dtype=np.int64)
    mask = np.zeros((len(rows), width), dtype=np.int64)
    for number, row in enumerate(rows):
        ids[number, :len(row)], mask[number, :len(row)] = row, 1
    return ids, mask


def require_onnx():
    try:
        import onnx  # noqa: F401
        import onnxruntime  # noqa: F401
    except ImportError as error:
        raise UserError(f"--onnx needs the onnx and onnxruntime packages ({error.name} is missing): "
                        f"{INSTALL}") from None


def write_onnx(checkpoint: dict, vocab, path: Path, shown_as: Path) -> None:
    """Export the checkpoint's model into `path` (one file, the weights inside) and check it
    (check_graph); `shown_as` names the file in messages (the export's final place)."""
    require_onnx()
    wrapper = exported_model(checkpoint)
    max_len = checkpoint["model_config"]["max_len"]
    ids, mask = (torch.from_numpy(each) for each in
                 padded([[vocab.cls_id, vocab.sep_id], [vocab.cls_id, 7 % vocab.size, vocab.sep_id]], vocab.pad_id))
    path.parent.mkdir(exist_ok=True)
    with without_exporter_noise(), torch.no_grad():
        torch.onnx.export(wrapper, (ids, mask, torch.zeros_like(ids)), str(path), input_names=list(INPUTS),
                          output_names=list(output_names(checkpoint["task"])), dynamic_shapes=DYNAMIC_SHAPES,
                          opset_version=OPSET, dynamo=True, external_data=False, verbose=False)
    check_graph(path, wrapper, check_batches(vocab, max_len), shown_as)


@contextlib.contextmanager
def without_exporter_noise():
    """The exporter's EXPORTER_NOISE warnings and its registry's notes left out; every other warning shown."""
    registry = logging.getLogger(REGISTRY_LOGGER)
    level = registry.level
    registry.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            for message in EXPORTER_NOISE:
                warnings.filterwarnings("ignore", message=message)
            yield
    finally:
        registry.setLevel(level)


def check_graph(path: Path, wrapper: Outputs, batches, shown_as: Path) -> float:
    """Every output of the graph on every batch finite and within TOLERANCE of ours (times the output's
    largest magnitude where that passes 1); returns the largest difference seen over that scale, or
    refuses in one line naming the output, the batch and the place."""
    import onnxruntime
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    wanted = {each.name for each in session.get_inputs()}
    names = [each.name for each in session.get_outputs()]
    largest = 0.0
    for ids, mask in batches:
        feeds = {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
        theirs = session.run(None, {name: value for name, value in feeds.items() if name in wanted})
        with torch.no_grad():
            ours = wrapper(*(torch.from_numpy(feeds[name]) for name in INPUTS))
        ours = ours if isinstance(ours, tuple) else (ours,)
        for name, graph, reference in zip(names, theirs, ours):
            where = f"{ids.shape[0]} text(s) of up to {ids.shape[1]} pieces"
            if not np.isfinite(graph).all():
                raise UserError(f"{shown_as}: the graph's {name} is not finite for {where}: not written")
            reference = reference.float().numpy()
            difference = np.abs(graph - reference)
            worst = np.unravel_index(int(difference.argmax()), difference.shape)
            scale = max(1.0, float(np.abs(reference).max()))
            if difference[worst] > TOLERANCE * scale:
                raise UserError(f"{shown_as}: the graph's {name} differs from ours by {difference[worst]:.2e} at "
                                f"{tuple(int(i) for i in worst)} for {where} (at most {TOLERANCE * scale:.2g}): "
                                f"not written")
            largest = max(largest, float(difference[worst]) / scale)
    return largest


def check_graphable(checkpoint: dict, path: Path):
    """--onnx traces MLM, fine-tuned and encoder models: a causal LM or ELECTRA is refused first."""
    task = checkpoint["task"]
    if kind_of(task).family == PRE_TRAINING and task not in GRAPH_PRE_TRAINING:
        raise UserError(f"{path}: a {task} checkpoint: --onnx exports mlm, fine-tuned and encoder models; "
                        f"export it without --onnx")


def check_quantizable(checkpoint: dict, path: Path):
    """--quantize scores a fine-tuned task's validation split: a pre-training's checkpoint is refused first."""
    task = checkpoint["task"]
    if task not in FINE_TUNING_TASKS:  # their validation split scores a graph through onnx_model's classes
        raise UserError(f"{path}: a {task} checkpoint: --quantize scores the graphs on a fine-tuning task's "
                        f"validation split; quantize a fine-tuned model")


def write_quantized(graph: Path, scores_of: Callable[[dict[str, Path]], dict]) -> dict:
    """QUANTIZED_FILE and QUANTIZATION_REPORT beside `graph` (onnx/model.onnx), each graph scored by
    `scores_of` ({"float32": path, "int8": path} -> each one's metrics, and "metric": the headline);
    returns the report."""
    from onnxruntime.quantization import QuantType, quantize_dynamic
    quantized = graph.parent / Path(QUANTIZED_FILE).name
    logging.disable(logging.WARNING)  # its advice to pre-process the graph first, logged every time
    try:
        quantize_dynamic(graph, quantized, weight_type=QuantType.QInt8)
    finally:
        logging.disable(logging.NOTSET)
    scores = scores_of({"float32": graph, "int8": quantized})
    report = {"split": "val", "metric": scores.pop("metric")} | {
        kind: {"file": f"onnx/{path.name}", "megabytes": round(path.stat().st_size / 2 ** 20, 2),
               "metrics": scores[kind]} for kind, path in (("float32", graph), ("int8", quantized))}
    (graph.parent / Path(QUANTIZATION_REPORT).name).write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    return report


def quantization_line(report: dict) -> str:
    """One line: the headline metric and the size of each graph."""
    metric = report["metric"]
    float32, int8 = report["float32"], report["int8"]
    count = float32["metrics"].get("examples") or float32["metrics"].get("pairs") or float32["metrics"].get("queries")
    counted = f" of {count:,}" if count else ""
    shown = {kind: "undefined" if report[kind]["metrics"][metric] is None else f"{report[kind]['metrics'][metric]:.4f}"
             for kind in ("float32", "int8")}  # a correlation of constant predictions has none
    return (f"validation{counted}: {metric} {shown['float32']} float32 ({float32['megabytes']} MB), "
            f"{shown['int8']} int8 ({int8['megabytes']} MB, {QUANTIZED_FILE})")
