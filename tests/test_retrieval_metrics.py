"""src/tasks/retrieval_metrics.py: recall, MRR and nDCG as pytrec_eval defines them, and the best
documents of each query best first, ties in document order, in any chunking."""
import math

import numpy as np
import pytest

from tasks import retrieval_metrics
from tasks.retrieval_metrics import best_documents, retrieval_scores


def test_retrieval_scores_as_pytrec_eval_defines_them():
    ranked = np.array([[2, 0, 1], [1, 2, 0], [0, 1, 2]])
    relevant = [{0: 1.0}, {0: 2.0, 2: 1.0}, {2: 1.0}]
    scores = retrieval_scores(ranked, relevant)
    assert scores["recall@1"] == pytest.approx((0 + 0 + 0) / 3)
    assert scores["recall@10"] == pytest.approx(1.0)  # every relevant document within 10
    assert scores["mrr@10"] == pytest.approx((1 / 2 + 1 / 2 + 1 / 3) / 3)
    # query 2: gains 0, 1, 2 at ranks 1-3 against the ideal 2, 1
    second = (1 / math.log2(3) + 2 / math.log2(4)) / (2 + 1 / math.log2(3))
    assert scores["ndcg@10"] == pytest.approx((1 / math.log2(3) + second + 1 / math.log2(4)) / 3)


def test_the_best_documents_come_best_first_ties_in_document_order_in_any_chunking(monkeypatch):
    rng = np.random.default_rng(0)
    queries, documents = rng.normal(size=(7, 4)), rng.normal(size=(30, 4))
    documents[5] = documents[3]  # a tie: document 3 before 5
    full = best_documents(queries, documents)
    scores = queries @ documents.T
    assert (np.diff(np.take_along_axis(scores, full, 1), axis=1) <= 0).all()
    assert np.array_equal(full[:, 0], scores.argmax(1))
    tied = np.flatnonzero((full == 3) | (full == 5))
    assert all(full.flat[a] == 3 for a in tied[::2])
    monkeypatch.setattr(retrieval_metrics, "SCORES_AT_ONCE", 40)  # one query at a time
    assert np.array_equal(best_documents(queries, documents), full)
    assert best_documents(queries, documents[:4]).shape == (7, 4)  # fewer documents than the depth
