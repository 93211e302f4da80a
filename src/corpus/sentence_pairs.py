"""Sentence pairs for next-sentence (BERT) and sentence-order (ALBERT) prediction: documents cut
into sentences (tokenizing.py), pairs built as Google's create_pretraining_data.py builds them.

A sample is [CLS] A [SEP] B [SEP]. Sentences end at ., ! or ? (maybe followed by a closing quote
or bracket) before whitespace. Each document's sentences are gathered into chunks of up to m-3
word pieces (10% of documents aim shorter, at 2 to m-3), each chunk is cut at a random sentence
boundary into A and B, and the longer side is trimmed at a random end until the pair fits.
NSP: B continues A (label 0) or, with probability 0.5, comes from another document of the same
split (label 1; B's own sentences then start the next chunk). SOP: B always continues A; with
probability 0.5 the two are swapped (label 1). Documents, not samples, go to a split, so no
document is in two; NSP's random B comes from one of the next 1,000 documents of its split (the
last 1,000 at the end), which keeps memory bounded where BERT draws from the whole corpus. A chunk
needs two sentences, so one-sentence documents give no pair; the summary counts them.
"""
from collections import deque
from typing import Callable, NamedTuple

import numpy as np

from config import SENTENCE_OBJECTIVES
from corpus.preparation import DEFAULT_SHARES, SPLITS, assign_splits

OBJECTIVES = SENTENCE_OBJECTIVES[1:]  # nsp, sop: "none" makes no pairs
IS_NEXT, RANDOM_NEXT = 0, 1  # NSP labels, as transformers' next_sentence_label
IN_ORDER, SWAPPED = 0, 1  # SOP labels
SHORT_TARGET_PROBABILITY = 0.1  # BERT's short_seq_prob: some samples shorter than seq-len
NEGATIVE_WINDOW = 1000  # documents of a split held in memory to draw NSP's random B from


class Pair(NamedTuple):
    first: np.ndarray  # A's word pieces
    second: np.ndarray  # B's word pieces
    label: int  # NSP: RANDOM_NEXT or IS_NEXT; SOP: SWAPPED or IN_ORDER
    document: int  # A's document, by its running index in the input
    second_document: int  # B's: another one for NSP's random B, else the same


