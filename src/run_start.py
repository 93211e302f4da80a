"""Starting a training run: from fresh weights, from a checkpoint's weights in a new run, or the run
a checkpoint comes from, resumed exactly; and the Run the trainer carries from step to step."""
import dataclasses
import math
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import checkpoints
from atomic import remove_stale_temps
from config import INI_KEYS, Config, ini_text
from errors import UserError
from hardware import auto_dtype, check_fits_memory, fast_dtype
from model import ModelConfig, count_parameters, estimated_parameters
from optimizer import make_optimizer
from run_log import RunLog, create_run_dir, write_run_config
from run_plan import Schedule, in_stable_phase, run_progress
from task import Task


@dataclass
class Run:
    """What a training run carries from step to step."""
    model: nn.Module
    compiled: nn.Module  # what trains: the model under torch.compile and DDP, where used
    optimizer: torch.optim.Optimizer
    scaler: torch.amp.GradScaler
    run_dir: Path | None  # None off rank 0
    log: RunLog
    finite: torch.Tensor  # on the device: False once any loss was nan or inf
    step: int = 0
    tokens: int = 0  # input positions trained on, all ranks, padding included (from shapes: no sync)
    position: dict | None = None  # of the data stream, for exact resume
    best: float | None = None
    elapsed: float = 0.0  # seconds of training, validation left out: what a time budget counts
    lr: float = 0.0  # of the last step
    start: str | None = None  # the checkpoint whose weights a new run started from
    lineage: list = field(default_factory=list)  # the training behind those weights (checkpoints.stage)
    resumed_at: int | None = None  # the step a resumed run went on from
    own_dir: bool = True  # its directory made for it: removed again if it fails before its first step
    log_sums: dict | None = None  # the meter's sums when the checkpoint a run resumes from was saved
    decay_branch: bool = False  # --decay-from's run: its lr-scheduler computed at the branch (decay_branch)

    @property
    def checkpoints(self) -> Path | None:
        return self.run_dir / "checkpoints" if self.run_dir else None


def resumes(checkpoint: dict, task: Task, config: Config) -> bool:
    """The rule for --cp: a checkpoint of the same task and heads, with optimizer state, resumes
    its run; any other (pre-training to fine-tune, an imported model) starts a new run from its weights."""
    same_heads = bool(checkpoint["model_config"]["sentence_classes"]) == (config.sentence_objective != "none")
    return checkpoint["task"] == task.name and checkpoint["optimizer"] is not None and same_heads


def decay_branch(config: Config, saved: dict, path: Path, task: str) -> Config:
    """The config of --decay-from's run: the checkpoint's wsd run goes on from its step, with
    lr-scheduler wsd:DECAY where DECAY is the share of this run's length (max-iters and
    lr-decay-iters, or time-budget) still ahead of that step, so the rate falls from learning-rate
    there to min-learning-rate at the end (mask-rate's @decay steps down there too)."""
    settings = checkpoints.saved_settings(saved)
    if saved["task"] != task or saved["optimizer"] is None:
        kind = f"a {saved['task']} checkpoint" + ("" if saved["optimizer"] is not None else " without its optimizer")
        raise UserError(f"--decay-from {path}: {kind}; it takes a checkpoint of a task-type = {task} run, with "
                        f"its optimizer")
    stable = settings["lr_scheduler"]
    if stable.name != "wsd":
        raise UserError(f"--decay-from {path}: its run has lr-scheduler = {settings['lr_scheduler']}; the decay "
                        f"branches from the stable phase of a wsd run")
    plan = {name: settings[name] for name in ("lr_scheduler", "lr_decay_iters", "time_budget", "warmup_iters")}
    then = dataclasses.replace(config, **plan)
    step, elapsed = saved["step"], saved["elapsed"]
    if not in_stable_phase(step, then.budget_share(elapsed), then):
        raise UserError(f"--decay-from {path}: step {step} is past the stable phase of its run (lr-scheduler = "
                        f"{settings['lr_scheduler']}); take a checkpoint from before its decay, such as stable.pt")
    done = run_progress(step, config.budget_share(elapsed), config)
    if done >= 1:
        length = f"time-budget = {config.time_budget}" if config.budget_seconds else \
            f"lr-decay-iters = {config.lr_decay_iters}"
        raise UserError(f"--decay-from {path}: the checkpoint is at step {step} and {length} ends this run there; "
                        f"give the decay steps (or time) beyond it")
    current = config.lr_scheduler
    shape = current.shape if current.name == "wsd" else stable.shape
    return dataclasses.replace(config, lr_scheduler=Schedule("wsd", decay=round(1 - done, 6), shape=shape))


