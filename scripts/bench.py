"""Side by side, ours against transformers: MLM step speed, MFU, peak memory, fine-tuning speed.

Example:
    python scripts/bench.py                       # MLM at small and medium, fine-tuning at medium and original
    python scripts/bench.py --sizes small medium original --steps 10
    python scripts/bench.py --sizes --finetune-sizes medium original   # fine-tuning only
    python scripts/bench.py --sizes original base --finetune-sizes medium original --compiled

Both models get the same config, the same real batch (demo shards when present), the same
thread count and their best dtype on the device (bf16 autocast where supported). Ours masks
with src/masking.py and computes its last layer and head at the masked positions only; theirs masks
as DataCollatorForLanguageModeling does. Both use fused AdamW, as the trainer does and as
transformers' Trainer does by default (adamw_torch_fused, from torch 2.8). The two
are timed in alternating rounds in one process, each round starting one arm later, so drift in the
machine hits both alike.

MFU counts the FLOPs a step needs (model.flops_per_token with the last layer but for its keys and
values, and the head, on the masked slots only) for both sides, over the matmul peak of the step's
dtype measured in the same run. Fine-tuning runs both sides over the same real SST-2 training
batches from demo/ (build it with scripts/make_demo.py), drawn as our trainer draws them
(length-grouped, the default seed): ours pads a batch to its longest sentence (rounded up to 8 on a
GPU: batching.pad_multiple), theirs to 128 as run_glue does, or dynamically as Trainer does. On
the CPU a last table gives the floor under those steps: their GEMMs, attention and AdamW timed
alone. Peak memory is measured in a fresh subprocess per side and size (peak RSS growth on CPU,
max_memory_allocated on CUDA).
"""
import argparse
import dataclasses
import json
import statistics
import subprocess
import sys
import time
from itertools import islice
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))
from batching import pad_multiple, padded_width  # noqa: E402
from hardware import (MEASURED_NOW, fast_dtype, keep_freed_memory, keep_kernels_for_every_width,  # noqa: E402
                      measure_matmul_flops, peak_flops, seconds_per_call, select_device, synchronize)
from masking import MaskingRule, mask_tokens, predictions_per_sequence  # noqa: E402
from model import (IGNORE_INDEX, BertForMaskedLM, BertForSequenceClassification, ModelConfig,  # noqa: E402
                   attend, flops_per_token)

# layers, width, heads
SIZES = {"small": (2, 128, 2), "medium": (4, 256, 4), "original": (6, 768, 12), "base": (12, 768, 12)}
VOCAB_SIZE, SEQ_LEN, SPECIAL_IDS, MASK_ID = 30522, 128, torch.tensor([0, 100, 101, 102, 103]), 103


def real_batch(batch_size: int) -> torch.Tensor:
    """Token ids of real IMDB text when the demo is built, else random ids: [batch, 128]."""
    shard_path = ROOT / "demo" / "datasets" / "train_imdb_128_123.msgpack.gz"
    if not shard_path.is_file():
        return torch.randint(1000, VOCAB_SIZE, (batch_size, SEQ_LEN))
    from batching import gather_padded
    from shards import read_shard
    shard = read_shard(shard_path)
    ids, _ = gather_padded(shard.tokens, shard.offsets, torch.arange(batch_size).numpy(), SEQ_LEN, 0)
    return torch.from_numpy(ids)


def collator_masking(ids: torch.Tensor, generator: torch.Generator):
    """What transformers' DataCollatorForLanguageModeling does: a coin per token, 80/10/10,
    labels at every position (-100 where not masked)."""
    labels = ids.clone()
    special = torch.isin(ids, SPECIAL_IDS)
    picked = torch.bernoulli(torch.full(ids.shape, 0.15), generator=generator).bool() & ~special
    labels[~picked] = IGNORE_INDEX
    inputs = ids.clone()
    to_mask = torch.bernoulli(torch.full(ids.shape, 0.8), generator=generator).bool() & picked
    inputs[to_mask] = MASK_ID
    to_random = torch.bernoulli(torch.full(ids.shape, 0.5), generator=generator).bool() & picked & ~to_mask
    inputs[to_random] = torch.randint(VOCAB_SIZE, ids.shape, generator=generator)[to_random]
    return inputs, labels


