"""Sentence embeddings' data (task-type = embed), in the layouts sentence-transformers and BEIR
publish, read and checked (a bad value is one line naming the file and the line or row):
- training pairs: `anchor`, `positive` and, optionally, a hard `negative` per row, in JSON lines
  (`train.jsonl`) or Hugging Face parquet (`train-00000-of-0000N.parquet`);
- similarity: sentence pairs scored by people, in STS-B's layout (GLUE's TSV or parquet: glue_data.py
  reads them), the validation and test splits;
- retrieval: BEIR's layout, `retrieval/corpus.jsonl` (`_id`, `title`, `text`), `retrieval/queries.jsonl`
  (`_id`, `text`) and the relevance judgements `retrieval/qrels/dev.tsv` and `test.tsv` (`query-id`,
  `corpus-id`, `score`).
All under datasets/embed/ (or the fine-tuning data folder itself).
"""
import csv
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from errors import UserError
from tasks import glue_data
from tasks.glue_tasks import glue_task

PAIR_COLUMNS = ("anchor", "positive")
NEGATIVE = "negative"
QRELS_FILES = {"validation": ("dev.tsv", "validation.tsv"), "test": ("test.tsv",)}


def folder_of(directory: Path) -> Path:
    """datasets/embed/ where it is there, else the fine-tuning data folder itself."""
    directory = Path(directory)
    return directory / "embed" if (directory / "embed").is_dir() else directory


# ----------------------------------------------------------------------------- training pairs

@dataclass
class Pairs:
    """Training rows: each anchor's positive, and its hard negative where the data has them."""
    anchors: list[str]
    positives: list[str]
    negatives: list[str] | None
    files: tuple[Path, ...]

    def __len__(self) -> int:
        return len(self.anchors)

    def select(self, rows: np.ndarray) -> "Pairs":
        pick = lambda texts: None if texts is None else [texts[row] for row in rows]  # noqa: E731
        return Pairs(pick(self.anchors), pick(self.positives), pick(self.negatives), self.files)

    @property
    def columns(self) -> list[list[str]]:
        return [self.anchors, self.positives] + ([self.negatives] if self.negatives is not None else [])


def pair_files(directory: Path) -> list[Path]:
    """The training split's files: parquet shards where there are, else train.jsonl."""
    folder = folder_of(directory)
    files = glue_data.parquet_shards(folder, "train") or ([folder / "train.jsonl"]
                                                          if (folder / "train.jsonl").is_file() else [])
    if not files:
        raise UserError(f"{folder}: no embed training pairs: expected train.jsonl or train-00000-of-00001.parquet "
                        f"with columns anchor, positive (and optionally negative)")
    return files


def read_pairs(directory: Path) -> Pairs:
    files = pair_files(directory)
    folder = files[0].parent
    parts = [read_parquet_pairs(path) if path.suffix == ".parquet" else read_jsonl_pairs(path) for path in files]
    if len({part.negatives is None for part in parts}) > 1:
        raise UserError(f"{folder}: some training files have a negative column and some do not")
    negatives = None if parts[0].negatives is None else [text for part in parts for text in part.negatives]
    return Pairs([text for part in parts for text in part.anchors], [text for part in parts for text in part.positives],
                 negatives, tuple(files))


def read_jsonl_pairs(path: Path) -> Pairs:
    rows = []
    try:
        with path.open(encoding="utf-8-sig") as file:
            for number, line in enumerate(file, 1):
                if line.strip():
                    rows.append((f"line {number}", json_object(path, number, line)))
    except (OSError, UnicodeDecodeError) as error:
        raise UserError(f"{path}: not readable ({error.__class__.__name__})") from None
    return checked_pairs(path, rows)


def json_object(path: Path, number: int, line: str) -> dict:
    try:
        value = json.loads(line)
    except (ValueError, RecursionError):  # RecursionError: nested thousands deep
        raise UserError(f"{path}: line {number}: not JSON") from None
    if not isinstance(value, dict):
        raise UserError(f"{path}: line {number}: a JSON {type(value).__name__}; expected an object")
    return value


def read_parquet_pairs(path: Path) -> Pairs:
    try:
        table = pq.read_table(path)
    except (OSError, pa.ArrowException) as error:
        raise UserError(f"{path}: not a readable parquet file ({error.__class__.__name__})") from None
    for name in PAIR_COLUMNS:
        if name not in table.column_names:
            raise UserError(f"{path}: missing column {name} (columns: {', '.join(table.column_names)})")
    names = [name for name in (*PAIR_COLUMNS, NEGATIVE) if name in table.column_names]
    columns = [table.column(name).to_pylist() for name in names]
    return checked_pairs(path, [(f"row {number}", dict(zip(names, values)))
                                for number, values in enumerate(zip(*columns))])


