"""The single-sentence classification task (trainer.Task: SST-2, CoLA, ...): read parquet or GLUE
TSV, batch, score.

Batches are padded to their own longest sentence (rounded up to a multiple of 8), not to
seq-len: SST-2 sentences average about 10 words, so most of a 128-wide batch would be padding.
With length-grouping, training batches hold sentences of similar length, so even less is.
"""
import csv
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import torch

from batching import BatchOrder, LengthGroupedBatchOrder, gather_padded, kept_rows
from errors import UserError
from hardware import to_device
from model import BertForSequenceClassification, model_config

HIDDEN_LABEL = -1  # GLUE test sets hide their labels
PARQUET_NAMES = {"train": "train-00000-of-00001.parquet", "val": "validation-00000-of-00001.parquet",
                 "test": "test-00000-of-00001.parquet"}
TSV_NAMES = {"train": "train.tsv", "val": "dev.tsv", "test": "test.tsv"}


@dataclass
class Sentences:
    texts: list[str]
    labels: np.ndarray  # int64, HIDDEN_LABEL where unknown
    index: np.ndarray  # the data set's own idx / index column, for submission files


def find_split_file(datasets_dir: Path, split: str) -> Path:
    """Hugging Face parquet first, then GLUE TSV, in datasets/ or GLUE's datasets/SST-2/ or datasets/CoLA/."""
    for directory in (datasets_dir, datasets_dir / "SST-2", datasets_dir / "CoLA"):
        for names in (PARQUET_NAMES, TSV_NAMES):
            if (directory / names[split]).is_file():
                return directory / names[split]
    raise UserError(f"{datasets_dir}: no {split} split found: expected {PARQUET_NAMES[split]} "
                    f"(Hugging Face parquet) or {TSV_NAMES[split]} (GLUE TSV)")


def read_parquet(path: Path) -> Sentences:
    try:
        table = pq.read_table(path)
    except Exception as error:  # pyarrow raises several kinds for a bad file
        raise UserError(f"{path}: not a readable parquet file ({error.__class__.__name__})") from None
    missing = {"sentence", "label"} - set(table.column_names)
    if missing:
        raise UserError(f"{path}: missing column(s) {', '.join(sorted(missing))}; "
                        f"expected idx, sentence, label")
    column = lambda name: table.column(name).to_pylist()  # noqa: E731
    place = lambda row: f"row {row + 1}"  # noqa: E731
    index = (checked_integers(path, column("idx"), "idx", place) if "idx" in table.column_names
             else np.arange(table.num_rows))
    return Sentences(checked_texts(path, column("sentence"), place),
                     checked_integers(path, column("label"), "label", place), index)


def read_tsv(path: Path) -> Sentences:
    """GLUE layouts: `sentence label` (SST-2 train/dev), `index sentence` (test, labels
    hidden), or CoLA's headerless `source label original-label sentence`."""
    try:
        with path.open(encoding="utf-8", newline="") as file:
            rows = list(csv.reader(file, delimiter="\t", quoting=csv.QUOTE_NONE))
    except (OSError, UnicodeDecodeError) as error:
        raise UserError(f"{path}: cannot read ({error})") from None
    if not rows:
        raise UserError(f"{path}: empty file")
    header = [name.strip().lower() for name in rows[0]]
    if header[:2] == ["sentence", "label"]:
        columns, body, first_line = {"sentence": 0, "label": 1}, rows[1:], 2
    elif header[:2] == ["index", "sentence"]:
        columns, body, first_line = {"index": 0, "sentence": 1}, rows[1:], 2
    elif len(rows[0]) == 4:
        columns, body, first_line = {"label": 1, "sentence": 3}, rows, 1
    else:
        raise UserError(f"{path}: unknown TSV layout; expected a header 'sentence<TAB>label' or "
                        f"'index<TAB>sentence', or CoLA's four columns")
    place = lambda row: f"line {row + first_line}"  # noqa: E731
    width = max(columns.values()) + 1
    for row, fields in enumerate(body):
        if len(fields) < width:
            raise UserError(f"{path}: {place(row)}: {len(fields)} tab-separated column(s), expected {width}")
    column = lambda name: [fields[columns[name]] for fields in body]  # noqa: E731
    labels = (checked_integers(path, column("label"), "label", place) if "label" in columns
              else np.full(len(body), HIDDEN_LABEL, np.int64))
    index = checked_integers(path, column("index"), "index", place) if "index" in columns else np.arange(len(body))
    return Sentences(checked_texts(path, column("sentence"), place), labels, index)


