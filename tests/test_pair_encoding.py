"""src/tasks/pair_encoding.py: sentence pairs cut as transformers cuts them, token and segment ids equal
to transformers' on real sentences, and padding."""
import numpy as np
import pytest

from tasks.pair_encoding import encode_examples, kept_lengths
from vocab import load_vocab


@pytest.fixture(scope="module")
def synthetic_vocab(tmp_path_factory):
    """One word piece per word w0, w1, ...: a pair of n and m words is n and m pieces long."""
    path = tmp_path_factory.mktemp("synthetic_vocab") / "vocab.txt"
    path.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(20)]) + "\n")
    return path


def test_pairs_are_cut_as_transformers_cuts_them(synthetic_vocab):
    """The longer side first; when both are cut, each keeps half, the longer the odd piece."""
    from transformers import BertTokenizer
    reference = BertTokenizer(str(synthetic_vocab))
    words = [f"w{i}" for i in range(20)]
    for first in range(1, 13):
        for second in range(1, 13):
            for seq_len in range(4, 20):
                encoded = reference(" ".join(words[:first]), " ".join(words[:second]), truncation="longest_first",
                                    max_length=seq_len)
                kept = (encoded["token_type_ids"].count(0) - 2, encoded["token_type_ids"].count(1) - 1)
                assert kept_lengths(first, second, seq_len - 3) == kept, (first, second, seq_len)
    assert kept_lengths(10, 3, 5) == (3, 2) and kept_lengths(10, 10, 5) == (2, 3)


def test_encoded_pairs_match_transformers_on_real_sentences(vocab_dir, imdb_reviews):
    from transformers import BertTokenizer
    vocab = load_vocab(vocab_dir)
    reference = BertTokenizer(str(vocab_dir / "vocab.txt"), do_lower_case=vocab.lowercase)
    first, second = imdb_reviews[:40:2], imdb_reviews[1:40:2]
    for seq_len in (16, 128):
        encoded = encode_examples(vocab, first, second, seq_len)
        expected = reference(first, second, truncation="longest_first", max_length=seq_len)
        for row in range(len(first)):
            start, end = encoded.offsets[row], encoded.offsets[row + 1]
            assert encoded.tokens[start:end].tolist() == expected["input_ids"][row]
            assert encoded.segments[start:end].tolist() == expected["token_type_ids"][row]
        assert encoded.lengths.max() == seq_len


def test_segments_and_padding_of_a_pair_and_a_single_sentence(vocab_dir):
    vocab = load_vocab(vocab_dir)
    a, b = vocab.encode(["a good film", "it was bad"])
    pair = encode_examples(vocab, ["a good film"], ["it was bad"], 64)
    assert pair.tokens.tolist() == [vocab.cls_id, *a, vocab.sep_id, *b, vocab.sep_id]
    assert pair.segments.tolist() == [0] * (len(a) + 2) + [1] * (len(b) + 1)
    single = encode_examples(vocab, ["a good film", "it was bad " * 40], None, 16)
    assert single.tokens[:len(a) + 2].tolist() == [vocab.cls_id, *a, vocab.sep_id]
    assert single.lengths.tolist() == [len(a) + 2, 16] and not single.segments.any()
    input_ids, segments, real = pair.padded(np.array([0]), 16, vocab.pad_id)
    length = len(a) + len(b) + 3
    assert (input_ids[0, length:] == vocab.pad_id).all() and not segments[0, length:].any()
    assert real[0].sum() == length and segments[0].sum() == len(b) + 1


@pytest.mark.parametrize("second", [True, False])
def test_examples_encoded_a_chunk_at_a_time_equal_those_encoded_at_once(vocab_dir, imdb_reviews, second):
    vocab = load_vocab(vocab_dir)
    first, pairs = imdb_reviews[:41:2], imdb_reviews[1:42:2] if second else None
    whole = encode_examples(vocab, first, pairs, 64, chunk=len(first))
    for chunk in (1, 3, 7):
        chunked = encode_examples(vocab, first, pairs, 64, chunk=chunk)
        for name in ("tokens", "segments", "offsets"):
            assert np.array_equal(getattr(chunked, name), getattr(whole, name)), (chunk, name)
    assert len(encode_examples(vocab, [], None if pairs is None else [], 64)) == 0
