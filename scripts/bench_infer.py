"""Inference speed side by side: sentences per second for the same models through our PyTorch model
(eager, or with --compile), our ONNX export in onnxruntime (float32, int8), transformers' pipeline and
sentence-transformers' encode, at each batch size and thread count asked for, with each model's size.
Classifiers (a GLUE task, classify) and embedding models (embed) alike.

--cp takes what the inference scripts take: a checkpoint (PyTorch), an exported directory with
onnx/model.onnx or a .onnx file in its onnx/ folder (onnxruntime). --hf takes an exported (or any
transformers) directory: a classifier through `pipeline("text-classification")`, a sentence-transformers
folder through `SentenceTransformer.encode`; --hf-onnx the same with the directory's onnx/model.onnx
(optimum's ORTModel in the pipeline, sentence-transformers' ONNX backend). Every arm labels or embeds
the whole file; each is timed `--repeats` times after a warm-up (the median counts, min and max beside
it), one after another in this process; the last column divides by the first arm's speed at the same
batch size and threads.

Example (a classifier, its export and int8 graph, and transformers on the export):
    python scripts/export_hf.py --cp demo/runs/run1/checkpoints/best.pt -o demo/hf-sst2 --quantize int8
    python scripts/bench_infer.py -i sentences.txt --cp demo/runs/run1/checkpoints/best.pt demo/hf-sst2 \\
        demo/hf-sst2/onnx/model_qint8.onnx --hf demo/hf-sst2 --batch-size 1 32 --threads 1 2
"""
import argparse
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))
from config import CLASSIFICATION_TASKS  # noqa: E402
from errors import UserError, exit_on_user_error  # noqa: E402
from model import BertForEmbedding, BertForSequenceClassification, count_parameters  # noqa: E402
from interop.onnx_model import OnnxModel, is_onnx, restore_model  # noqa: E402
from tasks.embed_task import embed_texts  # noqa: E402
from classify import classify, read_sentences, trained_seq_len  # noqa: E402

MODELS = {task: BertForSequenceClassification for task in CLASSIFICATION_TASKS} | {"embed": BertForEmbedding}


@dataclass
class Arm:
    source: str
    runtime: str
    task: str
    megabytes: float
    run: Callable[[list[str], int], object]  # (texts, batch size): labels or embeds them all


def our_arm(path: Path, compiled: bool) -> Arm:
    """A checkpoint through our model (compiled where asked), or an export's graph in onnxruntime."""
    model, vocab, checkpoint = restore_model(path, MODELS)
    seq_len, task = trained_seq_len(checkpoint, model), checkpoint["task"]
    if isinstance(model, OnnxModel):
        runtime, megabytes = f"onnxruntime ({model.path.name})", model.path.stat().st_size / 2 ** 20
    else:
        runtime, megabytes = "PyTorch eager", count_parameters(model) * 4 / 2 ** 20
        if compiled:
            model, runtime = torch.compile(model, dynamic=True), "torch.compile"

    def run(texts: list[str], batch_size: int):
        if task == "embed":
            return embed_texts(model, vocab, texts, seq_len, batch_size)
        return classify(model, vocab, texts, None, seq_len, batch_size)
    return Arm(str(path), runtime, task, megabytes, run)


def transformers_arm(directory: Path, onnx: bool = False) -> Arm:
    """A transformers directory as its users run it: a sentence-transformers folder's encode, or a
    classifier's text-classification pipeline (texts cut to the tokenizer's length); with `onnx`, its
    onnx/model.onnx through sentence-transformers' ONNX backend or optimum's ORTModel in the pipeline
    (both need transformers 4: optimum-onnx 0.1 pins it)."""
    if not (directory / "config.json").is_file():
        raise UserError(f"--hf {directory}: not a transformers directory (no config.json)")
    weights = directory / ("onnx/model.onnx" if onnx else "model.safetensors")
    megabytes = weights.stat().st_size / 2 ** 20 if weights.is_file() else float("nan")
    if (directory / "modules.json").is_file():
        from sentence_transformers import SentenceTransformer
        encoder = SentenceTransformer(str(directory), device="cpu", trust_remote_code=True,
                                      backend="onnx" if onnx else "torch")
        return Arm(str(directory), "sentence-transformers" + (" onnx" if onnx else ""), "embed", megabytes,
                   lambda texts, batch_size: encoder.encode(texts, batch_size=batch_size))
    from transformers import pipeline
    model = str(directory)
    if onnx:
        from optimum.onnxruntime import ORTModelForSequenceClassification
        model = ORTModelForSequenceClassification.from_pretrained(directory, trust_remote_code=True)
    classifier = pipeline("text-classification", model=model, tokenizer=str(directory), device="cpu",
                          trust_remote_code=True)
    return Arm(str(directory), "optimum pipeline" if onnx else "transformers pipeline",
               classifier.model.config.finetuning_task or "classify", megabytes,
               lambda texts, batch_size: classifier(texts, batch_size=batch_size, truncation=True))