def checked_texts(path: Path, values: list, place) -> list[str]:
    """The sentences, each of them text; `place(row)` names a bad one's row or line."""
    for row, value in enumerate(values):
        if not isinstance(value, str):
            raise UserError(f"{path}: {place(row)}, column sentence: expected text, found {value!r}")
    return values


def checked_integers(path: Path, values: list, column: str, place) -> np.ndarray:
    """Labels or indices as int64: integers, integral floats or digits; anything else (text,
    0.7, null) is an error naming the row and column."""
    result = np.empty(len(values), np.int64)
    for row, value in enumerate(values):
        number = as_integer(value)
        if number is None:
            raise UserError(f"{path}: {place(row)}, column {column}: expected an integer, found {value!r}")
        result[row] = number
    return result


def as_integer(value) -> int | None:
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and re.fullmatch(r"\s*-?\d+\s*", value):
        return int(value)
    return None


def read_sentences(path: Path) -> Sentences:
    sentences = read_parquet(path) if path.suffix == ".parquet" else read_tsv(path)
    if not sentences.texts:
        raise UserError(f"{path}: no sentences")
    return sentences


class EncodedSentences:
    """Token ids of every sentence ([CLS] ... [SEP], cut to seq-len), stored ragged."""

    def __init__(self, sentences: Sentences, vocab, seq_len: int):
        pieces = vocab.encode(sentences.texts)
        ids = [[vocab.cls_id, *p[:seq_len - 2], vocab.sep_id] for p in pieces]
        self.tokens = np.fromiter((i for sample in ids for i in sample), dtype=np.int64)
        self.offsets = np.zeros(len(ids) + 1, dtype=np.int64)
        np.cumsum([len(sample) for sample in ids], out=self.offsets[1:])
        self.labels = sentences.labels
        self.index = sentences.index
        self.seq_len = seq_len

    def __len__(self) -> int:
        return len(self.labels)

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    def batch(self, rows: np.ndarray, pad_id: int) -> dict:
        longest = int((self.offsets[rows + 1] - self.offsets[rows]).max())
        # few distinct shapes (fewer recompiles, aligned matmuls), never past the position table
        width = min(-(-longest // 8) * 8, self.seq_len)
        input_ids, real = gather_padded(self.tokens, self.offsets, rows, width, pad_id)
        return {"input_ids": input_ids, "attention_mask": real, "labels": self.labels[rows]}


def confusion_matrix(predicted: torch.Tensor, labels: torch.Tensor, classes: int) -> torch.Tensor:
    """counts[true, predicted], flattened."""
    return torch.bincount(labels * classes + predicted, minlength=classes * classes)


def matthews_correlation(confusion: np.ndarray) -> float:
    """Matthews correlation for any number of classes (Gorodkin's R_K); 0 when undefined."""
    total = confusion.sum()
    correct = np.trace(confusion)
    true_counts, predicted_counts = confusion.sum(1), confusion.sum(0)
    numerator = correct * total - (true_counts * predicted_counts).sum()
    denominator = np.sqrt(float(total ** 2 - (predicted_counts ** 2).sum())) * np.sqrt(
        float(total ** 2 - (true_counts ** 2).sum()))
    return float(numerator / denominator) if denominator else 0.0


class ClassificationTask:
    """Fine-tuning as the trainer sees it: a classifier on BERT, sentences in, labels out. best.pt
    is the most accurate, or for CoLA the best Matthews correlation (GLUE's metric for it)."""
    lower_is_better = False
    predictions_per_token = 0.0  # no MLM head
    measuring_keys = ("seq_len", "dataset_percentage", "val_dataset_percentage")  # sentences are cut to seq-len

    def __init__(self, config, vocab, device: torch.device, rank: int = 0, world_size: int = 1):
        self.name = config.task_type
        self.best_metric = "matthews" if config.task_type == "cola" else "accuracy"
        self.config = config
        self.vocab = vocab
        self.device = device
        self.order = BatchOrder(config.batch_size, config.seed, rank, world_size)
        self.splits: dict[str, EncodedSentences] = {}
        self.data("train")  # fail early on a missing train split

    def data(self, split: str) -> EncodedSentences:
        if split not in self.splits:
            path = find_split_file(self.config.datasets_path, split)
            sentences = read_sentences(path)
            kept = kept_rows(len(sentences.texts), self.config.share_of(split), self.config.seed)
            if len(kept) < len(sentences.texts):
                sentences = Sentences([sentences.texts[row] for row in kept], sentences.labels[kept],
                                      sentences.index[kept])
            encoded = EncodedSentences(sentences, self.vocab, self.config.seq_len)
            labels = encoded.labels[encoded.labels != HIDDEN_LABEL]
            if labels.size and (labels.min() < 0 or labels.max() >= self.config.num_labels):
                raise UserError(f"{path}: labels range from {labels.min()} to {labels.max()}, "
                                f"but num-labels = {self.config.num_labels}")
            if split == "train" and labels.size < len(encoded):
                raise UserError(f"{path}: the training split has hidden labels ({HIDDEN_LABEL})")
            if len(encoded) < self.order.batch_size * self.order.world_size:
                raise UserError(f"{path}: {len(encoded)} sentences are fewer than one batch "
                                f"(batch-size {self.order.batch_size} x {self.order.world_size} processes)")
            self.splits[split] = encoded
        return self.splits[split]


    def check_data(self, splits: tuple[str, ...]):
        for split in splits:
            self.data(split)

    def build_model(self, max_len: int | None = None) -> BertForSequenceClassification:
        return BertForSequenceClassification(model_config(self.config, self.vocab, max_len))

    def train_batches(self, position: dict | None):
        data = self.data("train")
        order = self.order
        if self.config.length_grouping:
            order = LengthGroupedBatchOrder(data.lengths, order.batch_size, order.seed, order.rank, order.world_size)
        return order.batches(position, lambda epoch: len(data),
                             lambda epoch, rows: data.batch(rows, self.vocab.pad_id))

    def eval_batches(self, split: str, count: int | None):
        """Evaluation sees every sentence once (the last batch may be short), or the first `count` batches."""
        data = self.data(split)
        rank, world = self.order.rank, self.order.world_size
        rows = np.arange(len(data))[rank::world]
        size = self.order.batch_size
        batches = range(0, len(rows), size)
        for start in batches if count is None else batches[:count]:
            yield to_device(data.batch(rows[start:start + size], self.vocab.pad_id), self.device, False)

    def loss(self, model, batch: dict, generator=None):
        """Mean loss and [count, confusion matrix...] for accuracy and Matthews correlation."""
        logits, loss = model(batch["input_ids"], batch["labels"], attention_mask=batch["attention_mask"])
        confusion = confusion_matrix(logits.argmax(-1), batch["labels"], self.config.num_labels)
        return loss, torch.cat([batch["labels"].new_tensor([len(batch["labels"])]), confusion])

    def metrics(self, loss: float, statistics: torch.Tensor) -> dict:
        classes = self.config.num_labels
        confusion = statistics[1:].numpy().reshape(classes, classes)
        return {"loss": loss, "accuracy": float(np.trace(confusion) / confusion.sum()),
                "matthews": matthews_correlation(confusion)}

    def submission(self, model, split: str, autocast) -> list[str] | None:
        """GLUE's predictions file (`index<TAB>prediction`) where the split's labels are hidden, else None."""
        if not (self.data(split).labels == HIDDEN_LABEL).all():
            return None
        predictions, index = self.predict(model, split, autocast)
        return ["index\tprediction"] + [f"{i}\t{p}" for i, p in zip(index, predictions)]

    @torch.no_grad()
    def predict(self, model, split: str, autocast) -> tuple[np.ndarray, np.ndarray]:
        """Predicted labels and the data set's index column."""
        model.eval()
        predictions = []
        for batch in self.eval_batches(split, None):
            with autocast:
                logits, _ = model(batch["input_ids"], attention_mask=batch["attention_mask"])
            predictions.append(logits.argmax(-1).cpu().numpy())
        model.train()
        data = self.data(split)
        return np.concatenate(predictions), data.index[np.arange(len(data))[self.order.rank::self.order.world_size]]

    @torch.no_grad()
    def show_predictions(self, model, autocast) -> str:
        """A few validation sentences with the predicted label and its probability."""
        batch = next(self.eval_batches("val", 1))
        model.eval()
        with autocast:
            logits, _ = model(batch["input_ids"][:4], attention_mask=batch["attention_mask"][:4])
        model.train()
        probabilities = logits.float().softmax(-1)
        lines = []
        for row in range(len(probabilities)):
            label = int(probabilities[row].argmax())
            ids = batch["input_ids"][row][batch["attention_mask"][row]].tolist()[1:-1]
            text = " ".join(self.vocab.decode_tokens(ids)).replace(" ##", "")
            lines.append(f"  {label} ({probabilities[row, label]:.2f}, true {int(batch['labels'][row])}): {text}")
        return "predictions:\n" + "\n".join(lines)
