"""The training loop on real IMDB shards: learning, exact resume, checkpoints, stop
requests (file and SIGTERM), NaN guard, test scores, run directories and TensorBoard scalars; the
figures of a log line (mean loss, summed statistics, tokens/s, MFU) with pauses left out, the sums a
checkpoint keeps, and the clock a time budget counts (a fake clock)."""
import json
import math
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

import main
import trainer
from conftest import MLM_SEQ_LEN
from tasks.mlm_task import MaskedLMTask
from vocab import load_vocab
from trainer import Clock, Throughput, cut_rows, improves

ROOT = Path(__file__).resolve().parent.parent
CHECKPOINT_KEYS = {"model", "optimizer", "config", "step", "data_position", "rng_per_rank", "best"}
SCALAR_TAGS = {"train/loss", "train/lr", "train/tokens", "train/tokens_per_sec", "train/mfu",
               "val/loss", "val/accuracy", "val/tokens"}


def scalars(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar of a run's TensorBoard event files: tag -> [(step, value)]."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    events = EventAccumulator(str(run_dir / "logs"), size_guidance={"scalars": 0})
    events.Reload()
    return {tag: [(event.step, event.value) for event in events.Scalars(tag)]
            for tag in events.Tags()["scalars"]}


def load(path: Path) -> dict:
    return torch.load(path, map_location="cpu", weights_only=True)


def test_an_undefined_score_is_no_score_for_the_best_checkpoint():
    """None (a correlation of constant predictions) beats no score and loses to any; until a score is
    defined, each validation's checkpoint is best.pt, so a run always leaves one."""
    assert improves(None, None, lower_is_better=False) and improves(0.1, None, lower_is_better=False)
    assert not improves(None, -0.5, lower_is_better=False) and not improves(None, 3.0, lower_is_better=True)
    assert improves(0.2, 0.1, lower_is_better=False) and not improves(0.1, 0.2, lower_is_better=False)
    assert improves(2.0, 3.0, lower_is_better=True) and not improves(3.0, 3.0, lower_is_better=True)


# ----------------------------------------------------------------------------- learning

def test_training_lowers_validation_loss_and_beats_chance(mlm_trained_run):
    vocab_size = load_vocab(mlm_trained_run / "vocab").size
    values = scalars(mlm_trained_run / "runs" / "run0")
    val_loss = [value for _, value in values["val/loss"]]
    accuracy = [value for _, value in values["val/accuracy"]]
    assert [step for step, _ in values["val/loss"]] == list(range(5, 41, 5))

    # An untrained model scores about ln(vocab size) and 1/vocab size; unigram statistics alone
    # reach about ln(V) - 1.2 and 4% within these 40 steps.
    assert val_loss[0] > val_loss[-1] + 0.8
    assert val_loss[-1] < math.log(vocab_size) - 1.0
    assert accuracy[-1] > 20 / vocab_size
    train_loss = [value for _, value in values["train/loss"]]
    assert np.mean(train_loss[-10:]) < np.mean(train_loss[:10]) - 0.8


def test_run_directory_keeps_a_config_that_loads_back(mlm_trained_run):
    run_dir = mlm_trained_run / "runs" / "run0"
    saved = main.load_config(run_dir / "config.ini", [])
    assert saved.to_dict() == load(run_dir / "checkpoints" / "checkpoint.pt")["config"]
    assert (run_dir / "finished").read_text() == "step 40\n"  # it reached max-iters


def test_tokens_count_every_input_position(mlm_trained_run):
    """Batches of batch-size x seq-len: tokens at step s are s times that, in events and checkpoints."""
    run_dir = mlm_trained_run / "runs" / "run0"
    config = main.load_config(run_dir / "config.ini", [])
    per_step = config.batch_size * config.seq_len
    for tag in ("train/tokens", "val/tokens"):
        assert all(value == step * per_step for step, value in scalars(run_dir)[tag])
    checkpoint = load(run_dir / "checkpoints" / "checkpoint.pt")
    assert checkpoint["tokens"] == checkpoint["step"] * per_step


def test_log_has_a_line_per_step_and_per_validation(mlm_trained_run):
    log = (mlm_trained_run / "runs" / "run0" / "logs" / "log.txt").read_text(encoding="utf-8")
    train_steps = [int(step) for step in re.findall(r"^step (\d+) \| loss [\d.]+ \| lr ", log, re.M)]
    val_steps = [int(step) for step in re.findall(r"^step (\d+) \| val loss [\d.]+ \| val accuracy ", log, re.M)]
    assert train_steps == list(range(1, 41))
    assert val_steps == list(range(5, 41, 5))
    peak = re.search(r"^mfu against a (\w+) matmul peak of ([\d.]+) TFLOP/s, measured now \(best of 5 tries\)$",
                     log, re.M)
    assert peak and peak[1] in ("bfloat16", "float32") and float(peak[2]) > 0


def test_tensorboard_has_train_and_validation_scalars(mlm_trained_run):
    values = scalars(mlm_trained_run / "runs" / "run0")
    assert SCALAR_TAGS <= set(values)
    assert [step for step, _ in values["train/loss"]] == list(range(1, 41))
    assert [step for step, _ in values["val/accuracy"]] == list(range(5, 41, 5))
    lr = dict(values["train/lr"])
    assert lr[1] < lr[10] and lr[40] == pytest.approx(2e-4, rel=0.05)  # warmup, then decayed to the minimum
    assert all(value > 0 for _, value in values["train/tokens_per_sec"] + values["train/mfu"])


# ----------------------------------------------------------------------------- checkpoints

def test_checkpoints_load_safely_and_hold_the_training_state(mlm_trained_run):
    checkpoints = mlm_trained_run / "runs" / "run0" / "checkpoints"
    latest = load(checkpoints / "checkpoint.pt")
    assert CHECKPOINT_KEYS <= set(latest)
    assert latest["step"] == 40
    assert latest["config"]["max-iters"] == 40
    position = latest["data_position"]
    assert (position["epoch"], position["sample"]) == (0, 40 * 16)
    assert list(position["shards"]) == ["train_imdb_64_123.msgpack.gz"]  # the data it is a position in
    assert latest["optimizer"]["state"]  # Adam moments
    assert latest["optimizer"]["param_groups"][0]["lr"] == pytest.approx(2e-4, rel=0.05)
    assert {"torch", "mask"} <= set(latest["rng_per_rank"][0])

    best = load(checkpoints / "best.pt")
    assert CHECKPOINT_KEYS <= set(best)
    val_loss = scalars(mlm_trained_run / "runs" / "run0")["val/loss"]
    best_step, best_loss = min(val_loss, key=lambda item: item[1])
    assert best["step"] == best_step and best["best"] == pytest.approx(best_loss)
    assert latest["best"] == pytest.approx(best_loss)


def test_max_checkpoints_keeps_the_latest_and_older_ones(mlm_trained_run):
    checkpoints = mlm_trained_run / "runs" / "run0" / "checkpoints"
    older = sorted(checkpoints.glob("checkpoint-*.pt"))
    assert (checkpoints / "checkpoint.pt").is_file()
    assert len(older) == 2  # max-checkpoints 3, eight validations
    for path in older:
        assert CHECKPOINT_KEYS <= set(load(path))


def test_rotated_checkpoints_are_named_after_their_own_step(mlm_trained_run):
    checkpoints = mlm_trained_run / "runs" / "run0" / "checkpoints"
    steps = {path.name: load(path)["step"] for path in checkpoints.glob("checkpoint-*.pt")}
    assert steps == {"checkpoint-30.pt": 30, "checkpoint-35.pt": 35}


def run_to(steps: int, *extra: str):
    main.main(["--max-iters", str(steps), *extra])


def check_resume_equivalence(mlm_workdir_factory, tmp_path, monkeypatch, losses, micro_steps: int = 10,
                             **settings):
    """Losses of the micro-steps of steps N+1..2N: one run of 2N steps vs N steps, then resumed to 2N."""
    n = 5
    settings = {"lr_decay_iters": 2 * n, "val_interval": n, **settings}
    monkeypatch.chdir(mlm_workdir_factory(tmp_path / "straight", **settings))
    run_to(2 * n)
    straight = losses[:]
    assert len(straight) == micro_steps

    monkeypatch.chdir(mlm_workdir_factory(tmp_path / "resumed", **settings))
    losses.clear()
    run_to(n)
    first = len(losses)
    assert losses == straight[:first]  # the same start; else the comparison below means nothing
    losses.clear()
    run_to(2 * n, "--cp", "runs/run0/checkpoints/checkpoint.pt")
    assert np.allclose(losses, straight[first:], rtol=0, atol=1e-5), (losses, straight[first:])
    assert load(Path("runs/run0/checkpoints/checkpoint.pt"))["step"] == 2 * n
    assert not Path("runs/run1").exists()  # a resumed run writes into its own run directory
    log = Path("runs/run0/logs/log.txt").read_text(encoding="utf-8")
    assert "resuming runs/run0/checkpoints/checkpoint.pt at step 5" in log


def test_resume_without_dropout_continues_exactly(mlm_workdir_factory, tmp_path, monkeypatch, training_losses,
                                                  keep_signal_handlers, skip_flops_measurement):
    """Data position, masking generator, optimizer and schedule are restored."""
    check_resume_equivalence(mlm_workdir_factory, tmp_path, monkeypatch, training_losses, dropout=0.0)


def test_stable_adamw_trains_and_resumes_exactly(mlm_workdir_factory, tmp_path, monkeypatch, training_losses,
                                                 keep_signal_handlers, skip_flops_measurement):
    """Its moments and step counts are restored as AdamW's are."""
    check_resume_equivalence(mlm_workdir_factory, tmp_path, monkeypatch, training_losses, dropout=0.0,
                             optimizer="stable-adamw", grad_clip=0)
    assert training_losses[-1] < training_losses[0] - 0.1  # it learns


def test_resume_with_dropout_continues_exactly(mlm_workdir_factory, tmp_path, monkeypatch, training_losses,
                                               keep_signal_handlers):
    """The global torch RNG (dropout) is restored too."""
    check_resume_equivalence(mlm_workdir_factory, tmp_path, monkeypatch, training_losses, dropout=0.1)


def test_resume_in_the_middle_of_a_batch_ramp_continues_exactly(mlm_workdir_factory, tmp_path, monkeypatch,
                                                                training_losses, keep_signal_handlers,
                                                                skip_flops_measurement):
    """The step's batch follows the step: 1, 1, 1, 1, 2, 2, 2, 2, 3, 3 micro-batches (ramped by 80% of 10
    steps), and a run resumed at step 5, in the middle of the ramp, draws the same samples from there."""
    check_resume_equivalence(mlm_workdir_factory, tmp_path, monkeypatch, training_losses, micro_steps=18,
                             dropout=0.0, grad_accum_steps=3, batch_ramp=0.8)
    log = Path("runs/run0/logs/log.txt").read_text(encoding="utf-8")
    assert "ramped up from 16 by 80% of the run" in log
    assert load(Path("runs/run0/checkpoints/checkpoint.pt"))["data_position"]["sample"] == 18 * 16


def test_a_length_curriculum_cuts_the_rows_and_resumes_exactly(mlm_workdir_factory, tmp_path, monkeypatch,
                                                               training_losses, keep_signal_handlers,
                                                               skip_flops_measurement):
    """Rows of half seq-len for the first 60% of 10 steps (twice the rows, the same samples), then whole
    rows; a run resumed at step 5, inside the short phase, continues as the straight run does."""
    shapes, original = [], MaskedLMTask.loss

    def recording_shape(self, model, batch, progress=None):
        if torch.is_grad_enabled():
            shapes.append(tuple(batch["input_ids"].shape))
        return original(self, model, batch, progress)

    monkeypatch.setattr(MaskedLMTask, "loss", recording_shape)
    check_resume_equivalence(mlm_workdir_factory, tmp_path, monkeypatch, training_losses, dropout=0.0,
                             seq_len_curriculum=f"{MLM_SEQ_LEN // 2}:0.6")
    short, whole = (32, MLM_SEQ_LEN // 2), (16, MLM_SEQ_LEN)
    assert shapes[:10] == [short] * 6 + [whole] * 4  # the straight run
    assert load(Path("runs/run0/checkpoints/checkpoint.pt"))["data_position"]["sample"] == 10 * 16


def test_a_falling_mask_rate_masks_each_step_at_its_rate_and_resumes_exactly(
        mlm_workdir_factory, tmp_path, monkeypatch, training_losses, keep_signal_handlers, skip_flops_measurement):
    """30% of the tokens masked for the first 60% of 10 steps, then 15%; a run resumed at step 5,
    before the step down, continues as the straight run does; each log line says the step's rate."""
    picked, original = [], MaskedLMTask.loss

    def recording_picks(self, model, batch, progress=None):
        if torch.is_grad_enabled():
            masked = self.masker.masked(batch, progress)
            share = (masked["labels"] != -100).sum().item() / batch["attention_mask"].sum().item()
            picked.append((self.masker.step_rate, share))
        return original(self, model, batch, progress)

    monkeypatch.setattr(MaskedLMTask, "loss", recording_picks)
    check_resume_equivalence(mlm_workdir_factory, tmp_path, monkeypatch, training_losses, dropout=0.0,
                             mask_rate="0.3:0.15@0.6")
    rates = [rate for rate, _ in picked[:10]]
    assert rates == [0.3] * 6 + [0.15] * 4  # the straight run
    assert all(abs(share - rate) < 0.05 for rate, share in picked[:10])  # [CLS] and [SEP] are never picked
    log = Path("runs/run0/logs/log.txt").read_text(encoding="utf-8")
    assert "| mask rate 0.300" in log and "| mask rate 0.150" in log


def test_cut_rows_keep_every_token_and_one_visible_slot_a_row():
    ids = torch.arange(12).reshape(2, 6)
    real = torch.tensor([[True] * 6, [True, True, False, False, False, False]])
    cut = cut_rows({"input_ids": ids, "attention_mask": real}, 3)
    assert cut["input_ids"].tolist() == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9, 10, 11]]
    assert cut["attention_mask"].tolist() == [[True] * 3, [True] * 3, [True, True, False], [True, False, False]]
    assert not real[1, 3]  # the batch given is left alone
    assert cut_rows({"input_ids": torch.ones(2, 4), "attention_mask": None}, 2)["input_ids"].shape == (4, 2)


