"""Fine-tuning on GLUE tasks: SST-2 and CoLA files read, dynamic padding, fine-tuning from MLM, the
metrics and submission files, pair tasks (MRPC, STS-B, MNLI) end to end, epochs and warmup-ratio,
and the fill-mask and classify scripts."""
import math
import re
import shutil
from itertools import islice
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

import checkpoints
import classify
import fill_mask
from tasks import glue_data
from tasks import glue_metrics
from tasks import glue_tasks
from tasks import pair_encoding
import main
import make_demo
import prepare_mlm_dataset
from tasks.classification_task import ClassificationTask, Part, confusion_metrics
from config import CLASSIFICATION_TASKS, Config
from errors import UserError
from model import BertForSequenceClassification, ModelConfig
from vocab import load_vocab
from conftest import TEST_DEVICE, assert_resumes_exactly_mid_epoch, one_error_line

CONFIG = """\
seq-len = 64
batch-size = 32
d-model = 64
heads = 2
n-layer = 2
d-ff = 128
dropout = 0.1
device = {device}
dtype = float32
compile = false
log-interval = 10
val-iters = 1000
learning-rate = 1e-3
min-learning-rate = 1e-4
warmup-iters = 10
dataset-pattern = train_imdb_64_*.msgpack
val-dataset-pattern = val_imdb_64_*.msgpack
test-dataset-pattern = test_imdb_64_*.msgpack
"""


@pytest.fixture(scope="module")
def base_dir(tmp_path_factory, vocab_dir, imdb_corpus, rotten_tomatoes):
    """vocab/, MLM shards and SST-2 in both layouts, as make_demo lays them out."""
    base = tmp_path_factory.mktemp("base")
    shutil.copytree(vocab_dir, base / "vocab")
    prepare_mlm_dataset.main(["-i", str(imdb_corpus), "-l", "imdb", "-o", str(base / "datasets"),
                              "-m", "64", "-v", str(base / "vocab")])
    make_demo.write_sst2(base / "datasets", rotten_tomatoes, seed=123)
    (base / "config.ini").write_text(CONFIG.format(device=TEST_DEVICE) + "base-dir = .\n")
    return base


@pytest.fixture(scope="module")
def mlm_checkpoint(base_dir):
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(base_dir)
        run_dir = main.run(main.load_config(None, ["--max-iters", "30", "--val-interval", "30",
                                                   "--lr-decay-iters", "30"]), None, False)
    return run_dir / "checkpoints" / "best.pt"


