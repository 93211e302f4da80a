"""Inference speed of checkpoints side by side: sentences per second through our model (eager,
float32, every core), a file's sentences in batches as classify.py and embed.py make them, and each
model's weights (parameters, float32 megabytes). Classifiers (a GLUE task, classify) and embedding
models (embed) alike; the arms run one after another in this process, each timed `--repeats` times
after a warm-up (the median counts, min and max beside it).

Example (the teacher against its distilled student, on SST-2's test sentences):
    python scripts/bench_infer.py -i sentences.txt --cp demo/runs/teacher/checkpoints/best.pt \\
        demo/runs/student/checkpoints/best.pt
"""
import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))
from checkpoints import restore_model  # noqa: E402
from classify import classify, read_sentences, trained_seq_len  # noqa: E402
from config import CLASSIFICATION_TASKS  # noqa: E402
from embed_task import embed_texts  # noqa: E402
from errors import exit_on_user_error  # noqa: E402
from model import BertForEmbedding, BertForSequenceClassification, count_parameters  # noqa: E402

MODELS = {task: BertForSequenceClassification for task in CLASSIFICATION_TASKS} | {"embed": BertForEmbedding}


def run_once(model, vocab, task: str, texts: list[str], seq_len: int, batch_size: int) -> float:
    """Seconds to label or embed every text once."""
    start = time.perf_counter()
    if task == "embed":
        embed_texts(model, vocab, texts, seq_len, batch_size)
    else:
        classify(model, vocab, texts, None, seq_len, batch_size)
    return time.perf_counter() - start


def measure(path: Path, texts: list[str], batch_size: int, repeats: int) -> dict:
    model, vocab, checkpoint = restore_model(path, MODELS)
    seq_len = trained_seq_len(checkpoint, model)
    with torch.inference_mode():
        run_once(model, vocab, checkpoint["task"], texts[:batch_size * 2], seq_len, batch_size)  # warm-up
        seconds = [run_once(model, vocab, checkpoint["task"], texts, seq_len, batch_size) for _ in range(repeats)]
    rates = sorted(len(texts) / each for each in seconds)
    shape = model.config
    return {"checkpoint": str(path), "shape": f"{shape.n_layer} x {shape.d_model}", "task": checkpoint["task"],
            "parameters": count_parameters(model), "rate": statistics.median(rates), "low": rates[0],
            "high": rates[-1]}


def table(rows: list[dict]) -> str:
    first = rows[0]["rate"]
    lines = ["| checkpoint | shape | task | parameters | float32 MB | sentences/s (median) | min-max | "
             "against the first |", "|---|---|---|---:|---:|---:|---|---:|"]
    for row in rows:
        lines.append(f"| {row['checkpoint']} | {row['shape']} | {row['task']} | {row['parameters'] / 1e6:.2f}M | "
                     f"{row['parameters'] * 4 / 2 ** 20:.1f} | {row['rate']:,.0f} | {row['low']:,.0f}-"
                     f"{row['high']:,.0f} | {row['rate'] / first:.2f}x |")
    return "\n".join(lines)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cp", type=Path, nargs="+", required=True, help="checkpoints: classifiers or embed")
    parser.add_argument("-i", "--input", type=Path, required=True, help="a file with one sentence per line")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    return parser.parse_args(argv)


@exit_on_user_error
def main(argv=None):
    args = parse_args(argv)
    texts = read_sentences(args.input)
    rows = [measure(path, texts, args.batch_size, args.repeats) for path in args.cp]
    print(f"{len(texts):,} sentences of {args.input}, batch {args.batch_size}, {torch.get_num_threads()} threads, "
          f"float32 eager, median of {args.repeats}")
    print(table(rows))


if __name__ == "__main__":
    main()