def logged_curve(run_dir: Path) -> dict[int, tuple]:
    """step -> (loss, accuracy) of the training log's lines and of TensorBoard's scalars."""
    log = (run_dir / "logs" / "log.txt").read_text(encoding="utf-8")
    lines = re.findall(r"^step (\d+) \| loss ([\d.]+) \| .* \| accuracy ([\d.]+)$", log, re.M)
    values = scalars(run_dir)
    board = {tag: dict(values[tag]) for tag in ("train/loss", "train/accuracy")}
    return {int(step): (loss, accuracy, board["train/loss"][int(step)], board["train/accuracy"][int(step)])
            for step, loss, accuracy in lines}


@pytest.mark.parametrize("interruption", ["max-iters", "stop file"])
def test_the_logged_curve_after_a_resume_equals_the_uninterrupted_one(mlm_workdir_factory, tmp_path, monkeypatch,
                                                                      keep_signal_handlers, skip_flops_measurement,
                                                                      interruption):
    """Log lines every 4 steps; the run ends at step 10 (max-iters) or is stopped at 11 (the stop file),
    so the first line after the resume, at 12, must average steps 9 to 12 as the straight run's does."""
    settings = {"log_interval": 4, "val_interval": 5}
    monkeypatch.chdir(mlm_workdir_factory(tmp_path / "straight", **settings))
    run_to(12)
    straight = logged_curve(Path("runs/run0"))
    assert sorted(straight) == [4, 8, 12]

    monkeypatch.chdir(mlm_workdir_factory(tmp_path / "resumed", **settings))
    if interruption == "max-iters":
        run_to(10)
    else:
        original, steps = MaskedLMTask.loss, []
        with monkeypatch.context() as patch:
            def loss_then_stop(self, model, batch, progress=None):
                if torch.is_grad_enabled():
                    steps.append(1)
                    if len(steps) == 11:
                        Path("stop").touch()
                return original(self, model, batch, progress)
            patch.setattr(MaskedLMTask, "loss", loss_then_stop)
            run_to(12)
        assert load(Path("runs/run0/checkpoints/checkpoint.pt"))["step"] == 11
    run_to(12, "--cp", "runs/run0/checkpoints/checkpoint.pt")
    resumed = logged_curve(Path("runs/run0"))
    assert {step: resumed[step] for step in straight} == straight


