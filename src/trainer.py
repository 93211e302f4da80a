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
from contextlib import contextmanager, nullcontext
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from tqdm import tqdm

import distributed
from config import Config
from errors import UserError
from model import ModelConfig, count_parameters, flops_per_token
from vocab import Vocab

CHECKPOINT_FORMAT = 1
MODEL_DEFAULTS = {field.name: field.default for field in fields(ModelConfig)}


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
    generator = torch.Generator(device=device).manual_seed(0)  # leaves the training RNG alone
    a = torch.randn(size, size, device=device, dtype=dtype, generator=generator)
    b = torch.randn(size, size, device=device, dtype=dtype, generator=generator)
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
    missing, _ = model.load_state_dict(checkpoint["model"], strict=False)  # unused heads (NSP) may stay behind
    if missing:
        raise UserError(f"{path}: weights missing for {type(model).__name__}: {', '.join(missing[:5])}")
    return model.eval(), Vocab(tuple(checkpoint["vocab"])), checkpoint


def model_config(config: Config, vocab, max_len: int | None = None) -> ModelConfig:
    """The model a config and vocabulary describe; max_len, the position table, defaults to
    seq-len (a checkpoint may bring a larger one: bert-base has 512)."""
    max_len = max_len or config.seq_len
    if config.seq_len > max_len:
        raise UserError(f"seq-len = {config.seq_len}: the checkpoint's model has positions for {max_len} tokens")
    return ModelConfig(vocab_size=vocab.size, max_len=max_len, d_model=config.d_model,
                       heads=config.heads, n_layer=config.n_layer, d_ff=config.feed_forward_size,
                       dropout=config.dropout, pad_id=vocab.pad_id, num_labels=config.num_labels,
                       norm=config.norm, position=config.position, feed_forward=config.feed_forward,
                       causal=config.task_type == "clm",
                       sentence_classes=0 if config.sentence_objective == "none" else 2)


def check_compatible(path: Path, checkpoint: dict, vocab, current: ModelConfig):
    """The checkpoint's model must be the one the config describes, with the same vocabulary."""
    if checkpoint.get("vocab_checksum") != vocab.checksum:
        raise UserError(f"{path}: made with another vocabulary than {vocab.path} (checksum differs)")
    for key, value in asdict(current).items():
        if key in ("dropout", "num_labels", "causal", "sentence_classes"):
            continue  # free to change between runs and tasks: pre-training heads come and go
        saved = checkpoint["model_config"].get(key, MODEL_DEFAULTS.get(key))  # older checkpoints lack new keys
        if saved != value:
            raise UserError(f"{path}: {key} is {saved} in the checkpoint but {value} "
                            f"from the config and vocabulary")


def load_pretrained(model: nn.Module, checkpoint: dict, path: Path, log):
    """Start from a checkpoint's weights. The encoder must be complete; a head the checkpoint
    lacks, or one that does not fit (another number of labels), starts fresh. The log says which."""
    own = model.state_dict()
    fitting = {name: tensor for name, tensor in checkpoint["model"].items()
               if name in own and own[name].shape == tensor.shape}
    missing, _ = model.load_state_dict(fitting, strict=False)
    loaded = {own[name].data_ptr() for name in fitting}
    missing = [name for name in missing if own[name].data_ptr() not in loaded]  # tied to a loaded weight
    if any(name.startswith("encoder.") for name in missing):
        raise UserError(f"{path}: encoder weights missing or of another shape: {', '.join(missing[:5])}")
    unused = sorted({name.split(".")[0] + ".*" for name in checkpoint["model"] if name not in fitting})
    log(f"loaded the encoder of {path} ({checkpoint['task']} step {checkpoint['step']})")
    log(f"  newly initialised: {', '.join(missing) or 'nothing'}")
    log(f"  not used: {', '.join(unused) or 'nothing'}")


def load_weights(model: nn.Module, checkpoint: dict, path: Path, vocab, resuming: bool, log):
    """A checkpoint's weights into the model: all of them to resume a run, else as a start."""
    check_compatible(path, checkpoint, vocab, model.config)
    if resuming:
        model.load_state_dict(checkpoint["model"])
    else:
        load_pretrained(model, checkpoint, path, log)


