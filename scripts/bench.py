"""Side by side, ours against transformers: MLM step speed, MFU, peak memory, fine-tuning speed.

Example:
    python scripts/bench.py                       # MLM at small and medium, fine-tuning at medium and original
    python scripts/bench.py --sizes small medium original --steps 10

Both models get the same config, the same real batch (demo shards when present), the same
thread count and their best dtype on the device (bf16 autocast where supported). Ours masks
with src/masking.py and scores only the masked positions, with fused AdamW as the trainer
uses it; theirs masks as DataCollatorForLanguageModeling does and uses torch AdamW. The two
are timed in alternating rounds in one process, so drift in the machine hits both alike.

MFU counts the FLOPs a step needs (model.flops_per_token with the head on the masked slots
only) for both sides, over the matmul peak measured in the same run. Fine-tuning uses real
SST-2 sentences from demo/ (build it with scripts/make_demo.py): ours pads a batch to its
longest sentence, theirs to 128 as run_glue does. Peak memory is measured in a fresh
subprocess per side and size (peak RSS growth on CPU, max_memory_allocated on CUDA).
"""
import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))
from masking import IGNORE_INDEX, MaskingRule, mask_tokens, predictions_per_sequence  # noqa: E402
from model import BertForMaskedLM, BertForSequenceClassification, ModelConfig, flops_per_token  # noqa: E402
from trainer import measure_matmul_flops, select_device, select_dtype  # noqa: E402

SIZES = {"small": (2, 128, 2), "medium": (4, 256, 4), "original": (6, 768, 12)}  # layers, width, heads
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


class Ours:
    name = "ours"

    def __init__(self, layers, width, heads, device, dtype):
        config = ModelConfig(vocab_size=VOCAB_SIZE, max_len=SEQ_LEN, d_model=width, heads=heads, n_layer=layers,
                             d_ff=4 * width, dropout=0.1)
        self.model = BertForMaskedLM(config).to(device)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-4, fused=True)
        self.device, self.dtype = device, dtype
        self.generator = torch.Generator(device=device).manual_seed(0)

    def step(self, ids):
        inputs, positions, labels = mask_tokens(ids, SPECIAL_IDS, MASK_ID, VOCAB_SIZE, MaskingRule(), self.generator)
        with torch.autocast(self.device.type, dtype=self.dtype, enabled=self.dtype != torch.float32):
            _, loss = self.model(inputs, positions, labels)
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)


class Theirs:
    name = "transformers"

    def __init__(self, layers, width, heads, device, dtype):
        from transformers import BertConfig
        from transformers import BertForMaskedLM as HuggingFaceBert
        config = BertConfig(vocab_size=VOCAB_SIZE, hidden_size=width, num_hidden_layers=layers,
                            num_attention_heads=heads, intermediate_size=4 * width,
                            max_position_embeddings=SEQ_LEN, attn_implementation="sdpa")
        self.model = HuggingFaceBert(config).to(device)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-4)
        self.device, self.dtype = device, dtype
        self.generator = torch.Generator().manual_seed(0)

    def step(self, ids):
        inputs, labels = collator_masking(ids.cpu(), self.generator)
        with torch.autocast(self.device.type, dtype=self.dtype, enabled=self.dtype != torch.float32):
            loss = self.model(input_ids=inputs.to(self.device), labels=labels.to(self.device)).loss
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)


def seconds_per_step(runner, ids, steps: int, device) -> float:
    synchronize = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    synchronize()
    started = time.perf_counter()
    for _ in range(steps):
        runner.step(ids)
    synchronize()
    return (time.perf_counter() - started) / steps


def compare(size: str, batch_size: int, steps: int, rounds: int, device, dtype) -> dict:
    layers, width, heads = SIZES[size]
    ids = real_batch(batch_size).to(device)
    runners = [Ours(layers, width, heads, device, dtype), Theirs(layers, width, heads, device, dtype)]
    for runner in runners:
        seconds_per_step(runner, ids, 2, device)  # warm-up: allocator, kernels, optimizer state
    timings = {runner.name: [] for runner in runners}
    for _ in range(rounds):
        for runner in runners:
            timings[runner.name].append(seconds_per_step(runner, ids, steps, device))
    tokens = batch_size * SEQ_LEN
    return {name: tokens / statistics.median(times) for name, times in timings.items()}


