"""`classify` on the user's own files (train-file, validation-file, test-file): labels by name into the
model and out through --test, classify.py, the export and its import, pairs, scores and multi-label,
and a resume that finds its files changed; every bad file or setting one line. Reading the files
themselves (every format, column and bad value): test_labelled_files.py."""
import hashlib
import json
import re
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

import checkpoints
import classify
import export_hf
from tasks import glue_data
import import_hf
from tasks import labelled_files
import main
import model as model_module
from interop import onnx_model
import run_start
import task as task_module
from config import Config
from errors import UserError
from conftest import MOODS, TEST_DEVICE, one_error_line
from test_labelled_files import read_rows, tagged, write_csv, write_jsonl

TINY_RUN = {"task-type": "classify", "seq-len": 32, "batch-size": 16, "d-model": 32, "heads": 2, "n-layer": 2,
            "d-ff": 64, "dropout": 0.1, "device": TEST_DEVICE, "dtype": "float32", "compile": "false",
            "peak-tflops": 1, "log-interval": 1, "learning-rate": 2e-3, "min-learning-rate": 2e-4,
            "warmup-iters": 2, "max-iters": 4, "lr-decay-iters": 4, "val-interval": 4}


@pytest.fixture
def workdir(tmp_path, vocab_dir, monkeypatch, keep_signal_handlers, examples) -> Path:
    """The current directory: vocab/, and train.csv, dev.jsonl, test.tsv (no labels) of the examples."""
    shutil.copytree(vocab_dir, tmp_path / "vocab")
    write_csv(tmp_path / "train.csv", examples[:160])
    write_jsonl(tmp_path / "dev.jsonl", examples[160:])
    (tmp_path / "test.tsv").write_text("text\n" + "".join(text + "\n" for text, _ in examples[160:180]))
    monkeypatch.chdir(tmp_path)
    return tmp_path


def fine_tune(cp: Path | None = None, test: bool = False, switch_training: bool = False, **settings):
    """A tiny classify run on the working directory's files (TINY_RUN and `settings`)."""
    values = TINY_RUN | {"train-file": "train.csv", "validation-file": "dev.jsonl", "test-file": "test.tsv"} | {
        key.replace("_", "-"): value for key, value in settings.items()}
    Path("config.ini").write_text("".join(f"{key} = {value}\n" for key, value in values.items()))
    return main.run(main.load_config(None, []), cp, test, switch_training=switch_training)


# ------------------------------------------------------------------------------ the file keys

@pytest.mark.parametrize("settings, expected", [
    ({"task_type": "sst2", "train_file": "a.csv", "validation_file": "b.csv"},
     "train-file goes with task-type = classify or classify_pair, not sst2 (a GLUE task reads glue-dir's layout)"),
    ({"task_type": "classify", "train_file": "a.csv"},
     "train-file and validation-file go together: a run trains on one and scores on the other"),
    ({"task_type": "classify", "test_file": "t.csv"}, "test-file goes with train-file"),
    ({"task_type": "classify", "text_column": "review"}, "text-column goes with train-file"),
    ({"task_type": "classify", "label_column": "mood"}, "label-column goes with train-file"),
    ({"task_type": "classify", "num_labels": 1},
     "num-labels = 1 (one score a text: regression) reads its numbers from your own files: set train-file and "
     "validation-file"),
    ({"task_type": "classify_pair", "num_labels": 1, "labels": "low,high", "train_file": "a.csv",
      "validation_file": "b.csv"},
     "labels = low,high names classes, but num-labels = 1 is one score a text (regression)"),
    ({"task_type": "classify", "multi_label": True}, "multi-label goes with train-file"),
    ({"task_type": "classify", "multi_label": True, "num_labels": 1, "train_file": "a.csv", "validation_file": "b.csv"},
     "multi-label = true is any number of classes an example, but num-labels = 1 is one score a text"),
])
def test_the_file_keys_go_with_classify_and_each_other(settings, expected):
    with pytest.raises(UserError) as error:
        Config(**settings)
    assert str(error.value) == f"config: {expected}"


# ------------------------------------------------------------------------------ a run on them

