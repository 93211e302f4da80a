"""src/tasks/glue_data.py: every GLUE task's splits read the same from both layouts, the layouts SST-2 and
CoLA had before, QQP as distributed, and every bad file as a one-line error."""

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import make_demo
from errors import UserError
from tasks.glue_data import read_split
from tasks.glue_tasks import TASKS

ROWS = 12  # examples per split file: enough for every label of every task
STSB_HEADER = ["index", "genre", "filename", "year", "old_index", "source1", "source2", "sentence1", "sentence2"]
MNLI_HEADER = ["index", "promptID", "pairID", "genre", "sentence1_binary_parse", "sentence2_binary_parse",
               "sentence1_parse", "sentence2_parse", "sentence1", "sentence2"]
# The GLUE distribution's headers: (train and dev files, test files); None: no header (CoLA).
TSV_HEADERS = {
    "cola": (None, ["index", "sentence"]),
    "sst2": (["sentence", "label"], ["index", "sentence"]),
    "mrpc": (["Quality", "#1 ID", "#2 ID", "#1 String", "#2 String"],
             ["index", "#1 ID", "#2 ID", "#1 String", "#2 String"]),
    "qqp": (["id", "qid1", "qid2", "question1", "question2", "is_duplicate"], ["id", "question1", "question2"]),
    "stsb": (STSB_HEADER + ["score"], STSB_HEADER),
    "mnli": (MNLI_HEADER + ["label1", "gold_label"], MNLI_HEADER),
    "qnli": (["index", "question", "sentence", "label"], ["index", "question", "sentence"]),
    "rte": (["index", "sentence1", "sentence2", "label"], ["index", "sentence1", "sentence2"]),
    "wnli": (["index", "sentence1", "sentence2", "label"], ["index", "sentence1", "sentence2"]),
    "ax": (None, ["index", "sentence1", "sentence2"]),
}
TSV_LABELS_AS_NAMES = {"mnli", "qnli", "rte"}  # the others' TSV files hold numbers
SPLITS = [(name, split) for name, task in TASKS.items() for split in task.tsv_files]


def one_line_sentences(rotten_tomatoes) -> list[str]:
    """Real sentences of one line each; pair i is (sentence i, sentence i + 1)."""
    return [" ".join(text.split()) for text, _ in rotten_tomatoes[:ROWS + 1]]


@pytest.fixture(scope="module")
def sentences(rotten_tomatoes) -> list[str]:
    return one_line_sentences(rotten_tomatoes)


def split_rows(task, split: str, sentences: list[str]) -> dict:
    """What a split file holds: texts, labels (hidden in test splits) and the index."""
    hidden = split.startswith("test")
    if task.is_regression:
        labels = np.full(ROWS, np.nan, np.float32) if hidden else (np.arange(ROWS) % 11 * 0.5).astype(np.float32)
    else:
        labels = np.full(ROWS, -1) if hidden else np.arange(ROWS) % task.num_labels
    return {"first": sentences[:ROWS], "second": sentences[1:ROWS + 1] if task.is_pair else None,
            "labels": labels, "index": np.arange(ROWS)}


def write_parquet_split(directory, task, split: str, rows: dict, shards: int = 1):
    """nyu-mll/glue's layout: directory/<task>/<split>-0000N-of-0000M.parquet, labels -1 where hidden."""
    labels = np.where(np.isnan(rows["labels"]), -1, rows["labels"]) if task.is_regression else rows["labels"]
    texts = [rows["first"]] + ([rows["second"]] if task.is_pair else [])
    columns = dict(zip(task.text_columns, texts)) | {"label": labels, "idx": rows["index"]}
    table = pa.table(columns)
    (directory / task.name).mkdir(parents=True, exist_ok=True)
    bounds = np.linspace(0, ROWS, shards + 1).astype(int)
    for number in range(shards):
        part = table.slice(bounds[number], bounds[number + 1] - bounds[number])
        pq.write_table(part, directory / task.name / f"{split}-{number:05d}-of-{shards:05d}.parquet")


