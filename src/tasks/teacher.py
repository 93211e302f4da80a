"""A teacher a student learns from (task-type = distill, and a fine-tuning task with teacher = PATH):
a transformers or sentence-transformers directory converted in memory, or a checkpoint of ours. It
runs beside the student, frozen and in eval mode, and reads the student's vocabulary."""
from pathlib import Path

import torch
from torch import nn

import checkpoints
from errors import UserError
from model import ModelConfig
from corpus.input_files import find_inputs, read_documents
from corpus.tokenizing import split_sentences
from interop import hf_import


def read_teacher(path: Path, vocab, seq_len: int) -> tuple[dict, ModelConfig]:
    """The teacher's checkpoint contents and model shape; its vocabulary must be the run's and its
    positions must reach seq-len."""
    if path.is_dir():
        state = hf_import.read_model(path)[0]
    elif path.is_file():
        state = checkpoints.load(path)
    else:
        raise UserError(f"teacher = {path}: no such directory or checkpoint file")
    if state["vocab_checksum"] != vocab.checksum or state["vocab_lowercase"] != vocab.lowercase:
        raise UserError(f"vocab = {vocab.path}: not the vocabulary of teacher = {path} (checksum or casing "
                        f"differs); the student shares the teacher's: prepare the data with it")
    config = ModelConfig(**state["model_config"])
    if config.position == "learned" and config.max_len < seq_len:
        raise UserError(f"seq-len = {seq_len}: longer than teacher = {path}'s position table ({config.max_len})")
    return state, config


def frozen(model: nn.Module, state: dict, path: Path, device: torch.device) -> nn.Module:
    """The model with the teacher's weights (every one it has must be there), frozen, in eval mode."""
    missing = checkpoints.load_weights(model, state["model"], path, strict=False)
    if missing:
        raise UserError(f"teacher = {path}: weights missing: {', '.join(missing[:3])}")
    return model.to(device).eval().requires_grad_(False)


def load_teacher(path: Path, vocab, seq_len: int, device: torch.device, model_class: type) -> nn.Module:
    """The teacher as a `model_class` of its shape: read, checked and frozen on the device."""
    state, config = read_teacher(path, vocab, seq_len)
    return frozen(model_class(config), state, path, device)


def transfer_sentences(pattern: str) -> list[str]:
    """The sentences of every document of transfer-data (the text a teacher labels for its student), in order."""
    return [sentence for documents in read_documents(find_inputs([pattern]))
            for document in documents for sentence in split_sentences(document)]
