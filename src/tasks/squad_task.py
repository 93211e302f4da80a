"""Extractive question answering (task-type = squad for SQuAD v1.1, squad_v2 with unanswerable
questions; task.Task). squad_data.py reads and encodes the data, squad_metrics.py scores as SQuAD's
official scripts do.

The model gives every token a start and an end logit. A question's answer is chosen as
transformers' run_qa.py chooses it (postprocess_qa_predictions in its utils_qa.py): in each window
a start among the window's 20 highest start logits and an end among its 20 highest end logits
([CLS] and the question's pieces among them; padding never, where run_qa's may), both in the
context, the end not before the start, at most max-answer-length pieces; the best such span over
all the windows by the two logits' sum. For squad_v2 the no-answer score is [CLS]'s (the lowest over
the windows), and the answer is empty where it beats the best span's by more than
null-score-threshold. best.pt goes by F1.
"""
from dataclasses import dataclass

import numpy as np
import torch

from batching import gather_padded, pad_multiple, padded_width
from config import model_config
from distributed import every_rank
from hardware import to_device
from model import BertForQuestionAnswering, ModelConfig
from tasks import squad_data
from tasks.fine_tuning import EncodedSplit, FineTuningTask, inference_rows
from tasks.squad_data import EncodedQuestions, Questions
from tasks.squad_metrics import squad_scores

N_BEST = 20  # start and end candidates per window, as run_qa.py and BERT's own script take


@dataclass
class QuestionSplit(EncodedSplit):
    """One split: its questions and their encoded windows."""
    questions: Questions
    encoded: EncodedQuestions

    def batch(self, rows: np.ndarray, pad_id: int, seq_len: int, multiple: int) -> dict:
        """Windows `rows`, padded to the longest (rounded up to `multiple`)."""
        windows = self.encoded
        width = padded_width(windows.lengths[rows], seq_len, multiple)
        input_ids, real = gather_padded(windows.tokens, windows.starts, rows, width, pad_id)
        segment_ids, _ = gather_padded(windows.segments, windows.starts, rows, width, 0)
        return {"input_ids": input_ids, "attention_mask": real, "segment_ids": segment_ids,
                "start_positions": windows.answer_start[rows], "end_positions": windows.answer_end[rows],
                "windows": rows}


@dataclass
class Answer:
    text: str
    score: float  # the span's start and end logits summed; -inf where no span is legal
    null_score: float  # [CLS]'s, the lowest over the question's windows


def best_answers(data: QuestionSplit, logits: dict[int, tuple[np.ndarray, np.ndarray]],
                 max_answer_length: int) -> dict[int, Answer]:
    """The best legal span of each question whose windows the logits (window -> start, end) cover."""
    by_question: dict[int, list[int]] = {}
    for window in sorted(logits):
        by_question.setdefault(int(data.encoded.questions[window]), []).append(window)
    answers = {}
    for question, windows in by_question.items():
        best, best_score, null_score = (0, 0), -np.inf, np.inf
        for window in windows:
            start_logits, end_logits = logits[window]
            null_score = min(null_score, float(start_logits[0] + end_logits[0]))
            span, score = best_span(start_logits, end_logits, data.encoded, window, max_answer_length)
            if score > best_score:  # an earlier window wins a tie, as in run_qa's stable sort
                best, best_score = span, score
        context, offsets = data.questions.contexts[question], data.encoded.offsets[question]
        text = context[offsets[best[0], 0]:offsets[best[1], 1]] if best_score > -np.inf else ""
        answers[question] = Answer(text, best_score, null_score)
    return answers


def best_span(start_logits: np.ndarray, end_logits: np.ndarray, windows: EncodedQuestions, window: int,
              max_answer_length: int) -> tuple[tuple[int, int], float]:
    """The window's best (first, last) context pieces and their score ((0, 0), -inf where none is
    legal): a start among the window's N_BEST highest start logits and an end among its N_BEST
    highest end logits, both in the context, the end not before the start, the span at most
    max_answer_length pieces. Padding is not ranked: a window's logits end at its length."""
    offset, first = int(windows.window_offsets[window]), int(windows.first_pieces[window])
    length = int(windows.lengths[window])
    context_end = length - 1  # the closing [SEP]
    starts, ends = np.meshgrid(highest(start_logits[:length]), highest(end_logits[:length]), indexing="ij")
    legal = (starts >= offset) & (starts <= ends) & (ends < context_end) & (ends - starts < max_answer_length)
    if not legal.any():
        return (0, 0), -np.inf
    scores = np.where(legal, start_logits[starts] + end_logits[ends], -np.inf)
    # the first best in start-major order, the order run_qa.py lists its candidates in
    row, column = np.unravel_index(np.argmax(scores), scores.shape)
    start, end = int(starts[row, column]), int(ends[row, column])
    return (first + start - offset, first + end - offset), float(scores[row, column])


def highest(logits: np.ndarray) -> np.ndarray:
    """The positions of the N_BEST highest logits, highest first (run_qa.py's expression, so that ties
    fall as they fall there)."""
    return np.argsort(logits)[-1:-N_BEST - 1:-1]


