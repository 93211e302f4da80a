"""Tests of src/preparation.py: the data split. Static masking and SplitWriter are tested through the
preparers (test_prepare.py) and the shards they write (test_shards.py)."""
import numpy as np

from preparation import assign_splits


def test_split_is_stateless_and_about_80_10_10():
    codes = assign_splits(123, np.arange(100_000))
    pieces = np.concatenate([assign_splits(123, np.arange(start, start + 999)) for start in range(0, 100_000, 999)])
    assert np.array_equal(codes, pieces[:100_000])
    assert np.allclose(np.bincount(codes) / len(codes), [0.8, 0.1, 0.1], atol=0.01)
    assert (assign_splits(124, np.arange(1000)) != codes[:1000]).mean() > 0.2