@pytest.mark.parametrize("override", [["--mask-rate", "0.3"], ["--val-dataset-pattern", "train_imdb_64_*.msgpack"],
                                      ["--masking", "static"], ["--lr-scheduler", "linear"]])
def test_resuming_refuses_settings_that_change_what_the_run_measures(mlm_workdir, capsys, override,
                                                                    skip_flops_measurement):
    run_to(2, "--val-interval", "2")
    before = {path: path.read_bytes() for path in Path("runs/run0").rglob("*") if path.is_file()}
    with pytest.raises(SystemExit) as exit_info:
        run_to(4, "--cp", "runs/run0/checkpoints/checkpoint.pt", *override)
    assert exit_info.value.code == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    key = override[0].removeprefix("--")
    assert error.startswith("error: runs/run0/checkpoints/checkpoint.pt: the run has " + key), error
    assert "--switch-training" in error
    assert {path: path.read_bytes() for path in Path("runs/run0").rglob("*") if path.is_file()} == before


def test_switch_training_starts_a_new_run_from_the_weights(mlm_workdir, skip_flops_measurement):
    run_to(3, "--val-interval", "3")
    run_to(2, "--cp", "runs/run0/checkpoints/checkpoint.pt", "--switch-training", "--mask-rate", "0.3")
    saved = load(Path("runs/run1/checkpoints/checkpoint.pt"))
    assert saved["step"] == 2 and saved["config"]["mask-rate"] == "0.3"
    assert saved["start"] == str(Path("runs/run0/checkpoints/checkpoint.pt").resolve())
    log = Path("runs/run1/logs/log.txt").read_text(encoding="utf-8")
    assert "loaded the encoder of runs/run0/checkpoints/checkpoint.pt (mlm step 3)" in log
    assert load(Path("runs/run0/checkpoints/checkpoint.pt"))["step"] == 3  # the first run untouched


