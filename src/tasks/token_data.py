"""Token classification's data (named entities): sentences of words with a tag each, read from the
CoNLL text layout or Hugging Face's parquet layout, checked (a bad value is one line naming the file
and line or row), and encoded as BERT reads them: word pieces in windows of seq-len, each word's
label on its first piece.

CoNLL text: a word per line, its columns separated by spaces or tabs, a blank line between
sentences, `-DOCSTART-` lines between documents (skipped). Parquet: a `tokens` column of word lists
and a tag column of integer lists, whose names Hugging Face's metadata carries (or `labels` gives).
"""
import json
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from architecture import IGNORE_INDEX
from config import check_unique_names
from errors import UserError
from tasks.glue_data import parquet_shards

# Where a split lives in the CoNLL text layout: the names of Hugging Face's conll2003 files, of
# the CoNLL-2003 distribution (eng.testa is the dev split) and the .conll of WNUT's.
TEXT_FILES = {"train": ("train.txt", "train.conll", "eng.train"),
              "validation": ("validation.txt", "valid.txt", "dev.txt", "dev.conll", "eng.testa"),
              "test": ("test.txt", "test.conll", "eng.testb")}
# conll2003's column names for the text layout's columns: word, part of speech, chunk, entity.
TEXT_COLUMNS = {"tokens": 1, "pos_tags": 2, "chunk_tags": 3}
DOCUMENT_START = "-DOCSTART-"


@dataclass
class TaggedSentences:
    """A split in memory: each sentence's words and tag ids, the tags' names, where it came from."""
    words: list[list[str]]
    tags: list[list[int]]
    label_names: tuple[str, ...]
    files: tuple[Path, ...]

    def __len__(self) -> int:
        return len(self.words)

    def tag_names(self, sentence: int) -> list[str]:
        return [self.label_names[tag] for tag in self.tags[sentence]]

    def select(self, rows: np.ndarray) -> "TaggedSentences":
        return TaggedSentences([self.words[row] for row in rows], [self.tags[row] for row in rows],
                               self.label_names, self.files)


def find_files(directory: Path, split: str) -> list[Path]:
    """A split's files under directory/ner, else directory: parquet shards (they win), else a text
    file. ner/ first in either layout: directory itself may hold another task's parquet (SST-2's)."""
    for folder in (directory / "ner", directory):
        shards = parquet_shards(folder, split) if folder.is_dir() else []
        if shards:
            return shards
        for name in TEXT_FILES[split]:
            if (folder / name).is_file():
                return [folder / name]
    raise UserError(f"{directory}: no token classification {split} split: expected "
                    f"ner/{split}-00000-of-00001.parquet (Hugging Face) or ner/{TEXT_FILES[split][0]} (CoNLL text; "
                    f"also {', '.join(TEXT_FILES[split][1:])})")


class ReadTags(NamedTuple):
    """A file's sentences as read: words, tag names and where each tag stands (`unit` `place`)."""
    words: list[list[str]]
    tags: list[list[str]]
    places: list[list[int]]
    unit: str  # line (text) or row (parquet)
    declared: tuple[str, ...]  # a parquet file's names of its tag ids, in their order; () in text


def read_split(directory: Path, split: str, tag_column: str, label_names: tuple[str, ...] = (),
               id_names: tuple[str, ...] = (), whose: str = "the model's") -> TaggedSentences:
    """A split's sentences, each tag matched by name to label_names: the model's labels in its order
    (a checkpoint's, `labels` or the training split's); () for the training split of a new model,
    which names them itself (a text layout's tags, O first, then sorted; a parquet file's metadata).
    id_names: the names of a parquet file's tag ids (`labels`), over its metadata. whose: the labels'
    owner, as an error names them."""
    files = find_files(Path(directory), split)
    if files[0].suffix == ".parquet":
        parts = [read_parquet(path, tag_column, id_names) for path in files]
        names = label_names or parts[0].declared
    else:
        parts = [read_text(files[0], tag_column)]
        names = label_names or ordered_labels({tag for sentence in parts[0].tags for tag in sentence})
    words, tags = [], []
    for path, part in zip(files, parts):
        words += part.words
        tags += tag_ids(path, part, names, whose)
    return TaggedSentences(words, tags, names, tuple(files))


