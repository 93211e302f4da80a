"""WordPiece vocabulary: load a BERT vocab.txt, tokenize with the `tokenizers` library.

A vocabulary is identified by a checksum of its tokens, so shards and checkpoints can say
which vocabulary they were made with.
"""
import hashlib
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer
from tokenizers.implementations import BertWordPieceTokenizer

from errors import UserError

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")


@dataclass(frozen=True)
class Vocab:
    tokens: tuple[str, ...]
    path: Path | None = None  # None for a vocabulary carried inside a checkpoint

    @property
    def size(self) -> int:
        return len(self.tokens)

    @cached_property
    def ids(self) -> dict[str, int]:
        return {token: index for index, token in enumerate(self.tokens)}

    @property
    def pad_id(self) -> int:
        return self.ids["[PAD]"]

    @property
    def unk_id(self) -> int:
        return self.ids["[UNK]"]

    @property
    def cls_id(self) -> int:
        return self.ids["[CLS]"]

    @property
    def sep_id(self) -> int:
        return self.ids["[SEP]"]

    @property
    def mask_id(self) -> int:
        return self.ids["[MASK]"]

    @property
    def special_ids(self) -> tuple[int, ...]:
        """Ids never picked for masking: [PAD], [CLS], [SEP] (and [UNK], [MASK])."""
        return tuple(self.ids[token] for token in SPECIAL_TOKENS)

    @cached_property
    def is_continuation(self) -> np.ndarray:
        """True per id for word pieces that continue a word (`##ing`), for whole-word handling."""
        return np.array([token.startswith("##") for token in self.tokens])

    @cached_property
    def checksum(self) -> str:
        """sha256 of the tokens in order: equal checksums mean equal token ids."""
        return hashlib.sha256("\n".join(self.tokens).encode("utf-8")).hexdigest()[:16]

    @property
    def lowercase(self) -> bool:
        """Uncased vocabularies hold no upper-case word pieces (bert-base-uncased, ours)."""
        return not any(token[:1].isupper() for token in self.tokens if not token.startswith("["))

    @property
    def id_dtype(self) -> type:
        """Smallest unsigned type that holds every id: uint16 up to 65,536 tokens."""
        return np.uint16 if self.size <= 65536 else np.int32

    @cached_property
    def tokenizer(self) -> Tokenizer:
        """A fast WordPiece tokenizer; encodes without [CLS]/[SEP] (callers add them)."""
        tokenizer = BertWordPieceTokenizer(dict(self.ids), lowercase=self.lowercase)
        tokenizer.post_processor = None
        return tokenizer

    def pair_tokenizer(self) -> Tokenizer:
        """The same tokenizer as BERT's users run it: [CLS] a [SEP] b [SEP], segment ids 0 then 1."""
        return BertWordPieceTokenizer(dict(self.ids), lowercase=self.lowercase)

    def encode(self, texts: list[str]) -> list[list[int]]:
        """Token ids of each text, without special tokens."""
        return [encoding.ids for encoding in self.tokenizer.encode_batch(texts, add_special_tokens=False)]

    def decode_tokens(self, ids) -> list[str]:
        return [self.tokens[int(i)] for i in ids]

    def render(self, ids: list[int], shown: dict[int, int]) -> str:
        """A sample as text: word pieces joined, `|` between the sentences of a pair, and at each
        position in `shown` that token /between slashes/ (a prediction, a replacement)."""
        words = []
        for position, token_id in enumerate(ids):
            if token_id == self.pad_id:
                break
            if token_id == self.sep_id and ids[position + 1:position + 2] not in ([], [self.pad_id]):
                words.append("|")
                continue
            if token_id in (self.cls_id, self.sep_id):
                continue
            if position in shown:
                words.append(f"/{self.tokens[shown[position]]}/")
                continue
            token = self.tokens[token_id]
            if token.startswith("##") and words:
                words[-1] += token[2:]
            else:
                words.append(token)
        return " ".join(words)


def vocab_file(path) -> Path:
    """`-v` takes the directory holding vocab.txt (the original convention) or the file."""
    path = Path(path)
    return path / "vocab.txt" if path.is_dir() else path


def load_vocab(path) -> Vocab:
    file = vocab_file(path)
    try:
        tokens = tuple(line.rstrip("\r\n") for line in file.open(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as error:
        raise UserError(f"{file}: cannot read vocabulary ({error.__class__.__name__}: {error})") from None
    while tokens and not tokens[-1]:
        tokens = tokens[:-1]
    missing = [token for token in SPECIAL_TOKENS if token not in tokens]
    if missing:
        raise UserError(f"{file}: not a BERT vocabulary, missing special tokens {' '.join(missing)}")
    if len(set(tokens)) != len(tokens):
        raise UserError(f"{file}: not a BERT vocabulary, some tokens appear twice")
    return Vocab(tokens=tokens, path=file)
