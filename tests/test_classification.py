"""Sentence classification: readers, dynamic padding, fine-tuning from MLM, submission files, scripts."""
import shutil
from itertools import islice

import numpy as np
import pytest
import torch

import classify
import fill_mask
import main
import make_demo
import prepare_mlm_dataset
from classification_task import (ClassificationTask, EncodedSentences, find_split_file, matthews_correlation,
                                    read_sentences, read_tsv)
from config import Config
from errors import UserError
from model import BertForSequenceClassification, ModelConfig
from vocab import load_vocab
from conftest import TEST_DEVICE

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
    for split, tsv_name in [("train", "train.tsv"), ("val", "dev.tsv")]:
        parquet = read_sentences(find_split_file(datasets, split))
        tsv = read_sentences(datasets / "SST-2" / tsv_name)
        assert parquet.texts == tsv.texts
        assert np.array_equal(parquet.labels, tsv.labels)
        assert set(np.unique(parquet.labels)) == {0, 1}
    hidden = read_sentences(datasets / "SST-2" / "test.tsv")
    assert (hidden.labels == -1).all() and len(hidden.texts) == 200


def test_cola_layout_and_matthews(tmp_path):
    cola = tmp_path / "train.tsv"
    cola.write_text("gj04\t1\t\tthe sailors rode the breeze clear of the rocks .\n"
                    "gj04\t0\t*\tthe more we study verbs , the crazier they get get .\n")
    sentences = read_tsv(cola)
    assert sentences.labels.tolist() == [1, 0]
    assert sentences.texts[1].startswith("the more we study")
    # Binary Matthews: (tp*tn - fp*fn) / sqrt((tp+fp)(tp+fn)(tn+fp)(tn+fn)); rows are true labels.
    tn, fp, fn, tp = 50, 10, 5, 35
    expected = (tp * tn - fp * fn) / np.sqrt((tp + fp) * (tp + fn) * (tn + fp) * (tn + fn))
    assert matthews_correlation(np.array([[tn, fp], [fn, tp]])) == pytest.approx(expected)
    assert matthews_correlation(np.array([[60, 0], [40, 0]])) == 0.0  # a constant guess


def test_unknown_tsv_layout_is_a_clear_error(tmp_path):
    bad = tmp_path / "train.tsv"
    bad.write_text("text\tpolarity\nfine\t1\n")
    with pytest.raises(UserError, match="train.tsv: unknown TSV layout"):
        read_tsv(bad)


@pytest.mark.parametrize("sentences, labels, message", [
    (["good", "bad"], ["positive", "negative"], "row 1, column label: expected an integer, found 'positive'"),
    (["good", "bad"], [1.0, 0.7], "row 2, column label: expected an integer, found 0.7"),
    (["good", None], [1, 0], "row 2, column sentence: expected text, found None"),
    (["good", "bad"], [1, None], "row 2, column label: expected an integer, found None"),
])
def test_bad_parquet_values_name_the_file_row_and_column(tmp_path, sentences, labels, message):
    import pyarrow as pa
    import pyarrow.parquet as pq
    path = tmp_path / "train-00000-of-00001.parquet"
    pq.write_table(pa.table({"sentence": sentences, "label": labels}), path)
    with pytest.raises(UserError) as error:
        read_sentences(path)
    assert str(error.value) == f"{path}: {message}"


@pytest.mark.parametrize("content, message", [
    ("sentence\tlabel\ngood\t1\nbad\tneg\n", "line 3, column label: expected an integer, found 'neg'"),
    ("sentence\tlabel\ngood\t1\nbad\n", "line 3: 1 tab-separated column(s), expected 2"),
    ("index\tsentence\nx\tgood\n", "line 2, column index: expected an integer, found 'x'"),
    ("gj04\t1\t\tfine .\ngj04\t0.5\t*\tbad .\n", "line 2, column label: expected an integer, found '0.5'"),
])
def test_bad_tsv_values_name_the_file_line_and_column(tmp_path, content, message):
    path = tmp_path / "train.tsv"
    path.write_text(content)
    with pytest.raises(UserError) as error:
        read_sentences(path)
    assert str(error.value) == f"{path}: {message}"


