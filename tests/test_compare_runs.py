"""compare_runs.py on real runs of the small MLM model: groups, plots, the summary table and its
statistics, runs of different lengths, a dead run, resumed event files and the user errors."""
import signal
import statistics
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from scipy.stats import ttest_ind

import compare_runs
import main
import hardware
from test_trainer import scalars

ROOT = Path(__file__).resolve().parent.parent
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
LOW_MASK, HIGH_MASK = "mask-rate=0.15", "mask-rate=0.3"


@pytest.fixture(scope="module")
def runs(mlm_workdir_factory, tmp_path_factory) -> dict[str, Path]:
    """One base directory with six runs of 12 steps or fewer: two seeds at mask-rate 0.15, two at
    0.3, a third 0.3 run stopped at max-iters 8, and a dead one stopped before any validation."""
    directory = mlm_workdir_factory(tmp_path_factory.mktemp("compare") / "work",
                                    max_iters=12, lr_decay_iters=12, val_interval=4, val_iters=2)
    plans = {"low_1": ["--seed", "1"], "low_2": ["--seed", "2"],
             "high_1": ["--mask-rate", "0.3", "--seed", "1"], "high_2": ["--mask-rate", "0.3", "--seed", "2"],
             "high_short": ["--mask-rate", "0.3", "--seed", "3", "--max-iters", "8"],
             "dead": ["--mask-rate", "0.3", "--seed", "4"]}
    saved = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(hardware, "measure_matmul_flops", lambda device, dtype: 1e12)  # not tested here
            patch.chdir(directory)
            for name, overrides in plans.items():
                if name == "dead":
                    Path("stop").touch()  # stops after the first step, before any validation
                main.main(overrides)
    finally:
        for signum, handler in saved.items():
            signal.signal(signum, handler)
    return {name: directory / "runs" / f"run{number}" for number, name in enumerate(plans)}


def compare(tmp_path: Path, *arguments) -> tuple[str, Path]:
    out = tmp_path / "out"
    return compare_runs.main([*map(str, arguments), "-o", str(out)]), out


def table_rows(summary: str, tag: str) -> dict[str, list[str]]:
    """group label -> the cells of its row in the metric's table."""
    section = summary.split(f"## {tag}:", 1)[1].split("\n## ", 1)[0]
    rows = [line.strip("|").split("|") for line in section.splitlines() if line.startswith("| ")]
    return {cells[0].strip(): [cell.strip() for cell in cells[1:]] for cells in rows[1:]}


def mean_std_cell(cell: str) -> tuple[float, float]:
    mean, std = cell.split(" ± ")
    return float(mean), float(std)


def final_values(run_dirs: list[Path], tag: str, step: int) -> list[float]:
    return [dict(scalars(run_dir)[tag])[step] for run_dir in run_dirs]


# ----------------------------------------------------------------------------- real runs

