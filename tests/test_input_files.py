"""Reading inputs: every format gives the same documents (compressed text, JSON lines with unicode
and empty records, parquet, a datasets folder, a directory, standard input), bad records are one line
naming the file and line (or skipped and counted), every script reads them all, and a one-line
corpus gives the same ids as the same words in many lines, in bounded pieces."""
import bz2
import gzip
import io
import json
import lzma
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from corpus import input_files
import prepare_mlm_dataset
import prepare_mlm_fixed_len_dataset_from_ids as prepare_fixed_len
import tokenize_text
import train_vocab
from errors import UserError
from corpus.input_files import byte_pieces, find_inputs, line_batches, read_documents
from shards import read_shard
from corpus.token_stream import read_token_stream
from vocab import Vocab

ROOT = Path(__file__).resolve().parent.parent
# Unicode, an empty record and a blank one (both left out), a record with a line break inside.
DOCUMENTS = ["Der Film war großartig, «très bien» 🎬.", "", "   ", "Second review: 映画は良かった。",
             "a line\nbreak inside one record", "the last one"]
KEPT = [text for text in DOCUMENTS if text.strip()]


def write_inputs(directory: Path) -> dict[str, Path]:
    """The documents in every format: text files hold the one-line records only."""
    directory.mkdir(parents=True, exist_ok=True)
    lines = "".join(text + "\n" for text in KEPT if "\n" not in text)
    records = "".join(json.dumps({"id": index, "text": text}, ensure_ascii=index % 2 == 0) + "\n"
                      for index, text in enumerate(DOCUMENTS))
    paths = {"txt": directory / "docs.txt", "gz": directory / "docs.txt.gz", "bz2": directory / "docs.txt.bz2",
             "xz": directory / "docs.tokens.xz", "jsonl": directory / "docs.jsonl",
             "json.gz": directory / "docs.json.gz", "jsonl.gz": directory / "docs.jsonl.gz"}
    paths["txt"].write_text(lines, encoding="utf-8")
    for key, opener in (("gz", gzip.open), ("bz2", bz2.open), ("xz", lzma.open)):
        with opener(paths[key], "wt", encoding="utf-8") as out:
            out.write(lines)
    paths["jsonl"].write_text(records, encoding="utf-8")
    for key in ("json.gz", "jsonl.gz"):
        with gzip.open(paths[key], "wt", encoding="utf-8") as out:
            out.write(records)
    paths["parquet"] = write_parquet(directory / "docs.parquet", DOCUMENTS)
    return paths


def write_parquet(path: Path, texts: list, column: str = "text") -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq
    pq.write_table(pa.table({"id": list(range(len(texts))), column: texts}), path, row_group_size=2)
    return path


def documents_of(*patterns, **options) -> list[str]:
    return [text for batch in read_documents(find_inputs([str(p) for p in patterns]), **options) for text in batch]


def test_every_format_gives_the_same_documents(tmp_path):
    paths = write_inputs(tmp_path)
    one_line = [text for text in KEPT if "\n" not in text]
    for key in ("txt", "gz", "bz2", "xz"):
        assert documents_of(paths[key]) == one_line, key
    for key in ("jsonl", "json.gz", "jsonl.gz", "parquet"):
        assert documents_of(paths[key]) == KEPT, key
    assert [each.format for each in find_inputs([str(path) for path in paths.values()])] == \
        ["text"] * 4 + ["jsonl"] * 3 + ["parquet"]


def test_a_datasets_folder_is_read_through_its_arrow_files(tmp_path):
    import datasets
    folder = tmp_path / "saved"
    datasets.Dataset.from_dict({"text": DOCUMENTS * 3, "label": list(range(18))}).save_to_disk(
        str(folder), max_shard_size=300)
    inputs = find_inputs([str(folder)])
    assert len(inputs) > 1 and all(each.format == "arrow" for each in inputs)
    assert documents_of(folder) == KEPT * 3
    datasets.DatasetDict({"train": datasets.Dataset.from_dict({"text": KEPT})}).save_to_disk(str(tmp_path / "dict"))
    assert documents_of(tmp_path / "dict" / "train") == KEPT
    with pytest.raises(input_files.UserError, match="a datasets DatasetDict; name one of its splits"):
        find_inputs([str(tmp_path / "dict")])


