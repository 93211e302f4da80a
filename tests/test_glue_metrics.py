"""src/tasks/glue_metrics.py: the metrics against scipy and by hand, a task's score as the mean of its
metrics, and both averages on BERT-large's published numbers."""
import numpy as np
import pytest
from scipy.stats import pearsonr, spearmanr

from tasks.glue_metrics import (accuracy, cramming_average, f1_score, leaderboard_average, macro_f1,
                                matthews_correlation, multi_label_metrics, pearson, spearman, task_metrics,
                                task_score)
from tasks.glue_tasks import TASKS


def test_correlations_match_scipy_with_ties():
    rng = np.random.default_rng(0)
    labels = np.round(rng.uniform(0, 5, 200) * 2) / 2  # STS-B-like, many ties
    predictions = np.round(labels + rng.normal(0, 1, 200), 1)
    assert pearson(labels, predictions) == pytest.approx(pearsonr(labels, predictions)[0], abs=1e-12)
    assert spearman(labels, predictions) == pytest.approx(spearmanr(labels, predictions)[0], abs=1e-12)


def test_a_correlation_of_constant_predictions_is_undefined_as_scipy_says_not_a_score():
    """scipy's NaN (and ConstantInputWarning) is None here: a collapsed STS-B model has no score,
    so no 0.0 reads as one, and a task or average made from it is undefined too."""
    labels, constant = np.array([0.0, 2.5, 5.0, 1.0]), np.full(4, 2.5)
    assert pearson(labels, constant) is None and spearman(labels, constant) is None
    assert pearson(constant, labels) is None  # constant labels: undefined too
    metrics = task_metrics(TASKS["stsb"], labels, constant)
    assert metrics == {"pearson": None, "spearman": None} and task_score(TASKS["stsb"], metrics) is None
    collapsed = BERT_LARGE_TEST | {"stsb": metrics}
    assert leaderboard_average(collapsed) is None and cramming_average(collapsed) is None


def test_matthews_f1_and_accuracy_by_hand():
    # tp 1, tn 2, fp 0, fn 1: (1*2 - 0*1) / sqrt((1+0)(1+1)(2+0)(2+1)) = 2 / sqrt(12)
    assert matthews_correlation([1, 1, 0, 0], [1, 0, 0, 0]) == pytest.approx(2 / np.sqrt(12))
    tn, fp, fn, tp = 50, 10, 5, 35
    labels = np.repeat([0, 0, 1, 1], [tn, fp, fn, tp])
    predictions = np.repeat([0, 1, 0, 1], [tn, fp, fn, tp])
    expected = (tp * tn - fp * fn) / np.sqrt((tp + fp) * (tp + fn) * (tn + fp) * (tn + fn))
    assert matthews_correlation(labels, predictions) == pytest.approx(expected)
    assert matthews_correlation(labels, np.zeros_like(labels)) == 0.0  # one class always: undefined
    # tp 2, fp 1, fn 1: precision = recall = 2/3, so F1 = 2/3
    assert f1_score([1, 1, 1, 0, 0], [1, 1, 0, 1, 0]) == pytest.approx(2 / 3)
    assert f1_score([1, 0], [0, 0]) == 0.0
    assert accuracy([1, 1, 1, 0, 0], [1, 1, 0, 1, 0]) == pytest.approx(0.6)


def test_macro_f1_weighs_every_class_alike_by_hand():
    # class 0: 1 hit of 2 true, 2 predicted: F1 2/4; class 1: 1 of 1 and 2: 2/3; class 2: 2 of 3 and 2: 4/5
    assert macro_f1([0, 0, 1, 2, 2, 2], [0, 1, 1, 2, 2, 0]) == pytest.approx((1 / 2 + 2 / 3 + 4 / 5) / 3)
    # a rare class missed: accuracy 0.9, macro-F1 the mean of 18/19 and 0 (a class never true but predicted: 0)
    labels, predictions = [0] * 9 + [1], [0] * 10
    assert accuracy(labels, predictions) == pytest.approx(0.9)
    assert macro_f1(labels, predictions) == pytest.approx((18 / 19 + 0) / 2)
    assert macro_f1([0, 0], [0, 2]) == pytest.approx((2 / 3 + 0) / 2)
    assert macro_f1([1, 0, 2], [1, 0, 2]) == 1.0 and type(macro_f1([1], [1])) is float


def test_a_task_with_two_metrics_scores_their_mean():
    metrics = task_metrics(TASKS["mrpc"], np.array([1, 1, 1, 0, 0]), np.array([1, 1, 0, 1, 0]))
    assert metrics == pytest.approx({"f1": 2 / 3, "accuracy": 0.6})
    assert task_score(TASKS["mrpc"], metrics | {"loss": 0.5}) == pytest.approx((2 / 3 + 0.6) / 2)
    assert set(task_metrics(TASKS["stsb"], np.array([1.0, 2, 3]), np.array([1.5, 2, 2.5]))) == {"pearson", "spearman"}


BERT_LARGE_TEST = {  # the BERT paper's GLUE test results for BERT-large, as fractions
    "cola": {"matthews": 0.605}, "sst2": {"accuracy": 0.949}, "mrpc": {"f1": 0.893, "accuracy": 0.854},
    "stsb": {"pearson": 0.876, "spearman": 0.865}, "qqp": {"f1": 0.721, "accuracy": 0.893},
    "mnli_matched": {"accuracy": 0.867}, "mnli_mismatched": {"accuracy": 0.859}, "qnli": {"accuracy": 0.927},
    "rte": {"accuracy": 0.701}, "wnli": {"accuracy": 0.651}}


def test_the_averages_give_the_published_numbers():
    assert leaderboard_average(BERT_LARGE_TEST) == pytest.approx(0.805, abs=5e-4)  # the leaderboard's 80.5
    assert cramming_average(BERT_LARGE_TEST) == pytest.approx(0.821, abs=5e-4)  # the BERT paper's 82.1
    without_rte = {name: metrics for name, metrics in BERT_LARGE_TEST.items() if name != "rte"}
    assert leaderboard_average(without_rte) is None and cramming_average(without_rte) is None
    assert cramming_average({name: m for name, m in BERT_LARGE_TEST.items() if name != "wnli"}) is not None


def test_multi_label_metrics_by_hand():
    """Three classes, four examples: class 0 hit twice and once too often, class 1 hit once and missed
    once, class 2 missed; scikit-learn's f1_score(average=micro/macro), accuracy_score, hamming_loss."""
    labels = np.array([[1, 0, 1], [0, 0, 0], [1, 1, 0], [0, 1, 0]])
    predictions = np.array([[1, 0, 0], [0, 0, 0], [1, 0, 0], [1, 1, 0]])
    metrics = multi_label_metrics(labels, predictions)
    assert metrics["f1_micro"] == pytest.approx(6 / 9)  # 3 hits, 3 wrong decisions
    assert metrics["f1_macro"] == pytest.approx((4 / 5 + 2 / 3 + 0) / 3)
    assert metrics["subset_accuracy"] == 0.25 and metrics["hamming_loss"] == 0.25
    assert multi_label_metrics(labels, labels)["f1_macro"] == 1.0