def mlm_config(size: str) -> ModelConfig:
    layers, width, heads = SIZES[size]
    return ModelConfig(vocab_size=VOCAB_SIZE, max_len=SEQ_LEN, d_model=width, heads=heads, n_layer=layers,
                       d_ff=4 * width)


def useful_flops_per_step(size: str, batch_size: int) -> float:
    """Training FLOPs one MLM step needs: encoder on every token, head on the masked slots only.
    Transformers runs its head on all 128 positions, but that extra work is not counted."""
    predictions_per_token = predictions_per_sequence(SEQ_LEN, MaskingRule().mask_rate) / SEQ_LEN
    return flops_per_token(mlm_config(size), SEQ_LEN, predictions_per_token) * batch_size * SEQ_LEN


# ----------------------------------------------------------------------------- fine-tuning

def sst2_batch(batch_size: int, seed: int = 0):
    """A random batch of real SST-2 training sentences: the encoded set and the chosen rows."""
    from classification_dataset import EncodedSentences, read_sentences
    from vocab import load_vocab
    path = ROOT / "demo" / "datasets" / "train-00000-of-00001.parquet"
    if not path.is_file():
        sys.exit(f"{path}: not found; the fine-tuning benchmark needs the demo (python scripts/make_demo.py)")
    vocab = load_vocab(ROOT / "demo" / "vocab")
    encoded = EncodedSentences(read_sentences(path), vocab, SEQ_LEN)
    rows = np.random.default_rng(seed).choice(len(encoded), batch_size, replace=False)
    return encoded, rows, vocab


class OursClassifier:
    name = "ours"

    def __init__(self, size, vocab, device, dtype):
        layers, width, heads = SIZES[size]
        config = ModelConfig(vocab_size=vocab.size, max_len=SEQ_LEN, d_model=width, heads=heads, n_layer=layers,
                             d_ff=4 * width, dropout=0.1, pad_id=vocab.pad_id, num_labels=2)
        self.model = BertForSequenceClassification(config).to(device)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-4, fused=True)
        self.device, self.dtype = device, dtype

    def step(self, batch):
        with torch.autocast(self.device.type, dtype=self.dtype, enabled=self.dtype != torch.float32):
            _, loss = self.model(batch["input_ids"], batch["labels"], attention_mask=batch["attention_mask"])
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)


class TheirsClassifier:
    name = "transformers"

    def __init__(self, size, vocab, device, dtype):
        from transformers import BertConfig
        from transformers import BertForSequenceClassification as HuggingFaceClassifier
        layers, width, heads = SIZES[size]
        config = BertConfig(vocab_size=vocab.size, hidden_size=width, num_hidden_layers=layers,
                            num_attention_heads=heads, intermediate_size=4 * width, pad_token_id=vocab.pad_id,
                            max_position_embeddings=SEQ_LEN, num_labels=2, attn_implementation="sdpa")
        self.model = HuggingFaceClassifier(config).to(device)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-4)
        self.device, self.dtype = device, dtype

    def step(self, batch):
        with torch.autocast(self.device.type, dtype=self.dtype, enabled=self.dtype != torch.float32):
            loss = self.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                              labels=batch["labels"]).loss
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)


def compare_finetuning(size: str, batch_size: int, steps: int, rounds: int, device, dtype) -> dict:
    """Sentences/s of one fine-tuning step on the same SST-2 batch: ours padded to the batch's
    longest sentence (rounded up to 8, as EncodedSentences.batch does), theirs padded to 128."""
    from batching import gather_padded
    encoded, rows, vocab = sst2_batch(batch_size)
    ours_batch = encoded.batch(rows, vocab.pad_id)
    ids, real = gather_padded(encoded.tokens, encoded.offsets, rows, SEQ_LEN, vocab.pad_id)
    batches = {"ours": {key: torch.as_tensor(value).to(device) for key, value in ours_batch.items()},
               "transformers": {"input_ids": torch.as_tensor(ids).to(device),
                                "attention_mask": torch.as_tensor(real).long().to(device),
                                "labels": torch.as_tensor(encoded.labels[rows]).to(device)}}
    runners = [OursClassifier(size, vocab, device, dtype), TheirsClassifier(size, vocab, device, dtype)]
    for runner in runners:
        seconds_per_step(runner, batches[runner.name], 2, device)
    timings = {runner.name: [] for runner in runners}
    for _ in range(rounds):
        for runner in runners:
            timings[runner.name].append(seconds_per_step(runner, batches[runner.name], steps, device))
    result = {name: batch_size / statistics.median(times) for name, times in timings.items()}
    result["ours_width"] = ours_batch["input_ids"].shape[1]
    return result


