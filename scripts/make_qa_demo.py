"""Made-up extractive question answering from the demo's reviews, for task-type = squad and
squad_v2: not a benchmark.

Example:
    python scripts/make_qa_demo.py -i demo/input/imdb.txt -o demo/datasets --limit 3000

Each review is a context; make_ner_demo.py's rule finds its years, scores and genres, and each
kind found asks a question ("What score does the reviewer give?") whose gold answers are every
mention of that kind. squad_v2 adds, for a kind the review lacks, the same question unanswerable.
Reviews are split 80/10/10 and written in both layouts under OUTPUT/squad and OUTPUT/squad_v2:
    {train,dev,test}-v1.1.json (v2.0.json)           SQuAD's JSON
    {train,validation,test}-00000-of-00001.parquet   Hugging Face: id, title, context, question, answers
A real SQuAD in either layout trains the same way.
"""
import json
import random
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from atomic import atomic_write  # noqa: E402
from errors import UserError, exit_on_user_error  # noqa: E402
from make_ner_demo import SPLITS, WORD, run_maker, tag_words  # noqa: E402

QUESTIONS = {"YEAR": "Which year does the review mention?", "SCORE": "What score does the reviewer give?",
             "GENRE": "What genre does the review name?"}
JSON_SPLITS = {"train": "train", "validation": "dev", "test": "test"}


def mentions(review: str) -> dict[str, list[tuple[str, int]]]:
    """Each kind's mentions in a review as (text, character start), in order."""
    matches = list(WORD.finditer(review))
    tags = tag_words([match.group() for match in matches])
    found: dict[str, list[tuple[str, int]]] = {}
    for number, tag in enumerate(tags):
        if tag.startswith("B-"):
            last = number
            while last + 1 < len(tags) and tags[last + 1] == f"I-{tag[2:]}":
                last += 1
            start, end = matches[number].start(), matches[last].end()
            found.setdefault(tag[2:], []).append((review[start:end], start))
    return found


def questions_of(review: str, number: int, unanswerable: bool) -> list[dict]:
    """SQuAD's qas of one review: a question per kind it mentions; with unanswerable, one more about
    a kind it lacks (where it mentions any), so about half the questions have no answer."""
    found = mentions(review)
    missing = [kind for kind in QUESTIONS if kind not in found]
    asked = [kind for kind in QUESTIONS if kind in found]
    if unanswerable and found and missing:
        asked.append(missing[number % len(missing)])
    return [{"id": f"{number}-{kind.lower()}", "question": QUESTIONS[kind], "is_impossible": kind not in found,
             "answers": [{"text": text, "answer_start": start} for text, start in found.get(kind, [])]}
            for kind in asked]


def write_split(directory: Path, version: str, split: str, reviews: list[tuple[int, str]]) -> int:
    """Both layouts of one split; returns its questions."""
    unanswerable = version == "v2.0"
    paragraphs = [{"context": review, "qas": qas} for number, review in reviews
                  if (qas := questions_of(review, number, unanswerable))]
    document = {"version": version, "data": [{"title": "imdb", "paragraphs": paragraphs}]}
    text = json.dumps(document, ensure_ascii=False)
    atomic_write(directory / f"{JSON_SPLITS[split]}-{version}.json",
                 lambda temp: temp.write_text(text, encoding="utf-8"))
    rows = [(qa["id"], paragraph["context"], qa["question"], qa["answers"]) for paragraph in paragraphs
            for qa in paragraph["qas"]]
    table = pa.table({"id": [row[0] for row in rows], "title": ["imdb"] * len(rows),
                      "context": [row[1] for row in rows], "question": [row[2] for row in rows],
                      "answers": [{"text": [answer["text"] for answer in row[3]],
                                   "answer_start": [answer["answer_start"] for answer in row[3]]} for row in rows]})
    atomic_write(directory / f"{split}-00000-of-00001.parquet", lambda temp: pq.write_table(table, temp))
    return len(rows)


def make_qa_demo(corpus: Path, out_dir: Path, seed: int = 123, limit: int | None = None) -> dict[str, int]:
    """squad/ and squad_v2/ under out_dir; returns questions per task and split."""
    try:
        reviews = list(enumerate(corpus.read_text(encoding="utf-8").splitlines()[:limit]))
    except (OSError, UnicodeDecodeError) as error:
        raise UserError(f"{corpus}: cannot read ({error})") from None
    random.Random(seed).shuffle(reviews)
    counts = {}
    for task, version in (("squad", "v1.1"), ("squad_v2", "v2.0")):
        (out_dir / task).mkdir(parents=True, exist_ok=True)
        start = 0
        for split, share in SPLITS.items():
            end = len(reviews) if split == "test" else start + round(share * len(reviews))
            counts[f"{task} {split}"] = write_split(out_dir / task, version, split, reviews[start:end])
            if not counts[f"{task} {split}"]:
                raise UserError(f"{corpus}: no question in the {split} split's {end - start} reviews; give more text")
            start = end
    return counts


@exit_on_user_error
def main(argv=None):
    run_maker(argv, __doc__, "directory for squad/ and squad_v2/ (demo/datasets)", make_qa_demo, "questions")


if __name__ == "__main__":
    main()