def test_a_run_names_its_classes_and_every_output_keeps_them(workdir, capsys, tmp_path):
    run_dir = fine_tune()
    saved = checkpoints.load(run_dir / "checkpoints" / "best.pt")
    assert saved["model_config"]["label_names"] == ("mixed", "negative", "positive")
    assert saved["model_config"]["num_labels"] == 3
    log = (run_dir / "logs" / "log.txt").read_text()
    assert "val examples 40" in log and any(f"true {mood})" in log for mood in MOODS)

    fine_tune(cp=run_dir / "checkpoints" / "best.pt", test=True)  # test.tsv has no labels
    predictions = (run_dir / "test_predictions_step4_test.tsv").read_text().splitlines()
    assert predictions[0] == "index\tprediction\tprobability" and len(predictions) == 21
    assert {line.split("\t")[1] for line in predictions[1:]} <= set(MOODS)
    assert all(1 / 3 <= float(line.split("\t")[2]) <= 1 for line in predictions[1:])  # the largest of 3
    assert [line.split("\t")[0] for line in predictions[1:]] == [str(row) for row in range(20)]

    write_csv(workdir / "test.csv", [(text, label) for text, label in json_rows(workdir / "dev.jsonl")])
    metrics = fine_tune(cp=run_dir / "checkpoints" / "best.pt", test=True, test_file="test.csv")
    validation = [line for line in log.splitlines() if line.startswith("step 4 | val")][0]
    assert f"val accuracy {metrics['test_accuracy']:.4f}" in validation  # the same examples, the same score
    assert f"val f1_macro {metrics['test_f1_macro']:.4f}" in validation and 0 <= metrics["test_f1_macro"] <= 1
    lines = (run_dir / "test_predictions_step4_test.tsv").read_text().splitlines()[1:]  # beside the scores
    truth = [label for _, label in json_rows(workdir / "dev.jsonl")]
    assert np.mean([line.split("\t")[1] == label for line, label in zip(lines, truth, strict=True)]) == \
        pytest.approx(metrics["test_accuracy"])

    best = str(run_dir / "checkpoints" / "best.pt")
    Path("config.ini").write_text(Path("config.ini").read_text().replace("test-file = test.csv\n", ""))
    line = one_error_line(capsys, lambda: main.main(["--cp", best, "--test"]))
    assert line == ("error: --test needs test-file: task-type = classify reads its examples from train-file, "
                    "validation-file and test-file")

    classify.main(["--cp", str(run_dir / "checkpoints" / "best.pt"), "a gorgeous film"])
    label, _, text = capsys.readouterr().out.rstrip("\n").split("\t")
    assert label in MOODS and text == "a gorgeous film"
    export_hf.main(["--cp", str(run_dir / "checkpoints" / "best.pt"), "-o", str(tmp_path / "hf")])
    exported = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert exported["id2label"] == {"0": "mixed", "1": "negative", "2": "positive"}
    import_hf.main(["-i", str(tmp_path / "hf"), "-o", str(tmp_path / "back.pt")])
    assert checkpoints.load(tmp_path / "back.pt")["model_config"]["label_names"] == ("mixed", "negative", "positive")


def json_rows(path: Path) -> list[tuple[str, str]]:
    return [(row["text"], row["label"]) for row in map(json.loads, path.read_text().splitlines())]


def test_a_new_run_reads_its_files_against_a_checkpoints_names(workdir, examples):
    """A training file without `mixed` is covered by the checkpoint's classes: the head goes on, the
    labels read by name in the checkpoint's order. One with a class the checkpoint lacks gets a new head."""
    first = fine_tune(run_id="first")
    write_csv(workdir / "two.csv", [row for row in examples[:160] if row[1] != "mixed"])
    write_jsonl(workdir / "two.jsonl", [row for row in examples[160:] if row[1] != "mixed"][:32])
    second = fine_tune(cp=first / "checkpoints" / "best.pt", switch_training=True, run_id="second",
                       train_file="two.csv", validation_file="two.jsonl", max_iters=2, lr_decay_iters=2,
                       val_interval=2)
    log = (second / "logs" / "log.txt").read_text()
    assert "newly initialised: nothing" in log
    assert checkpoints.load(second / "checkpoints" / "best.pt")["model_config"]["label_names"] == (
        "mixed", "negative", "positive")
    # the export scores its graphs as the run scored: by the checkpoint's names, not two.csv's own order
    export_hf.main(["--cp", str(second / "checkpoints" / "best.pt"), "-o", str(workdir / "hf"), "--quantize", "int8"])
    report = json.loads((workdir / "hf" / "onnx" / "quantization.json").read_text())["float32"]["metrics"]
    validation = [line for line in log.splitlines() if line.startswith("step 2 | val")][0]
    loss, accuracy = (float(validation.split(f"val {name} ")[1].split(" ")[0]) for name in ("loss", "accuracy"))
    assert report["examples"] == 32 and report["accuracy"] == pytest.approx(accuracy, abs=1.5 / 32)
    assert report["loss"] == pytest.approx(loss, abs=2e-3)  # the labels' ids as the run had them

    write_csv(workdir / "four.csv", examples[:159] + [("a so-so film", "so-so")])
    third = fine_tune(cp=first / "checkpoints" / "best.pt", switch_training=True, run_id="third", train_file="four.csv",
                      max_iters=2, lr_decay_iters=2, val_interval=2)
    log = (third / "logs" / "log.txt").read_text()
    assert ("a new head: the checkpoint's labels (mixed, negative, positive) are not this run's "
            "(mixed, negative, positive, so-so)") in log