def tsv_label(task, label) -> str:
    if task.is_regression:
        return f"{label:.3f}"
    return task.label_names[label] if task.name in TSV_LABELS_AS_NAMES else str(label)


def tsv_field(task, name: str, rows: dict, row: int) -> str:
    texts = dict(zip(task.tsv_text_columns, [rows["first"], rows["second"]]))
    if name in texts:
        return texts[name][row]
    if name in (task.tsv_label_column, "label1"):
        return tsv_label(task, rows["labels"][row])
    return str(rows["index"][row]) if name == task.tsv_index_column else f"{name}-{row}"


def write_tsv_split(directory, task, split: str, rows: dict):
    """The GLUE distribution's layout: directory/<Folder>/<file>.tsv with the task's own header."""
    header = TSV_HEADERS[task.name][split.startswith("test")]
    if header is None:  # CoLA's train and dev: source, label, original mark, sentence
        lines = [f"gj04\t{label}\t{'' if label else '*'}\t{text}" for text, label in zip(rows["first"], rows["labels"])]
    else:
        lines = ["\t".join(header)] + ["\t".join(tsv_field(task, name, rows, row) for name in header)
                                       for row in range(ROWS)]
    bom = "\ufeff" if task.name == "mrpc" and not split.startswith("test") else ""  # as msr_paraphrase_train.txt
    path = directory / task.tsv_folder / task.tsv_files[split]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(bom + "\n".join(lines) + "\n", encoding="utf-8")


def assert_same_examples(examples, rows: dict):
    assert examples.first == rows["first"]
    assert examples.second == rows["second"]
    np.testing.assert_array_equal(examples.labels, rows["labels"])
    assert examples.labels.dtype == (np.float32 if np.issubdtype(rows["labels"].dtype, np.floating) else np.int64)
    np.testing.assert_array_equal(examples.index, rows["index"])


# ----------------------------------------------------------------------------- reading

@pytest.mark.parametrize("task_name, split", SPLITS)
def test_every_split_reads_the_same_from_parquet_and_tsv(tmp_path, sentences, task_name, split):
    """Labels as names (MNLI's TSV) and numbers (parquet) mean the same; MRPC's byte-order mark,
    CoLA's missing header and MNLI's two dev sets are read as the real files have them."""
    task = TASKS[task_name]
    rows = split_rows(task, split, sentences)
    write_parquet_split(tmp_path / "hf", task, split, rows, shards=2 if split == "train" else 1)
    write_tsv_split(tmp_path / "glue_data", task, split, rows)
    for layout in ("hf", "glue_data"):
        examples = read_split(tmp_path / layout, task_name, split)
        assert_same_examples(examples, rows)
        assert examples.labels_hidden == split.startswith("test")


def test_parquet_shards_are_read_in_order_and_a_missing_one_is_named(tmp_path, sentences):
    task = TASKS["qnli"]
    rows = split_rows(task, "train", sentences)
    write_parquet_split(tmp_path, task, "train", rows, shards=3)
    examples = read_split(tmp_path, "qnli", "train")
    assert_same_examples(examples, rows)
    assert [path.name for path in examples.files] == [f"train-0000{n}-of-00003.parquet" for n in range(3)]
    (tmp_path / "qnli" / "train-00001-of-00003.parquet").unlink()
    with pytest.raises(UserError, match=r"qnli: train-00001-of-00003.parquet is missing \(2 of the split's 3"):
        read_split(tmp_path, "qnli", "train")


def test_val_means_the_first_dev_split_and_mnli_has_no_plain_validation(tmp_path, sentences):
    for split in ("validation_matched", "validation_mismatched"):
        write_parquet_split(tmp_path, TASKS["mnli"], split, split_rows(TASKS["mnli"], split, sentences))
    assert read_split(tmp_path, "mnli", "val").files[0].name.startswith("validation_matched-")
    with pytest.raises(UserError, match="mnli has no split 'validation'; its splits: train, validation_matched"):
        read_split(tmp_path, "mnli", "validation")


