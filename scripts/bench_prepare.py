"""Benchmark our data preparation against the original project's: tokens/s, peak memory, bytes/token.

Example:
    python scripts/make_demo.py -o demo && python scripts/bench_prepare.py -i demo/input/imdb.txt -v demo/vocab

Each step runs in its own subprocess, so its peak memory is its own: the VmHWM the step reports
at its end, or, for a worker pool, the sum of its processes' RSS sampled every 20 ms, whichever
is larger. "Above start" subtracts the RSS after imports, before the
work. The original approach (regex clean, the pure-Python BertTokenizer, ids in Python
lists, msgpack + gzip) runs on a prefix of the corpus (--prefix-fraction, default 1/4); ours runs
on that prefix and on the whole corpus, to show that its peak memory does not grow with size.
Prints a markdown table to stdout; progress goes to stderr.
"""
import argparse
import gzip
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import msgpack
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # the scripts it measures, run in-process
from cores import available_cores  # noqa: E402
from errors import UserError, exit_on_user_error  # noqa: E402

ORIGINAL_CHUNK_CHARS = 20 * 2**20  # the original tokenize_text.py read ~20 MB of text at a time
ORIGINAL_CLEAN = re.compile(r'[^a-zA-Z0-9\s,.!?\'"-]+')
MIB = 2**20


# ---------------------------------------------------------------------------------------------
# Steps, each run in a child process (`--run-step`); they print one JSON line of results


def rss_bytes(field: str = "VmRSS", pid="self") -> int:
    """A memory field of /proc/PID/status in bytes (0 once the process is gone)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0
    match = re.search(rf"^{field}:\s+(\d+) kB", status, re.MULTILINE)
    return int(match.group(1)) * 1024 if match else 0


def slow_bert_tokenizer(vocab_dir: Path):
    """The pure-Python BertTokenizer the original used (BertTokenizerLegacy in transformers >= 5)."""
    try:
        from transformers.models.bert.tokenization_bert_legacy import BertTokenizerLegacy as tokenizer_class
    except ImportError:
        from transformers import BertTokenizer as tokenizer_class  # the Python one before transformers 5
    return tokenizer_class.from_pretrained(str(vocab_dir))


def run_original(input_path: Path, vocab_dir: Path, output: Path) -> dict:
    """The original tokenize_text.py: per ~20 MB chunk, regex clean and encode; lists; msgpack.gz."""
    tokenizer = slow_bert_tokenizer(vocab_dir)
    start_rss, started = rss_bytes(), time.perf_counter()
    ids = []
    with input_path.open(encoding="utf-8") as file:
        while text := file.read(ORIGINAL_CHUNK_CHARS):
            ids.extend(tokenizer.encode(ORIGINAL_CLEAN.sub("", text), add_special_tokens=False))
    with gzip.open(output, "wb") as out:
        out.write(msgpack.packb(ids))
    kind = type(tokenizer)
    return {"tokens": len(ids), "seconds": time.perf_counter() - started, "start_rss": start_rss,
            "tokenizer": f"{kind.__module__}.{kind.__name__} (is_fast={tokenizer.is_fast})"}


def run_tokenize(input_path: Path, vocab_dir: Path, output: Path, nproc: int, chunk_mb: float) -> dict:
    import tokenize_text
    from corpus.input_files import find_inputs
    start_rss, started = rss_bytes(), time.perf_counter()
    tokens = tokenize_text.tokenize_files(find_inputs([str(input_path)]), vocab_dir, output, nproc, int(chunk_mb * MIB),
                                          show_progress=False)
    return {"tokens": tokens, "seconds": time.perf_counter() - started, "start_rss": start_rss}


def run_preparer(script: str, input_path: Path, vocab_dir: Path, output: Path, seq_len: int,
                 extra_argv: list[str] = ()) -> dict:
    """prepare_mlm_dataset.py (text) or prepare_mlm_fixed_len_dataset_from_ids.py (ids), via main()."""
    import contextlib
    import importlib
    module = importlib.import_module(script)
    start_rss, started = rss_bytes(), time.perf_counter()
    with contextlib.redirect_stdout(sys.stderr):
        module.main(["-i", str(input_path), "-l", "bench", "-o", str(output), "-m", str(seq_len),
                     "-v", str(vocab_dir), "-s", "123", *extra_argv])
    seconds = time.perf_counter() - started
    tokens = sum(shard_header(path)["tokens"] - 2 * shard_header(path)["samples"] for path in output.glob("*.gz"))
    return {"tokens": tokens, "seconds": seconds, "start_rss": start_rss}


def shard_header(path: Path) -> dict:
    """The header map a shard starts with, without loading the shard."""
    with gzip.open(path, "rb") as stream:
        return next(msgpack.Unpacker(stream, raw=False))


def run_load_ours(shard_path: Path) -> dict:
    from shards import read_shard
    start_rss, started = rss_bytes(), time.perf_counter()
    shard = read_shard(shard_path)
    tokens = len(shard.tokens)
    return {"tokens": tokens, "seconds": time.perf_counter() - started, "start_rss": start_rss,
            "resident_bytes": shard.resident_bytes()}


def run_load_lists(legacy_path: Path) -> dict:
    """The original reader: the whole shard as Python lists of ints (sizes by sys.getsizeof)."""
    start_rss, started = rss_bytes(), time.perf_counter()
    with gzip.open(legacy_path, "rb") as stream:
        lists = msgpack.unpackb(stream.read())
    seconds = time.perf_counter() - started
    ids_bytes = lists_bytes(lists[0::2])
    return {"tokens": sum(len(ids) for ids in lists[0::2]), "seconds": seconds, "start_rss": start_rss,
            "resident_bytes": sys.getsizeof(lists) + ids_bytes + lists_bytes(lists[1::2]),
            "ids_only_bytes": ids_bytes}


def lists_bytes(lists: list[list[int]]) -> int:
    """sys.getsizeof of the lists and of their ints outside CPython's small-int cache (-5..256)."""
    return sum(sys.getsizeof(ids) + sum(sys.getsizeof(i) for i in ids if not -5 <= i <= 256) for ids in lists)