def test_two_groups_of_two_seeds_give_plots_and_a_table_of_the_events_values(runs, tmp_path, capsys):
    low, high = [runs["low_1"], runs["low_2"]], [runs["high_1"], runs["high_2"]]
    summary, out = compare(tmp_path, *low, *high)

    assert capsys.readouterr().out.strip() == summary.strip()
    assert (out / "summary.md").read_text(encoding="utf-8") == summary
    for tag in ("val_loss", "val_accuracy"):
        for x_axis in ("step", "tokens"):
            png = out / f"{tag}_vs_{x_axis}.png"
            assert png.read_bytes().startswith(PNG_SIGNATURE)
            import matplotlib.pyplot as plt
            assert plt.imread(png).shape[0] > 100  # decodes, and is a real picture
    assert sorted(path.name for path in out.iterdir()) == sorted(
        ["summary.md"] + [f"val_{m}_vs_{x}.png" for m in ("loss", "accuracy") for x in ("step", "tokens")])

    assert "## val/loss: final at step 12, the last step all 4 runs reached" in summary
    rows = table_rows(summary, "val/loss")
    assert list(rows) == [LOW_MASK, HIGH_MASK]  # the default grouping: only mask-rate differs (not seed)
    low_finals, high_finals = final_values(low, "val/loss", 12), final_values(high, "val/loss", 12)
    for label, finals in ((LOW_MASK, low_finals), (HIGH_MASK, high_finals)):
        count, final, best, reached, _ = rows[label]
        assert count == "2" and reached == "12"
        assert mean_std_cell(final) == pytest.approx((statistics.mean(finals), statistics.stdev(finals)), abs=6e-5)
    best_losses = [min(value for _, value in scalars(run_dir)["val/loss"]) for run_dir in low]
    assert mean_std_cell(rows[LOW_MASK][2]) == pytest.approx(
        (statistics.mean(best_losses), statistics.stdev(best_losses)), abs=6e-5)
    assert rows[LOW_MASK][4] == "–"
    expected_p = ttest_ind(low_finals, high_finals, equal_var=False).pvalue
    assert float(rows[HIGH_MASK][4]) == pytest.approx(expected_p, rel=1e-2)  # shown to 3 digits

    accuracies = [max(value for _, value in scalars(run_dir)["val/accuracy"]) for run_dir in high]
    assert mean_std_cell(table_rows(summary, "val/accuracy")[HIGH_MASK][2]) == pytest.approx(
        (statistics.mean(accuracies), statistics.stdev(accuracies)), abs=6e-5)  # best of accuracy: the highest


def test_runs_of_different_lengths_are_compared_at_the_last_step_all_reached(runs, tmp_path):
    high = [runs["high_1"], runs["high_2"], runs["high_short"]]
    summary, _ = compare(tmp_path, runs["low_1"], runs["low_2"], *high, "--metric", "loss")

    assert "## val/loss: final at step 8, the last step all 5 runs reached" in summary
    assert "val/accuracy" not in summary
    count, final, _, reached, _ = table_rows(summary, "val/loss")[HIGH_MASK]
    assert (count, reached) == ("3", "8–12")  # max-iters is not a grouping key by default
    finals = final_values(high, "val/loss", 8)
    assert mean_std_cell(final) == pytest.approx((statistics.mean(finals), statistics.stdev(finals)), abs=6e-5)


def test_a_run_without_validation_scalars_is_left_out_with_a_warning(runs, tmp_path, capsys):
    assert "val/loss" not in scalars(runs["dead"]) and "train/loss" in scalars(runs["dead"])
    summary, _ = compare(tmp_path, runs["low_1"], runs["high_1"], runs["dead"])

    warnings = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning:")]
    assert warnings == [f"warning: {runs['dead']}: no validation scalars (stopped before its first "
                        f"validation, at step 1); left out"]
    assert f"left out: {runs['dead']}" in summary
    rows = table_rows(summary, "val/loss")
    assert [cells[0] for cells in rows.values()] == ["1", "1"]
    assert rows[HIGH_MASK][4] == "–"  # no t-test on a single run
    assert rows[LOW_MASK][1].endswith(" ± –")


def test_group_by_an_explicit_key_pools_what_differs_otherwise(runs, tmp_path):
    summary, _ = compare(tmp_path, runs["low_1"], runs["low_2"], runs["high_1"], "--group-by", "seed")
    rows = table_rows(summary, "val/loss")
    assert {label: cells[0] for label, cells in rows.items()} == {"seed=1": "2", "seed=2": "1"}


def test_target_gives_the_steps_tokens_and_minutes_each_group_took(runs, tmp_path):
    low = [runs["low_1"], runs["low_2"]]
    accuracies = {run: dict(scalars(run)["val/accuracy"]) for run in low}
    target = min(max(values.values()) for values in accuracies.values())  # both low runs reach it
    summary, _ = compare(tmp_path, *low, runs["high_1"], "--target", f"accuracy:{target!r}")

    firsts = [min(step for step, value in accuracies[run].items() if value >= target) for run in low]
    tokens = [dict(scalars(run)["val/tokens"])[step] / 1e6 for run, step in zip(low, firsts)]
    minutes = [dict(scalars(run)["val/elapsed"])[step] / 60 for run, step in zip(low, firsts)]
    reached, steps, token_cell, minute_cell = table_rows(summary, "time to target")[LOW_MASK]
    assert reached == "2 of 2"
    assert mean_std_cell(steps) == pytest.approx((statistics.mean(firsts), statistics.stdev(firsts)), abs=0.5)
    assert mean_std_cell(token_cell) == pytest.approx((statistics.mean(tokens), statistics.stdev(tokens)), abs=0.05)
    assert mean_std_cell(minute_cell) == pytest.approx((statistics.mean(minutes), statistics.stdev(minutes)),
                                                       abs=0.05)


