"""Extractive question answering (task-type = squad, squad_v2): the answers run_qa.py chooses and legal
spans as pure functions, learning in both layouts, exact resume, --test, scripts/qa.py, and the export
that transformers' question-answering pipeline reads. The data (windows, layouts, their errors):
test_squad_data.py; the official scores: test_squad_metrics.py."""
import json
import re
import shutil

import numpy as np
import pytest
import torch

import checkpoints
import export_hf
import import_hf
import main
import make_qa_demo
import qa
from tasks import squad_data
from conftest import assert_resumes_exactly_mid_epoch, one_error_line, write_mlm_config
from test_distributed import run_main
from test_squad_data import QUESTIONS, one_question, run_qa_features, unanswered
from tasks.squad_data import encode_questions
from tasks.squad_task import QuestionSplit, answer_questions, best_answers

SQUAD = {"seq_len": 128, "batch_size": 16, "learning_rate": 1e-3, "warmup_iters": 10, "dataset_pattern": "",
         "val_dataset_pattern": "", "test_dataset_pattern": ""}


def run_qa_answers(features, start_logits, end_logits, contexts, with_null: bool, max_answer_length: int,
                   threshold: float = 0.0) -> list[tuple[str, float]]:
    """Each question's answer and no-answer margin as postprocess_qa_predictions in transformers'
    examples/pytorch/question-answering/utils_qa.py chooses them, condensed: 20 best starts and ends
    per window, both in the context, the end not before the start, the best sum over the windows."""
    answers = []
    for question, context in enumerate(contexts):
        candidates, null = [], None
        for window in np.nonzero(np.asarray(features["overflow_to_sample_mapping"]) == question)[0]:
            start, end = start_logits[window], end_logits[window]
            offsets = [span if sequence == 1 else None
                       for span, sequence in zip(features["offset_mapping"][window], features.sequence_ids(window))]
            null = start[0] + end[0] if null is None or null > start[0] + end[0] else null
            for first in np.argsort(start)[-1:-21:-1]:
                for last in np.argsort(end)[-1:-21:-1]:
                    if offsets[first] is None or offsets[last] is None:
                        continue
                    if last < first or last - first + 1 > max_answer_length:
                        continue
                    candidates.append((start[first] + end[last], context[offsets[first][0]:offsets[last][1]]))
        score, text = sorted(candidates, key=lambda candidate: candidate[0], reverse=True)[0]
        answers.append(("" if with_null and null - score > threshold else text, float(null - score)))
    return answers


class FixedLogits:
    """Stands in for a model: the given start and end logits of each window in the order inference
    batches them (shortest first), the padding given high logits that must never be ranked."""

    def __init__(self, logits: list[tuple[np.ndarray, np.ndarray]]):
        order = np.argsort([len(start) for start, _ in logits], kind="stable")
        self.pending = [logits[window] for window in order]

    def __call__(self, input_ids, attention_mask, segment_ids):
        windows = [self.pending.pop(0) for _ in range(len(input_ids))]
        padded = [[np.pad(each[side], (0, input_ids.shape[1] - len(each[side])), constant_values=50.0)
                   for each in windows] for side in (0, 1)]
        return torch.from_numpy(np.stack(padded[0])), torch.from_numpy(np.stack(padded[1])), None


@pytest.mark.parametrize("task", ["squad", "squad_v2"])
def test_answers_are_chosen_as_run_qa_chooses_them(vocab_dir, vocab, long_reviews, task):
    """The same logits on the same windows give run_qa.py's answers and no-answer margins: no window
    is preferred for a piece, the ends are a window's 20 best whatever the start, [CLS] and the
    question take places among the 20 best starts."""
    questions = [QUESTIONS[number % 3] for number in range(len(long_reviews))]
    features = run_qa_features(vocab_dir, vocab, questions, long_reviews, 64, 16)
    data = unanswered(questions, long_reviews)
    split = QuestionSplit(data, encode_questions(vocab, data, 64, 16, 64))
    generator = np.random.default_rng(0)
    logits = [tuple(generator.normal(size=int(length)).astype(np.float32) * 3 for _ in range(2))
              for length in split.encoded.lengths]
    for start, end in logits:
        start[0], end[0] = start[0] + 9, end[0] + 9  # [CLS]: some questions unanswered
        start[1:3] += 6  # question pieces among the best starts: never an answer, yet they take places
    theirs = run_qa_answers(features, [start for start, _ in logits], [end for _, end in logits], long_reviews,
                            task == "squad_v2", max_answer_length=8)
    settings = {"seq-len": 64, "doc-stride": 16, "max-query-length": 64, "max-answer-length": 8}
    if task == "squad_v2":
        settings["null-score-threshold"] = 0.0
    ours = answer_questions(FixedLogits(logits), vocab, questions, long_reviews, settings, batch_size=4)
    assert [text for text, _ in ours] == [text for text, _ in theirs]
    margins = [answer.null_score - answer.score for _, answer in
               sorted(best_answers(split, dict(enumerate(logits)), max_answer_length=8).items())]
    assert margins == pytest.approx([margin for _, margin in theirs], abs=1e-5)
    assert task == "squad" or 0 < sum(text == "" for text, _ in ours) < len(ours)