def test_dont_load_optimizer_resumes_the_run_with_fresh_moments(mlm_workdir, monkeypatch, skip_flops_measurement):
    run_to(3, "--val-interval", "3")
    loaded = []
    monkeypatch.setattr(torch.optim.AdamW, "load_state_dict", lambda self, state: loaded.append(state))
    run_to(5, "--cp", "runs/run0/checkpoints/checkpoint.pt", "--dont-load-optimizer")
    assert loaded == [] and not Path("runs/run1").exists()
    assert load(Path("runs/run0/checkpoints/checkpoint.pt"))["step"] == 5
    log = Path("runs/run0/logs/log.txt").read_text(encoding="utf-8")
    assert "resuming runs/run0/checkpoints/checkpoint.pt at step 3" in log and "optimizer starts afresh" in log


def test_layer_lr_decay_sets_the_rates_and_a_resumed_run_keeps_it(mlm_workdir, capsys, skip_flops_measurement):
    run_to(2, "--val-interval", "2", "--layer-lr-decay", "0.5")
    saved = load(Path("runs/run0/checkpoints/checkpoint.pt"))
    rates = sorted({group["lr"] for group in saved["optimizer"]["param_groups"]})
    layers = saved["config"]["n-layer"]
    assert rates == pytest.approx([rates[-1] * 0.5 ** above for above in range(layers, -1, -1)])
    before = {path: path.read_bytes() for path in Path("runs/run0").rglob("*") if path.is_file()}
    with pytest.raises(SystemExit) as exit_info:
        run_to(4, "--cp", "runs/run0/checkpoints/checkpoint.pt", "--layer-lr-decay", "0.8")
    assert exit_info.value.code == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert error.startswith("error: runs/run0/checkpoints/checkpoint.pt: the run has layer-lr-decay = 0.5"), error
    assert {path: path.read_bytes() for path in Path("runs/run0").rglob("*") if path.is_file()} == before
    run_to(4, "--cp", "runs/run0/checkpoints/checkpoint.pt", "--layer-lr-decay", "0.8", "--dont-load-optimizer")
    assert load(Path("runs/run0/checkpoints/checkpoint.pt"))["step"] == 4


