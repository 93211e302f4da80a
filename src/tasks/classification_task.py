"""Fine-tuning on a sentence or a sentence pair (task.Task): every GLUE task (glue_tasks.py has the
table, glue_data.py the readers of both layouts, pair_encoding.py the inputs, glue_metrics.py the
metrics), and `classify` and `classify_pair`, any classification of one text or of a pair: the user's
own files (labelled_files.py: labels by name, a list of them with multi-label, or a score to predict
with num-labels = 1) or SST-2's and RTE's layouts with num-labels classes.

Batches are padded to their own longest example (batching.pad_multiple's rounding), not to seq-len:
SST-2 sentences average about 10 words, so most of a 128-wide batch would be padding. With
length-grouping, training batches hold examples of similar length, so even less is. Validation
scores the whole dev split (MNLI's two, matched and mismatched) at every validation.
"""
import dataclasses
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from architecture import USER_CLASS_TASKS, label_names
from batching import padded_width
from config import model_config
from distributed import every_rank
from errors import UserError
from model import BertForSequenceClassification, ModelConfig
from tasks import glue_data
from tasks import glue_metrics
from tasks import glue_tasks
from tasks import pair_encoding
from tasks.fine_tuning import EncodedSplit, FineTuningTask, pooled_share


def glue_task_of(config, names: tuple[str, ...] = ()) -> glue_tasks.GlueTask:
    """The GLUE task a config names. `classify` is SST-2's layout with classes of its own, and
    `classify_pair` RTE's (in a folder of its name): `names` (a checkpoint's, or its training file's),
    else `labels`, else 0 to num-labels - 1; on the user's own files (train-file) --test writes each
    prediction's name."""
    if config.task_type not in USER_CLASS_TASKS:
        return glue_tasks.TASKS[config.task_type]
    names = names or config.given_labels or label_names(config.task_type, config.num_labels)
    if config.task_type == "classify":
        task = dataclasses.replace(glue_tasks.TASKS["sst2"], name="classify", label_names=names)
    else:
        task = dataclasses.replace(glue_tasks.TASKS["rte"], name="classify_pair", tsv_folder="classify_pair",
                                   label_names=names, server_wants_names=False,
                                   submission_files={"test": "classify_pair.tsv"})
    if config.num_labels == 1:  # one score a text, scored as STS-B is (only on the user's own files)
        task = dataclasses.replace(task, label_names=(), metrics=glue_tasks.TASKS["stsb"].metrics,
                                   headline_metric=glue_tasks.TASKS["stsb"].headline_metric)
    if config.multi_label:  # any number of the classes an example (only on the user's own files)
        task = dataclasses.replace(task, multi_label=True, metrics=("f1_micro",), headline_metric="f1_micro")
    if config.train_file:
        predictions = f"{Path(config.test_file or 'test').stem}.tsv"  # beside the run: test_predictions_stepN_NAME.tsv
        task = dataclasses.replace(task, submission_files={"test": predictions}, server_wants_names=True)
    return task


@dataclass
class Part(EncodedSplit):
    """One file set of a split (MNLI's validation has two: matched and mismatched), encoded."""
    name: str  # the split as glue_tasks.py names it: validation_matched
    examples: glue_data.Examples
    encoded: pair_encoding.EncodedExamples

    def batch(self, rows: np.ndarray, pad_id: int, seq_len: int, multiple: int) -> dict:
        width = padded_width(self.encoded.lengths[rows], seq_len, multiple)
        input_ids, segment_ids, real = self.encoded.padded(rows, width, pad_id)
        pair = self.examples.second is not None
        return {"input_ids": input_ids, "attention_mask": real, "segment_ids": segment_ids if pair else None,
                "labels": self.examples.labels[rows]}


def confusion_matrix(predicted: torch.Tensor, labels: torch.Tensor, classes: int,
                     known: torch.Tensor | None = None) -> torch.Tensor:
    """counts[true, predicted], flattened; of the rows `known` marks where it is given."""
    cells = labels.clamp(min=0) * classes + predicted
    if known is None:
        return torch.bincount(cells, minlength=classes * classes)
    return torch.bincount(cells, weights=known.float(), minlength=classes * classes).long()


