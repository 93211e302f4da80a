"""The documents of the inputs named on a command line (train_vocab.py, tokenize_text.py, the shard
preparers): plain text (.txt, .gz, .bz2, .xz), JSON lines, parquet, a Hugging Face `datasets` folder,
a directory, or standard input (`-`). Each record is a document; a bad one is a one-line error
naming its file and line, or, with --skip-bad-records, skipped and counted.
"""
import argparse
import bz2
import codecs
import contextlib
import glob
import gzip
import hashlib
import json
import lzma
import re
import sys
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from tqdm import tqdm

from errors import UserError

FORMATS = ("text", "jsonl", "parquet", "arrow")
FORMAT_OF_SUFFIX = {".jsonl": "jsonl", ".json": "jsonl", ".parquet": "parquet", ".arrow": "arrow"}
OPENERS = {".gz": gzip.open, ".bz2": bz2.open, ".xz": lzma.open}
# Text read and tokenized at once. Measured on the demo corpus x 4 with 2 workers: chunks of 1 MiB
# prepare it in 26 s with 149 MiB in the largest process, chunks of 16 MiB in 28 s with 511 MiB
# (chunks in flight and their packing transients dominate the memory).
DEFAULT_CHUNK_MB = 1.0
READ_ERRORS = (OSError, EOFError, zlib.error, lzma.LZMAError)  # gzip.BadGzipFile is an OSError
STDIN = "-"
ROWS_PER_BATCH = 4096  # parquet and arrow records read at once

# The tokenizer needs ~150 bytes a token of a string it encodes: a longer line is cut at a space,
# so a one-line corpus (text8, 100 MB) is tokenized in bounded memory. Words do not cross spaces,
# so the ids are the same.
MAX_LINE_CHARS = 1 << 16

# JSON may escape half of a UTF-16 pair alone ("\ud800", common in web dumps); Python reads it into
# a string that no UTF-8 encoder, the tokenizer's included, accepts.
LONE_SURROGATE = re.compile("[\ud800-\udfff]")


@dataclass(frozen=True)
class InputFile:
    """One input: a file and how to read it; path None is standard input."""
    path: Path | None
    format: str

    def __str__(self) -> str:
        return STDIN if self.path is None else str(self.path)

    @property
    def size(self) -> int:
        return 0 if self.path is None else self.path.stat().st_size


def content_hashes(inputs: list[InputFile], chunk_bytes: int = 8 << 20) -> list[str | None]:
    """sha256 of each input's bytes as stored (None for standard input): what names an input in a
    preparation, so copies on several machines (new paths, new modification times) agree and a
    `touch` prepares nothing again. Reading costs a small share of tokenizing: 2.2 GB/s a core."""
    hashes = []
    with tqdm(total=sum(each.size for each in inputs), unit="B", unit_scale=True, desc="reading the inputs",
              disable=None) as bar:
        for each in inputs:
            if each.path is None:
                hashes.append(None)
                continue
            digest = hashlib.sha256()
            with each.path.open("rb") as file:
                while chunk := file.read(chunk_bytes):
                    digest.update(chunk)
                    bar.update(len(chunk))
            hashes.append(digest.hexdigest())
    return hashes


def add_input_arguments(parser: argparse.ArgumentParser, what: str = "documents") -> None:
    """-i and the options that say how to read it, the same in every script."""
    parser.add_argument("-i", "--input", nargs="+", required=True,
                        help=f"{what}: files, globs, directories (every file in them), a Hugging Face datasets "
                             f"folder (save_to_disk), or - for standard input")
    parser.add_argument("--format", choices=FORMATS,
                        help="how to read every input (default: by its name: .jsonl/.json(.gz) JSON lines, "
                             ".parquet, .arrow, anything else text, one document a line; .gz/.bz2/.xz decompressed)")
    parser.add_argument("--text-field", default="text",
                        help="the field (jsonl) or column (parquet, arrow) holding the text (default text)")
    parser.add_argument("--skip-bad-records", action="store_true",
                        help="skip and count records that are not JSON, lack the field or hold no string, "
                             "rather than stopping at the first")


# ---------------------------------------------------------------------------------------------
# Finding the inputs


def format_of(path: Path) -> str:
    """The format a file's name says: its last suffix before a compression suffix."""
    suffixes = [suffix.lower() for suffix in path.suffixes]
    if suffixes and suffixes[-1] in OPENERS:
        suffixes.pop()
    return FORMAT_OF_SUFFIX.get(suffixes[-1] if suffixes else "", "text")


