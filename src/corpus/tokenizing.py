"""Tokenizing batches of documents in N worker processes, results in input order and memory bounded:
what tokenize_text.py and the shard preparers share; documents as ids, or as sentences' ids (for
sentence pairs). The result never depends on N.
"""
import collections
import itertools
import multiprocessing
import os
import re
import signal
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Iterator

import numpy as np

from child_processes import die_with_parent
from errors import UserError
from vocab import Vocab, load_vocab

ENCODE_BATCH_CHARS = 1 << 20
KINDS = ("ids", "documents", "sentences")

# A sentence ends at . ! or ?, maybe followed by a closing quote or bracket, then whitespace.
# Abbreviations ("Mr. Smith") split too: a pair boundary there costs little.
SENTENCE_END = re.compile(r"(?<=[.!?])\s+|(?<=[.!?][\"')\]])\s+")


def document_batches(documents: list[str], batch_chars: int = ENCODE_BATCH_CHARS) -> Iterator[list[str]]:
    """Consecutive documents in groups of about batch_chars characters."""
    batch, size = [], 0
    for document in documents:
        batch.append(document)
        size += len(document)
        if size >= batch_chars:
            yield batch
            batch, size = [], 0
    if batch:
        yield batch


def document_ids(vocab: Vocab, documents: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """The ids of every document, concatenated, as the vocabulary's id dtype; and each document's
    count of them."""
    # The tokenizer's Encoding objects take ~150 bytes a token: encoding in batches of about a
    # megabyte keeps them small (and is faster than one huge batch).
    arrays, lengths = [], []
    for batch in document_batches(documents):
        encoded = vocab.encode(batch)
        counts = [len(ids) for ids in encoded]
        lengths += counts
        arrays.append(np.fromiter(itertools.chain.from_iterable(encoded), dtype=vocab.id_dtype, count=sum(counts)))
    ids = np.concatenate(arrays) if arrays else np.empty(0, dtype=vocab.id_dtype)
    return ids, np.array(lengths, dtype=np.int64)


def encode(vocab: Vocab, kind: str, documents: list[str]):
    """ids: the documents' ids concatenated; documents: those ids and each document's count of them;
    sentences: each document as its sentences' ids."""
    if kind == "ids":
        return document_ids(vocab, documents)[0]
    if kind == "documents":
        return document_ids(vocab, documents)
    return encode_documents(vocab, documents)


def split_sentences(text: str) -> list[str]:
    return [sentence for sentence in SENTENCE_END.split(text.strip()) if sentence]


def encode_documents(vocab, lines: list[str]) -> list[list[np.ndarray]]:
    """One document per line, as its sentences' word pieces; sentences and documents without
    pieces are left out. All sentences of the lines go through the tokenizer at once."""
    sentences = [split_sentences(line) for line in lines]
    encoded = vocab.encode([sentence for document in sentences for sentence in document])
    documents, start = [], 0
    for document in sentences:
        pieces = [np.array(ids, dtype=np.int32) for ids in encoded[start:start + len(document)] if ids]
        start += len(document)
        if pieces:
            documents.append(pieces)
    return documents



worker_vocab: Vocab | None = None  # one per worker process, loaded once by start_worker


def one_thread_each():
    # Workers are already parallel: one tokenizer thread each avoids oversubscribing the cores.
    os.environ["TOKENIZERS_PARALLELISM"] = "false"


def start_worker(vocab_path, parent: int):
    """A worker's start: it dies with the process that started the pool, however that ends (kill -9
    mid-write too), rather than live on orphaned holding the pool's pipes; it leaves Ctrl-C, which
    reaches the whole process group, to the parent, which answers it after the batches in flight."""
    die_with_parent(parent)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    one_thread_each()
    global worker_vocab
    worker_vocab = load_vocab(vocab_path)


def encode_in_worker(kind: str, documents: list[str]):
    return encode(worker_vocab, kind, documents)


WORKER_DIED = ("a tokenizing worker process died (killed, or out of memory); the same command goes on from the "
               "work already finished")


class Tokenizing:
    """map((tag, documents), ...) -> (tag, encoded), in order, on `workers` processes (1: this one,
    on one core, so that -n 1 against -n 2 compares one core with two).

    Submitting at most 2 * workers batches at a time keeps memory bounded while every worker always
    has a batch queued. On leaving (an error, Ctrl-C) the batches in flight finish and nothing else
    starts: a pool that is terminated while a large batch is half sent can wait forever.
    """

    def __init__(self, vocab: Vocab, workers: int, kind: str = "ids"):
        self.vocab, self.workers, self.kind = vocab, workers, kind
        self.pool = None

    def __enter__(self):
        if self.workers == 1:
            one_thread_each()
        else:
            # spawn, not fork: a forked child of a process that already used the tokenizers thread pool
            # gets its parallelism disabled with a warning, and spawn is the same on every platform.
            # The workers start at map's first submits, from map's thread: their parent-death signal
            # comes when that thread ends, so map runs on the thread that lasts (the scripts' main one).
            self.pool = ProcessPoolExecutor(self.workers, mp_context=multiprocessing.get_context("spawn"),
                                            initializer=start_worker, initargs=(self.vocab.path, os.getpid()))
        return self

    def __exit__(self, *exception):
        if self.pool is not None:
            self.pool.shutdown(wait=True, cancel_futures=True)
        return False

    def map(self, jobs) -> Iterator[tuple[object, object]]:
        if self.pool is None:
            for tag, documents in jobs:
                yield tag, encode(self.vocab, self.kind, documents)
            return
        in_flight = collections.deque()
        for tag, documents in jobs:
            in_flight.append((tag, self.submitted(documents)))
            if len(in_flight) >= 2 * self.workers:
                yield self.finished(*in_flight.popleft())
        while in_flight:
            yield self.finished(*in_flight.popleft())

    def submitted(self, documents):
        """The pool's future of the documents' encoding; a pool whose worker died before this job
        refuses it at once, before any future says so."""
        try:
            return self.pool.submit(encode_in_worker, self.kind, documents)
        except BrokenProcessPool:
            raise UserError(WORKER_DIED) from None

    @staticmethod
    def finished(tag, future) -> tuple[object, object]:
        try:
            return tag, future.result()
        except BrokenProcessPool:
            raise UserError(WORKER_DIED) from None
