"""src/tasks/mlm_task.py: masked language modelling on real IMDB shards: dynamic masks by each masking
key, stored masks (ours and the original project's), the loss and its statistics, and the
predictions shown in the log."""
import gzip
import math
from pathlib import Path

import msgpack
import numpy as np
import pytest
import torch

import main
from conftest import TEST_DEVICE, make_mlm_workdir
from run_plan import Progress
from tasks.mlm_task import MaskedLMTask
from shards import read_shard
from test_trainer import scalars
from vocab import load_vocab


# A short, fast schedule: twelve steps at a high learning rate reach well below ln(vocab size).
QUICK = ["--max-iters", "12", "--lr-decay-iters", "12", "--val-interval", "4", "--warmup-iters", "2",
         "--learning-rate", "1e-2", "--min-learning-rate", "1e-3"]


def check_learned(base: Path, below_chance: float = 0.8) -> None:
    vocab_size = load_vocab(base / "vocab").size
    losses = [value for _, value in scalars(base / "runs" / "run0")["val/loss"]]
    assert len(losses) == 3
    assert losses[-1] < losses[0] and losses[-1] < math.log(vocab_size) - below_chance, losses


def test_static_masked_shards_train(mlm_static_base_dir, mlm_config, monkeypatch, keep_signal_handlers,
                                    skip_flops_measurement, training_losses):
    shard = read_shard(next((mlm_static_base_dir / "datasets").glob("train_*")))
    assert shard.masking == "static"
    mlm_config(mlm_static_base_dir, masking="static")
    monkeypatch.chdir(mlm_static_base_dir)
    main.main(QUICK)
    check_learned(mlm_static_base_dir)
    assert len(training_losses) == 12 and all(math.isfinite(loss) for loss in training_losses)


