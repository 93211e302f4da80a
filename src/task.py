"""What the trainer needs of a task (the Task protocol), the evaluation the language-model tasks
share: their loss and statistics summed over the batches, and the record of the user's own files a
checkpoint keeps as its data.
"""
import hashlib
from pathlib import Path
from typing import Iterator, Protocol

import torch
from torch import nn

from errors import UserError
from model import ModelConfig
from run_plan import Progress
from vocab import Vocab


class Task(Protocol):
    """A task supplies the model, the batches, the loss and the metrics; the trainer does the rest."""
    name: str  # saved in checkpoints: which task made them
    vocab: Vocab
    device: torch.device
    best_metric: str  # the validation metric that picks best.pt unless best-metric names another
    predictions_per_token: float  # share of the input tokens the output head scores, for MFU
    last_layer_share: float  # share of the tokens the last layer computes (model.Encoder's rows), for MFU
    measuring_keys: tuple[str, ...]  # Config fields that decide what the scores mean: a resumed run keeps them
    # The generator of the task's own random draws (an MLM's masks), seeded per rank: checkpoints keep its
    # state with the run's; None where the task draws none.
    random_generator: torch.Generator | None
    # What it trains on, kept in its checkpoints: a text for their lineage (the shards' pattern), or the
    # record of the user's own files it reads (files_record), which a resumed run finds unchanged.
    data_source: str | dict[str, dict[str, str]] | None

    def model_config(self, max_len: int | None = None) -> ModelConfig:
        """The shape of the task's model, heads included; max_len (the position table) from a
        checkpoint, else seq-len."""

    def build_model(self, max_len: int | None = None) -> nn.Module:
        """The task's model, of model_config(max_len)'s shape."""

    def check_data(self, splits: tuple[str, ...]):
        """Open and check these splits now: a bad file stops the run before its first step."""

    def train_examples(self) -> int:
        """The examples (an LM's samples) of one pass over the training split: what `epochs` counts."""

    def take_checkpoint_labels(self, names: tuple[str, ...], kept: bool):
        """Read the data against a checkpoint's label names, tag by name (kept: the model is the
        checkpoint's); a task whose outputs have no names (all but ner) passes."""

    def train_batches(self, position: dict | None) -> Iterator[tuple[dict, dict]]:
        """Endless (position after it, numpy batch) pairs from `position` on: the data order to resume."""

    def eval_batches(self, split: str, count: int | None) -> Iterator[dict]:
        """The same device batches of a split at every call: the first `count`, or all for None."""

    def loss(self, model: nn.Module, batch: dict,
             progress: Progress | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Mean loss and a vector of additive statistics whose first entry counts the predictions;
        progress: a training batch's step and share of the budget, for a task with a schedule of its
        own (the MLM's mask rate); None for evaluation batches."""

    def progress_metrics(self) -> dict[str, float]:
        """What the task's own schedule stands at after the last training step, for the training log
        (the MLM's falling mask rate); most tasks have none."""

    def metrics(self, loss: float, statistics: torch.Tensor) -> dict[str, float]:
        """Named metrics from the mean loss and the summed statistics: the training log's."""

    def evaluate(self, model: nn.Module, batches: Iterator[dict], autocast) -> dict[str, float]:
        """Named metrics over evaluation batches, all ranks' together, `loss` among them: from summed
        statistics (evaluate_by_sums), or from every prediction where a metric needs them (GLUE's)."""

    def show_predictions(self, model: nn.Module, autocast) -> str:
        """A few validation predictions as text, for the log."""

    def submission(self, model: nn.Module, split: str, autocast) -> dict[str, list[str]] | None:
        """Each predictions file's name -> its lines, where the task writes them for the split: GLUE's
        test sets (their labels hidden), the user's own test file; else None."""

    def labels_known(self, split: str) -> bool:
        """Whether the split's labels are known, so --test scores it (GLUE's test sets hide theirs)."""


@torch.no_grad()
def evaluate_by_sums(task: Task, model: nn.Module, batches: Iterator[dict], autocast) -> dict[str, float]:
    """The task's metrics from its loss and statistics summed over the batches and the ranks; the sums
    stay on the device until the end."""
    model.eval()
    loss_sum, totals = torch.zeros((), device=task.device, dtype=torch.float64), 0
    for batch in batches:
        with autocast:
            loss, statistics = task.loss(model, batch)
        loss_sum += loss.double() * statistics[0]
        totals = totals + statistics.double()
    model.train()
    if isinstance(totals, int):
        raise UserError("the evaluation split has no batch: it holds fewer samples than batch-size")
    summed = torch.cat([loss_sum[None], totals])
    if torch.distributed.is_initialized():
        torch.distributed.all_reduce(summed)
    return task.metrics(summed[0].item() / summed[1].item(), summed[1:].cpu())


def chosen_metric(config, task: Task) -> str:
    """The validation metric best.pt goes by: best-metric, else the task's own."""
    return config.best_metric or task.best_metric


def files_record(files: dict[str, tuple[Path, ...]]) -> dict[str, dict[str, str]] | None:
    """Each file's sha256 by the key that names it and its path ({"validation-file": {"dev.csv": "ab12..."}}):
    what a checkpoint keeps as its data, so a resumed run finds out a file whose contents changed under the
    same name (run_start.check_same_files); None where the task reads no such file."""
    record = {key: {str(path): file_sha256(path) for path in paths} for key, paths in files.items() if paths}
    return record or None


def file_sha256(path: Path, chunk_bytes: int = 8 << 20) -> str:
    """sha256 of a file's bytes, read a chunk at a time: a training file may be larger than memory."""
    digest = hashlib.sha256()
    with Path(path).open("rb") as file:
        while chunk := file.read(chunk_bytes):
            digest.update(chunk)
    return digest.hexdigest()