def test_numbered_labels_read_as_the_sst2_layout_reads_them(workdir, rotten_tomatoes):
    rows = [(" ".join(text.split()), label) for text, label in rotten_tomatoes[::20]]
    write_csv(workdir / "numbers.csv", rows)
    pq.write_table(pa.table({"sentence": [text for text, _ in rows], "label": [label for _, label in rows]}),
                   workdir / "train-00000-of-00001.parquet")
    from_file = labelled_files.labelled_examples(read_rows(workdir / "numbers.csv"), ("0", "1"), "the training file's")
    from_layout = glue_data.read_split(workdir, "sst2", "train")
    assert from_file.first == from_layout.first and np.array_equal(from_file.labels, from_layout.labels)


def test_labels_and_num_labels_must_agree_with_the_data(workdir, capsys):
    line = one_error_line(capsys, lambda: main.main(["--config", str(write_config(num_labels=2)),
                                                      "--run-id", "refused"]))
    assert line == "error: num-labels = 2, but the training file's labels are 3: mixed, negative, positive"
    line = one_error_line(capsys, lambda: main.main(["--config", str(write_config(labels="negative,positive")),
                                                      "--run-id", "refused"]))
    assert line == ("error: train.csv: row 1, column label: label 'mixed' is not one of the config's labels "
                    "(negative, positive)")
    assert not (workdir / "runs" / "refused").exists()


def write_config(**settings) -> Path:
    values = TINY_RUN | {"train-file": "train.csv", "validation-file": "dev.jsonl"} | {
        key.replace("_", "-"): value for key, value in settings.items()}
    path = Path("own.ini")
    path.write_text("".join(f"{key} = {value}\n" for key, value in values.items()))
    return path


def test_given_names_order_the_classes_in_any_layout(workdir, rotten_tomatoes, capsys):
    """`labels` names classify's classes in the ids' order: a file's names are read against them, and
    the SST-2 layout's numbers are their ids."""
    run_dir = fine_tune(labels="positive,negative,mixed")
    assert checkpoints.load(run_dir / "checkpoints" / "best.pt")["model_config"]["label_names"] == (
        "positive", "negative", "mixed")
    rows = rotten_tomatoes[:80] + rotten_tomatoes[-80:]
    (workdir / "datasets").mkdir()
    for split in ("train", "validation"):
        pq.write_table(pa.table({"sentence": [text for text, _ in rows], "label": [label for _, label in rows]}),
                       workdir / "datasets" / f"{split}-00000-of-00001.parquet")
    values = TINY_RUN | {"labels": "bad,good", "run-id": "layout"}
    Path("config.ini").write_text("".join(f"{key} = {value}\n" for key, value in values.items()))
    run_dir = main.run(main.load_config(None, []), None, False)
    assert checkpoints.load(run_dir / "checkpoints" / "best.pt")["model_config"]["label_names"] == ("bad", "good")
    capsys.readouterr()
    classify.main(["--cp", str(run_dir / "checkpoints" / "best.pt"), "a gorgeous film"])
    assert capsys.readouterr().out.split("\t")[0] in ("bad", "good")


# ------------------------------------------------------------------------------ pairs of texts


def test_a_pair_column_goes_with_classify_pair():
    with pytest.raises(UserError) as error:
        Config(task_type="classify", train_file="a.csv", validation_file="b.csv", text_pair_column="passage")
    assert str(error.value) == "config: text-pair-column goes with task-type = classify_pair, not classify"


