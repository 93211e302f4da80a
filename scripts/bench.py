"""Side-by-side speed of one MLM training step: ours against transformers.BertForMaskedLM.

Example:
    python scripts/bench.py                       # small and medium sizes, on this machine
    python scripts/bench.py --sizes small medium original --steps 10

Both models get the same config, the same real batch (demo shards when present), the same
thread count and their best dtype on the device (bf16 autocast where supported). Ours masks
with src/masking.py and scores only the masked positions, with fused AdamW as the trainer
uses it; theirs masks as DataCollatorForLanguageModeling does and uses torch AdamW. The two
are timed in alternating rounds in one process, so drift in the machine hits both alike.
"""
import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))
from masking import IGNORE_INDEX, MaskingRule, mask_tokens  # noqa: E402
from model import BertForMaskedLM, ModelConfig  # noqa: E402
from trainer import select_device, select_dtype  # noqa: E402

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


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", nargs="+", choices=list(SIZES), default=["small", "medium"])
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--steps", type=int, default=5, help="steps per timed round")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds; the median counts")
    parser.add_argument("--device", default="auto")
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    device = select_device(args.device)
    dtype = select_dtype("auto", device)
    print(f"device {device}, {torch.get_num_threads()} threads, autocast {str(dtype).removeprefix('torch.')}, "
          f"batch {args.batch_size} x {SEQ_LEN}, vocab {VOCAB_SIZE}, median of {args.rounds} rounds of {args.steps} steps")
    print("| size | layers x width | ours tokens/s | transformers tokens/s | ours / transformers |")
    print("|---|---|---:|---:|---:|")
    for size in args.sizes:
        result = compare(size, args.batch_size, args.steps, args.rounds, device, dtype)
        layers, width, _ = SIZES[size]
        print(f"| {size} | {layers} x {width} | {result['ours']:,.0f} | {result['transformers']:,.0f} | "
              f"{result['ours'] / result['transformers']:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
