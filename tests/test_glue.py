"""scripts/glue.py: the GLUE table from a checkpoint, on small SST-2 and MRPC sets made from real sentences."""
import errno
import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import checkpoints
import make_demo
from conftest import TEST_DEVICE
from errors import UserError
from run_log import lock_run_dir
from trainer import finished_marker

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
peak-tflops = 1

[mrpc]
epochs = 2
"""


def load_runner():
    """scripts/glue.py by its path: `import glue` finds src/tasks/glue_tasks.py's neighbour first."""
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

    def training_to_the_end(command):
        calls.append(command)
        finished_marker(out / "runs" / command[command.index("--run-id") + 1]).touch()
        return 0
    monkeypatch.setattr(runner, "run_training", training_to_the_end)
    before = (out / "results.md").read_text()
    runner.main(arguments)
    assert calls == [] and (out / "results.md").read_text() == before
    score = out / "scores" / "sst2-seed2.json"
    score.unlink()  # as if stopped while scoring
    runner.main(arguments)
    assert calls == [] and score.is_file()  # its run had finished: scored again, not trained again
    score.unlink()
    finished_marker(out / "runs" / "sst2-seed2").unlink()  # as if stopped while training
    runner.main(arguments)
    assert len(calls) == 1 and "--run-id" in calls[0] and "sst2-seed2" in calls[0]
    assert calls[0][calls[0].index("--cp") + 1].endswith("checkpoint.pt")  # resumes its own run


def test_a_stopped_run_is_not_scored_and_the_same_command_resumes_it(checkpoint, glue_dir, tmp_path, monkeypatch,
                                                                      capsys):
    """A stop file (or SIGTERM to the run) saves and exits 0 by design: the runner must not take that
    for the end of the run."""
    recipe = tmp_path / "recipe.ini"
    recipe.write_text(RECIPE, encoding="utf-8")
    out = tmp_path / "out"
    arguments = ["--cp", str(checkpoint), "--glue-dir", str(glue_dir), "--tasks", "sst2", "--seeds", "1",
                 "--recipe", str(recipe), "-o", str(out)]
    monkeypatch.chdir(tmp_path)
    Path("stop").touch()  # the run reads it after its first step, as if written while it trained
    with pytest.raises(SystemExit) as exit_info:
        load_runner().main(arguments)
    assert exit_info.value.code == 130
    error = capsys.readouterr().err.strip()
    assert error.startswith("stopped: sst2 seed 1 was stopped before its end") and "\n" not in error
    run_dir = out / "runs" / "sst2-seed1"
    assert not (out / "scores").exists() and not finished_marker(run_dir).exists()
    assert checkpoints.load(run_dir / "checkpoints" / "checkpoint.pt")["step"] == 1
    load_runner().main(arguments)
    score = json.loads((out / "scores" / "sst2-seed1.json").read_text())
    assert score["step"] == 10  # one epoch of 160 sentences at batch 16: the whole run
    assert "resuming" in (run_dir / "logs" / "log.txt").read_text(encoding="utf-8")


