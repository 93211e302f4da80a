"""Extractive question answering (task-type = squad, squad_v2): the official scores, windows and
legal spans as pure functions, both layouts and their one-line errors, learning, exact resume, --test,
scripts/qa.py, and the export that transformers' question-answering pipeline reads."""
import json
import re
import shutil

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
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
from tasks.squad_data import Questions, answer_pieces, context_windows, encode_questions
from tasks.squad_metrics import normalize_answer, squad_scores
from tasks.squad_task import QuestionSplit, answer_questions, best_answers

SQUAD = {"seq_len": 128, "batch_size": 16, "learning_rate": 1e-3, "warmup_iters": 10, "dataset_pattern": "",
         "val_dataset_pattern": "", "test_dataset_pattern": ""}


def test_answers_are_normalised_and_scored_as_the_official_scripts_do():
    assert normalize_answer("The  Eiffel-Tower, in Paris!") == "eiffeltower in paris"
    assert normalize_answer("an apple a day") == "apple day"
    golds = {"q1": ["Denver Broncos", "The Denver Broncos"], "q2": ["Santa Clara, California"], "q3": ["1959"]}
    predictions = {"q1": "the Denver Broncos!", "q2": "Santa Clara", "q3": ""}
    scores = squad_scores(predictions, golds)
    # q1 exact; q2 F1 2 * (2/2 * 2/3) / (1 + 2/3) = 0.8; q3 empty against an answer: 0
    assert scores["exact"] == pytest.approx(100 / 3) and scores["f1"] == pytest.approx(100 * 1.8 / 3)


def test_unanswerable_questions_score_the_empty_answer_and_the_best_threshold():
    golds = {"has1": ["1959"], "has2": ["8 out of 10"], "no1": [], "no2": [""]}
    predictions = {"has1": "1959", "has2": "", "no1": "", "no2": "western"}
    margins = {"has1": -3.0, "has2": 1.0, "no1": 2.0, "no2": -1.0}  # no-answer score minus the best span's
    scores = squad_scores(predictions, golds, margins)
    assert scores["exact"] == 50.0 and scores["HasAns_exact"] == 50.0 and scores["NoAns_exact"] == 50.0
    # by rising margin: has1 (+1), no2 (answered: -1), has2 (abstained: +0), no1: the best is 3 of 4 at -3.0
    assert scores["best_exact"] == 75.0 and scores["best_exact_thresh"] == -3.0


def test_windows_overlap_by_the_stride_and_the_last_holds_what_remains():
    assert context_windows(50, 60, 16) == [(0, 50)]
    assert context_windows(100, 40, 16) == [(0, 40), (24, 64), (48, 88), (72, 100)]  # the last short
    assert context_windows(88, 40, 16) == [(0, 40), (24, 64), (48, 88)]
    assert context_windows(41, 40, 16) == [(0, 40), (24, 41)]
    offsets = np.array([[0, 3], [4, 9], [9, 12], [13, 15]])
    assert answer_pieces(offsets, 4, 12) == (1, 2) and answer_pieces(offsets, 5, 6) == (1, 1)
    assert answer_pieces(offsets, 12, 13) is None  # a space between pieces


QUESTIONS = ("What does the reviewer think of the film?", "Who plays the lead?", "When was it made?")


@pytest.fixture(scope="module")
def long_reviews(imdb_reviews, vocab) -> list[str]:
    """Reviews of 150 to 600 pieces: several windows each at seq-len 64."""
    return [review for review, ids in zip(imdb_reviews[:200], vocab.encode(imdb_reviews[:200]))
            if 150 <= len(ids) <= 600][:9]


def run_qa_features(vocab_dir, vocab, questions: list[str], contexts: list[str], seq_len: int, stride: int):
    """The windows transformers' run_qa.py makes: its tokenizer call on a BertTokenizerFast of the vocabulary."""
    transformers = pytest.importorskip("transformers")
    tokenizer = transformers.BertTokenizerFast.from_pretrained(vocab_dir, do_lower_case=vocab.lowercase)
    return tokenizer(questions, contexts, truncation="only_second", max_length=seq_len, stride=stride,
                     return_overflowing_tokens=True, return_offsets_mapping=True)


def unanswered(questions: list[str], contexts: list[str]) -> Questions:
    return Questions([f"q{number}" for number in range(len(questions))], questions, contexts,
                     [[] for _ in questions], ())