def test_classify_pair_trains_on_pairs_and_classify_py_labels_pairs(workdir, examples, capsys, tmp_path):
    def pairs(rows):  # even rows: a sentence and its own start; odd ones: another sentence's start
        return [(text, " ".join((text if i % 2 == 0 else rows[(i + 7) % len(rows)][0]).split()[:5]),
                 "same" if i % 2 == 0 else "different") for i, (text, _) in enumerate(rows)]
    write_csv(workdir / "pairs.csv", pairs(examples[:160]), header=("sentence1", "sentence2", "label"))
    write_jsonl(workdir / "pairs.jsonl", pairs(examples[160:]), keys=("text", "text_pair", "label"))
    run_dir = fine_tune(task_type="classify_pair", train_file="pairs.csv", validation_file="pairs.jsonl",
                        test_file="pairs.jsonl")
    best = run_dir / "checkpoints" / "best.pt"
    assert checkpoints.load(best)["model_config"]["label_names"] == ("different", "same")
    assert "val examples 40" in (run_dir / "logs" / "log.txt").read_text()
    metrics = fine_tune(cp=best, test=True, task_type="classify_pair", train_file="pairs.csv",
                        validation_file="pairs.jsonl", test_file="pairs.jsonl")
    assert metrics["test_examples"] == 40
    capsys.readouterr()
    classify.main(["--cp", str(best), "a fine film ||| a fine film", "a fine film ||| a storm at sea"])
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 and all(line.split("\t")[0] in ("different", "same") for line in lines)
    line = one_error_line(capsys, lambda: classify.main(["--cp", str(best), "a fine film"]))
    assert "a classify_pair checkpoint labels sentence pairs" in line
    export_hf.main(["--cp", str(best), "-o", str(tmp_path / "hf")])
    import_hf.main(["-i", str(tmp_path / "hf"), "-o", str(tmp_path / "back.pt")])
    back = checkpoints.load(tmp_path / "back.pt")
    assert back["task"] == "classify_pair" and back["model_config"]["label_names"] == ("different", "same")


def test_a_teacher_of_named_classes_teaches_them_in_its_order(workdir, capsys):
    """A student learns the teacher's logit i as its class i: their names must agree, order too."""
    teacher = fine_tune(run_id="teacher") / "checkpoints" / "best.pt"
    student = fine_tune(run_id="student", teacher=str(teacher), max_iters=2, lr_decay_iters=2, val_interval=2)
    assert checkpoints.load(student / "checkpoints" / "best.pt")["model_config"]["label_names"] == (
        "mixed", "negative", "positive")
    config = write_config(teacher=str(teacher), labels="positive,negative,mixed", run_id="refused")
    line = one_error_line(capsys, lambda: main.main(["--config", str(config)]))
    assert line == (f"error: teacher = {teacher}: its classes are mixed, negative, positive; this run's are "
                    f"positive, negative, mixed (the same, in the same order)")
    assert not (workdir / "runs" / "refused").exists()


# ------------------------------------------------------------------------------ one score a text: num-labels = 1

def scored(rows) -> list[tuple[str, float]]:
    """Each sentence with a score: its mood's (1, 2.5, 4) plus a quarter a word past eight, up to 5."""
    base = {"negative": 1.0, "mixed": 2.5, "positive": 4.0}
    return [(text, min(5.0, base[mood] + 0.25 * max(0, len(text.split()) - 8))) for text, mood in rows]


def test_num_labels_1_learns_a_score_and_every_output_keeps_it_one(workdir, examples, capsys, tmp_path):
    rows = scored(examples)
    write_csv(workdir / "scores.csv", rows[:160])
    write_jsonl(workdir / "scores.jsonl", rows[160:])  # JSON numbers, where the CSV's are text
    files = {"num_labels": 1, "train_file": "scores.csv", "validation_file": "scores.jsonl"}
    run_dir = fine_tune(**files)
    best = run_dir / "checkpoints" / "best.pt"
    saved = checkpoints.load(best)
    assert saved["model_config"]["num_labels"] == 1 and saved["model_config"]["label_names"] == ()
    log = (run_dir / "logs" / "log.txt").read_text()
    validation = [line for line in log.splitlines() if line.startswith("step 4 | val")][0]
    assert all(f"val {name} " in validation for name in ("loss", "pearson", "spearman", "score"))
    assert "accuracy" not in validation and "f1_macro" not in validation
    assert re.search(r"\n  -?\d+\.\d\d \(true \d\.\d\d\): ", log)  # the predictions shown are scores

    fine_tune(cp=best, test=True, **files)  # test.tsv has no labels: each text's predicted score
    predictions = (run_dir / "test_predictions_step4_test.tsv").read_text().splitlines()
    assert predictions[0] == "index\tprediction" and len(predictions) == 21
    assert all(np.isfinite(float(line.split("\t")[1])) for line in predictions[1:])
    metrics = fine_tune(cp=best, test=True, **files, test_file="scores.jsonl")
    assert metrics["test_examples"] == 40  # the validation file again: its scores, to the digits logged
    assert all(f"val {name} {metrics['test_' + name]:.4f}" in validation for name in ("loss", "pearson", "score"))

    capsys.readouterr()
    classify.main(["--cp", str(best), "a gorgeous film"])
    score, text = capsys.readouterr().out.rstrip("\n").split("\t")
    assert np.isfinite(float(score)) and text == "a gorgeous film"
    export_hf.main(["--cp", str(best), "-o", str(tmp_path / "hf")])
    exported = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert exported["problem_type"] == "regression" and exported["id2label"] == {"0": "score"}
    import_hf.main(["-i", str(tmp_path / "hf"), "-o", str(tmp_path / "back.pt")])
    back = checkpoints.load(tmp_path / "back.pt")
    assert back["task"] == "classify" and back["model_config"]["num_labels"] == 1
    assert back["model_config"]["label_names"] == ()