def resumed_decay(config: Config, saved: dict, task: Task, switch_training: bool) -> Config:
    """The config of a --decay-from run resumed by --cp: its lr-scheduler, which decay_branch
    computed (wsd:DECAY:SHAPE) and no config file holds, read from the checkpoint, not typed again."""
    if switch_training or not saved["decay_branch"] or not resumes(saved, task, config):
        return config
    return dataclasses.replace(config, lr_scheduler=checkpoints.saved_settings(saved)["lr_scheduler"])


def check_same_task(saved: dict, path: Path, task: str):
    """A model is scored or resumed as the task it was trained for: another task's head of the same
    size (sst2's two classes read as cola's) would load and give a score that means nothing. An
    imported model's task is the import's guess from its config, so it may be scored as any."""
    if saved["task"] != task and saved["imported_from"] is None:
        raise UserError(f"{path}: a task-type = {saved['task']} model; scored as {task}, its head's outputs "
                        f"would be read as another task's: set task-type = {saved['task']}")


def check_same_measure(path: Path, saved_settings: dict, task: Task, config: Config):
    """A resumed run keeps the settings that decide what its scores mean, or its curves and
    best.pt would mix two experiments."""
    for name in (*task.measuring_keys, "best_metric"):
        if name in saved_settings:
            check_kept(path, name, saved_settings[name], getattr(config, name),
                       "to start a new run from these weights, add --switch-training")


def check_same_files(path: Path, then, now):
    """A resumed run reads the user's files it began on (task.files_record: each one's sha256 by key and
    path), or it would go on training on other data and choose best.pt across two validation sets.
    A checkpoint whose data is no such record passes: a pre-training's shards are checked by its data
    position, and an older version's checkpoint holds None."""
    if not isinstance(then, dict):
        return
    now = now if isinstance(now, dict) else {}
    for key in dict.fromkeys([*then, *now]):
        before, after = then.get(key, {}), now.get(key, {})
        for name in dict.fromkeys([*before, *after]):
            if before.get(name) != after.get(name):
                raise UserError(f"{path}: {key} {name} {file_change(before.get(name), after.get(name))}; a resumed "
                                f"run keeps its data (to start a new run from these weights on the new data, add "
                                f"--switch-training)")


def file_change(then: str | None, now: str | None) -> str:
    """How a file differs from the one a run began with, by their sha256 (None: no such file)."""
    if then is None:
        return "is new since the run began"
    if now is None:
        return "is gone since the run began"
    return f"has changed since the run began (sha256 {str(then)[:12]}... then, {now[:12]}... now)"


def check_same_optimizer_groups(path: Path, saved_settings: dict, config: Config):
    """Adam's moments are saved per parameter group, and layer-lr-decay decides the groups."""
    check_kept(path, "layer_lr_decay", saved_settings["layer_lr_decay"], config.layer_lr_decay,
               "or add --dont-load-optimizer to resume with fresh optimizer moments")