@pytest.fixture(scope="module")
def sst2_run(base_dir, mlm_checkpoint):
    """Fine-tune the MLM checkpoint for 250 steps (5 epochs of 1,600 sentences)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(base_dir)
        config = main.load_config(None, ["--task-type", "sst2", "--max-iters", "250", "--lr-decay-iters", "250",
                                         "--val-interval", "50", "--learning-rate", "2e-3"])
        return main.run(config, mlm_checkpoint, False)


def test_parquet_and_tsv_hold_the_same_sentences(base_dir):
    datasets = base_dir / "datasets"
    for split in ("train", "val"):
        parquet = glue_data.read_split(datasets, "sst2", split)  # make_demo's parquet files, in datasets/ itself
        tsv = glue_data.read_split(datasets / "SST-2", "sst2", split)  # its GLUE TSV files
        assert parquet.files[0].suffix == ".parquet" and tsv.files[0].suffix == ".tsv"
        assert parquet.first == tsv.first and parquet.second is None and tsv.second is None
        assert np.array_equal(parquet.labels, tsv.labels)
        assert set(np.unique(parquet.labels)) == {0, 1}
    hidden = glue_data.read_split(datasets / "SST-2", "sst2", "test")
    assert hidden.labels_hidden and (hidden.labels == glue_data.HIDDEN_LABEL).all() and len(hidden) == 200
    assert hidden.index.tolist() == list(range(200))


def test_cola_layout_and_matthews(tmp_path):
    cola = tmp_path / "train.tsv"  # CoLA's headerless layout: source, label, original mark, sentence
    cola.write_text("gj04\t1\t\tthe sailors rode the breeze clear of the rocks .\n"
                    "gj04\t0\t*\tthe more we study verbs , the crazier they get get .\n")
    examples = glue_data.read_split(tmp_path, "cola", "train")
    assert examples.labels.tolist() == [1, 0] and examples.second is None
    assert examples.first[1].startswith("the more we study")
    # Binary Matthews: (tp*tn - fp*fn) / sqrt((tp+fp)(tp+fn)(tn+fp)(tn+fn)); rows are true labels.
    tn, fp, fn, tp = 50, 10, 5, 35
    expected = (tp * tn - fp * fn) / np.sqrt((tp + fp) * (tp + fn) * (tn + fp) * (tn + fn))
    metrics = confusion_metrics(np.array([[tn, fp], [fn, tp]]))
    assert metrics == pytest.approx({"matthews": expected, "accuracy": (tn + tp) / 100,
                                     "f1": 2 * tp / (2 * tp + fp + fn)})
    # the training metrics from sums agree with GLUE's metric on the predictions themselves
    labels, predictions = np.repeat([0, 0, 1, 1], [tn, fp, fn, tp]), np.repeat([0, 1, 0, 1], [tn, fp, fn, tp])
    assert glue_metrics.matthews_correlation(labels, predictions) == pytest.approx(expected)
    # plain floats: a numpy scalar in a checkpoint's "best" would fail the safe load
    assert type(metrics["matthews"]) is float
    assert type(glue_metrics.matthews_correlation(labels, predictions)) is float
    assert confusion_metrics(np.array([[60, 0], [40, 0]]))["matthews"] == 0.0  # a constant guess


def test_unknown_tsv_layout_is_a_clear_error(tmp_path):
    bad = tmp_path / "train.tsv"
    bad.write_text("text\tpolarity\nfine\t1\n")
    with pytest.raises(UserError) as error:
        glue_data.read_split(tmp_path, "sst2", "train")
    assert str(error.value) == f"{bad}: line 1: missing column sentence (header: text, polarity)"


@pytest.mark.parametrize("sentences, labels, message", [
    (["good", "bad"], ["positive", "great"],
     "row 2, column label: expected 0 to 1 or negative, positive, found 'great'"),
    (["good", "bad"], [1.0, 0.7], "row 2, column label: expected 0 to 1 or negative, positive, found 0.7"),
    (["good", None], [1, 0], "row 2, column sentence: expected text, found None"),
    (["good", "bad"], [1, None], "row 2, column label: expected 0 to 1 or negative, positive, found None"),
    (["good", "bad"], [1, 2], "row 2, column label: expected 0 to 1 or negative, positive, found 2"),
])
def test_bad_parquet_values_name_the_file_row_and_column(tmp_path, sentences, labels, message):
    path = tmp_path / "train-00000-of-00001.parquet"
    pq.write_table(pa.table({"sentence": sentences, "label": labels}), path)
    with pytest.raises(UserError) as error:
        glue_data.read_split(tmp_path, "sst2", "train")
    assert str(error.value) == f"{path}: {message}"


@pytest.mark.parametrize("task, name, content, message", [
    ("sst2", "train.tsv", "sentence\tlabel\ngood\t1\nbad\tneg\n",
     "line 3, column label: expected 0 to 1 or negative, positive, found 'neg'"),
    ("sst2", "train.tsv", "sentence\tlabel\ngood\t1\nbad\n",
     "line 3, column label: missing (the line has 1 tab-separated fields)"),
    ("sst2", "train.tsv", "index\tsentence\n0\tgood\n", "line 1: missing column label (header: index, sentence)"),
    ("sst2", "test.tsv", "index\tsentence\nx\tgood\n", "line 2, column index: expected an integer, found 'x'"),
    ("cola", "train.tsv", "gj04\t1\t\tfine .\ngj04\t0.5\t*\tbad .\n",
     "line 2, column label: expected 0 to 1 or unacceptable, acceptable, found '0.5'"),
])
def test_bad_tsv_values_name_the_file_line_and_column(tmp_path, task, name, content, message):
    path = tmp_path / name
    path.write_text(content)
    with pytest.raises(UserError) as error:
        glue_data.read_split(tmp_path, task, name.removesuffix(".tsv"))
    assert str(error.value) == f"{path}: {message}"


def test_labels_as_integers_of_any_type_or_as_names_are_read(tmp_path):
    path = tmp_path / "train-00000-of-00001.parquet"
    for labels in ([1.0, 0.0], ["1", "0"], ["positive", "negative"]):
        pq.write_table(pa.table({"sentence": ["good", "bad"], "label": labels}), path)
        assert glue_data.read_split(tmp_path, "sst2", "train").labels.tolist() == [1, 0]


@pytest.mark.parametrize("pairs", [False, True])
def test_dynamic_padding_gives_the_same_logits_as_padding_to_seq_len(base_dir, pairs):
    vocab = load_vocab(base_dir / "vocab")
    examples = glue_data.read_split(base_dir / "datasets", "sst2", "val")
    if pairs:  # sentence i with sentence i + 1: segment ids matter too
        examples.second = examples.first[1:] + examples.first[:1]
    part = Part("validation", examples, pair_encoding.encode_examples(vocab, examples.first, examples.second, 128))
    torch.manual_seed(0)
    model = BertForSequenceClassification(ModelConfig(vocab_size=vocab.size, max_len=128, d_model=64, heads=2,
                                                      n_layer=2, d_ff=128, pad_id=vocab.pad_id)).eval()
    rows = np.arange(16)
    batch = part.batch(rows, vocab.pad_id, 128, 8)
    assert batch["input_ids"].shape[1] < 128 and batch["input_ids"].shape[1] % 8 == 0
    assert (batch["segment_ids"] is not None) == pairs and (batch["labels"] == examples.labels[rows]).all()
    full_ids, full_segments, full_real = part.encoded.padded(rows, 128, vocab.pad_id)
    tensor = lambda array: None if array is None else torch.from_numpy(array)  # noqa: E731
    short_logits, _ = model(tensor(batch["input_ids"]), attention_mask=tensor(batch["attention_mask"]),
                            segment_ids=tensor(batch["segment_ids"]))
    full_logits, _ = model(tensor(full_ids), attention_mask=tensor(full_real),
                           segment_ids=tensor(full_segments) if pairs else None)
    torch.testing.assert_close(short_logits, full_logits, rtol=1e-4, atol=1e-5)


def test_length_grouping_narrows_training_batches_and_can_be_turned_off(base_dir):
    vocab = load_vocab(base_dir / "vocab")

    def mean_width(length_grouping: bool) -> float:
        config = Config(task_type="sst2", base_dir=str(base_dir), length_grouping=length_grouping)
        task = ClassificationTask(config, vocab, torch.device(TEST_DEVICE))
        return np.mean([batch["input_ids"].shape[1] for _, batch in islice(task.train_batches(None), 50)])

    assert mean_width(True) < 0.7 * mean_width(False)


def validations(run_dir: Path) -> list[dict[str, float]]:
    """Each validation's metrics as log.txt has them, with its step."""
    found = []
    for line in (run_dir / "logs" / "log.txt").read_text().splitlines():
        if " | val " in line:
            step, *fields = line.split(" | ")
            found.append({"step": int(step.removeprefix("step "))} | {
                name: float(value) for name, value in (field.removeprefix("val ").split(" ") for field in fields)})
    return found