def test_a_directory_is_every_file_in_it_and_standard_input_is_a_dash(tmp_path, monkeypatch):
    paths = write_inputs(tmp_path / "corpus")
    (tmp_path / "corpus" / ".hidden").write_text("not read\n")
    names = [Path(str(each)).name for each in find_inputs([str(tmp_path / "corpus")])]
    assert names == sorted(path.name for path in paths.values())
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(paths["txt"].read_bytes())))
    assert documents_of("-") == documents_of(paths["txt"])
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(paths["jsonl"].read_bytes())))
    assert [text for batch in read_documents(find_inputs(["-"], "jsonl")) for text in batch] == KEPT


def test_the_format_and_the_field_can_be_named(tmp_path):
    log = tmp_path / "records.log"
    log.write_text("".join(json.dumps({"content": text}) + "\n" for text in KEPT), encoding="utf-8")
    assert [text for batch in read_documents(find_inputs([str(log)], "jsonl"), "content") for text in batch] == KEPT
    assert documents_of(write_parquet(tmp_path / "c.parquet", KEPT, "body"), text_field="body") == KEPT


def test_long_lines_come_in_pieces_cut_where_the_line_alone_says(monkeypatch):
    line = " ".join(f"word{index}" for index in range(3000)).encode() + "é".encode() * 500
    pieces = byte_pieces(line, 1000)
    assert b"".join(pieces) == line and max(map(len, pieces)) <= 1000
    assert all(piece.endswith(b" ") for piece in pieces[:-2])
    text = b"short\n" + line + b"\nend"
    for batch_bytes in (7, 100, 5000, 1 << 20):
        numbers, lines = zip(*[(n, piece) for numbers, lines in line_batches(io.BytesIO(text), batch_bytes, 1000)
                                for n, piece in zip(numbers, lines)])
        assert list(lines) == [b"short", *pieces, b"end"], batch_bytes
        assert list(numbers) == [1] + [2] * len(pieces) + [3]
        for piece in lines:
            piece.decode("utf-8")  # never inside a character


def test_short_lines_cut_at_spaces_and_keep_every_character():
    lines = ["a b c d e f g h", "short"]
    cut = input_files.short_lines(lines, limit=4)
    assert "".join(cut) == "".join(lines) and max(map(len, cut)) <= 4
    assert cut[:4] == ["a b ", "c d ", "e f ", "g h"]
    assert input_files.short_lines(lines, limit=100) is lines  # nothing to cut: the same list


def one_line_corpus(imdb_corpus, tmp_path):
    """The corpus's first 2,000 lines as many lines and as one."""
    lines = imdb_corpus.read_text(encoding="utf-8").splitlines()[:2000]
    many, one = tmp_path / "many.txt", tmp_path / "one.txt"
    many.write_text("\n".join(lines) + "\n", encoding="utf-8")
    one.write_text(" ".join(lines) + "\n", encoding="utf-8")
    return many, one


def test_a_one_line_corpus_is_tokenized_in_bounded_pieces_to_the_same_ids(imdb_corpus, vocab_dir, tmp_path,
                                                                         monkeypatch):
    many, one = one_line_corpus(imdb_corpus, tmp_path)
    longest, original = [], Vocab.encode
    monkeypatch.setattr(Vocab, "encode", lambda self, texts: longest.append(max(map(len, texts))) or
                        original(self, texts))
    monkeypatch.setattr(input_files, "MAX_LINE_CHARS", 10_000)
    monkeypatch.setattr(input_files.short_lines, "__defaults__", (10_000,))
    ids = {}
    for path in (many, one):
        tokenize_text.main(["-i", str(path), "-o", str(path.with_suffix(".ids")), "-v", str(vocab_dir), "-n", "1",
                            "--chunk-mb", "0.05"])
        ids[path.name] = np.concatenate(list(read_token_stream(path.with_suffix(".ids"))[1]))
    assert one.stat().st_size > 200_000 and max(longest) <= 10_000
    np.testing.assert_array_equal(ids["one.txt"], ids["many.txt"])


def test_a_one_line_corpus_packs_to_the_same_samples(imdb_corpus, vocab_dir, tmp_path, monkeypatch):
    many, one = one_line_corpus(imdb_corpus, tmp_path)
    monkeypatch.setattr(input_files.short_lines, "__defaults__", (10_000,))
    samples = {}
    for path in (many, one):
        out = tmp_path / path.stem
        prepare_mlm_dataset.main(["-i", str(path), "-l", "imdb", "-o", str(out), "-m", "64", "-v", str(vocab_dir),
                                  "--chunk-mb", "0.05"])
        shard = read_shard(out / "train_imdb_64_123.msgpack.gz")
        samples[path.name] = (shard.tokens, shard.offsets)
    for many_array, one_array in zip(samples["many.txt"], samples["one.txt"]):
        np.testing.assert_array_equal(many_array, one_array)


