"""src/tasks/squad_data.py: the windows and the answer's pieces as pure functions, the windows
run_qa.py makes piece for piece, the answer labelled in the windows that hold it, and both layouts'
one-line errors."""
import json
import re

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tasks import squad_data
from tasks.squad_data import Questions, answer_pieces, context_windows, encode_questions
from tasks.squad_task import QuestionSplit


def test_windows_overlap_by_the_stride_and_the_last_holds_what_remains():
    assert context_windows(50, 60, 16) == [(0, 50)]
    assert context_windows(100, 40, 16) == [(0, 40), (24, 64), (48, 88), (72, 100)]  # the last short
    assert context_windows(88, 40, 16) == [(0, 40), (24, 64), (48, 88)]
    assert context_windows(41, 40, 16) == [(0, 40), (24, 41)]
    offsets = np.array([[0, 3], [4, 9], [9, 12], [13, 15]])
    assert answer_pieces(offsets, 4, 12) == (1, 2) and answer_pieces(offsets, 5, 6) == (1, 1)
    assert answer_pieces(offsets, 12, 13) is None  # a space between pieces


QUESTIONS = ("What does the reviewer think of the film?", "Who plays the lead?", "When was it made?")


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