def test_resuming_with_more_processes_than_saved_says_so_in_the_log(mlm_workdir, skip_flops_measurement):
    run_to(2, "--val-interval", "2")
    config = main.load_config(None, ["--max-iters", "3"])
    main.run(config, Path("runs/run0/checkpoints/checkpoint.pt"), False, rank=0, world_size=2)  # rank 0 of --nproc 2
    log = Path("runs/run0/logs/log.txt").read_text(encoding="utf-8")
    assert "note: the checkpoint holds random states for 1 process(es); ranks 1 and up start from fresh seeds" in log


def test_second_run_gets_its_own_directory(mlm_workdir, skip_flops_measurement):
    run_to(2)
    first_log = Path("runs/run0/logs/log.txt").read_text(encoding="utf-8")
    first_checkpoint = Path("runs/run0/checkpoints/checkpoint.pt").read_bytes()
    run_to(3)
    assert sorted(path.name for path in Path("runs").iterdir()) == ["run0", "run1"]
    assert Path("runs/run0/logs/log.txt").read_text(encoding="utf-8") == first_log
    assert Path("runs/run0/checkpoints/checkpoint.pt").read_bytes() == first_checkpoint
    assert load(Path("runs/run1/checkpoints/checkpoint.pt"))["step"] == 3
    log = Path("runs/run1/logs/log.txt").read_text(encoding="utf-8")
    assert f"run directory: {Path('runs/run1').absolute()}" in log


# ----------------------------------------------------------------------------- failed starts

def truncate(split: str):
    shard = next(Path("datasets").glob(f"{split}_imdb_64_*.msgpack*"))
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])


def wrong_val_pattern():
    config = Path("config.ini").read_text()
    Path("config.ini").write_text(config.replace("val_imdb_64_*.msgpack", "val_wiki_*.msgpack"))


@pytest.mark.parametrize("damage, message", [
    (lambda: truncate("val"), "val_imdb_64_"), (wrong_val_pattern, "val_wiki_*.msgpack"),
    (lambda: truncate("train"), "train_imdb_64_")])  # read at step 1: after the run directory was made
def test_a_run_that_cannot_start_says_why_and_leaves_no_run_directory(mlm_workdir, capsys, damage, message,
                                                                      skip_flops_measurement):
    damage()
    with pytest.raises(SystemExit) as exit_info:
        run_to(2)
    assert exit_info.value.code == 2
    error_lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(error_lines) == 1 and message in error_lines[0], error_lines
    assert not Path("runs").exists() or not any(Path("runs").iterdir())


def test_a_second_process_on_the_same_run_is_refused(mlm_workdir, capsys, skip_flops_measurement):
    from run_log import lock_run_dir
    run_to(2, "--val-interval", "2")
    held = lock_run_dir(Path("runs/run0"))  # as the other process would hold it
    log_before = Path("runs/run0/logs/log.txt").read_text(encoding="utf-8")
    try:
        with pytest.raises(SystemExit) as exit_info:
            run_to(4, "--cp", "runs/run0/checkpoints/checkpoint.pt")
    finally:
        held.close()
    assert exit_info.value.code == 2
    assert "another process is training this run" in capsys.readouterr().err.splitlines()[-1]
    assert Path("runs/run0/logs/log.txt").read_text(encoding="utf-8") == log_before
    run_to(4, "--cp", "runs/run0/checkpoints/checkpoint.pt")  # once it has ended, the run resumes
    assert load(Path("runs/run0/checkpoints/checkpoint.pt"))["step"] == 4


