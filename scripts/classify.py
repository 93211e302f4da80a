"""Label sentences with a fine-tuned classification checkpoint (SST-2: 0 negative, 1 positive).

Examples:
    python scripts/classify.py --cp demo/runs/run1/checkpoints/best.pt "a gorgeous, witty film"
    python scripts/classify.py --cp demo/runs/run1/checkpoints/best.pt -i sentences.txt
"""
import argparse
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))
from checkpoint import restore_model  # noqa: E402
from classification_task import HIDDEN_LABEL, EncodedSentences, Sentences  # noqa: E402
from config import CLASSIFICATION_TASKS  # noqa: E402
from errors import UserError, exit_on_user_error  # noqa: E402
from model import BertForSequenceClassification  # noqa: E402

CLASSIFIERS = {task: BertForSequenceClassification for task in CLASSIFICATION_TASKS}


@torch.no_grad()
def classify(model, vocab, sentences: list[str], batch_size: int = 64) -> list[tuple[int, float]]:
    """(label, probability) for each sentence, in order; batches as fine-tuning makes them."""
    count = len(sentences)
    encoded = EncodedSentences(Sentences(sentences, np.full(count, HIDDEN_LABEL), np.arange(count)),
                               vocab, model.config.max_len)
    results = []
    for start in range(0, count, batch_size):
        batch = encoded.batch(np.arange(start, min(start + batch_size, count)), vocab.pad_id)
        logits, _ = model(torch.from_numpy(batch["input_ids"]),
                          attention_mask=torch.from_numpy(batch["attention_mask"]))
        probabilities, labels = logits.float().softmax(-1).max(-1)
        results += list(zip(labels.tolist(), probabilities.tolist()))
    return results


def read_sentences(path: Path) -> list[str]:
    try:
        lines = [line.strip() for line in path.read_text(encoding="utf-8").splitlines()]
    except (OSError, UnicodeDecodeError) as error:
        raise UserError(f"{path}: cannot read ({error.__class__.__name__})") from None
    sentences = [line for line in lines if line]
    if not sentences:
        raise UserError(f"{path}: no sentences")
    return sentences


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cp", type=Path, required=True, help="a fine-tuned classification checkpoint")
    parser.add_argument("text", nargs="*", help="sentences to label")
    parser.add_argument("-i", "--input", type=Path, help="a file with one sentence per line")
    return parser.parse_args(argv)


@exit_on_user_error
def main(argv=None):
    args = parse_args(argv)
    sentences = list(args.text) + (read_sentences(args.input) if args.input else [])
    if not sentences:
        raise UserError("nothing to classify: give sentences or -i FILE")
    model, vocab, _ = restore_model(args.cp, CLASSIFIERS)
    for sentence, (label, probability) in zip(sentences, classify(model, vocab, sentences)):
        print(f"{label}\t{probability:.3f}\t{sentence}")


if __name__ == "__main__":
    main()