def test_grouped_by_start_the_test_scores_stand_against_the_pretraining_behind_each_start(
        mlm_trained_run, tmp_path, monkeypatch, keep_signal_handlers, skip_flops_measurement):
    """Starts of 30 and 40 steps, one of 30 + 4 more (two stages in its lineage) and random weights,
    two seeds each, scored with --test: the tokens column and the scaling plot."""
    import shutil
    import torch
    work = tmp_path / "work"
    shutil.copytree(mlm_trained_run, work, ignore=shutil.ignore_patterns("run[1-9]*"))
    monkeypatch.chdir(work)
    saved = work / "runs" / "run0" / "checkpoints"

    def train(run_id: str, start: Path | None, seed: int) -> Path:
        begin = ["--cp", str(start), "--switch-training"] if start else []
        main.main([*begin, "--run-id", run_id, "--seed", str(seed), "--max-iters", "4", "--lr-decay-iters", "4",
                   "--warmup-iters", "0", "--val-interval", "2"])
        return work / "runs" / run_id

    two_stages = train("longer", saved / "checkpoint-30.pt", 1) / "checkpoints" / "checkpoint.pt"
    starts = {"steps30": saved / "checkpoint-30.pt", "steps40": saved / "checkpoint.pt",
              "steps30and4": two_stages, "random": None}
    run_dirs = []
    for name, start in starts.items():
        for seed in (1, 2):
            run_dirs.append(train(f"{name}-{seed}", start, seed))
            main.main(["--cp", str(run_dirs[-1] / "checkpoints" / "checkpoint.pt"), "--test"])
    summary, out = compare(tmp_path, *run_dirs, "--group-by", "start")

    def tokens_of(path: Path) -> int:
        return torch.load(path, map_location="cpu", weights_only=True)["tokens"]

    expected = {f"start={start.resolve()}": tokens_of(start) for start in starts.values() if start}
    expected[f"start={two_stages.resolve()}"] += tokens_of(saved / "checkpoint-30.pt")
    expected["start=none"] = 0
    rows = table_rows(summary, "test/accuracy")
    assert {label: float(cells[0]) for label, cells in rows.items()} == pytest.approx(
        {label: count / 1e6 for label, count in expected.items()}, rel=1e-2)
    assert {cells[1] for cells in rows.values()} == {"2"}
    plot = out / "test_accuracy_vs_pretraining_tokens.png"
    assert plot.read_bytes().startswith(PNG_SIGNATURE)
    assert not (out / "test_examples_vs_pretraining_tokens.png").exists()  # a count, not a score


@pytest.mark.parametrize("arguments, message", [
    (["{tmp}"], "error: {tmp}: not a run directory (no config.ini and no logs/)"),
    (["{run}", "--target", "accuracy"], "error: --target accuracy: expected METRIC:VALUE, a validation metric and "
                                        "a number (accuracy:0.35)"),
    (["{run}", "--target", "bleu:0.3"], "error: --target bleu:0.3: no run has val/bleu"),
    (["{run}", "--group-by", "mask_rat"], "error: --group-by mask-rat: not a config key (did you mean mask-rate?)"),
])
def test_bad_input_is_one_line_and_exit_code_2(runs, tmp_path, arguments, message):
    arguments = [argument.format(tmp=tmp_path, run=runs["low_1"]) for argument in arguments]
    result = subprocess.run([sys.executable, str(ROOT / "scripts" / "compare_runs.py"), *arguments,
                             "-o", str(tmp_path / "out")], capture_output=True, text=True)
    assert result.returncode == 2
    assert result.stderr.splitlines() == [message.format(tmp=tmp_path)]
    assert not (tmp_path / "out").exists()