# ----------------------------------------------------------------------------- every script reads them


@pytest.fixture(scope="module")
def review_inputs(imdb_reviews, tmp_path_factory) -> dict[str, Path]:
    """300 IMDB reviews as text, gzipped JSON lines and parquet."""
    directory = tmp_path_factory.mktemp("reviews")
    reviews = imdb_reviews[:300]
    text = directory / "reviews.txt"
    text.write_text("\n".join(reviews) + "\n", encoding="utf-8")
    records = directory / "reviews.jsonl.gz"
    with gzip.open(records, "wt", encoding="utf-8") as out:
        out.writelines(json.dumps({"text": review, "stars": 7}) + "\n" for review in reviews)
    return {"txt": text, "jsonl.gz": records, "parquet": write_parquet(directory / "reviews.parquet", reviews)}


def samples(out: Path) -> list[list[int]]:
    return [read_shard(path).tokens.tolist() for path in sorted(out.glob("*.msgpack.gz"))]


def test_every_script_reads_every_format_to_the_same_result(review_inputs, vocab_dir, tmp_path):
    results = {}
    for key, path in review_inputs.items():
        out = tmp_path / key.replace(".", "_")
        train_vocab.main(["-i", str(path), "-o", str(out / "vocab"), "--vocab-size", "500"])
        tokenize_text.main(["-i", str(path), "-o", str(out / "ids"), "-v", str(vocab_dir), "-n", "1"])
        prepare_mlm_dataset.main(["-i", str(path), "-l", "r", "-o", str(out / "segments"), "-m", "64",
                                  "-v", str(vocab_dir), "-n", "1"])
        prepare_fixed_len.main(["-i", str(path), "-l", "r", "-o", str(out / "fixed"), "-m", "64",
                                "-v", str(vocab_dir), "-n", "1"])
        results[key] = ((out / "vocab" / "vocab.txt").read_bytes(),
                        np.concatenate(list(read_token_stream(out / "ids")[1])).tolist(),
                        samples(out / "segments"), samples(out / "fixed"))
    assert results["txt"][1] and len(results["txt"][2]) == 3
    assert results["jsonl.gz"] == results["txt"] and results["parquet"] == results["txt"]


BAD_RECORDS = [('{"text": "cut off', "not a JSON record (Unterminated string"),
               ('{"body": "no text"}', "no field 'text' (the record has: body; --text-field names the field)"),
               ('{"text": 42}', "field 'text' is a number (42), expected a string"),
               ('{"text": null}', "field 'text' is null (null), expected a string"),
               ('["text"]', "an array where a JSON record ({...}) was expected"),
               (b'{"text": "caf\xe9"}', "not a JSON record")]


def with_bad_record(path: Path, good: list[str], bad) -> Path:
    """The good records as JSON lines, the bad one second."""
    lines = [json.dumps({"text": text}).encode() for text in good]
    lines.insert(1, bad if isinstance(bad, bytes) else bad.encode())
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path


def script_runs(path: Path, vocab_dir: Path, out: Path) -> dict:
    return {"prepare_mlm_dataset": (prepare_mlm_dataset.main, ["-i", str(path), "-l", "r", "-o", str(out), "-m", "64",
                                                               "-v", str(vocab_dir), "-n", "1"]),
            "fixed_len": (prepare_fixed_len.main, ["-i", str(path), "-l", "r", "-o", str(out), "-m", "64",
                                                   "-v", str(vocab_dir), "-n", "1"]),
            "tokenize_text": (tokenize_text.main, ["-i", str(path), "-o", str(out) + ".ids", "-v", str(vocab_dir)]),
            "train_vocab": (train_vocab.main, ["-i", str(path), "-o", str(out)])}


def test_a_bad_record_is_one_line_naming_file_and_line_and_nothing_is_written(imdb_reviews, vocab_dir, tmp_path,
                                                                               capsys):
    for index, (bad, message) in enumerate(BAD_RECORDS):
        path = with_bad_record(tmp_path / f"bad{index}.jsonl", imdb_reviews[:50], bad)
        for name, (main, argv) in script_runs(path, vocab_dir, tmp_path / "out").items():
            with pytest.raises(SystemExit) as exit_info:
                main(argv)
            errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error")]
            assert exit_info.value.code == 2 and len(errors) == 1, (name, bad, errors)
            assert errors[0].startswith(f"error: {path}:2: {message}"), (name, errors)
            assert not (tmp_path / "out").exists() and not Path(f"{tmp_path / 'out'}.ids").exists(), name