def shown_predictions(run_dir: Path, names: str) -> list[str]:
    """The lines show_predictions logged: `name (probability, true name): text`, names a regex."""
    pattern = re.compile(rf"  ({names}) \((0\.\d\d|1\.00), true ({names})\): \S")
    return [line for line in (run_dir / "logs" / "log.txt").read_text().splitlines() if pattern.match(line)]


def test_fine_tuning_from_mlm_learns_far_above_chance(sst2_run):
    log = (sst2_run / "logs" / "log.txt").read_text()
    assert "loaded the encoder of" in log and "not used: head.*" in log
    assert "newly initialised: pooler.weight, pooler.bias, classifier.weight, classifier.bias" in log
    scores = validations(sst2_run)
    assert [metrics["step"] for metrics in scores] == [50, 100, 150, 200, 250]
    assert all(metrics["examples"] == 200 for metrics in scores)  # the whole dev split, every time
    # 200 balanced validation sentences: chance is 0.5 with a standard error of 0.035.
    assert max(metrics["accuracy"] for metrics in scores) > 0.6
    assert len(shown_predictions(sst2_run, "negative|positive")) == 4 * len(scores)
    assert (sst2_run / "checkpoints" / "best.pt").is_file()


def test_checkpoint_of_another_architecture_is_refused(base_dir, mlm_checkpoint, monkeypatch):
    monkeypatch.chdir(base_dir)
    config = main.load_config(None, ["--task-type", "sst2", "--d-model", "128"])
    with pytest.raises(UserError, match="d-model = 64 in the checkpoint but 128"):
        main.run(config, mlm_checkpoint, False)


def test_test_split_is_scored_and_hidden_labels_give_a_submission_file(base_dir, sst2_run, monkeypatch, capsys):
    monkeypatch.chdir(base_dir)
    best = sst2_run / "checkpoints" / "best.pt"
    metrics = main.run(main.load_config(None, ["--task-type", "sst2"]), best, True)
    assert 0.55 < metrics["test_accuracy"] <= 1 and metrics["test_examples"] == 200

    # The GLUE layout hides test labels: predictions are written instead of a score.
    glue_base = base_dir / "glue"
    (glue_base / "datasets").mkdir(parents=True)
    shutil.copytree(base_dir / "datasets" / "SST-2", glue_base / "datasets" / "SST-2")
    shutil.copytree(base_dir / "vocab", glue_base / "vocab")
    result = main.run(main.load_config(None, ["--task-type", "sst2", "--base-dir", "glue"]), best, True)
    step = checkpoints.load(best)["step"]
    assert result == {"predictions": [str(sst2_run / f"test_predictions_step{step}_SST-2.tsv")]}
    lines = Path(result["predictions"][0]).read_text().splitlines()
    assert lines[0] == "index\tprediction" and len(lines) == 201
    assert [line.split("\t")[0] for line in lines[1:]] == [str(index) for index in range(200)]
    assert {line.split("\t")[1] for line in lines[1:]} <= {"0", "1"}  # SST-2's server takes numbers


@pytest.mark.parametrize("task", ["cola", "classify"])
def test_a_model_is_scored_only_as_the_task_it_was_trained_for(base_dir, sst2_run, monkeypatch, task):
    """An sst2 head of two classes would load as cola's or classify's and score something meaningless."""
    monkeypatch.chdir(base_dir)
    best = sst2_run / "checkpoints" / "best.pt"
    with pytest.raises(UserError, match=f"a task-type = sst2 model; scored as {task}.*set task-type = sst2"):
        main.run(main.load_config(None, ["--task-type", task]), best, True)