# ----------------------------------------------------------------------------- pure functions

def test_a_resumed_run_keeps_the_latest_values_and_drops_what_followed_the_checkpoint(tmp_path):
    from torch.utils.tensorboard import SummaryWriter
    first = SummaryWriter(str(tmp_path))  # logged to step 30, but its last checkpoint was at 20
    for step in range(10, 31, 10):
        first.add_scalar("val/loss", 10.0 - step / 10, step)
    first.close()
    resumed = SummaryWriter(str(tmp_path))  # a second event file in the same directory
    for step in range(21, 26):
        resumed.add_scalar("train/loss", 1.0, step)
    resumed.add_scalar("val/loss", 5.0, 25)
    resumed.close()

    steps, values = compare_runs.read_scalars(tmp_path)["val/loss"]
    assert steps.tolist() == [10, 20, 25] and values.tolist() == [9.0, 8.0, 5.0]


def test_merging_event_files_replaces_logged_steps_with_the_later_file():
    merged = compare_runs.merge_event_files([{"val/loss": [(5, 3.0), (10, 2.0), (10, 1.5)]},
                                             {}, {"val/loss": [(10, 1.0), (15, 0.5)]}])
    assert merged == {"val/loss": {5: 3.0, 10: 1.0, 15: 0.5}}


def run_with(**settings) -> compare_runs.RunData:
    values = {"seed": "1", "max-iters": "20", "base-dir": ".", "mask-rate": "0.15", "dropout": "0.1"} | settings
    steps = np.array([10, 20])
    return compare_runs.RunData(Path("run"), values, {"val/loss": (steps, np.array([2.0, 1.0]))})


def test_default_grouping_ignores_seed_length_and_paths():
    runs = [run_with(), run_with(seed="2", **{"max-iters": "10", "base-dir": "/b"}), run_with(**{"mask-rate": "0.3"})]
    assert compare_runs.differing_keys(runs) == ["mask-rate"]
    assert list(compare_runs.group_runs(runs, ["mask-rate", "dropout"])) == [
        "mask-rate=0.15, dropout=0.1", "mask-rate=0.3, dropout=0.1"]
    assert list(compare_runs.group_runs(runs[:2], [])) == ["all runs"]


def test_statistics_are_undefined_rather_than_failing_for_single_runs_and_ties():
    assert np.isnan(compare_runs.welch_p_value([1.0], [2.0, 3.0]))
    assert np.isnan(compare_runs.welch_p_value([1.0, 1.0], [1.0, 1.0]))
    assert compare_runs.welch_p_value([1.0, 1.2, 0.9], [2.0, 2.5]) == pytest.approx(
        ttest_ind([1.0, 1.2, 0.9], [2.0, 2.5], equal_var=False).pvalue)
    assert np.isnan(compare_runs.mean_and_std([1.0])[1])
    assert compare_runs.mean_std_text([1.0]) == "1.0000 ± –"


def test_the_group_mean_curve_goes_on_over_the_runs_that_reached_each_step():
    longer = run_with()
    shorter = compare_runs.RunData(Path("short"), longer.settings, {"val/loss": (np.array([10]), np.array([3.0]))})
    steps, mean, std = compare_runs.mean_curve([longer, shorter], "val/loss", "step")
    assert steps.tolist() == [10, 20] and mean.tolist() == [2.5, 1.0]
    assert std.tolist() == [pytest.approx(statistics.stdev([2.0, 3.0])), 0.0]


def test_runs_without_a_common_validation_step_are_a_user_error():
    ended_early = compare_runs.RunData(Path("early"), {}, {"val/loss": (np.array([5]), np.array([3.0]))})
    with pytest.raises(compare_runs.UserError, match="run: its first val/loss is at step 10, after another run ended"):
        compare_runs.common_last_step([run_with(), ended_early], "val/loss")