@pytest.mark.parametrize("seq_len, stride", [(64, 16), (48, 20), (128, 32)])
def test_the_windows_are_run_qa_s_piece_for_piece(vocab_dir, vocab, long_reviews, seq_len, stride):
    """Tokens, segments and the context pieces' character spans of every window, the short last ones too."""
    questions = [QUESTIONS[number % 3] for number in range(len(long_reviews))]
    theirs = run_qa_features(vocab_dir, vocab, questions, long_reviews, seq_len, stride)
    ours = encode_questions(vocab, unanswered(questions, long_reviews), seq_len, stride, 64)
    assert ours.questions.tolist() == theirs["overflow_to_sample_mapping"]
    assert (ours.lengths < seq_len).any()  # short last windows are among them
    for window, (tokens, segments) in enumerate(zip(theirs["input_ids"], theirs["token_type_ids"])):
        assert ours.tokens[ours.starts[window]:ours.starts[window + 1]].tolist() == tokens
        assert ours.segments[ours.starts[window]:ours.starts[window + 1]].tolist() == segments
        context = [tuple(span) for span, sequence in zip(theirs["offset_mapping"][window], theirs.sequence_ids(window))
                   if sequence == 1]
        first, question = int(ours.first_pieces[window]), int(ours.questions[window])
        assert [tuple(span) for span in ours.offsets[question][first:first + len(context)].tolist()] == context


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


def one_question(vocab, context: str, answer: str, seq_len: int, stride: int) -> tuple[Questions, QuestionSplit]:
    start = context.index(answer)
    data = Questions(["q"], ["where?"], [context], [[(answer, start)]], ())
    return data, QuestionSplit(data, encode_questions(vocab, data, seq_len, stride, 64))


def test_the_answer_is_labelled_in_each_window_that_holds_it_whole_else_cls(vocab):
    context = " ".join(f"w{number}" for number in range(60)) + " the answer here"
    data, split = one_question(vocab, context, "answer here", seq_len=32, stride=8)
    windows = split.encoded
    assert len(windows) > 2 and (windows.lengths <= 32).all()
    holding = [w for w in range(len(windows)) if windows.answer_start[w] > 0]
    assert holding == [len(windows) - 1]  # only the last window holds it (at its edge)
    w = holding[0]
    tokens = windows.tokens[windows.starts[w]:windows.starts[w + 1]]
    span = vocab.decode_tokens(tokens[windows.answer_start[w]:windows.answer_end[w] + 1])
    assert "".join(span).replace("##", "") == "answerhere"
    assert windows.answer_start[:-1].tolist() == [0] * (len(windows) - 1)  # the others: [CLS]


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


def write_squad_json(path, qas, context="A fine western from 1959."):
    path.write_text(json.dumps({"version": "v2.0", "data": [{"title": "t", "paragraphs": [
        {"context": context, "qas": qas}]}]}), encoding="utf-8")


def test_bad_files_are_one_line_naming_file_and_question(tmp_path):
    folder = tmp_path / "squad"
    folder.mkdir()
    path = folder / "train-v1.1.json"
    cases = {"question q1: answer_start 3 does not point at its text '1959'": [
                 {"id": "q1", "question": "When?", "answers": [{"text": "1959", "answer_start": 3}]}],
             "question q2 has no answer; squad (v1.1) answers every question": [
                 {"id": "q2", "question": "Who?", "answers": []}],
             "question q3: an empty question": [{"id": "q3", "question": " ", "answers": []}],
             # the official scripts assume answers inside the context and one question per id
             "question q6: answer_start -5 of '1959' is not inside the context (25 characters)": [
                 {"id": "q6", "question": "When?", "answers": [{"text": "1959", "answer_start": -5}]}],
             "question q7: an answer with empty text '' at answer_start 0": [
                 {"id": "q7", "question": "When?", "answers": [{"text": "", "answer_start": 0}]}],
             "question id q8 is used twice; SQuAD's ids name one question each": [
                 {"id": "q8", "question": "When?", "answers": [{"text": "1959", "answer_start": 20}]},
                 {"id": "q8", "question": "What?", "answers": [{"text": "western", "answer_start": 7}]}]}
    for message, qas in cases.items():
        write_squad_json(path, qas)
        with pytest.raises(squad_data.UserError, match=re.escape(f"{path}: {message}")):
            squad_data.read_split(tmp_path, "squad", "train")
    write_squad_json(path, [{"id": "q4", "question": "When?", "answers": []}], context="")
    with pytest.raises(squad_data.UserError, match="question q4: an empty context"):
        squad_data.read_split(tmp_path, "squad", "train")
    parquet = folder / "train-00000-of-00001.parquet"
    pq.write_table(pa.table({"id": ["q5"], "question": ["When?"], "context": ["In 1959."]}), parquet)
    with pytest.raises(squad_data.UserError, match=f"{parquet}: missing column answers"):
        squad_data.read_split(tmp_path, "squad", "train")


def test_an_id_in_two_shards_is_one_line_naming_it(tmp_path):
    folder = tmp_path / "squad_v2"
    folder.mkdir()
    for number, question in enumerate(("When?", "Where?")):
        pq.write_table(pa.table({"id": ["q1"], "question": [question], "context": ["In 1959."],
                                 "answers": [{"text": [], "answer_start": []}]}),
                       folder / f"validation-0000{number}-of-00002.parquet")
    with pytest.raises(squad_data.UserError, match="validation-00001-of-00002.parquet: question id q1 is used twice"):
        squad_data.read_split(tmp_path, "squad_v2", "validation")


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