def test_fill_mask_and_classify_scripts(mlm_checkpoint, sst2_run, capsys, tmp_path):
    fill_mask.main(["--cp", str(mlm_checkpoint), "the movie was [MASK] .", "-k", "3"])
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "the movie was [MASK] ." and out[1].startswith("  [MASK] 1: ")
    probabilities = [float(word) for word in out[1].split()[3::2]]
    assert len(probabilities) == 3 and probabilities == sorted(probabilities, reverse=True)

    sentences = tmp_path / "sentences.txt"
    texts = ["a gorgeous , witty , seductive movie .", "the plot is nothing but boilerplate clichés ."]
    sentences.write_text(f"{texts[0]}\n\n{texts[1]}\n")
    best = str(sst2_run / "checkpoints" / "best.pt")
    classify.main(["--cp", best, "-i", str(sentences)])
    rows = [line.split("\t") for line in capsys.readouterr().out.splitlines()]
    assert [row[2] for row in rows] == texts
    assert all(row[0] in ("negative", "positive") and 0.5 <= float(row[1]) <= 1 for row in rows)

    for arguments, message in [
        (["--cp", str(mlm_checkpoint), "fine"],  # an MLM checkpoint has no classifier
         f"a mlm checkpoint; expected {' or '.join(CLASSIFICATION_TASKS)}"),
        (["--cp", best, "good ||| bad"], "a sst2 checkpoint labels single sentences, not `first ||| second` pairs"),
    ]:
        with pytest.raises(SystemExit) as exit_info:
            classify.main(arguments)
        assert exit_info.value.code == 2 and message in capsys.readouterr().err


def test_batch_width_rounds_to_8_but_never_past_seq_len(base_dir):
    vocab = load_vocab(base_dir / "vocab")
    examples = glue_data.read_split(base_dir / "datasets", "sst2", "val")
    examples.first[:3] = [" ".join(["wonderful"] * 40), "good", " ".join(["good"] * 7)]
    part = Part("validation", examples, pair_encoding.encode_examples(vocab, examples.first, None, 21))
    assert part.encoded.lengths[:3].tolist() == [21, 3, 9]  # cut to seq-len; [CLS] and [SEP] around one piece a word
    batch = part.batch(np.arange(4), vocab.pad_id, 21, 8)  # 21: not a multiple of 8
    assert batch["input_ids"].shape[1] == 21
    assert batch["attention_mask"][0].all()
    assert part.batch(np.array([1]), vocab.pad_id, 21, 8)["input_ids"].shape[1] == 8  # the longest, rounded up to 8
    assert part.batch(np.array([1, 2]), vocab.pad_id, 21, 8)["input_ids"].shape[1] == 16
    assert part.batch(np.array([1, 2]), vocab.pad_id, 21, 1)["input_ids"].shape[1] == 9  # the longest exactly


def test_compare_runs_groups_fine_tunings_by_their_start_and_tables_test_accuracy(base_dir, mlm_checkpoint, sst2_run,
                                                                                  monkeypatch, tmp_path):
    import compare_runs
    monkeypatch.chdir(base_dir)
    started_from = f"# started from {mlm_checkpoint.resolve()}"
    assert started_from in (sst2_run / "config.ini").read_text().splitlines()
    short = ["--task-type", "sst2", "--val-interval", "50"]  # validates at step 50, as sst2_run did first
    scratch = main.run(main.load_config(None, [*short, "--max-iters", "50", "--lr-decay-iters", "50"]), None, False)
    assert "started from" not in (scratch / "config.ini").read_text()
    # Resuming keeps the start, as the checkpoint remembers it.
    resumed = main.run(main.load_config(None, [*short, "--max-iters", "260", "--lr-decay-iters", "260"]),
                       sst2_run / "checkpoints" / "checkpoint.pt", False)
    assert resumed == sst2_run and started_from in (sst2_run / "config.ini").read_text().splitlines()

    scores = [main.run(main.load_config(None, ["--task-type", "sst2"]), run / "checkpoints" / "best.pt", True)
              for run in (sst2_run, scratch)]
    summary = compare_runs.main([str(sst2_run), str(scratch), "--group-by", "start", "-o", str(tmp_path / "out")])
    section = summary.split("## test/accuracy:", 1)[1].split("\n## ", 1)[0]
    rows = {cells[0]: cells[1:] for cells in ([cell.strip() for cell in line.strip("|").split("|")]
                                              for line in section.splitlines() if line.startswith("| "))}
    pretrained = checkpoints.load(mlm_checkpoint)["tokens"] / 1e6
    assert rows[f"start={mlm_checkpoint.resolve()}"][:3] == [f"{pretrained:.3g}", "1",
                                                            f"{scores[0]['test_accuracy']:.4f} ± –"]
    assert rows["start=none"][:3] == ["0", "1", f"{scores[1]['test_accuracy']:.4f} ± –"]


# ----------------------------------------------------------------------------- GLUE tasks end to end

# A model that trains a few dozen steps in seconds on two CPU cores; float32 and no compilation.
TINY_RUN = {"seq-len": 32, "batch-size": 16, "d-model": 32, "heads": 2, "n-layer": 2, "d-ff": 64, "dropout": 0.1,
            "device": TEST_DEVICE, "dtype": "float32", "compile": "false", "peak-tflops": 1, "log-interval": 1,
            "learning-rate": 2e-3, "min-learning-rate": 2e-4, "warmup-iters": 2}


@pytest.fixture
def glue_workdir(tmp_path, vocab_dir, monkeypatch, keep_signal_handlers) -> Path:
    """The current directory for one tiny fine-tuning run: vocab/, and datasets/ to write GLUE files in."""
    shutil.copytree(vocab_dir, tmp_path / "vocab")
    (tmp_path / "datasets").mkdir()
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.fixture(scope="module")
def sentences(rotten_tomatoes) -> list[str]:
    """The fixture's 2,000 real sentences, one line each."""
    return [" ".join(text.split()) for text, _ in rotten_tomatoes]