def check_same_global_batch(path: Path, saved: dict, config: Config, world_size: int):
    """A data position counted in global batches ({"epoch", "batch"}: fine-tuning's) points at
    another sample, and the run's steps mean another thing, under another global batch."""
    if "batch" not in (saved["data_position"] or {}):
        return
    settings = checkpoints.saved_settings(saved)
    then = (settings["batch_size"], settings["grad_accum_steps"], len(saved["rng_per_rank"]) or 1)
    now = (config.batch_size, config.grad_accum_steps, world_size)
    if math.prod(then) != math.prod(now):
        raise UserError(f"{path}: the run's global batch is {global_batch_text(*then)}, this resume's "
                        f"{global_batch_text(*now)}; a resumed fine-tuning keeps batch-size x grad-accum-steps "
                        f"x processes")


def global_batch_text(batch_size: int, accumulation: int, processes: int) -> str:
    return f"{batch_size * accumulation * processes} ({batch_size} x {accumulation} accumulation x {processes} " \
           f"process{'es' if processes > 1 else ''})"


def check_kept(path: Path, name: str, saved, current, remedy: str):
    """One line, exit 2, when a resumed run's config changes a setting the run must keep."""
    if saved != current and ini_text(saved) != ini_text(current):  # equal as text: 0.15 saved, "0.15" read
        raise UserError(f"{path}: the run has {INI_KEYS[name]} = {ini_text(saved)}, the config "
                        f"{ini_text(current)}; a resumed run keeps it ({remedy})")