def test_a_score_teacher_teaches_on_unlabelled_text(workdir, examples):
    """transfer-data's sentences have no score: they are left out of the student's own loss (NaN, not -1)."""
    rows = scored(examples)
    write_csv(workdir / "scores.csv", rows[:160])
    write_jsonl(workdir / "scores.jsonl", rows[160:])
    (workdir / "more.txt").write_text("".join(text + "\n" for text, _ in examples[::3]))
    files = {"num_labels": 1, "train_file": "scores.csv", "validation_file": "scores.jsonl"}
    teacher = fine_tune(run_id="teacher", **files) / "checkpoints" / "best.pt"
    student = fine_tune(run_id="student", teacher=str(teacher), transfer_data="more.txt", **files)
    log = (student / "logs" / "log.txt").read_text()
    losses = [float(line.split("| loss ")[1].split(" ")[0]) for line in log.splitlines() if "| loss " in line]
    assert len(losses) == 4 and all(np.isfinite(losses))


def test_a_score_that_is_not_a_number_is_one_line(workdir, capsys):
    write_csv(workdir / "scores.csv", [("a fine film", "4.5"), ("a dull one", "poor"), ("a third", "1")])
    write_csv(workdir / "dev.csv", [("a fine film", "4.5")])
    config = write_config(num_labels=1, train_file="scores.csv", validation_file="dev.csv", run_id="refused")
    line = one_error_line(capsys, lambda: main.main(["--config", str(config)]))
    assert line == ("error: scores.csv: row 2, column label: expected a number (num-labels = 1: a score to "
                    "predict), found 'poor'")
    assert not (workdir / "runs" / "refused").exists()


# ------------------------------------------------------------------------------ best-metric

def test_best_metric_picks_best_pt_by_the_metric_it_names(workdir, capsys, tmp_path):
    from test_trainer import scalars
    for metric, pick in (("f1_macro", max), ("loss", min)):
        run_dir = fine_tune(run_id=metric, best_metric=metric, max_iters=8, lr_decay_iters=8, val_interval=2)
        values = dict(scalars(run_dir)[f"val/{metric}"])
        best = checkpoints.load(run_dir / "checkpoints" / "best.pt")
        assert len(values) == 4 and best["best"] == pytest.approx(pick(values.values()), rel=1e-6)
        assert best["step"] == min(step for step, value in values.items() if value == pick(values.values()))
    export_hf.main(["--cp", str(run_dir / "checkpoints" / "best.pt"), "-o", str(tmp_path / "hf")])
    assert f"Best validation loss on classify: {best['best']:.4f}." in (tmp_path / "hf" / "README.md").read_text()

    line = one_error_line(capsys, lambda: main.main(["--config", str(write_config(best_metric="f1_micro")),
                                                      "--cp", str(run_dir / "checkpoints" / "checkpoint.pt")]))
    assert line.endswith("the run has best-metric = loss, the config f1_micro; a resumed run keeps it (to start a "
                         "new run from these weights, add --switch-training)")


def test_a_best_metric_the_task_does_not_validate_is_one_line_before_the_first_step(workdir, capsys):
    config = write_config(best_metric="pearson", run_id="refused")
    line = one_error_line(capsys, lambda: main.main(["--config", str(config)]))
    assert line == ("error: best-metric = pearson: task-type = classify validates loss, accuracy, f1_macro, "
                    "not pearson")
    assert not (workdir / "runs" / "refused").exists()
    with pytest.raises(UserError, match="best-metric = 'F1 macro': expected a validation metric's name"):
        Config(best_metric="F1 macro")


