"""WordPiece vocabulary: load a BERT vocab.txt (or tokenizer.json), tokenize with the `tokenizers` library.

A vocabulary is identified by a checksum of its tokens, so shards and checkpoints can say
which vocabulary they were made with. Whether text is lower-cased first is for the vocabulary's
own files to say (declared_lowercase); where none does, its tokens decide (lowercase_by_tokens).
"""
import hashlib
import io
import json
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer
from tokenizers.implementations import BertWordPieceTokenizer

from atomic import atomic_write
from errors import UserError, full_path, script_command

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
SPECIAL_TOKEN_NAMES = {"unk_token": "[UNK]", "sep_token": "[SEP]", "pad_token": "[PAD]", "cls_token": "[CLS]",
                       "mask_token": "[MASK]"}
# Far above any published tokenizer file (bert-base-uncased's tokenizer.json: 0.7 MB), so that a
# device (/dev/zero) or a huge file is refused instead of read until memory runs out.
MAX_FILE_BYTES = 64 * 2**20
DEMO_BASE_DIR = "demo"  # the templates' base-dir for the demo that scripts/make_demo.py builds


@dataclass(frozen=True)
class Vocab:
    tokens: tuple[str, ...]
    path: Path | None = None  # None for a vocabulary carried inside a checkpoint
    # Whether text is lower-cased (and accents stripped) before WordPiece, as the vocabulary's own
    # files or its checkpoint say; None: as its tokens suggest (lowercase_by_tokens).
    lowercase: bool | None = None

    def __post_init__(self):
        if self.lowercase is None:  # decided once, so equal vocabularies compare equal
            object.__setattr__(self, "lowercase", lowercase_by_tokens(self.tokens))

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


def lowercase_by_tokens(tokens) -> bool:
    """The rule for a vocabulary whose files do not say: uncased when lower-casing changes none of
    its pieces. Lower-casing is the test, not str.isupper(): bert-base-uncased holds `ℝ`, an
    upper-case letter without a lower case, which lower-casing keeps."""
    return all(token == token.lower() for token in tokens if not token.startswith("["))


def declared_lowercase(directory: Path) -> bool | None:
    """Whether a vocabulary directory's own files say text is lower-cased, as transformers reads
    them: tokenizer_config.json's do_lower_case first, then tokenizer.json's normaliser; None
    when neither file says."""
    config_file, tokenizer_file = directory / "tokenizer_config.json", directory / "tokenizer.json"
    if config_file.exists():
        value = read_json_object(config_file, "the tokenizer settings").get("do_lower_case")
        if isinstance(value, bool):
            return value
        if value is not None:
            raise UserError(f"{config_file}: do_lower_case is {value!r}; expected true or false")
    if tokenizer_file.exists():
        return normalizer_lowercase(read_json_object(tokenizer_file, "the tokenizer").get("normalizer"))
    return None


def normalizer_lowercase(normalizer) -> bool:
    """Whether a tokenizer.json normaliser lower-cases: BERT's own, or a Lowercase step in a sequence."""
    if not isinstance(normalizer, dict):
        return False
    if normalizer.get("type") == "Sequence":
        return any(normalizer_lowercase(step) for step in normalizer.get("normalizers") or [])
    return normalizer.get("type") == "Lowercase" or (normalizer.get("type") == "BertNormalizer"
                                                     and normalizer.get("lowercase") is True)


def tokenizer_config(lowercase: bool, max_len: int | None = None) -> dict:
    """tokenizer_config.json: transformers' BertTokenizer and load_vocab read the casing from it."""
    config = {"tokenizer_class": "BertTokenizer", "do_lower_case": lowercase, **SPECIAL_TOKEN_NAMES}
    return config if max_len is None else config | {"model_max_length": max_len}


def write_tokenizer_config(directory: Path, lowercase: bool):
    """A vocabulary directory's own word on its casing, beside its vocab.txt."""
    text = json.dumps(tokenizer_config(lowercase), indent=2) + "\n"
    atomic_write(directory / "tokenizer_config.json", lambda temp: temp.write_text(text, encoding="utf-8"))


def write_vocab_directory(directory: Path, vocab: Vocab):
    """vocab.txt and tokenizer_config.json: a directory load_vocab reads this vocabulary back from,
    its casing included (a checkpoint's, for the runs that fine-tune it)."""
    directory.mkdir(parents=True, exist_ok=True)
    text = "\n".join(vocab.tokens) + "\n"
    atomic_write(directory / "vocab.txt", lambda temp: temp.write_text(text, encoding="utf-8"))
    write_tokenizer_config(directory, vocab.lowercase)