def mlm_config(size: str) -> ModelConfig:
    layers, width, heads = SIZES[size]
    return ModelConfig(vocab_size=VOCAB_SIZE, max_len=SEQ_LEN, d_model=width, heads=heads, n_layer=layers,
                       d_ff=4 * width)


class TrainingStep:
    """One side of a comparison: a model and its optimizer; step() runs the loss (a subclass's)
    under autocast, backward and the optimizer step."""

    def __init__(self, model, device, dtype):
        self.model = model.to(device)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-4, fused=True)
        self.device, self.dtype = device, dtype

    def step(self, batch):
        with torch.autocast(self.device.type, dtype=self.dtype, enabled=self.dtype != torch.float32):
            loss = self.loss(batch)
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)


class Ours(TrainingStep):
    name = "ours"

    def __init__(self, size, device, dtype):
        super().__init__(BertForMaskedLM(mlm_config(size)), device, dtype)
        self.generator = torch.Generator(device=device).manual_seed(0)

    def loss(self, ids):
        inputs, positions, labels = mask_tokens(ids, SPECIAL_IDS, MASK_ID, VOCAB_SIZE, MaskingRule(), self.generator)
        return self.model(inputs, positions, labels)[1]


class Theirs(TrainingStep):
    name = "transformers"

    def __init__(self, size, device, dtype):
        from transformers import BertConfig
        from transformers import BertForMaskedLM as HuggingFaceBert
        layers, width, heads = SIZES[size]
        config = BertConfig(vocab_size=VOCAB_SIZE, hidden_size=width, num_hidden_layers=layers,
                            num_attention_heads=heads, intermediate_size=4 * width,
                            max_position_embeddings=SEQ_LEN, attn_implementation="sdpa")
        super().__init__(HuggingFaceBert(config), device, dtype)
        self.generator = torch.Generator().manual_seed(0)

    def loss(self, ids):
        inputs, labels = collator_masking(ids.cpu(), self.generator)
        return self.model(input_ids=inputs.to(self.device), labels=labels.to(self.device)).loss


def seconds_for_batches(runner, batches: list, device) -> float:
    synchronize(device)
    started = time.perf_counter()
    for batch in batches:
        runner.step(batch)
    synchronize(device)
    return time.perf_counter() - started


def rotated(arms: list, round_number: int) -> list:
    """The arms in the order a round runs them, starting one later each round: an arm that always ran
    first, at widths no other arm had just run, read 5-8% slower than the same code run after it (the
    kernels each width builds, etc/results/step-time.md, "oneDNN's kernels for every width")."""
    start = round_number % len(arms)
    return arms[start:] + arms[:start]


def seconds_per_step(runner, ids, steps: int, device) -> float:
    return seconds_for_batches(runner, [ids] * steps, device) / steps


def compare(size: str, batch_size: int, steps: int, rounds: int, device, dtype) -> dict:
    ids = real_batch(batch_size).to(device)
    runners = [Ours(size, device, dtype), Theirs(size, device, dtype)]
    for runner in runners:
        seconds_per_step(runner, ids, 2, device)  # warm-up: allocator, kernels, optimizer state
    timings = {runner.name: [] for runner in runners}
    for number in range(rounds):
        for runner in rotated(runners, number):
            timings[runner.name].append(seconds_per_step(runner, ids, steps, device))
    tokens = batch_size * SEQ_LEN
    return {name: tokens / statistics.median(times) for name, times in timings.items()}