def test_warmup_longer_than_the_run_is_warned_about(mlm_workdir, skip_flops_measurement):
    run_to(2)  # warmup-iters 10
    log = Path("runs/run0/logs/log.txt").read_text(encoding="utf-8")
    assert "warning: warmup-iters = 10 is above max-iters = 2" in log


# ----------------------------------------------------------------------------- stopping

def test_stop_file_ends_the_run_after_the_step_with_a_checkpoint(mlm_workdir, monkeypatch, skip_flops_measurement):
    original = MaskedLMTask.loss
    calls = []

    def loss_then_stop(self, model, batch, progress=None):
        if torch.is_grad_enabled():  # training, not evaluation
            calls.append(1)
            if len(calls) == 3:
                Path("stop").touch()  # during step 3
        return original(self, model, batch, progress)

    monkeypatch.setattr(MaskedLMTask, "loss", loss_then_stop)
    run_dir = main.run(main.load_config(None, ["--max-iters", "1000"]), None, False)
    assert len(calls) == 3
    assert not Path("stop").exists()  # consumed, so the next run is not stopped too
    assert load(Path("runs/run0/checkpoints/checkpoint.pt"))["step"] == 3
    assert Path(run_dir).resolve() == (mlm_workdir / "runs" / "run0").resolve()
    log = Path("runs/run0/logs/log.txt").read_text(encoding="utf-8")
    assert "stopped by the file ./stop at step 3" in log
    assert not Path("runs/run0/finished").exists()  # stopped: a run to resume, not a finished one


def wait_for(condition, timeout: float, process: subprocess.Popen) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if process.poll() is not None:
            raise AssertionError(f"the run ended early: {process.communicate()}")
        if time.monotonic() > deadline:
            process.kill()
            raise AssertionError(f"gave up waiting after {timeout} s: {process.communicate()}")
        time.sleep(0.1)


