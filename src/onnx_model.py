"""An exported directory's ONNX graph behind our model classes' calls, so that the inference scripts
(classify.py, embed.py, ner.py, qa.py), bench_infer.py and the int8 check of export_hf.py run it in
onnxruntime as they run a checkpoint in PyTorch: same inputs, same outputs, same losses.

`--cp` takes a checkpoint, an exported directory with onnx/model.onnx, its onnx/ folder, or one .onnx
file in that folder (the int8 one, say). The directory's config.json, tokenizer and
sentence-transformers files say what the graph is, as import_hf.py reads them.
"""
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

import checkpoints
from architecture import ANSWERS, CLASSIFICATION, EMBEDDING, ENCODER, PRE_TRAINING, TOKENS, kind_of
from errors import UserError
from model import IGNORE_INDEX, ModelConfig, at_positions, pool, sequence_loss, token_loss

GRAPH = Path("onnx") / "model.onnx"  # where export_hf.py --onnx writes it
INSTALL = "pip install onnx onnxruntime"  # what --onnx and running a graph need
# What each inference script's --cp help adds to the checkpoint it names.
OR_EXPORTED = "; or its export with --onnx (the directory, its onnx/ folder or a .onnx file there), run in onnxruntime"


class OnnxModel(nn.Module):
    """An onnxruntime session of the graph; a subclass answers as our model class of the head."""

    def __init__(self, path: Path, config: ModelConfig):
        super().__init__()
        self.config = config
        self.path = path
        self.session = session(path)
        self.inputs = {each.name for each in self.session.get_inputs()}

    def outputs(self, input_ids, attention_mask=None, segment_ids=None) -> tuple[list[torch.Tensor], torch.Tensor]:
        """The graph's outputs, as float32 tensors, for our model's inputs (a bool mask, or None: every
        token), the columns past the last real token left out (a batch made for a GPU or a compiled model is
        padded to a multiple of 8: the graph needs no such shapes, and padding costs time); with the mask so cut."""
        mask = torch.ones_like(input_ids, dtype=torch.bool) if attention_mask is None else attention_mask.bool()
        width = int(mask.any(0).nonzero().max()) + 1
        segments = torch.zeros_like(input_ids) if segment_ids is None else segment_ids
        feeds = {"input_ids": input_ids, "attention_mask": mask, "token_type_ids": segments}
        fed = {name: value[:, :width].cpu().long().numpy() for name, value in feeds.items() if name in self.inputs}
        return [torch.from_numpy(np.asarray(each)) for each in self.session.run(None, fed)], mask[:, :width]


def widened(values: torch.Tensor, width: int) -> torch.Tensor:
    """Values per token ([batch, tokens] or [batch, tokens, classes]) padded with zeros to `width` tokens."""
    extra = width - values.shape[1]
    return F.pad(values, (0, extra) if values.dim() == 2 else (0, 0, 0, extra))


class OnnxMaskedLM(OnnxModel):
    def forward(self, input_ids, positions, labels=None, attention_mask=None, segment_ids=None):
        """The graph scores every token; our model's answer is its logits at `positions`."""
        (logits,), _ = self.outputs(input_ids, attention_mask, segment_ids)
        masked = at_positions(logits, positions)
        return masked, None if labels is None else token_loss(masked, labels)


class OnnxSequenceClassification(OnnxModel):
    def forward(self, input_ids, labels=None, attention_mask=None, segment_ids=None):
        (logits,), _ = self.outputs(input_ids, attention_mask, segment_ids)
        return logits, None if labels is None else sequence_loss(logits, labels, self.config.multi_label)


class OnnxTokenClassification(OnnxModel):
    def forward(self, input_ids, labels=None, attention_mask=None, segment_ids=None):
        (logits,), _ = self.outputs(input_ids, attention_mask, segment_ids)
        logits = widened(logits, input_ids.shape[1])
        if labels is None:
            return logits, None
        return logits, F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=IGNORE_INDEX)


class OnnxQuestionAnswering(OnnxModel):
    def forward(self, input_ids, attention_mask=None, segment_ids=None, start_positions=None, end_positions=None):
        outputs, _ = self.outputs(input_ids, attention_mask, segment_ids)
        start, end = (widened(each, input_ids.shape[1]) for each in outputs)
        if start_positions is None:
            return start, end, None
        return start, end, (F.cross_entropy(start, start_positions) + F.cross_entropy(end, end_positions)) / 2


class OnnxEmbedding(OnnxModel):
    def forward(self, input_ids, attention_mask=None, segment_ids=None):
        (hidden,), mask = self.outputs(input_ids, attention_mask, segment_ids)
        return F.normalize(pool(hidden, mask, self.config.pooling), dim=-1)


# The class that runs a family's graph behind our model's call.
ONNX_CLASSES = {PRE_TRAINING: OnnxMaskedLM, CLASSIFICATION: OnnxSequenceClassification, TOKENS: OnnxTokenClassification,
                ANSWERS: OnnxQuestionAnswering, EMBEDDING: OnnxEmbedding, ENCODER: OnnxEmbedding}


def onnx_class(task: str) -> type[OnnxModel]:
    return ONNX_CLASSES[kind_of(task).family]


def session(path: Path):
    """An onnxruntime session on the CPU with as many threads as torch uses (the same machine share)."""
    try:
        import onnxruntime
    except ImportError:
        raise UserError(f"{path}: running an ONNX graph needs onnxruntime: {INSTALL}") from None
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = torch.get_num_threads()
    options.log_severity_level = 3  # errors only: its notes on unused initializers are not the user's
    try:
        return onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    except Exception as error:  # onnxruntime raises its own types, one per kind of bad file
        raise UserError(f"{path}: not a graph onnxruntime runs ({str(error).splitlines()[0][:200]})") from None


def graph_and_directory(path: Path) -> tuple[Path, Path]:
    """(the .onnx file, the exported directory) that `path` names: the directory, its onnx/ folder or a
    file in that folder."""
    if path.is_dir() and path.name == GRAPH.parent.name and (path / GRAPH.name).is_file():
        return path / GRAPH.name, path.parent
    if path.is_dir():
        graph = path / GRAPH
        if not graph.is_file():
            raise UserError(f"{path}: a directory without {GRAPH}: export with --onnx, or give a checkpoint")
        return graph, path
    return path, path.parent.parent


def is_onnx(path: Path) -> bool:
    return path.is_dir() or path.suffix == ".onnx"


def restore_model(path: Path, kinds: dict[str, type]) -> tuple[nn.Module, object, dict]:
    """checkpoints.restore_model, or for an exported directory (or a .onnx file in its onnx/ folder)
    the graph in onnxruntime behind the call of our model class for its task, with the directory's
    vocabulary and a checkpoint's fields (task, model_config, config) as import_hf.py reads them."""
    if not is_onnx(path):
        return checkpoints.restore_model(path, kinds)
    graph, directory = graph_and_directory(path)
    if not graph.is_file():
        raise UserError(f"{graph}: no such file")
    if not (directory / "config.json").is_file():
        raise UserError(f"{graph}: not in an exported directory's onnx/ folder (no {directory / 'config.json'})")
    import hf_import  # the directory's metadata, read as an import reads it
    state, _ = hf_import.read_model(directory, shapes_only=True)
    if state["task"] not in kinds:
        raise UserError(f"{path}: a {state['task']} model; expected {' or '.join(kinds)}")
    config = ModelConfig(**state["model_config"])
    return onnx_class(state["task"])(graph, config).eval(), checkpoints.vocab_of(state), state