def truncate_pair(first: np.ndarray, second: np.ndarray, max_pieces: int,
                  rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """BERT's truncate_seq_pair: take pieces off the longer side (B on a tie) until both fit,
    each piece from the front or the back at random."""
    excess = max(0, len(first) + len(second) - max_pieces)
    from_first = min(excess, max(0, len(first) - len(second)))
    from_second = min(excess - from_first, max(0, len(second) - len(first)))
    even = excess - from_first - from_second  # then they alternate, B first
    from_first, from_second = from_first + even // 2, from_second + even - even // 2
    return trim(first, from_first, rng), trim(second, from_second, rng)


def trim(pieces: np.ndarray, count: int, rng: np.random.Generator) -> np.ndarray:
    front = int(rng.binomial(count, 0.5)) if count else 0
    return pieces[front:len(pieces) - (count - front)]


def chunk_end(sentences: list[np.ndarray], start: int, target: int) -> int:
    """End of the chunk that starts at `start`: sentences until it holds target pieces, but at
    least two (so it splits into A and B) and never leaving a lone last sentence behind."""
    length, end = 0, start
    while end < len(sentences):
        length += len(sentences[end])
        end += 1
        if length >= target and end - start >= 2 and len(sentences) - end != 1:
            break
    return end


def random_continuation(sentences: list[np.ndarray], length: int, rng: np.random.Generator) -> np.ndarray:
    """Sentences from a random one on, until they hold `length` pieces (at least one sentence)."""
    taken, total = [], 0
    for sentence in sentences[int(rng.integers(len(sentences))):]:
        taken.append(sentence)
        total += len(sentence)
        if total >= length:
            break
    return np.concatenate(taken)


OtherDocument = Callable[[np.random.Generator], tuple[int, list[np.ndarray]]]


def document_pairs(index: int, sentences: list[np.ndarray], objective: str, max_pieces: int,
                   rng: np.random.Generator, other_document: OtherDocument | None = None) -> tuple[list[Pair], int]:
    """Pairs from one document, as create_instances_from_document does: chunks of sentences up to a
    target length, each cut at a random sentence boundary into A and B; A and B together hold at
    most max_pieces. other_document(rng) gives NSP's random (index, sentences).

    Returns the pairs and the sentences left over: a chunk of one sentence (a one-sentence
    document, or the last sentence after NSP put back B's unused ones) has no B.
    """
    target = max_pieces if rng.random() >= SHORT_TARGET_PROBABILITY else int(rng.integers(2, max_pieces + 1))
    pairs, start = [], 0
    while start < len(sentences):
        end = chunk_end(sentences, start, target)
        if end - start < 2:
            return pairs, end - start
        split_at = int(rng.integers(start + 1, end))
        first = np.concatenate(sentences[start:split_at])
        label = int(rng.random() < 0.5)
        if objective == "nsp" and label == RANDOM_NEXT:
            second_index, other = other_document(rng)
            second = random_continuation(other, target - len(first), rng)
            next_start = split_at  # B's own sentences are put back for the next chunk, as BERT does
        else:
            second, second_index, next_start = np.concatenate(sentences[split_at:end]), index, end
            if objective == "sop" and label == SWAPPED:
                first, second = second, first
        first, second = truncate_pair(first, second, max_pieces, rng)
        pairs.append(Pair(first, second, label, index, second_index))
        start = next_start
    return pairs, 0


class PairMaker:
    """Documents in input order to pairs, each tagged with its split.

    A document's split comes from a hash of its running index (preparation.assign_splits), so no
    document spans two splits, and its pairs from a generator seeded by (seed, index): chunking
    and buffering never change the result. NSP draws the random B from the other documents in a
    window of `window` documents of the same split (the next ones; at the end, the last ones), since
    they must be in memory; BERT draws from the whole corpus. A split of a single document has no
    other document, so that document gives no NSP pairs (counted in lonely_documents).
    """

    def __init__(self, objective: str, max_pieces: int, seed: int, window: int = NEGATIVE_WINDOW,
                 shares: tuple[float, float] = DEFAULT_SHARES, first_document: int = 0):
        if objective not in OBJECTIVES:
            raise ValueError(f"objective {objective!r} is not one of {OBJECTIVES}")
        self.objective, self.max_pieces, self.seed, self.window = objective, max_pieces, seed, window
        self.shares, self.first_document = shares, first_document  # a unit's documents start there
        self.waiting = [deque() for _ in SPLITS]  # NSP: (index, sentences) per split
        self.documents = self.left_over_sentences = self.lonely_documents = 0

    def add(self, documents: list[list[np.ndarray]]) -> list[tuple[int, Pair]]:
        """(split code, pair) for the documents whose pairs are now complete."""
        first = self.first_document + self.documents
        codes = assign_splits(self.seed, np.arange(first, first + len(documents)), self.shares)
        made = []
        for code, sentences in zip(codes.tolist(), documents):
            index = self.first_document + self.documents
            self.documents += 1
            if self.objective == "sop":
                made += self._pairs(code, index, sentences, None)
                continue
            window = self.waiting[code]
            window.append((index, sentences))
            if len(window) == self.window:
                made += self._pairs(code, index=window[0][0], sentences=window[0][1], window=window, own=0)
                window.popleft()
        return made

    def finish(self) -> list[tuple[int, Pair]]:
        """The pairs of the documents still waiting for NSP partners."""
        made = []
        for code, window in enumerate(self.waiting):
            for own, (index, sentences) in enumerate(window):
                made += self._pairs(code, index, sentences, window, own)
            window.clear()
        return made

    def _pairs(self, code: int, index: int, sentences: list[np.ndarray], window: deque | None,
               own: int = 0) -> list[tuple[int, Pair]]:
        if window is not None and len(window) < 2:
            self.lonely_documents += 1
            return []
        other = None if window is None else lambda rng: other_in_window(window, own, rng)
        pairs, left_over = document_pairs(index, sentences, self.objective, self.max_pieces,
                                          np.random.default_rng([self.seed, index]), other)
        self.left_over_sentences += left_over
        return [(code, pair) for pair in pairs]


def other_in_window(window: deque, own: int, rng: np.random.Generator) -> tuple[int, list[np.ndarray]]:
    """A random document of the window other than the one at position `own`."""
    position = int(rng.integers(len(window) - 1))
    return window[position + (position >= own)]


def pair_sample(pair: Pair, cls_id: int, sep_id: int) -> np.ndarray:
    return np.concatenate(([cls_id], pair.first, [sep_id], pair.second, [sep_id]))