def test_skipped_bad_records_are_counted_and_change_nothing_else(imdb_reviews, vocab_dir, tmp_path, capsys):
    good = imdb_reviews[:200]
    clean = with_bad_record(tmp_path / "clean.jsonl", good, json.dumps({"text": ""}))  # an empty record
    dirty = tmp_path / "dirty.jsonl"
    lines = clean.read_bytes().splitlines()
    for offset, (bad, _) in enumerate(BAD_RECORDS):
        lines.insert(3 + 7 * offset, bad if isinstance(bad, bytes) else bad.encode())
    dirty.write_bytes(b"\n".join(lines) + b"\n")
    for path, out in ((clean, tmp_path / "clean"), (dirty, tmp_path / "dirty")):
        prepare_mlm_dataset.main(["-i", str(path), "-l", "r", "-o", str(out), "-m", "64", "-v", str(vocab_dir),
                                  "--skip-bad-records", "-n", "1"])
    printed = capsys.readouterr().out
    assert f"{len(BAD_RECORDS)} bad records skipped (the first: {dirty}:4: not a JSON record" in printed
    assert printed.count("bad records skipped") == 1  # the clean file has none
    assert samples(tmp_path / "dirty") == samples(tmp_path / "clean")


def test_input_mistakes_are_one_line(tmp_path, vocab_dir):
    (tmp_path / "empty_dir").mkdir()
    table = write_parquet(tmp_path / "t.parquet", KEPT, "body")
    numbers = tmp_path / "n.parquet"
    write_parquet(numbers, [1, 2], "text")
    cases = [(["-", "-"], "-: standard input named twice"),
             ([str(tmp_path / "empty_dir")], "the directory holds no input file"),
             ([str(table)], "no column 'text' (columns: id, body; --text-field names it)"),
             ([str(numbers)], "column 'text' holds int64, expected strings"),
             ([str(tmp_path / "none*.jsonl")], "none*.jsonl: no file matches this pattern")]
    for argv, message in cases:
        result = subprocess.run([sys.executable, str(ROOT / "scripts" / "tokenize_text.py"), "-i", *argv,
                                 "-o", str(tmp_path / "ids"), "-v", str(vocab_dir), "-n", "1"],
                                capture_output=True, text=True, stdin=subprocess.DEVNULL)
        errors = [line for line in result.stderr.splitlines() if line.startswith("error")]  # after a progress bar
        assert result.returncode == 2 and len(errors) == 1 and message in errors[0], (argv, result.stderr)
        assert "Traceback" not in result.stderr


def test_a_lone_surrogate_in_json_is_read_as_the_replacement_character(imdb_reviews, vocab_dir, tmp_path, capsys):
    """JSON's "\\ud800" (half a UTF-16 pair, common in web dumps) becomes U+FFFD, as a bad UTF-8 byte
    would, and every script reads the record, with --skip-bad-records or without."""
    path = with_bad_record(tmp_path / "surrogate.jsonl", imdb_reviews[:50], '{"text": "caf\\ud800 au lait \\udfff"}')
    assert documents_of(path)[1] == "caf\ufffd au lait \ufffd"
    for skip in ([], ["--skip-bad-records"]):
        for name, (main, argv) in script_runs(path, vocab_dir, tmp_path / f"out{len(skip)}").items():
            main(argv + skip)
            assert "bad records skipped" not in capsys.readouterr().out, name


def test_an_existing_path_with_glob_characters_is_taken_literally(tmp_path):
    folder = tmp_path / "data [v2]"
    folder.mkdir()
    (folder / "corpus.txt").write_text("one review\nanother review\n", encoding="utf-8")
    assert documents_of(folder / "corpus.txt") == ["one review", "another review"]
    assert documents_of(folder) == ["one review", "another review"]
    with pytest.raises(UserError, match="no file matches"):  # a glob, whose [v2] is a character class
        documents_of(tmp_path / "data [v2]" / "corp*.txt")


def test_standard_input_closed_is_one_line(tmp_path, vocab_dir):
    for script, options in (("prepare_mlm_dataset.py", ["-l", "r", "-o", str(tmp_path / "out"), "-v", str(vocab_dir)]),
                            ("train_vocab.py", ["-o", str(tmp_path / "out")])):
        result = subprocess.run(f'"{sys.executable}" "{ROOT / "scripts" / script}" -i - '
                                + " ".join(f'"{option}"' for option in options) + " <&-",
                                shell=True, capture_output=True, text=True)
        assert result.returncode == 2 and result.stderr == "error: -: standard input is closed\n", result.stderr
        assert not (tmp_path / "out").exists()
