"""Made-up named-entity data from the demo's reviews, for task-type = ner: not a benchmark.

Example:
    python scripts/make_ner_demo.py -i demo/input/imdb.txt -o demo/datasets/ner

Each review is cut into sentences and words; a rule tags three kinds of entity that a lower-cased
vocabulary can see, in BIO: YEAR (a year from 1900 to 2029), SCORE (`7/10`, `8 out of 10`,
`4 stars`) and GENRE (a genre, `romantic comedy` and `science fiction` as one). Sentences with an
entity and as many without are kept, split by review (80/10/10), and written in both layouts:
    train.txt, validation.txt, test.txt                  CoNLL text: a word and its tag per line
    {train,validation,test}-00000-of-00001.parquet       Hugging Face: tokens, ner_tags, label names
A real corpus (CoNLL-2003, WNUT-17) in either layout trains the same way.
"""
import argparse
import json
import random
import re
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))
from atomic import atomic_write  # noqa: E402
from errors import UserError, exit_on_user_error  # noqa: E402

LABELS = ("O", "B-YEAR", "I-YEAR", "B-SCORE", "I-SCORE", "B-GENRE", "I-GENRE")
GENRES = {"horror", "comedy", "comedies", "drama", "dramas", "thriller", "thrillers", "western", "westerns",
          "documentary", "documentaries", "musical", "musicals", "romance", "animation", "cartoon", "cartoons",
          "slasher", "noir", "mystery", "fantasy", "action", "sci-fi", "satire", "melodrama", "sitcom", "anime"}
TWO_WORD_GENRES = {("romantic", "comedy"), ("science", "fiction"), ("black", "comedy"), ("film", "noir"),
                   ("martial", "arts"), ("war", "movie"), ("war", "film"), ("kung", "fu")}
WORD = re.compile(r"\w+(?:[-']\w+)*|[^\w\s]")
SENTENCE_END = re.compile(r"(?<=[.!?])\s+")
SPLITS = {"train": 0.8, "validation": 0.1, "test": 0.1}


def words_of(sentence: str) -> list[str]:
    return WORD.findall(sentence)


def score_length(words: list[str], at: int) -> int:
    """Words of a score starting at `at` (7 / 10, 8 out of 10, 4 stars), or 0."""
    if not words[at].isdigit() or len(words[at]) > 2:
        return 0
    following = [word.lower() for word in words[at + 1:at + 4]]
    if following[:2] == ["/", "10"]:
        return 3
    if following[:3] == ["out", "of", "10"]:
        return 4
    return 2 if following[:1] in (["stars"], ["star"]) else 0


def tag_words(words: list[str]) -> list[str]:
    """The rule's BIO tags of a sentence's words."""
    tags, at = ["O"] * len(words), 0
    while at < len(words):
        lower = words[at].lower()
        kind, length = None, 1
        if score_length(words, at):
            kind, length = "SCORE", score_length(words, at)
        elif lower.isdigit() and len(lower) == 4 and 1900 <= int(lower) <= 2029:
            kind = "YEAR"
        elif at + 1 < len(words) and (lower, words[at + 1].lower()) in TWO_WORD_GENRES:
            kind, length = "GENRE", 2
        elif lower in GENRES:
            kind = "GENRE"
        if kind:
            tags[at:at + length] = [f"B-{kind}"] + [f"I-{kind}"] * (length - 1)
        at += length
    return tags


def tagged_sentences(reviews: list[str], seed: int) -> list[tuple[list[str], list[str]]]:
    """Each sentence of the reviews with an entity, and as many without (drawn with `seed`)."""
    with_entity, without = [], []
    for review in reviews:
        for sentence in SENTENCE_END.split(review):
            words = words_of(sentence)
            if words:
                tags = tag_words(words)
                (with_entity if any(tag != "O" for tag in tags) else without).append((words, tags))
    random.Random(seed).shuffle(without)
    return with_entity + without[:len(with_entity)]


def write_conll(path: Path, sentences: list[tuple[list[str], list[str]]]):
    text = "".join("".join(f"{word} {tag}\n" for word, tag in zip(words, tags)) + "\n" for words, tags in sentences)
    atomic_write(path, lambda temp: temp.write_text("-DOCSTART- O\n\n" + text, encoding="utf-8"))


def write_parquet(path: Path, sentences: list[tuple[list[str], list[str]]]):
    """tokens and ner_tags with the label names in Hugging Face's metadata, as `datasets` writes them."""
    ids = {name: number for number, name in enumerate(LABELS)}
    features = {"tokens": {"feature": {"dtype": "string", "_type": "Value"}, "_type": "Sequence"},
                "ner_tags": {"feature": {"names": list(LABELS), "_type": "ClassLabel"}, "_type": "Sequence"}}
    table = pa.table({"tokens": [words for words, _ in sentences],
                      "ner_tags": [[ids[tag] for tag in tags] for _, tags in sentences]})
    table = table.replace_schema_metadata({"huggingface": json.dumps({"info": {"features": features}})})
    atomic_write(path, lambda temp: pq.write_table(table, temp))


def make_ner_demo(corpus: Path, out_dir: Path, seed: int = 123, limit: int | None = None) -> dict[str, int]:
    """Write both layouts of each split under out_dir; returns sentences per split."""
    try:
        reviews = corpus.read_text(encoding="utf-8").splitlines()[:limit]
    except (OSError, UnicodeDecodeError) as error:
        raise UserError(f"{corpus}: cannot read ({error})") from None
    random.Random(seed).shuffle(reviews)
    out_dir.mkdir(parents=True, exist_ok=True)
    counts, start = {}, 0
    for split, share in SPLITS.items():
        end = len(reviews) if split == "test" else start + round(share * len(reviews))
        sentences = tagged_sentences(reviews[start:end], seed)
        if not sentences:
            raise UserError(f"{corpus}: no entity in the {split} split's {end - start} reviews; give more text")
        write_conll(out_dir / f"{split}.txt", sentences)
        write_parquet(out_dir / f"{split}-00000-of-00001.parquet", sentences)
        counts[split], start = len(sentences), end
    return counts


def run_maker(argv, description: str, output_help: str, make, noun: str):
    """The command line of a demo-data maker: -i reviews, -o directory, -s seed, --limit; make(input,
    output, seed, limit) returns counts by name, printed as `name COUNT noun`."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-i", "--input", required=True, type=Path, help="reviews, one a line (demo/input/imdb.txt)")
    parser.add_argument("-o", "--output", required=True, type=Path, help=output_help)
    parser.add_argument("-s", "--seed", type=int, default=123, help="seed of the splits (default 123)")
    parser.add_argument("--limit", type=int, help="the first N reviews only")
    args = parser.parse_args(argv)
    if args.limit is not None and args.limit < 10:
        raise UserError(f"--limit {args.limit}: expected at least 10 reviews")
    try:
        counts = make(args.input, args.output, args.seed, args.limit)
    except OSError as error:
        raise UserError(f"{error.filename or args.output}: cannot write ({error.strerror or error})") from None
    print(f"wrote {args.output}: " + ", ".join(f"{name} {count:,}{noun and ' ' + noun}"
                                               for name, count in counts.items()))


@exit_on_user_error
def main(argv=None):
    run_maker(argv, __doc__, "directory to write (demo/datasets/ner)", make_ner_demo, "sentences")


if __name__ == "__main__":
    main()
