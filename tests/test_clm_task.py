"""src/tasks/clm_task.py: causal language modelling on the MLM shards: each position's label is the next
token, it learns and resumes through main.py, its encoder starts an MLM run, and static shards
give it their original ids."""
import subprocess
import sys

import pytest
import torch

import main
from conftest import TEST_DEVICE
from tasks.clm_task import CausalLMTask
from test_trainer import ROOT, load, scalars
from test_variants_training import val_losses
from vocab import load_vocab

pytestmark = pytest.mark.usefixtures("skip_flops_measurement")


@pytest.fixture
def task(mlm_workdir) -> CausalLMTask:
    config = main.load_config(None, ["--task-type", "clm"])
    return CausalLMTask(config, load_vocab(mlm_workdir / "vocab"), torch.device(TEST_DEVICE))


def test_each_label_is_the_next_token_and_none_follows_the_last(task):
    pad = task.vocab.pad_id
    ids = torch.tensor([[2, 50, 51, 52, 3, pad, pad], [2, 60, 61, 62, 63, 64, 3]])
    assert task.next_tokens(ids).tolist() == [[50, 51, 52, 3, -100, -100, -100], [60, 61, 62, 63, 64, 3, -100]]


def test_the_loss_counts_every_real_next_token(task):
    torch.manual_seed(0)
    model = task.build_model().to(task.device).eval()
    batch = next(task.eval_batches("val", 1))
    with torch.no_grad():
        loss, statistics = task.loss(model, batch)
    real = batch["input_ids"].numel() if batch["attention_mask"] is None else int(batch["attention_mask"].sum())
    count, hits = statistics.tolist()
    assert count == real - len(batch["input_ids"])  # the last token of each sample predicts nothing
    assert task.metrics(loss.item(), statistics) == {"loss": loss.item(), "accuracy": hits / count}


def test_causal_lm_learns_next_tokens_and_resumes(mlm_workdir):
    run_dir = main.run(main.load_config(None, ["--task-type", "clm", "--max-iters", "60",
                                               "--lr-decay-iters", "60", "--val-interval", "10"]), None, False)
    losses = val_losses(run_dir)
    accuracy = [value for _, value in scalars(run_dir)["val/accuracy"]]
    assert losses[-1] < losses[0] - 0.5 and accuracy[-1] > accuracy[0]
    checkpoint = load(run_dir / "checkpoints" / "checkpoint.pt")
    assert checkpoint["task"] == "clm" and checkpoint["model_config"]["causal"] is True
    # Nothing is masked, so another mask-rate cannot change what the run measures: it resumes.
    main.run(main.load_config(None, ["--task-type", "clm", "--max-iters", "70", "--lr-decay-iters", "60",
                                     "--mask-rate", "0.3"]), run_dir / "checkpoints" / "checkpoint.pt", False)
    assert load(run_dir / "checkpoints" / "checkpoint.pt")["step"] == 70
    assert "resuming" in (run_dir / "logs" / "log.txt").read_text()


def test_masked_lm_can_start_from_a_causal_checkpoint(mlm_workdir):
    """The comparison of objectives fine-tunes both; the encoder weights carry over, attention
    becomes bidirectional."""
    clm = main.run(main.load_config(None, ["--task-type", "clm", "--max-iters", "2"]), None, False)
    mlm = main.run(main.load_config(None, ["--max-iters", "2"]), clm / "checkpoints" / "checkpoint.pt", False)
    assert load(mlm / "checkpoints" / "checkpoint.pt")["model_config"]["causal"] is False
    assert "loaded the encoder of" in (mlm / "logs" / "log.txt").read_text()


def test_causal_lm_reads_the_original_ids_of_static_shards(mlm_static_base_dir, mlm_config, tmp_path, monkeypatch,
                                                           keep_signal_handlers):
    mlm_config(tmp_path, task_type="clm", base_dir=mlm_static_base_dir)
    monkeypatch.chdir(tmp_path)
    config = main.load_config(None, ["--base-dir", str(mlm_static_base_dir)])
    task = main.make_task(config)
    batch = next(task.eval_batches("val", 1))
    assert "positions" not in batch and not (batch["input_ids"] == task.vocab.mask_id).any()
    result = subprocess.run([sys.executable, str(ROOT / "src" / "main.py"), "--masking", "static"], cwd=tmp_path,
                            capture_output=True, text=True)
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "masking = static goes with task-type = mlm, not clm" in result.stderr