class QuestionAnsweringTask(FineTuningTask):
    """SQuAD on BERT: BertForQuestionAnswering, scored by exact match and F1."""
    best_metric = "f1"
    measuring_keys = ("seq_len", "doc_stride", "max_query_length", "max_answer_length", "null_score_threshold",
                      "dataset_percentage", "val_dataset_percentage")

    def __init__(self, config, vocab, device: torch.device, rank: int = 0, world_size: int = 1):
        super().__init__(config, vocab, device, rank, world_size)
        self.split("train")  # fail early on a missing or bad train split

    def read_part(self, split: str, name: str) -> QuestionSplit:
        config = self.config
        questions = self.kept(squad_data.read_split(config.glue_path, self.name, name), split, "questions")
        windows = squad_data.encode_questions(self.vocab, questions, config.seq_len, config.doc_stride,
                                              config.max_query_length)
        return QuestionSplit(questions, windows)

    def model_config(self, max_len: int | None = None) -> ModelConfig:
        return model_config(self.config, self.vocab, max_len)

    def build_model(self, max_len: int | None = None) -> BertForQuestionAnswering:
        return BertForQuestionAnswering(self.model_config(max_len))

    def outputs(self, model, batch: dict, labelled: bool = True):
        return model(batch["input_ids"], batch["attention_mask"], batch["segment_ids"],
                     batch["start_positions"] if labelled else None, batch["end_positions"] if labelled else None)

    def loss(self, model, batch: dict, progress=None):
        """Mean loss, and [windows, starts right, ends right]; no host sync."""
        start, end, loss = self.outputs(model, batch)
        return loss, torch.stack([batch["start_positions"].new_tensor(len(start)),
                                  (start.argmax(-1) == batch["start_positions"]).sum(),
                                  (end.argmax(-1) == batch["end_positions"]).sum()])

    def metrics(self, loss: float, statistics: torch.Tensor) -> dict:
        count = float(statistics[0])
        return {"loss": loss, "start_accuracy": float(statistics[1]) / count,
                "end_accuracy": float(statistics[2]) / count}

    @torch.no_grad()
    def evaluate(self, model, batches, autocast) -> dict:
        """exact and f1 (with HasAns_, NoAns_ and the best threshold for squad_v2) over every question
        the batches reach (all ranks'), and the mean loss over their windows."""
        model.eval()
        loss_sum, windows, logits, split = 0.0, 0, {}, "val"
        for batch in batches:
            split = batch["split"]
            with autocast:
                start, end, loss = self.outputs(model, batch)
            loss_sum, windows = loss_sum + loss.double().item() * len(start), windows + len(start)
            logits |= window_logits(batch, start, end)
        model.train()
        gathered = every_rank((loss_sum, windows, logits))
        loss_sum, windows = sum(each[0] for each in gathered), sum(each[1] for each in gathered)
        logits = {window: value for each in gathered for window, value in each[2].items()}
        data = self.split(split)
        answers = best_answers(data, logits, self.config.max_answer_length)
        return {"loss": loss_sum / windows, **self.scores(data.questions, answers), "questions": len(answers)}

    def scores(self, questions: Questions, answers: dict[int, Answer]) -> dict[str, float]:
        predictions = {questions.ids[row]: self.predicted_text(answer) for row, answer in answers.items()}
        golds = {questions.ids[row]: [text for text, _ in questions.answers[row]] for row in answers}
        margins = None
        if self.name == "squad_v2":
            margins = {questions.ids[row]: answer.null_score - answer.score for row, answer in answers.items()}
        return squad_scores(predictions, golds, margins)

    def predicted_text(self, answer: Answer) -> str:
        """The span, or for squad_v2 nothing where [CLS] beats it by the threshold."""
        if self.name == "squad_v2" and answer.null_score > answer.score + self.config.null_score_threshold:
            return ""
        return answer.text

    def show_predictions(self, model, autocast) -> str:
        """A few validation questions with the predicted answer and the gold ones."""
        data = self.split("val")
        first = np.nonzero(data.encoded.questions < 4)[0]
        batch = to_device(data.batch(first, self.vocab.pad_id, self.config.seq_len, self.pad_multiple),
                          self.device, False)
        model.eval()
        with torch.no_grad(), autocast:
            start, end, _ = self.outputs(model, batch, labelled=False)
        model.train()
        answers = best_answers(data, window_logits(batch, start, end), self.config.max_answer_length)
        lines = [f"  {data.questions.questions[row]} -> {self.predicted_text(answer)!r} (gold "
                 f"{[text for text, _ in data.questions.answers[row]] or ['']})" for row, answer in answers.items()]
        return "predictions:\n" + "\n".join(lines)


def window_logits(batch: dict, start: torch.Tensor, end: torch.Tensor) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """window -> its start and end logits (float32 numpy, padding included)."""
    start, end = start.float().cpu().numpy(), end.float().cpu().numpy()
    return {int(window): (start[row], end[row]) for row, window in enumerate(batch["windows"].tolist())}


@torch.no_grad()
def answer_questions(model, vocab, questions: list[str], contexts: list[str], settings: dict,
                     batch_size: int = 32, progress: bool = False) -> list[tuple[str, float]]:
    """The answer span and its score for each question on its context, windows and spans as
    fine-tuning made them (settings: the run's seq-len, doc-stride, max-query-length,
    max-answer-length; null-score-threshold where squad_v2, whose empty answer scores [CLS])."""
    data = Questions([str(number) for number in range(len(questions))], questions, contexts,
                     [[] for _ in questions], ())
    split = QuestionSplit(data, squad_data.encode_questions(vocab, data, settings["seq-len"], settings["doc-stride"],
                                                            settings["max-query-length"]))
    logits = {}
    for rows in inference_rows(split.lengths, batch_size, progress):
        batch = split.batch(rows, vocab.pad_id, settings["seq-len"], pad_multiple("cpu"))  # on the CPU: numpy in
        starts, ends, _ = model(*(torch.from_numpy(batch[name]) for name in ("input_ids", "attention_mask",
                                                                             "segment_ids")))
        logits |= window_logits(batch, starts, ends)
    answers = best_answers(split, logits, settings["max-answer-length"])
    threshold = settings.get("null-score-threshold")
    return [("", answer.null_score) if threshold is not None and answer.null_score > answer.score + threshold
            else (answer.text, answer.score) for answer in (answers[row] for row in range(len(questions)))]
