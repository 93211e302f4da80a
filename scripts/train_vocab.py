"""Train an uncased BERT WordPiece vocabulary with the `tokenizers` library.

Example:
    python scripts/train_vocab.py -i demo/input/imdb.txt -o demo/vocab --vocab-size 8192
    python scripts/train_vocab.py -i wiki/parquet/ -o wiki/vocab --vocab-size 30522   # every file in it

Reads every input the preparers read (text, JSON lines, parquet, a datasets folder, standard input).

Writes VOCABDIR/vocab.txt with [PAD] [UNK] [CLS] [SEP] [MASK] as ids 0-4, so that
transformers.BertTokenizer(vocab.txt) gives the same ids as this program, and
VOCABDIR/tokenizer_config.json, which says that text is lower-cased (do_lower_case).
"""
import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))
from atomic import temp_path  # noqa: E402
from errors import UserError, exit_on_user_error  # noqa: E402
from corpus.input_files import BadRecords, InputFile, add_input_arguments, find_inputs, read_documents  # noqa: E402
from corpus.preparation import output_dir  # noqa: E402
from tokenizers.implementations import BertWordPieceTokenizer  # noqa: E402
from vocab import SPECIAL_TOKENS, load_vocab, write_tokenizer_config  # noqa: E402


def canonical_order(tokens: list[str]) -> list[str]:
    """Special tokens first, then single characters, then longer pieces, each group sorted.

    The trainer breaks ties in hash order, so two runs on one corpus list the same tokens in
    different orders. WordPiece matches the longest piece in the set, so order changes no
    tokenization; a fixed order makes the ids, and so shards and checkpoints, reproducible.
    """
    rest = [token for token in tokens if token not in SPECIAL_TOKENS]
    return list(SPECIAL_TOKENS) + sorted(rest, key=lambda t: (len(t.removeprefix("##")) > 1, t.startswith("##"), t))


def train_vocab(inputs: list[InputFile], out_dir: Path, vocab_size: int, min_frequency: int = 2,
                show_progress: bool = True, text_field: str = "text", bad: BadRecords | None = None) -> Path:
    """Train the vocabulary and write out_dir/vocab.txt atomically, with a tokenizer_config.json that
    says it lower-cases; returns vocab.txt's path."""
    if vocab_size < len(SPECIAL_TOKENS) + 100:
        raise UserError(f"--vocab-size {vocab_size}: expected at least {len(SPECIAL_TOKENS) + 100}")
    tokenizer = BertWordPieceTokenizer(lowercase=True)
    with output_dir(out_dir):  # a directory made here goes again if reading the input fails
        tokenizer.train_from_iterator(read_documents(inputs, text_field, bad), vocab_size=vocab_size,
                                      min_frequency=min_frequency, special_tokens=list(SPECIAL_TOKENS),
                                      show_progress=show_progress)
        if len(tokenizer.get_vocab()) <= len(SPECIAL_TOKENS):  # blank lines only: nothing to write
            raise UserError(f"{', '.join(map(str, inputs))}: no text to learn a vocabulary from")
    target = out_dir / "vocab.txt"
    temp = temp_path(target)  # renamed when complete: never half a vocabulary
    try:
        temp.write_text("\n".join(canonical_order(list(tokenizer.get_vocab()))) + "\n", encoding="utf-8")
        os.replace(temp, target)
    finally:
        temp.unlink(missing_ok=True)
    write_tokenizer_config(out_dir, lowercase=True)  # load_vocab and transformers read the casing there
    load_vocab(target)  # the file we wrote must be a valid vocabulary
    return target


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_input_arguments(parser)
    parser.add_argument("-o", "--output", required=True, type=Path, help="directory for vocab.txt")
    parser.add_argument("--vocab-size", type=int, default=8192, help="number of tokens (default 8192)")
    parser.add_argument("--min-frequency", type=int, default=2, help="least count of a merged piece")
    return parser.parse_args(argv)


@exit_on_user_error
def main(argv=None):
    args = parse_args(argv)
    inputs = find_inputs(args.input, args.format)
    bad = BadRecords(args.skip_bad_records)
    target = train_vocab(inputs, args.output, args.vocab_size, args.min_frequency, text_field=args.text_field,
                         bad=bad)
    print(f"wrote {target} ({load_vocab(target).size} tokens)")
    if bad.count:
        print(bad.summary())


if __name__ == "__main__":
    main()