def write_legacy_shard(path: Path, samples: list[np.ndarray], mask_id: int, rng) -> None:
    """The original project's format: one msgpack list alternating id lists and label lists."""
    items = []
    for sample in samples:
        ids = sample.astype(np.int64).tolist()
        labels = [0] * len(ids)
        for position in rng.choice(np.arange(1, len(ids) - 1), max(1, (len(ids) - 2) * 15 // 100), replace=False):
            labels[position], ids[position] = ids[position], mask_id
        items += [ids, labels]
    path.write_bytes(gzip.compress(msgpack.packb(items)))


def test_legacy_shards_train(mlm_workdir, skip_flops_measurement):
    rng = np.random.default_rng(0)
    datasets = mlm_workdir / "datasets"
    mask_id = load_vocab(mlm_workdir / "vocab").mask_id
    for split, count in (("train", 2000), ("val", 300), ("test", 300)):
        shard = read_shard(datasets / f"{split}_imdb_64_123.msgpack.gz")
        write_legacy_shard(datasets / f"{split}_old_1.msgpack.gz", [shard.sample(i) for i in range(count)],
                           mask_id, rng)
    main.main([*QUICK, "--masking", "static", "--dataset-pattern", "train_old_*.msgpack",
               "--val-dataset-pattern", "val_old_*.msgpack", "--test-dataset-pattern", "test_old_*.msgpack"])
    check_learned(mlm_workdir)


# Whole words are harder to guess from word-piece counts alone: the loss falls less in twelve steps.
@pytest.mark.parametrize("options, below_chance", [(["--whole-word-masking"], 0.5), (["--mask-rate", "0.3"], 0.8)],
                         ids=["whole_words", "rate_0.3"])
def test_dynamic_masking_options_train(mlm_workdir, skip_flops_measurement, options, below_chance):
    main.main([*QUICK, *options])
    check_learned(mlm_workdir, below_chance)


def test_mask_rate_0_3_fills_its_slots(mlm_workdir):
    config = main.load_config(None, ["--mask-rate", "0.3"])
    task = MaskedLMTask(config, load_vocab(mlm_workdir / "vocab"), torch.device(TEST_DEVICE))
    ids = torch.from_numpy(next(task.data.fixed_batches("val", 1))["input_ids"].astype(np.int64))
    generator = torch.Generator().manual_seed(0)
    labels = task.masker.with_masks({"input_ids": ids}, generator, task.masker.rule.mask_rate)["labels"].cpu()
    assert labels.shape == (config.batch_size, math.ceil(0.3 * config.seq_len))
    maskable = ~torch.isin(ids, task.masker.special_ids.cpu())  # the masker's ids live on the task's device
    assert (labels != -100).sum() / maskable.sum() == pytest.approx(0.3, abs=0.02)


def test_static_whole_word_shards_train(mlm_static_whole_word_base_dir, mlm_config, monkeypatch,
                                        keep_signal_handlers, skip_flops_measurement):
    mlm_config(mlm_static_whole_word_base_dir, masking="static", whole_word_masking="true", mask_rate=0.3)
    monkeypatch.chdir(mlm_static_whole_word_base_dir)
    main.main(QUICK)
    check_learned(mlm_static_whole_word_base_dir)


@pytest.fixture
def task(mlm_workdir) -> MaskedLMTask:
    config = main.load_config(None, [])
    return MaskedLMTask(config, load_vocab(mlm_workdir / "vocab"), torch.device(TEST_DEVICE))


def test_a_batch_is_masked_once_keeping_its_ids_and_stored_masks_pass(task):
    batch = {name: torch.as_tensor(value) if value is not None else None
             for name, value in next(task.data.fixed_batches("val", 1)).items()}
    masked = task.masker.masked(batch, Progress(0, 0.0))
    assert masked["original_ids"] is batch["input_ids"]
    labelled = masked["labels"] != -100
    rows = torch.arange(len(labelled))[:, None].expand_as(labelled)
    assert torch.equal(masked["labels"][labelled], batch["input_ids"][rows[labelled], masked["positions"][labelled]])
    assert task.masker.masked(masked, Progress(1, 0.0)) is masked  # masks there: kept


def test_the_loss_counts_the_masked_tokens_and_an_untrained_model_guesses(task):
    torch.manual_seed(0)
    model = task.build_model().to(task.device).eval()
    batch = next(task.eval_batches("val", 1))
    with torch.no_grad():
        loss, statistics = task.loss(model, batch)
    count, hits = statistics.tolist()
    assert count == (batch["labels"] != -100).sum().item() > 0
    assert loss.item() == pytest.approx(math.log(task.vocab.size), abs=0.5)  # about uniform
    metrics = task.metrics(loss.item(), statistics)
    assert metrics == {"loss": loss.item(), "accuracy": hits / count} and hits / count < 0.05


def test_the_log_shows_the_predictions_and_the_original_at_the_masks(task):
    torch.manual_seed(0)
    model = task.build_model().to(task.device)
    shown = task.show_predictions(model, torch.autocast("cpu", enabled=False)).splitlines()
    batch = next(task.eval_batches("val", 1))
    masked = int((batch["labels"][0] != -100).sum())
    assert [line[:11] for line in shown] == ["predicted: ", "original:  "]
    assert all(line.count("/") == 2 * masked for line in shown)
    assert model.training  # back to training after the look


def test_shards_of_documents_apart_train_mlm_electra_and_clm_with_their_document_ids(
        mlm_apart_base_dir, tmp_path, monkeypatch, keep_signal_handlers, skip_flops_measurement):
    seen, original = [], MaskedLMTask.loss

    def recording(self, model, batch, progress=None):
        seen.append(batch.get("document_ids"))
        return original(self, model, batch, progress)

    monkeypatch.setattr(MaskedLMTask, "loss", recording)
    work = make_mlm_workdir(mlm_apart_base_dir, tmp_path / "work")
    monkeypatch.chdir(work)
    main.main(QUICK)
    check_learned(work)
    assert all(ids is not None for ids in seen) and max(int(ids.max()) for ids in seen) > 0
    for task in ("electra", "clm"):  # each runs on them too
        main.main(["--task-type", task, "--max-iters", "2", "--val-interval", "2", "--val-iters", "1"])