def measure(arm: Arm, texts: list[str], batch_size: int, repeats: int) -> dict:
    with torch.inference_mode():
        arm.run(texts[:batch_size * 2], batch_size)  # warm-up (and compilation)
        seconds = []
        for _ in range(repeats):
            start = time.perf_counter()
            arm.run(texts, batch_size)
            seconds.append(time.perf_counter() - start)
    rates = sorted(len(texts) / each for each in seconds)
    return {"rate": statistics.median(rates), "low": rates[0], "high": rates[-1]}


def table(rows: list[dict]) -> str:
    lines = ["| model | runtime | task | batch | threads | MB | sentences/s (median) | min-max | against the first |",
             "|---|---|---|---:|---:|---:|---:|---|---:|"]
    first = {}
    for row in rows:
        unit = first.setdefault((row["batch"], row["threads"]), row["rate"])
        lines.append(f"| {row['source']} | {row['runtime']} | {row['task']} | {row['batch']} | {row['threads']} | "
                     f"{row['megabytes']:.1f} | {row['rate']:,.0f} | {row['low']:,.0f}-{row['high']:,.0f} | "
                     f"{row['rate'] / unit:.2f}x |")
    return "\n".join(lines)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cp", type=Path, nargs="+", default=[],
                        help="checkpoints (classifiers or embed), exported directories or .onnx files in their onnx/")
    parser.add_argument("--hf", type=Path, nargs="+", default=[],
                        help="transformers directories: a pipeline, or sentence-transformers' encode")
    parser.add_argument("--hf-onnx", type=Path, nargs="+", default=[],
                        help="exported directories' onnx/model.onnx through optimum's pipeline or "
                             "sentence-transformers' ONNX backend (these need transformers 4)")
    parser.add_argument("-i", "--input", type=Path, required=True, help="a file with one sentence per line")
    parser.add_argument("--batch-size", type=int, nargs="+", default=[32])
    parser.add_argument("--threads", type=int, nargs="+", default=[torch.get_num_threads()])
    parser.add_argument("--compile", action="store_true", help="also each checkpoint under torch.compile")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    if not args.cp and not args.hf and not args.hf_onnx:
        parser.error("nothing to measure: give --cp, --hf or --hf-onnx")
    if min(args.batch_size + args.threads) < 1 or args.repeats < 1:
        parser.error("--batch-size, --threads and --repeats take whole numbers above 0")
    return args


def arms(args) -> list[Arm]:
    """Every arm, built after the thread count is set (onnxruntime takes it when a session starts)."""
    built = []
    for path in args.cp:
        built.append(our_arm(path, compiled=False))
        if args.compile and not is_onnx(path):
            built.append(our_arm(path, compiled=True))
    return built + [transformers_arm(directory) for directory in args.hf] + [
        transformers_arm(directory, onnx=True) for directory in args.hf_onnx]


@exit_on_user_error
def main(argv=None):
    args = parse_args(argv)
    texts = read_sentences(args.input)
    rows = []
    for threads in args.threads:
        torch.set_num_threads(threads)
        for arm in arms(args):
            for batch_size in args.batch_size:
                rows.append({"source": arm.source, "runtime": arm.runtime, "task": arm.task, "batch": batch_size,
                             "threads": threads, "megabytes": arm.megabytes,
                             **measure(arm, texts, batch_size, args.repeats)})
    print(f"{len(texts):,} sentences of {args.input}, float32 but where the runtime says int8, median of "
          f"{args.repeats}")
    print(table(rows))


if __name__ == "__main__":
    main()