def fine_tune(task: str, **settings) -> Path:
    """Train from fresh weights in the current directory with TINY_RUN and `settings` on top; the run directory."""
    values = TINY_RUN | {"task-type": task} | {key.replace("_", "-"): value for key, value in settings.items()}
    Path("config.ini").write_text("".join(f"{key} = {value}\n" for key, value in values.items()))
    return main.run(main.load_config(None, []), None, False)


def similar_pairs(sentences: list[str], similar, different) -> tuple[list[str], list[str], list]:
    """Even i: sentence i with itself, labelled `similar`; odd i: with the first four words of
    another sentence, labelled `different`."""
    second = [text if i % 2 == 0 else " ".join(sentences[(i + 7) % len(sentences)].split()[:4])
              for i, text in enumerate(sentences)]
    return sentences, second, [similar if i % 2 == 0 else different for i in range(len(sentences))]


def write_parquet_pairs(folder: Path, split: str, columns: tuple[str, str], pairs: tuple[list, list, list]):
    """nyu-mll/glue's layout: folder/<split>-00000-of-00001.parquet with the task's text columns, label and idx."""
    first, second, labels = pairs
    folder.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({columns[0]: first, columns[1]: second, "label": labels, "idx": range(len(first))}),
                   folder / f"{split}-00000-of-00001.parquet")


def run_settings(run_dir: Path) -> dict[str, str]:
    """The settings the run wrote to its config.ini."""
    lines = (run_dir / "config.ini").read_text().splitlines()
    return dict(line.split(" = ", 1) for line in lines if " = " in line and not line.startswith("#"))


def test_mrpc_pairs_in_parquet_train_and_score_f1_accuracy_and_their_mean(glue_workdir, sentences, capsys):
    mrpc = glue_workdir / "datasets" / "mrpc"
    write_parquet_pairs(mrpc, "train", glue_tasks.TASKS["mrpc"].text_columns, similar_pairs(sentences[:160], 1, 0))
    dev = similar_pairs(sentences[-40:], 1, 0)
    write_parquet_pairs(mrpc, "validation", glue_tasks.TASKS["mrpc"].text_columns, dev)
    run_dir = fine_tune("mrpc", max_iters=8, lr_decay_iters=8, val_interval=4)
    scores = validations(run_dir)
    assert [metrics["step"] for metrics in scores] == [4, 8]
    for metrics in scores:
        assert set(metrics) == {"step", "loss", "f1", "accuracy", "score", "examples"}
        assert metrics["examples"] == 40  # the whole dev split: two batches of 16 and a short one of 8
        assert 0 <= metrics["f1"] <= 1 and 0 <= metrics["accuracy"] <= 1
        assert metrics["score"] == pytest.approx((metrics["f1"] + metrics["accuracy"]) / 2, abs=1e-4)
    best = checkpoints.load(run_dir / "checkpoints" / "best.pt")
    assert best["task"] == "mrpc" and best["best"] == pytest.approx(max(m["score"] for m in scores), abs=5e-5)
    assert len(shown_predictions(run_dir, "equivalent|not_equivalent")) == 4 * len(scores)

    # classify.py labels the dev pairs as validation did: its accuracy is best.pt's
    first, second, labels = dev
    pairs = glue_workdir / "pairs.txt"
    pairs.write_text("".join(f"{a} ||| {b}\n" for a, b in zip(first, second)), encoding="utf-8")
    capsys.readouterr()  # the run's log
    classify.main(["--cp", str(run_dir / "checkpoints" / "best.pt"), "-i", str(pairs)])
    rows = [line.split("\t") for line in capsys.readouterr().out.splitlines()]
    assert [text for _, _, text in rows] == [f"{a} ||| {b}" for a, b in zip(first, second)]
    assert all(label in ("not_equivalent", "equivalent") and 0.5 <= float(p) <= 1 for label, p, _ in rows)
    predicted = [("not_equivalent", "equivalent").index(label) for label, _, _ in rows]
    at_best = next(metrics for metrics in scores if metrics["step"] == best["step"])
    assert glue_metrics.accuracy(labels, predicted) == pytest.approx(at_best["accuracy"], abs=5e-5)
    with pytest.raises(SystemExit) as exit_info:
        classify.main(["--cp", str(run_dir / "checkpoints" / "best.pt"), sentences[0]])
    assert exit_info.value.code == 2 and "a mrpc checkpoint labels sentence pairs" in capsys.readouterr().err


