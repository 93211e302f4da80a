"""What the fine-tuning tasks share (classification, ner, squad, embed): each split read once, the
share of it a run keeps and the check that it fills a batch, training batches in the seeded (or
length-grouped) order, and evaluation batches that hold every example once."""
import itertools
import sys
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import torch
from tqdm import tqdm

from batching import BatchOrder, LengthGroupedBatchOrder, kept_rows, pad_multiple
from errors import UserError
from hardware import to_device
from task import files_record

PROGRESS_BATCHES = 20  # an inference of at least this many batches shows a progress bar (on a terminal)
# Each split's name in the data's files; GLUE names its own (MNLI's validation has two: ClassificationTask).
SPLIT_NAMES = {"train": ("train",), "val": ("validation",), "test": ("test",)}


class EncodedSplit:
    """A split, or a part of one, whose rows are those of `encoded` (windows, texts: len() and .lengths
    of each); a subclass makes batches of them: batch(rows, pad_id, seq_len, multiple), padded to
    batching.padded_width."""
    encoded: Any

    def __len__(self) -> int:
        return len(self.encoded)

    @property
    def lengths(self) -> np.ndarray:
        return self.encoded.lengths


def inference_rows(lengths: np.ndarray, batch_size: int, progress: bool = False) -> Iterator[np.ndarray]:
    """The rows of texts of these lengths in batches of neighbouring lengths, shortest first (the least
    padding); with `progress`, a bar on the terminal's stderr for PROGRESS_BATCHES batches or more."""
    order = np.argsort(lengths, kind="stable")
    starts = range(0, len(order), batch_size)
    shown = progress and len(starts) >= PROGRESS_BATCHES and sys.stderr.isatty()
    for start in tqdm(starts, unit="batch", disable=not shown, leave=False):
        yield order[start:start + batch_size]


class FineTuningTask:
    """The data side of a fine-tuning task (task.Task). A subclass reads each part of a split
    (read_part), into an EncodedSplit where the batches here are made of it (embed batches its
    evaluation texts itself); a split is one part but for MNLI's validation and test (matched and
    mismatched)."""
    predictions_per_token = 0.0  # no MLM head
    last_layer_share = 1.0  # every token's state is read (NER, SQuAD); one a row with [CLS] pooling
    data_source = None  # a GLUE layout is named by its task; your own files set their record (task.files_record)
    random_generator = None  # no draws of its own: dropout and the batch order follow the run's seed

    def __init__(self, config, vocab, device: torch.device, rank: int = 0, world_size: int = 1):
        self.name = config.task_type
        self.config = config
        self.vocab = vocab
        self.device = device
        self.order = BatchOrder(config.batch_size, config.seed, rank, world_size)
        self.splits: dict[str, list] = {}

    def split_names(self, split: str) -> tuple[str, ...]:
        return SPLIT_NAMES[split]

    def parts(self, split: str) -> list:
        if split not in self.splits:
            self.splits[split] = [self.read_part(split, name) for name in self.split_names(split)]
        return self.splits[split]

    def split(self, name: str):
        """The split's first part: the whole of it but for MNLI's second validation and test sets."""
        return self.parts(name)[0]

    def check_data(self, splits: tuple[str, ...]):
        """The splits read and checked; and, once, as the run starts, the record of the user's files it
        reads taken (data_source): what its checkpoints keep, and what a resumed run must find unchanged."""
        for split in splits:
            self.parts(split)
        if self.data_source is None:
            self.data_source = files_record(self.data_files())

    def data_files(self) -> dict[str, tuple[Path, ...]]:
        """The user's files that make the run's data, by key: transfer-data's (a student's unlabelled
        text). glue-dir's layouts are not among them: a resumed run may read the same data in another
        layout."""
        return {"transfer-data": transfer_files(self.config.transfer_data)} if self.config.transfer_data else {}

    def progress_metrics(self) -> dict[str, float]:
        return {}

    @property
    def pad_multiple(self) -> int:
        return pad_multiple(self.device.type)

    def train_examples(self) -> int:
        return len(self.split("train"))

    def kept(self, examples, split: str, noun: str):
        """The split's share of its examples (dataset-percentage and val-dataset-percentage), which
        must fill one batch (so every rank evaluates at least one); `noun` names them in the error."""
        rows = kept_rows(len(examples), self.config.share_of(split), self.config.seed)
        if len(rows) < len(examples):
            examples = examples.select(rows)
        if len(examples) < self.order.batch_size * self.order.world_size:
            raise UserError(f"{examples.files[0]}: {len(examples)} {noun} are fewer than one batch "
                            f"(batch-size {self.order.batch_size} x {self.order.world_size} processes)")
        return examples

    def train_batches(self, position: dict | None):
        data = self.split("train")
        order = self.order
        if self.config.length_grouping:
            order = LengthGroupedBatchOrder(data.lengths, order.batch_size, order.seed, order.rank,
                                            order.world_size)
        return order.batches(position, lambda epoch: len(data),
                             lambda epoch, rows: data.batch(rows, self.vocab.pad_id, self.config.seq_len,
                                                            self.pad_multiple))

    def eval_batches(self, split: str, count: int | None):
        """Every example of the split once, each batch tagged with its split and the number of its part;
        the test split's first `count` batches where count is given (test-iters). Validation scores the
        whole split: val-iters is for pre-training."""
        batches = (batch | {"split": split, "part": number} for number, part in enumerate(self.parts(split))
                   for batch in self.part_batches(part))
        return batches if count is None or split == "val" else itertools.islice(batches, count)

    def part_batches(self, part):
        """The part's device batches in order (the last may be short), each rank every world-size-th example."""
        rows = np.arange(len(part))[self.order.rank::self.order.world_size]
        size = self.order.batch_size
        for start in range(0, len(rows), size):
            yield to_device(part.batch(rows[start:start + size], self.vocab.pad_id, self.config.seq_len,
                                       self.pad_multiple), self.device, False)

    def take_checkpoint_labels(self, names: tuple[str, ...], kept: bool):
        pass  # outputs without names: ner's tags have them (TokenClassificationTask)

    def submission(self, model, split: str, autocast):
        return None  # every split has its labels: GLUE's test sets hide theirs (ClassificationTask)

    def labels_known(self, split: str) -> bool:
        return True


def pooled_share(config) -> float:
    """The share of the tokens a pooled model's last layer computes (model.pooled_rows): one a row with
    [CLS] pooling, counted against seq-len (batches as wide as that), else every one."""
    return 1 / config.seq_len if config.pooling == "cls" else 1.0


def transfer_files(pattern: str) -> tuple[Path, ...]:
    """The files transfer-data names (a file, directory or pattern), as teacher.transfer_sentences reads them;
    standard input has no file to record."""
    from corpus.input_files import find_inputs  # read only by a run with transfer-data, as teacher.py reads it
    return tuple(each.path for each in find_inputs([pattern]) if each.path is not None)
