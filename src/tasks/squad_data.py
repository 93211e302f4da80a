"""Extractive question answering's data (SQuAD v1.1 and v2.0): questions on a context with the
answers' texts and character starts, read from SQuAD's JSON or Hugging Face's parquet layout and
checked (a bad value is one line naming the file and the question), then encoded as BERT reads them:
`[CLS] question [SEP] context window [SEP]`, a long context cut into windows that overlap by
doc-stride pieces (the windows of transformers' run_qa.py, its tokenizer's overflow), the answer's
first and last piece in each window that holds it whole, else [CLS]. Unlike run_qa, a question is
cut at max-query-length pieces (run_qa keeps it whole).
"""
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from errors import UserError
from tasks.glue_data import parquet_shards

# Where a split lives: SQuAD's own file names, then plain ones.
JSON_FILES = {"train": ("train-v2.0.json", "train-v1.1.json", "train.json"),
              "validation": ("dev-v2.0.json", "dev-v1.1.json", "dev.json", "validation.json"),
              "test": ("test-v2.0.json", "test-v1.1.json", "test.json")}


@dataclass
class Questions:
    """A split in memory: each question with its context and gold answers (text, character start)."""
    ids: list[str]
    questions: list[str]
    contexts: list[str]
    answers: list[list[tuple[str, int]]]  # empty: unanswerable (v2.0)
    files: tuple[Path, ...]

    def __len__(self) -> int:
        return len(self.ids)

    def select(self, rows: np.ndarray) -> "Questions":
        pick = lambda values: [values[row] for row in rows]  # noqa: E731
        return Questions(pick(self.ids), pick(self.questions), pick(self.contexts), pick(self.answers), self.files)


def find_files(directory: Path, task: str, split: str) -> list[Path]:
    """A split's files under directory/TASK (squad or squad_v2) or directory: parquet shards win."""
    for folder in (directory / task, directory):
        shards = parquet_shards(folder, split) if folder.is_dir() else []
        if shards:
            return shards
    for folder in (directory / task, directory):
        for name in JSON_FILES[split]:
            if (folder / name).is_file():
                return [folder / name]
    raise UserError(f"{directory}: no {task} {split} split: expected {task}/{split}-00000-of-00001.parquet "
                    f"(Hugging Face) or {task}/{JSON_FILES[split][1 if task == 'squad' else 0]} (SQuAD's JSON)")


def read_split(directory: Path, task: str, split: str) -> Questions:
    """A split's questions, checked; squad (v1.1) requires an answer to every question."""
    files = find_files(Path(directory), task, split)
    parts = [read_parquet(path) if path.suffix == ".parquet" else read_json(path) for path in files]
    for path, part in zip(files, parts):
        unanswered = next((qid for qid, answers in zip(part.ids, part.answers) if not answers), None)
        if task == "squad" and unanswered is not None:
            raise UserError(f"{path}: question {unanswered} has no answer; squad (v1.1) answers every question "
                            f"(task-type = squad_v2 takes unanswerable ones)")
    check_unique_ids(files, parts)
    return Questions(*(sum((getattr(part, name) for part in parts), []) for name in
                       ("ids", "questions", "contexts", "answers")), tuple(files))


def check_unique_ids(files: list[Path], parts: list[Questions]) -> None:
    """Every question's id once over the split's files: predictions and scores are keyed by id, so a
    second question of one id would be scored against the other's gold answers."""
    seen = set()
    for path, part in zip(files, parts):
        for qid in part.ids:
            if qid in seen:
                raise UserError(f"{path}: question id {qid} is used twice; SQuAD's ids name one question each")
            seen.add(qid)


def read_json(path: Path) -> Questions:
    """SQuAD's layout: data -> paragraphs -> context and qas (id, question, answers, is_impossible)."""
    try:
        document = json.loads(path.read_text(encoding="utf-8-sig"))
        paragraphs = [(paragraph["context"], qa) for article in document["data"]
                      for paragraph in article["paragraphs"] for qa in paragraph["qas"]]
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as error:  # RecursionError: nested thousands deep
        raise UserError(f"{path}: not a readable SQuAD JSON file ({error.__class__.__name__})") from None
    except (KeyError, TypeError) as error:
        raise UserError(f"{path}: not SQuAD's layout (data -> paragraphs -> context, qas): {error} missing") from None
    rows = []
    for context, qa in paragraphs:
        if not isinstance(qa, dict) or not {"id", "question"} <= qa.keys():
            raise UserError(f"{path}: a question without id or question under context {context[:40]!r}")
        answers = [] if qa.get("is_impossible") else [(answer["text"], answer["answer_start"])
                                                       for answer in qa.get("answers", [])]
        rows.append((str(qa["id"]), qa["question"], context, answers))
    return checked(path, rows)


def read_parquet(path: Path) -> Questions:
    """Hugging Face's layout: id, question, context, answers {text: [...], answer_start: [...]}."""
    try:
        table = pq.read_table(path)
    except (OSError, pa.ArrowException) as error:
        raise UserError(f"{path}: not a readable parquet file ({error.__class__.__name__})") from None
    for name in ("id", "question", "context", "answers"):
        if name not in table.column_names:
            raise UserError(f"{path}: missing column {name} (columns: {', '.join(table.column_names)})")
    rows = []
    for qid, question, context, answers in zip(*(table.column(name).to_pylist()
                                                 for name in ("id", "question", "context", "answers"))):
        if not isinstance(answers, dict) or len(answers.get("text") or []) != len(answers.get("answer_start") or []):
            raise UserError(f"{path}: question {qid}: answers must hold as many text as answer_start")
        rows.append((str(qid), question, context, list(zip(answers["text"], answers["answer_start"]))))
    return checked(path, rows)