def read_small_text(path: Path, what: str, limit: int = MAX_FILE_BYTES) -> str:
    """A UTF-8 text file of at most `limit` bytes, its line ends as written; anything else is one
    line saying why `what` cannot be read."""
    if not path.is_file():
        raise UserError(f"{path}: cannot read {what} ({'not a regular file' if path.exists() else 'not found'})")
    try:
        with path.open("rb") as file:
            data = file.read(limit + 1)
        if len(data) > limit:
            raise UserError(f"{path}: cannot read {what} (larger than {limit / 2**20:.0f} MiB)")
        return data.decode("utf-8-sig")  # a byte-order mark is not part of the first token or key
    except (OSError, UnicodeDecodeError) as error:
        raise UserError(f"{path}: cannot read {what} ({error.__class__.__name__}: {error})") from None


def read_json_object(path: Path, what: str) -> dict:
    """A small JSON file holding an object (config.json, tokenizer.json, tokenizer_config.json)."""
    try:
        value = json.loads(read_small_text(path, what))
    except (ValueError, RecursionError) as error:  # RecursionError: nested thousands deep
        raise UserError(f"{path}: cannot read {what} (not JSON: {error})") from None
    if not isinstance(value, dict):
        raise UserError(f"{path}: cannot read {what} (expected a JSON object, found {type(value).__name__})")
    return value


def vocab_file(path) -> Path:
    """`-v` takes the directory holding vocab.txt (the original convention) or the file."""
    path = Path(path)
    return path / "vocab.txt" if path.is_dir() else path


def load_vocab(path) -> Vocab:
    """vocab.txt, lower-casing as the files beside it say (declared_lowercase)."""
    file = vocab_file(path)
    text = read_small_text(file, "vocabulary")
    # Line ends as transformers' BertTokenizer reads them: \n, \r\n and \r.
    tokens = tuple(line.rstrip("\r\n") for line in io.StringIO(text, newline=None))
    while tokens and not tokens[-1]:
        tokens = tokens[:-1]
    check_tokens(file, tokens)
    return Vocab(tokens=tokens, path=file, lowercase=declared_lowercase(file.parent))


def load_run_vocab(config) -> Vocab:
    """The vocabulary a run's config names (vocab, else base-dir/vocab). One that is not there is
    one line naming the full path looked at and the command that makes it."""
    file = vocab_file(config.vocab_path)
    if not file.exists():
        raise UserError(f"{full_path(file)}: cannot read vocabulary (not found); {making_vocab(config, file)}")
    return load_vocab(config.vocab_path)


def making_vocab(config, file: Path) -> str:
    """The command that makes the vocabulary `file` a run looks for: the demo's for its base dir,
    else train_vocab.py's into the directory the file is in (or is)."""
    base_dir = full_path(config.base_dir)
    if not config.vocab and base_dir.name == DEMO_BASE_DIR:
        return f"build the demo: {script_command('make_demo.py')} -o {base_dir}"
    directory = full_path(file.parent if file.suffix == ".txt" else file)
    command = f"make one: {script_command('train_vocab.py')} -i YOUR_TEXT -o {directory}"
    if file.suffix == ".txt" and file.name != "vocab.txt":  # train_vocab.py writes vocab.txt
        return f"{command}, then set vocab = {directory}"
    return command


def load_tokenizer_json(path: Path) -> Vocab:
    """The WordPiece vocabulary inside a tokenizer.json, lower-casing as the files beside it say."""
    model = read_json_object(path, "the tokenizer").get("model")
    try:
        tokens = tuple(sorted(model["vocab"], key=model["vocab"].get))
        ids = sorted(model["vocab"].values())
    except (KeyError, TypeError, AttributeError) as error:
        raise UserError(f"{path}: cannot read a WordPiece vocabulary ({error.__class__.__name__})") from None
    if model.get("type") != "WordPiece":
        raise UserError(f"{path}: not a BERT WordPiece tokenizer (model type {model.get('type')!r})")
    if ids != list(range(len(ids))):
        raise UserError(f"{path}: the WordPiece ids are not 0 to {len(ids) - 1}, each once")
    broken = next((token for token in tokens if "\n" in token or "\r" in token), None)
    if broken is not None:
        raise UserError(f"{path}: token {model['vocab'][broken]} ({broken!r}) holds a line break, "
                        f"which a vocab.txt (one token a line) cannot hold")
    check_tokens(path, tokens)
    return Vocab(tokens=tokens, path=path, lowercase=declared_lowercase(path.parent))


def check_tokens(path: Path, tokens: tuple[str, ...]):
    missing = [token for token in SPECIAL_TOKENS if token not in tokens]
    if missing:
        raise UserError(f"{path}: not a BERT vocabulary, missing special tokens {' '.join(missing)}")
    if len(set(tokens)) != len(tokens):
        raise UserError(f"{path}: not a BERT vocabulary, some tokens appear twice")
