"""Answer questions from a context with a fine-tuned question answering checkpoint (task-type =
squad or squad_v2): the answer span of the context and its score (start and end logits summed),
tab-separated; a squad_v2 model answers nothing (an empty first field) where it judges the context
holds no answer. Windows, the span rules and the thresholds are those the run was fine-tuned with.

Examples:
    python scripts/qa.py --cp demo/runs/run3/checkpoints/best.pt -q "What score does the reviewer give?" \
        -c "A fine western from 1959. I give it 8 out of 10."
    python scripts/qa.py --cp demo/runs/run3/checkpoints/best.pt -i questions.jsonl   # {"question", "context"} a line
"""
import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from architecture import ANSWERS, tasks_of  # noqa: E402
from config import Config  # noqa: E402
from errors import UserError, exit_on_user_error  # noqa: E402
from model import BertForQuestionAnswering  # noqa: E402
from interop.onnx_model import OR_EXPORTED, restore_model  # noqa: E402
from tasks.squad_task import answer_questions  # noqa: E402
from classify import print_lines  # noqa: E402

SETTINGS = ("seq-len", "doc-stride", "max-query-length", "max-answer-length")


def read_questions(path: Path) -> list[tuple[str, str]]:
    """(question, context) of each line of a JSON-lines file."""
    try:
        lines = path.read_text(encoding="utf-8-sig").splitlines()
    except (OSError, UnicodeDecodeError) as error:
        raise UserError(f"{path}: cannot read ({error.__class__.__name__})") from None
    pairs = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            pairs.append((row["question"], row["context"]))
        except (ValueError, KeyError, TypeError, RecursionError):
            raise UserError(f"{path}: line {number}: expected a JSON object with question and context") from None
        if not all(isinstance(text, str) for text in pairs[-1]):
            raise UserError(f"{path}: line {number}: expected a question and a context of text")
        check_pair(*pairs[-1], f"{path}: line {number}")
    if not pairs:
        raise UserError(f"{path}: no question")
    return pairs


def check_pair(question: str, context: str, where: str):
    """The one rule for -q/-c and -i alike: an empty question asks nothing and an empty context holds
    no answer, so either is refused rather than answered with a span of nothing (or -inf)."""
    for name, text in (("question", question), ("context", context)):
        if not text.strip():
            raise UserError(f"{where}: an empty {name}")


def run_settings(checkpoint: dict, max_len: int) -> dict:
    """The windows and span rules of the checkpoint's run (the defaults where it predates a key)."""
    defaults = Config().to_dict()
    settings = {key: checkpoint["config"].get(key, defaults[key]) for key in SETTINGS}
    settings["seq-len"] = min(int(settings["seq-len"]), max_len)
    if checkpoint["task"] == "squad_v2":
        settings["null-score-threshold"] = float(checkpoint["config"].get("null-score-threshold", 0.0))
    return settings


@exit_on_user_error
def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cp", type=Path, required=True,
                        help="a fine-tuned squad or squad_v2 checkpoint" + OR_EXPORTED)
    parser.add_argument("-q", "--question", help="the question")
    parser.add_argument("-c", "--context", help="the text that holds the answer")
    parser.add_argument("-i", "--input", type=Path, help="JSON lines, each with question and context")
    args = parser.parse_args(argv)
    if (args.question is None) != (args.context is None):
        raise UserError("-q and -c go together: a question and the context that answers it")
    if args.question is not None:
        check_pair(args.question, args.context, "-q QUESTION -c CONTEXT")
    pairs = ([(args.question, args.context)] if args.question is not None else []) + (
        read_questions(args.input) if args.input else [])
    if not pairs:
        raise UserError("nothing to answer: give -q QUESTION -c CONTEXT or -i FILE")
    kinds = dict.fromkeys(tasks_of(ANSWERS), BertForQuestionAnswering)
    model, vocab, checkpoint = restore_model(args.cp, kinds)
    answers = answer_questions(model, vocab, [question for question, _ in pairs], [context for _, context in pairs],
                               run_settings(checkpoint, model.config.max_len), progress=True)
    print_lines(f"{text}\t{score:.3f}" for text, score in answers)


if __name__ == "__main__":
    main()
