"""Benchmark the data path at growing corpus sizes: preparation (ours with -n 1 and -n 2, and the
`datasets` map + group_texts preparation of transformers' run_mlm.py), training memory per process
(1 and 2 processes), the slowest step at a shard switch against the median step, and the loader
alone (shards to masked batches on the device, no model) against what BERT-base consumes on an H100.

Example (the demo corpus at 1x, 4x and 16x, ~500 MB at 16x; minutes on quiet cores):
    python scripts/make_demo.py -o demo && python scripts/bench_data.py -i demo/input/imdb.txt -v demo/vocab

Every measurement runs in its own child process (peak RSS sampled every 20 ms: the largest of its
processes, and all of them together). The corpus at size K is the demo corpus written K times; the
shards are cut so that the 1x corpus makes --shards-per-1x of them (--shard-tokens), so that
preparation works in units of one size at every K and training crosses shard switches in the steps
it measures. The training loop's median step is set against the same step timed alone
(built and warmed as scripts/profile_step.py does, on the same shards, just before and just after
the loop: the mean of the two medians). Prints markdown tables.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from errors import UserError, exit_on_user_error  # noqa: E402
from bench_prepare import descendants, rss_bytes  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
MIB = 2 ** 20
H100_MFU = 0.4  # assumed for a well-tuned BERT-base MLM step on one H100: the pace the loaders must keep
# No MFU in the tables: a set peak spares each training child the seconds of matmuls that measure one.
TRAIN_SETTINGS = {"d-model": 64, "heads": 2, "n-layer": 2, "d-ff": 128, "batch-size": 32, "val-interval": 10 ** 6,
                  "log-interval": 10 ** 6, "val-iters": 2, "device": "cpu", "dtype": "float32", "warmup-iters": 0,
                  "peak-tflops": 1}


# ---------------------------------------------------------------------------------------------
# Steps, each run in a child (`--run-step NAME JSON`); they print one JSON line


def step_prepare(corpus: str, vocab: str, out: str, nproc: int, seq_len: int, shard_tokens: int) -> dict:
    import prepare_mlm_dataset
    started = time.perf_counter()
    prepare_mlm_dataset.main(["-i", corpus, "-l", "bench", "-o", out, "-m", str(seq_len), "-v", vocab,
                              "-n", str(nproc), "--shard-tokens", str(shard_tokens)])
    return {"seconds": time.perf_counter() - started, "tokens": shard_tokens_in(Path(out))}


def shard_tokens_in(directory: Path) -> int:
    from packed_files import read_header
    return sum(read_header(path)["tokens"] for path in directory.glob("*.msgpack.gz"))


def step_datasets(corpus: str, vocab: str, out: str, nproc: int, seq_len: int, shard_tokens: int) -> dict:
    """transformers' run_mlm.py without --line_by_line: map(tokenize), then map(group_texts)."""
    import datasets
    from transformers import BertTokenizerFast
    tokenizer = BertTokenizerFast(str(Path(vocab) / "vocab.txt"))
    started = time.perf_counter()
    raw = datasets.load_dataset("text", data_files=corpus, split="train", cache_dir=out)
    tokenized = raw.map(lambda batch: tokenizer(batch["text"], return_special_tokens_mask=True), batched=True,
                        num_proc=nproc, remove_columns=["text"])

    def group_texts(examples):
        joined = {key: sum(examples[key], []) for key in examples}
        total = len(joined["input_ids"]) // seq_len * seq_len
        return {key: [value[i:i + seq_len] for i in range(0, total, seq_len)] for key, value in joined.items()}

    grouped = tokenized.map(group_texts, batched=True, num_proc=nproc)
    return {"seconds": time.perf_counter() - started, "tokens": len(grouped) * seq_len}


def step_train(workdir: str, steps: int, nproc: int) -> dict:
    """main.py for `steps` steps; with one process, each step's time and the steps that switched shards."""
    os.chdir(workdir)
    if nproc > 1:
        started = time.perf_counter()
        command = [sys.executable, str(ROOT / "src" / "main.py"), "--ddp", "--nproc", str(nproc), "--max-iters",
                   str(steps)]
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
        return {"seconds": time.perf_counter() - started}
    import main
    import shard_stream
    import trainer
    times, switches, loads = [], [], []
    original_step, original_get = trainer.Trainer.train_step, shard_stream.ShardLoader.get

    def timed_step(self, run, batches, meter):
        started = time.perf_counter()
        original_step(self, run, batches, meter)
        times.append(time.perf_counter() - started)

    def noting_get(self, keys, following=None):
        if any(key not in self.held for key in keys) or (loads and loads[-1] != keys):
            switches.append(len(times))
        loads.append(keys)
        return original_get(self, keys, following)

    trainer.Trainer.train_step, shard_stream.ShardLoader.get = timed_step, noting_get
    main.main(["--max-iters", str(steps)])
    return {"step_seconds": times, "switch_steps": sorted(set(switches) - {0})}


