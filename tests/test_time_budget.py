"""time-budget: the key (its schedule: test_optimizer.py), stopping with a
checkpoint when the budget is spent (a fake clock: one second per training step, validation
free), resume continuing the count, and two DDP ranks stopping together on rank 0's clock;
stop-at, the run that ends when a validation metric reaches a target, with the time it took."""
import pytest
import torch

import checkpoints
import hardware
import main
import trainer
from config import Config
from ini import load_config
from errors import UserError
from tasks.mlm_task import MaskedLMTask
from run_plan import learning_rate
from test_distributed import run_main
from test_trainer import scalars
from trainer import Trainer


@pytest.mark.parametrize("text, seconds", [("90s", 90), ("30m", 1800), ("1.5h", 5400), ("2H", 7200), ("0", 0)])
def test_durations(text, seconds):
    assert Config(time_budget=text).budget_seconds == seconds


@pytest.mark.parametrize("overrides, message", [
    (["--time-budget", "90"], "--time-budget 90: expected a duration such as 90s, 30m or 2h (0: no budget)"),
    (["--time-budget", "-5m"], "--time-budget -5m: expected a duration"),
    (["--time-budget", "soon"], "--time-budget soon: expected a duration"),
    (["--time-budget", "30m", "--max-iters", "50", "--warmup-iters", "100"],
     "time-budget = 30m with max-iters = 50 below warmup-iters = 100: the run would stop before warming up"),
])
def test_bad_budgets_get_one_line(tmp_path, overrides, message):
    (tmp_path / "config.ini").write_text("")
    with pytest.raises(UserError) as error:
        load_config(tmp_path / "config.ini", overrides)
    assert message in str(error.value)


@pytest.fixture
def fake_clock(monkeypatch):
    """Training time that moves one second per training micro-step and not at all elsewhere, while
    each validation takes 100 real-looking seconds that must not be charged."""
    now = [0.0]
    monkeypatch.setattr(trainer.Clock, "now", staticmethod(lambda: now[0]))
    monkeypatch.setattr(hardware, "measure_matmul_flops", lambda device, dtype: 1e12)
    original_loss, original_validate = MaskedLMTask.loss, Trainer.validate

    def loss(self, model, batch, progress=None):
        if model.training:
            now[0] += 1.0
        return original_loss(self, model, batch, progress)

    def validate(self, run):
        now[0] += 100.0
        return original_validate(self, run)

    monkeypatch.setattr(MaskedLMTask, "loss", loss)
    monkeypatch.setattr(Trainer, "validate", validate)
    return now


def test_run_stops_when_the_budget_is_spent_with_a_checkpoint(mlm_workdir, fake_clock):
    run_dir = main.run(load_config(None, ["--time-budget", "10s", "--max-iters", "1000", "--val-interval", "4"]),
                       None, False)
    saved = checkpoints.load(run_dir / "checkpoints" / "checkpoint.pt")
    assert saved["step"] == 10 and saved["elapsed"] == 10.0  # validations at 4 and 8 were not charged
    assert (run_dir / "checkpoints" / "best.pt").is_file()
    log = (run_dir / "logs" / "log.txt").read_text(encoding="utf-8")
    assert "step 10 | val loss" in log and "time-budget = 10s spent at step 10" in log
    assert "0:05 of time-budget left" in log  # after step 5
    assert saved["optimizer"]["param_groups"][0]["lr"] == pytest.approx(
        learning_rate(9, 9 / 10, Config(time_budget="10s", learning_rate=2e-3, min_learning_rate=2e-4,
                                        warmup_iters=10)))


def test_resume_continues_the_time_already_spent(mlm_workdir, fake_clock):
    budget = ["--time-budget", "10s", "--warmup-iters", "2"]
    run_dir = main.run(load_config(None, budget + ["--max-iters", "4"]), None, False)
    path = run_dir / "checkpoints" / "checkpoint.pt"
    assert checkpoints.load(path)["elapsed"] == 4.0
    main.run(load_config(None, budget + ["--max-iters", "1000"]), path, False)
    resumed = checkpoints.load(path)
    assert resumed["step"] == 10 and resumed["elapsed"] == 10.0


def test_two_ranks_stop_together_on_rank_0s_clock(mlm_workdir):
    result = run_main(mlm_workdir, "--time-budget", "1s", "--max-iters", "100000", "--val-interval", "100000")
    assert result.returncode == 0, result.stderr
    saved = checkpoints.load(mlm_workdir / "runs" / "run0" / "checkpoints" / "checkpoint.pt")
    assert saved["elapsed"] >= 1.0 and len(saved["rng_per_rank"]) == 2
    log = (mlm_workdir / "runs" / "run0" / "logs" / "log.txt").read_text(encoding="utf-8")
    assert f"time-budget = 1s spent at step {saved['step']}" in log