def find_inputs(patterns, format: str | None = None) -> list[InputFile]:
    """The inputs named on the command line, globs and directories expanded; each must exist and
    hold something, before any work starts."""
    inputs = []
    for pattern in patterns:
        if pattern == STDIN:
            inputs.append(InputFile(None, format or "text"))
            continue
        matches = sorted(glob.glob(pattern)) if is_a_pattern(pattern) else [pattern]
        if not matches:
            raise UserError(f"{pattern}: no file matches this pattern")
        for match in matches:
            inputs.extend(inputs_in(Path(match), format))
    for each in inputs:
        check_input(each, stdin_count=sum(other.path is None for other in inputs))
    return inputs


def is_a_pattern(name: str) -> bool:
    """A glob to expand: a name with *, ? or [...] that is not itself a path there ("data [v2]/corpus.txt")."""
    return glob.has_magic(name) and not Path(name).exists()


def inputs_in(path: Path, format: str | None) -> list[InputFile]:
    """A file, or the files of a directory (a datasets folder: its arrow files, in its order)."""
    if not path.is_dir():
        return [InputFile(path, format or format_of(path))]
    if (path / "dataset_dict.json").is_file():
        raise UserError(f"{path}: a datasets DatasetDict; name one of its splits, e.g. {path / 'train'}")
    if (path / "state.json").is_file():
        return [InputFile(path / name, "arrow") for name in datasets_arrow_files(path)]
    found = [each for child in sorted(path.iterdir()) if not child.name.startswith(".")
             for each in inputs_in(child, format)]
    if not found:
        raise UserError(f"{path}: the directory holds no input file")
    return found


def datasets_arrow_files(folder: Path) -> list[str]:
    """The arrow files a `datasets` save_to_disk folder lists in its state.json."""
    state = folder / "state.json"
    try:
        return [entry["filename"] for entry in json.loads(state.read_text(encoding="utf-8"))["_data_files"]]
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise UserError(f"{state}: not a datasets state file ({error.__class__.__name__}: {error})") from None


def check_input(each: InputFile, stdin_count: int) -> None:
    if each.path is None:
        if stdin_count > 1:
            raise UserError("-: standard input named twice")
        if sys.stdin is None:  # started with standard input closed (`<&-`)
            raise UserError("-: standard input is closed")
        if each.format not in ("text", "jsonl"):
            raise UserError(f"-: standard input is read as text or jsonl, not --format {each.format}")
        return
    if not each.path.is_file():
        raise UserError(f"{each}: input file not found")
    if each.path.stat().st_size == 0:
        raise UserError(f"{each}: input file is empty")


# ---------------------------------------------------------------------------------------------
# Reading documents


class BadRecords:
    """The bad records met: the first stops the run, or with skip they are counted."""

    def __init__(self, skip: bool):
        self.skip = skip
        self.count = 0
        self.first: str | None = None

    def found(self, where: str, what: str) -> None:
        what = without_lone_surrogates(what)  # a record shown in the message may hold one
        if not self.skip:
            raise UserError(f"{where}: {what} (--skip-bad-records skips such records)")
        self.count += 1
        self.first = self.first or f"{where}: {what}"

    def summary(self) -> str:
        return f"{self.count:,} bad records skipped (the first: {self.first})" if self.count else ""


def read_documents(inputs: list[InputFile], text_field: str = "text", bad: BadRecords | None = None,
                   batch_bytes: int = 16 << 20) -> Iterator[list[str]]:
    """Every input's documents in order, in lists of about batch_bytes of text, without empty
    ones; documents longer than MAX_LINE_CHARS come in pieces cut at spaces."""
    bad = bad or BadRecords(skip=False)
    readers = {"text": text_documents, "jsonl": jsonl_documents, "parquet": parquet_documents,
               "arrow": arrow_documents}
    for each in inputs:
        yield from readers[each.format](each, text_field, bad, batch_bytes)


@contextlib.contextmanager
def binary_stream(each: InputFile):
    """The input's bytes, decompressed as its name says; a damaged file is one line naming it."""
    if each.path is None:
        yield sys.stdin.buffer
        return
    opener = OPENERS.get(each.path.suffix.lower(), open)
    try:
        with opener(each.path, "rb") as stream:
            yield stream
    except READ_ERRORS as error:
        kind = each.path.suffix.lower() if opener is not open else "input"
        raise UserError(f"{each}: cannot read this {kind} file ({error.__class__.__name__}: {error})") from None