def test_the_sst2_layout_make_demo_writes_reads_back_as_written(tmp_path, rotten_tomatoes):
    """make_demo's parquet files in the directory itself, its GLUE TSV in dir/SST-2: both hold the
    seeded 80/10/10 split of the cleaned sentences, in order; only the TSV test split hides its labels."""
    make_demo.write_sst2(tmp_path, rotten_tomatoes, seed=123)
    cleaned = [(make_demo.clean_sentence(text), label) for text, label in rotten_tomatoes]
    written = make_demo.split_sentences(cleaned, seed=123)
    assert {split: len(rows) for split, rows in written.items()} == {"train": 1600, "validation": 200, "test": 200}
    tsv_dir = tmp_path / "SST-2"
    for split, alias in (("train", "train"), ("validation", "val"), ("test", "test")):
        texts, labels = [text for text, _ in written[split]], [label for _, label in written[split]]
        parquet = read_split(tmp_path, "sst2", alias)
        assert parquet.files == (tmp_path / f"{split}-00000-of-00001.parquet",)
        assert parquet.first == texts and parquet.second is None
        assert parquet.labels.tolist() == labels and parquet.index.tolist() == list(range(len(texts)))
        tsv = read_split(tsv_dir, "sst2", alias)  # no parquet there: the TSV file
        assert tsv.files == (tsv_dir / TASKS["sst2"].tsv_files[split],)
        assert tsv.first == texts and tsv.index.tolist() == list(range(len(texts)))
        assert tsv.labels_hidden == (split == "test")
        if split != "test":
            assert tsv.labels.tolist() == labels
    for path in tmp_path.glob("*.parquet"):
        path.unlink()
    assert read_split(tmp_path, "sst2", "val").files == (tsv_dir / "dev.tsv",)  # found in its task folder


def test_cola_and_sst2_tsv_files_directly_in_the_directory(tmp_path, sentences):
    """The layout this program read for SST-2 and CoLA before GLUE: dev.tsv with no task folder around it."""
    for name in ("cola", "sst2"):
        rows = split_rows(TASKS[name], "validation", sentences)
        write_tsv_split(tmp_path / name, TASKS[name], "validation", rows)
        flat = tmp_path / name / TASKS[name].tsv_folder
        assert_same_examples(read_split(flat, name, "val"), rows)


