"""BERT's own sizes on this machine: BERT-base (12 x 768) and BERT-large (24 x 1024, 16 heads), MLM
pre-training for a few steps from prepared shards. For each size: the parameters, the training
process's peak memory against the 4 float32 copies (weights, gradients, Adam's two moments) that
main.py checks before it allocates, tokens/s, the checkpoint's size, the seconds to save it and to
load it (its sha256 checked, as every load does), and whether a run stopped one step early and
resumed ends with the uninterrupted run's weights and optimizer state, bit for bit.

Example (the demo's shards, seq-len 128; minutes for base, about ten for large on 2 cores):
    python scripts/make_demo.py -o demo && python scripts/bench_scale.py --base-dir demo --sizes base large

Each run is a child `python src/main.py` (peak RSS sampled every 20 ms) writing under a temporary
base directory that links the given one's vocab/ and datasets/. Prints a markdown table.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import checkpoints  # noqa: E402
from errors import UserError, exit_on_user_error  # noqa: E402
from hardware import BYTES_PER_WEIGHT  # noqa: E402
from model import ModelConfig, estimated_parameters  # noqa: E402
from bench_prepare import sample_tree_rss  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
GIB = 2 ** 30
SIZES = {  # BERT's (Devlin et al. 2019, table 1), in its own layout
    "base": {"n-layer": 12, "d-model": 768, "heads": 12, "d-ff": 3072},
    "large": {"n-layer": 24, "d-model": 1024, "heads": 16, "d-ff": 4096},
    "tiny": {"n-layer": 2, "d-model": 64, "heads": 2, "d-ff": 256},  # seconds: a check that the script runs
}
TRAINING_COPIES = 4  # run_start.py's memory check: estimated_parameters's weights, gradients, Adam's two moments


def config_text(size: str, args) -> str:
    settings = {**SIZES[size], "norm": "postln", "position": "learned", "seq-len": args.seq_len,
                "batch-size": args.batch_size, "dataset-pattern": args.dataset_pattern,
                "val-dataset-pattern": args.val_dataset_pattern, "warmup-iters": 1, "lr-decay-iters": args.steps,
                "learning-rate": "1e-4", "val-interval": 10 ** 6, "val-iters": 1, "log-interval": 1,
                "device": "cpu", "compile": "false", "time-budget": 0,
                "peak-tflops": 1}  # no MFU in the table: spares each run the seconds of matmuls that measure a peak
    return "".join(f"{key} = {value}\n" for key, value in settings.items())


def train(base: Path, run_id: str, steps: int, resume: Path | None = None) -> tuple[Path, int, str]:
    """A child main.py run of `steps` steps (a resume when `resume`): its checkpoint, peak RSS and log."""
    command = [sys.executable, str(ROOT / "src" / "main.py"), "--max-iters", str(steps)]
    command += ["--cp", str(resume)] if resume else ["--run-id", run_id]
    child = subprocess.Popen(command, cwd=base, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    done, peak = threading.Event(), [0]
    sampler = threading.Thread(target=sample_tree_rss, args=(child.pid, done, peak))
    sampler.start()
    output, _ = child.communicate()
    done.set()
    sampler.join()
    if child.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed (exit {child.returncode}):\n{output[-3000:]}")
    run_dir = base / "runs" / run_id
    return run_dir / "checkpoints" / "checkpoint.pt", peak[0], (run_dir / "logs" / "log.txt").read_text()


def logged_tokens_per_second(log: str) -> list[float]:
    """The tokens/s of every line of a run's log that has one (the training lines), in order."""
    return [float(line.split(" tok/s")[0].rsplit("| ", 1)[1].replace(",", "")) for line in log.splitlines()
            if " tok/s" in line]


def last_tokens_per_second(log: str) -> float:
    rates = logged_tokens_per_second(log)
    return rates[-1] if rates else float("nan")


def same_tensors(first, second) -> bool:
    """Equal nested states: every tensor bit for bit, everything else by ==."""
    if isinstance(first, torch.Tensor):
        return isinstance(second, torch.Tensor) and torch.equal(first, second)
    if isinstance(first, dict):
        return first.keys() == second.keys() and all(same_tensors(first[key], second[key]) for key in first)
    if isinstance(first, (list, tuple)):
        return len(first) == len(second) and all(same_tensors(a, b) for a, b in zip(first, second))
    return first == second


