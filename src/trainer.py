"""The training loop shared by every task: schedule, optimizer, mixed precision, checkpoints, logs.

A task (MLM pre-training, sentence classification) supplies the model, the batches and the
loss; this file does everything else, the same way for all of them.
"""
import json
import math
import os
import signal
import sys
import time
from contextlib import nullcontext
from dataclasses import asdict
from pathlib import Path

import torch
from torch import nn
from tqdm import tqdm

from config import Config
from errors import UserError
from model import ModelConfig, count_parameters, flops_per_token
from vocab import Vocab

CHECKPOINT_FORMAT = 1


# ----------------------------------------------------------------------------- schedule

def cosine_lr(step: int, config: Config) -> float:
    """Learning rate at `step`: linear warmup to learning-rate over warmup-iters, then cosine
    decay to min-learning-rate at lr-decay-iters, then constant."""
    if step < config.warmup_iters:
        return config.learning_rate * (step + 1) / (config.warmup_iters + 1)
    if step >= config.lr_decay_iters:
        return config.min_learning_rate
    progress = (step - config.warmup_iters) / max(1, config.lr_decay_iters - config.warmup_iters)
    return config.min_learning_rate + 0.5 * (1 + math.cos(math.pi * progress)) * (
        config.learning_rate - config.min_learning_rate)


# ----------------------------------------------------------------------------- hardware

def select_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise UserError(f"device = {name}: CUDA is not available on this machine (use device = cpu or auto)")
    return torch.device(name)


def cpu_supports_bf16() -> bool:
    return torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()


def select_dtype(name: str, device: torch.device) -> torch.dtype:
    """Autocast dtype: bf16 where the hardware has it, else fp16 on CUDA (with a GradScaler), else fp32."""
    if name != "auto":
        return getattr(torch, name)
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return torch.bfloat16 if cpu_supports_bf16() else torch.float32


def measure_matmul_flops(device: torch.device, dtype: torch.dtype, size: int = 1024,
                         seconds: float = 0.3) -> float:
    """Peak matmul rate actually reached on this device: the denominator of MFU."""
    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn(size, size, device=device, dtype=dtype)
    synchronize = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    for _ in range(3):
        a @ b
    synchronize()
    count, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        for _ in range(10):
            a @ b
        count += 10
        synchronize()
    return 2 * size ** 3 * count / (time.perf_counter() - start)


# ----------------------------------------------------------------------------- optimizer

