"""The classification data path at MNLI's size: 392,702 sentence pairs (and MNLI's four dev and test
sets of about 9,800) made from the demo corpus's sentences, then a fine-tuning run of one step on them
in a child process: the seconds spent reading and encoding each split (a run reads no test split),
the seconds until the first step ends, and peak memory; the same at an eighth of the size, to show how each grows.

Example (minutes on 2 cores):
    python scripts/make_demo.py -o demo && python scripts/bench_glue_data.py -i demo/input/imdb.txt -v demo/vocab

The model is small (2 x 128, batch 32, float32) so that what is measured is the data
path, not the model. Prints a markdown table.
"""
import argparse
import os
import random
import re
import sys
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from errors import UserError, exit_on_user_error  # noqa: E402
from bench_data import MIB, check_inputs, measure, run_step  # noqa: E402

MNLI_TRAIN = 392_702
MNLI_OTHERS = {"validation_matched": 9_815, "validation_mismatched": 9_832, "test_matched": 9_796,
               "test_mismatched": 9_847}
RUN_SETTINGS = {"task-type": "mnli", "glue-dir": "datasets", "d-model": 128, "heads": 2, "n-layer": 2,
                "d-ff": 512, "seq-len": 128, "batch-size": 32, "epochs": 0, "max-iters": 1, "lr-decay-iters": 1,
                "warmup-iters": 0, "warmup-ratio": 0, "device": "cpu", "dtype": "float32", "peak-tflops": 1}


def sentences_of(corpus: Path, limit: int = 200_000) -> list[str]:
    """Sentences of 4 to 60 words from the corpus's lines, up to `limit`."""
    found = []
    with corpus.open(encoding="utf-8") as lines:
        for line in lines:
            found += [part for part in re.split(r"(?<=[.!?])\s+", line.strip()) if 4 <= len(part.split()) <= 60]
            if len(found) >= limit:
                break
    if len(found) < 100:
        raise UserError(f"{corpus}: {len(found)} sentences of 4 to 60 words; expected at least 100")
    return found[:limit]


def write_mnli(directory: Path, sentences: list[str], train_pairs: int, seed: int = 0):
    """MNLI's parquet layout (premise, hypothesis, label, idx), pairs of random sentences, random
    labels; the dev and test sets in MNLI's proportion to the training pairs (at least a batch)."""
    chooser = random.Random(seed)
    directory.mkdir(parents=True, exist_ok=True)
    others = {split: max(round(count * train_pairs / MNLI_TRAIN), 32) for split, count in MNLI_OTHERS.items()}
    for split, count in {"train": train_pairs, **others}.items():
        labels = [-1] * count if split.startswith("test") else [chooser.randrange(3) for _ in range(count)]
        table = pa.table({"premise": chooser.choices(sentences, k=count),
                          "hypothesis": chooser.choices(sentences, k=count),
                          "label": pa.array(labels, pa.int64()), "idx": pa.array(range(count), pa.int32())})
        pq.write_table(table, directory / f"{split}-00000-of-00001.parquet")


def step_run(workdir: str) -> dict:
    """main.py for one step in `workdir`: the seconds reading and encoding each split part, and
    until the first training step ends, counted from here (torch imported)."""
    os.chdir(workdir)
    from tasks import classification_task
    import main
    import trainer
    started = time.perf_counter()
    reads, first_step = {}, []
    read_part, train_step = classification_task.ClassificationTask.read_part, trainer.Trainer.train_step

    def timed_read(self, split, name):
        begun = time.perf_counter()
        part = read_part(self, split, name)
        reads[name] = time.perf_counter() - begun
        return part

    def noted_step(self, run, batches, meter):
        train_step(self, run, batches, meter)
        first_step.append(first_step[0] if first_step else time.perf_counter() - started)

    classification_task.ClassificationTask.read_part, trainer.Trainer.train_step = timed_read, noted_step
    main.main([])
    return {"reads": reads, "first_step": first_step[0], "total": time.perf_counter() - started}


def workdir_for(work: Path, vocab: Path, sentences: list[str], pairs: int) -> Path:
    directory = work / f"mnli-{pairs}"
    write_mnli(directory / "datasets" / "mnli", sentences, pairs)
    if not (directory / "vocab").exists():
        (directory / "vocab").symlink_to(vocab.resolve())
    (directory / "config.ini").write_text("".join(f"{key} = {value}\n" for key, value in RUN_SETTINGS.items()))
    return directory


def report(rows: list[tuple[int, dict]]) -> str:
    lines = ["| train pairs | read + encode train s | validation (both) s | first step ends at s | whole run s "
             "| peak RSS MiB |", "|---:|---:|---:|---:|---:|---:|"]
    for pairs, result in rows:
        reads = result["reads"]
        validation = sum(seconds for name, seconds in reads.items() if name.startswith("validation"))
        lines.append(f"| {pairs:,} | {reads['train']:.2f} | {validation:.2f} | {result['first_step']:.2f} "
                     f"| {result['total']:.2f} | {result['process_peak'] / MIB:,.0f} |")
    return "\n".join(lines)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-i", "--input", type=Path, default=Path("demo/input/imdb.txt"), help="text corpus")
    parser.add_argument("-v", "--vocab", type=Path, default=Path("demo/vocab"), help="vocabulary directory")
    parser.add_argument("--pairs", type=int, nargs="+", default=[MNLI_TRAIN // 8, MNLI_TRAIN],
                        help="training pairs of each run (default: an eighth of MNLI's, and MNLI's)")
    parser.add_argument("--workdir", type=Path, help="where to keep the files made (default: a temporary directory)")
    parser.add_argument("--run-step", nargs=2, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


@exit_on_user_error
def main(argv=None):
    args = parse_args(argv)
    if args.run_step:
        return run_step(*args.run_step, {"run": step_run})
    check_inputs(args.input, args.vocab)
    if min(args.pairs) < RUN_SETTINGS["batch-size"]:
        raise UserError(f"--pairs {min(args.pairs)}: expected at least a batch ({RUN_SETTINGS['batch-size']})")
    sentences = sentences_of(args.input)
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-glue-") as scratch:
        work = args.workdir or Path(scratch)
        work.mkdir(parents=True, exist_ok=True)
        for pairs in args.pairs:
            workdir = workdir_for(work, args.vocab, sentences, pairs)
            rows.append((pairs, measure("run", script=__file__, workdir=str(workdir))))
    print(f"{os.cpu_count()} CPU cores; {len(sentences):,} sentences of {args.input}")
    print(report(rows))


if __name__ == "__main__":
    main()