def test_integral_labels_of_any_type_are_read(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq
    path = tmp_path / "train-00000-of-00001.parquet"
    pq.write_table(pa.table({"sentence": ["good", "bad"], "label": [1.0, 0.0]}), path)
    assert read_sentences(path).labels.tolist() == [1, 0]


def test_dynamic_padding_gives_the_same_logits_as_padding_to_seq_len(base_dir):
    vocab = load_vocab(base_dir / "vocab")
    sentences = read_sentences(find_split_file(base_dir / "datasets", "val"))
    encoded = EncodedSentences(sentences, vocab, seq_len=128)
    torch.manual_seed(0)
    model = BertForSequenceClassification(ModelConfig(vocab_size=vocab.size, max_len=128, d_model=64, heads=2,
                                                      n_layer=2, d_ff=128, pad_id=vocab.pad_id)).eval()
    rows = np.arange(16)
    batch = encoded.batch(rows, vocab.pad_id)
    assert batch["input_ids"].shape[1] < 128 and batch["input_ids"].shape[1] % 8 == 0
    full = np.full((16, 128), vocab.pad_id)
    full[:, :batch["input_ids"].shape[1]] = batch["input_ids"]
    short_logits, _ = model(torch.from_numpy(batch["input_ids"]),
                            attention_mask=torch.from_numpy(batch["attention_mask"]))
    full_ids = torch.from_numpy(full)
    full_logits, _ = model(full_ids, attention_mask=full_ids != vocab.pad_id)
    torch.testing.assert_close(short_logits, full_logits, rtol=1e-4, atol=1e-5)


def test_length_grouping_narrows_training_batches_and_can_be_turned_off(base_dir):
    vocab = load_vocab(base_dir / "vocab")

    def mean_width(length_grouping: bool) -> float:
        config = Config(task_type="sst2", base_dir=str(base_dir), length_grouping=length_grouping)
        task = ClassificationTask(config, vocab, torch.device(TEST_DEVICE))
        return np.mean([batch["input_ids"].shape[1] for _, batch in islice(task.train_batches(None), 50)])

    assert mean_width(True) < 0.7 * mean_width(False)


def test_fine_tuning_from_mlm_learns_far_above_chance(sst2_run):
    log = (sst2_run / "logs" / "log.txt").read_text()
    assert "loaded the encoder of" in log and "not used: head.*" in log
    assert "newly initialised: pooler.weight, pooler.bias, classifier.weight, classifier.bias" in log
    accuracies = [float(line.split("val accuracy ")[1].split()[0]) for line in log.splitlines()
                  if "val accuracy" in line]
    assert len(accuracies) == 5
    # 200 balanced validation sentences: chance is 0.5 with a standard error of 0.035.
    assert max(accuracies) > 0.6
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
    assert 0.55 < metrics["test_accuracy"] <= 1 and "test_matthews" in metrics

    # The GLUE layout hides test labels: predictions are written instead of a score.
    glue_base = base_dir / "glue"
    (glue_base / "datasets").mkdir(parents=True)
    shutil.copytree(base_dir / "datasets" / "SST-2", glue_base / "datasets" / "SST-2")
    shutil.copytree(base_dir / "vocab", glue_base / "vocab")
    result = main.run(main.load_config(None, ["--task-type", "sst2", "--base-dir", "glue"]), best, True)
    lines = open(result["predictions"]).read().splitlines()
    assert lines[0] == "index\tprediction" and len(lines) == 201
    assert lines[1] == "0\t" + lines[1].split("\t")[1] and {line.split("\t")[1] for line in lines[1:]} <= {"0", "1"}


def test_fill_mask_and_classify_scripts(mlm_checkpoint, sst2_run, capsys, tmp_path):
    fill_mask.main(["--cp", str(mlm_checkpoint), "the movie was [MASK] .", "-k", "3"])
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "the movie was [MASK] ." and out[1].startswith("  [MASK] 1: ")
    probabilities = [float(word) for word in out[1].split()[3::2]]
    assert len(probabilities) == 3 and probabilities == sorted(probabilities, reverse=True)

    sentences = tmp_path / "sentences.txt"
    sentences.write_text("a gorgeous , witty , seductive movie .\n\nthe plot is nothing but boilerplate clichés .\n")
    classify.main(["--cp", str(sst2_run / "checkpoints" / "best.pt"), "-i", str(sentences)])
    rows = [line.split("\t") for line in capsys.readouterr().out.splitlines()]
    assert len(rows) == 2 and all(row[0] in "01" and 0.5 <= float(row[1]) <= 1 for row in rows)

    with pytest.raises(SystemExit) as exit_info:
        classify.main(["--cp", str(mlm_checkpoint), "fine"])  # an MLM checkpoint has no classifier
    assert exit_info.value.code == 2
    assert "a mlm checkpoint; expected sst2 or cola or classify" in capsys.readouterr().err


def test_batch_width_rounds_to_8_but_never_past_seq_len(base_dir):
    vocab = load_vocab(base_dir / "vocab")
    long_sentence = " ".join(["wonderful"] * 40)
    sentences = read_sentences(find_split_file(base_dir / "datasets", "val"))
    sentences.texts[0] = long_sentence
    encoded = EncodedSentences(sentences, vocab, seq_len=21)  # not a multiple of 8
    batch = encoded.batch(np.arange(4), vocab.pad_id)
    assert batch["input_ids"].shape[1] == 21
    assert batch["attention_mask"][0].all()


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
    assert rows[f"start={mlm_checkpoint.resolve()}"][:2] == ["1", f"{scores[0]['test_accuracy']:.4f} ± –"]
    assert rows["start=none"][:2] == ["1", f"{scores[1]['test_accuracy']:.4f} ± –"]