def useful_flops_per_step(size: str, batch_size: int) -> float:
    """Training FLOPs one MLM step needs: the encoder on every token but for the last layer, which
    needs keys and values everywhere and the rest at the masked slots, as the head. Transformers runs
    its last layer and head on all 128 positions, but that extra work is not counted."""
    predictions_per_token = predictions_per_sequence(SEQ_LEN, MaskingRule().mask_rate) / SEQ_LEN
    per_token = flops_per_token(mlm_config(size), SEQ_LEN, predictions_per_token, predictions_per_token)
    return per_token * batch_size * SEQ_LEN


# ----------------------------------------------------------------------------- fine-tuning

def sst2_epoch(batch_size: int, demo: Path = ROOT / "demo"):
    """One epoch of real SST-2 training batches (numpy), as the trainer draws them with the default
    config (length-grouped, padded to each batch's longest), and the vocabulary."""
    from tasks.classification_task import ClassificationTask
    from config import Config
    from vocab import load_vocab
    if not (demo / "datasets" / "train-00000-of-00001.parquet").is_file():
        sys.exit(f"{demo}/datasets: no SST-2 training split; the fine-tuning benchmark needs the demo "
                 f"(python scripts/make_demo.py -o demo)")
    vocab = load_vocab(demo / "vocab")
    config = Config(task_type="sst2", base_dir=str(demo), batch_size=batch_size, seq_len=SEQ_LEN)
    task = ClassificationTask(config, vocab, torch.device("cpu"))
    batches_per_epoch = task.train_examples() // batch_size
    return [batch for _, batch in islice(task.train_batches(None), batches_per_epoch)], vocab


def padded_to(batch: dict, width: int, pad_id: int) -> dict:
    """The same sentences padded to `width`: 128 as run_glue's default (pad_to_max_length) does, or a
    multiple of 8 as the trainer pads for a compiled model."""
    extra = ((0, 0), (0, width - batch["input_ids"].shape[1]))
    return {"input_ids": np.pad(batch["input_ids"], extra, constant_values=pad_id),
            "attention_mask": np.pad(batch["attention_mask"], extra), "labels": batch["labels"]}


class OursClassifier(TrainingStep):
    name = "ours"

    def __init__(self, size, vocab, device, dtype, compiled: bool = False):
        config = dataclasses.replace(mlm_config(size), vocab_size=vocab.size, pad_id=vocab.pad_id, num_labels=2)
        super().__init__(BertForSequenceClassification(config), device, dtype)
        if compiled:  # as the trainer compiles with compile = true: one graph, dynamic after a second width
            self.model = torch.compile(self.model)

    def loss(self, batch):
        return self.model(batch["input_ids"], batch["labels"], attention_mask=batch["attention_mask"])[1]


class TheirsClassifier(TrainingStep):
    name = "transformers"

    def __init__(self, size, vocab, device, dtype):
        from transformers import BertConfig
        from transformers import BertForSequenceClassification as HuggingFaceClassifier
        layers, width, heads = SIZES[size]
        config = BertConfig(vocab_size=vocab.size, hidden_size=width, num_hidden_layers=layers,
                            num_attention_heads=heads, intermediate_size=4 * width, pad_token_id=vocab.pad_id,
                            max_position_embeddings=SEQ_LEN, num_labels=2, attn_implementation="sdpa")
        super().__init__(HuggingFaceClassifier(config), device, dtype)

    def loss(self, batch):
        return self.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                          labels=batch["labels"]).loss


def warm_up_batches(batches: list[dict]) -> list[dict]:
    """One batch of each width in the set, twice if there is one width: the first step at a new
    shape pays for set-up (allocator, kernels) that a whole epoch amortises."""
    distinct = list({batch["input_ids"].shape[1]: batch for batch in batches}.values())
    return distinct if len(distinct) > 1 else distinct * 2


