"""Entity-level precision, recall and F1 of tagged sentences, as CoNLL's conlleval script (and
seqeval's default mode) count them: an entity is a run of tags of one type that starts where
conlleval says a chunk starts (B-X; I-X after O or another type, so IOB1 and BIO read alike;
E-X and S-X of IOBES too) and ends where the next one starts or an O comes. A predicted entity
counts when its type, start and end all match a true one.
"""
from collections import Counter

OUTSIDE = "O"


def split_tag(tag: str) -> tuple[str, str]:
    """("B", "PER") from "B-PER"; a tag without a prefix is its own type inside an entity (as
    conlleval reads "PER"), "O" is outside."""
    if tag == OUTSIDE:
        return OUTSIDE, ""
    prefix, dash, kind = tag.partition("-")
    return (prefix, kind) if dash and prefix in "BIES" and len(prefix) == 1 else ("I", tag)


def ends_before(previous: tuple[str, str], current: tuple[str, str]) -> bool:
    """Whether an entity tagged `previous` ends before the token tagged `current` (conlleval's endOfChunk)."""
    (before, kind_before), (now, kind_now) = previous, current
    return before in ("E", "S") or (before != OUTSIDE and (now in ("B", "S", OUTSIDE) or kind_now != kind_before))


def starts_at(previous: tuple[str, str], current: tuple[str, str]) -> bool:
    """Whether an entity starts at the token tagged `current` (conlleval's startOfChunk)."""
    (before, kind_before), (now, kind_now) = previous, current
    return now in ("B", "S") or (now != OUTSIDE and (before in (OUTSIDE, "E", "S") or kind_now != kind_before))


def entities(tags: list[str]) -> set[tuple[str, int, int]]:
    """(type, first token, last token + 1) of each entity of one sentence's tags."""
    found, start, previous = set(), None, (OUTSIDE, "")
    for position, tag in enumerate([*tags, OUTSIDE]):
        current = split_tag(tag)
        if start is not None and ends_before(previous, current):
            found.add((previous[1], start, position))
            start = None
        if starts_at(previous, current):
            start = position
        previous = current
    return found


def entity_scores(true_tags: list[list[str]], predicted_tags: list[list[str]]) -> dict[str, float]:
    """precision, recall and f1 over all entities of all sentences (micro-averaged, as conlleval's
    first line), each type's f1 as f1_TYPE, and the share of tokens tagged right (accuracy)."""
    if len(true_tags) != len(predicted_tags):
        raise ValueError(f"{len(predicted_tags)} predicted sentences for {len(true_tags)}")
    correct, true_counts, predicted_counts = Counter(), Counter(), Counter()
    right_tokens = tokens = 0
    for true, predicted in zip(true_tags, predicted_tags):
        if len(true) != len(predicted):
            raise ValueError(f"a sentence of {len(true)} tokens has {len(predicted)} predicted tags")
        expected, found = entities(true), entities(predicted)
        true_counts.update(kind for kind, _, _ in expected)
        predicted_counts.update(kind for kind, _, _ in found)
        correct.update(kind for kind, _, _ in expected & found)
        right_tokens += sum(a == b for a, b in zip(true, predicted))
        tokens += len(true)
    scores = f1_scores(sum(correct.values()), sum(true_counts.values()), sum(predicted_counts.values()))
    for kind in sorted(true_counts | predicted_counts):
        scores[f"f1_{kind}"] = f1_scores(correct[kind], true_counts[kind], predicted_counts[kind])["f1"]
    return scores | {"accuracy": right_tokens / tokens if tokens else 0.0}


def f1_scores(correct: int, true: int, predicted: int) -> dict[str, float]:
    """Precision, recall and their harmonic mean; 0 where nothing was predicted or expected."""
    precision = correct / predicted if predicted else 0.0
    recall = correct / true if true else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {"precision": precision, "recall": recall, "f1": f1}