def run_step(args) -> None:
    steps = {
        "original": lambda: run_original(args.input, args.vocab, args.output),
        "tokenize": lambda: run_tokenize(args.input, args.vocab, args.output, args.nproc, args.chunk_mb),
        "segment": lambda: run_preparer("prepare_mlm_dataset", args.input, args.vocab, args.output, args.seq_len,
                                        ["--chunk-mb", str(args.chunk_mb)]),
        "cut": lambda: run_preparer("prepare_mlm_fixed_len_dataset_from_ids", args.input, args.vocab, args.output,
                                    args.seq_len),
        "load-ours": lambda: run_load_ours(args.input),
        "load-lists": lambda: run_load_lists(args.input),
    }
    result = steps[args.run_step]()
    # VmHWM, not getrusage: a child's ru_maxrss keeps the RSS of the parent it was forked from.
    result["peak_rss"] = rss_bytes("VmHWM")
    print(json.dumps(result))


# ---------------------------------------------------------------------------------------------
# Measuring a child process


@dataclass
class Measured:
    name: str
    corpus: str
    result: dict
    peak_rss: int

    @property
    def tokens_per_second(self) -> float:
        return self.result["tokens"] / self.result["seconds"]


def descendants(pid: int) -> list[int]:
    """pid and every process below it (Linux /proc)."""
    found, queue = [], [pid]
    while queue:
        current = queue.pop()
        found.append(current)
        try:
            for task in Path(f"/proc/{current}/task").iterdir():
                queue += [int(child) for child in (task / "children").read_text().split()]
        except OSError:
            pass
    return found


def sample_tree_rss(pid: int, done: threading.Event, peak: list[int]) -> None:
    while not done.wait(0.02):
        peak[0] = max(peak[0], sum(rss_bytes("VmRSS", each) for each in descendants(pid)))


def measure(name: str, corpus: str, step_argv: list[str]) -> Measured:
    """Run `bench_prepare.py --run-step ...` in a child; its JSON result and its peak RSS."""
    print(f"running {name} on {corpus} ...", file=sys.stderr)
    command = [sys.executable, __file__, "--run-step", *map(str, step_argv)]
    with tempfile.TemporaryFile() as stdout, tempfile.TemporaryFile() as stderr:
        child = subprocess.Popen(command, stdout=stdout, stderr=stderr)
        done, tree_peak = threading.Event(), [0]
        sampler = threading.Thread(target=sample_tree_rss, args=(child.pid, done, tree_peak))
        sampler.start()
        child.wait()
        done.set()
        sampler.join()
        stdout.seek(0), stderr.seek(0)
        output, errors = stdout.read().decode(), stderr.read().decode(errors="replace")
    if child.returncode != 0:
        raise RuntimeError(f"{name} failed (exit {child.returncode}):\n{errors[-3000:]}")
    result = json.loads(output.strip().splitlines()[-1])
    return Measured(name, corpus, result, max(result["peak_rss"], tree_peak[0]))


# ---------------------------------------------------------------------------------------------
# The benchmark


def write_prefix(corpus: Path, fraction: float, target: Path) -> Path:
    """The corpus's first lines holding about fraction of its bytes."""
    with corpus.open("rb") as source, target.open("wb") as out:
        out.write(source.read(int(corpus.stat().st_size * fraction)) + source.readline())
    return target


