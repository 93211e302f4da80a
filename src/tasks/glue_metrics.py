"""GLUE's metrics (accuracy, F1, Matthews, Pearson, Spearman; macro-F1 for your own classes, and the
multi-label ones), each task's score, and the two averages the field reports: the leaderboard's and
the BERT paper's (Cramming's)."""
import math

import numpy as np

from tasks.glue_tasks import TASKS, GlueTask


def accuracy(labels: np.ndarray, predictions: np.ndarray) -> float:
    return float(np.mean(np.asarray(labels) == np.asarray(predictions)))


def f1_score(labels: np.ndarray, predictions: np.ndarray) -> float:
    """F1 of class 1 (MRPC's equivalent, QQP's duplicate), as GLUE scores it; 0 with no true positive."""
    labels, predictions = np.asarray(labels) == 1, np.asarray(predictions) == 1
    return f1_from_counts(int(np.sum(labels & predictions)), int(np.sum(labels != predictions)))


def macro_f1(labels: np.ndarray, predictions: np.ndarray) -> float:
    """The mean of each class's F1, every class in the labels or the predictions weighed alike however
    rare (scikit-learn's f1_score(average="macro")): what accuracy hides on imbalanced classes."""
    labels, predictions = np.asarray(labels, np.int64), np.asarray(predictions, np.int64)
    scores = []
    for label in np.union1d(labels, predictions):
        true, predicted = labels == label, predictions == label
        scores.append(f1_from_counts(int(np.sum(true & predicted)), int(np.sum(true != predicted))))
    return float(np.mean(scores))


def matthews_correlation(labels: np.ndarray, predictions: np.ndarray) -> float:
    """Matthews correlation (CoLA), for any number of classes (Gorodkin's R_K, as scikit-learn's
    matthews_corrcoef); 0 where undefined, e.g. a model that always predicts one class."""
    labels, predictions = np.asarray(labels, np.int64), np.asarray(predictions, np.int64)
    classes = int(max(labels.max(), predictions.max())) + 1
    return matthews_from_confusion(
        np.bincount(labels * classes + predictions, minlength=classes * classes).reshape(classes, classes))


def matthews_from_confusion(confusion: np.ndarray) -> float:
    """Matthews correlation from counts[true, predicted]; 0 where undefined."""
    total, correct = float(confusion.sum()), float(np.trace(confusion))
    true_counts, predicted_counts = confusion.sum(1).astype(float), confusion.sum(0).astype(float)
    numerator = correct * total - true_counts @ predicted_counts
    denominator = math.sqrt(total ** 2 - predicted_counts @ predicted_counts) * math.sqrt(
        total ** 2 - true_counts @ true_counts)
    return float(numerator / denominator) if denominator else 0.0


def pearson(labels: np.ndarray, predictions: np.ndarray) -> float | None:
    """Pearson correlation (STS-B); None where undefined (constant predictions or labels), where
    scipy says NaN: not a score, so a collapsed model's 0 never reads as one."""
    x = np.asarray(labels, np.float64) - np.mean(labels)
    y = np.asarray(predictions, np.float64) - np.mean(predictions)
    denominator = math.sqrt(float(x @ x) * float(y @ y))
    return float(x @ y) / denominator if denominator else None


def spearman(labels: np.ndarray, predictions: np.ndarray) -> float | None:
    """Spearman correlation (STS-B): Pearson's on the ranks, ties at their average rank; None where undefined."""
    return pearson(average_ranks(labels), average_ranks(predictions))


def average_ranks(values: np.ndarray) -> np.ndarray:
    """Ranks from 1, tied values sharing the mean of their ranks (scipy's rankdata, 'average')."""
    values = np.asarray(values, np.float64)
    order = np.argsort(values, kind="stable")
    ordered = values[order]
    starts = np.flatnonzero(np.r_[True, ordered[1:] != ordered[:-1]])
    sizes = np.diff(np.r_[starts, len(values)])
    ranks = np.empty(len(values))
    ranks[order] = np.repeat(starts + (sizes + 1) / 2, sizes)
    return ranks


# ----------------------------------------------------------------------------- multi-label

