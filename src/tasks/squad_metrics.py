"""SQuAD's scores as its official evaluation scripts (v1.1 and v2.0) compute them: answers normalised
(lower case, no punctuation, no articles a/an/the, single spaces), exact match and token F1 taking
the best over the gold answers; an unanswerable question's only gold answer is the empty one. For
v2.0 also HasAns and NoAns and the no-answer threshold that would have scored best.
"""
import collections
import re
import string

PUNCTUATION = set(string.punctuation)
ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)


def normalize_answer(text: str) -> str:
    text = "".join(character for character in text.lower() if character not in PUNCTUATION)
    return " ".join(ARTICLES.sub(" ", text).split())


def exact_match(prediction: str, gold: str) -> float:
    return float(normalize_answer(prediction) == normalize_answer(gold))


def token_f1(prediction: str, gold: str) -> float:
    predicted, expected = normalize_answer(prediction).split(), normalize_answer(gold).split()
    if not predicted or not expected:  # an empty answer matches only an empty one
        return float(predicted == expected)
    common = sum((collections.Counter(predicted) & collections.Counter(expected)).values())
    if not common:
        return 0.0
    precision, recall = common / len(predicted), common / len(expected)
    return 2 * precision * recall / (precision + recall)


def question_scores(prediction: str, golds: list[str]) -> tuple[float, float]:
    """Exact match and F1 of one question against its gold answers ([""] where it has none)."""
    golds = [gold for gold in golds if normalize_answer(gold)] or [""]
    return max(exact_match(prediction, gold) for gold in golds), max(token_f1(prediction, gold) for gold in golds)


def squad_scores(predictions: dict[str, str], golds: dict[str, list[str]],
                 null_margins: dict[str, float] | None = None) -> dict[str, float]:
    """exact and f1 in percent over every question of golds (a missing prediction scores 0); with
    null_margins (v2: how far each question's no-answer score is above its best span's), HasAns_ and
    NoAns_ scores and best_exact, best_f1 with their thresholds on that margin."""
    scores = {qid: question_scores(predictions.get(qid, ""), gold) for qid, gold in golds.items()}
    result = {"exact": mean([each[0] for each in scores.values()]), "f1": mean([each[1] for each in scores.values()])}
    if null_margins is None:
        return result
    answerable = {qid for qid, gold in golds.items() if any(normalize_answer(each) for each in gold)}
    for name, kept in (("HasAns", answerable), ("NoAns", set(golds) - answerable)):
        if kept:
            result[f"{name}_exact"] = mean([scores[qid][0] for qid in kept])
            result[f"{name}_f1"] = mean([scores[qid][1] for qid in kept])
    for number, name in enumerate(("exact", "f1")):
        best, threshold = best_threshold(predictions, {qid: score[number] for qid, score in scores.items()},
                                         null_margins, answerable)
        result[f"best_{name}"], result[f"best_{name}_thresh"] = best, threshold
    return result


def best_threshold(predictions: dict[str, str], scores: dict[str, float], null_margins: dict[str, float],
                   answerable: set[str]) -> tuple[float, float]:
    """The official v2.0 sweep: questions by rising no-answer margin; answering those up to a
    threshold and abstaining on the rest, the best score (percent) and its threshold."""
    current = best = sum(1.0 for qid in scores if qid not in answerable)  # all abstain
    threshold = 0.0
    for qid in sorted(scores, key=lambda qid: null_margins.get(qid, 0.0)):
        if qid not in null_margins:
            continue
        if qid in answerable:
            current += scores[qid]
        elif predictions.get(qid):
            current -= 1
        if current > best:
            best, threshold = current, null_margins[qid]
    return 100.0 * best / max(len(scores), 1), threshold


def mean(values: list[float]) -> float:
    return 100.0 * sum(values) / len(values) if values else 0.0