def test_qqp_as_distributed_quotes_broken_rows_and_empty_questions(tmp_path, sentences):
    """QQP's train.tsv: a question starting with a quote is text, rows cut in two by a newline in a
    question are left out (as Hugging Face's loader does), and an empty question2 (two in the real
    train split) is kept."""
    header = "id\tqid1\tqid2\tquestion1\tquestion2\tis_duplicate"
    lines = [header, f'0\t1\t2\t"Why" is {sentences[0]}\t{sentences[1]}\t1',
             f"1\t3\t4\t{sentences[2]}\tWhat is the first half of", "a question?\t0",
             f"2\t5\t6\t{sentences[3]}\t\t0"]
    (tmp_path / "QQP").mkdir()
    (tmp_path / "QQP" / "train.tsv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    examples = read_split(tmp_path, "qqp", "train")
    assert examples.first == [f'"Why" is {sentences[0]}', sentences[3]]
    assert examples.second == [sentences[1], ""]
    assert examples.labels.tolist() == [1, 0] and examples.index.tolist() == [0, 2]
    assert examples.skipped_lines == (3, 4)


def test_a_sentence_longer_than_csvs_default_field_limit_is_read(tmp_path, sentences):
    """Python's csv stops at 131,072 characters a field; a long scraped review is still one sentence."""
    long_sentence = " ".join(sentences) * (200_000 // len(" ".join(sentences)) + 1)
    (tmp_path / "SST-2").mkdir()
    (tmp_path / "SST-2" / "train.tsv").write_text(f"sentence\tlabel\n{long_sentence}\t1\nshort\t0\n", encoding="utf-8")
    examples = read_split(tmp_path, "sst2", "train")
    assert examples.first == [long_sentence, "short"] and len(long_sentence) > 131_072


def test_an_index_twice_across_a_test_splits_shards_is_named(tmp_path, sentences):
    task = TASKS["qnli"]
    rows = split_rows(task, "test", sentences)
    rows["index"] = np.arange(ROWS) % (ROWS // 2)  # the second shard repeats the first's
    write_parquet_split(tmp_path, task, "test", rows, shards=2)
    with pytest.raises(UserError, match=r"test-00001-of-00002.parquet: index 0 is on two test examples "
                                        r"\(one in .*test-00000-of-00002.parquet\)"):
        read_split(tmp_path, "qnli", "test")


# ----------------------------------------------------------------------------- bad files

def parquet_file(task_name: str, split: str, columns: dict):
    def write(directory):
        folder = directory / task_name
        folder.mkdir()
        pq.write_table(pa.table(columns), folder / f"{split}-00000-of-00001.parquet")
    return write


def tsv_file(folder: str, name: str, text: str):
    def write(directory):
        (directory / folder).mkdir()
        (directory / folder / name).write_text(text, encoding="utf-8")
    return write


PAIRS = {"sentence1": ["A man is playing a flute.", "A dog runs."], "sentence2": ["A man plays.", "A cat sleeps."]}
BAD_FILES = [  # (task, split, what is written, what the one-line error says)
    ("sst2", "train", parquet_file("sst2", "train", {"sentence": ["good", "bad"], "label": ["1", "maybe"]}),
     "sst2/train-00000-of-00001.parquet: row 2, column label: expected 0 to 1 or negative, positive, found 'maybe'"),
    ("mnli", "validation_matched", parquet_file("mnli", "validation_matched", {
        "premise": ["It rains.", "It snows."], "hypothesis": ["It is wet.", "It is cold."], "label": [3, 0]}),
     "validation_matched-00000-of-00001.parquet: row 1, column label: expected 0 to 2 or entailment, neutral, "
     "contradiction, found 3"),
    ("cola", "train", parquet_file("cola", "train", {"sentence": ["He left.", "Left he."], "label": [1, None]}),
     "row 2, column label: expected 0 to 1 or unacceptable, acceptable, found None"),
    ("cola", "train", parquet_file("cola", "train", {"sentence": ["He left.", "Left he."], "label": [1, -1]}),
     "row 2, column label: found -1, a hidden label, outside a test split"),
    ("rte", "train", parquet_file("rte", "train", PAIRS | {"sentence2": ["A man plays.", " "], "label": [0, 1]}),
     "rte/train-00000-of-00001.parquet: row 2, column sentence2: empty sentence"),
    ("rte", "train", parquet_file("rte", "train", PAIRS | {"sentence1": [None, "A dog runs."], "label": [0, 1]}),
     "row 1, column sentence1: expected text, found None"),
    ("stsb", "train", parquet_file("stsb", "train", PAIRS | {"label": [4.2, 5.5]}),
     "row 2, column label: expected a similarity score from 0 to 5, found 5.5"),
    ("stsb", "validation", parquet_file("stsb", "validation", PAIRS | {"label": [-1.0, 2.0]}),
     "validation-00000-of-00001.parquet: row 1, column label: expected a similarity score from 0 to 5, found -1.0"),
    ("stsb", "train", parquet_file("stsb", "train", PAIRS | {"label": ["high", "low"]}),
     "row 1, column label: expected a similarity score from 0 to 5, found 'high'"),
    ("mrpc", "train", parquet_file("mrpc", "train", {"sentence1": ["A man plays."], "label": [1]}),
     "mrpc/train-00000-of-00001.parquet: missing column sentence2 (columns: sentence1, label)"),
    ("wnli", "train", parquet_file("wnli", "train", PAIRS | {"label": [0, 1], "idx": [0.0, 1.5]}),
     "row 2, column idx: expected an integer, found 1.5"),
    ("sst2", "validation", tsv_file("SST-2", "dev.tsv", "sentence\tlabel\ngood film\t1\nbad film\t2\n"),
     "SST-2/dev.tsv: line 3, column label: expected 0 to 1 or negative, positive, found '2'"),
    ("mnli", "validation_mismatched",
     tsv_file("MNLI", "dev_mismatched.tsv", "index\tsentence1\tsentence2\tgold_label\n0\tIt rains.\tIt is wet.\t-\n"),
     "MNLI/dev_mismatched.tsv: line 2, column gold_label: expected 0 to 2 or entailment, neutral, contradiction, "
     "found '-'"),
    ("stsb", "train", tsv_file("STS-B", "train.tsv", "index\tsentence1\tsentence2\tscore\n0\tA.\tB.\t6.000\n"),
     "STS-B/train.tsv: line 2, column score: expected a similarity score from 0 to 5, found '6.000'"),
    ("qnli", "train", tsv_file("QNLI", "train.tsv", "index\tquestion\tsentence\tlabel\n0\tWho?\tHe.\tentailment\n"
                                                    "1\t  \tShe.\tnot_entailment\n"),
     "QNLI/train.tsv: line 3, column question: empty sentence"),
    ("mrpc", "train", tsv_file("MRPC", "train.tsv", "Quality\t#1 ID\t#2 ID\t#1 String\n1\t1\t2\tA man plays.\n"),
     "MRPC/train.tsv: line 1: missing column #2 String (header: Quality, #1 ID, #2 ID, #1 String)"),
    ("rte", "validation", tsv_file("RTE", "dev.tsv", "index\tsentence1\tsentence2\n0\tIt rains.\tIt is wet.\n"),
     "RTE/dev.tsv: line 1: missing column label (header: index, sentence1, sentence2)"),
    ("rte", "train",
     tsv_file("RTE", "train.tsv", "index\tsentence1\tsentence2\tlabel\n0\tA.\tB.\tentailment\n1\tC.\tD.\n"),
     "RTE/train.tsv: line 3, column label: missing (the line has 3 tab-separated fields)"),
    ("cola", "train", tsv_file("CoLA", "train.tsv", "gj04\t1\t\tHe left.\ngj04\tx\t*\tLeft he.\n"),
     "CoLA/train.tsv: line 2, column label: expected 0 to 1 or unacceptable, acceptable, found 'x'"),
    ("rte", "validation", lambda directory: None,
     "no rte validation split: expected rte/validation-00000-of-00001.parquet (Hugging Face) "
     "or RTE/dev.tsv (GLUE TSV)"),
    ("sst2", "train", tsv_file("sst2", "train-00000-of-00001.parquet", "not parquet"),
     "sst2/train-00000-of-00001.parquet: not a readable parquet file"),
    ("rte", "test", tsv_file("RTE", "test.tsv", "index\tsentence1\tsentence2\n0\tA.\tB.\n1\tC.\tD.\n0\tE.\tF.\n"),
     "RTE/test.tsv: index 0 is on two test examples"),
    ("sst2", "test", parquet_file("sst2", "test", {"sentence": ["good", "bad"], "label": [-1, -1], "idx": [7, 7]}),
     "sst2/test-00000-of-00001.parquet: index 7 is on two test examples"),
]


@pytest.mark.parametrize("task_name, split, write, message", BAD_FILES)
def test_a_bad_file_is_one_line_naming_the_file_row_and_column(tmp_path, task_name, split, write, message):
    write(tmp_path)
    with pytest.raises(UserError) as error:
        read_split(tmp_path, task_name, split)
    assert message in str(error.value)
    assert "\n" not in str(error.value)