def test_stsb_regression_learns_a_simple_signal(glue_workdir, sentences, capsys):
    """Scores 5 for a sentence paired with itself, 0 for one paired with four words of another:
    a tiny model from scratch learns to tell them apart (by how much of the input is the second
    sentence) in 100 steps; on 60 unseen pairs, Pearson's r reaches 0.88 to 0.96 across seeds."""
    stsb = glue_workdir / "datasets" / "stsb"
    write_parquet_pairs(stsb, "train", glue_tasks.TASKS["stsb"].text_columns, similar_pairs(sentences[:400], 5.0, 0.0))
    dev = similar_pairs(sentences[-60:], 5.0, 0.0)
    write_parquet_pairs(stsb, "validation", glue_tasks.TASKS["stsb"].text_columns, dev)
    run_dir = fine_tune("stsb", batch_size=32, learning_rate=3e-3, min_learning_rate=1e-3, warmup_iters=5,
                        max_iters=100, lr_decay_iters=100, val_interval=100)
    (metrics,) = validations(run_dir)
    assert set(metrics) == {"step", "loss", "pearson", "spearman", "score", "examples"} and metrics["examples"] == 60
    assert metrics["pearson"] > 0.7 and metrics["spearman"] > 0.5
    assert re.search(r"^  -?\d+\.\d\d \(true [05]\.00\): \S", (run_dir / "logs" / "log.txt").read_text(), re.M)

    # classify.py scores pairs as validation did: the same correlation with the labels
    first, second, labels = dev
    capsys.readouterr()  # the run's log
    classify.main(["--cp", str(run_dir / "checkpoints" / "best.pt"), *(f"{a} ||| {b}" for a, b in zip(first, second))])
    rows = [line.split("\t") for line in capsys.readouterr().out.splitlines()]
    assert [text for _, text in rows] == [f"{a} ||| {b}" for a, b in zip(first, second)]
    predicted = [float(score) for score, _ in rows]
    assert glue_metrics.pearson(labels, predicted) == pytest.approx(metrics["pearson"], abs=1e-3)


def test_an_stsb_validation_of_constant_predictions_is_undefined_not_a_score(glue_workdir, sentences, monkeypatch):
    """A collapsed regressor (every prediction equal) has no correlation: the log says so in words, as
    scipy's NaN does, TensorBoard gets no point, and best.pt holds no score (the latest stands in)."""
    stsb = glue_workdir / "datasets" / "stsb"
    columns = glue_tasks.TASKS["stsb"].text_columns
    write_parquet_pairs(stsb, "train", columns, similar_pairs(sentences[:64], 5.0, 0.0))
    write_parquet_pairs(stsb, "validation", columns, similar_pairs(sentences[-32:], 5.0, 0.0))
    monkeypatch.setattr(ClassificationTask, "predicted", lambda self, logits: torch.zeros(len(logits)))
    run_dir = fine_tune("stsb", max_iters=4, lr_decay_iters=4, val_interval=2)
    log = (run_dir / "logs" / "log.txt").read_text()
    undefined = "undefined (constant predictions or labels)"
    validation_lines = [line for line in log.splitlines() if " | val " in line]
    assert len(validation_lines) == 2 and all(f"val pearson {undefined} | val spearman {undefined} | val score "
                                              f"{undefined}" in line for line in validation_lines)
    assert "val pearson 0.0000" not in log  # the training line may read 0.0000: a real correlation
    best = checkpoints.load(run_dir / "checkpoints" / "best.pt")
    assert best["best"] is None and best["step"] == 4
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    events = EventAccumulator(str(run_dir / "logs"), size_guidance={"scalars": 0})
    events.Reload()
    assert "val/loss" in events.Tags()["scalars"] and "val/pearson" not in events.Tags()["scalars"]


def write_mnli_tsv(path: Path, pairs: tuple[list, list, list]):
    """The GLUE distribution's MNLI columns that count, labels as names."""
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = ["index\tgenre\tsentence1\tsentence2\tgold_label"] + [
        f"{i}\tfiction\t{first}\t{second}\t{label}" for i, (first, second, label) in enumerate(zip(*pairs))]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def test_mnli_in_tsv_validates_on_matched_and_mismatched(glue_workdir, sentences):
    """Both dev sets are scored whole at every validation. The matched one alone is 21 batches of 4,
    past val-iters' default of 20 batches, which must not cut the validation short."""
    mnli = glue_workdir / "datasets" / "MNLI"
    write_mnli_tsv(mnli / "train.tsv", similar_pairs(sentences[:48], "entailment", "contradiction"))
    write_mnli_tsv(mnli / "dev_matched.tsv", similar_pairs(sentences[-84:], "entailment", "neutral"))
    write_mnli_tsv(mnli / "dev_mismatched.tsv", similar_pairs(sentences[1000:1024], "entailment", "contradiction"))
    run_dir = fine_tune("mnli", batch_size=4, max_iters=4, lr_decay_iters=4, val_interval=4)
    (metrics,) = validations(run_dir)
    assert set(metrics) == {"step", "loss", "accuracy", "accuracy_mismatched", "examples"}
    assert metrics["examples"] == 84 + 24
    assert 0 <= metrics["accuracy"] <= 1 and 0 <= metrics["accuracy_mismatched"] <= 1
    # best.pt goes by the matched accuracy, MNLI's first dev set
    assert checkpoints.load(run_dir / "checkpoints" / "best.pt")["best"] == pytest.approx(metrics["accuracy"], abs=5e-5)
    assert shown_predictions(run_dir, "entailment|neutral|contradiction")


def test_epochs_set_max_iters_from_the_training_examples(glue_workdir, sentences):
    write_parquet_pairs(glue_workdir / "datasets" / "mrpc", "train", glue_tasks.TASKS["mrpc"].text_columns,
                        similar_pairs(sentences[:100], 1, 0))
    write_parquet_pairs(glue_workdir / "datasets" / "mrpc", "validation", glue_tasks.TASKS["mrpc"].text_columns,
                        similar_pairs(sentences[-16:], 1, 0))
    run_dir = fine_tune("mrpc", epochs=2, max_iters=1000, lr_decay_iters=1000, val_interval=1000)
    steps = math.ceil(2 * 100 / 16)  # 13: the last batch of an epoch may be short
    settings = run_settings(run_dir)
    assert settings["max-iters"] == settings["lr-decay-iters"] == str(steps)
    assert [metrics["step"] for metrics in validations(run_dir)] == [steps]  # the run stopped there
    assert checkpoints.load(run_dir / "checkpoints" / "checkpoint.pt")["step"] == steps