def test_the_best_span_is_legal_and_its_text_comes_from_the_context(vocab):
    context = "A fine western from 1959 . I give it 8 out of 10 , truly ."
    data, split = one_question(vocab, context, "8 out of 10", seq_len=64, stride=8)
    length = int(split.encoded.lengths[0])
    start, end = np.full(length, -5.0), np.full(length, -5.0)
    offset = int(split.encoded.window_offsets[0])
    pieces = split.encoded.offsets[0]
    first = int(np.nonzero(pieces[:, 0] == context.index("8"))[0][0])
    last = int(np.nonzero(pieces[:, 1] == context.index("10") + 2)[0][0])
    start[offset + first], end[offset + last] = 4.0, 3.0
    end[offset + first - 2] = 9.0  # before the start: never chosen
    start[1] = 20.0  # a question piece: outside the context, never chosen
    answer = best_answers(split, {0: (start, end)}, max_answer_length=30)[0]
    assert answer.text == "8 out of 10" and answer.score == 7.0
    assert best_answers(split, {0: (start, end)}, max_answer_length=2)[0].text != "8 out of 10"  # too long


@pytest.fixture(scope="module")
def squad_base(imdb_corpus, vocab_dir, tmp_path_factory):
    """vocab/ and datasets/squad, datasets/squad_v2 in both layouts, made up from the demo reviews."""
    base = tmp_path_factory.mktemp("squad_base")
    shutil.copytree(vocab_dir, base / "vocab")
    make_qa_demo.make_qa_demo(imdb_corpus, base / "datasets", seed=123)
    return base


def squad_workdir(base, directory, task: str, layout: str, **settings):
    """A copy of the base with one task's files in one layout, and a config.ini for a small model."""
    shutil.copytree(base / "vocab", directory / "vocab")
    (directory / "datasets" / task).mkdir(parents=True)
    for path in (base / "datasets" / task).iterdir():
        if (path.suffix == ".parquet") == (layout == "parquet"):
            shutil.copy(path, directory / "datasets" / task / path.name)
    write_mlm_config(directory, **SQUAD | {"task_type": task} | settings)
    return directory


@pytest.mark.parametrize("task, layout, steps", [("squad", "json", 300), ("squad_v2", "parquet", 40)])
def test_the_model_learns_to_answer_in_either_layout_tests_and_answers_text(squad_base, tmp_path, monkeypatch,
                                                                           keep_signal_handlers, capsys, task, layout,
                                                                           steps):
    """squad learns in 300 steps (an empty answer scores 0); squad_v2 needs far more to tell
    answerable questions apart, so here it shows its scores only."""
    monkeypatch.chdir(squad_workdir(squad_base, tmp_path / task, task, layout, max_iters=steps, lr_decay_iters=steps,
                                    val_interval=steps))
    run_dir = main.run(main.load_config(None, []), None, False)
    best = run_dir / "checkpoints" / "best.pt"
    assert checkpoints.load(best)["task"] == task
    main.main(["--cp", str(best), "--test"])
    scores = json.loads(next(run_dir.glob("test_metrics_step*.json")).read_text())
    if task == "squad":
        assert scores["test_f1"] > 50 and scores["test_exact"] > 40  # percent
    else:
        assert {"test_HasAns_f1", "test_NoAns_f1", "test_best_f1", "test_best_f1_thresh"} <= scores.keys()
        assert scores["test_best_f1"] >= scores["test_f1"] - 1e-9  # the sweep includes the threshold used
    capsys.readouterr()
    context = "A fine western from 1959 with a great cast. I give it 8 out of 10, no less."
    qa.main(["--cp", str(best), "-q", "Which year does the review mention?", "-c", context])
    text, score = capsys.readouterr().out.rstrip("\n").split("\t")
    assert text in context and float(score) > -1e9 and (text or task == "squad_v2")


@pytest.mark.parametrize("question, context, message", [
    ("", "A fine western.", "an empty question"), ("What year?", " ", "an empty context")])