# ------------------------------------------------------------------------------ multi-label

def write_tagged(workdir: Path, rows) -> dict:
    """train.csv with the tags between commas, dev.jsonl with lists: the run's file keys."""
    write_csv(workdir / "tags.csv", [(text, ",".join(tags)) for text, tags in rows[:160]])
    write_jsonl(workdir / "tags.jsonl", rows[160:])
    return {"multi_label": "true", "train_file": "tags.csv", "validation_file": "tags.jsonl"}


def test_multi_label_learns_any_number_of_classes_and_every_output_keeps_them(workdir, examples, capsys, tmp_path):
    files = write_tagged(workdir, tagged(examples))
    run_dir = fine_tune(**files)
    best = run_dir / "checkpoints" / "best.pt"
    saved = checkpoints.load(best)
    assert saved["model_config"]["multi_label"] and saved["model_config"]["label_names"] == (
        "long", "negative", "positive")
    log = (run_dir / "logs" / "log.txt").read_text()
    validation = [line for line in log.splitlines() if line.startswith("step 4 | val")][0]
    assert all(f"val {name} " in validation for name in ("loss", "f1_micro", "f1_macro", "subset_accuracy",
                                                         "hamming_loss"))
    assert re.search(r"\(true (none|[a-z, ]+)\): ", log) and "f1_micro" in log.split("step 4 | val")[0]

    fine_tune(cp=best, test=True, **files)  # test.tsv has no labels: each text's classes by name
    predictions = (run_dir / "test_predictions_step4_test.tsv").read_text().splitlines()
    assert predictions[0] == "index\tprediction\tprobability" and len(predictions) == 21
    for line in predictions[1:]:  # the classes above 0.5 and their sigmoids, or neither
        names, chances = (list(filter(None, field.split(","))) for field in line.split("\t")[1:])
        assert set(names) <= {"long", "negative", "positive"} and len(names) == len(chances)
        assert all(0.5 <= float(chance) <= 1 for chance in chances)
    metrics = fine_tune(cp=best, test=True, **files, test_file="tags.jsonl")
    assert all(f"val {name} {metrics['test_' + name]:.4f}" in validation for name in ("loss", "f1_micro", "f1_macro"))

    capsys.readouterr()
    classify.main(["--cp", str(best), "a gorgeous film"])
    names, chances, text = capsys.readouterr().out.rstrip("\n").split("\t")
    assert text == "a gorgeous film" and (names, chances) == ("-", "-") or set(names.split(",")) <= {
        "long", "negative", "positive"}
    export_hf.main(["--cp", str(best), "-o", str(tmp_path / "hf"), "--quantize", "int8"])
    exported = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert exported["problem_type"] == "multi_label_classification"
    report = json.loads((tmp_path / "hf" / "onnx" / "quantization.json").read_text())
    loss = float(validation.split("val loss ")[1].split(" ")[0])
    assert report["metric"] == "f1_micro" and report["float32"]["metrics"]["loss"] == pytest.approx(loss, abs=2e-3)
    from transformers import AutoModelForSequenceClassification
    theirs = AutoModelForSequenceClassification.from_pretrained(tmp_path / "hf", trust_remote_code=True).eval()
    ids = torch.tensor([[2, 40, 41, 42, 3]])
    labels = torch.tensor([[1.0, 0.0, 1.0]])
    model = checkpoints.restore_model(best, classify.CLASSIFIERS)[0]
    with torch.no_grad():  # transformers' loss for problem_type multi_label_classification is ours
        ours, _ = model(ids)
        assert float(theirs(ids, labels=labels).loss) == pytest.approx(
            float(model_module.sequence_loss(ours, labels, True)), abs=1e-5)
    graph, vocab, _ = onnx_model.restore_model(tmp_path / "hf", classify.CLASSIFIERS)  # serving: the graph's sigmoids
    sentences = [text for text, _ in examples[160:170]]
    expected, found = (classify.classify(each, vocab, sentences, None, 32) for each in (model, graph))
    assert np.allclose([chances for _, chances in found], [chances for _, chances in expected], atol=1e-4)
    import_hf.main(["-i", str(tmp_path / "hf"), "-o", str(tmp_path / "back.pt")])
    assert checkpoints.load(tmp_path / "back.pt")["model_config"]["multi_label"]