def test_sigterm_saves_a_checkpoint_and_exits_cleanly(mlm_workdir):
    log = mlm_workdir / "runs" / "run0" / "logs" / "log.txt"
    process = subprocess.Popen([sys.executable, str(ROOT / "src" / "main.py"), "--max-iters", "100000"],
                               cwd=mlm_workdir, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for(lambda: log.is_file() and re.search(r"^step \d+ \| loss", log.read_text(encoding="utf-8"), re.M),
             timeout=120, process=process)
    process.send_signal(signal.SIGTERM)
    try:
        _, stderr = process.communicate(timeout=20)
    except subprocess.TimeoutExpired:
        process.kill()
        raise
    assert process.returncode == 0, stderr
    assert "Traceback" not in stderr
    checkpoint = load(mlm_workdir / "runs" / "run0" / "checkpoints" / "checkpoint.pt")
    assert 1 <= checkpoint["step"] < 100000
    assert f"stopped by SIGTERM at step {checkpoint['step']}" in log.read_text(encoding="utf-8")


# ----------------------------------------------------------------------------- NaN guard

@pytest.fixture
def good_run(mlm_workdir, skip_flops_measurement):
    """Two steps validated and saved: the checkpoints directory and its files' bytes."""
    run_to(2, "--val-interval", "2")
    checkpoints = mlm_workdir / "runs" / "run0" / "checkpoints"
    return checkpoints, {name: (checkpoints / name).read_bytes() for name in ("checkpoint.pt", "best.pt")}


def resume_with_nan_loss(monkeypatch, capsys, *, in_training: bool, options: tuple) -> list[str]:
    """Resume the good run to step 8 with the loss NaN in training or in validation; its error lines."""
    original = MaskedLMTask.loss

    def loss_turning_nan(self, model, batch, progress=None):
        result = original(self, model, batch, progress)
        return (result[0] * float("nan"), *result[1:]) if torch.is_grad_enabled() == in_training else result

    monkeypatch.setattr(MaskedLMTask, "loss", loss_turning_nan)
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        run_to(8, "--cp", "runs/run0/checkpoints/checkpoint.pt", *options)
    assert exit_info.value.code == 2
    return [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]


def test_nan_loss_stops_with_one_line_and_keeps_the_good_checkpoint(good_run, monkeypatch, capsys):
    checkpoints, good = good_run
    # NaN from step 3 on; checked at log and validation steps only: step 4 is both, and must not be saved.
    error_lines = resume_with_nan_loss(monkeypatch, capsys, in_training=True,
                                       options=("--val-interval", "4", "--log-interval", "4"))
    assert len(error_lines) == 1 and "not finite" in error_lines[0] and "step 4" in error_lines[0], error_lines
    assert str(checkpoints.resolve()) in error_lines[0]
    assert {name: (checkpoints / name).read_bytes() for name in good} == good
    assert sorted(path.name for path in checkpoints.iterdir()) == ["best.pt", "checkpoint.pt"]


def test_nan_validation_loss_stops_and_never_becomes_best(good_run, monkeypatch, capsys):
    checkpoints, good = good_run
    error_lines = resume_with_nan_loss(monkeypatch, capsys, in_training=False, options=("--val-interval", "4"))
    assert len(error_lines) == 1 and "validation loss is not finite" in error_lines[0] and "step 4" in error_lines[0]
    assert {name: (checkpoints / name).read_bytes() for name in good} == good


# ----------------------------------------------------------------------------- test split

def test_test_flag_prints_and_saves_test_metrics(mlm_trained_run, monkeypatch, capsys, keep_signal_handlers):
    monkeypatch.chdir(mlm_trained_run)
    best = Path("runs/run0/checkpoints/best.pt")
    step = load(best)["step"]
    capsys.readouterr()
    main.main(["--cp", str(best), "--test"])
    metrics = json.loads(capsys.readouterr().out)
    assert metrics["step"] == step and metrics["checkpoint"] == str(best)
    vocab_size = load_vocab(Path("vocab")).size
    assert 0 < metrics["test_loss"] < math.log(vocab_size) - 1.0
    assert 20 / vocab_size < metrics["test_accuracy"] < 1
    saved = Path(f"runs/run0/test_metrics_step{step}.json")
    assert json.loads(saved.read_text(encoding="utf-8")) == metrics


def test_wsd_keeps_the_last_checkpoint_before_its_decay_as_stable_pt(mlm_workdir):
    run_dir = main.run(main.load_config(None, ["--lr-scheduler", "wsd:0.5", "--max-iters", "6", "--lr-decay-iters", "6",
                                               "--warmup-iters", "1", "--val-interval", "2"]), None, False)
    directory = run_dir / "checkpoints"
    # Saved at steps 2, 4 and 6; the decay takes the second half of the run, from step 3 on.
    assert load(directory / "stable.pt")["step"] == 2 and load(directory / "checkpoint.pt")["step"] == 6
    assert not list(directory.glob(".*"))


def wsd_run(*extra: str, **settings) -> list[str]:
    """The options of a wsd:0.25 run of 8 steps (its decay begins at step 6), settings overridden."""
    settings = {"lr_scheduler": "wsd:0.25", "max_iters": 8, "lr_decay_iters": 8, "warmup_iters": 1,
                "val_interval": 2, "dropout": 0} | settings
    return [*(item for name, value in settings.items() for item in (f"--{name.replace('_', '-')}", str(value))),
            *extra]


def test_a_decay_from_a_stable_checkpoint_trains_as_a_run_planned_with_that_decay(
        mlm_workdir, training_losses, skip_flops_measurement):
    """stable.pt of a wsd:0.25 run of 8 steps is step 4 (its decay begins at step 6); decayed from
    there to step 8, the branch's steps are those of a wsd:0.5 run of 8 steps, loss for loss, in a
    new run directory that records where it came from and resumes exactly."""
    main.main(wsd_run("--run-id", "planned", lr_scheduler="wsd:0.5"))
    planned = training_losses[4:]
    training_losses.clear()
    main.main(wsd_run("--run-id", "stable"))
    stable = Path("runs/stable/checkpoints/stable.pt")
    assert load(stable)["step"] == 4
    training_losses.clear()
    main.main(wsd_run("--run-id", "branch", "--decay-from", str(stable), max_iters=6))
    branch = Path("runs/branch")
    main.main(wsd_run("--cp", str(branch / "checkpoints/checkpoint.pt"),  # resumed at step 6, as its config.ini says
                      lr_scheduler="wsd:0.5:sqrt"))
    assert np.allclose(training_losses, planned, rtol=0, atol=1e-5), (training_losses, planned)
    saved = load(branch / "checkpoints/checkpoint.pt")
    assert saved["step"] == 8 and saved["lineage"] == load(stable)["lineage"]
    assert saved["start"] == str(stable.resolve())
    assert "lr-scheduler = wsd:0.5" in (branch / "config.ini").read_text()
    assert f"decaying from {stable} at step 4" in (branch / "logs/log.txt").read_text()
    assert not (branch / "checkpoints/stable.pt").exists()  # all of it is decay


@pytest.mark.parametrize("extra, message", [
    (["--decay-from", "runs/stable/checkpoints/checkpoint.pt"],
     "--decay-from runs/stable/checkpoints/checkpoint.pt: step 8 is past the stable phase of its run "
     "(lr-scheduler = wsd:0.25); take a checkpoint from before its decay, such as stable.pt"),
    (["--decay-from", "runs/stable/checkpoints/stable.pt", "--lr-decay-iters=4", "--max-iters=4"],
     "--decay-from runs/stable/checkpoints/stable.pt: the checkpoint is at step 4 and lr-decay-iters = 4 ends "
     "this run there"),
    (["--decay-from", "runs/stable/checkpoints/stable.pt", "--task-type", "electra"],
     "--decay-from runs/stable/checkpoints/stable.pt: a mlm checkpoint; it takes a checkpoint of a "
     "task-type = electra run"),
    (["--decay-from", "runs/stable/checkpoints/stable.pt", "--cp", "runs/stable/checkpoints/stable.pt"],
     "--decay-from and --cp: --decay-from names the checkpoint"),
    (["--decay-from", "runs/stable/checkpoints/stable.pt", "--switch-training"],
     "--decay-from and --switch-training"),
])
def test_a_decay_that_cannot_branch_is_one_line_and_leaves_no_run(mlm_workdir, capsys, skip_flops_measurement,
                                                                  extra, message):
    main.main(wsd_run("--run-id", "stable"))
    capsys.readouterr()
    settings = dict(option.removeprefix("--").replace("-", "_").split("=") for option in extra if "=" in option)
    with pytest.raises(SystemExit) as exit_info:
        main.main(wsd_run(*(option for option in extra if "=" not in option), **settings))
    assert exit_info.value.code == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and error[0].startswith(f"error: {message}"), error
    assert sorted(path.name for path in Path("runs").iterdir()) == ["stable"]


def test_a_decay_from_a_run_without_a_stable_phase_is_one_line(mlm_workdir, capsys, skip_flops_measurement):
    main.main(["--run-id", "cosine", "--max-iters", "2", "--val-interval", "2"])
    capsys.readouterr()
    with pytest.raises(SystemExit):
        main.main(["--max-iters", "4", "--decay-from", "runs/cosine/checkpoints/checkpoint.pt"])
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "error: --decay-from runs/cosine/checkpoints/checkpoint.pt: its run has lr-scheduler = cosine; the decay "
        "branches from the stable phase of a wsd run")