def make_optimizer(model: nn.Module, config: Config, log) -> torch.optim.AdamW:
    """AdamW with weight decay on matrices only (not on biases, norms), fused when asked."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": config.weight_decay},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    kwargs = dict(lr=config.learning_rate, betas=(config.beta1, config.beta2))
    if config.fused_adamw:
        try:
            return torch.optim.AdamW(groups, fused=True, **kwargs)
        except (RuntimeError, ValueError) as error:
            log(f"warning: fused AdamW is not supported here ({error}); using the default AdamW")
    return torch.optim.AdamW(groups, **kwargs)


# ----------------------------------------------------------------------------- checkpoints

def unwrap(model: nn.Module) -> nn.Module:
    """The plain model under torch.compile and DistributedDataParallel wrappers."""
    model = getattr(model, "_orig_mod", model)
    model = getattr(model, "module", model)
    return getattr(model, "_orig_mod", model)


def atomic_write(path: Path, write):
    """Write through a temp file in the same directory, then rename: never a half-written file."""
    temp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        write(temp)
        os.replace(temp, path)
    finally:
        temp.unlink(missing_ok=True)


def save_checkpoint(path: Path, state: dict):
    atomic_write(path, lambda temp: torch.save(state, temp))


def load_checkpoint(path: Path) -> dict:
    """A checkpoint of ours, loaded safely (tensors and plain types only)."""
    if not path.is_file():
        raise UserError(f"{path}: checkpoint not found")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # torch raises many kinds for a bad file
        raise UserError(f"{path}: not a readable checkpoint ({error.__class__.__name__})") from None
    if not isinstance(state, dict) or state.get("format") != CHECKPOINT_FORMAT:
        raise UserError(f"{path}: not a checkpoint of this program (format {CHECKPOINT_FORMAT} expected)")
    return state


def restore_model(path: Path, kinds: dict[str, type]) -> tuple[nn.Module, "Vocab", dict]:
    """The model a checkpoint holds, with its vocabulary, for inference; `kinds` maps the
    task names this caller accepts to model classes."""
    checkpoint = load_checkpoint(path)
    if checkpoint["task"] not in kinds:
        raise UserError(f"{path}: a {checkpoint['task']} checkpoint; expected {' or '.join(kinds)}")
    model = kinds[checkpoint["task"]](ModelConfig(**checkpoint["model_config"]))
    model.load_state_dict(checkpoint["model"])
    return model.eval(), Vocab(tuple(checkpoint["vocab"])), checkpoint


def model_config(config: Config, vocab) -> ModelConfig:
    """The model a config and vocabulary describe."""
    return ModelConfig(vocab_size=vocab.size, max_len=config.seq_len, d_model=config.d_model,
                       heads=config.heads, n_layer=config.n_layer, d_ff=config.feed_forward_size,
                       dropout=config.dropout, pad_id=vocab.pad_id, num_labels=config.num_labels)


def check_compatible(path: Path, checkpoint: dict, vocab, current: ModelConfig):
    """The checkpoint's model must be the one the config describes, with the same vocabulary."""
    if checkpoint.get("vocab_checksum") != vocab.checksum:
        raise UserError(f"{path}: made with another vocabulary than {vocab.path} (checksum differs)")
    for key, value in asdict(current).items():
        if key in ("dropout", "num_labels"):
            continue  # free to change between runs
        saved = checkpoint["model_config"].get(key)
        if saved != value:
            raise UserError(f"{path}: {key} is {saved} in the checkpoint but {value} "
                            f"from the config and vocabulary")


def rotate_checkpoints(directory: Path, keep: int, step: int):
    """checkpoint.pt is the latest; keep-1 older ones stay as checkpoint-STEP.pt."""
    latest = directory / "checkpoint.pt"
    if keep > 1 and latest.exists():
        os.replace(latest, directory / f"checkpoint-{step}.pt")
    older = sorted(directory.glob("checkpoint-*.pt"), key=lambda p: int(p.stem.split("-")[1]))
    for stale in older[:max(0, len(older) - (keep - 1))]:
        stale.unlink()