def rotate_checkpoints(directory: Path, keep: int):
    """checkpoint.pt is the latest; keep-1 older ones stay as checkpoint-STEP.pt."""
    latest = directory / "checkpoint.pt"
    if keep > 1 and latest.exists():
        # mmap: reads the step without loading the tensors
        step = torch.load(latest, map_location="cpu", weights_only=True, mmap=True)["step"]
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
    """One rank's RNG states (rng_state's dict)."""
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
    """log.txt, the console (above the progress bar), TensorBoard and optionally Weights &
    Biases; silent off rank 0 (run_dir None)."""

    def __init__(self, run_dir: Path | None, config: Config):
        self.file = self.board = self.wandb = None
        if run_dir is None:
            return
        (run_dir / "logs").mkdir(parents=True, exist_ok=True)
        self.file = (run_dir / "logs" / "log.txt").open("a", encoding="utf-8")
        from torch.utils.tensorboard import SummaryWriter
        self.board = SummaryWriter(str(run_dir / "logs"))
        if config.wandb:
            try:
                import wandb
            except ImportError:
                raise UserError("wandb = true, but the wandb package is not installed (pip install wandb)") from None
            self.wandb = wandb.init(project="bert", name=run_dir.name, dir=str(run_dir),
                                    config=config.to_dict(), resume="allow")

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
        if self.wandb is not None:
            self.wandb.log(values, step=step)

    def close(self):
        if self.board is not None:
            self.board.close()
            self.file.close()
        if self.wandb is not None:
            self.wandb.finish()


class StopRequest:
    """SIGINT, SIGTERM or a file named `stop` in the working directory: finish the step, save, exit.

    A context manager: the handlers it installs are replaced by the previous ones on exit.
    """
    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self):
        self.reason = None
        self.previous = {}

    def __enter__(self):
        for signum in self.SIGNALS:
            self.previous[signum] = signal.signal(signum, self._on_signal)
        return self

    def __exit__(self, *exc_info):
        for signum, handler in self.previous.items():
            signal.signal(signum, handler)

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

@dataclass
class Run:
    """What a training run carries from step to step."""
    model: nn.Module
    compiled: nn.Module  # what trains: the model under torch.compile and DDP, where used
    optimizer: torch.optim.Optimizer
    scaler: torch.amp.GradScaler
    mask_generator: torch.Generator
    run_dir: Path | None  # None off rank 0
    log: RunLog
    finite: torch.Tensor  # on the device: False once any loss was nan or inf
    step: int = 0
    tokens: int = 0  # input positions trained on, all ranks, padding included (from shapes: no sync)
    position: dict | None = None  # of the data stream, for exact resume
    best: float | None = None

    @property
    def checkpoints(self) -> Path | None:
        return self.run_dir / "checkpoints" if self.run_dir else None