def test_warmup_ratio_sets_warmup_iters(glue_workdir, sentences):
    write_parquet_pairs(glue_workdir / "datasets" / "mrpc", "train", glue_tasks.TASKS["mrpc"].text_columns,
                        similar_pairs(sentences[:64], 1, 0))
    write_parquet_pairs(glue_workdir / "datasets" / "mrpc", "validation", glue_tasks.TASKS["mrpc"].text_columns,
                        similar_pairs(sentences[-16:], 1, 0))
    run_dir = fine_tune("mrpc", warmup_ratio=0.25, warmup_iters=1, max_iters=12, lr_decay_iters=12,
                        val_interval=12)
    assert run_settings(run_dir)["warmup-iters"] == "3"  # a quarter of 12 steps
    rates = {int(step): float(rate) for step, rate in re.findall(
        r"^step (\d+) \| loss \S+ \| lr (\S+) \|", (run_dir / "logs" / "log.txt").read_text(), re.M)}
    # a linear ramp over steps 0..2 (logged after each as steps 1..3), the full rate at step 3
    assert [rates[step] for step in (1, 2, 3, 4)] == pytest.approx([5e-4, 1e-3, 1.5e-3, 2e-3])


def test_classify_task_takes_num_labels_classes_named_by_number(glue_workdir, sentences, capsys):
    """`classify`: SST-2's layout with num-labels classes; its labels are shown and printed as numbers."""
    texts = sentences[:96]
    table = pa.table({"sentence": texts, "label": [i % 3 for i in range(len(texts))]})
    for split in ("train", "validation"):
        pq.write_table(table, glue_workdir / "datasets" / f"{split}-00000-of-00001.parquet")
    run_dir = fine_tune("classify", num_labels=3, max_iters=2, lr_decay_iters=2, val_interval=2)
    assert set(validations(run_dir)[0]) == {"step", "loss", "accuracy", "f1_macro", "examples"}
    assert len(shown_predictions(run_dir, "[012]")) == 4
    capsys.readouterr()  # the run's log
    classify.main(["--cp", str(run_dir / "checkpoints" / "best.pt"), texts[0]])
    label, probability, text = capsys.readouterr().out.rstrip("\n").split("\t")
    assert label in ("0", "1", "2") and 1 / 3 <= float(probability) <= 1 and text == texts[0]


def test_a_cola_run_whose_score_is_a_numpy_scalar_saves_checkpoints_that_load(base_dir, mlm_checkpoint, monkeypatch,
                                                                               rotten_tomatoes):
    """Whatever type a metric returns, best.pt and checkpoint.pt load safely, resume and --test."""
    cola = base_dir / "CoLA"
    cola.mkdir(exist_ok=True)
    both = rotten_tomatoes[:160] + rotten_tomatoes[-160:]  # both labels in each split; a labelled test split
    for name, rows in (("train.tsv", both[::2]), ("dev.tsv", both[1::2]), ("test.tsv", both[1::4])):
        (cola / name).write_text("".join(f"gj04\t{label}\t\t{text}\n" for text, label in rows))
    real = glue_metrics.matthews_from_confusion
    monkeypatch.setattr(glue_metrics, "matthews_from_confusion", lambda confusion: np.float64(real(confusion)) + 0.25)
    monkeypatch.chdir(base_dir)
    settings = ["--task-type", "cola", "--glue-dir", "CoLA", "--max-iters", "8", "--lr-decay-iters", "8",
                "--val-interval", "4", "--warmup-iters", "2"]
    run_dir = main.run(main.load_config(None, settings), mlm_checkpoint, False)
    best = checkpoints.load(run_dir / "checkpoints" / "best.pt")
    assert type(best["best"]) is float and best["best"] >= 0.25
    assert checkpoints.load(run_dir / "checkpoints" / "checkpoint.pt")["step"] == 8
    metrics = main.run(main.load_config(None, settings), run_dir / "checkpoints" / "best.pt", True)
    assert metrics["test_matthews"] >= 0.25


# ------------------------------------------------------------- a teacher, and sentences without labels

STUDENT = ["--d-model", "32", "--heads", "2", "--n-layer", "1", "--d-ff", "64"]  # narrower than the 64-wide teacher


def write_transfer_text(path: Path, reviews: list[str]) -> Path:
    path.write_text("\n".join(reviews) + "\n", encoding="utf-8")
    return path


def test_sentence_tasks_are_the_glue_tasks_of_one_text():
    from config import SENTENCE_TASKS
    assert set(SENTENCE_TASKS) == {name for name, task in glue_tasks.TASKS.items() if not task.is_pair} | {"classify"}