def step_alone(workdir: str, steps: int) -> dict:
    """The training step timed alone, as scripts/profile_step.py builds and warms it: each step's seconds."""
    os.chdir(workdir)
    import profile_step
    from ini import load_config
    trainer, run, batches = profile_step.prepared_run(load_config(None, []))
    meter = trainer.throughput_meter(run)
    for _ in range(5):  # warm-up, as profile_step's default
        trainer.train_step(run, batches, meter)
    times = []
    for _ in range(steps):
        started = time.perf_counter()
        trainer.train_step(run, batches, meter)
        times.append(time.perf_counter() - started)
    return {"step_seconds": times}


def step_loader(workdir: str, batches: int) -> dict:
    os.chdir(workdir)
    from ini import load_config
    return loader_speed(load_config(None, []), batches)


def loader_speed(config, batches: int) -> dict:
    """The data path alone, no model: shards read and batched, moved to the device and masked there,
    as the trainer gets them: tokens/s of one process."""
    import hardware
    import main
    import torch
    task = main.make_task(config)
    stream = hardware.prefetch(task.train_batches(None), task.device, config.async_to_device)
    generator = torch.Generator(device=task.device).manual_seed(0)
    next(stream)  # the first shard's load: a run's start, not its pace
    tokens, started = 0, time.perf_counter()
    for _, (_, batch) in zip(range(batches), stream):
        masked = task.masker.with_masks(batch, generator, task.masker.rule.mask_rate)
        tokens += masked["input_ids"].numel()
    hardware.synchronize(task.device)
    return {"tokens_per_sec": tokens / (time.perf_counter() - started), "tokens": tokens}


STEPS = {"prepare": step_prepare, "datasets": step_datasets, "train": step_train, "alone": step_alone,
         "loader": step_loader}


def run_step(name: str, arguments: str, steps: dict | None = None) -> None:
    """A child's step (of `steps`, default this script's): its result and peak RSS as one JSON line."""
    result = (steps or STEPS)[name](**json.loads(arguments))
    result["peak_rss"] = rss_bytes("VmHWM")
    print(json.dumps(result))


# ---------------------------------------------------------------------------------------------
# Measuring a child: its result, and the largest RSS of any one of its processes


def measure(name: str, script: str = __file__, **arguments) -> dict:
    """The step `name` of `script` (its --run-step, printing a JSON line) in a child, with peak RSS added."""
    print(f"running {name} {arguments} ...", file=sys.stderr)
    command = [sys.executable, script, "--run-step", name, json.dumps(arguments)]
    peak, done = [0, 0], threading.Event()
    with tempfile.TemporaryFile() as output:
        child = subprocess.Popen(command, stdout=output, stderr=subprocess.PIPE, text=False)
        sampler = threading.Thread(target=sample_largest_process, args=(child.pid, done, peak))
        sampler.start()
        errors = child.stderr.read()
        child.wait()
        done.set()
        sampler.join()
        output.seek(0)
        text = output.read().decode()
    if child.returncode != 0:
        raise RuntimeError(f"{name} failed (exit {child.returncode}):\n{errors.decode(errors='replace')[-3000:]}")
    result = json.loads(text.strip().splitlines()[-1])
    result["process_peak"] = max(peak[0], result["peak_rss"])
    result["tree_peak"] = max(peak[1], result["process_peak"])
    return result


def sample_largest_process(pid: int, done: threading.Event, peak: list[int]) -> None:
    """peak := [the largest RSS of one process, the largest RSS of all of them together]."""
    while not done.wait(0.02):
        sizes = [rss_bytes("VmRSS", each) for each in descendants(pid)]
        peak[0], peak[1] = max([peak[0]] + sizes), max(peak[1], sum(sizes))


# ---------------------------------------------------------------------------------------------
# The benchmark


