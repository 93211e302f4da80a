"""Retrieval's scores as BEIR and MTEB report them (pytrec_eval's definitions): recall@k, MRR@10 and
nDCG@10 over the judged queries, from each query's best documents by cosine similarity."""
import math

import numpy as np

CUTOFF = 10  # the depth of MRR and nDCG, and of the ranking kept
SCORES_AT_ONCE = 2**25  # similarities held at a time (128 MiB of float32): memory bounded for any corpus


def best_documents(queries: np.ndarray, documents: np.ndarray, depth: int = CUTOFF) -> np.ndarray:
    """Each query's `depth` documents of highest similarity (the vectors' dot product, the cosine for
    unit vectors), best first, ties in document order: [queries, depth] document numbers."""
    depth = min(depth, len(documents))
    rows_at_once = max(1, SCORES_AT_ONCE // max(len(documents), 1))
    ranked = []
    for start in range(0, len(queries), rows_at_once):
        scores = queries[start:start + rows_at_once] @ documents.T
        top = np.argpartition(-scores, depth - 1, axis=1)[:, :depth] if depth < scores.shape[1] else \
            np.tile(np.arange(scores.shape[1]), (len(scores), 1))
        # best first; equal scores in document order, whatever order argpartition left them in
        order = np.lexsort((top, -np.take_along_axis(scores, top, 1)), axis=1)
        ranked.append(np.take_along_axis(top, order, 1))
    return np.concatenate(ranked) if ranked else np.zeros((0, depth), np.int64)


def retrieval_scores(ranked: np.ndarray, relevant: list[dict[int, float]]) -> dict[str, float]:
    """Means over the queries of recall@1, recall@10 (the share of a query's relevant documents
    found), MRR@10 (1 / the rank of the first relevant one) and nDCG@10 (graded: the gain is the
    relevance, discounted by log2(rank + 1), over the best order's)."""
    totals = {"recall@1": 0.0, "recall@10": 0.0, "mrr@10": 0.0, "ndcg@10": 0.0}
    for documents, grades in zip(ranked.tolist(), relevant):
        found = [grades.get(document, 0.0) for document in documents[:CUTOFF]]
        hits = [grade > 0 for grade in found]
        totals["recall@1"] += sum(hits[:1]) / len(grades)
        totals["recall@10"] += sum(hits) / len(grades)
        totals["mrr@10"] += next((1 / rank for rank, hit in enumerate(hits, 1) if hit), 0.0)
        ideal = sorted(grades.values(), reverse=True)[:CUTOFF]
        totals["ndcg@10"] += discounted_gain(found) / discounted_gain(ideal)
    return {name: total / len(relevant) for name, total in totals.items()}


def discounted_gain(grades: list[float]) -> float:
    return sum(grade / math.log2(rank + 1) for rank, grade in enumerate(grades, 1))