def shuffled_dynamic_batches(batches: list[dict], vocab, seed: int = 0) -> list[dict]:
    """The same sentences as transformers users batch them: shuffled, DataCollatorWithPadding
    padding each batch to its longest sentence (Trainer's default for a tokenizer without
    pad_to_max_length)."""
    from transformers import BertTokenizerFast, DataCollatorWithPadding
    collator = DataCollatorWithPadding(BertTokenizerFast(vocab_file=str(vocab.path)), return_tensors="np")
    sentences = [{"input_ids": ids[real.astype(bool)].tolist(), "label": int(label)}
                 for batch in batches
                 for ids, real, label in zip(batch["input_ids"], batch["attention_mask"], batch["labels"])]
    order = np.random.default_rng(seed).permutation(len(sentences))
    size = len(batches[0]["labels"])
    collated = [collator([sentences[i] for i in order[first:first + size]]) for first in range(0, len(order), size)]
    return [{"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"], "labels": batch["labels"]}
            for batch in collated]


FINETUNING_ARMS = {  # arm: (side, how its batches are made)
    "ours": ("ours", "length-grouped, padded to the longest (on a GPU rounded up to 8)"),
    "transformers, padded to 128": ("transformers", "padded to 128 as run_glue does by default"),
    "transformers, dynamic padding": ("transformers", "shuffled, DataCollatorWithPadding"),
    "transformers, our batches": ("transformers", "our length-grouped batches"),
}


COMPILED_ARM = {"ours, compiled": ("ours, compiled", "ours under torch.compile, as compile = true has it")}


def finetuning_arms(compiled: bool) -> dict:
    """The arms, ours compiled after ours when asked (compiling takes a minute a size on 2 cores)."""
    arms = dict(FINETUNING_ARMS)
    return {"ours": arms.pop("ours"), **(COMPILED_ARM if compiled else {}), **arms}


def finetuning_batches(measured: list[dict], vocab, device_type: str) -> dict[str, list[dict]]:
    """Each arm's batches: ours as the trainer pads them on this device (exactly on the CPU, to 8 on a GPU)."""
    ours = [padded_to(batch, padded_width(batch["attention_mask"].sum(1), SEQ_LEN, pad_multiple(device_type)),
                      vocab.pad_id) for batch in measured]
    return {"ours": ours, "ours, compiled": ours, "transformers, our batches": measured,
            "transformers, padded to 128": [padded_to(batch, SEQ_LEN, vocab.pad_id) for batch in measured],
            "transformers, dynamic padding": shuffled_dynamic_batches(measured, vocab)}


def compare_finetuning(size: str, epoch: list[dict], vocab, steps: int, rounds: int, device, dtype,
                       compiled: bool = False) -> dict:
    """Sentences/s of fine-tuning over the first rounds x steps training batches of the epoch, each
    round the next `steps` of them for every arm in turn (`rotated`), all arms on the same sentences."""
    arms = finetuning_arms(compiled)
    def on_device(batch):
        return {key: torch.as_tensor(value).to(device) for key, value in batch.items() if value is not None}

    measured = epoch[:rounds * steps]
    batches = {arm: [on_device(batch) for batch in arm_batches]
               for arm, arm_batches in finetuning_batches(measured, vocab, device.type).items() if arm in arms}
    runners = {"ours": OursClassifier(size, vocab, device, dtype),
               "transformers": TheirsClassifier(size, vocab, device, dtype)}
    if compiled:
        runners["ours, compiled"] = OursClassifier(size, vocab, device, dtype, compiled=True)
    for arm, (side, _) in arms.items():
        seconds_for_batches(runners[side], warm_up_batches(batches[arm]), device)
    seconds = dict.fromkeys(arms, 0.0)
    for number, first in enumerate(range(0, len(measured), steps)):
        for arm in rotated(list(arms), number):
            seconds[arm] += seconds_for_batches(runners[arms[arm][0]], batches[arm][first:first + steps], device)
    sentences = sum(len(batch["labels"]) for batch in measured)
    return {arm: {"rate": sentences / seconds[arm],
                  "width": np.mean([batch["input_ids"].shape[1] for batch in batches[arm]])}
            for arm in arms}