def with_unlabelled(examples: glue_data.Examples, texts: list[str]) -> glue_data.Examples:
    """The examples, then the texts as examples whose label is hidden."""
    hidden = glue_data.HIDDEN_SCORE if examples.labels.dtype.kind == "f" else glue_data.HIDDEN_LABEL
    unknown = np.full((len(texts), *examples.labels.shape[1:]), hidden, dtype=examples.labels.dtype)
    no_index = np.full(len(texts), glue_data.HIDDEN_LABEL, np.int64)
    return glue_data.Examples(examples.first + texts, None, np.concatenate([examples.labels, unknown]),
                              np.concatenate([examples.index, no_index]), examples.files, examples.skipped_lines)


def load_classifier_teacher(path: Path, vocab, seq_len: int, num_labels: int,
                            device: torch.device) -> BertForSequenceClassification:
    """teacher = PATH as a classifier of the run's classes, frozen (teacher.py) on the device."""
    from tasks.teacher import frozen, read_teacher  # a run without a teacher reads no other model
    state, config = read_teacher(path, vocab, seq_len)
    if "classifier.weight" not in state["model"] or config.num_labels != num_labels:
        raise UserError(f"teacher = {path}: not a classifier of this task's {num_labels} "
                        f"{'output' if num_labels == 1 else 'classes'} (fine-tune it on the task first)")
    return frozen(BertForSequenceClassification(config), state, path, device)


def confusion_metrics(confusion: np.ndarray) -> dict[str, float]:
    """Accuracy and Matthews correlation from counts[true, predicted], and F1 of class 1 with two classes."""
    metrics = {"accuracy": float(np.trace(confusion) / confusion.sum()),
               "matthews": glue_metrics.matthews_from_confusion(confusion)}
    if len(confusion) == 2:
        true_positive = confusion[1, 1]
        metrics["f1"] = float(2 * true_positive / (2 * true_positive + confusion[0, 1] + confusion[1, 0]) or 0.0)
    return metrics


def known_labels(labels: torch.Tensor) -> torch.Tensor:
    """The rows whose label is given: a class id, a score, or a multi-label row (not NaN)."""
    if not labels.is_floating_point():
        return labels != glue_data.HIDDEN_LABEL
    return ~torch.isnan(labels).any(-1) if labels.dim() == 2 else ~torch.isnan(labels)


def multi_label_sums(predicted: torch.Tensor, labels: torch.Tensor, known: torch.Tensor) -> torch.Tensor:
    """[examples right in every class, true positives, wrong decisions] over the known rows: enough for
    subset accuracy and micro-F1 by addition."""
    predicted, true = predicted.bool(), labels > 0.5
    wrong = (predicted != true) & known[:, None]
    return torch.stack([((~wrong).all(-1) & known).sum(), (predicted & true & known[:, None]).sum(), wrong.sum()])


def regression_sums(scores: torch.Tensor, labels: torch.Tensor, known: torch.Tensor) -> torch.Tensor:
    """[n, sum p, sum y, sum p^2, sum y^2, sum py] over the known rows: enough for Pearson's
    correlation by addition."""
    p, y = scores.double() * known, labels.double().nan_to_num() * known
    return torch.stack([known.sum().double(), p.sum(), y.sum(), (p * p).sum(), (y * y).sum(), (p * y).sum()])


def pearson_from_sums(sums: np.ndarray) -> float | None:
    """Pearson's correlation from regression_sums; None where undefined (constant predictions or
    labels), as glue_metrics.pearson."""
    n, p, y, pp, yy, py = sums
    spread = (n * pp - p * p) * (n * yy - y * y)
    return float((n * py - p * y) / np.sqrt(spread)) if spread > 0 else None