def timed(work) -> tuple[object, float]:
    start = time.perf_counter()
    result = work()
    return result, time.perf_counter() - start


def measure(size: str, args, work: Path) -> dict:
    base = work / size
    (base / "runs").mkdir(parents=True)
    for name in ("vocab", "datasets"):
        os.symlink(args.base_dir.resolve() / name, base / name)
    (base / "config.ini").write_text(config_text(size, args))
    print(f"{size}: {args.steps} steps ...", file=sys.stderr)
    full, peak, log = train(base, f"{size}-full", args.steps)
    print(f"{size}: {args.steps - 1} steps, then a resume to {args.steps} ...", file=sys.stderr)
    part, _, _ = train(base, f"{size}-resumed", args.steps - 1)
    resumed, _, _ = train(base, f"{size}-resumed", args.steps, resume=part)
    uninterrupted, load_seconds = timed(lambda: checkpoints.load(full))
    _, save_seconds = timed(lambda: checkpoints.save(base / "saved.pt", uninterrupted))
    other = checkpoints.load(resumed)
    shape = ModelConfig(**uninterrupted["model_config"])
    unique = {tensor.data_ptr(): tensor for tensor in uninterrupted["model"].values()}  # tied weights once
    return {"size": size, "shape": shape, "weights": sum(tensor.numel() for tensor in unique.values()),
            "peak_rss": peak, "checked_bytes": TRAINING_COPIES * BYTES_PER_WEIGHT * estimated_parameters(shape),
            "tokens_per_second": last_tokens_per_second(log), "checkpoint_bytes": full.stat().st_size,
            "save_seconds": save_seconds, "load_seconds": load_seconds,
            "exact_resume": all(same_tensors(uninterrupted[key], other[key])
                                for key in ("model", "optimizer", "data_position", "step", "tokens"))}


def report(results: list[dict], args) -> str:
    lines = [f"seq-len {args.seq_len}, batch {args.batch_size}, {args.steps} steps, vocabulary "
             f"{results[0]['shape'].vocab_size:,}, {torch.get_num_threads()} threads", "",
             "| size | weights | peak memory | 4 float32 copies (the check) | tokens/s | checkpoint | save | "
             "load (sha256 checked) | resumed = uninterrupted |", "|---|---|---|---|---|---|---|---|---|"]
    for row in results:
        shape = row["shape"]
        lines.append(f"| {row['size']} ({shape.n_layer} x {shape.d_model}) | {row['weights'] / 1e6:.1f}M | "
                     f"{row['peak_rss'] / GIB:.2f} GiB | {row['checked_bytes'] / GIB:.2f} GiB | "
                     f"{row['tokens_per_second']:,.0f} | {row['checkpoint_bytes'] / GIB:.2f} GiB | "
                     f"{row['save_seconds']:.1f} s | {row['load_seconds']:.1f} s | "
                     f"{'yes, bit for bit' if row['exact_resume'] else 'NO'} |")
    return "\n".join(lines)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base-dir", type=Path, required=True, help="a base directory with vocab/ and datasets/")
    parser.add_argument("--sizes", nargs="+", choices=SIZES, default=["base", "large"])
    parser.add_argument("--steps", type=int, default=3, help="training steps of the uninterrupted run (>= 2)")
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--dataset-pattern", default="train_imdb_128_*.msgpack")
    parser.add_argument("--val-dataset-pattern", default="val_imdb_128_*.msgpack")
    parser.add_argument("--json", type=Path, help="also write the measurements here")
    return parser.parse_args(argv)


@exit_on_user_error
def main(argv=None):
    args = parse_args(argv)
    if args.steps < 2:
        raise UserError(f"--steps {args.steps}: expected at least 2 (a resume needs a step before it)")
    for name in ("vocab", "datasets"):
        if not (args.base_dir / name).is_dir():
            raise UserError(f"{args.base_dir / name}: not a directory (--base-dir names one with vocab/ and datasets/)")
    with tempfile.TemporaryDirectory(prefix="bench_scale_") as work:
        results = [measure(size, args, Path(work)) for size in args.sizes]
    print(report(results, args))
    if args.json:
        rows = [{**row, "shape": vars(row["shape"])} for row in results]
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
