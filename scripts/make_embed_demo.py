"""Made-up sentence-embedding data from the demo's reviews, for task-type = embed: not a benchmark.

Example:
    python scripts/make_embed_demo.py -i demo/input/imdb.txt -o demo/datasets/embed --limit 3000

Reviews are split 80/10/10. A review's sentence and the passage it was cut from (two sentences
each side) make a pair (the inverse cloze task): the training pairs are written as `train.jsonl`
(anchor, positive); validation and test search for each held-out sentence its passage among every
held-out one, in BEIR's layout (`retrieval/corpus.jsonl`, `queries.jsonl`, `qrels/dev.tsv`,
`qrels/test.tsv`). Scored pairs in STS-B's layout (`stsb/{validation,test}-00000-of-00001.parquet`)
pair a sentence with itself after k of its n words were replaced by words of other sentences,
scored 5 (1 - k/n), and with an unrelated sentence, scored 0. Real data (sentence-transformers'
pairs, STS-B, a BEIR set) in these layouts trains the same way.
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
from make_ner_demo import SENTENCE_END, SPLITS, run_maker  # noqa: E402

MIN_WORDS = 6  # a shorter sentence is too little to find its review by
PAIRS_PER_REVIEW = 3
CONTEXT = 2  # sentences each side of a held-out sentence in its passage: a passage fits 128 pieces
QRELS_NAMES = {"validation": "dev", "test": "test"}


def sentences_of(review: str) -> list[str]:
    return [sentence for sentence in SENTENCE_END.split(review.replace("<br />", " ").strip())
            if len(sentence.split()) >= MIN_WORDS]


def cloze_pairs(review: str, rng: random.Random, count: int) -> list[tuple[str, str]]:
    """Up to `count` (sentence, its passage) pairs of a review of at least two sentences: the passage
    is the CONTEXT sentences before the sentence and after it, without it."""
    sentences = sentences_of(review)
    if len(sentences) < 2:
        return []
    chosen = rng.sample(range(len(sentences)), min(count, len(sentences)))
    return [(sentences[number], " ".join(sentences[max(0, number - CONTEXT):number]
                                         + sentences[number + 1:number + 1 + CONTEXT])) for number in chosen]


def scored_pairs(sentences: list[str], rng: random.Random) -> list[tuple[str, str, float]]:
    """Each sentence with a copy of it with some words replaced (score 5 (1 - k/n)), and every
    fourth with an unrelated sentence (score 0)."""
    words = [word for sentence in sentences for word in sentence.split()]
    pairs = []
    for number, sentence in enumerate(sentences):
        own = sentence.split()
        replaced = rng.randint(0, len(own))
        changed = list(own)
        for place in rng.sample(range(len(own)), replaced):
            changed[place] = rng.choice(words)
        pairs.append((sentence, " ".join(changed), round(5 * (1 - replaced / len(own)), 2)))
        if number % 4 == 0:
            pairs.append((sentence, rng.choice(sentences), 0.0))
    return pairs


def write_jsonl(path: Path, rows: list[dict]):
    text = "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)
    atomic_write(path, lambda temp: temp.write_text(text, encoding="utf-8"))


def write_similarity(folder: Path, split: str, pairs: list[tuple[str, str, float]]):
    """GLUE's STS-B parquet layout: sentence1, sentence2, label (0-5), idx."""
    folder.mkdir(parents=True, exist_ok=True)
    table = pa.table({"sentence1": [pair[0] for pair in pairs], "sentence2": [pair[1] for pair in pairs],
                      "label": pa.array([pair[2] for pair in pairs], pa.float32()),
                      "idx": pa.array(range(len(pairs)), pa.int32())})
    atomic_write(folder / f"{split}-00000-of-00001.parquet", lambda temp: pq.write_table(table, temp))


def make_embed_demo(corpus: Path, out_dir: Path, seed: int = 123, limit: int | None = None) -> dict[str, int]:
    """train.jsonl, retrieval/ and stsb/ under out_dir; returns counts by split."""
    try:
        reviews = corpus.read_text(encoding="utf-8").splitlines()[:limit]
    except (OSError, UnicodeDecodeError) as error:
        raise UserError(f"{corpus}: cannot read ({error})") from None
    rng = random.Random(seed)
    rng.shuffle(reviews)
    cut = round(SPLITS["train"] * len(reviews))
    held_out = len(reviews) - cut
    splits = {"train": reviews[:cut], "validation": reviews[cut:cut + held_out // 2],
              "test": reviews[cut + held_out // 2:]}
    out_dir.mkdir(parents=True, exist_ok=True)
    pairs = [pair for review in splits["train"] for pair in cloze_pairs(review, rng, PAIRS_PER_REVIEW)]
    write_jsonl(out_dir / "train.jsonl", [{"anchor": anchor, "positive": positive} for anchor, positive in pairs])
    counts = {"train pairs": len(pairs)}
    documents, queries = [], []
    (out_dir / "retrieval" / "qrels").mkdir(parents=True, exist_ok=True)
    for split in ("validation", "test"):
        judged = []
        for number, review in enumerate(splits[split]):
            found = cloze_pairs(review, rng, 1)
            if found:
                document, query = f"{split}-d{number}", f"{split}-q{number}"
                documents.append({"_id": document, "title": "", "text": found[0][1]})
                queries.append({"_id": query, "text": found[0][0]})
                judged.append(f"{query}\t{document}\t1")
        atomic_write(out_dir / "retrieval" / "qrels" / f"{QRELS_NAMES[split]}.tsv",
                     lambda temp, judged=judged: temp.write_text("query-id\tcorpus-id\tscore\n" + "\n".join(judged)
                                                                 + "\n", encoding="utf-8"))
        sentences = [sentence for review in splits[split] for sentence in sentences_of(review)][:2000]
        similarity = scored_pairs(sentences, rng)
        if not judged or not similarity:
            raise UserError(f"{corpus}: no sentence pair in the {split} split's {len(splits[split])} reviews; "
                            f"give more text")
        write_similarity(out_dir / "stsb", split, similarity)
        counts |= {f"{split} queries": len(judged), f"{split} scored pairs": len(similarity)}
    write_jsonl(out_dir / "retrieval" / "corpus.jsonl", documents)
    write_jsonl(out_dir / "retrieval" / "queries.jsonl", queries)
    return counts


@exit_on_user_error
def main(argv=None):
    run_maker(argv, __doc__, "directory to write (demo/datasets/embed)", make_embed_demo, "")


if __name__ == "__main__":
    main()