def test_stop_at_ends_the_run_at_the_first_validation_past_the_target(mlm_workdir, fake_clock):
    run_dir = main.run(load_config(None, ["--stop-at", "loss:100", "--max-iters", "1000", "--val-interval", "4"]),
                       None, False)
    saved = checkpoints.load(run_dir / "checkpoints" / "checkpoint.pt")
    assert saved["step"] == 4
    log = (run_dir / "logs" / "log.txt").read_text(encoding="utf-8")
    tokens = saved["tokens"]
    assert "stop-at = loss:100 reached at step 4 (val loss " in log
    assert f"): 0.07 minutes of training, {tokens:,} tokens" in log  # 4 fake seconds; validation not charged
    assert dict(scalars(run_dir)["val/elapsed"]) == {4: 4.0}


def test_a_target_not_reached_leaves_the_run_to_its_length(mlm_workdir, fake_clock):
    run_dir = main.run(load_config(None, ["--stop-at", "accuracy:1", "--max-iters", "8", "--val-interval", "4"]),
                       None, False)
    assert checkpoints.load(run_dir / "checkpoints" / "checkpoint.pt")["step"] == 8
    assert "reached at step" not in (run_dir / "logs" / "log.txt").read_text(encoding="utf-8")


def test_a_stop_at_metric_the_task_does_not_validate_is_one_line_before_the_first_step(mlm_workdir, capsys,
                                                                                      skip_flops_measurement):
    with pytest.raises(SystemExit) as exit_info:
        main.main(["--stop-at", "bleu:0.3", "--max-iters", "4"])
    assert exit_info.value.code == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert errors == ["error: stop-at = bleu:0.3: task-type = mlm validates loss, accuracy, not bleu"]
    assert not (mlm_workdir / "runs" / "run0").exists()


@pytest.mark.parametrize("value", ["accuracy", "0.35", "accuracy:high", "val accuracy:0.3"])
def test_a_malformed_stop_at_is_one_line(value):
    with pytest.raises(UserError, match="stop-at = .*expected METRIC:VALUE"):
        Config(stop_at=value)


def test_a_time_budget_run_records_its_clock_and_replay_clock_repeats_it_bit_for_bit(mlm_workdir):
    """The clock itself (real seconds) decides the first run's steps and rates; the second follows
    its record and ends the same, to the last bit of every weight."""
    budget = ["--time-budget", "3s", "--max-iters", "100000", "--val-interval", "100000", "--warmup-iters", "2"]
    first = main.run(load_config(None, budget + ["--run-id", "first"]), None, False)
    record = first / trainer.CLOCK_RECORD
    seconds = trainer.read_clock_record(record)
    second = main.run(load_config(None, budget + ["--run-id", "second", "--replay-clock", str(record)]), None, False)
    one, other = (checkpoints.load(run / "checkpoints" / "checkpoint.pt") for run in (first, second))
    assert one["step"] == other["step"] == len(seconds) and one["elapsed"] == other["elapsed"] == seconds[-1]
    assert all(torch.equal(one["model"][name], other["model"][name]) for name in one["model"])
    assert trainer.read_clock_record(second / trainer.CLOCK_RECORD) == seconds


def test_a_resume_cuts_the_clock_record_to_its_step_and_goes_on(mlm_workdir, fake_clock):
    budget = ["--time-budget", "10s", "--warmup-iters", "2"]
    run_dir = main.run(load_config(None, budget + ["--max-iters", "6", "--val-interval", "4"]), None, False)
    path = run_dir / "checkpoints" / "checkpoint.pt"
    record = run_dir / trainer.CLOCK_RECORD
    assert trainer.read_clock_record(record) == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    with record.open("a", encoding="utf-8") as file:
        file.write("7\t99.0\n")  # a step a killed run took after its last checkpoint
    main.run(load_config(None, budget + ["--max-iters", "1000", "--val-interval", "4"]), path, False)
    assert trainer.read_clock_record(record) == [float(step) for step in range(1, 11)]


@pytest.mark.parametrize("record, message", [
    (None, "cannot read the clock record"),
    ("step\tseconds\n1\t0.5\n2\t1.0\n", "it records 2 steps (1.0 s), short of time-budget = 10s: the run it records "
                                        "was stopped before its end"),
    ("step,seconds\n", "not a run's clock record"),
    ("step\tseconds\n1\t0.5\n3\t1.0\n", ":3: expected step 2 and seconds that never fall"),
    ("step\tseconds\n1\t0.5\n2\tsoon\n", ":3: expected a step and its seconds"),
])
def test_a_clock_record_that_cannot_be_replayed_is_one_line(mlm_workdir, capsys, record, message):
    path = mlm_workdir / "clock.tsv"
    if record is not None:
        path.write_text(record, encoding="utf-8")
    with pytest.raises(SystemExit) as exit_info:
        main.main(["--time-budget", "10s", "--replay-clock", str(path)])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and err.count("\n") == 1, err
    assert not (mlm_workdir / "runs" / "run0").exists()


def test_replay_clock_goes_with_a_time_budget(tmp_path):
    (tmp_path / "config.ini").write_text("")
    with pytest.raises(UserError) as error:
        load_config(tmp_path / "config.ini", ["--replay-clock", "runs/run0/clock.tsv"])
    assert "replay-clock = runs/run0/clock.tsv goes with a time-budget" in str(error.value)
