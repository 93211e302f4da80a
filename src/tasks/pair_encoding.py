"""A sentence or a sentence pair as BERT reads it: `[CLS] A [SEP]` or `[CLS] A [SEP] B [SEP]` with
segment ids, a pair cut to seq-len as transformers cuts it, stored end to end (ragged)."""
from dataclasses import dataclass

import numpy as np

from batching import gather_padded


@dataclass
class EncodedExamples:
    """`[CLS] A [SEP]` or `[CLS] A [SEP] B [SEP]` per example, stored end to end (ragged)."""
    tokens: np.ndarray  # int64 token ids
    segments: np.ndarray  # int8: 0 up to and including the first [SEP], 1 after it
    offsets: np.ndarray  # example i is tokens[offsets[i]:offsets[i + 1]]

    def __len__(self) -> int:
        return len(self.offsets) - 1

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    def padded(self, rows: np.ndarray, width: int, pad_id: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """[len(rows), width] input ids, segment ids (0 on padding) and the mask of real tokens."""
        input_ids, real = gather_padded(self.tokens, self.offsets, rows, width, pad_id)
        segments, _ = gather_padded(self.segments, self.offsets, rows, width, 0)
        return input_ids, segments, real


def kept_lengths(first: int, second: int, room: int) -> tuple[int, int]:
    """How many word pieces of A and B fit in `room`, as transformers' tokenizers cut a pair
    (truncation="longest_first"): the longer side is cut first; if the shorter must be cut too, each
    keeps half, the longer (B on a tie) the odd piece. Google's run_classifier, popping one piece at a
    time, gives that odd piece to A instead; we match transformers, so that run_glue sees our inputs."""
    if first + second <= room:
        return first, second
    shorter, longer = sorted((first, second))
    kept_shorter, kept_longer = shorter, max(shorter, room - shorter)
    if kept_shorter + kept_longer > room:
        kept_shorter, kept_longer = room // 2, room // 2 + room % 2
    return (kept_longer, kept_shorter) if first > second else (kept_shorter, kept_longer)


# Texts tokenized at a time: the tokenizer's Encoding objects (pieces, offsets, masks) take
# hundreds of bytes a token, so MNLI's 785,000 texts at once held 3.4 GB; the ids alone are kept.
ENCODE_CHUNK = 16_384


def encode_examples(vocab, first: list[str], second: list[str] | None, seq_len: int,
                    chunk: int = ENCODE_CHUNK) -> EncodedExamples:
    """Token ids and segment ids of every example, cut to seq_len, with the vocabulary's tokenizer
    (`vocab.encode`, then [CLS] and [SEP] added), `chunk` examples at a time."""
    if seq_len < (4 if second is not None else 3):
        raise ValueError(f"seq_len {seq_len} leaves no room for a word piece")
    parts = [encode_chunk(vocab, first[start:start + chunk], None if second is None else second[start:start + chunk],
                          seq_len) for start in range(0, len(first), chunk)]
    return joined(parts) if parts else ragged([], [])


def encode_chunk(vocab, first: list[str], second: list[str] | None, seq_len: int) -> EncodedExamples:
    first_pieces = vocab.encode(first)
    second_pieces = vocab.encode(second) if second is not None else [None] * len(first_pieces)
    samples, segments = [], []
    for a, b in zip(first_pieces, second_pieces):
        if b is None:
            a = a[:seq_len - 2]
            samples.append([vocab.cls_id, *a, vocab.sep_id])
            segments.append(len(a) + 2)
            continue
        keep_a, keep_b = kept_lengths(len(a), len(b), seq_len - 3)
        samples.append([vocab.cls_id, *a[:keep_a], vocab.sep_id, *b[:keep_b], vocab.sep_id])
        segments.append(keep_a + 2)
    return ragged(samples, segments)


def joined(parts: list[EncodedExamples]) -> EncodedExamples:
    """The examples of each part, in order, as one."""
    starts = np.cumsum([0] + [len(part.tokens) for part in parts[:-1]])
    offsets = np.concatenate([parts[0].offsets[:1]] + [part.offsets[1:] + start for part, start in zip(parts, starts)])
    return EncodedExamples(np.concatenate([part.tokens for part in parts]),
                           np.concatenate([part.segments for part in parts]), offsets)


def ragged(samples: list[list[int]], first_segment_lengths: list[int]) -> EncodedExamples:
    lengths = np.fromiter((len(sample) for sample in samples), np.int64, len(samples))
    offsets = np.zeros(len(samples) + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    tokens = np.fromiter((token for sample in samples for token in sample), np.int64, int(offsets[-1]))
    # within each example, a position is in segment 1 once it is past A's [CLS] A [SEP]
    position = np.arange(offsets[-1]) - np.repeat(offsets[:-1], lengths)
    segments = (position >= np.repeat(np.asarray(first_segment_lengths, np.int64), lengths)).astype(np.int8)
    return EncodedExamples(tokens, segments, offsets)
