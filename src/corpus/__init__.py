"""The corpus wing: the offline preparation a run's shards come from. Input files of every format,
tokenizing on all cores, sentence pairs, the corpus cut into resumable units, and the preparation
that masks and writes the shards (scripts/prepare_mlm_dataset.py and its siblings run it).
"""