# ----------------------------------------------------------------------------- peak memory

def measure_memory(side: str, size: str, batch_size: int, steps: int, device) -> float:
    """MiB one side's MLM training (model, gradients, AdamW state, activations) adds at its peak.
    Meant for a fresh process (see peak_memory_mib), where nothing else has raised the peak."""
    import transformers  # noqa: F401  imported before the baseline by both sides alike
    dtype = select_dtype("auto", device)
    ids = real_batch(batch_size).to(device)
    layers, width, heads = SIZES[size]
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
    else:
        before = peak_rss_bytes()
    runner = (Ours if side == "ours" else Theirs)(layers, width, heads, device, dtype)
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
    parser.add_argument("--sizes", nargs="+", choices=list(SIZES), default=["small", "medium"],
                        help="sizes for the MLM step, its MFU and peak memory")
    parser.add_argument("--finetune-sizes", nargs="*", choices=list(SIZES), default=["medium", "original"],
                        help="sizes for the SST-2 fine-tuning step (none to skip)")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--steps", type=int, default=5, help="MLM steps per timed round")
    parser.add_argument("--finetune-steps", type=int, default=2, help="fine-tuning steps per timed round")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds; the median counts")
    parser.add_argument("--memory-steps", type=int, default=3, help="steps run to find the peak memory")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--measure-memory", choices=["ours", "transformers"], help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    device = select_device(args.device)
    if args.measure_memory:  # the subprocess peak_memory_mib starts
        mib = measure_memory(args.measure_memory, args.sizes[0], args.batch_size, args.steps, device)
        print(json.dumps({"mib": mib}))
        return
    dtype = select_dtype("auto", device)
    peaks = {name: measure_matmul_flops(device, peak_dtype) for name, peak_dtype in
             (("bf16", torch.bfloat16), ("fp32", torch.float32))}
    print(f"device {device}, {torch.get_num_threads()} threads, autocast {str(dtype).removeprefix('torch.')}, "
          f"batch {args.batch_size} x {SEQ_LEN}, vocab {VOCAB_SIZE}, median of {args.rounds} rounds of {args.steps} steps")
    print(f"measured matmul peak (1024^3): bf16 {peaks['bf16'] / 1e9:,.1f} GFLOP/s, "
          f"fp32 {peaks['fp32'] / 1e9:,.1f} GFLOP/s")
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
    print()
    print("MFU of the MLM step: useful FLOPs (encoder on all tokens, head on the 15% masked slots;\n"
          "transformers' head on all 128 positions is extra work, not counted) per second over the peak")
    print()
    print("| size | useful GFLOP/step | ours GFLOP/s | ours MFU bf16 | ours MFU fp32 | "
          "transformers GFLOP/s | transformers MFU bf16 | transformers MFU fp32 |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for size in args.sizes:
        flops = useful_flops_per_step(size, args.batch_size)
        per_second = {name: flops * rate / (args.batch_size * SEQ_LEN) for name, rate in rates[size].items()}
        cells = [f"{per_second[name] / 1e9:,.1f} | {per_second[name] / peaks['bf16']:.0%} | "
                 f"{per_second[name] / peaks['fp32']:.0%}" for name in ("ours", "transformers")]
        print(f"| {size} | {flops / 1e9:,.1f} | {cells[0]} | {cells[1]} |", flush=True)
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
    if not args.finetune_sizes:
        return
    print()
    print(f"SST-2 fine-tuning step, same {args.batch_size} real sentences: ours padded to the batch's longest "
          f"(rounded to 8), transformers to {SEQ_LEN}; median of {args.rounds} rounds of {args.finetune_steps} steps")
    print()
    print("| size | layers x width | ours width | ours sentences/s | transformers sentences/s | ours / transformers |")
    print("|---|---|---:|---:|---:|---:|")
    for size in args.finetune_sizes:
        result = compare_finetuning(size, args.batch_size, args.finetune_steps, args.rounds, device, dtype)
        layers, width, _ = SIZES[size]
        print(f"| {size} | {layers} x {width} | {result['ours_width']} | {result['ours']:,.1f} | "
              f"{result['transformers']:,.1f} | {result['ours'] / result['transformers']:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
