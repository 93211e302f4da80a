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
INPUTS = ("input_ids", "attention_mask", "token_type_ids")  # a graph takes input_ids and any of the others
FREE_AXES = ("batch", "sequence")  # any size; every other axis is as wide as the ModelConfig field it names


class OnnxModel(nn.Module):
    """An onnxruntime session of the graph; a subclass answers as our model class of the head, whose
    graph gives OUTPUTS (each output's axes: FREE_AXES, or the ModelConfig field that sizes one)."""
    HEAD = ""
    OUTPUTS: dict[str, tuple[str, ...]] = {}

    def __init__(self, path: Path, config: ModelConfig):
        super().__init__()
        self.config = config
        self.path = path
        self.session = session(path)
        check_signature(path, self.session, self.HEAD, expected_outputs(self.OUTPUTS, config))
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
    HEAD = "a masked LM's"
    OUTPUTS = {"logits": ("batch", "sequence", "vocab_size")}

    def forward(self, input_ids, positions, labels=None, attention_mask=None, segment_ids=None):
        """The graph scores every token; our model's answer is its logits at `positions`."""
        (logits,), _ = self.outputs(input_ids, attention_mask, segment_ids)
        masked = at_positions(logits, positions)
        return masked, None if labels is None else token_loss(masked, labels)


class OnnxSequenceClassification(OnnxModel):
    HEAD = "a sequence classifier's"
    OUTPUTS = {"logits": ("batch", "num_labels")}

    def forward(self, input_ids, labels=None, attention_mask=None, segment_ids=None):
        (logits,), _ = self.outputs(input_ids, attention_mask, segment_ids)
        return logits, None if labels is None else sequence_loss(logits, labels, self.config.multi_label)


class OnnxTokenClassification(OnnxModel):
    HEAD = "a token classifier's"
    OUTPUTS = {"logits": ("batch", "sequence", "num_labels")}

    def forward(self, input_ids, labels=None, attention_mask=None, segment_ids=None):
        (logits,), _ = self.outputs(input_ids, attention_mask, segment_ids)
        logits = widened(logits, input_ids.shape[1])
        if labels is None:
            return logits, None
        return logits, F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=IGNORE_INDEX)


class OnnxQuestionAnswering(OnnxModel):
    HEAD = "a question answering model's"
    OUTPUTS = {"start_logits": ("batch", "sequence"), "end_logits": ("batch", "sequence")}

    def forward(self, input_ids, attention_mask=None, segment_ids=None, start_positions=None, end_positions=None):
        outputs, _ = self.outputs(input_ids, attention_mask, segment_ids)
        start, end = (widened(each, input_ids.shape[1]) for each in outputs)
        if start_positions is None:
            return start, end, None
        return start, end, (F.cross_entropy(start, start_positions) + F.cross_entropy(end, end_positions)) / 2


class OnnxEmbedding(OnnxModel):
    HEAD = "an encoder's"
    OUTPUTS = {"last_hidden_state": ("batch", "sequence", "d_model")}

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


Shape = tuple[str | int | None, ...]  # an axis: its name where free, its size where fixed, None where unknown


def expected_outputs(outputs: dict[str, tuple[str, ...]], config: ModelConfig) -> dict[str, Shape]:
    """A head's OUTPUTS with each fixed axis as wide as the config says."""
    return {name: tuple(axis if axis in FREE_AXES else getattr(config, axis) for axis in axes)
            for name, axes in outputs.items()}


def check_signature(path: Path, graph_session, head: str, outputs: dict[str, Shape]):
    """The graph takes our inputs and gives the head's outputs, so that a graph of another head (an MLM's
    in a classifier's directory, say) is refused at load, in one line naming what it has and what was
    expected, rather than failing in the middle of the script's work."""
    found = {each.name: tuple(each.shape) for each in graph_session.get_inputs()}
    if "input_ids" not in found or set(found) - set(INPUTS) or not all(
            fits(shape, FREE_AXES) for shape in found.values()):
        raise UserError(f"{path}: the graph takes {signature_text(found)}; expected input_ids, with "
                        f"attention_mask and token_type_ids or not, each [batch, sequence]")
    found = {each.name: tuple(each.shape) for each in graph_session.get_outputs()}
    if list(found) != list(outputs) or not all(fits(found[name], shape) for name, shape in outputs.items()):
        raise UserError(f"{path}: the graph gives {signature_text(found)}; expected {head} "
                        f"{signature_text(outputs)}")


def fits(shape: Shape, expected: Shape) -> bool:
    """The expected rank, each axis fitting (onnxruntime shows an output whose rank the graph does not
    say as no axes: it may be anything)."""
    if not shape:
        return True
    return len(shape) == len(expected) and all(axis_fits(axis, wanted) for axis, wanted in zip(shape, expected))


def axis_fits(axis: str | int | None, wanted: str | int) -> bool:
    """A fixed axis of the graph fits an expected axis of that size alone, never a free one (the scripts
    run any number of texts of any length); an axis the graph leaves free (named, or of a size it does
    not say) fits any, its size known only when the graph runs."""
    return not isinstance(axis, int) or axis == wanted


def signature_text(shapes: dict[str, Shape]) -> str:
    """`logits [batch, sequence, 2000]`, each output so, between commas; none: `nothing`."""
    return ", ".join(f"{name} [{', '.join('?' if axis is None else str(axis) for axis in shape)}]"
                     for name, shape in shapes.items()) or "nothing"


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
    from interop import hf_import  # the directory's metadata, read as an import reads it
    state, _ = hf_import.read_model(directory, shapes_only=True)
    if state["task"] not in kinds:
        raise UserError(f"{path}: a {state['task']} model; expected {' or '.join(kinds)}")
    config = ModelConfig(**state["model_config"])
    return onnx_class(state["task"])(graph, config).eval(), checkpoints.vocab_of(state), state