def tag_ids(path: Path, part: ReadTags, names: tuple[str, ...], whose: str) -> list[list[int]]:
    """Each sentence's tags as ids of `names`, by name: the ids' order in a file never decides what a
    tag means. A tag outside `names` is one line naming each such tag where it first stands."""
    ids = {name: number for number, name in enumerate(names)}
    unknown = {}
    for sentence, places in zip(part.tags, part.places):
        for tag, place in zip(sentence, places):
            if tag not in ids:
                unknown.setdefault(tag, place)
    if unknown:
        shown = [f"{tag} ({part.unit} {place})" for tag, place in list(unknown.items())[:8]]
        more = f" and {len(unknown) - 8} more" if len(unknown) > 8 else ""
        raise UserError(f"{path}: {'tag' if len(unknown) == 1 else 'tags'} {', '.join(shown)}{more} "
                        f"{'is' if len(unknown) == 1 else 'are'} not among {whose} labels ({', '.join(names)})")
    return [[ids[tag] for tag in sentence] for sentence in part.tags]


def ordered_labels(tags: set[str]) -> tuple[str, ...]:
    """O first, then by entity type, each type's B- before its I- (and E-, S-)."""
    def key(tag: str):
        prefix, _, kind = tag.partition("-")
        return (kind or prefix, "BIES".find(prefix) if kind else -1)
    return ("O",) + tuple(sorted(tags - {"O"}, key=key))


def text_column(tag_column: str, path: Path) -> int | None:
    """The 0-based column of the tags in a text file: a name of TEXT_COLUMNS, a number from 1 (the
    word), or None for ner_tags: the last column."""
    if tag_column == "ner_tags":
        return None
    if tag_column in TEXT_COLUMNS:
        return TEXT_COLUMNS[tag_column] - 1
    if tag_column.isdigit() and int(tag_column) >= 2:
        return int(tag_column) - 1
    raise UserError(f"{path}: tag-column = {tag_column}: in a CoNLL text file, expected ner_tags (the last column), "
                    f"pos_tags, chunk_tags or a column number from 2")


def read_text(path: Path, tag_column: str) -> ReadTags:
    """Words, tag names and line numbers of each sentence of a CoNLL text file."""
    column = text_column(tag_column, path)
    try:
        text = path.read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as error:
        raise UserError(f"{path}: cannot read ({error})") from None
    sentences, current = [], []  # current: (word, tag, line number) of the sentence being read
    for number, line in enumerate(text.splitlines(), start=1):
        fields = line.split()
        if not fields or fields[0] == DOCUMENT_START:
            if current:
                sentences.append(current)
            current = []
            continue
        if len(fields) < (2 if column is None else column + 1):
            raise UserError(f"{path}: line {number}: {len(fields)} column(s), expected a word and its tag"
                            + ("" if column is None else f" in column {column + 1}"))
        current.append((fields[0], fields[-1 if column is None else column], number))
    if current:
        sentences.append(current)
    if not sentences:
        raise UserError(f"{path}: no sentence (expected a word and its tag per line)")
    words, tags, lines = ([[entry[part] for entry in sentence] for sentence in sentences] for part in range(3))
    return ReadTags(words, tags, lines, "line", ())


def read_parquet(path: Path, tag_column: str, id_names: tuple[str, ...]) -> ReadTags:
    """Words and tag names of each row, the ids named by id_names, else by the file's metadata."""
    try:
        table = pq.read_table(path)
    except (OSError, pa.ArrowException) as error:
        raise UserError(f"{path}: not a readable parquet file ({error.__class__.__name__})") from None
    for name in ("tokens", tag_column):
        if name not in table.column_names:
            raise UserError(f"{path}: missing column {name} (columns: {', '.join(table.column_names)})")
    names = id_names or metadata_label_names(table.schema, tag_column)
    check_unique_names(names, f"{path}: the Hugging Face metadata of {tag_column}")
    if not names:
        raise UserError(f"{path}: column {tag_column} holds tag ids without their names (no Hugging Face "
                        f"metadata): give them in order with labels = O,B-PER,I-PER,...")
    words, tags = table.column("tokens").to_pylist(), table.column(tag_column).to_pylist()
    for row, (sentence, sentence_tags) in enumerate(zip(words, tags), start=1):
        if not isinstance(sentence, list) or not isinstance(sentence_tags, list):
            raise UserError(f"{path}: row {row}: tokens and {tag_column} must be lists")
        if len(sentence) != len(sentence_tags):
            raise UserError(f"{path}: row {row}: {len(sentence)} tokens but {len(sentence_tags)} tags")
        for tag in sentence_tags:
            if not isinstance(tag, int) or not 0 <= tag < len(names):
                raise UserError(f"{path}: row {row}: tag {tag!r} in {tag_column} is not a label id (0 to "
                                f"{len(names) - 1}: {', '.join(names)})")
        if any(not isinstance(word, str) or not word for word in sentence):
            raise UserError(f"{path}: row {row}: an empty or missing word in tokens")
    kept = [row for row, sentence in enumerate(words) if sentence]
    return ReadTags([words[row] for row in kept], [[names[tag] for tag in tags[row]] for row in kept],
                    [[row + 1] * len(words[row]) for row in kept], "row", names)