def test_a_model_is_scored_and_continued_as_the_kind_it_is(workdir, examples, capsys):
    """A multi-label model is not scored as a one-class-an-example one; a new multi-label run from a
    one-class model's weights gets a new head."""
    rows = tagged(examples)
    files = write_tagged(workdir, rows)
    tags = fine_tune(run_id="tags", **files) / "checkpoints" / "best.pt"
    write_csv(workdir / "one.csv", [(text, (tags or ["long"])[0]) for text, tags in rows])  # one class a row
    config = write_config(train_file="one.csv", validation_file="one.csv", test_file="one.csv")
    line = one_error_line(capsys, lambda: main.main(["--config", str(config), "--cp", str(tags), "--test"]))
    assert line.endswith("multi-label = True in the checkpoint but False from the config and vocabulary")
    moods = fine_tune(run_id="moods") / "checkpoints" / "best.pt"
    run_dir = fine_tune(cp=moods, run_id="from_moods", switch_training=True, **files)
    assert ("a new head: the checkpoint's picks one class an example (softmax), this run's any number of classes "
            "(multi-label)") in (run_dir / "logs" / "log.txt").read_text()


def test_a_multi_label_file_that_names_no_class_is_one_line(workdir, capsys):
    write_csv(workdir / "none.csv", [("a fine film", ""), ("a dull one", "")])
    config = write_config(multi_label="true", train_file="none.csv", run_id="refused")
    line = one_error_line(capsys, lambda: main.main(["--config", str(config)]))
    assert line == "error: none.csv: no row names a class in column label: nothing to learn"
    assert not (workdir / "runs" / "refused").exists()


# ------------------------------------------------------------------------------ a resume keeps its files

SHORT_RUN = {"max_iters": 2, "lr_decay_iters": 4, "val_interval": 2}  # resumed to step 4 below


def sha256_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def changed_line(checkpoint: Path, key: str, name: str, then: str, now: str) -> str:
    return (f"error: {checkpoint}: {key} {name} has changed since the run began (sha256 {then[:12]}... then, "
            f"{now[:12]}... now); a resumed run keeps its data (to start a new run from these weights on the new "
            f"data, add --switch-training)")


def test_a_checkpoint_records_the_sha256_of_its_training_and_validation_files(workdir):
    """test-file is not among them: neither training nor best.pt reads it."""
    saved = checkpoints.load(fine_tune(**SHORT_RUN) / "checkpoints" / "checkpoint.pt")
    assert saved["data"] == {"train-file": {"train.csv": sha256_of(workdir / "train.csv")},
                             "validation-file": {"dev.jsonl": sha256_of(workdir / "dev.jsonl")}}
    assert checkpoints.stage(saved)["data"] == "train-file train.csv, validation-file dev.jsonl"  # the lineage's


def test_a_resume_whose_validation_file_changed_is_one_line_and_writes_nothing(workdir, examples, capsys):
    """The rows cut from 40 to 20 under the same name: best.pt would be chosen across two validation sets."""
    run_dir = fine_tune(**SHORT_RUN)
    latest = run_dir / "checkpoints" / "checkpoint.pt"
    then, before = sha256_of(workdir / "dev.jsonl"), sorted(path.name for path in run_dir.rglob("*"))
    saved, log = latest.read_bytes(), (run_dir / "logs" / "log.txt").read_text()
    write_jsonl(workdir / "dev.jsonl", examples[160:180])
    line = one_error_line(capsys, lambda: main.main(["--cp", str(latest), "--max-iters", "4"]))
    assert line == changed_line(latest, "validation-file", "dev.jsonl", then, sha256_of(workdir / "dev.jsonl"))
    assert latest.read_bytes() == saved and (run_dir / "logs" / "log.txt").read_text() == log
    assert sorted(path.name for path in run_dir.rglob("*")) == before


def test_a_resume_whose_training_file_changed_is_one_line(workdir, examples, capsys):
    latest = fine_tune(**SHORT_RUN) / "checkpoints" / "checkpoint.pt"
    then = sha256_of(workdir / "train.csv")
    write_csv(workdir / "train.csv", examples[:150])
    line = one_error_line(capsys, lambda: main.main(["--cp", str(latest), "--max-iters", "4"]))
    assert line == changed_line(latest, "train-file", "train.csv", then, sha256_of(workdir / "train.csv"))


