"""src/tasks/squad_metrics.py: answers normalised and scored as the official SQuAD scripts do, and
unanswerable questions (v2.0) scored with the empty answer and the best no-answer threshold."""
import pytest

from tasks.squad_metrics import normalize_answer, squad_scores


def test_answers_are_normalised_and_scored_as_the_official_scripts_do():
    assert normalize_answer("The  Eiffel-Tower, in Paris!") == "eiffeltower in paris"
    assert normalize_answer("an apple a day") == "apple day"
    golds = {"q1": ["Denver Broncos", "The Denver Broncos"], "q2": ["Santa Clara, California"], "q3": ["1959"]}
    predictions = {"q1": "the Denver Broncos!", "q2": "Santa Clara", "q3": ""}
    scores = squad_scores(predictions, golds)
    # q1 exact; q2 F1 2 * (2/2 * 2/3) / (1 + 2/3) = 0.8; q3 empty against an answer: 0
    assert scores["exact"] == pytest.approx(100 / 3) and scores["f1"] == pytest.approx(100 * 1.8 / 3)


def test_unanswerable_questions_score_the_empty_answer_and_the_best_threshold():
    golds = {"has1": ["1959"], "has2": ["8 out of 10"], "no1": [], "no2": [""]}
    predictions = {"has1": "1959", "has2": "", "no1": "", "no2": "western"}
    margins = {"has1": -3.0, "has2": 1.0, "no1": 2.0, "no2": -1.0}  # no-answer score minus the best span's
    scores = squad_scores(predictions, golds, margins)
    assert scores["exact"] == 50.0 and scores["HasAns_exact"] == 50.0 and scores["NoAns_exact"] == 50.0
    # by rising margin: has1 (+1), no2 (answered: -1), has2 (abstained: +0), no1: the best is 3 of 4 at -3.0
    assert scores["best_exact"] == 75.0 and scores["best_exact_thresh"] == -3.0