class RunStarter:
    """Opens the run one process trains (rank of world_size): its model, optimizer, directory and log."""

    def __init__(self, config: Config, task: Task, dtype: torch.dtype, rank: int = 0, world_size: int = 1):
        self.config = config
        self.task = task
        self.dtype = dtype
        self.rank = rank
        self.world_size = world_size
        self.device = task.device
        self.dtype_note = None  # what dtype = auto chose and why, for the log's header

    def start(self, checkpoint_path: Path | None, start: dict | None, switch_training: bool,
              load_optimizer: bool, branch: bool = False) -> Run:
        """A new run, from fresh weights or a checkpoint's (`start`, as loaded from checkpoint_path);
        or, where --cp's rule says so and switch_training does not overrule it, the checkpoint's run
        resumed; with branch (--decay-from), resumed in a new run directory under the config's schedule."""
        if branch or start is not None and not switch_training and resumes(start, self.task, self.config):
            return self.resume_run(start, checkpoint_path, load_optimizer, branch)
        return self.new_run(start, checkpoint_path)

    def new_run(self, start: dict | None, start_path: Path | None) -> Run:
        """A run in a new directory, from fresh weights or from those of `start`. The directory
        is removed again if the run cannot start."""
        if start is not None:
            self.take_checkpoint_labels(start, kept=False)
        model = self.build_model(start)
        if start is not None:
            checkpoints.check_compatible(start_path, start, self.task.vocab, model.config, new_phase=True)
        self.task.check_data(("val",))  # train: read at step 1, before anything is lost
        run_dir = self.new_run_dir()
        log = None
        try:
            log = RunLog(run_dir if self.rank == 0 else None, self.config)
            if start is not None:
                checkpoints.load_pretrained(model, start, start_path, log)
            run = self.open_run(model, run_dir, log)
            run.start = str(start_path.resolve()) if start is not None else None
            run.lineage = checkpoints.lineage(start) if start is not None else []
            self.settle_dtype(None)
            self.announce(run)
        except BaseException:
            self.discard_run_dir(run_dir, log)
            raise
        return run

    def resume_run(self, saved: dict, path: Path, load_optimizer: bool = True, branch: bool = False) -> Run:
        """The run `saved` comes from, continued exactly: weights, optimizer, data position, random
        states. It goes on in its run directory (a copied checkpoint, or a branch: in a new one)."""
        settings = checkpoints.saved_settings(saved)
        check_same_measure(path, settings, self.task, self.config)
        if not branch and "lr_scheduler" in settings:
            check_kept(path, "lr_scheduler", settings["lr_scheduler"], self.config.lr_scheduler,
                       "set it so, or add --switch-training to start a new run from these weights")
        check_same_global_batch(path, saved, self.config, self.world_size)
        if load_optimizer:
            check_same_optimizer_groups(path, settings, self.config)
        model = self.restored_model(saved, path)
        self.task.check_data(("val",))
        check_same_files(path, saved["data"], self.task.data_source)
        resumed_dir = None if branch else checkpoints.run_dir_of(path)
        run_dir = resumed_dir or self.new_run_dir()
        if self.rank == 0:
            remove_stale_temps(run_dir / "checkpoints")
        log = RunLog(run_dir if self.rank == 0 else None, self.config)
        run = self.open_run(model, run_dir, log)
        run.own_dir = resumed_dir is None
        if load_optimizer:
            run.optimizer.load_state_dict(saved["optimizer"])
        else:
            log("the optimizer starts afresh (--dont-load-optimizer): Adam's moments are zero")
        states = saved["rng_per_rank"]  # one per rank that saved it
        sums = saved["log_sums_per_rank"]
        run.log_sums = sums[self.rank] if self.rank < len(sums) else None
        if self.rank < len(states):
            checkpoints.restore_random_states(states[self.rank], self.task.random_generator)
        if len(states) < self.world_size:  # said by rank 0, the one that logs
            log(f"note: the checkpoint holds random states for {len(states)} process(es); "
                f"ranks {len(states)} and up start from fresh seeds")
        run.step, run.best, run.position = saved["step"], saved["best"], saved["data_position"]
        run.tokens, run.elapsed, run.start = saved["tokens"], saved["elapsed"], saved["start"]
        run.lineage = saved["lineage"]  # a branch goes on counting its run's steps and tokens: no new stage
        run.resumed_at = run.step
        run.decay_branch = branch or saved["decay_branch"]
        if branch:
            run.start = str(path.resolve())
            log(f"decaying from {path} at step {run.step}: lr-scheduler = {self.config.lr_scheduler} for this run")
        else:
            decay = f" with the decay --decay-from gave it: lr-scheduler = {self.config.lr_scheduler}" \
                if run.decay_branch else ""
            log(f"resuming {path} at step {run.step}{decay}")
        self.settle_dtype(saved)
        self.announce(run)
        return run

    def remove_failed_start(self, run: Run):
        """A run in a directory of its own that failed before its first step leaves no directory behind."""
        if run.own_dir:
            self.discard_run_dir(run.run_dir, run.log)

    def discard_run_dir(self, run_dir: Path, log: RunLog | None):
        """Close the run's log (and its lock), then remove its directory; rank 0 owns it."""
        if log is not None:
            log.close()
        if self.rank == 0:
            shutil.rmtree(run_dir, ignore_errors=True)

    def build_model(self, checkpoint: dict | None) -> nn.Module:
        """The task's model with fresh weights, seeded per rank; a checkpoint's position table size."""
        torch.manual_seed(self.config.seed + self.rank)
        max_len = checkpoint["model_config"]["max_len"] if checkpoint else None
        self.check_model_fits(self.task.model_config(max_len))
        return self.task.build_model(max_len).to(self.device)

    def take_checkpoint_labels(self, checkpoint: dict, kept: bool):
        """A task whose outputs have names (ner's tags) reads its data against a checkpoint's names,
        tag by name: a model's labels are part of it (kept: the model is the checkpoint's)."""
        self.task.take_checkpoint_labels(tuple(checkpoint["model_config"]["label_names"]), kept)

    def check_model_fits(self, shape: ModelConfig):
        """A model too large for the machine is one line before it is allocated, not a process the
        kernel kills: float32 weights, gradients and AdamW's two moments."""
        keys = ", ".join(f"{INI_KEYS[name]} = {getattr(shape, name)}" for name in ("d_model", "d_ff", "n_layer"))
        check_fits_memory(estimated_parameters(shape), copies=4, limit_gib=self.config.memory_limit_gib or None,
                          source=f"{keys} with {shape.vocab_size:,} tokens", flag="--memory-limit-gib")

    def restored_model(self, saved: dict, path: Path) -> nn.Module:
        """The task's model with every weight of a checkpoint of this task."""
        check_same_task(saved, path, self.task.name)
        self.take_checkpoint_labels(saved, kept=True)
        model = self.build_model(saved)
        checkpoints.check_compatible(path, saved, self.task.vocab, model.config)
        checkpoints.load_weights(model, saved["model"], path)
        return model

    def new_run_dir(self) -> Path:
        """runs/runN (or runs/RUN-ID), made by rank 0 and known to every rank."""
        runs_dir = Path(self.config.runs_dir).absolute()
        run_dir = [create_run_dir(runs_dir, self.config.run_id) if self.rank == 0 else None]
        if torch.distributed.is_initialized():
            torch.distributed.broadcast_object_list(run_dir, src=0)
        return run_dir[0]

    def open_run(self, model: nn.Module, run_dir: Path, log: RunLog) -> Run:
        """The run around a model: compiled and wrapped for DDP where asked, its optimizer."""
        config, device = self.config, self.device
        compiled = torch.compile(model) if config.compile else model
        if torch.distributed.is_initialized():  # compile, then DDP, as nanoGPT does
            compiled = DistributedDataParallel(compiled, device_ids=[device.index] if device.type == "cuda" else None)
        run = Run(model=model, compiled=compiled, optimizer=make_optimizer(model, config, log),
                  scaler=torch.amp.GradScaler(device.type, enabled=self.dtype == torch.float16),
                  run_dir=run_dir, log=log,
                  finite=torch.ones((), dtype=torch.bool, device=device))
        return run

    def settle_dtype(self, saved: dict | None):
        """dtype = auto: hardware.auto_dtype's rule, said in the log; a resumed run keeps the dtype its
        checkpoint ran in where this device runs it fast, so that its steps go on as they were taken."""
        if self.config.dtype != "auto":
            return
        self.dtype, reason = auto_dtype(self.device)
        kept = saved["autocast"] if saved is not None else None
        if kept and kept != str(self.dtype).removeprefix("torch.") and \
                kept in ("float32", str(fast_dtype(self.device)).removeprefix("torch.")):
            self.dtype, reason = getattr(torch, kept), "the dtype the resumed run ran in"
        self.dtype_note = f"dtype = auto: {str(self.dtype).removeprefix('torch.')} ({reason})"

    def announce(self, run: Run):
        """The log's header (directory, settings, model size), and the run's config.ini."""
        config = self.config
        run.log(f"run directory: {run.run_dir}")
        if config.sources:
            run.log(f"config read from {', then '.join(config.sources)} (the later overrides)"
                    if len(config.sources) > 1 else f"config read from {config.sources[0]}")
        for line in config.describe():
            run.log(f"  {line}")
        run.log(f"model: {count_parameters(run.model) / 1e6:.2f}M parameters; device {self.device}, "
                f"autocast {str(self.dtype).removeprefix('torch.')}; global batch "
                f"{global_batch_text(config.batch_size, config.grad_accum_steps, self.world_size)}"
                + (f", ramped up from {config.batch_size * self.world_size} by {config.batch_ramp:.0%} of the run"
                   if config.batch_ramp else ""))
        if self.dtype_note:
            run.log(self.dtype_note)
        if config.warmup_iters > config.max_iters and not config.budget_seconds:
            run.log(f"warning: warmup-iters = {config.warmup_iters} is above max-iters = {config.max_iters}: "
                    f"the learning rate stops before it reaches learning-rate")
        if self.rank == 0:  # what compare_runs.py and a reader of the run directory look up
            write_run_config(run.run_dir, config, self.world_size, run.start)