def line_batches(stream, batch_bytes: int, cut_at: int | None = None) -> Iterator[tuple[range | list, list[bytes]]]:
    """(the line numbers, the lines without their line ends) about batch_bytes at a time. With cut_at,
    a line longer than that many bytes comes in pieces (byte_pieces) of the same number: where a piece
    ends depends on the line alone, never on batch_bytes, so a one-line corpus streams through."""
    # A byte-order mark (Windows editors write one) is not part of the first line.
    carry, number = stream.read(len(codecs.BOM_UTF8)).removeprefix(codecs.BOM_UTF8), 1
    while block := stream.read(batch_bytes):
        lines = (carry + block).split(b"\n")
        carry = lines.pop()
        numbers = range(number, number + len(lines))
        number += len(lines)
        if cut_at and (len(carry) > cut_at or any(len(line) > cut_at for line in lines)):
            numbers, lines, carry = cut_lines(numbers, lines, carry, number, cut_at)
        yield numbers, lines
    if carry:
        yield [number], [carry]


def cut_lines(numbers, lines: list[bytes], carry: bytes, carry_number: int, cut_at: int):
    """The lines with each long one in pieces, and the carried start of the next line with its
    finished pieces moved to the lines."""
    cut_numbers, cut = [], []
    for number, line in zip(numbers, lines):
        pieces = byte_pieces(line, cut_at)
        cut_numbers += [number] * len(pieces)
        cut += pieces
    *finished, carry = byte_pieces(carry, cut_at)
    return cut_numbers + [carry_number] * len(finished), cut + finished, carry


def byte_pieces(line: bytes, limit: int) -> list[bytes]:
    """A line cut at spaces into pieces of at most limit bytes (at a character's start where a piece has
    no space); a space byte is never part of a multi-byte UTF-8 character."""
    pieces = []
    while len(line) > limit:
        cut = line.rfind(b" ", 0, limit) + 1 or character_start(line, limit)
        pieces.append(line[:cut])
        line = line[cut:]
    pieces.append(line)
    return pieces


def character_start(data: bytes, index: int) -> int:
    while index > 1 and data[index] & 0xC0 == 0x80:  # a UTF-8 continuation byte
        index -= 1
    return index


def text_documents(each: InputFile, text_field, bad: BadRecords, batch_bytes: int) -> Iterator[list[str]]:
    with binary_stream(each) as stream:
        for numbers, lines in line_batches(stream, batch_bytes, cut_at=MAX_LINE_CHARS):
            try:
                text = b"\n".join(lines).decode("utf-8")
            except UnicodeDecodeError:
                text = "\n".join(decoded_lines(each, numbers, lines, bad))
            yield [line for line in text.split("\n") if line.strip()]


def decoded_lines(each: InputFile, numbers, lines: list[bytes], bad: BadRecords) -> Iterator[str]:
    """The lines that are UTF-8; the others are bad records."""
    for number, line in zip(numbers, lines):
        try:
            yield line.decode("utf-8")
        except UnicodeDecodeError as error:
            bad.found(f"{each}:{number}", f"not UTF-8 text (byte {error.start} of the line)")


def jsonl_documents(each: InputFile, text_field: str, bad: BadRecords, batch_bytes: int) -> Iterator[list[str]]:
    with binary_stream(each) as stream:
        for numbers, lines in line_batches(stream, batch_bytes):
            texts = (record_text(each, number, line, text_field, bad) for number, line in zip(numbers, lines))
            yield short_lines([text for text in texts if text and text.strip()])


def record_text(each: InputFile, number: int, line: bytes, text_field: str, bad: BadRecords) -> str | None:
    """The text field of one JSON line; None for a blank line or a bad record."""
    if not line.strip():
        return None
    where = f"{each}:{number}"
    try:
        record = json.loads(line)
    except (ValueError, RecursionError) as error:  # JSONDecodeError, UnicodeDecodeError; nested thousands deep
        bad.found(where, f"not a JSON record ({getattr(error, 'msg', error)}: {shown(line)})")
        return None
    if not isinstance(record, dict):
        bad.found(where, f"{json_type(record)} where a JSON record ({{...}}) was expected")
        return None
    if text_field not in record:
        fields = ", ".join(list(record)[:8]) or "none"
        bad.found(where, f"no field '{text_field}' (the record has: {fields}; --text-field names the field)")
        return None
    return checked_text(where, f"field '{text_field}'", record[text_field], bad)