def metadata_label_names(schema: pa.Schema, column: str) -> tuple[str, ...]:
    """The ClassLabel names Hugging Face's datasets write into a parquet file's metadata, if any."""
    try:
        features = json.loads((schema.metadata or {})[b"huggingface"])["info"]["features"]
        return tuple(features[column]["feature"]["names"])
    except (KeyError, TypeError, ValueError):
        return ()


# ----------------------------------------------------------------------------- encoding

def windows(length: int, width: int) -> list[tuple[int, int]]:
    """(start, end) of the windows that cover `length` pieces with at most `width` each: one where it
    fits, else windows every width // 2 pieces, the last ending at the end (so each piece but the
    first and last few sits well inside one of them)."""
    if length <= width:
        return [(0, length)]
    stride = max(1, width // 2)
    starts = list(range(0, length - width, stride)) + [length - width]
    return [(start, start + width) for start in starts]


def best_windows(spans: list[tuple[int, int]], length: int) -> np.ndarray:
    """For each piece, the window where it has the most context on its nearer side (BERT's rule for
    SQuAD's windows); the earlier one on a tie."""
    best = np.zeros(length, dtype=np.int64)
    score = np.full(length, -1)
    for number, (start, end) in enumerate(spans):
        pieces = np.arange(start, end)
        context = np.minimum(pieces - start, end - 1 - pieces)
        better = context > score[start:end]
        best[start:end][better], score[start:end][better] = number, context[better]
    return best


@dataclass
class EncodedWindows:
    """Every window of every sentence as `[CLS] pieces [SEP]`, stored end to end (ragged), with each
    position's label (IGNORE_INDEX but on a word's first piece) and the word it scores (-1 where it
    scores none: special tokens, later pieces, and a first piece that another window scores)."""
    tokens: np.ndarray  # int64
    labels: np.ndarray  # int64
    scored_words: np.ndarray  # int64
    offsets: np.ndarray  # window i is tokens[offsets[i]:offsets[i + 1]]
    sentences: np.ndarray  # window i is of sentence sentences[i]

    def __len__(self) -> int:
        return len(self.sentences)

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)


def encode_sentences(vocab, data: TaggedSentences, seq_len: int) -> EncodedWindows:
    """Word pieces of each sentence in windows of seq_len - 2 pieces; a word without any piece (the
    vocabulary spells nothing of it) has no label and is predicted O."""
    width = seq_len - 2
    encodings = vocab.tokenizer.encode_batch(data.words, is_pretokenized=True, add_special_tokens=False)
    tokens, labels, scored, lengths, sentences = [], [], [], [], []
    for sentence, (encoding, tags) in enumerate(zip(encodings, data.tags)):
        word_ids = np.array([-1 if word is None else word for word in encoding.word_ids], dtype=np.int64)
        first = np.r_[True, word_ids[1:] != word_ids[:-1]] & (word_ids >= 0)
        piece_labels = np.where(first, np.asarray(tags, dtype=np.int64)[np.maximum(word_ids, 0)], IGNORE_INDEX)
        spans = windows(len(word_ids), width)
        best = best_windows(spans, len(word_ids))
        for number, (start, end) in enumerate(spans):
            keep = slice(start, end)
            tokens.append(np.r_[vocab.cls_id, encoding.ids[keep], vocab.sep_id])
            labels.append(np.r_[IGNORE_INDEX, piece_labels[keep], IGNORE_INDEX])
            own = first[keep] & (best[keep] == number)
            scored.append(np.r_[-1, np.where(own, word_ids[keep], -1), -1])
            lengths.append(end - start + 2)
            sentences.append(sentence)
    offsets = np.r_[0, np.cumsum(lengths)].astype(np.int64)
    join = lambda parts: np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, np.int64)  # noqa: E731
    return EncodedWindows(join(tokens), join(labels), join(scored), offsets, np.asarray(sentences, dtype=np.int64))
