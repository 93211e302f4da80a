"""The pre-training a user would otherwise run: transformers' BertForMaskedLM as run_mlm.py trains it,
on this program's corpus and vocabulary, written as a checkpoint of ours to fine-tune beside ours.

Example (the anchor of etc/results/pretraining.md's recipe comparison; N: the steps the budget buys, measured
with --measure on the same machine beside this program's step):
    python scripts/bench_pretrain.py --config etc/templates/config_cpu.ini --base-dir demo --measure 60
    python scripts/bench_pretrain.py --config etc/templates/config_cpu.ini --base-dir demo --max-steps N -o demo/hf_mlm
    python src/main.py --config etc/templates/config_sst2_cpu.ini --cp demo/hf_mlm/checkpoint.pt \\
        --norm postln --position learned

The model is BERT's layout (post-LN, learned positions, GELU, dropout 0.1, the MLM head over every
position) at the size of --config (d-model, heads, n-layer, d-ff, seq-len); the recipe is run_mlm.py's
defaults: batch 8, AdamW lr 5e-5 (betas 0.9/0.999, eps 1e-8, no weight decay), linear decay to 0 with
no warmup, gradient clip 1, float32, 15% masking shown 80/10/10 (DataCollatorForLanguageModeling), seed 42.
Any of those can be changed with its option. The samples are this program's training shards of --config
(the same packed 128-token rows, the held-out documents held out); run_mlm.py would cut the same text
into the same rows with group_texts. -o DIR gets the transformers directory (DIR/hf) and the checkpoint
(DIR/checkpoint.pt, hf_import.py's conversion).
"""
import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "scripts"))
from errors import UserError, exit_on_user_error  # noqa: E402
from ini import load_config  # noqa: E402
from tasks.lm_data import split_pattern  # noqa: E402
from shards import find_shards, read_shard  # noqa: E402
from interop import hf_import  # noqa: E402


def training_rows(config) -> list[dict]:
    """Every training sample of the config's shards, as the token ids a collator pads."""
    rows = []
    for path in find_shards(config.datasets_path, split_pattern(config, "train")):
        shard = read_shard(path)
        rows += [{"input_ids": shard.sample(index).tolist()} for index in range(len(shard))]
    return rows


def bert_for_masked_lm(config, vocab_size: int):
    """transformers' BertForMaskedLM at the config's size, BERT's defaults otherwise."""
    from transformers import BertConfig, BertForMaskedLM
    return BertForMaskedLM(BertConfig(vocab_size=vocab_size, hidden_size=config.d_model,
                                      num_hidden_layers=config.n_layer, num_attention_heads=config.heads,
                                      intermediate_size=config.feed_forward_size,
                                      max_position_embeddings=config.seq_len))


def trainer(args, config, output: Path, max_steps: int):
    from transformers import (BertTokenizerFast, DataCollatorForLanguageModeling, Trainer, TrainingArguments,
                              set_seed)
    set_seed(args.seed)
    tokenizer = BertTokenizerFast(str(config.vocab_path / "vocab.txt"))
    model = bert_for_masked_lm(config, len(tokenizer))
    arguments = TrainingArguments(
        output_dir=str(output), max_steps=max_steps, per_device_train_batch_size=args.batch_size,
        learning_rate=args.learning_rate, weight_decay=args.weight_decay, warmup_steps=args.warmup_steps,
        lr_scheduler_type="linear", max_grad_norm=1.0, seed=args.seed, logging_steps=max(1, max_steps // 50),
        save_strategy="no", report_to=[], use_cpu=config.device == "cpu", dataloader_num_workers=0)
    collator = DataCollatorForLanguageModeling(tokenizer, mlm_probability=args.mask_rate)
    return Trainer(model=model, args=arguments, train_dataset=training_rows(config), data_collator=collator), tokenizer


def measure(args, config, seconds: float) -> float:
    """transformers' steps per second over `seconds`, after 10 steps of warm-up."""
    from transformers import TrainerCallback

    class Clock(TrainerCallback):
        def __init__(self):
            self.started, self.steps, self.elapsed = None, 0, 0.0

        def on_step_end(self, arguments, state, control, **kwargs):
            if state.global_step == 10:
                self.started = time.perf_counter()
            elif self.started is not None:
                self.steps, self.elapsed = self.steps + 1, time.perf_counter() - self.started
                control.should_training_stop = self.elapsed >= seconds
            return control

    with tempfile.TemporaryDirectory() as scratch:
        run, _ = trainer(args, config, Path(scratch), max_steps=10 ** 6)
        clock = Clock()
        run.add_callback(clock)
        run.train()
    return clock.steps / clock.elapsed


def pretrain(args, config) -> Path:
    output = args.output
    if output.exists() and any(output.iterdir()):
        raise UserError(f"{output} is not empty: choose a new -o directory")
    run, tokenizer = trainer(args, config, output / "trainer", args.max_steps)
    started = time.perf_counter()
    run.train()
    print(f"{args.max_steps} steps x {args.batch_size} x {config.seq_len} in {time.perf_counter() - started:.0f} s")
    run.save_model(str(output / "hf"))
    tokenizer.save_pretrained(str(output / "hf"))
    hf_import.convert(output / "hf", output / "checkpoint.pt")
    print(f"wrote {output / 'hf'} and {output / 'checkpoint.pt'}")
    return output / "checkpoint.pt"


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", type=Path, default=ROOT / "etc" / "templates" / "config_cpu.ini",
                        help="this program's pre-training config: the size, seq-len, data and device")
    parser.add_argument("--base-dir", help="overrides the config's base-dir")
    parser.add_argument("--max-steps", type=int, help="optimizer steps (the budget)")
    parser.add_argument("--measure", type=float, metavar="SECONDS", help="print steps per second and exit")
    parser.add_argument("-o", "--output", type=Path, help="directory for hf/ and checkpoint.pt")
    parser.add_argument("--batch-size", type=int, default=8, help="run_mlm.py's per-device default: 8")
    parser.add_argument("--learning-rate", type=float, default=5e-5)
    parser.add_argument("--weight-decay", type=float, default=0.0)
    parser.add_argument("--warmup-steps", type=int, default=0)
    parser.add_argument("--mask-rate", type=float, default=0.15)
    parser.add_argument("--seed", type=int, default=42)
    args = parser.parse_args(argv)
    if args.measure is None and (args.max_steps is None or args.output is None):
        parser.error("give --max-steps and -o, or --measure SECONDS")
    return args


@exit_on_user_error
def main(argv=None):
    args = parse_args(argv)
    overrides = ["--base-dir", args.base_dir] if args.base_dir else []
    config = load_config(args.config, overrides)
    if args.measure is not None:
        print(f"{measure(args, config, args.measure):.3f} steps/s at batch {args.batch_size} x {config.seq_len}")
        return
    pretrain(args, config)


if __name__ == "__main__":
    main()
