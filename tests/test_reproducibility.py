"""The same config and seed make the same run: two runs of each, in fresh processes, with another
process keeping a core busy, end bit for bit equal (weights, optimizer state, the log's losses), for
pre-training and fine-tuning, under the default `dtype = auto` (bf16 on a CPU that has it)."""
import csv
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import checkpoints
from conftest import write_mlm_config

MAIN = Path(__file__).resolve().parent.parent / "src" / "main.py"
# Under dtype = auto (the default, left out of the config here) a CPU with bf16 runs bf16.
SHAPE = {"d-model": 128, "d-ff": 256, "heads": 2, "max-iters": 8, "lr-decay-iters": 8, "warmup-iters": 2,
         "val-interval": 4, "dropout": 0.1}
BUSY_LOOP = "import torch\ntorch.set_num_threads(1)\na = torch.randn(384, 384)\nwhile True:\n    a @ a\n"


@pytest.fixture
def busy_core():
    """Another process keeping a core busy with matmuls for as long as the test runs."""
    busy = subprocess.Popen([sys.executable, "-c", BUSY_LOOP])
    yield busy
    busy.kill()
    busy.wait()


def train(directory: Path, run_id: str, *options: str) -> Path:
    """python src/main.py in `directory`, a fresh process: the run's directory."""
    done = subprocess.run([sys.executable, str(MAIN), "--run-id", run_id, *options], cwd=directory,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return directory / "runs" / run_id


def logged_losses(run_dir: Path) -> list[str]:
    """Every loss the log prints, as printed (its timings differ from run to run, its losses may not)."""
    text = (run_dir / "logs" / "log.txt").read_text(encoding="utf-8")
    return re.findall(r"\b(?:val )?loss[ =:]+[-\d.e+]+", text)


def assert_same_run(first: Path, second: Path):
    one, other = (checkpoints.load(run / "checkpoints" / "checkpoint.pt") for run in (first, second))
    assert one["step"] == other["step"] and one["autocast"] == other["autocast"]
    assert one["model"].keys() == other["model"].keys()
    assert all(torch.equal(one["model"][name], other["model"][name]) for name in one["model"])
    moments = [(a, b) for state_a, state_b in zip(one["optimizer"]["state"].values(),
                                                  other["optimizer"]["state"].values())
               for a, b in zip(state_a.values(), state_b.values())]
    assert moments and all(torch.equal(torch.as_tensor(a), torch.as_tensor(b)) for a, b in moments)
    losses = logged_losses(first)
    assert losses and losses == logged_losses(second)


def test_two_pre_training_runs_of_one_config_and_seed_are_bit_for_bit_equal_beside_a_busy_core(
        mlm_workdir_factory, tmp_path, busy_core):
    work = mlm_workdir_factory(tmp_path / "work", **SHAPE)
    text = (work / "config.ini").read_text(encoding="utf-8")
    (work / "config.ini").write_text(re.sub(r"^dtype = .*\n", "", text, flags=re.MULTILINE), encoding="utf-8")
    assert_same_run(train(work, "first"), train(work, "second"))


def test_two_fine_tuning_runs_of_one_config_and_seed_are_bit_for_bit_equal_beside_a_busy_core(
        mlm_workdir_factory, rotten_tomatoes, tmp_path, busy_core):
    work = mlm_workdir_factory(tmp_path / "work", **SHAPE)
    start = train(work, "mlm", "--dtype", "float32") / "checkpoints" / "checkpoint.pt"
    for split, rows in (("train", rotten_tomatoes[::8]), ("dev", rotten_tomatoes[1::16])):
        with (work / f"{split}.csv").open("w", newline="", encoding="utf-8") as file:
            csv.writer(file).writerows([("text", "label"), *rows])
    config = write_mlm_config(work, **SHAPE, task_type="classify", train_file="train.csv",
                              validation_file="dev.csv")
    config.write_text(re.sub(r"^(dtype|dataset-pattern|val-dataset-pattern|test-dataset-pattern) = .*\n", "",
                             config.read_text(encoding="utf-8"), flags=re.MULTILINE), encoding="utf-8")
    assert_same_run(train(work, "first", "--cp", str(start)), train(work, "second", "--cp", str(start)))


def test_deterministic_turns_on_torchs_deterministic_algorithms_before_the_model_is_built(mlm_workdir, monkeypatch):
    import main
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)  # restored after the test
    try:
        main.main(["--deterministic", "true", "--max-iters", "2", "--val-interval", "2", "--val-iters", "1"])
        assert torch.are_deterministic_algorithms_enabled() and torch.is_deterministic_algorithms_warn_only_enabled()
        assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8" and not torch.backends.cudnn.benchmark
    finally:
        torch.use_deterministic_algorithms(False)
    assert (mlm_workdir / "runs" / "run0" / "checkpoints" / "checkpoint.pt").is_file()