def write_legacy_shard(shard_path: Path, target: Path, mask_rate: float = 0.15) -> Path:
    """Our shard's samples in the original layout: [ids, labels, ids, labels, ...], label 0 = not masked."""
    from shards import read_shard
    shard = read_shard(shard_path)
    generator = np.random.default_rng(0)
    items = []
    for index in range(len(shard)):
        ids = shard.sample(index)
        labels = np.where(generator.random(len(ids)) < mask_rate, ids, 0)
        items += [ids.tolist(), labels.tolist()]
    with gzip.open(target, "wb") as out:
        out.write(msgpack.packb(items))
    return target


def our_steps(text: Path, vocab_dir: Path, work: Path, size: str, seq_len: int, nproc: int, chunk_mb: float) -> dict:
    """Our pipelines on one corpus: tokenize_text (-n 1 and -n nproc) then cut; text segmentation."""
    ids, tag = work / f"ids-{size}.msgpack.gz", f"{size}"
    common = ["--vocab", vocab_dir, "--seq-len", seq_len, "--chunk-mb", chunk_mb]
    runs = {}
    for workers in sorted({1, nproc}):
        runs[f"tokenize -n {workers}"] = measure(f"ours: tokenize_text -n {workers}", tag,
                                                 ["tokenize", "--input", text, "--output", ids, "--nproc", workers,
                                                  *common])
    runs["cut"] = measure("ours: prepare_mlm_fixed_len_dataset_from_ids", tag,
                          ["cut", "--input", ids, "--output", work / f"cut-{size}", *common])
    runs["segment"] = measure("ours: prepare_mlm_dataset (text segmentation)", tag,
                              ["segment", "--input", text, "--output", work / f"segment-{size}", *common])
    return runs


def run_benchmark(corpus: Path, vocab_dir: Path, work: Path, seq_len: int, nproc: int, fraction: float,
                  chunk_mb: float) -> dict:
    """Every measurement; returns {"prefix": runs, "full": runs, "load": runs, sizes...}."""
    prefix = write_prefix(corpus, fraction, work / "prefix.txt")
    prefix_runs = {"original": measure("original: clean + pure-Python BertTokenizer + lists + msgpack.gz", "prefix",
                                       ["original", "--input", prefix, "--vocab", vocab_dir,
                                        "--output", work / "original.msgpack.gz"])}
    prefix_runs |= our_steps(prefix, vocab_dir, work, "prefix", seq_len, nproc, chunk_mb)
    full_runs = our_steps(corpus, vocab_dir, work, "full", seq_len, nproc, chunk_mb)
    train_shard = next((work / "segment-prefix").glob("train_*.msgpack.gz"))
    legacy = write_legacy_shard(train_shard, work / "legacy.msgpack.gz")
    load_runs = {"ours": measure("load a train shard: read_shard (numpy)", "prefix", ["load-ours", "--input",
                                                                                     train_shard]),
                 "lists": measure("load a train shard: msgpack into Python lists", "prefix",
                                  ["load-lists", "--input", legacy])}
    return {"prefix": prefix_runs, "full": full_runs, "load": load_runs,
            "prefix_bytes": prefix.stat().st_size, "full_bytes": corpus.stat().st_size}


# ---------------------------------------------------------------------------------------------
# Report


def mib(value: float) -> str:
    return f"{value / MIB:,.0f}"


def above_start(run: Measured) -> int:
    return run.peak_rss - run.result["start_rss"]


def steps_table(runs: list[Measured]) -> list[str]:
    lines = ["| step | corpus | tokens | seconds | tokens/s | peak RSS MiB | above start MiB |",
             "|---|---|---:|---:|---:|---:|---:|"]
    for run in runs:
        result = run.result
        lines.append(f"| {run.name} | {run.corpus} | {result['tokens']:,} | {result['seconds']:.1f} | "
                     f"{run.tokens_per_second:,.0f} | {mib(run.peak_rss)} | {mib(above_start(run))} |")
    return lines


def comparison_row(measure_name: str, ours: float, original: float, digits: str) -> str:
    return f"| {measure_name} | {ours:,{digits}} | {original:,{digits}} | {ours / original:.3g} |"