class ClassificationTask(FineTuningTask):
    """A classifier (one class an example, or with multi-label any number: micro-F1) or a regressor
    (STS-B's, or classify(_pair) with num-labels = 1) on BERT, examples in, labels out. best.pt goes by
    the task's GLUE score: its metric, or the mean of its two (MRPC, QQP, STS-B and regressions:
    Pearson's and Spearman's correlations).

    With a teacher (a classifier of the same task, of any size), the student also learns the
    teacher's logits by mean squared error (Tang et al. 2019), on its training examples and on the
    sentences of transfer-data, which have no label of their own: a small model learns a large
    one's task from unlabelled text of the task's kind."""
    # examples are cut to seq-len; the teacher and the transfer sentences make the training loss;
    # classify(_pair)'s own files and their columns are its data, `labels` what its classes mean
    measuring_keys = ("seq_len", "dataset_percentage", "val_dataset_percentage", "teacher", "transfer_data",
                      "train_file", "validation_file", "text_column", "text_pair_column", "label_column", "labels")

    def __init__(self, config, vocab, device: torch.device, rank: int = 0, world_size: int = 1):
        super().__init__(config, vocab, device, rank, world_size)
        self.last_layer_share = pooled_share(config)
        self.glue_task = glue_task_of(config)
        # classify(_pair)'s classes have names where the user gave them (labels) or its own files name them
        self.named = config.task_type in USER_CLASS_TASKS and bool(config.given_labels or config.train_file) \
            and not self.glue_task.is_regression
        self.names_from_data = bool(self.named and not config.given_labels)  # until a checkpoint's are taken
        self.whose = "the training file's"  # whose names the data is read against, for messages
        self.teacher = None  # loaded once the training split has named the classes
        if config.given_labels:
            self.use_names(config.given_labels, "the config's")
        self.best_metric = self.glue_task.metrics[0] if len(self.glue_task.metrics) == 1 else "score"
        self.split("train")  # fail early on a missing train split
        if config.teacher:
            self.teacher = load_classifier_teacher(Path(config.teacher), vocab, config.seq_len, self.num_labels,
                                                   device)
            self.check_teacher_classes()

    @property
    def num_labels(self) -> int:
        return self.glue_task.num_labels

    @property
    def multi_label(self) -> bool:
        return self.glue_task.multi_label

    def split_names(self, split: str) -> tuple[str, ...]:
        """glue_tasks.py's names of a split's parts: val is every dev split, test every test split."""
        return {"train": ("train",), "val": self.glue_task.dev_splits, "test": self.glue_task.test_splits}[split]

    def use_names(self, names: tuple[str, ...], whose: str):
        """classify(_pair)'s classes from now on: `names`, in the model's order (num-labels, where given, agrees)."""
        if "num_labels" in self.config.given and self.config.num_labels != len(names):
            raise UserError(f"num-labels = {self.config.num_labels}, but {whose} labels are {len(names)}: "
                            f"{', '.join(names[:12])}{', ...' if len(names) > 12 else ''}")
        self.glue_task, self.whose = glue_task_of(self.config, names), whose
        if self.teacher is not None:  # a checkpoint's names, taken after the teacher came
            self.check_teacher_classes()

    def check_teacher_classes(self):
        """A teacher with named classes names this run's, in its order: its logit i teaches class i."""
        names, taught = tuple(self.teacher.config.label_names), self.glue_task.label_names
        if self.teacher.config.multi_label != self.multi_label:
            kind = {True: "multi-label", False: "of one class an example"}
            raise UserError(f"teacher = {self.config.teacher}: a classifier {kind[self.teacher.config.multi_label]}; "
                            f"this run's is {kind[self.multi_label]}")
        if self.named and names and names != taught:
            raise UserError(f"teacher = {self.config.teacher}: its classes are {', '.join(names)}; this run's are "
                            f"{', '.join(taught)} (the same, in the same order)")

    def take_checkpoint_labels(self, names: tuple[str, ...], kept: bool):
        """classify(_pair)'s own files are read against a checkpoint's class names, label by name: always where
        its model is kept (resumed, scored); in a new run from its weights where they cover the training
        file's labels, so its head goes on. Names given by `labels` stay (another set: a new head)."""
        if not (names and self.named and not self.config.given_labels):
            return
        if not kept and not set(self.glue_task.label_names) <= set(names):
            return
        if names != self.glue_task.label_names:
            self.splits = {}  # read again under the checkpoint's names
        self.names_from_data = False
        self.use_names(names, "the checkpoint's")

    def data_files(self) -> dict[str, tuple[Path, ...]]:
        """transfer-data's files, and classify(_pair)'s training and validation files. test-file is not
        among them: neither training nor best.pt reads it, and --test scores whatever it holds then (a
        test set corrected since), so a change never stops a resume."""
        files = super().data_files()
        if self.config.train_file:
            files |= {"train-file": (Path(self.config.train_file),),
                      "validation-file": (Path(self.config.validation_file),)}
        return files

    def read_examples(self, split: str, name: str) -> glue_data.Examples:
        """A part's examples: from glue-dir's layout, or the user's own file, whose training file names
        the classes unless they have names already (labels, a checkpoint)."""
        if not self.config.train_file:
            return glue_data.read_split(self.config.glue_path, self.glue_task, name)
        from tasks import labelled_files  # a run on GLUE's layouts reads none of the user's files
        rows = labelled_files.read_labelled_rows(labelled_files.labelled_file(self.config, name),
                                                 labelled_files.text_columns(self.config), self.config.label_column,
                                                 needs_labels=split != "test")
        if self.glue_task.is_regression:
            return labelled_files.scored_examples(rows)
        if split == "train" and self.names_from_data:
            names = [name for row in rows.name_sets for name in row] if self.multi_label else rows.names
            if not names:
                raise UserError(f"{rows.path}: no row names a class in column {rows.column}: nothing to learn")
            self.use_names(labelled_files.ordered_names(names), "the training file's")
        if self.multi_label:
            return labelled_files.multi_hot_examples(rows, self.glue_task.label_names, self.whose)
        return labelled_files.labelled_examples(rows, self.glue_task.label_names, self.whose)

    def read_part(self, split: str, name: str) -> Part:
        examples = self.read_examples(split, name)
        if split == "train" and examples.labels_hidden:
            raise UserError(f"{examples.files[0]}: the training split's labels are hidden")
        examples = self.kept(examples, split, "examples")
        if split == "train" and self.config.transfer_data:
            from tasks.teacher import transfer_sentences
            examples = with_unlabelled(examples, transfer_sentences(self.config.transfer_data))
        encoded = pair_encoding.encode_examples(self.vocab, examples.first, examples.second, self.config.seq_len)
        return Part(name, examples, encoded)

    def model_config(self, max_len: int | None = None) -> ModelConfig:
        names = self.glue_task.label_names if self.named else ()
        return model_config(self.config, self.vocab, max_len, num_labels=self.num_labels, label_names=names,
                            multi_label=self.multi_label)

    def build_model(self, max_len: int | None = None) -> BertForSequenceClassification:
        return BertForSequenceClassification(self.model_config(max_len))

    def outputs(self, model, batch: dict):
        return model(batch["input_ids"], batch.get("labels"), attention_mask=batch["attention_mask"],
                     segment_ids=batch["segment_ids"])

    def loss(self, model, batch: dict, progress=None):
        """Mean loss and summed statistics of the labelled examples: [count, confusion matrix...] for a
        classifier, [count, multi_label_sums...] multi-label, [count, regression_sums...] for a regressor;
        no host sync. With a teacher, the mean
        squared error to its logits over every example is added."""
        logits, _ = self.outputs(model, {**batch, "labels": None})
        labels = batch["labels"]
        known = known_labels(labels)
        loss = self.labelled_loss(logits, labels, known)
        if self.teacher is not None:
            with torch.no_grad():
                taught, _ = self.outputs(self.teacher, {**batch, "labels": None})
            loss = loss + F.mse_loss(logits.float(), taught.float())
        if self.glue_task.is_regression:
            sums = regression_sums(logits[:, 0], labels, known)
            return loss, torch.cat([sums[:1], sums])
        if self.multi_label:
            return loss, torch.cat([known.sum()[None], multi_label_sums(self.predicted(logits), labels, known)])
        confusion = confusion_matrix(logits.argmax(-1), labels, self.num_labels, known)
        return loss, torch.cat([known.sum()[None], confusion])

    def labelled_loss(self, logits: torch.Tensor, labels: torch.Tensor, known: torch.Tensor) -> torch.Tensor:
        """The model's loss over the rows with a label: cross-entropy, a regression's squared error, or
        multi-label the binary cross-entropy of each class's decision (as model.sequence_loss)."""
        if self.glue_task.is_regression:
            each = F.mse_loss(logits[:, 0].float(), labels.float().nan_to_num(), reduction="none")
        elif self.multi_label:
            each = F.binary_cross_entropy_with_logits(logits.float(), labels.float().nan_to_num(),
                                                      reduction="none").mean(-1)
        else:
            each = F.cross_entropy(logits.float(), labels.clamp(min=0), reduction="none")
        return (each * known).sum() / known.sum().clamp(min=1)

    def metrics(self, loss: float, statistics: torch.Tensor) -> dict:
        """Training metrics from summed statistics (evaluate scores every prediction)."""
        if self.glue_task.is_regression:
            return {"loss": loss, "pearson": pearson_from_sums(statistics[1:].numpy())}
        if self.multi_label:
            count, exact, hits, wrong = (int(value) for value in statistics)
            return {"loss": loss, "subset_accuracy": exact / max(count, 1),
                    "f1_micro": glue_metrics.f1_from_counts(hits, wrong)}
        classes = self.num_labels
        return {"loss": loss, **confusion_metrics(statistics[1:].numpy().reshape(classes, classes))}

    @torch.no_grad()
    def evaluate(self, model, batches, autocast) -> dict:
        """The task's GLUE metrics on every prediction of the batches (all ranks'), per part: MNLI's
        mismatched ones end in _mismatched. `examples` counts what was scored."""
        model.eval()
        loss_sum, collected = 0.0, []
        for batch in batches:
            with autocast:
                logits, loss = self.outputs(model, batch)
            loss_sum += loss.double().item() * len(batch["labels"])
            collected.append((batch["part"], self.predicted(logits).cpu().numpy(), batch["labels"].cpu().numpy()))
        model.train()
        gathered = every_rank((loss_sum, collected))
        loss_sum, collected = sum(each[0] for each in gathered), [item for each in gathered for item in each[1]]
        examples = sum(len(labels) for _, _, labels in collected)
        metrics = {"loss": loss_sum / examples}
        for number in sorted({part for part, _, _ in collected}):
            predictions = np.concatenate([each[1] for each in collected if each[0] == number])
            labels = np.concatenate([each[2] for each in collected if each[0] == number])
            suffix = "" if number == 0 else "_mismatched"
            metrics |= {name + suffix: value for name, value in self.part_metrics(labels, predictions).items()}
        return metrics | {"examples": examples}

    def part_metrics(self, labels: np.ndarray, predictions: np.ndarray) -> dict[str, float]:
        if self.multi_label:
            return glue_metrics.multi_label_metrics(labels, predictions)
        metrics = glue_metrics.task_metrics(self.glue_task, labels, predictions)
        if not self.glue_task.is_regression:
            metrics.setdefault("accuracy", glue_metrics.accuracy(labels, predictions))
        if self.glue_task.name in USER_CLASS_TASKS and not self.glue_task.is_regression:  # classes far from balanced
            metrics["f1_macro"] = glue_metrics.macro_f1(labels, predictions)
        if len(self.glue_task.metrics) > 1:
            metrics["score"] = glue_metrics.task_score(self.glue_task, metrics)
        return metrics

    def predicted(self, logits: torch.Tensor) -> torch.Tensor:
        """Class ids, a regressor's scores, or a multi-label model's 0 or 1 a class."""
        if self.multi_label:
            return (logits > 0).to(torch.int8)
        return logits[:, 0].float() if self.glue_task.is_regression else logits.argmax(-1)

    def submission(self, model, split: str, autocast) -> dict[str, list[str]] | None:
        """Where the split's labels are hidden (GLUE's test sets), the GLUE server's file name of each
        part -> its lines (`index<TAB>prediction`); for the user's own test file, labelled or not, its
        predictions by name and how sure each is (`index<TAB>prediction<TAB>probability`; a score
        alone for a regression); else None."""
        parts = self.parts(split)
        if self.labels_known(split) and not self.config.train_file:
            return None
        files = {}
        for part in parts:
            logits = self.part_logits(model, part, autocast)
            index = part.examples.index[np.arange(len(part))[self.order.rank::self.order.world_size]]
            lines = glue_tasks.submission_lines(self.glue_task, self.predicted(logits).numpy(), index)
            if self.config.train_file and not self.glue_task.is_regression:
                lines = [f"{line}\t{sure}" for line, sure in zip(lines, ["probability", *self.certainty(logits)])]
            files[self.glue_task.submission_files[part.name]] = lines
        return files

    def certainty(self, logits: torch.Tensor) -> list[str]:
        """Each prediction's probability: the class's softmax, or a multi-label model's sigmoids of the
        classes it predicts, between commas."""
        if self.multi_label:  # the classes predicted() picks, by the same rule
            picked = self.predicted(logits).tolist()
            return [",".join(f"{chance:.3f}" for chance, chosen in zip(row, picks) if chosen)
                    for row, picks in zip(logits.sigmoid().tolist(), picked)]
        return [f"{chance:.3f}" for chance in logits.softmax(-1).amax(-1).tolist()]

    def labels_known(self, split: str) -> bool:
        return not all(part.examples.labels_hidden for part in self.parts(split))

    def predict(self, model, part: Part, autocast) -> np.ndarray:
        """Predictions for a part, in its order (this rank's share)."""
        return self.predicted(self.part_logits(model, part, autocast)).numpy()

    @torch.no_grad()
    def part_logits(self, model, part: Part, autocast) -> torch.Tensor:
        """The model's outputs for a part, in its order (this rank's share), float32 on the CPU."""
        model.eval()
        logits = []
        for batch in self.part_batches(part):
            with autocast:
                outputs, _ = self.outputs(model, {**batch, "labels": None})
            logits.append(outputs.float().cpu())
        model.train()
        return torch.cat(logits)

    @torch.no_grad()
    def show_predictions(self, model, autocast) -> str:
        """A few validation examples with the prediction (and its probability) and the truth."""
        batch = next(self.eval_batches("val", 1))
        batch = {name: value[:4] if isinstance(value, torch.Tensor) else value for name, value in batch.items()}
        model.eval()
        with autocast:
            logits, _ = self.outputs(model, {**batch, "labels": None})
        model.train()
        lines = []
        for row in range(len(logits)):
            ids = batch["input_ids"][row][batch["attention_mask"][row]].tolist()
            text = self.vocab.render(ids, {})
            if self.glue_task.is_regression:
                lines.append(f"  {float(logits[row, 0]):.2f} (true {float(batch['labels'][row]):.2f}): {text}")
                continue
            if self.multi_label:
                chances, picks = logits[row].float().sigmoid().tolist(), self.predicted(logits[row]).tolist()
                chosen = ", ".join(f"{self.label_name(label)} {chance:.2f}" for label, (chance, picked)
                                   in enumerate(zip(chances, picks)) if picked) or "none"
                true = ", ".join(self.label_name(label) for label, value in enumerate(batch["labels"][row].tolist())
                                 if value > 0.5) or "none"
                lines.append(f"  {chosen} (true {true}): {text}")
                continue
            probabilities = logits[row].float().softmax(-1)
            label = int(probabilities.argmax())
            lines.append(f"  {self.label_name(label)} ({probabilities[label]:.2f}, "
                         f"true {self.label_name(int(batch['labels'][row]))}): {text}")
        return "predictions:\n" + "\n".join(lines)

    def label_name(self, label: int) -> str:
        return self.glue_task.label_names[label] if 0 <= label < len(self.glue_task.label_names) else str(label)
