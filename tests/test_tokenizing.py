"""src/tokenizing.py: documents tokenized in batches of bounded size, on N processes, in input order."""
import os
import signal

import numpy as np
import pytest

from errors import UserError
from tokenizing import Tokenizing, document_batches, document_ids, split_sentences


def test_batches_hold_about_batch_chars_and_keep_every_document_in_order():
    documents = ["a" * size for size in (5, 1, 7, 2, 2, 9, 3)]
    batches = list(document_batches(documents, batch_chars=8))
    assert sum(batches, []) == documents
    assert all(sum(map(len, batch)) >= 8 for batch in batches[:-1])
    assert all(sum(map(len, batch[:-1])) < 8 for batch in batches)  # each ends at the first that reaches it


def test_ids_are_each_document_encoded_and_concatenated_with_their_counts(vocab, imdb_reviews):
    documents = [*imdb_reviews[:40], ""]
    ids, lengths = document_ids(vocab, documents)
    assert ids.dtype == vocab.id_dtype
    assert ids.tolist() == [token for encoded in vocab.encode(documents) for token in encoded]
    assert lengths.tolist() == [len(encoded) for encoded in vocab.encode(documents)] and lengths[-1] == 0
    assert len(document_ids(vocab, [])[0]) == 0


def test_two_processes_give_one_process_results_in_input_order(vocab, imdb_reviews):
    jobs = [(index, imdb_reviews[index * 25:(index + 1) * 25]) for index in range(8)]
    with Tokenizing(vocab, workers=1) as one:
        serial = list(one.map(jobs))
    with Tokenizing(vocab, workers=2) as two:
        parallel = list(two.map(iter(jobs)))
    assert [tag for tag, _ in parallel] == list(range(8))
    assert all(np.array_equal(a, b) for (_, a), (_, b) in zip(serial, parallel))


def test_a_worker_that_dies_is_one_line_and_the_pool_shuts_down(vocab, imdb_reviews):
    jobs = ((index, imdb_reviews[:50]) for index in range(40))
    with pytest.raises(UserError, match="a tokenizing worker process died"):
        with Tokenizing(vocab, workers=2) as two:
            for index, _ in two.map(jobs):
                if index == 0:
                    os.kill(next(iter(two.pool._processes)), signal.SIGKILL)  # as the out-of-memory killer would


def test_split_sentences_at_end_punctuation_and_whitespace():
    assert split_sentences("It was great. Really! Was it? \"Yes.\" (Sure.) 3.5 stars...ok") == \
        ["It was great.", "Really!", "Was it?", "\"Yes.\"", "(Sure.)", "3.5 stars...ok"]
    assert split_sentences("  no end  ") == ["no end"]
