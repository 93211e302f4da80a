"""scripts/glue.py: the GLUE table from a checkpoint, on small SST-2 and MRPC sets made from real sentences."""
import importlib.util
import json
import subprocess
import zipfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import make_demo
from conftest import TEST_DEVICE

ROOT = Path(__file__).resolve().parent.parent
RECIPE = f"""\
[all]
batch-size = 16
epochs = 1
learning-rate = 1e-3
warmup-ratio = 0.1
val-interval = 1000
log-interval = 10
pooling = mean
device = {TEST_DEVICE}
dtype = float32
seq-len = 64

[mrpc]
epochs = 2
"""


def load_runner():
    """scripts/glue.py by its path: `import glue` finds src/glue_tasks.py's neighbour first."""
    spec = importlib.util.spec_from_file_location("glue_runner", ROOT / "scripts" / "glue.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def write_mrpc(folder: Path, sentences: list[str]):
    """Pairs of a sentence with itself (equivalent) or with another one (not), in nyu-mll/glue's layout."""
    folder.mkdir(parents=True)
    for split, (start, count) in {"train": (0, 320), "validation": (400, 64), "test": (500, 48)}.items():
        rows = range(start, start + count)
        first = [sentences[row] for row in rows]
        second = [sentences[row] if row % 2 else sentences[row + 1000] for row in rows]
        labels = [row % 2 if split != "test" else -1 for row in rows]
        table = pa.table({"sentence1": first, "sentence2": second, "label": pa.array(labels, pa.int64()),
                          "idx": pa.array(range(count), pa.int32())})
        pq.write_table(table, folder / f"{split}-00000-of-00001.parquet")


@pytest.fixture(scope="module")
def glue_dir(tmp_path_factory, rotten_tomatoes):
    directory = tmp_path_factory.mktemp("glue")
    make_demo.write_sst2(directory / "sst2", rotten_tomatoes[::10], seed=1)
    write_mrpc(directory / "mrpc", [make_demo.clean_sentence(text) for text, _ in rotten_tomatoes])
    return directory


@pytest.fixture(scope="module")
def checkpoint(mlm_trained_run):
    return mlm_trained_run / "runs" / "run0" / "checkpoints" / "best.pt"


@pytest.fixture(scope="module")
def finished(checkpoint, glue_dir, tmp_path_factory):
    """Two tasks, two seeds each: the table, the scores and the submission."""
    work = tmp_path_factory.mktemp("glue_work")
    recipe = work / "recipe.ini"
    recipe.write_text(RECIPE, encoding="utf-8")
    arguments = ["--cp", str(checkpoint), "--glue-dir", str(glue_dir), "--tasks", "mrpc", "sst2", "--seeds", "2",
                 "--recipe", str(recipe), "-o", str(work / "out")]
    load_runner().main(arguments)
    return work / "out", arguments


def test_the_table_has_each_tasks_metrics_over_seeds(finished):
    out, _ = finished
    table = (out / "results.md").read_text()
    for row in ("| sst2 | accuracy |", "| mrpc | f1 |", "| mrpc | accuracy |"):
        assert row in table
    assert "n/a (not every task ran)" in table
    report = json.loads((out / "results.json").read_text())
    assert sorted((run["task"], run["seed"]) for run in report["runs"]) == [("mrpc", 1), ("mrpc", 2),
                                                                            ("sst2", 1), ("sst2", 2)]
    mrpc = [run["metrics"] for run in report["runs"] if run["task"] == "mrpc"]
    assert all(metrics["examples"] == 64 and 0 <= metrics["f1"] <= 1 for metrics in mrpc)
    assert report["medians"]["sst2"]["accuracy"] == pytest.approx(
        sorted(run["metrics"]["accuracy"] for run in report["runs"] if run["task"] == "sst2")[0] / 2
        + sorted(run["metrics"]["accuracy"] for run in report["runs"] if run["task"] == "sst2")[1] / 2)


def test_epochs_from_the_recipe_decide_each_runs_length(finished):
    out, _ = finished
    saved = (out / "runs" / "mrpc-seed1" / "config.ini").read_text()
    assert "max-iters = 40" in saved  # 2 epochs of 320 pairs at batch 16
    assert "warmup-iters = 4" in saved


def test_hidden_test_labels_give_the_servers_files_and_a_zip(finished):
    out, _ = finished
    lines = (out / "submission" / "MRPC.tsv").read_text().splitlines()
    assert lines[0] == "index\tprediction" and len(lines) == 49
    assert {line.split("\t")[1] for line in lines[1:]} <= {"0", "1"}
    assert not (out / "submission" / "SST-2.tsv").exists()  # its test labels are known: scored, not submitted
    with zipfile.ZipFile(out / "submission.zip") as bundle:
        assert bundle.namelist() == ["MRPC.tsv"]


def test_a_second_call_runs_nothing_again_and_a_lost_run_is_redone(finished, monkeypatch):
    out, arguments = finished
    runner = load_runner()
    calls = []
    monkeypatch.setattr(runner.subprocess, "run", lambda command: calls.append(command) or subprocess.CompletedProcess(
        command, 0))
    before = (out / "results.md").read_text()
    runner.main(arguments)
    assert calls == [] and (out / "results.md").read_text() == before
    (out / "scores" / "sst2-seed2.json").unlink()  # as if stopped while scoring
    runner.main(arguments)
    assert len(calls) == 1 and "--run-id" in calls[0] and "sst2-seed2" in calls[0]
    assert calls[0][calls[0].index("--cp") + 1].endswith("checkpoint.pt")  # resumes its own run


@pytest.mark.parametrize("options, message", [
    (["--tasks", "mrcp"], "unknown GLUE task 'mrcp'; did you mean mrpc?"),
    (["--tasks", "qnli"], "no data for qnli (found: none)"),
    (["--tasks", "sst2", "--seeds", "0"], "--seeds 0: expected at least 1"),
    (["--tasks", "sst2", "--lerning-rate", "1e-3"], "--lerning-rate: unknown option (did you mean --learning-rate?)"),
    (["--tasks", "sst2", "--recipe", "{bad_recipe}"], "[all]: unknown key 'epoch' (did you mean 'epochs'?)"),
])
def test_bad_input_is_one_line(checkpoint, glue_dir, tmp_path, capsys, options, message):
    bad_recipe = tmp_path / "bad.ini"
    bad_recipe.write_text("[all]\nepoch = 3\n", encoding="utf-8")
    options = [option.format(bad_recipe=bad_recipe) for option in options]
    with pytest.raises(SystemExit) as exit_info:
        load_runner().main(["--cp", str(checkpoint), "--glue-dir", str(glue_dir), "-o", str(tmp_path / "out"),
                            *options])
    assert exit_info.value.code == 2
    error = capsys.readouterr().err.strip()
    assert error.startswith("error: ") and message in error and "\n" not in error
    assert not (tmp_path / "out").exists()
