"""Token classification (task-type = ner; task.Task): a tag for every word, named entities above
all. token_data.py reads and encodes the data, entity_metrics.py scores it as conlleval does.

A word's label sits on its first word piece; the others have none in the loss and take the first
one's prediction. A sentence longer than seq-len is read in overlapping windows, each word scored
in the window where it has the most context. best.pt goes by the entity-level F1. A model's labels
are part of it: a checkpoint's are matched to the data's tags by name, never by their ids' order.
"""

import numpy as np
import torch

from batching import gather_padded, pad_multiple, padded_width
from config import model_config
from distributed import every_rank
from hardware import to_device
from model import IGNORE_INDEX, BertForTokenClassification, ModelConfig
from tasks import token_data
from tasks.entity_metrics import entity_scores
from tasks.fine_tuning import EncodedSplit, FineTuningTask, inference_rows
from tasks.token_data import EncodedWindows, TaggedSentences


class TaggedSplit(EncodedSplit):
    """One split: its sentences and their encoded windows."""

    def __init__(self, sentences: TaggedSentences, windows: EncodedWindows):
        self.sentences = sentences
        self.encoded = windows

    def batch(self, rows: np.ndarray, pad_id: int, seq_len: int, multiple: int) -> dict:
        """Windows `rows`, padded to the longest (rounded up to `multiple`)."""
        windows = self.encoded
        width = padded_width(windows.lengths[rows], seq_len, multiple)
        input_ids, real = gather_padded(windows.tokens, windows.offsets, rows, width, pad_id)
        labels, _ = gather_padded(windows.labels, windows.offsets, rows, width, IGNORE_INDEX)
        words, _ = gather_padded(windows.scored_words, windows.offsets, rows, width, -1)
        return {"input_ids": input_ids, "attention_mask": real, "segment_ids": None, "labels": labels,
                "scored_words": words, "sentences": windows.sentences[rows]}


class TokenClassificationTask(FineTuningTask):
    """A tag per word on BERT: BertForTokenClassification, scored by entity precision, recall, F1."""
    best_metric = "f1"
    measuring_keys = ("seq_len", "tag_column", "dataset_percentage", "val_dataset_percentage")

    def __init__(self, config, vocab, device: torch.device, rank: int = 0, world_size: int = 1):
        super().__init__(config, vocab, device, rank, world_size)
        self.ids_named = config.given_labels  # what a parquet file's tag ids mean
        self.names = self.ids_named or None  # the model's labels: None until the training split names them
        self.whose = "the model's"  # the labels' owner, as a refused tag's error names them

    @property
    def label_names(self) -> tuple[str, ...]:
        """The model's outputs' names, in its order: a checkpoint's (take_checkpoint_labels), else
        `labels`, else the training split's; each split is read against them, tag by name."""
        if self.names is None:
            self.names = self.split("train").sentences.label_names
        return self.names

    @property
    def num_labels(self) -> int:
        return len(self.label_names)

    def take_checkpoint_labels(self, names: tuple[str, ...], kept: bool):
        """The data is read against a checkpoint's labels, tag by name: always where its model is kept
        (resumed, scored), so a tag it lacks is refused; in a new run from its weights where they cover
        the data, so its head goes on (other tags get a new head: checkpoints.load_pretrained)."""
        if not names or not kept and not self.covered_by(names):
            return
        if names != self.names:
            self.splits = {}  # read under other names
        self.names, self.whose = names, "the checkpoint's"

    def covered_by(self, names: tuple[str, ...]) -> bool:
        """Whether a new run's tags are among a checkpoint's labels: `labels`, where given, as a set
        (another set asks for a new head); else every tag the training split uses."""
        if self.ids_named:
            return set(self.ids_named) == set(names)
        sentences = self.split("train").sentences
        return {sentences.label_names[tag] for tags in sentences.tags for tag in tags} <= set(names)

    def read_part(self, split: str, name: str) -> TaggedSplit:
        names = (self.names or ()) if split == "train" else self.label_names  # the training split names a new model's
        sentences = token_data.read_split(self.config.glue_path, name, self.config.tag_column, names,
                                          self.ids_named, self.whose)
        sentences = self.kept(sentences, split, "sentences")
        return TaggedSplit(sentences, token_data.encode_sentences(self.vocab, sentences, self.config.seq_len))

    def model_config(self, max_len: int | None = None) -> ModelConfig:
        return model_config(self.config, self.vocab, max_len, num_labels=self.num_labels,
                            label_names=self.label_names)

    def build_model(self, max_len: int | None = None) -> BertForTokenClassification:
        return BertForTokenClassification(self.model_config(max_len))

    def outputs(self, model, batch: dict):
        return model(batch["input_ids"], batch.get("labels"), attention_mask=batch["attention_mask"])

    def loss(self, model, batch: dict, progress=None):
        """Mean loss over the labelled pieces, and [labelled pieces, right ones]; no host sync."""
        logits, loss = self.outputs(model, batch)
        labelled = batch["labels"] != IGNORE_INDEX
        right = (logits.argmax(-1) == batch["labels"]) & labelled
        return loss, torch.stack([labelled.sum(), right.sum()])

    def metrics(self, loss: float, statistics: torch.Tensor) -> dict:
        return {"loss": loss, "accuracy": float(statistics[1] / statistics[0]) if statistics[0] else 0.0}

    @torch.no_grad()
    def evaluate(self, model, batches, autocast) -> dict:
        """Entity precision, recall and F1 (and per type), token accuracy and the mean loss over every
        window of the batches (all ranks')."""
        model.eval()
        loss_sum, pieces, scored, split = 0.0, 0, [], "val"
        for batch in batches:
            split = batch["split"]
            with autocast:
                logits, loss = self.outputs(model, batch)
            labelled = int((batch["labels"] != IGNORE_INDEX).sum())
            loss_sum, pieces = loss_sum + loss.double().item() * labelled, pieces + labelled
            scored.append(scored_predictions(logits, batch))
        model.train()
        gathered = every_rank((loss_sum, pieces, scored))
        loss_sum, pieces = sum(each[0] for each in gathered), sum(each[1] for each in gathered)
        scored = [item for each in gathered for item in each[2]]
        _, true, predicted = self.tagged(self.split(split).sentences, scored)
        return {"loss": loss_sum / max(pieces, 1), **entity_scores(true, predicted), "sentences": len(true)}

    def tagged(self, sentences: TaggedSentences, scored: list) -> tuple[list[int], list[list[str]], list[list[str]]]:
        """The sentences the predictions reach, in order, with their true and predicted tag names."""
        predicted = predicted_tags(sentences.words, scored, self.label_names)
        names = self.label_names
        return (list(predicted), [sentences.tag_names(row) for row in predicted],
                [[names[tag] for tag in tags] for tags in predicted.values()])

    def show_predictions(self, model, autocast) -> str:
        """A few validation sentences with each entity predicted and true."""
        data = self.split("val")
        rows = np.arange(min(4, len(data)))
        batch = to_device(data.batch(rows, self.vocab.pad_id, self.config.seq_len, self.pad_multiple),
                          self.device, False)
        model.eval()
        with torch.no_grad(), autocast:
            logits, _ = self.outputs(model, {**batch, "labels": None})
        model.train()
        rows, true, predicted = self.tagged(data.sentences, [scored_predictions(logits, batch)])
        lines = []
        for row, expected, found in zip(rows, true, predicted):
            words = data.sentences.words[row]
            lines.append("  " + " ".join(word if a == b == "O" else f"{word}/{b}" + ("" if a == b else f"(true {a})")
                                         for word, a, b in zip(words, expected, found)))
        return "predictions:\n" + "\n".join(lines)