def checked(path: Path, rows: list[tuple]) -> Questions:
    """Every question non-empty, every context too, every answer a text inside the context where its
    answer_start says."""
    for qid, question, context, answers in rows:
        if not isinstance(question, str) or not question.strip():
            raise UserError(f"{path}: question {qid}: an empty question")
        if not isinstance(context, str) or not context.strip():
            raise UserError(f"{path}: question {qid}: an empty context")
        for text, start in answers:
            problem = misplaced_answer(context, text, start)
            if problem:
                raise UserError(f"{path}: question {qid}: {problem}")
    if not rows:
        raise UserError(f"{path}: no question")
    return Questions(*(list(column) for column in zip(*rows)), (path,))


def misplaced_answer(context: str, text, start) -> str | None:
    """Why an answer is not a text inside the context at answer_start (as SQuAD's scripts assume), or
    None. A negative start would slice from the context's end, and an empty text has no piece to
    label: both would train as unanswerable."""
    if not isinstance(text, str) or not text.strip():
        return f"an answer with empty text {text!r} at answer_start {start}"
    if isinstance(start, bool) or not isinstance(start, int) or not 0 <= start <= len(context) - len(text):
        return f"answer_start {start!r} of {text!r} is not inside the context ({len(context)} characters)"
    if context[start:start + len(text)] != text:
        return f"answer_start {start} does not point at its text {text!r} in the context"
    return None


# ----------------------------------------------------------------------------- encoding

@dataclass
class EncodedQuestions:
    """Every window of every question as `[CLS] question [SEP] window [SEP]`, end to end (ragged),
    with the first position of the window in it, the window's first context piece, the question
    it belongs to, and the answer's start and end positions in it (0, [CLS], where it holds none).
    offsets[q] are the character spans of question q's context pieces."""
    tokens: np.ndarray  # int64
    segments: np.ndarray  # int8: 0 for [CLS] question [SEP], 1 after
    starts: np.ndarray  # window i is tokens[starts[i]:starts[i + 1]]
    questions: np.ndarray  # the question of each window
    window_offsets: np.ndarray  # position of the window's first context piece in the window's tokens
    first_pieces: np.ndarray  # the window's first context piece, as a number among the context's pieces
    answer_start: np.ndarray
    answer_end: np.ndarray
    offsets: list[np.ndarray]  # per question, [pieces, 2] character spans of its context's pieces

    def __len__(self) -> int:
        return len(self.questions)

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.starts)


def context_windows(pieces: int, room: int, overlap: int) -> list[tuple[int, int]]:
    """(first, end) piece ranges of at most `room` pieces covering `pieces`, each starting
    room - overlap after the one before (overlap: run_qa's doc_stride), up to the first that reaches
    the end. This is how tokenizers cuts an overflowing second text (run_qa.py's windows): the last
    window holds what remains, often fewer than `room` pieces."""
    step = room - overlap
    windows = [(0, min(room, pieces))]
    while windows[-1][1] < pieces:
        start = windows[-1][0] + step
        windows.append((start, min(start + room, pieces)))
    return windows


def answer_pieces(offsets: np.ndarray, start: int, end: int) -> tuple[int, int] | None:
    """The first and last context pieces that an answer's characters [start, end) overlap."""
    inside = np.nonzero((offsets[:, 1] > start) & (offsets[:, 0] < end))[0]
    return (int(inside[0]), int(inside[-1])) if len(inside) else None


def encode_questions(vocab, data: Questions, seq_len: int, overlap: int, max_query: int) -> EncodedQuestions:
    """The windows of every question (see EncodedQuestions); the first gold answer is the label."""
    question_pieces = [ids[:max_query] for ids in vocab.encode(data.questions)]
    contexts = vocab.tokenizer.encode_batch(data.contexts, add_special_tokens=False)
    columns = {name: [] for name in ("tokens", "segments", "lengths", "questions", "window_offsets", "first_pieces",
                                     "answer_start", "answer_end")}
    offsets = []
    for number, (question, context) in enumerate(zip(question_pieces, contexts)):
        spans = np.asarray(context.offsets, dtype=np.int64).reshape(-1, 2)
        offsets.append(spans)
        room = seq_len - len(question) - 3
        if room <= overlap:
            raise UserError(f"seq-len = {seq_len} leaves {room} pieces of context beside a question of "
                            f"{len(question)}; doc-stride must be below that (or max-query-length smaller)")
        gold = data.answers[number][0] if data.answers[number] else None
        answer = answer_pieces(spans, gold[1], gold[1] + len(gold[0])) if gold else None
        for first, end in context_windows(len(spans), room, overlap):
            window_offset = len(question) + 2
            columns["tokens"].append([vocab.cls_id, *question, vocab.sep_id, *context.ids[first:end], vocab.sep_id])
            columns["segments"].append([0] * window_offset + [1] * (end - first + 1))
            columns["lengths"].append(window_offset + end - first + 1)
            inside = answer is not None and first <= answer[0] and answer[1] < end
            columns["answer_start"].append(answer[0] - first + window_offset if inside else 0)
            columns["answer_end"].append(answer[1] - first + window_offset if inside else 0)
            columns["questions"].append(number)
            columns["window_offsets"].append(window_offset)
            columns["first_pieces"].append(first)
    flat = lambda name, dtype: np.asarray([item for row in columns[name] for item in row], dtype=dtype)  # noqa: E731
    array = lambda name: np.asarray(columns[name], dtype=np.int64)  # noqa: E731
    return EncodedQuestions(flat("tokens", np.int64), flat("segments", np.int8),
                            np.r_[0, np.cumsum(columns["lengths"])].astype(np.int64), array("questions"),
                            array("window_offsets"), array("first_pieces"), array("answer_start"),
                            array("answer_end"), offsets)
