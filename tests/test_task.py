"""src/task.py: the evaluation the language-model tasks share: the loss weighted by each batch's
count of predictions, the statistics summed, and an empty split as one line."""
import contextlib

import pytest
import torch
from torch import nn

from errors import UserError
from task import evaluate_by_sums


class SignTask:
    """Scores a batch of numbers: the loss is their mean, the statistics [count, positives]."""
    device = torch.device("cpu")

    def loss(self, model, batch, progress=None):
        values = model(batch["values"])
        return values.mean(), torch.stack([torch.tensor(float(len(values))), (values > 0).sum().float()])

    def metrics(self, loss, statistics):
        count, positives = statistics.tolist()
        return {"loss": loss, "positive": positives / count}


def test_the_loss_is_weighted_by_each_batchs_count_and_the_statistics_summed():
    batches = [{"values": torch.tensor([1.0, 2.0, 3.0])}, {"values": torch.tensor([4.0, -8.0])}]
    model = nn.Identity()
    metrics = evaluate_by_sums(SignTask(), model, iter(batches), contextlib.nullcontext())
    assert metrics == {"loss": pytest.approx((6 - 4) / 5), "positive": pytest.approx(4 / 5)}  # not the mean of means
    assert model.training  # back to training


def test_a_split_without_a_batch_is_one_line():
    with pytest.raises(UserError, match="the evaluation split has no batch: it holds fewer samples than batch-size"):
        evaluate_by_sums(SignTask(), nn.Identity(), iter([]), contextlib.nullcontext())