def test_qa_refuses_an_empty_question_or_context_from_the_command_line_as_from_a_file(tmp_path, capsys, question,
                                                                                     context, message):
    """One rule for -q/-c and -i, applied before the checkpoint is read."""
    path = tmp_path / "questions.jsonl"
    path.write_text(json.dumps({"question": question, "context": context}) + "\n", encoding="utf-8")
    missing = str(tmp_path / "never-read.pt")
    given = one_error_line(capsys, lambda: qa.main(["--cp", missing, "-q", question, "-c", context]))
    assert given == f"error: -q QUESTION -c CONTEXT: {message}"
    assert one_error_line(capsys, lambda: qa.main(["--cp", missing, "-i", str(path)])) == \
        f"error: {path}: line 1: {message}"


def test_a_run_resumes_exactly_mid_epoch(squad_base, tmp_path, monkeypatch, keep_signal_handlers):
    settings = {"lr_decay_iters": 12, "val_interval": 6}

    def make_workdir(name):
        return squad_workdir(squad_base, tmp_path / name, "squad", "json", **settings)
    assert_resumes_exactly_mid_epoch(make_workdir, monkeypatch, steps=12)


def test_two_processes_train_and_score_every_question_once(squad_base, tmp_path):
    workdir = squad_workdir(squad_base, tmp_path / "ddp", "squad_v2", "json", batch_size=8, max_iters=4,
                            val_interval=4)
    result = run_main(workdir)
    assert result.returncode == 0, result.stderr
    saved = checkpoints.load(workdir / "runs" / "run0" / "checkpoints" / "checkpoint.pt")
    assert saved["step"] == 4 and len(saved["rng_per_rank"]) == 2
    questions = len(squad_data.read_split(workdir / "datasets", "squad_v2", "validation"))
    log = (workdir / "runs" / "run0" / "logs" / "log.txt").read_text(encoding="utf-8")
    assert re.search(rf"val questions {questions}\b", log)  # each question's windows met, from whichever rank


def test_a_doc_stride_without_room_is_one_line(squad_base, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(squad_workdir(squad_base, tmp_path / "room", "squad", "json", doc_stride=200))
    assert "doc-stride must be below that" in one_error_line(capsys, lambda: main.main(["--max-iters", "2"]))


@pytest.mark.parametrize("architecture", [["--norm", "postln", "--position", "learned"],
                                          ["--norm", "preln", "--position", "rope"]])
def test_the_export_answers_as_ours_in_transformers_pipeline(squad_base, tmp_path, monkeypatch, keep_signal_handlers,
                                                             architecture):
    transformers = pytest.importorskip("transformers")
    monkeypatch.chdir(squad_workdir(squad_base, tmp_path / "work", "squad", "parquet"))
    run_dir = main.run(main.load_config(None, ["--max-iters", "60", "--val-interval", "60", *architecture]),
                       None, False)
    path = run_dir / "checkpoints" / "checkpoint.pt"
    export_hf.main(["--cp", str(path), "-o", str(tmp_path / "hf")])
    native = architecture[1] == "postln"
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert config["architectures"] == ["BertForQuestionAnswering" if native else "BertVariantForQuestionAnswering"]
    model, vocab, checkpoint = checkpoints.restore_model(path, {"squad": qa.BertForQuestionAnswering})
    question = "What score does the reviewer give?"
    context = "A fine western from 1959 with a great cast. I give it 8 out of 10, no less."
    ours = qa.answer_questions(model, vocab, [question], [context], qa.run_settings(checkpoint, 128))[0]
    assert ours[0] and ours[0] in context
    if int(transformers.__version__.split(".")[0]) < 5:  # transformers 5 has no question-answering pipeline
        reader = transformers.pipeline("question-answering", model=str(tmp_path / "hf"), trust_remote_code=not native)
        assert reader(question=question, context=context, max_answer_len=30)["answer"] == ours[0]
    loaded = transformers.AutoModelForQuestionAnswering.from_pretrained(tmp_path / "hf", trust_remote_code=not native)
    inputs = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")(question, context, return_tensors="pt")
    with torch.no_grad():
        start, end, _ = model(inputs["input_ids"], segment_ids=inputs["token_type_ids"])
        output = loaded(**inputs)
    torch.testing.assert_close(output.start_logits, start, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(output.end_logits, end, rtol=1e-4, atol=1e-4)
    import_hf.main(["-i", str(tmp_path / "hf"), "-o", str(tmp_path / "back.pt")])
    back = checkpoints.load(tmp_path / "back.pt")
    assert back["task"] == "squad" and back["model"].keys() == model.state_dict().keys()