def checked_pairs(path: Path, rows: list[tuple[str, dict]]) -> Pairs:
    """Every row with a non-empty anchor and positive; a negative in every row or in none."""
    if not rows:
        raise UserError(f"{path}: no training pair")
    with_negative = NEGATIVE in rows[0][1]
    for place, row in rows:
        for name in (*PAIR_COLUMNS, NEGATIVE) if with_negative else PAIR_COLUMNS:
            if not isinstance(row.get(name), str) or not row[name].strip():
                problem = "missing" if name not in row else f"{row[name]!r}; expected a non-empty text"
                raise UserError(f"{path}: {place}: {name} {problem}")
        if NEGATIVE in row and not with_negative:
            raise UserError(f"{path}: {place}: a negative, unlike the first row: give one in every row or in none")
    texts = lambda name: [row[name] for _, row in rows]  # noqa: E731
    return Pairs(texts("anchor"), texts("positive"), texts(NEGATIVE) if with_negative else None, (path,))


# ----------------------------------------------------------------------------- similarity (STS-B's layout)

def has_similarity(directory: Path, split: str) -> bool:
    """Whether STS-B-layout pairs of this split are there (stsb/, STS-B/ or the folder itself)."""
    try:
        glue_data.find_split_files(folder_of(directory), glue_task("stsb"), split)
    except UserError:
        return False
    return True


def read_similarity(directory: Path, split: str) -> glue_data.Examples | None:
    """A split's scored pairs; None where there are none, or their scores are hidden (GLUE's STS-B test split)."""
    if not has_similarity(directory, split):
        return None
    examples = glue_data.read_split(folder_of(directory), "stsb", split)
    return None if examples.labels_hidden else examples


# ----------------------------------------------------------------------------- retrieval (BEIR's layout)

@dataclass
class Retrieval:
    """Queries, the documents searched, and each query's relevant documents with their grades."""
    queries: list[str]
    documents: list[str]
    relevant: list[dict[int, float]]  # per query: document number -> relevance (above 0)
    files: tuple[Path, ...]


def qrels_file(directory: Path, split: str) -> Path | None:
    folder = folder_of(directory) / "retrieval" / "qrels"
    return next((folder / name for name in QRELS_FILES[split] if (folder / name).is_file()), None)


def read_retrieval(directory: Path, split: str) -> Retrieval:
    """The queries judged in the split's qrels, and the whole corpus."""
    qrels = qrels_file(directory, split)
    folder = qrels.parent.parent
    judged = read_qrels(qrels)
    queries = read_texts(folder / "queries.jsonl", with_title=False)
    corpus = read_texts(folder / "corpus.jsonl", with_title=True)
    document_number = {identifier: number for number, identifier in enumerate(corpus)}
    kept_queries, relevant = [], []
    for query, grades in judged.items():
        if query not in queries:
            raise UserError(f"{qrels}: query-id {query} is not in {folder / 'queries.jsonl'}")
        missing = next((document for document in grades if document not in document_number), None)
        if missing is not None:
            raise UserError(f"{qrels}: corpus-id {missing} is not in {folder / 'corpus.jsonl'}")
        positive = {document_number[document]: grade for document, grade in grades.items() if grade > 0}
        if positive:  # a query with no relevant document scores nothing (BEIR leaves it out too)
            kept_queries.append(queries[query])
            relevant.append(positive)
    if not relevant:
        raise UserError(f"{qrels}: no query has a relevant document (a score above 0)")
    return Retrieval(kept_queries, list(corpus.values()), relevant,
                     (qrels, folder / "queries.jsonl", folder / "corpus.jsonl"))


def read_qrels(path: Path) -> dict[str, dict[str, float]]:
    """query-id -> corpus-id -> score, from a TSV with BEIR's header."""
    try:
        with path.open(encoding="utf-8-sig", newline="") as file:
            rows = list(csv.reader(file, delimiter="\t"))
    except (OSError, UnicodeDecodeError) as error:
        raise UserError(f"{path}: not readable ({error.__class__.__name__})") from None
    if not rows or rows[0][:3] != ["query-id", "corpus-id", "score"]:
        raise UserError(f"{path}: expected the header query-id, corpus-id, score (BEIR's qrels)")
    judged: dict[str, dict[str, float]] = {}
    for number, row in enumerate(rows[1:], 2):
        score = glue_data.as_number(row[2]) if len(row) >= 3 else None
        if score is None:
            raise UserError(f"{path}: line {number}: expected query-id, corpus-id and a numeric score")
        judged.setdefault(row[0], {})[row[1]] = score
    return judged


def read_texts(path: Path, with_title: bool) -> dict[str, str]:
    """_id -> text of a BEIR JSON lines file; a document's title goes before its text."""
    texts = {}
    try:
        with path.open(encoding="utf-8-sig") as file:
            for number, line in enumerate(file, 1):
                if not line.strip():
                    continue
                row = json_object(path, number, line)
                text = row.get("text")
                if not isinstance(row.get("_id"), (str, int)) or not isinstance(text, str):
                    raise UserError(f"{path}: line {number}: expected _id and text")
                title = row.get("title") if with_title else None
                text = f"{title} {text}" if isinstance(title, str) and title.strip() else text
                if not text.strip():
                    raise UserError(f"{path}: line {number}: an empty text")
                texts[str(row["_id"])] = text
    except FileNotFoundError:
        raise UserError(f"{path}: missing (BEIR's layout: corpus.jsonl and queries.jsonl beside qrels/)") from None
    except (OSError, UnicodeDecodeError) as error:
        raise UserError(f"{path}: not readable ({error.__class__.__name__})") from None
    return texts
