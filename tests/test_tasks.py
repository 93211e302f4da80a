"""src/tasks/__init__.py: the table a run's task class comes from. A task of a test's own, one class here
and one row in each table (what the task-type is: architecture.TASK_KINDS; the class that trains it:
tasks.TASK_CLASSES), trains, checkpoints and resumes through main.py like the program's own tasks."""
import math
from pathlib import Path

import torch

import architecture
import main
import tasks
from tasks.lm_data import DATA_KEYS, CorpusTask, LanguageModelData
from model import BertForMaskedLM, ModelConfig
from run_plan import Progress
from tasks.mlm_task import token_statistics

COPIED = 8  # the first positions of each row, whose own token the model names


class CopyTask(CorpusTask):
    """Names the token at each of the first COPIED positions, unmasked: the smallest objective that learns."""
    name = "copy"
    measuring_keys = DATA_KEYS

    def __init__(self, config, vocab, device: torch.device, rank: int = 0, world_size: int = 1):
        super().__init__(config, vocab, device, LanguageModelData(config, vocab, rank, world_size))
        self.predictions_per_token = COPIED / config.seq_len

    def model_config(self, max_len: int | None = None) -> ModelConfig:
        from config import model_config
        return model_config(self.config, self.vocab, max_len)

    def build_model(self, max_len: int | None = None) -> BertForMaskedLM:
        return BertForMaskedLM(self.model_config(max_len))

    def eval_batches(self, split: str, count: int | None):
        from hardware import to_device
        for batch in self.data.fixed_batches(split, count):
            yield to_device(batch, self.device, non_blocking=False)

    def loss(self, model, batch: dict, progress: Progress | None = None):
        input_ids = batch["input_ids"]
        positions = torch.arange(COPIED, device=input_ids.device).expand(len(input_ids), COPIED)
        labels = input_ids[:, :COPIED]
        logits, loss = model(input_ids, positions, labels, attention_mask=batch["attention_mask"])
        return loss, token_statistics(logits, labels)

    def metrics(self, loss: float, statistics: torch.Tensor) -> dict:
        count, hits = statistics.tolist()
        return {"loss": loss, "accuracy": hits / count}

    def evaluate(self, model, batches, autocast) -> dict:
        from task import evaluate_by_sums
        return evaluate_by_sums(self, model, batches, autocast)

    def show_predictions(self, model, autocast) -> str:
        return ""


def registered(monkeypatch):
    """The copy task in both tables, as a new task's module and rows would put it."""
    monkeypatch.setitem(architecture.TASK_KINDS, "copy", architecture.TaskKind(
        architecture.PRE_TRAINING, "BertForMaskedLM", "BertForMaskedLM", "BertVariantForMaskedLM"))
    monkeypatch.setitem(tasks.TASK_CLASSES, "copy", lambda: CopyTask)


def test_every_task_type_has_its_class_and_only_its_own_module_is_imported_for_it():
    assert list(tasks.TASK_CLASSES) == list(architecture.TASK_KINDS)
    for name in architecture.TASK_KINDS:
        assert tasks.task_class(name).__module__.startswith("tasks."), name


def test_a_task_of_its_own_trains_checkpoints_and_resumes(mlm_workdir, monkeypatch, skip_flops_measurement):
    """Registered, it is a task-type like any: it learns (its validation loss a nat under a uniform guess's),
    its checkpoints name it, and a resume goes on from them."""
    registered(monkeypatch)
    settings = ["--task-type", "copy", "--val-interval", "30"]
    run_dir = main.run(main.load_config(None, [*settings, "--max-iters", "30"]), None, False)
    best = torch.load(run_dir / "checkpoints" / "best.pt", weights_only=False)
    vocab_size = best["model_config"]["vocab_size"]
    assert best["task"] == "copy" and best["step"] == 30 and best["best"] < math.log(vocab_size) - 1
    again = main.run(main.load_config(None, [*settings, "--max-iters", "40"]),
                     Path(run_dir / "checkpoints" / "checkpoint.pt"), False)
    latest = torch.load(again / "checkpoints" / "checkpoint.pt", weights_only=False)
    assert (again, latest["task"], latest["step"]) == (run_dir, "copy", 40)
