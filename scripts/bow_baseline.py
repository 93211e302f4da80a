"""A plain baseline for sentence classification: bag-of-words logistic regression.

Example:
    python scripts/bow_baseline.py --datasets demo/datasets

Reads the same splits as fine-tuning (parquet or GLUE TSV), counts lower-cased unigrams and
bigrams seen at least twice in training, fits a multinomial logistic regression with L2
regularisation (L-BFGS, full batch), picks the regularisation on the validation split and
reports validation and test accuracy. A small BERT worth its pre-training should beat it.
"""
import argparse
import re
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))
from errors import UserError, exit_on_user_error  # noqa: E402
from tasks import glue_data  # noqa: E402

WORD = re.compile(r"[a-z0-9']+|[^\sa-z0-9']")


def ngrams(text: str) -> list[str]:
    words = WORD.findall(text.lower())
    return words + [f"{a} {b}" for a, b in zip(words, words[1:])]


def feature_index(texts: list[str], min_count: int = 2) -> dict[str, int]:
    counts = Counter(gram for text in texts for gram in set(ngrams(text)))
    return {gram: i for i, gram in enumerate(sorted(g for g, c in counts.items() if c >= min_count))}


def bags(texts: list[str], index: dict[str, int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """EmbeddingBag inputs: feature ids, offsets, and log-scaled counts as weights."""
    ids, offsets, weights = [], [], []
    for text in texts:
        offsets.append(len(ids))
        for gram, count in Counter(g for g in ngrams(text) if g in index).items():
            ids.append(index[gram])
            weights.append(1.0 + np.log(count))
    return torch.tensor(ids, dtype=torch.long), torch.tensor(offsets), torch.tensor(weights, dtype=torch.float32)


class BagOfWords(nn.Module):
    """Logistic regression on sparse counts: a weighted sum of per-feature class scores."""

    def __init__(self, features: int, classes: int):
        super().__init__()
        self.weights = nn.EmbeddingBag(features, classes, mode="sum")
        nn.init.zeros_(self.weights.weight)
        self.bias = nn.Parameter(torch.zeros(classes))

    def forward(self, bag):
        ids, offsets, weights = bag
        return self.weights(ids, offsets, per_sample_weights=weights) + self.bias


def fit(bag, labels: torch.Tensor, features: int, classes: int, l2: float) -> BagOfWords:
    model = BagOfWords(features, classes)
    optimizer = torch.optim.LBFGS(model.parameters(), max_iter=200, line_search_fn="strong_wolfe")

    def closure():
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(model(bag), labels) + l2 * model.weights.weight.pow(2).sum()
        loss.backward()
        return loss

    optimizer.step(closure)
    return model


@torch.no_grad()
def accuracy(model: BagOfWords, bag, labels: torch.Tensor) -> float:
    return (model(bag).argmax(-1) == labels).float().mean().item()


def load_split(datasets: Path, split: str) -> glue_data.Examples:
    """An SST-2 split as fine-tuning finds it: parquet, or GLUE TSV in datasets/SST-2."""
    return glue_data.read_split(datasets, "sst2", split)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--datasets", type=Path, required=True, help="directory with the SST-2 splits")
    return parser.parse_args(argv)


@exit_on_user_error
def main(argv=None) -> dict:
    args = parse_args(argv)
    train, val, test = (load_split(args.datasets, split) for split in ("train", "val", "test"))
    if test.labels_hidden:  # before the fitting, not after
        raise UserError(f"{test.files[0]}: the test labels are hidden; use the parquet layout to score test")
    train_labels, val_labels, test_labels = (torch.from_numpy(split.labels) for split in (train, val, test))
    index = feature_index(train.first)
    classes = int(train_labels.max()) + 1
    train_bag, val_bag, test_bag = (bags(split.first, index) for split in (train, val, test))
    candidates = {l2: fit(train_bag, train_labels, len(index), classes, l2) for l2 in (1e-5, 3e-5, 1e-4, 3e-4, 1e-3)}
    l2, model = max(candidates.items(), key=lambda item: accuracy(item[1], val_bag, val_labels))
    result = {"features": len(index), "l2": l2, "val_accuracy": accuracy(model, val_bag, val_labels),
              "test_accuracy": accuracy(model, test_bag, test_labels)}
    print(f"bag-of-words logistic regression: {result['features']:,} unigram+bigram features, l2 {l2:g}; "
          f"val accuracy {result['val_accuracy']:.1%}, test accuracy {result['test_accuracy']:.1%}")
    return result


if __name__ == "__main__":
    main()