def test_a_teacher_adds_the_squared_error_of_its_logits_and_unlabelled_sentences_learn_from_it_alone(
        base_dir, sst2_run, monkeypatch, tmp_path):
    monkeypatch.chdir(base_dir)
    transfer = write_transfer_text(tmp_path / "reviews.txt", ["A fine film. It bored me!", "Too long?"])
    config = main.load_config(None, ["--task-type", "sst2", "--teacher", str(sst2_run / "checkpoints" / "best.pt"),
                                     "--transfer-data", str(transfer), *STUDENT])
    vocab = load_vocab(base_dir / "vocab")
    task = ClassificationTask(config, vocab, torch.device("cpu"))
    train = task.split("train")
    assert len(train) == 1600 + 3 and list(train.examples.first[-3:]) == ["A fine film.", "It bored me!", "Too long?"]
    assert list(train.examples.labels[-3:]) == [glue_data.HIDDEN_LABEL] * 3
    torch.manual_seed(0)
    model = task.build_model().eval()  # no dropout: the hand sum below sees the same logits
    rows = np.array([0, 1, 1601, 1602])  # two labelled sentences, two transfer sentences
    batch = {name: torch.as_tensor(value) if value is not None else None
             for name, value in train.batch(rows, vocab.pad_id, 64, 8).items()}
    loss, statistics = task.loss(model, batch)
    logits, _ = model(batch["input_ids"], attention_mask=batch["attention_mask"])
    taught, _ = task.teacher(batch["input_ids"], attention_mask=batch["attention_mask"])
    expected = (torch.nn.functional.cross_entropy(logits[:2], batch["labels"][:2])
                + torch.nn.functional.mse_loss(logits, taught))
    torch.testing.assert_close(loss, expected)
    assert statistics[0] == 2 and statistics[1:].sum() == 2  # the confusion matrix counts labelled rows only
    assert not any(parameter.requires_grad for parameter in task.teacher.parameters())


def test_a_narrow_student_learns_the_task_from_its_teacher(base_dir, sst2_run, imdb_reviews, monkeypatch, tmp_path):
    monkeypatch.chdir(base_dir)
    transfer = write_transfer_text(tmp_path / "reviews.txt", imdb_reviews[:300])
    config = main.load_config(None, ["--task-type", "sst2", "--teacher", str(sst2_run / "checkpoints" / "best.pt"),
                                     "--transfer-data", str(transfer), *STUDENT, "--max-iters", "200",
                                     "--lr-decay-iters", "200", "--val-interval", "100", "--learning-rate", "2e-3",
                                     "--run-id", "student"])
    run_dir = main.run(config, None, False)
    # 200 balanced validation sentences: chance is 0.5 with a standard error of 0.035.
    assert max(metrics["accuracy"] for metrics in validations(run_dir)) > 0.6
    saved = checkpoints.load(run_dir / "checkpoints" / "checkpoint.pt")
    assert saved["model_config"]["d_model"] == 32 and not any(name.startswith("teacher") for name in saved["model"])


def test_a_student_with_a_teacher_resumes_exactly(base_dir, sst2_run, imdb_reviews, monkeypatch, tmp_path):
    transfer = write_transfer_text(tmp_path / "reviews.txt", imdb_reviews[:100])

    def make_workdir(name: str) -> Path:
        workdir = tmp_path / name
        workdir.mkdir()
        student = {"d-model = 64": "d-model = 32", "d-ff = 128": "d-ff = 64", "n-layer = 2": "n-layer = 1",
                   "warmup-iters = 10": "warmup-iters = 2"}
        settings = CONFIG.format(device=TEST_DEVICE)
        for line, replacement in student.items():
            settings = settings.replace(line, replacement)
        (workdir / "config.ini").write_text(
            settings + f"base-dir = .\nvocab = {base_dir / 'vocab'}\ndatasets-dir = {base_dir / 'datasets'}\n"
            f"task-type = sst2\nteacher = {sst2_run / 'checkpoints' / 'best.pt'}\ntransfer-data = {transfer}\n"
            "val-interval = 100\nlr-decay-iters = 6\n")
        return workdir

    assert_resumes_exactly_mid_epoch(make_workdir, monkeypatch, 6)


@pytest.mark.parametrize("task, arguments, message", [
    ("sst2", ["--transfer-data", "reviews.txt"],
     "transfer-data = reviews.txt goes with a teacher and a task of single texts"),
    ("mrpc", ["--teacher", "t.pt", "--transfer-data", "reviews.txt"], "not task-type = mrpc"),
    ("ner", ["--teacher", "t.pt"], "teacher = t.pt goes with task-type = distill, embed or a classification task"),
    ("sst2", ["--teacher", "missing.pt"], "teacher = missing.pt: no such directory or checkpoint file"),
    ("sst2", ["--teacher", "MLM"], "not a classifier of this task's 2 classes"),
    ("sst2", ["--teacher", "SST2", "--transfer-data", "missing.txt"], "missing.txt"),
])
def test_a_wrong_teacher_or_transfer_data_is_one_line(base_dir, mlm_checkpoint, sst2_run, monkeypatch, capsys,
                                                     task, arguments, message):
    monkeypatch.chdir(base_dir)
    teachers = {"MLM": str(mlm_checkpoint), "SST2": str(sst2_run / "checkpoints" / "best.pt")}
    arguments = [teachers.get(argument, argument) for argument in arguments]
    line = one_error_line(capsys, lambda: main.main(["--task-type", task, *arguments, "--max-iters", "1"]))
    assert message in line, line