@pytest.fixture
def now(monkeypatch) -> list[float]:
    """The seconds time.perf_counter and Clock read, set by the test."""
    seconds = [100.0]
    monkeypatch.setattr(trainer.time, "perf_counter", lambda: seconds[0])
    monkeypatch.setattr(Clock, "now", staticmethod(lambda: seconds[0]))
    return seconds


def meter(tokens: int = 0) -> Throughput:
    return Throughput(flops_per_token=1e6, peak_flops=1e12, world_size=1, device=torch.device("cpu"), tokens=tokens)


def summed(figures: tuple) -> tuple[float, list]:
    """The mean loss and the statistics of a read, as plain numbers."""
    return figures[0], figures[1].tolist()


def test_a_log_line_reads_the_mean_loss_the_summed_statistics_and_the_rates(now):
    figures = meter(tokens=5000)
    figures.add(torch.tensor(2.0), torch.tensor([10, 4]))
    figures.add(torch.tensor(4.0), torch.tensor([20, 6]))
    now[0] += 2.0
    loss, statistics, tokens_per_sec, mfu = figures.read(tokens=5000 + 4096)
    assert loss == 3.0 and statistics.tolist() == [30, 10]
    assert tokens_per_sec == 2048 and mfu == pytest.approx(1e6 * 2048 / 1e12)
    figures.add(torch.tensor(1.0), torch.tensor([1, 1]))
    now[0] += 1.0
    loss, statistics, tokens_per_sec, _ = figures.read(tokens=9096 + 1000)  # counted afresh
    assert (loss, statistics.tolist(), tokens_per_sec) == (1.0, [1, 1], 1000)


def test_a_pause_is_left_out_of_the_rates(now):
    figures = meter()
    figures.add(torch.tensor(1.0), torch.tensor([1]))
    with figures.paused():
        now[0] += 50.0  # validation
    now[0] += 1.0
    assert figures.read(tokens=512)[2] == 512


def test_a_line_off_the_interval_goes_on_summing(now):
    figures = meter()
    figures.add(torch.tensor(2.0), torch.tensor([1]))
    now[0] += 1.0
    figures.read(tokens=10, restart=False)
    figures.add(torch.tensor(4.0), torch.tensor([3]))
    now[0] += 1.0
    assert summed(figures.read(tokens=20)) == (3.0, [4])


def test_the_sums_since_a_log_line_carry_over_to_a_resumed_meter(now):
    saved = meter()
    saved.add(torch.tensor(2.0), torch.tensor([5, 1]))
    resumed = meter(tokens=10)
    resumed.restore(saved.since_log())
    resumed.add(torch.tensor(4.0), torch.tensor([5, 3]))
    now[0] += 1.0
    assert summed(resumed.read(tokens=20)) == (3.0, [10, 4])
    fresh = meter()
    fresh.restore(meter().since_log())  # saved right after a log line: nothing summed yet
    fresh.add(torch.tensor(1.0), torch.tensor([2]))
    now[0] += 1.0
    assert summed(fresh.read(tokens=1)) == (1.0, [2])


def test_the_clock_goes_on_from_a_resumed_count_and_skips_pauses(now):
    clock = Clock(elapsed=30.0)
    now[0] += 5.0
    assert clock.elapsed() == 35.0
    with clock.paused():
        now[0] += 100.0
    now[0] += 1.0
    assert clock.elapsed() == 36.0