def rng_state(mask_generator: torch.Generator) -> dict:
    state = {"torch": torch.get_rng_state(), "mask": mask_generator.get_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def restore_rng(state: dict, mask_generator: torch.Generator):
    torch.set_rng_state(state["torch"])
    mask_generator.set_state(state["mask"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


# ----------------------------------------------------------------------------- run directory and logs

def create_run_dir(runs_dir: Path) -> Path:
    """runs/runN for the next free N; mkdir is the lock, so two runs never share one."""
    runs_dir.mkdir(parents=True, exist_ok=True)
    number = 0
    while True:
        run_dir = runs_dir / f"run{number}"
        try:
            run_dir.mkdir()
            return run_dir
        except FileExistsError:
            number += 1


def run_dir_of(checkpoint_path: Path) -> Path | None:
    """The run a checkpoint belongs to: runs/runN/checkpoints/checkpoint.pt -> runs/runN."""
    parent = checkpoint_path.resolve().parent
    return parent.parent if parent.name == "checkpoints" else None


class RunLog:
    """log.txt, the console (above the progress bar) and TensorBoard; silent off rank 0."""

    def __init__(self, run_dir: Path | None):
        self.file = None
        self.board = None
        if run_dir is not None:
            (run_dir / "logs").mkdir(parents=True, exist_ok=True)
            self.file = (run_dir / "logs" / "log.txt").open("a", encoding="utf-8")
            from torch.utils.tensorboard import SummaryWriter
            self.board = SummaryWriter(str(run_dir / "logs"))

    def __call__(self, message: str):
        if self.file is None:
            return
        tqdm.write(message)
        self.file.write(message + "\n")
        self.file.flush()

    def scalars(self, step: int, values: dict):
        if self.board is not None:
            for name, value in values.items():
                self.board.add_scalar(name, value, step)

    def close(self):
        if self.board is not None:
            self.board.close()
            self.file.close()


class StopRequest:
    """SIGINT, SIGTERM or a file named `stop` in the working directory: finish the step, save, exit."""

    def __init__(self):
        self.reason = None
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, self._on_signal)

    def _on_signal(self, signum, frame):
        self.reason = signal.Signals(signum).name

    def requested(self) -> bool:
        stop_file = Path("stop")
        if self.reason is None and stop_file.exists():
            stop_file.unlink(missing_ok=True)  # consumed, so the next run is not stopped too
            self.reason = "the file ./stop"
        return self.reason is not None


# ----------------------------------------------------------------------------- device transfer

def to_device(batch: dict, device: torch.device, non_blocking: bool) -> dict:
    """numpy arrays to device tensors; pinned host memory lets the copy overlap compute."""
    moved = {}
    for name, value in batch.items():
        if value is None:
            moved[name] = None
            continue
        tensor = torch.from_numpy(value)
        if device.type == "cuda" and non_blocking:
            tensor = tensor.pin_memory().to(device, non_blocking=True)
        else:
            tensor = tensor.to(device)
        moved[name] = tensor
    return moved


def prefetch(batches, device: torch.device, non_blocking: bool):
    """Yield (position, device batch) while the next batch is already assembled and on its way."""
    iterator = iter(batches)
    position, batch = next(iterator)
    upcoming = (position, to_device(batch, device, non_blocking))
    for position, batch in iterator:
        current, upcoming = upcoming, (position, to_device(batch, device, non_blocking))
        yield current
    yield upcoming


# ----------------------------------------------------------------------------- evaluation

@torch.no_grad()
def evaluate(model: nn.Module, task, batches, autocast) -> dict:
    """The task's metrics over the given batches, all ranks' together.

    task.loss returns the mean loss and a vector of additive statistics whose first entry
    is the number of predictions; sums stay on the device until the end.
    """
    model.eval()
    loss_sum, totals = torch.zeros((), device=task.device, dtype=torch.float64), 0
    for batch in batches:
        with autocast:
            loss, statistics = task.loss(model, batch, training=False)
        loss_sum += loss.double() * statistics[0]
        totals = totals + statistics.double()
    model.train()
    if isinstance(totals, int):
        raise UserError("the evaluation split has no batch: it holds fewer samples than batch-size")
    summed = torch.cat([loss_sum[None], totals])
    if torch.distributed.is_initialized():
        torch.distributed.all_reduce(summed)
    return task.metrics(summed[0].item() / summed[1].item(), summed[1:].cpu())


# ----------------------------------------------------------------------------- the loop

class Trainer:
    def __init__(self, config: Config, task, rank: int = 0, world_size: int = 1):
        self.config = config
        self.task = task
        self.rank = rank
        self.world_size = world_size
        self.device = task.device
        self.dtype = select_dtype(config.dtype, self.device)
        self.autocast = torch.autocast(self.device.type, dtype=self.dtype,
                                       enabled=self.dtype != torch.float32)

    def log_header(self, log, model: nn.Module, run_dir: Path):
        config = self.config
        log(f"run directory: {run_dir}")
        for line in config.describe():
            log(f"  {line}")
        global_batch = config.batch_size * config.grad_accum_steps * self.world_size
        log(f"model: {count_parameters(model) / 1e6:.2f}M parameters; device {self.device}, "
            f"autocast {str(self.dtype).removeprefix('torch.')}; global batch {global_batch} "
            f"({config.batch_size} x {config.grad_accum_steps} accumulation x {self.world_size} processes)")

    def fit(self, checkpoint_path: Path | None = None) -> Path:
        """Train from scratch, resume a run, or start a new task from a checkpoint."""
        config, task, device = self.config, self.task, self.device
        torch.manual_seed(config.seed + self.rank)
        model = task.build_model().to(device)
        mask_generator = torch.Generator(device=device)
        mask_generator.manual_seed(config.seed + 1000 + self.rank)

        checkpoint = load_checkpoint(checkpoint_path) if checkpoint_path else None
        resuming = checkpoint is not None and checkpoint["task"] == task.name
        step, position, best = 0, None, None
        run_dir = run_dir_of(checkpoint_path) if resuming else None
        is_writer = self.rank == 0
        if run_dir is None and is_writer:
            run_dir = create_run_dir(Path(config.runs_dir))
        log = RunLog(run_dir if is_writer else None)
        if checkpoint is not None:
            task.load_weights(model, checkpoint, checkpoint_path, resuming, log)
        optimizer = make_optimizer(model, config, log)
        if resuming:
            optimizer.load_state_dict(checkpoint["optimizer"])
            restore_rng(checkpoint["rng"], mask_generator)
            step, best = checkpoint["step"], checkpoint["best"]
            position = checkpoint["data_position"]
            log(f"resuming {checkpoint_path} at step {step}")
        self.log_header(log, model, run_dir)

        scaler = torch.amp.GradScaler(device.type, enabled=self.dtype == torch.float16)
        compiled = torch.compile(model) if config.compile else model
        stop = StopRequest()
        checkpoints_dir = run_dir / "checkpoints" if run_dir else None

        def save(kind: str):
            if not is_writer:
                return
            checkpoints_dir.mkdir(parents=True, exist_ok=True)
            state = {"format": CHECKPOINT_FORMAT, "task": task.name, "step": step,
                     "model": unwrap(model).state_dict(), "optimizer": optimizer.state_dict(),
                     "config": config.to_dict(), "model_config": asdict(unwrap(model).config),
                     "vocab_checksum": task.vocab.checksum, "vocab": list(task.vocab.tokens), "data_position": position,
                     "rng": rng_state(mask_generator), "best": best}
            if kind == "best":
                save_checkpoint(checkpoints_dir / "best.pt", state)
            else:
                rotate_checkpoints(checkpoints_dir, config.max_checkpoints, step)
                save_checkpoint(checkpoints_dir / "checkpoint.pt", state)

        batches = prefetch(task.train_batches(position), device, config.async_to_device)
        flops = flops_per_token(unwrap(model).config, config.seq_len, task.predictions_per_token)
        peak = measure_matmul_flops(device, self.dtype) if is_writer else 1.0
        tokens_per_step = config.batch_size * config.seq_len * config.grad_accum_steps * self.world_size
        # disable=None: a bar on a terminal, none in CI logs (the log lines say the same).
        progress = tqdm(total=config.max_iters, initial=step, disable=None if is_writer else True,
                        dynamic_ncols=True)
        loss_sum = torch.zeros((), device=device)
        finite = torch.ones((), dtype=torch.bool, device=device)
        last_log_time, last_log_step = time.perf_counter(), step
        stopped_by = None

        while step < config.max_iters:
            lr = cosine_lr(step, config)
            for group in optimizer.param_groups:
                group["lr"] = lr
            for micro in range(config.grad_accum_steps):
                position, batch = next(batches)
                sync = micro == config.grad_accum_steps - 1
                with (nullcontext() if sync or self.world_size == 1 else compiled.no_sync()):
                    with self.autocast:
                        loss, _ = task.loss(compiled, batch, training=True, generator=mask_generator)
                    scaler.scale(loss / config.grad_accum_steps).backward()
                loss_sum += loss.detach().float()
                finite &= torch.isfinite(loss.detach())
            if config.grad_clip > 0:
                scaler.unscale_(optimizer)
                nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad(set_to_none=True)
            step += 1
            progress.update(1)

            at_log = step % config.log_interval == 0 or step == config.max_iters
            at_val = step % config.val_interval == 0 or step == config.max_iters
            if stop.requested():
                stopped_by = stop.reason
            if at_log or at_val or stopped_by:
                if not finite.item():
                    raise UserError(f"loss is not finite (nan or inf) near step {step}: run stopped; "
                                    f"the last good checkpoint is in {checkpoints_dir}")
            if at_log:
                elapsed = time.perf_counter() - last_log_time
                steps = step - last_log_step
                mean_loss = loss_sum.item() / (steps * config.grad_accum_steps)
                tokens_per_sec = tokens_per_step * steps / elapsed
                mfu = flops * tokens_per_sec / self.world_size / peak
                log(f"step {step} | loss {mean_loss:.4f} | lr {lr:.2e} | {tokens_per_sec:,.0f} tok/s | mfu {mfu:.1%}")
                log.scalars(step, {"train/loss": mean_loss, "train/lr": lr,
                                   "train/tokens_per_sec": tokens_per_sec, "train/mfu": mfu})
                progress.set_postfix(loss=f"{mean_loss:.3f}")
                loss_sum.zero_()
                last_log_time, last_log_step = time.perf_counter(), step
            if at_val:
                metrics = evaluate(compiled, task, task.eval_batches("val", config.val_iters), self.autocast)
                log(f"step {step} | " + " | ".join(f"val {name} {value:.4f}" for name, value in metrics.items()))
                log.scalars(step, {f"val/{name}": value for name, value in metrics.items()})
                if is_writer:
                    log(task.show_predictions(compiled, self.autocast))
                score = metrics[task.best_metric]
                improved = best is None or (score < best if task.lower_is_better else score > best)
                if improved:
                    best = score
                    save("best")
                save("latest")
                last_log_time = time.perf_counter()  # evaluation time is not training throughput
            if stopped_by:
                if not at_val:
                    save("latest")
                log(f"stopped by {stopped_by} at step {step}; checkpoint saved in {checkpoints_dir}")
                break
        progress.close()
        log.close()
        return run_dir

    def test(self, checkpoint_path: Path) -> dict:
        """Score a checkpoint on the test split and save the metrics in its run directory;
        where the labels are hidden (GLUE), write the predictions as a submission file instead."""
        checkpoint = load_checkpoint(checkpoint_path)
        model = self.task.build_model().to(self.device)
        self.task.load_weights(model, checkpoint, checkpoint_path, resuming=True)
        run_dir = run_dir_of(checkpoint_path) or checkpoint_path.parent
        step = checkpoint["step"]
        if self.task.labels_hidden("test"):
            predictions, index = self.task.predict(model, "test", self.autocast)
            target = run_dir / f"test_predictions_step{step}.tsv"
            lines = ["index\tprediction"] + [f"{i}\t{p}" for i, p in zip(index, predictions)]
            atomic_write(target, lambda temp: temp.write_text("\n".join(lines) + "\n"))
            print(f"the test labels are hidden: wrote {len(predictions)} predictions to {target}")
            return {"predictions": str(target)}
        metrics = evaluate(model, self.task, self.task.eval_batches("test", None), self.autocast)
        metrics = {"checkpoint": str(checkpoint_path), "step": step,
                   **{f"test_{name}": value for name, value in metrics.items()}}
        target = run_dir / f"test_metrics_step{step}.json"
        atomic_write(target, lambda temp: temp.write_text(json.dumps(metrics, indent=2) + "\n"))
        print(json.dumps(metrics, indent=2))
        print(f"saved {target}", file=sys.stderr)
        return metrics
