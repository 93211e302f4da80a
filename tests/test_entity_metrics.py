"""Entity-level scores of token classification against seqeval, the reference (conlleval's rules)."""
import random

import pytest

from tasks.entity_metrics import entities, entity_scores


def test_entities_of_bio_iob1_and_iobes_tags():
    assert entities(["B-PER", "I-PER", "O", "B-LOC"]) == {("PER", 0, 2), ("LOC", 3, 4)}
    # IOB1: I- starts an entity after O or another type; B- only splits two of one type
    assert entities(["I-ORG", "I-ORG", "B-ORG", "O", "I-PER"]) == {("ORG", 0, 2), ("ORG", 2, 3), ("PER", 4, 5)}
    assert entities(["B-PER", "I-LOC"]) == {("PER", 0, 1), ("LOC", 1, 2)}  # a type change ends one
    assert entities(["S-PER", "B-LOC", "E-LOC", "E-LOC"]) == {("PER", 0, 1), ("LOC", 1, 3), ("LOC", 3, 4)}
    assert entities(["O", "O"]) == set() and entities([]) == set()


def test_scores_of_hand_made_predictions():
    true = [["B-PER", "I-PER", "O", "B-LOC"], ["O", "B-ORG"]]
    predicted = [["B-PER", "O", "O", "B-LOC"], ["O", "O"]]  # PER cut short, ORG missed
    scores = entity_scores(true, predicted)
    assert scores["precision"] == 0.5 and scores["recall"] == pytest.approx(1 / 3)
    assert scores["f1"] == pytest.approx(0.4) and scores["f1_LOC"] == 1.0 and scores["f1_ORG"] == 0.0
    assert scores["accuracy"] == pytest.approx(4 / 6)
    nothing = entity_scores([["O", "B-PER"]], [["O", "O"]])  # nothing predicted: zero, not a division error
    assert nothing["precision"] == nothing["recall"] == nothing["f1"] == 0.0


def random_tags(generator: random.Random, length: int, scheme: str) -> list[str]:
    prefixes = {"bio": "BI", "iob1": "IIB", "iobes": "BIES"}[scheme]
    return [generator.choice(["O", "O", f"{generator.choice(prefixes)}-{generator.choice(['PER', 'LOC'])}"])
            for _ in range(length)]


@pytest.mark.parametrize("scheme", ["bio", "iob1", "iobes"])
def test_scores_equal_seqevals_on_random_sentences(scheme):
    metrics = pytest.importorskip("seqeval.metrics")
    generator = random.Random(scheme)
    true = [random_tags(generator, generator.randint(1, 12), scheme) for _ in range(300)]
    predicted = [[tag if generator.random() < 0.7 else random_tags(generator, 1, scheme)[0] for tag in sentence]
                 for sentence in true]
    ours = entity_scores(true, predicted)
    assert ours["precision"] == pytest.approx(metrics.precision_score(true, predicted))
    assert ours["recall"] == pytest.approx(metrics.recall_score(true, predicted))
    assert ours["f1"] == pytest.approx(metrics.f1_score(true, predicted))
    report = metrics.classification_report(true, predicted, output_dict=True)
    assert ours["f1_PER"] == pytest.approx(report["PER"]["f1-score"])
    assert ours["accuracy"] == pytest.approx(metrics.accuracy_score(true, predicted))