def comparison_table(prefix_runs: dict, load_runs: dict) -> list[str]:
    """Ours against the original on the same prefix; ratios ours/original."""
    original = prefix_runs["original"]
    lines = ["| measure (same prefix) | ours | original | ours/original |", "|---|---:|---:|---:|"]
    for key in (key for key in prefix_runs if key.startswith("tokenize")):
        ours = prefix_runs[key]
        lines += [comparison_row(f"tokens/s, {key}", ours.tokens_per_second, original.tokens_per_second, ".0f"),
                  comparison_row(f"peak RSS MiB, {key}", ours.peak_rss / MIB, original.peak_rss / MIB, ".0f"),
                  comparison_row(f"peak RSS above start MiB, {key}", above_start(ours) / MIB,
                                 above_start(original) / MIB, ".0f")]
    ours, lists = load_runs["ours"].result, load_runs["lists"].result
    ours_per_token = ours["resident_bytes"] / ours["tokens"]
    lines += [comparison_row("loaded shard bytes/token (ids)", ours_per_token,
                             lists["ids_only_bytes"] / lists["tokens"], ".2f"),
              comparison_row("loaded shard bytes/token (original layout: ids + label lists)", ours_per_token,
                             lists["resident_bytes"] / lists["tokens"], ".2f"),
              comparison_row("loaded shard peak RSS above start MiB", above_start(load_runs["ours"]) / MIB,
                             above_start(load_runs["lists"]) / MIB, ".0f")]
    return lines


def growth_table(prefix_runs: dict, full_runs: dict) -> list[str]:
    lines = ["| ours: peak RSS MiB | prefix | full corpus | full/prefix |", "|---|---:|---:|---:|"]
    for key, full in full_runs.items():
        small = prefix_runs[key]
        lines.append(f"| {full.name.removeprefix('ours: ')} | {mib(small.peak_rss)} | {mib(full.peak_rss)} | "
                     f"{full.peak_rss / small.peak_rss:.3g} |")
    return lines


def report(measured: dict, fraction: float, chunk_mb: float, seconds: float) -> str:
    prefix_runs, full_runs, load_runs = measured["prefix"], measured["full"], measured["load"]
    original = prefix_runs["original"].result
    lines = [f"corpus: full {measured['full_bytes'] / MIB:.1f} MiB ({full_runs['tokenize -n 1'].result['tokens']:,} "
             f"tokens); prefix = first {fraction:.0%}: {measured['prefix_bytes'] / MIB:.1f} MiB "
             f"({original['tokens']:,} tokens by the original's cleaning + tokenizer). "
             f"The original runs on the prefix only; ours reads --chunk-mb {chunk_mb:g}. "
             f"{os.cpu_count()} CPU cores; bench took {seconds:.0f} s.",
             f"original tokenizer: {original['tokenizer']}", "",
             *steps_table([*prefix_runs.values(), *full_runs.values(), *load_runs.values()]), "",
             *comparison_table(prefix_runs, load_runs), "", *growth_table(prefix_runs, full_runs)]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-i", "--input", type=Path, default=Path("demo/input/imdb.txt"), help="text corpus")
    parser.add_argument("-v", "--vocab", type=Path, default=Path("demo/vocab"), help="vocabulary directory")
    parser.add_argument("-m", "--seq-len", type=int, default=128, help="sample length (default 128)")
    parser.add_argument("-n", "--nproc", type=int, default=available_cores(),
                        help="tokenize_text workers for the parallel run (default: the cores this process may use)")
    parser.add_argument("--prefix-fraction", type=float, default=0.25,
                        help="prefix of the corpus for the slow original and ours' small runs (default 0.25)")
    parser.add_argument("--chunk-mb", type=float, default=4.0,
                        help="ours' text chunk (default 4: the 1/4 prefix spans several chunks, so a peak "
                             "that stays flat from prefix to full corpus shows memory bounded by chunks)")
    parser.add_argument("--workdir", type=Path, help="where to keep the files made (default: a temporary directory)")
    parser.add_argument("--run-step", help=argparse.SUPPRESS)
    parser.add_argument("--output", type=Path, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def check_args(args) -> None:
    if not args.input.is_file() or args.input.stat().st_size == 0:
        raise UserError(f"{args.input}: corpus not found or empty (build it: python scripts/make_demo.py -o demo)")
    from vocab import load_vocab
    load_vocab(args.vocab)
    if args.nproc < 1:
        raise UserError(f"-n {args.nproc}: expected at least 1 process")
    if args.chunk_mb <= 0:
        raise UserError(f"--chunk-mb {args.chunk_mb}: expected a positive size")
    if not 0 < args.prefix_fraction < 1:
        raise UserError(f"--prefix-fraction {args.prefix_fraction}: expected a value between 0 and 1")


@exit_on_user_error
def main(argv=None):
    args = parse_args(argv)
    if args.run_step:
        return run_step(args)
    check_args(args)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench-prepare-") as scratch:
        work = args.workdir or Path(scratch)
        work.mkdir(parents=True, exist_ok=True)
        measured = run_benchmark(args.input, args.vocab, work, args.seq_len, args.nproc, args.prefix_fraction,
                                 args.chunk_mb)
    print(report(measured, args.prefix_fraction, args.chunk_mb, time.perf_counter() - started))


if __name__ == "__main__":
    main()
