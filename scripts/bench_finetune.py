"""Fine-tuning side by side: this program against transformers' Trainer, from the same checkpoint.

Example:
    python scripts/bench_finetune.py --cp demo/runs/run0/checkpoints/best.pt --base-dir demo --seeds 3

The pre-trained checkpoint is exported with scripts/export_hf.py and fine-tuned twice per task and
seed with one recipe (the fine-tuning config, etc/templates/config_sst2_cpu.ini by default): by
this program (src/main.py's run), and by transformers' Trainer as run_glue.py drives it (the same
learning rate, batch size, steps, warmup, cosine decay to min-learning-rate, weight decay, Adam
betas, gradient clip, dropout, dtype, length-grouped batches, validation every val-interval steps
with the best model kept), each then scored on the test split. Tasks: SST-2 from the demo's data,
and a sentence-pair task built from the demo's IMDB reviews (do the two sentences come from the same
review? MRPC's layout and metrics: F1 and accuracy), so that segment ids and pair encoding are compared too;
GLUE's own pair tasks keep their test labels back. Prints the scores per seed, their means, Welch's p and the
ratio of wall-clock times. Run it alone on the machine: the times are compared.
"""
import argparse
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from scipy.stats import ttest_ind

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "scripts"))
import checkpoints  # noqa: E402
from errors import UserError, exit_on_user_error  # noqa: E402
from ini import load_config  # noqa: E402
from main import run  # noqa: E402
from interop import hf_export  # noqa: E402
from tasks import glue_data  # noqa: E402
from tasks import glue_metrics  # noqa: E402
from tasks import glue_tasks  # noqa: E402
import export_hf  # noqa: E402

RECIPE = ROOT / "etc" / "templates" / "config_sst2_cpu.ini"
SPLITS = ("train", "validation", "test")


PAIRS_PER_SPLIT = {"train": 6000, "validation": 800, "test": 800}
SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


def review_sentences(review: str) -> list[str]:
    """A review's sentences of 5 to 40 words."""
    return [sentence for sentence in SENTENCE_END.split(review.strip()) if 5 <= len(sentence.split()) <= 40]


def same_review_pairs(corpus: Path, out_dir: Path, seed: int = 0) -> Path:
    """MRPC's layout from the corpus's reviews (one a line): two sentences, label 1 where both come
    from the same review, 0 where the second comes from another; the splits draw on disjoint reviews.
    Learnable from what the sentences share (names, the film's words), and only from both of them
    read together. Returns the glue directory."""
    rng = np.random.default_rng(seed)
    with open(corpus, encoding="utf-8") as lines:
        reviews = [sentences for sentences in map(review_sentences, lines) if len(sentences) >= 2]
    needed = sum(PAIRS_PER_SPLIT.values())
    if len(reviews) < 2 * needed:
        raise UserError(f"{corpus}: {len(reviews):,} reviews with two sentences of 5-40 words; "
                        f"the pair task needs {2 * needed:,}")
    order, start = rng.permutation(len(reviews)), 0
    (out_dir / "mrpc").mkdir(parents=True, exist_ok=True)
    for split, count in PAIRS_PER_SPLIT.items():
        firsts, others = order[start:start + count], order[start + count:start + 2 * count]
        start += 2 * count
        labels = rng.integers(0, 2, count)
        pairs = [rng.choice(reviews[first], 2, replace=False) if label else
                 (rng.choice(reviews[first]), rng.choice(reviews[other]))
                 for first, other, label in zip(firsts, others, labels)]
        table = pa.table({"sentence1": [str(a) for a, _ in pairs], "sentence2": [str(b) for _, b in pairs],
                          "label": labels.astype(np.int64), "idx": np.arange(count)})
        pq.write_table(table, out_dir / "mrpc" / f"{split}-00000-of-00001.parquet")
    return out_dir


def ours(config, checkpoint: Path) -> tuple[dict, float]:
    """This program's fine-tuning, then the test split scored with the best checkpoint."""
    started = time.perf_counter()
    run_dir = run(config, checkpoint, False)
    seconds = time.perf_counter() - started
    metrics = run(config, run_dir / "checkpoints" / "best.pt", test=True)
    return {name.removeprefix("test_"): value for name, value in metrics.items()}, seconds