def test_a_resume_on_the_same_files_goes_on_even_where_the_test_file_changed(workdir, examples):
    """test-file is read by --test alone, which scores what it holds then: a corrected test set does not
    stop the training it takes no part in."""
    run_dir = fine_tune(**SHORT_RUN)
    latest = run_dir / "checkpoints" / "checkpoint.pt"
    (workdir / "test.tsv").write_text("text\n" + "".join(text + "\n" for text, _ in examples[:20]))
    assert fine_tune(cp=latest, **SHORT_RUN | {"max_iters": 4}) == run_dir
    assert checkpoints.load(latest)["step"] == 4
    assert f"resuming {latest} at step 2" in (run_dir / "logs" / "log.txt").read_text()


def test_changed_files_take_switch_training_to_a_new_run_and_test_still_scores(workdir, examples):
    """--switch-training starts a new run from the weights on the new data; --test scores a checkpoint on
    whatever the files hold now."""
    run_dir = fine_tune(**SHORT_RUN)
    latest = run_dir / "checkpoints" / "checkpoint.pt"
    write_jsonl(workdir / "dev.jsonl", examples[160:180])
    metrics = fine_tune(cp=latest, test=True, test_file="dev.jsonl")
    assert 0 <= metrics["test_accuracy"] <= 1
    second = fine_tune(cp=latest, switch_training=True, run_id="second", **SHORT_RUN)
    assert second != run_dir and "val examples 20" in (second / "logs" / "log.txt").read_text()
    saved = checkpoints.load(second / "checkpoints" / "checkpoint.pt")
    assert saved["step"] == 2 and saved["data"]["validation-file"] == {"dev.jsonl": sha256_of(workdir / "dev.jsonl")}


def test_a_checkpoint_without_the_record_resumes_as_before(workdir, examples):
    """An older version's checkpoint has data None: nothing to compare its files with."""
    run_dir = fine_tune(**SHORT_RUN)
    latest = run_dir / "checkpoints" / "checkpoint.pt"
    checkpoints.save(latest, checkpoints.load(latest) | {"data": None})
    write_jsonl(workdir / "dev.jsonl", examples[160:180])
    assert fine_tune(cp=latest, **SHORT_RUN | {"max_iters": 4}) == run_dir
    assert checkpoints.load(latest)["data"]["validation-file"] == {"dev.jsonl": sha256_of(workdir / "dev.jsonl")}


def test_a_resume_whose_transfer_data_changed_is_one_line(workdir, examples, capsys):
    """A student's transfer-data is its training data too (the teacher labels it)."""
    teacher = fine_tune(run_id="teacher", **SHORT_RUN) / "checkpoints" / "best.pt"
    (workdir / "more.txt").write_text("".join(text + "\n" for text, _ in examples[::3]))
    latest = fine_tune(run_id="student", teacher=str(teacher), transfer_data="more.txt", **SHORT_RUN) / \
        "checkpoints" / "checkpoint.pt"
    then = sha256_of(workdir / "more.txt")
    assert checkpoints.load(latest)["data"]["transfer-data"] == {"more.txt": then}
    (workdir / "more.txt").write_text("".join(text + "\n" for text, _ in examples[::4]))
    line = one_error_line(capsys, lambda: main.main(["--cp", str(latest), "--max-iters", "4"]))
    assert line == changed_line(latest, "transfer-data", "more.txt", then, sha256_of(workdir / "more.txt"))


@pytest.mark.parametrize("now, problem", [
    ({"transfer-data": {"a.txt": "1" * 64}}, "transfer-data b.txt is gone since the run began"),
    ({"transfer-data": {"a.txt": "1" * 64, "b.txt": "2" * 64, "c.txt": "3" * 64}},
     "transfer-data c.txt is new since the run began"),
])
def test_a_file_gone_or_new_under_a_key_is_one_line_too(now, problem):
    then = {"transfer-data": {"a.txt": "1" * 64, "b.txt": "2" * 64}}
    with pytest.raises(UserError) as error:
        run_start.check_same_files(Path("last.pt"), then, now)
    assert str(error.value) == (f"last.pt: {problem}; a resumed run keeps its data (to start a new run from these "
                                f"weights on the new data, add --switch-training)")
    run_start.check_same_files(Path("last.pt"), then, then)
    run_start.check_same_files(Path("last.pt"), "datasets/train_*.msgpack", None)  # pre-training's: its shards'


def test_a_files_sha256_is_read_in_chunks(tmp_path):
    path = tmp_path / "big.bin"
    path.write_bytes(bytes(range(256)) * 1000)
    assert task_module.file_sha256(path, chunk_bytes=1000) == sha256_of(path)