def start_long_runner(checkpoint, glue_dir, work: Path) -> tuple[subprocess.Popen, Path]:
    """scripts/glue.py in its own process, once its run trains: the process and the run directory."""
    recipe = work / "recipe.ini"
    recipe.write_text(RECIPE, encoding="utf-8")
    run_dir = work / "out" / "runs" / "sst2-seed1"
    process = subprocess.Popen([sys.executable, str(ROOT / "scripts" / "glue.py"), "--cp", str(checkpoint),
                                "--glue-dir", str(glue_dir), "--tasks", "sst2", "--seeds", "1", "--recipe", str(recipe),
                                "-o", str(work / "out"), "--epochs", "1000", "--log-interval", "1"],
                               cwd=work, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    log = run_dir / "logs" / "log.txt"
    deadline = time.monotonic() + 120
    while not (log.is_file() and re.search(r"^step \d+ \| loss", log.read_text(encoding="utf-8"), re.M)):
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            raise AssertionError(f"the run did not start training: {process.communicate()}")
        time.sleep(0.1)
    return process, run_dir


def wait_until_free(run_dir: Path, timeout: float) -> bool:
    """Whether the run directory's lock can be taken within timeout: no process trains in it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            lock_run_dir(run_dir).close()
            return True
        except UserError:
            time.sleep(0.1)
    return False


def kill_processes_running(text: str):
    """The processes whose command line holds text (a run left behind), by their ids."""
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and text in (entry / "cmdline").read_text(errors="replace"):
                os.kill(int(entry.name), signal.SIGKILL)
        except (OSError, ProcessLookupError):
            pass


def test_sigterm_to_the_runner_stops_its_run_cleanly(checkpoint, glue_dir, tmp_path):
    process, run_dir = start_long_runner(checkpoint, glue_dir, tmp_path)
    try:
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=60)
        assert process.returncode == 130, stderr
        assert "Traceback" not in stderr and "stopped: by SIGTERM; run the same command again" in stderr
        assert re.search(r"stopped by SIGTERM at step \d+", (run_dir / "logs" / "log.txt").read_text(encoding="utf-8"))
        assert (run_dir / "checkpoints" / "checkpoint.pt").is_file() and not finished_marker(run_dir).exists()
        assert wait_until_free(run_dir, timeout=1)
    finally:
        process.kill()
        kill_processes_running(str(run_dir.parent))


def test_kill_9_of_the_runner_ends_its_run_too(checkpoint, glue_dir, tmp_path):
    """A run nobody controls would hold its directory, and the same command would be refused."""
    process, run_dir = start_long_runner(checkpoint, glue_dir, tmp_path)
    try:
        process.kill()
        process.communicate(timeout=10)
        assert wait_until_free(run_dir, timeout=10)
    finally:
        kill_processes_running(str(run_dir.parent))


def test_a_second_runner_on_the_same_output_is_refused(finished, capsys):
    out, arguments = finished
    runner = load_runner()
    with runner.locked_output(out):  # as a first runner holds it while it trains
        with pytest.raises(SystemExit) as exit_info:
            runner.main(arguments)
    assert exit_info.value.code == 2
    error = capsys.readouterr().err.strip()
    assert error == f"error: {out}: another glue.py is working in it (it holds {out / '.lock'}); " \
                    f"wait for it to end, or stop it"


@pytest.mark.parametrize("change, message", [
    ("--learning-rate 2e-3", "holds runs made with learning-rate = 0.001 for mnli, not 0.002"),
    ("recipe: [mrpc] epochs = 3", "holds runs made with epochs = 2.0 for mrpc, not 3.0"),
    ("--glue-dir", "holds runs made with glue-dir "),
    ("--cp", "holds runs made with the checkpoint "),
])
def test_a_rerun_that_would_mix_scores_is_refused_naming_what_differs(finished, tmp_path, capsys, change, message):
    out, arguments = finished
    arguments = list(arguments)
    if change.startswith("--learning-rate"):
        arguments += change.split()
    elif change.startswith("recipe"):
        recipe = tmp_path / "recipe.ini"
        recipe.write_text(RECIPE.replace("epochs = 2", "epochs = 3"), encoding="utf-8")
        arguments[arguments.index("--recipe") + 1] = str(recipe)
    elif change == "--glue-dir":
        shutil.copytree(arguments[arguments.index("--glue-dir") + 1], tmp_path / "glue")
        arguments[arguments.index("--glue-dir") + 1] = str(tmp_path / "glue")
    else:
        other = tmp_path / "best.pt"
        other.write_bytes(Path(arguments[arguments.index("--cp") + 1]).read_bytes() + b"\0")
        arguments[arguments.index("--cp") + 1] = str(other)
    before = (out / "results.md").read_text()
    with pytest.raises(SystemExit) as exit_info:
        load_runner().main(arguments)
    assert exit_info.value.code == 2
    error = capsys.readouterr().err.strip()
    assert error.startswith(f"error: {out}: ") and message in error and "\n" not in error
    assert error.endswith(f"choose another -o, or remove {out} to start again")
    assert (out / "results.md").read_text() == before


def test_an_output_without_runs_yet_takes_the_new_settings(tmp_path):
    """A first command that failed before any run (a recipe that does not fit the machine) is
    corrected and run again: nothing to mix, so nothing to refuse."""
    check_made_by = load_runner().check_made_by
    made_by = {"checkpoint": "best.pt", "checkpoint sha256": "ab12", "glue-dir": "glue", "from-mnli": False,
               "processes": "1", "settings": {"sst2": {"batch-size": "32"}}}
    check_made_by(tmp_path, made_by)
    smaller = made_by | {"settings": {"sst2": {"batch-size": "16"}}}
    check_made_by(tmp_path, smaller)
    assert json.loads((tmp_path / "made_by.json").read_text()) == smaller
    (tmp_path / "runs" / "sst2-seed1").mkdir(parents=True)
    with pytest.raises(UserError, match="holds runs made with batch-size = 16 for sst2, not 32"):
        check_made_by(tmp_path, made_by)


def read_only(monkeypatch):
    def refuse(self, *args, **kwargs):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(self))
    monkeypatch.setattr(Path, "mkdir", refuse)


@pytest.mark.parametrize("output, message", [
    ("a_file", "a_file: not a directory (-o names the directory for the runs and the table)"),
    ("a_file/out", "a_file/out: cannot write there (Not a directory)"),
    ("read_only/out", "read_only/out: cannot write there (Read-only file system)"),
    ("older", "older: holds runs but no made_by.json saying what made them"),
])
def test_an_output_the_runner_cannot_use_is_one_line(checkpoint, glue_dir, tmp_path, monkeypatch, capsys, output,
                                                    message):
    (tmp_path / "a_file").write_text("not a directory\n", encoding="utf-8")
    (tmp_path / "older" / "scores").mkdir(parents=True)  # from a glue.py that kept no record
    (tmp_path / "older" / "scores" / "sst2-seed1.json").write_text("{}\n", encoding="utf-8")
    if output.startswith("read_only"):
        read_only(monkeypatch)
    recipe = tmp_path / "recipe.ini"
    recipe.write_text(RECIPE, encoding="utf-8")
    with pytest.raises(SystemExit) as exit_info:
        load_runner().main(["--cp", str(checkpoint), "--glue-dir", str(glue_dir), "--tasks", "sst2",
                            "--recipe", str(recipe), "-o", str(tmp_path / output)])
    assert exit_info.value.code == 2
    error = capsys.readouterr().err.strip()
    assert error.startswith("error: ") and message in error and "\n" not in error


@pytest.mark.parametrize("options, message", [
    (["--tasks", "mrcp"], "unknown GLUE task 'mrcp'; did you mean mrpc?"),
    (["--tasks", "qnli"], "no data for qnli (found: none)"),
    (["--tasks", "sst2", "--seeds", "0"], "--seeds 0: expected at least 1"),
    (["--tasks", "sst2", "--lerning-rate", "1e-3"], "--lerning-rate: unknown option (did you mean --learning-rate?)"),
    (["--tasks", "sst2", "--recipe", "{bad_recipe}"], "[all]: unknown key 'epoch' (did you mean 'epochs'?)"),
    (["--tasks", "sst2", "mrpc", "--recipe", "{bad_task_recipe}"],  # found before sst2 trains, in the user's file
     "bad_task.ini: [mrpc]: learning-rate = -0.001: expected a number > 0"),
    (["--tasks", "sst2", "mrpc", "--recipe", "{bad_task_recipe}", "--learning-rate", "1e-3"],
     "bad_task.ini: [mrpc]: min-learning-rate = 0.01 is above learning-rate = 0.001"),
])
def test_bad_input_is_one_line(checkpoint, glue_dir, tmp_path, capsys, options, message):
    bad_recipe = tmp_path / "bad.ini"
    bad_recipe.write_text("[all]\nepoch = 3\n", encoding="utf-8")
    bad_task_recipe = tmp_path / "bad_task.ini"
    bad_task_recipe.write_text(RECIPE + "learning-rate = -1e-3\nmin-learning-rate = 0.01\n", encoding="utf-8")
    options = [option.format(bad_recipe=bad_recipe, bad_task_recipe=bad_task_recipe) for option in options]
    with pytest.raises(SystemExit) as exit_info:
        load_runner().main(["--cp", str(checkpoint), "--glue-dir", str(glue_dir), "-o", str(tmp_path / "out"),
                            *options])
    assert exit_info.value.code == 2
    error = capsys.readouterr().err.strip()
    assert error.startswith("error: ") and message in error and "\n" not in error
    assert not (tmp_path / "out").exists()


def test_named_entities_squad_and_embeddings_join_the_table(checkpoint, imdb_corpus, tmp_path):
    """The report card: each task's scores over seeds beside GLUE's, from the demo makers' data."""
    import make_embed_demo
    import make_ner_demo
    import make_qa_demo
    data = tmp_path / "data"
    make_ner_demo.make_ner_demo(imdb_corpus, data / "ner", limit=300)
    make_qa_demo.make_qa_demo(imdb_corpus, data, limit=300)
    make_embed_demo.make_embed_demo(imdb_corpus, data / "embed", limit=300)
    recipe = tmp_path / "recipe.ini"
    recipe.write_text(RECIPE + "\n[ner]\ndataset-percentage = 0.1\n[squad]\ndataset-percentage = 0.2\n"
                      "[embed]\ndataset-percentage = 0.1\nval-dataset-percentage = 0.2\n", encoding="utf-8")
    load_runner().main(["--cp", str(checkpoint), "--glue-dir", str(data), "--tasks", "embed", "squad", "ner",
                        "--recipe", str(recipe), "--seeds", "1", "-o", str(tmp_path / "out")])
    table = (tmp_path / "out" / "results.md").read_text()
    rows = [line for line in table.splitlines() if line.startswith("| ") and "median" not in line]
    assert [row.split(" | ")[:2] for row in rows] == [
        ["| ner", "f1"], ["| ner", "precision"], ["| ner", "recall"], ["| squad", "exact"], ["| squad", "f1"],
        ["| embed", "spearman"], ["| embed", "ndcg@10"], ["| embed", "recall@10"]]
    report = json.loads((tmp_path / "out" / "results.json").read_text())
    squad = next(run["metrics"] for run in report["runs"] if run["task"] == "squad")
    assert report["medians"]["squad"]["f1"] == pytest.approx(squad["f1"] / 100)  # the table's fractions
    assert report["leaderboard_average"] is None and not (tmp_path / "out" / "submission").exists()


def test_a_task_whose_settings_do_not_fit_its_data_stops_the_runner_before_any_run(checkpoint, imdb_corpus,
                                                                                  tmp_path, capsys):
    """SQuAD's doc-stride 128 beside --seq-len 64 leaves no room for windows: refused before NER's run
    trains, as the run itself would refuse it (each task's data read with its settings)."""
    import make_ner_demo
    import make_qa_demo
    data = tmp_path / "data"
    make_ner_demo.make_ner_demo(imdb_corpus, data / "ner", limit=100)
    make_qa_demo.make_qa_demo(imdb_corpus, data, limit=100)
    recipe = tmp_path / "recipe.ini"
    recipe.write_text(RECIPE + "\n[squad]\ndoc-stride = 128\n", encoding="utf-8")
    with pytest.raises(SystemExit) as exit_info:
        load_runner().main(["--cp", str(checkpoint), "--glue-dir", str(data), "--tasks", "ner", "squad",
                            "--seq-len", "64", "--recipe", str(recipe), "--seeds", "1", "-o", str(tmp_path / "out")])
    assert exit_info.value.code == 2
    error = capsys.readouterr().err.strip()
    assert error.startswith("error: squad: seq-len = 64 leaves") and "doc-stride" in error and "\n" not in error
    assert not (tmp_path / "out").exists()


def test_a_seed_whose_correlation_is_undefined_is_said_and_not_counted_as_a_score(tmp_path):
    """STS-B's Pearson of constant predictions is None (undefined): the median is over the seeds with a
    score, the table says how many had none, and the averages are undefined where a median is."""
    runner = load_runner()
    stsb = [{"task": "stsb", "seed": seed, "predictions": {}, "metrics": {"pearson": value, "spearman": value}}
            for seed, value in ((1, 0.8), (2, None), (3, 0.6))]
    facts = runner.summary(stsb)
    assert facts["medians"]["stsb"] == {"pearson": pytest.approx(0.7), "spearman": pytest.approx(0.7)}
    assert facts["undefined_seeds"]["stsb"]["pearson"] == 1
    args = runner.parse_args(["--cp", "x.pt", "--glue-dir", "glue", "--tasks", "stsb", "--seeds", "3"])[0]
    table = runner.table(stsb, args)
    assert "| stsb | pearson | 70.0 | 60.0-80.0; 1 of 3 seeds undefined (constant predictions or labels), " \
           "left out |" in table
    collapsed = [result | {"metrics": {"pearson": None, "spearman": None}} for result in stsb]
    assert runner.summary(collapsed)["medians"]["stsb"] == {"pearson": None, "spearman": None}
    assert "| stsb | pearson | undefined | undefined (constant predictions or labels) in all 3 seeds |" in \
        runner.table(collapsed, args)
    for seed in (1, 2):
        (tmp_path / f"seed{seed}.tsv").write_text(f"index\tprediction\n0\t{seed}\n")
    scored = [collapsed[0] | {"predictions": {"STS-B.tsv": str(tmp_path / "seed1.tsv")}},
              stsb[2] | {"seed": 2, "predictions": {"STS-B.tsv": str(tmp_path / "seed2.tsv")}}]
    runner.write_submission(scored, tmp_path / "out")  # the seed with a score, not the undefined one
    assert (tmp_path / "out" / "submission" / "STS-B.tsv").read_text() == "index\tprediction\n0\t2\n"