def theirs(export_dir: Path, native: bool, config, data_dir: Path, task: str, seed: int,
           work: Path) -> tuple[dict, float]:
    """transformers' Trainer with the same recipe, then the test split with the best model."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer, Trainer, TrainingArguments
    glue_task = glue_tasks.TASKS[task]
    tokenizer = AutoTokenizer.from_pretrained(export_dir, trust_remote_code=True)
    recipe = ({"hidden_dropout_prob": config.dropout, "attention_probs_dropout_prob": config.dropout} if native
              else {"dropout": config.dropout, "pooling": config.pooling})
    model = AutoModelForSequenceClassification.from_pretrained(
        export_dir, trust_remote_code=True, num_labels=glue_task.num_labels, **recipe)

    def encoded(split: str) -> list[dict]:
        examples = glue_data.read_split(data_dir, task, split)
        texts = (examples.first,) if examples.second is None else (examples.first, examples.second)
        features = tokenizer(*texts, truncation=True, max_length=config.seq_len)
        return [{**{key: values[row] for key, values in features.items()}, "labels": int(examples.labels[row])}
                for row in range(len(examples.first))]

    def compute_metrics(prediction) -> dict:
        metrics = glue_metrics.task_metrics(glue_task, prediction.label_ids, prediction.predictions.argmax(-1))
        return metrics | {"score": glue_metrics.task_score(glue_task, metrics)}

    arguments = TrainingArguments(
        output_dir=str(work), seed=seed, data_seed=seed, max_steps=config.max_iters,
        per_device_train_batch_size=config.batch_size, per_device_eval_batch_size=config.batch_size,
        learning_rate=config.learning_rate, lr_scheduler_type="cosine_with_min_lr",
        lr_scheduler_kwargs={"min_lr": config.min_learning_rate}, warmup_steps=config.warmup_iters,
        weight_decay=config.weight_decay, adam_beta1=config.beta1, adam_beta2=config.beta2,
        max_grad_norm=config.grad_clip or 1e9,
        train_sampling_strategy="group_by_length" if config.length_grouping else "random",
        bf16=config.dtype in ("auto", "bfloat16"), use_cpu=config.device == "cpu",
        eval_strategy="steps", eval_steps=config.val_interval, save_strategy="steps", save_steps=config.val_interval,
        save_total_limit=1, load_best_model_at_end=True, metric_for_best_model="score",
        logging_steps=config.log_interval, report_to=[], dataloader_num_workers=0, disable_tqdm=True)
    trainer = Trainer(model=model, args=arguments, train_dataset=encoded("train"), eval_dataset=encoded("validation"),
                      processing_class=tokenizer, compute_metrics=compute_metrics)
    started = time.perf_counter()
    trainer.train()
    seconds = time.perf_counter() - started
    metrics = trainer.evaluate(encoded("test"), metric_key_prefix="test")
    return {name.removeprefix("test_"): value for name, value in metrics.items()}, seconds


def row(task: str, side: str, scores: list[float], seconds: list[float]) -> str:
    spread = f" +- {statistics.stdev(scores):.1%}" if len(scores) > 1 else ""
    per_seed = ", ".join(f"{score:.1%}" for score in scores)
    mean, seconds = statistics.mean(scores), statistics.median(seconds)
    return f"| {task} | {side} | {mean:.1%}{spread} | {per_seed} | {seconds:.0f} |"


def compare(args, checkpoint: dict, work: Path):
    export_dir = work / "hf"
    export_hf.export(args.cp, export_dir)
    pooling = ["--pooling", "cls"] if hf_export.is_native(checkpoint) else []  # transformers' BERT pools [CLS] only
    architecture = [item for key in checkpoints.ARCHITECTURE_KEYS
                    for item in (f"--{key.replace('_', '-')}", str(checkpoint["model_config"][key]))]
    data_dirs = {"sst2": args.base_dir / "datasets"}
    if "mrpc" in args.tasks:
        data_dirs["mrpc"] = same_review_pairs(args.base_dir / "input" / "imdb.txt", work / "pairs")
    print("| task | fine-tuned by | test score (mean +- sd) | per seed | seconds (median) |\n|---|---|---|---|---|")
    for task in args.tasks:
        results = {"this program": ([], []), "transformers Trainer": ([], [])}
        for seed in range(args.seeds):
            overrides = ["--base-dir", str(args.base_dir), "--task-type", task, "--seed", str(seed),
                         "--glue-dir", str(data_dirs[task].resolve()), *pooling,
                         *architecture, *args.overrides]
            config = load_config(args.recipe, overrides)
            metrics, seconds = ours(config, args.cp)
            results["this program"][0].append(score_of(task, metrics))
            results["this program"][1].append(seconds)
            metrics, seconds = theirs(export_dir, bool(pooling), config, data_dirs[task], task, seed,
                                      work / f"trainer-{task}-{seed}")
            results["transformers Trainer"][0].append(score_of(task, metrics))
            results["transformers Trainer"][1].append(seconds)
        for side, (scores, seconds) in results.items():
            print(row(task, side, scores, seconds), flush=True)
        (our_scores, our_seconds), (their_scores, their_seconds) = results.values()
        p = ttest_ind(our_scores, their_scores, equal_var=False).pvalue if args.seeds > 1 else float("nan")
        ratio = statistics.median(their_seconds) / statistics.median(our_seconds)
        print(f"{task}: difference {statistics.mean(our_scores) - statistics.mean(their_scores):+.1%} "
              f"(Welch p = {p:.2f}); transformers takes {ratio:.2f}x our time", flush=True)


def score_of(task: str, metrics: dict) -> float:
    return glue_metrics.task_score(glue_tasks.TASKS[task], metrics)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cp", type=Path, required=True, help="a pre-trained checkpoint (mlm, clm or electra)")
    parser.add_argument("--base-dir", type=Path, default=Path("demo"), help="holds datasets/ with SST-2 (the demo's)")
    parser.add_argument("--recipe", type=Path, default=RECIPE, help="the fine-tuning config both sides follow")
    parser.add_argument("--tasks", nargs="+", default=["sst2", "mrpc"], choices=["sst2", "mrpc"])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("overrides", nargs="*", help="--key value pairs for the recipe (after --)")
    return parser.parse_args(argv)


@exit_on_user_error
def main(argv=None):
    args = parse_args(argv)
    checkpoint = checkpoints.load(args.cp)
    if checkpoint["task"] not in ("mlm", "clm", "electra"):
        raise UserError(f"{args.cp}: a {checkpoint['task']} checkpoint; expected a pre-trained one (mlm, clm, electra)")
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory(prefix="bench_finetune.") as work:
        compare(args, checkpoint, Path(work))


if __name__ == "__main__":
    main()