def kernel_floor(size: str, batches: list[dict], vocab, dtype) -> dict[str, float]:
    """Seconds the fine-tuning steps over `batches` cannot go below on this device: each layer's GEMMs
    (forward and the two backward products, in the step's dtype), its attention (forward and backward,
    model.attend's fastest path for the length, without dropout) and fused AdamW over the model's
    weights, each timed alone at the batches' shapes; the last layer's keys and values at every
    token, the rest at [CLS] alone, as ours computes it. A ratio against transformers above what this
    floor allows is out of reach whatever the rest of the step does."""
    layers, width, heads = SIZES[size]
    rows = len(batches[0]["labels"])
    every_token = ((width, 3 * width), (width, width), (width, 4 * width), (4 * width, width))  # qkv, out, up, down
    keys_and_values, at_cls = ((width, 2 * width),), ((width, width), *every_token[1:])

    def gemms(tokens: int, shapes) -> float:
        def products(k: int, n: int) -> float:
            x, w, dy = (torch.randn(*shape, dtype=dtype) for shape in ((tokens, k), (k, n), (tokens, n)))
            return seconds_per_call(lambda: (x @ w, dy @ w.T, x.T @ dy))
        return sum(products(k, n) for k, n in shapes)

    def attention(queries: int, length: int) -> float:
        q = torch.randn(rows, heads, queries, width // heads, dtype=dtype, requires_grad=True)
        k, v = (torch.randn(rows, heads, length, width // heads, dtype=dtype, requires_grad=True) for _ in range(2))

        def forward_and_backward():
            with torch.autocast("cpu", dtype=dtype, enabled=dtype != torch.float32):
                y = attend(q, k, v, None, 0.0, False)
            y.float().sum().backward()
        return seconds_per_call(forward_and_backward)

    def layers_gemms(length: int) -> float:
        return ((layers - 1) * gemms(rows * length, every_token) + gemms(rows * length, keys_and_values)
                + gemms(rows, at_cls))

    widths = [batch["input_ids"].shape[1] for batch in batches]
    per_width = {length: (layers_gemms(length), (layers - 1) * attention(length, length) + attention(1, length))
                 for length in set(widths)}
    model = OursClassifier(size, vocab, torch.device("cpu"), dtype)
    for weight in model.model.parameters():
        weight.grad = torch.zeros_like(weight)
    return {"GEMMs": sum(per_width[length][0] for length in widths),
            "attention": sum(per_width[length][1] for length in widths),
            "AdamW": len(widths) * seconds_per_call(model.optimizer.step)}


# ----------------------------------------------------------------------------- peak memory

def measure_memory(side: str, size: str, batch_size: int, steps: int, device) -> float:
    """MiB one side's MLM training (model, gradients, AdamW state, activations) adds at its peak.
    Meant for a fresh process (see peak_memory_mib), where nothing else has raised the peak."""
    import transformers  # noqa: F401  imported before the baseline by both sides alike
    dtype = fast_dtype(device)
    ids = real_batch(batch_size).to(device)
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
    else:
        before = peak_rss_bytes()
    runner = (Ours if side == "ours" else Theirs)(size, device, dtype)
    for _ in range(steps):
        runner.step(ids)
    if device.type == "cuda":
        torch.cuda.synchronize()
        return (torch.cuda.max_memory_allocated() - before) / 2 ** 20
    return (peak_rss_bytes() - before) / 2 ** 20


def peak_rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status: peak memory on CPU needs Linux")


def peak_memory_mib(side: str, size: str, batch_size: int, steps: int, device) -> float:
    """Runs measure_memory in a fresh copy of this script, so each side starts from a clean peak."""
    command = [sys.executable, __file__, "--measure-memory", side, "--sizes", size,
               "--batch-size", str(batch_size), "--steps", str(steps), "--device", str(device.type)]
    output = subprocess.run(command, check=True, capture_output=True, text=True).stdout
    return json.loads(output.strip().splitlines()[-1])["mib"]


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", nargs="*", choices=list(SIZES), default=["small", "medium"],
                        help="sizes for the MLM step, its MFU and peak memory (none to skip)")
    parser.add_argument("--finetune-sizes", nargs="*", choices=list(SIZES), default=["medium", "original"],
                        help="sizes for the SST-2 fine-tuning step (none to skip)")
    parser.add_argument("--compiled", action="store_true",
                        help="fine-tuning also times ours under torch.compile (a minute a size on 2 cores)")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--steps", type=int, default=5, help="MLM steps per timed round")
    parser.add_argument("--finetune-steps", type=int, default=8,
                        help="fine-tuning steps per timed round, each on the next training batch of the epoch")
    parser.add_argument("--rounds", type=int, default=3,
                        help="alternating rounds; MLM: the median counts; fine-tuning: the total")
    parser.add_argument("--memory-steps", type=int, default=3, help="steps run to find the peak memory")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--measure-memory", choices=["ours", "transformers"], help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def print_mfu_table(sizes: list[str], rates: dict, batch_size: int, dtype: torch.dtype, peak: float):
    """MFU against the matmul peak of the dtype the step runs in (float32 where the CPU lacks bf16)."""
    name = dtype_name(dtype)
    print()
    print("MFU of the MLM step: useful FLOPs (encoder on all tokens; the last layer but for its keys and values,\n"
          "and the head, on the 15% masked slots; transformers' last layer and head on all 128 positions are extra\n"
          f"work, not counted) per second over the {name} peak")
    print()
    print(f"| size | useful GFLOP/step | ours GFLOP/s | ours MFU {name} | transformers GFLOP/s | "
          f"transformers MFU {name} |")
    print("|---|---:|---:|---:|---:|---:|")
    for size in sizes:
        flops = useful_flops_per_step(size, batch_size)
        per_second = {side: flops * rate / (batch_size * SEQ_LEN) for side, rate in rates[size].items()}
        cells = [f"{per_second[side] / 1e9:,.1f} | {per_second[side] / peak:.0%}" for side in ("ours", "transformers")]
        print(f"| {size} | {flops / 1e9:,.1f} | {cells[0]} | {cells[1]} |", flush=True)


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def print_mlm_tables(args, device, dtype, peak: float, source: str):
    print()
    print("MLM training step")
    print()
    print("| size | layers x width | ours tokens/s | transformers tokens/s | ours / transformers |")
    print("|---|---|---:|---:|---:|")
    rates = {}
    for size in args.sizes:
        rates[size] = compare(size, args.batch_size, args.steps, args.rounds, device, dtype)
        layers, width, _ = SIZES[size]
        print(f"| {size} | {layers} x {width} | {rates[size]['ours']:,.0f} | {rates[size]['transformers']:,.0f} | "
              f"{rates[size]['ours'] / rates[size]['transformers']:.2f}x |", flush=True)
    if source == MEASURED_NOW:  # the higher of two measurements, as training keeps
        peak = max(peak, measure_matmul_flops(device, dtype))
        print(f"\nmatmul peak measured again after the steps: the higher, {peak / 1e9:,.1f} GFLOP/s, kept")
    print_mfu_table(args.sizes, rates, args.batch_size, dtype, peak)
    print()
    where = "torch.cuda.max_memory_allocated" if device.type == "cuda" else "peak RSS (VmHWM) growth"
    print(f"Peak memory of the MLM step ({where} over {args.memory_steps} steps, a fresh process per cell)")
    print()
    print("| size | ours MiB | transformers MiB | ours / transformers |")
    print("|---|---:|---:|---:|")
    for size in args.sizes:
        mib = {side: peak_memory_mib(side, size, args.batch_size, args.memory_steps, device)
               for side in ("ours", "transformers")}
        print(f"| {size} | {mib['ours']:,.0f} | {mib['transformers']:,.0f} | "
              f"{mib['ours'] / mib['transformers']:.2f}x |", flush=True)


def print_finetuning_table(args, device, dtype):
    epoch, vocab = sst2_epoch(args.batch_size)
    batches = args.rounds * args.finetune_steps
    arms = finetuning_arms(args.compiled)
    mine = [arm for arm in arms if arm.startswith("ours")]
    print()
    print(f"SST-2 fine-tuning over the same {batches * args.batch_size} real training sentences (the first {batches} "
          f"of the epoch's {len(epoch)} batches of {args.batch_size}, drawn as our trainer draws them); "
          f"{args.rounds} rounds of {args.finetune_steps} steps, every arm in turn, each round starting one later; "
          f"total sentences over total seconds. Arms: " + "; ".join(f"{arm}: {how}" for arm, (_, how) in arms.items()))
    print()
    print("| size | arm | mean width | sentences/s | " + " | ".join(f"{arm} / this" for arm in mine) + " |")
    print("|---|---|---:|---:|" + "---:|" * len(mine))
    floors = {}
    for size in args.finetune_sizes:
        result = compare_finetuning(size, epoch, vocab, args.finetune_steps, args.rounds, device, dtype, args.compiled)
        layers, width, _ = SIZES[size]
        for arm in arms:  # ours first
            ratios = " | ".join("" if arm == each else f"{result[each]['rate'] / result[arm]['rate']:.2f}x"
                                for each in mine)
            print(f"| {layers} x {width} | {arm} | {result[arm]['width']:.1f} | {result[arm]['rate']:,.1f} | "
                  f"{ratios} |", flush=True)
        floor = kernel_floor(size, epoch[:batches], vocab, dtype) if device.type == "cpu" else None
        floors[size] = (result["transformers, dynamic padding"]["rate"], floor)
    print_floor_table(floors, batches * args.batch_size)


def print_floor_table(floors: dict, sentences: int):
    """How fast the same sentences could go at most: the step's kernels alone (kernel_floor), against
    3x transformers with dynamic padding."""
    print()
    print(f"The floor under the same {sentences} sentences: GEMMs, attention and AdamW each timed alone "
          f"(kernel_floor; CPU only)")
    print()
    print("| size | GEMMs s | attention s | AdamW s | at most sentences/s | 3x transformers, dynamic padding |")
    print("|---|---:|---:|---:|---:|---:|")
    for size, (theirs, floor) in floors.items():
        if floor:
            layers, width, _ = SIZES[size]
            print(f"| {layers} x {width} | {floor['GEMMs']:.3f} | {floor['attention']:.3f} | {floor['AdamW']:.3f} | "
                  f"{sentences / sum(floor.values()):,.1f} | {3 * theirs:,.1f} |", flush=True)


def main(argv=None):
    args = parse_args(argv)
    device = select_device(args.device)
    # the trainer's CPU allocator and kernel-cache settings, here for both sides: the ratios are the code's alone
    kept = device.type == "cpu" and keep_freed_memory()
    if device.type == "cpu":
        keep_kernels_for_every_width()
    if args.measure_memory:  # the subprocess peak_memory_mib starts
        mib = measure_memory(args.measure_memory, args.sizes[0], args.batch_size, args.steps, device)
        print(json.dumps({"mib": mib}))
        return
    dtype = fast_dtype(device)
    peak, source = peak_flops(device, dtype, 0.0)  # the trainer's and gpu_check.py's peak, found the same way
    print(f"device {device}, {torch.get_num_threads()} threads, autocast {dtype_name(dtype)}, "
          f"batch {args.batch_size} x {SEQ_LEN}, vocab {VOCAB_SIZE}, "
          f"median of {args.rounds} rounds of {args.steps} steps"
          f"{', freed memory and oneDNN kernels for every width kept (both sides)' if kept else ''}")
    print(f"matmul peak in {dtype_name(dtype)}: {peak / 1e9:,.1f} GFLOP/s, {source}")
    if args.sizes:
        print_mlm_tables(args, device, dtype, peak, source)
    if args.finetune_sizes:
        print_finetuning_table(args, device, dtype)


if __name__ == "__main__":
    main()