def write_corpus(source: Path, times: int, lines: int | None, target: Path) -> Path:
    text = source.read_bytes()
    if lines:
        text = b"".join(text.splitlines(keepends=True)[:lines])
    with target.open("wb") as out:
        for _ in range(times):
            out.write(text)
    return target


def train_workdir(work: Path, shards: Path, vocab: Path, steps: int, seq_len: int) -> Path:
    directory = work / f"train-{shards.name}"
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir()
    (directory / "datasets").symlink_to(shards.resolve())
    (directory / "vocab").symlink_to(vocab.resolve())
    settings = TRAIN_SETTINGS | {"seq-len": seq_len, "max-iters": steps, "lr-decay-iters": steps,
                                 "dataset-pattern": "train_bench_*", "val-dataset-pattern": "val_bench_*",
                                 "test-dataset-pattern": "test_bench_*"}
    (directory / "config.ini").write_text("".join(f"{key} = {value}\n" for key, value in settings.items()))
    return directory


def run_benchmark(args, work: Path) -> dict:
    results = {"prepare": {}, "datasets": {}, "train": {}, "alone": {}, "loader": {}, "shards": {}}
    shard_tokens = None
    for scale in args.scales:
        corpus = write_corpus(args.input, scale, args.lines, work / f"corpus-{scale}x.txt")
        common = {"corpus": str(corpus), "vocab": str(args.vocab), "seq_len": args.seq_len}
        for nproc in (1, 2):
            out = work / f"shards-{scale}x-n{nproc}"
            shutil.rmtree(out, ignore_errors=True)
            result = measure("prepare", out=str(out), nproc=nproc, shard_tokens=shard_tokens or 10 ** 12, **common)
            if shard_tokens is None:  # the 1x corpus makes --shards-per-1x: cut every size into shards of that
                shard_tokens = -(-result["tokens"] // (scale * args.shards_per_1x))
                shutil.rmtree(out)
                result = measure("prepare", out=str(out), nproc=nproc, shard_tokens=shard_tokens, **common)
            results["prepare"][scale, nproc] = result
        results["datasets"][scale] = measure("datasets", out=str(work / f"hf-{scale}x"), nproc=2,
                                             shard_tokens=0, **common)
        shards = work / f"shards-{scale}x-n1"
        workdir = str(train_workdir(work, shards, args.vocab, args.steps, args.seq_len))
        # the step alone just before and just after the loop: the machine's drift between them averages out
        alone = [measure("alone", workdir=workdir, steps=min(args.steps, 100))]
        for nproc in (1, 2):
            results["train"][scale, nproc] = measure("train", workdir=workdir, steps=args.steps, nproc=nproc)
            alone += [measure("alone", workdir=workdir, steps=min(args.steps, 100))] if nproc == 1 else []
        results["alone"][scale] = alone
        results["loader"][scale] = measure("loader", workdir=workdir, batches=args.loader_batches)
        results["shards"][scale] = len(list(shards.glob("train_*")))
        finished = args.scales[:args.scales.index(scale) + 1]
        print(f"up to {scale}x:\n{report(results, finished)}", file=sys.stderr)  # kept if a larger size fails
    return results


def report(results: dict, scales: list[int]) -> str:
    lines = ["| corpus | ours -n 1 tokens/s | ours -n 2 tokens/s | -n 2 / -n 1 | datasets tokens/s (num_proc 2) | "
             "ours -n 2 / datasets | ours -n 2 peak MiB: largest process; all | datasets peak MiB: largest; all |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for scale in scales:
        one, two, hf = results["prepare"][scale, 1], results["prepare"][scale, 2], results["datasets"][scale]
        speed = [run["tokens"] / run["seconds"] for run in (one, two, hf)]
        lines.append(f"| {scale}x | {speed[0]:,.0f} | {speed[1]:,.0f} | {speed[1] / speed[0]:.2f} | {speed[2]:,.0f} | "
                     f"{speed[1] / speed[2]:.2f} | {peaks(two)} | {peaks(hf)} |")
    lines += ["", "| corpus | train shards | training peak RSS per process MiB, 1 process | 2 processes | "
              "slowest step at a shard switch s | median step s | switch / median | loop mean step s | "
              "step alone, median s | loop / alone, medians |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for scale in scales:
        one, two, alone = results["train"][scale, 1], results["train"][scale, 2], results["alone"][scale]
        times = one["step_seconds"][1:]  # the first step builds everything
        median, mean = float(np.median(times)), float(np.mean(times))
        at_switch = max((one["step_seconds"][step] for step in one["switch_steps"]
                         if step < len(one["step_seconds"])), default=float("nan"))
        alone_median = float(np.mean([np.median(each["step_seconds"]) for each in alone]))
        lines.append(f"| {scale}x | {results['shards'][scale]} | {one['process_peak'] / MIB:,.0f} | "
                     f"{two['process_peak'] / MIB:,.0f} | {at_switch:.4f} | {median:.4f} | {at_switch / median:.2f} | "
                     f"{mean:.4f} | {alone_median:.4f} | {median / alone_median:.3f} |")
    need = bert_base_tokens_per_sec()
    lines += ["", f"| corpus | the loader alone, tokens/s of one process | processes one H100 needs for BERT-base at "
                  f"{H100_MFU:.0%} MFU ({need:,.0f} tokens/s) |", "|---|---:|---:|"]
    for scale in scales:
        speed = results["loader"][scale]["tokens_per_sec"]
        lines.append(f"| {scale}x | {speed:,.0f} | {need / speed:.2f} |")
    return "\n".join(lines)


def bert_base_tokens_per_sec(seq_len: int = 128) -> float:
    """What BERT-base's MLM step consumes on one H100 at H100_MFU of its published dense bf16 peak."""
    from hardware import published_peak_flops
    from masking import MaskingRule, predictions_per_sequence
    from model import ModelConfig, flops_per_token
    predictions = predictions_per_sequence(seq_len, MaskingRule().mask_rate) / seq_len
    return H100_MFU * published_peak_flops("H100") / flops_per_token(ModelConfig(vocab_size=30522), seq_len,
                                                                        predictions)


def peaks(run: dict) -> str:
    return f"{run['process_peak'] / MIB:,.0f}; {run['tree_peak'] / MIB:,.0f}"


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-i", "--input", type=Path, default=Path("demo/input/imdb.txt"), help="text corpus")
    parser.add_argument("-v", "--vocab", type=Path, default=Path("demo/vocab"), help="vocabulary directory")
    parser.add_argument("-m", "--seq-len", type=int, default=128, help="sample length (default 128)")
    parser.add_argument("--scales", type=int, nargs="+", default=[1, 4, 16], help="corpus sizes (default 1 4 16)")
    parser.add_argument("--lines", type=int, help="use only the corpus's first lines (a quick check of the script)")
    parser.add_argument("--steps", type=int, default=600, help="training steps at each size (default 600)")
    parser.add_argument("--loader-batches", type=int, default=400,
                        help="batches the loader alone is timed over (default 400)")
    parser.add_argument("--shards-per-1x", type=int, default=8,
                        help="shards the 1x corpus is cut into (default 8: a switch every ~200 steps)")
    parser.add_argument("--workdir", type=Path, help="where to keep the files made (default: a temporary directory)")
    parser.add_argument("--run-step", nargs=2, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def check_inputs(corpus: Path, vocab: Path) -> None:
    """The corpus and vocabulary a benchmark builds from, or one line saying which is missing."""
    if not corpus.is_file():
        raise UserError(f"{corpus}: corpus not found (build it: python scripts/make_demo.py -o demo)")
    if not (vocab / "vocab.txt").is_file():
        raise UserError(f"{vocab}: no vocab.txt there")


@exit_on_user_error
def main(argv=None):
    args = parse_args(argv)
    if args.run_step:
        return run_step(*args.run_step)
    check_inputs(args.input, args.vocab)
    if args.shards_per_1x < 1 or args.steps < 2:
        raise UserError(f"--shards-per-1x {args.shards_per_1x} --steps {args.steps}: expected at least 1 and 2")
    if min(args.scales) < 1:  # a corpus written 0 times over is empty: say which option made it so
        raise UserError(f"--scales {' '.join(map(str, args.scales))}: expected corpus sizes of at least 1")
    with tempfile.TemporaryDirectory(prefix="bench-data-") as scratch:
        work = args.workdir or Path(scratch)
        work.mkdir(parents=True, exist_ok=True)
        results = run_benchmark(args, work)
    print(f"{os.cpu_count()} CPU cores; steps {args.steps}; corpus {args.input} x {args.scales}")
    print(report(results, args.scales))


if __name__ == "__main__":
    main()
