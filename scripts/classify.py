"""Label sentences, or sentence pairs, with a fine-tuned checkpoint of a GLUE task or of `classify`.

Each output line is the predicted label's name (SST-2: negative or positive; `classify`: the class's
name, or its number), its probability and the text; an STS-B checkpoint (or `num-labels = 1`) prints
the predicted score and the text; a multi-label one the classes above 0.5 and their probabilities,
between commas (none: `-`). A pair task (MRPC, QQP, STS-B, MNLI, QNLI, RTE, WNLI) takes each pair as one text,
`first ||| second`, encoded as fine-tuning encodes it: [CLS] first [SEP] second [SEP].

Examples:
    python scripts/classify.py --cp demo/runs/run1/checkpoints/best.pt "a gorgeous, witty film"
    python scripts/classify.py --cp runs/run4/checkpoints/best.pt "A man plays a flute. ||| A man plays music."
    python scripts/classify.py --cp demo/runs/run1/checkpoints/best.pt -i sentences.txt
"""
import argparse
import os
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))
from architecture import TASK_KINDS, label_names  # noqa: E402
from batching import pad_multiple  # noqa: E402
from config import CLASSIFICATION_TASKS  # noqa: E402
from errors import UserError, exit_on_user_error  # noqa: E402
from model import BertForSequenceClassification  # noqa: E402
from interop.onnx_model import OR_EXPORTED, restore_model  # noqa: E402
from tasks import glue_data  # noqa: E402
from tasks import pair_encoding  # noqa: E402
from tasks.classification_task import Part  # noqa: E402
from tasks.fine_tuning import inference_rows  # noqa: E402

CLASSIFIERS = {task: BertForSequenceClassification for task in CLASSIFICATION_TASKS}
PAIR_SEPARATOR = "|||"
BROKEN_PIPE_STATUS = 141  # 128 + SIGPIPE: what a shell reports for a Unix tool its closed pipe ended


def split_pairs(texts: list[str], task: str) -> tuple[list[str], list[str] | None]:
    """The first and second sentences of `first ||| second` texts for a pair task; the texts
    themselves (and None) for a single-sentence one."""
    is_pair = not TASK_KINDS[task].single_text
    if not is_pair:
        paired = next((text for text in texts if PAIR_SEPARATOR in text), None)
        if paired is not None:
            raise UserError(f"{paired!r}: a {task} checkpoint labels single sentences, not "
                            f"`first {PAIR_SEPARATOR} second` pairs")
        return texts, None
    halves = [text.split(PAIR_SEPARATOR) for text in texts]
    for text, parts in zip(texts, halves):
        if len(parts) != 2 or not all(part.strip() for part in parts):
            raise UserError(f"{text!r}: a {task} checkpoint labels sentence pairs: write `first {PAIR_SEPARATOR} "
                            f"second`, both sentences non-empty")
    return [first.strip() for first, _ in halves], [second.strip() for _, second in halves]


@torch.no_grad()
def classify(model, vocab, first: list[str], second: list[str] | None, seq_len: int, batch_size: int = 64,
             progress: bool = False) -> list[tuple[int, float]]:
    """(label, probability) for each sentence or pair, in order; for a regressor (STS-B) (-1, score),
    for a multi-label model (-1, each class's probability); encoded as fine-tuning encodes them,
    batched by length."""
    count = len(first)
    examples = glue_data.Examples(first, second, np.full(count, glue_data.HIDDEN_LABEL), np.arange(count))
    part = Part("test", examples, pair_encoding.encode_examples(vocab, first, second, seq_len))
    results = [(-1, 0.0)] * count
    for rows in inference_rows(part.lengths, batch_size, progress):
        batch = part.batch(rows, vocab.pad_id, seq_len, pad_multiple("cpu"))  # numpy in: the CPU
        segment_ids = None if batch["segment_ids"] is None else torch.from_numpy(batch["segment_ids"])
        logits, _ = model(torch.from_numpy(batch["input_ids"]),
                          attention_mask=torch.from_numpy(batch["attention_mask"]), segment_ids=segment_ids)
        if model.config.num_labels == 1:
            found = [(-1, score) for score in logits[:, 0].float().tolist()]
        elif model.config.multi_label:
            found = [(-1, chances) for chances in logits.float().sigmoid().tolist()]
        else:
            probabilities, labels = logits.float().softmax(-1).max(-1)
            found = list(zip(labels.tolist(), probabilities.tolist()))
        for row, result in zip(rows.tolist(), found):
            results[row] = result
    return results


def read_sentences(path: Path) -> list[str]:
    try:
        lines = [line.strip() for line in path.read_text(encoding="utf-8-sig").splitlines()]
    except (OSError, UnicodeDecodeError) as error:
        raise UserError(f"{path}: cannot read ({error.__class__.__name__})") from None
    sentences = [line for line in lines if line]
    if not sentences:
        raise UserError(f"{path}: no sentences")
    return sentences


def input_texts(args, verb: str) -> list[str]:
    """The texts of the command line, then those of -i FILE; none is one line."""
    texts = list(args.text) + (read_sentences(args.input) if args.input else [])
    if not texts:
        raise UserError(f"nothing to {verb}: give sentences or -i FILE")
    return texts


def trained_seq_len(checkpoint: dict, model) -> int:
    """The length fine-tuning cut its inputs to: the run's seq-len, within the position table."""
    return min(int(checkpoint["config"].get("seq-len", model.config.max_len)), model.config.max_len)


def print_lines(lines):
    """Print the lines; a reader that stops reading (`| head -n1`) ends the script quietly, as it
    ends a Unix tool."""
    try:
        for line in lines:
            print(line)
        sys.stdout.flush()
    except BrokenPipeError:
        # Python flushes stdout again at exit: into the closed pipe, it would print a second error.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(BROKEN_PIPE_STATUS)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cp", type=Path, required=True,
                        help="a fine-tuned checkpoint of a GLUE task, classify or classify_pair" + OR_EXPORTED)
    parser.add_argument("text", nargs="*",
                        help=f"sentences to label; for a pair task, pairs written `first {PAIR_SEPARATOR} second`")
    parser.add_argument("-i", "--input", type=Path,
                        help=f"a file with one sentence (or `first {PAIR_SEPARATOR} second` pair) per line")
    return parser.parse_args(argv)


@exit_on_user_error
def main(argv=None):
    args = parse_args(argv)
    texts = input_texts(args, "classify")
    model, vocab, checkpoint = restore_model(args.cp, CLASSIFIERS)
    task = checkpoint["task"]
    first, second = split_pairs(texts, task)
    seq_len = trained_seq_len(checkpoint, model)
    names = label_names(task, model.config.num_labels, model.config.label_names)
    results = classify(model, vocab, first, second, seq_len, progress=True)
    print_lines(f"{result_text(label, value, names, model.config)}\t{text}"
                for text, (label, value) in zip(texts, results))


def result_text(label: int, value, names: tuple[str, ...], config) -> str:
    """A score; a class and its probability; or a multi-label model's classes above 0.5 and theirs
    (`insult,toxic<TAB>0.912,0.733`; none: `-<TAB>-`)."""
    if config.num_labels == 1:
        return f"{value:.3f}"
    if config.multi_label:
        chosen = [(name, chance) for name, chance in zip(names, value) if chance > 0.5]
        if not chosen:
            return "-\t-"
        return ",".join(name for name, _ in chosen) + "\t" + ",".join(f"{chance:.3f}" for _, chance in chosen)
    return f"{names[label]}\t{value:.3f}"


if __name__ == "__main__":
    main()