def checked_text(where: str, what: str, value, bad: BadRecords) -> str | None:
    if isinstance(value, str):
        return without_lone_surrogates(value)
    bad.found(where, f"{what} is {json_type(value)} ({shown(value)}), expected a string")
    return None


def without_lone_surrogates(text: str) -> str:
    """The text with each lone surrogate replaced by U+FFFD, as a UTF-8 decoder replaces a bad byte:
    the record's other text is good, and a web dump has too many such records to refuse or drop."""
    return text if text.isascii() else LONE_SURROGATE.sub("\ufffd", text)


def json_type(value) -> str:
    names = {dict: "an object", list: "an array", str: "a string", bool: "a boolean", int: "a number",
             float: "a number", type(None): "null"}
    return names.get(type(value), type(value).__name__)


def shown(value, limit: int = 40) -> str:
    text = value.decode("utf-8", "replace") if isinstance(value, bytes) else json.dumps(value, ensure_ascii=False)
    return text if len(text) <= limit else text[:limit] + "..."


def parquet_documents(each: InputFile, text_field: str, bad: BadRecords, batch_bytes: int) -> Iterator[list[str]]:
    import pyarrow as pa
    import pyarrow.parquet as pq
    try:
        parquet = pq.ParquetFile(each.path)
        names = parquet.schema_arrow.names
        if text_field not in names:
            raise UserError(f"{each}: no column '{text_field}' (columns: {', '.join(names)}; --text-field names it)")
        batches = parquet.iter_batches(batch_size=ROWS_PER_BATCH, columns=[text_field])
        yield from column_documents(each, text_field, batches, bad)
    except (pa.ArrowException, OSError) as error:
        raise UserError(f"{each}: not a readable parquet file ({error.__class__.__name__}: {error})") from None


def arrow_documents(each: InputFile, text_field: str, bad: BadRecords, batch_bytes: int) -> Iterator[list[str]]:
    """An arrow file of a `datasets` folder: the IPC stream format (or the file format)."""
    import pyarrow as pa
    try:
        with pa.memory_map(str(each.path)) as source:
            try:
                batches = iter(pa.ipc.open_stream(source))
            except pa.ArrowInvalid:
                source.seek(0)
                reader = pa.ipc.open_file(source)
                batches = (reader.get_batch(index) for index in range(reader.num_record_batches))
            yield from column_documents(each, text_field, batches, bad)
    except (pa.ArrowException, OSError) as error:
        raise UserError(f"{each}: not a readable arrow file ({error.__class__.__name__}: {error})") from None


def column_documents(each: InputFile, text_field: str, batches, bad: BadRecords) -> Iterator[list[str]]:
    """The text column of record batches, ROWS_PER_BATCH rows at a time."""
    import pyarrow as pa
    row = 0
    for batch in batches:
        if text_field not in batch.schema.names:
            raise UserError(f"{each}: no column '{text_field}' (columns: {', '.join(batch.schema.names)}; "
                            f"--text-field names it)")
        column = batch.column(text_field)
        if not (pa.types.is_string(column.type) or pa.types.is_large_string(column.type)):
            raise UserError(f"{each}: column '{text_field}' holds {column.type}, expected strings")
        for start in range(0, len(column), ROWS_PER_BATCH):
            values = column.slice(start, ROWS_PER_BATCH).to_pylist()
            texts = (checked_text(f"{each}: row {row + start + offset}", f"column '{text_field}'", value, bad)
                     for offset, value in enumerate(values))
            yield short_lines([text for text in texts if text and text.strip()])
        row += len(column)


def short_lines(lines: list[str], limit: int | None = None) -> list[str]:
    """The lines, each longer than limit (MAX_LINE_CHARS) cut at spaces (or at limit where it has none)."""
    limit = limit or MAX_LINE_CHARS
    if all(len(line) <= limit for line in lines):
        return lines
    result = []
    for line in lines:
        while len(line) > limit:
            cut = line.rfind(" ", 0, limit) + 1 or limit
            result.append(line[:cut])
            line = line[cut:]
        result.append(line)
    return result