def scored_predictions(logits: torch.Tensor, batch: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(sentence, word, predicted tag) of each piece that scores a word."""
    rows, columns = (batch["scored_words"] >= 0).nonzero(as_tuple=True)
    return (batch["sentences"][rows].cpu().numpy(), batch["scored_words"][rows, columns].cpu().numpy(),
            logits.argmax(-1)[rows, columns].cpu().numpy())


def predicted_tags(words: list[list[str]], scored: list, label_names: tuple[str, ...],
                   every: bool = False) -> dict[int, np.ndarray]:
    """Tag ids of each sentence the predictions reach (every: of every sentence), by sentence in
    order; a word without a prediction (no piece of it in the vocabulary) is predicted O."""
    rows, places, tags = (np.concatenate([each[part] for each in scored]) for part in range(3))
    outside = label_names.index("O") if "O" in label_names else 0
    reached = range(len(words)) if every else np.unique(rows).tolist()
    predicted = {row: np.full(len(words[row]), outside) for row in reached}
    for row, word, tag in zip(rows.tolist(), places.tolist(), tags.tolist()):
        predicted[row][word] = tag
    return predicted


@torch.no_grad()
def tag_sentences(model, vocab, words: list[list[str]], seq_len: int, batch_size: int = 64,
                  progress: bool = False) -> list[list[str]]:
    """The model's tag names for each sentence's words, windows as fine-tuning makes them, batched by length."""
    names = model.config.label_names
    sentences = TaggedSentences(words, [[0] * len(sentence) for sentence in words], names, ())
    split = TaggedSplit(sentences, token_data.encode_sentences(vocab, sentences, seq_len))
    scored = []
    for rows in inference_rows(split.lengths, batch_size, progress):
        batch = {name: torch.from_numpy(value) if isinstance(value, np.ndarray) else value
                 for name, value in split.batch(rows, vocab.pad_id, seq_len,
                                                pad_multiple("cpu")).items()}
        logits, _ = model(batch["input_ids"], attention_mask=batch["attention_mask"])
        scored.append(scored_predictions(logits, batch))
    predicted = predicted_tags(words, scored, names, every=True)
    return [[names[tag] for tag in predicted[row]] for row in range(len(words))]
