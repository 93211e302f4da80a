"""src/corpus/tokenizing.py: documents tokenized in batches of bounded size, on N processes, in input order."""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from errors import UserError
from corpus.tokenizing import Tokenizing, document_batches, document_ids, split_sentences


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


SRC = Path(__file__).resolve().parent.parent / "src"
# A preparation's pool at work, as prepare_mlm_dataset.py's is mid-write: two workers started, then it waits.
POOL_AT_WORK = """
import sys, time
sys.path.insert(0, {src!r})
from corpus.tokenizing import Tokenizing
from vocab import load_vocab
with Tokenizing(load_vocab({vocab!r}), workers=2) as two:
    results = two.map((index, ["a few words of a review"] * 20) for index in range(8))
    next(results)
    print("working", flush=True)
    time.sleep(600)
"""


def children_of(parent: int) -> set[int]:
    """The processes whose parent is `parent`, from /proc (the pool's workers, its resource tracker)."""
    children = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):  # ended meanwhile
            continue
        if int(fields[1]) == parent:
            children.add(int(stat.parent.name))
    return children


def alive(pid: int) -> bool:
    """Running, not ended: a zombie has ended and waits for whoever adopted it to reap it."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the kernel's parent-death signal is Linux's")
def test_the_workers_die_with_a_preparation_killed_mid_write(vocab_dir):
    """kill -9 of the process that started the pool: its workers go too, within seconds, rather than
    live on orphaned holding the pool's pipes."""
    parent = subprocess.Popen([sys.executable, "-c", POOL_AT_WORK.format(src=str(SRC), vocab=str(vocab_dir))],
                              stdout=subprocess.PIPE, text=True)
    workers = set()
    try:
        assert parent.stdout.readline() == "working\n"
        workers = children_of(parent.pid)
        assert len(workers) >= 2
        parent.kill()
        parent.wait()
        deadline = time.monotonic() + 10
        while any(alive(pid) for pid in workers) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not [pid for pid in workers if alive(pid)], "the workers outlived the process that started them"
    finally:
        parent.kill()
        for pid in workers:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)

def test_split_sentences_at_end_punctuation_and_whitespace():
    assert split_sentences("It was great. Really! Was it? \"Yes.\" (Sure.) 3.5 stars...ok") == \
        ["It was great.", "Really!", "Was it?", "\"Yes.\"", "(Sure.)", "3.5 stars...ok"]
    assert split_sentences("  no end  ") == ["no end"]