class Throughput:
    """Loss, tokens/s and MFU between two log lines, evaluation time left out."""

    def __init__(self, trainer: "Trainer", run: Run):
        self.trainer = trainer
        self.flops_per_token = flops_per_token(unwrap(run.model).config, trainer.config.seq_len,
                                               trainer.task.predictions_per_token)
        self.peak = 1.0  # MFU is logged on rank 0 only
        if trainer.rank == 0:  # measured once at the start: a busy machine gives a low peak, a high MFU
            self.peak = measure_matmul_flops(trainer.device, trainer.dtype)
            run.log(f"mfu against a {str(trainer.dtype).removeprefix('torch.')} matmul peak of "
                    f"{self.peak / 1e12:.3g} TFLOP/s measured now")
        self.loss_sum = torch.zeros((), device=trainer.device)
        self.since, self.since_step, self.since_tokens, self.pause = time.perf_counter(), run.step, run.tokens, 0.0

    @contextmanager
    def paused(self):
        started = time.perf_counter()
        try:
            yield
        finally:
            self.pause += time.perf_counter() - started

    def log(self, run: Run) -> float:
        """Write the train line and scalars; returns the mean loss since the last line."""
        trainer, config = self.trainer, self.trainer.config
        elapsed = time.perf_counter() - self.since - self.pause
        if torch.distributed.is_initialized():  # the mean over all ranks' micro-batches
            torch.distributed.all_reduce(self.loss_sum)
            self.loss_sum /= trainer.world_size
        mean_loss = self.loss_sum.item() / ((run.step - self.since_step) * config.grad_accum_steps)
        tokens_per_sec = (run.tokens - self.since_tokens) / elapsed
        mfu = self.flops_per_token * tokens_per_sec / trainer.world_size / self.peak
        lr = cosine_lr(run.step - 1, config)
        run.log(f"step {run.step} | loss {mean_loss:.4f} | lr {lr:.2e} | {tokens_per_sec:,.0f} tok/s | mfu {mfu:.1%}")
        run.log.scalars(run.step, {"train/loss": mean_loss, "train/lr": lr, "train/tokens": run.tokens,
                                   "train/tokens_per_sec": tokens_per_sec, "train/mfu": mfu})
        self.loss_sum.zero_()
        self.since, self.since_step, self.since_tokens, self.pause = time.perf_counter(), run.step, run.tokens, 0.0
        return mean_loss


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
        run = self.start(checkpoint_path)
        try:
            with StopRequest() as stop:
                self.train(run, stop)
        finally:
            run.log.close()
        return run.run_dir

    def start(self, checkpoint_path: Path | None) -> "Run":
        """Model, optimizer and run directory; from a checkpoint when given one."""
        config, task, device = self.config, self.task, self.device
        checkpoint = load_checkpoint(checkpoint_path) if checkpoint_path else None
        torch.manual_seed(config.seed + self.rank)
        model = task.build_model(checkpoint and checkpoint["model_config"]["max_len"]).to(device)
        mask_generator = torch.Generator(device=device).manual_seed(config.seed + 1000 + self.rank)
        # The same task and heads with optimizer state continue that run; anything else is a starting
        # point (an MLM checkpoint for fine-tuning or for MLM + NSP, an imported transformers model).
        resuming = (checkpoint is not None and checkpoint["task"] == task.name and checkpoint["optimizer"] is not None
                    and checkpoint["model_config"].get("sentence_classes", 0) == model.config.sentence_classes)
        run_dir = run_dir_of(checkpoint_path) if resuming else None
        if run_dir is None and self.rank == 0:
            run_dir = create_run_dir(Path(config.runs_dir).absolute())
        if torch.distributed.is_initialized():  # every rank learns rank 0's run directory
            shared = [run_dir]
            torch.distributed.broadcast_object_list(shared, src=0)
            run_dir = shared[0]
        log = RunLog(run_dir if self.rank == 0 else None, config)
        if checkpoint is not None:
            load_weights(model, checkpoint, checkpoint_path, task.vocab, resuming, log)
        compiled = torch.compile(model) if config.compile else model
        if torch.distributed.is_initialized():  # compile, then DDP, as nanoGPT does
            compiled = DistributedDataParallel(compiled, device_ids=[device.index] if device.type == "cuda" else None)
        run = Run(model=model, compiled=compiled,
                  optimizer=make_optimizer(model, config, log), mask_generator=mask_generator,
                  scaler=torch.amp.GradScaler(device.type, enabled=self.dtype == torch.float16),
                  run_dir=run_dir, log=log, finite=torch.ones((), dtype=torch.bool, device=device))
        if resuming:
            run.optimizer.load_state_dict(checkpoint["optimizer"])
            states = checkpoint["rng_per_rank"]  # one per rank that saved it
            if self.rank < len(states):
                restore_rng(states[self.rank], mask_generator)
            else:
                log(f"note: the checkpoint holds random states for {len(states)} process(es); "
                    f"ranks {len(states)} and up start from fresh seeds")
            run.step, run.best, run.position = checkpoint["step"], checkpoint["best"], checkpoint["data_position"]
            run.tokens = checkpoint.get("tokens", 0)  # older checkpoints did not count
            log(f"resuming {checkpoint_path} at step {run.step}")
        self.log_header(log, model, run_dir)
        if self.rank == 0:  # what compare_runs.py and a reader of the run directory look up
            lines = config.describe() + [f"# {self.world_size} process(es)"]
            atomic_write(run_dir / "config.ini", lambda temp: temp.write_text("\n".join(lines) + "\n"))
        return run

    def train(self, run: "Run", stop: StopRequest):
        """The loop: lr for this step, micro-steps, clip, step; log, validate, save, stop."""
        config = self.config
        batches = prefetch(self.task.train_batches(run.position), self.device, config.async_to_device)
        meter = Throughput(self, run)
        progress = tqdm(total=config.max_iters, initial=run.step, dynamic_ncols=True,
                        disable=None if self.rank == 0 else True)  # None: a bar on terminals only
        while run.step < config.max_iters:
            self.train_step(run, batches, meter)
            progress.update(1)
            at_log = run.step % config.log_interval == 0 or run.step == config.max_iters
            at_val = run.step % config.val_interval == 0 or run.step == config.max_iters
            stopping = distributed.any_rank(stop.requested())  # all ranks stop at the same step
            if (at_log or at_val or stopping) and not distributed.all_ranks(run.finite).item():
                raise UserError(f"loss is not finite (nan or inf) near step {run.step}: run stopped; "
                                f"the last good checkpoint is in {run.checkpoints}")
            if at_log:
                progress.set_postfix(loss=f"{meter.log(run):.3f}")
            if at_val:
                with meter.paused():
                    self.validate(run)
            if stopping:
                if not at_val:
                    self.save(run, "latest")
                reason = stop.reason or "a stop request on another rank"
                run.log(f"stopped by {reason} at step {run.step}; checkpoint saved in {run.checkpoints}")
                break
        progress.close()

    def train_step(self, run: "Run", batches, meter: "Throughput"):
        """One optimizer step over grad-accum-steps micro-batches; no host sync."""
        config, accumulation = self.config, self.config.grad_accum_steps
        for group in run.optimizer.param_groups:
            group["lr"] = cosine_lr(run.step, config)
        for micro in range(accumulation):
            run.position, batch = next(batches)
            run.tokens += batch["input_ids"].numel() * self.world_size
            last = micro == accumulation - 1
            with nullcontext() if last or self.world_size == 1 else run.compiled.no_sync():
                with self.autocast:
                    loss, _ = self.task.loss(run.compiled, batch, training=True, generator=run.mask_generator)
                run.scaler.scale(loss / accumulation).backward()
            meter.loss_sum += loss.detach().float()
            run.finite &= torch.isfinite(loss.detach())
        if config.grad_clip > 0:
            run.scaler.unscale_(run.optimizer)
            nn.utils.clip_grad_norm_(run.model.parameters(), config.grad_clip)
        run.scaler.step(run.optimizer)
        run.scaler.update()
        run.optimizer.zero_grad(set_to_none=True)
        run.step += 1

    def validate(self, run: "Run"):
        """Validation metrics in the log, predictions shown, best.pt and checkpoint.pt saved."""
        task = self.task
        # Past DDP: evaluation needs no gradient sync, and ranks may see different batch counts.
        model = run.compiled.module if isinstance(run.compiled, DistributedDataParallel) else run.compiled
        metrics = evaluate(model, task, task.eval_batches("val", self.config.val_iters), self.autocast)
        run.log(f"step {run.step} | " + " | ".join(f"val {name} {value:.4f}" for name, value in metrics.items()))
        scalars = {f"val/{name}": value for name, value in metrics.items()} | {"val/tokens": run.tokens}
        run.log.scalars(run.step, scalars)
        if self.rank == 0:
            run.log(task.show_predictions(model, self.autocast))
        score = metrics[task.best_metric]
        if run.best is None or (score < run.best if task.lower_is_better else score > run.best):
            run.best = score
            self.save(run, "best")
        self.save(run, "latest")

    def save(self, run: "Run", kind: str):
        """best.pt, or checkpoint.pt with the older ones rotated; rank 0 writes, with every
        rank's random states, and the others wait until it has."""
        rng = rng_state(run.mask_generator)
        rng_per_rank = [rng]
        if torch.distributed.is_initialized():
            rng_per_rank = [None] * self.world_size
            torch.distributed.all_gather_object(rng_per_rank, rng)
        if self.rank == 0:
            self.write_checkpoint(run, kind, rng, rng_per_rank)
        if torch.distributed.is_initialized():
            torch.distributed.barrier()

    def write_checkpoint(self, run: "Run", kind: str, rng: dict, rng_per_rank: list[dict]):
        directory = run.checkpoints
        directory.mkdir(parents=True, exist_ok=True)
        model = unwrap(run.model)
        state = {"format": CHECKPOINT_FORMAT, "task": self.task.name, "step": run.step, "tokens": run.tokens,
                 "model": model.state_dict(), "optimizer": run.optimizer.state_dict(),
                 "config": self.config.to_dict(), "model_config": asdict(model.config),
                 "vocab_checksum": self.task.vocab.checksum, "vocab": list(self.task.vocab.tokens),
                 "data_position": run.position, "rng": rng, "rng_per_rank": rng_per_rank, "best": run.best}
        if kind == "best":
            save_checkpoint(directory / "best.pt", state)
        else:
            rotate_checkpoints(directory, self.config.max_checkpoints)
            save_checkpoint(directory / "checkpoint.pt", state)

    def test(self, checkpoint_path: Path) -> dict:
        """Score a checkpoint on the test split and save the metrics in its run directory;
        where the labels are hidden (GLUE), write the predictions as a submission file instead."""
        checkpoint = load_checkpoint(checkpoint_path)
        model = self.task.build_model(checkpoint["model_config"]["max_len"]).to(self.device)
        load_weights(model, checkpoint, checkpoint_path, self.task.vocab, resuming=True, log=print)
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
