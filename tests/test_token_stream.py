"""Tests of src/corpus/token_stream.py: a token-id stream round trip, its header, clear errors on a truncated
stream or on a file of another format."""
import numpy as np
import pytest

from packed_files import ShardError
from shards import ShardWriter
from corpus.token_stream import TokenStreamWriter, read_token_stream


@pytest.fixture(scope="module")
def imdb_ids(imdb_reviews, vocab) -> list[list[int]]:
    return vocab.encode(imdb_reviews)


def test_token_stream_round_trip_and_truncation(tmp_path, vocab, imdb_ids):
    ids = [np.array(review) for review in imdb_ids]
    path = tmp_path / "ids.msgpack.gz"
    with TokenStreamWriter(path, vocab, ["imdb.txt"]) as stream:
        for review in ids:
            stream.write(review)
    header, blocks = read_token_stream(path)
    assert np.array_equal(np.concatenate(list(blocks)), np.concatenate(ids))
    assert header == {"format": "bert-token-ids", "version": 1, "vocab_size": vocab.size,
                      "vocab_checksum": vocab.checksum, "dtype": "uint16", "source_files": ["imdb.txt"],
                      "tokens": sum(map(len, ids)), "body_bytes": header["body_bytes"]}
    whole = path.read_bytes()
    path.write_bytes(whole[:len(whole) * 3 // 4])
    with pytest.raises(ShardError, match=f"^{path}: truncated or corrupt"):
        list(read_token_stream(path)[1])
    with ShardWriter(tmp_path / "s.msgpack.gz", vocab, seq_len=8, split="train", seed=1) as shard:
        shard.add([np.array([2, 3])])
    with pytest.raises(ShardError, match="not a token-id stream"):
        read_token_stream(tmp_path / "s.msgpack.gz")