def multi_label_metrics(labels: np.ndarray, predictions: np.ndarray) -> dict[str, float]:
    """Of 0-1 matrices [examples, classes] (scikit-learn's indicator arrays), scikit-learn's numbers:
    micro-F1 (every yes-or-no decision pooled), macro-F1 (each class's F1 weighed alike, 0 for a class
    neither labelled nor predicted), subset accuracy (an example right in every class) and Hamming
    loss (the share of wrong decisions)."""
    true, predicted = np.asarray(labels) > 0.5, np.asarray(predictions) > 0.5
    hits = (true & predicted).sum(0)
    wrong = (true != predicted).sum(0)
    return {"f1_micro": f1_from_counts(int(hits.sum()), int(wrong.sum())),
            "f1_macro": float(np.mean([f1_from_counts(int(h), int(w)) for h, w in zip(hits, wrong)])),
            "subset_accuracy": float(np.mean((true == predicted).all(1))),
            "hamming_loss": float(np.mean(true != predicted))}


def f1_from_counts(hits: int, wrong: int) -> float:
    """F1 from true positives and the false ones of both kinds together; 0 with no true positive."""
    return 2 * hits / (2 * hits + wrong) if hits else 0.0


METRICS = {"matthews": matthews_correlation, "accuracy": accuracy, "f1": f1_score, "pearson": pearson,
           "spearman": spearman, "f1_micro": lambda labels, predictions:
           multi_label_metrics(labels, predictions)["f1_micro"]}


def task_metrics(task: GlueTask, labels: np.ndarray, predictions: np.ndarray) -> dict[str, float | None]:
    """The task's GLUE metrics of one dev split (fractions, not percent): class ids for a
    classification task, scores for STS-B; None for a correlation that is undefined."""
    return {name: METRICS[name](labels, predictions) for name in task.metrics}


def task_score(task: GlueTask, metrics: dict[str, float | None]) -> float | None:
    """The one number GLUE gives a task: its metric, or the mean of its two (MRPC and QQP: F1 and
    accuracy; STS-B: Pearson and Spearman); None where one is undefined. best.pt is picked by it."""
    values = [metrics[name] for name in task.metrics]
    return None if None in values else float(np.mean(values))


# ----------------------------------------------------------------------------- averages

def result_task(result: str) -> GlueTask:
    """The task a result belongs to: `mnli_matched` is MNLI's."""
    return next(task for task in TASKS.values() if result in task.dev_results.values())


def leaderboard_average(results: dict[str, dict[str, float]]) -> float | None:
    """The GLUE leaderboard's score: the mean of nine task scores (CoLA, SST-2, MRPC, STS-B, QQP,
    MNLI, QNLI, RTE, WNLI), each the mean of the task's metrics, MNLI's the mean of its matched and
    mismatched accuracy; AX does not count. Checked against the BERT paper's test results: BERT-large
    (60.5, 94.9, 89.3/85.4, 87.6/86.5, 72.1/89.3, 86.7/85.9, 92.7, 70.1, 65.1) gives 80.5, its
    leaderboard score; counting MNLI-m and MNLI-mm as two tasks would give 81.1.

    `results` maps result names (`cola`, `mnli_matched`, `mnli_mismatched`, ...) to task_metrics;
    None while a task is missing or its score undefined."""
    names = [result for task in TASKS.values() if task.name != "ax" for result in task.dev_results.values()]
    if any(name not in results for name in names):
        return None
    scores = {name: task_score(result_task(name), results[name]) for name in names}
    if None in scores.values():
        return None
    scores["mnli"] = (scores.pop("mnli_matched") + scores.pop("mnli_mismatched")) / 2
    return float(np.mean(list(scores.values())))


def cramming_average(results: dict[str, dict[str, float]]) -> float | None:
    """The average Cramming reports, the BERT paper's (Table 1): WNLI left out, MNLI matched and
    mismatched counted as two, and one metric per task: F1 for MRPC and QQP, Spearman for STS-B,
    Matthews for CoLA, accuracy elsewhere. Checked: the BERT paper's BERT-large numbers above
    give its 82.1. None while a task is missing or its metric undefined."""
    names = [result for task in TASKS.values() if task.name not in ("ax", "wnli")
             for result in task.dev_results.values()]
    if any(name not in results for name in names):
        return None
    values = [results[name][result_task(name).headline_metric] for name in names]
    return None if None in values else float(np.mean(values))
