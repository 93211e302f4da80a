"""Tag the words of sentences with a fine-tuned token classification checkpoint (task-type = ner).

Prints CoNLL's layout: a word and its tag per line, a blank line after each sentence (conlleval and
the program's own reader take it back). A sentence is split into words as BERT's tokenizer splits
text (at spaces and around punctuation), the way transformers' token-classification pipeline does.

Examples:
    python scripts/ner.py --cp demo/runs/run2/checkpoints/best.pt "A 1981 film noir, 8 out of 10."
    python scripts/ner.py --cp demo/runs/run2/checkpoints/best.pt -i sentences.txt
"""
import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from errors import exit_on_user_error  # noqa: E402
from model import BertForTokenClassification  # noqa: E402
from interop.onnx_model import OR_EXPORTED, restore_model  # noqa: E402
from tasks.token_task import tag_sentences  # noqa: E402
from classify import input_texts, print_lines, trained_seq_len  # noqa: E402


def words_of(vocab, text: str) -> list[str]:
    """The words BERT's pre-tokenizer makes of a text: split at spaces and around punctuation."""
    return [word for word, _ in vocab.tokenizer.pre_tokenizer.pre_tokenize_str(text)]


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cp", type=Path, required=True, help="a fine-tuned ner checkpoint" + OR_EXPORTED)
    parser.add_argument("text", nargs="*", help="sentences to tag")
    parser.add_argument("-i", "--input", type=Path, help="a file with one sentence per line")
    return parser.parse_args(argv)


@exit_on_user_error
def main(argv=None):
    args = parse_args(argv)
    texts = input_texts(args, "tag")
    model, vocab, checkpoint = restore_model(args.cp, {"ner": BertForTokenClassification})
    words = [words_of(vocab, text) for text in texts]
    tags = tag_sentences(model, vocab, words, trained_seq_len(checkpoint, model), progress=True)
    print_lines(line for sentence, sentence_tags in zip(words, tags)
                for line in [*(f"{word}\t{tag}" for word, tag in zip(sentence, sentence_tags)), ""])


if __name__ == "__main__":
    main()
