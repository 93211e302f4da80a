"""The training loop shared by every task: schedule, optimizer, mixed precision, checkpoints, logs.

A task (mlm_task.py, classification_task.py) supplies the model, the batches and the loss, as
task.Task says; run_start.py opens the run; this file does everything else, the same way for all
of them. Read top to bottom: how a run is asked to stop, the loop, one step, its log line, validation,
saving, scoring a checkpoint; then the meter of a log line's figures (the loss and the task's
statistics, tokens/s, MFU) and the clock a time budget counts, with its record.
"""
import json
import math
import signal
import sys
import tempfile
import time
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Iterator, NamedTuple

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.profiler import record_function
from tqdm import tqdm

import checkpoints
import distributed
import hardware
from atomic import atomic_write
from config import Config
from errors import UserError
from model import flops_per_token
from run_log import RunLog, metric_text
from run_plan import Progress, in_stable_phase, learning_rate, lower_is_better, micro_batches, sequence_length
from run_start import Run, RunStarter
from task import Task, chosen_metric


class StepPhases(NamedTuple):
    """The parts of a training step as torch.profiler records them; scripts/profile_step.py reports them."""
    forward: str = "forward"
    backward: str = "backward"
    clip: str = "gradient clip"
    optimizer: str = "optimizer"


PHASES = StepPhases()


class StopRequest:
    """Stopping a run cleanly: SIGINT, SIGTERM or a file named `stop` in the working directory asks,
    and the loop finishes its step, saves and exits.

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


class Trainer:
    def __init__(self, config: Config, task: Task, rank: int = 0, world_size: int = 1):
        self.config = config
        self.task = task
        self.rank = rank
        self.world_size = world_size
        self.device = task.device
        hardware.use_the_cores_allowed()
        if self.device.type == "cpu":
            hardware.keep_freed_memory()
            hardware.keep_kernels_for_every_width()
        if config.deterministic:
            hardware.use_deterministic_algorithms()
        self.starter = RunStarter(config, task, hardware.select_dtype(config.dtype, self.device), rank, world_size)
        self.meter = None  # the training run's Throughput: its figures since the last log line

    @property
    def dtype(self) -> torch.dtype:
        """The autocast dtype: the config's, dtype = auto's rule, or a resumed run's own."""
        return self.starter.dtype

    @property
    def autocast(self) -> torch.autocast:
        return torch.autocast(self.device.type, dtype=self.dtype, enabled=self.dtype != torch.float32)

    def fit(self, checkpoint_path: Path | None = None, saved: dict | None = None, *, switch_training: bool = False,
            load_optimizer: bool = True, branch: bool = False, stop: StopRequest | None = None) -> Path:
        """Train from scratch, resume a run, or start a new run from a checkpoint's weights (`saved`,
        checkpoints.load of checkpoint_path; switch_training: whatever the checkpoint; load_optimizer
        False: resume with a fresh optimizer; branch: --decay-from's run). `stop`: the caller's, to
        learn whether the run was stopped; else its own."""
        run = self.starter.start(checkpoint_path, saved, switch_training, load_optimizer, branch)
        first_step = run.step
        if self.rank == 0:  # a resumed run is not finished until it reaches its end again
            finished_marker(run.run_dir).unlink(missing_ok=True)
        try:
            with StopRequest() if stop is None else nullcontext(stop) as stop:
                if self.train(run, stop) and self.rank == 0:
                    atomic_write(finished_marker(run.run_dir), lambda temp: temp.write_text(f"step {run.step}\n"))
        except BaseException:
            if run.step == first_step:
                self.starter.remove_failed_start(run)
            raise
        finally:
            run.log.close()
        return run.run_dir

    def scratch_run(self) -> tuple[Run, Iterator]:
        """A fresh run that keeps nothing (a temporary directory, a silent log) and its training
        batches on the device: train_step timed or profiled outside fit (scripts/profile_step.py)."""
        self.task.check_data(("train",))
        run = self.starter.open_run(self.starter.build_model(None), Path(tempfile.mkdtemp()),
                                    RunLog(None, self.config))
        return run, hardware.prefetch(self.task.train_batches(None), self.device, self.config.async_to_device)

    # ------------------------------------------------------------------------- the loop

    def train(self, run: Run, stop: StopRequest) -> bool:
        """The loop: lr for this step, micro-steps, clip, step; log, validate, save, stop. Returns
        whether the run reached its end (max-iters, time-budget or stop-at), False when stopped."""
        config = self.config
        stopping = False
        self.check_metric_names(run)
        batches = hardware.prefetch(self.task.train_batches(run.position), self.device, config.async_to_device)
        meter = self.meter = self.throughput_meter(run)
        clock, replayed = Clock(run.elapsed), self.replayed_clock()
        recorded = self.rank == 0 and config.budget_seconds  # the clock a time budget follows
        if recorded:
            start_clock_record(run.run_dir, run.step)
        progress = tqdm(total=config.max_iters, initial=run.step, dynamic_ncols=True,
                        disable=None if self.rank == 0 else True)  # None: a bar on terminals only
        while not self.finished(run):
            self.train_step(run, batches, meter)
            # one clock decides, on every rank: rank 0's, or the replayed run's record
            run.elapsed = replayed[run.step - 1] if replayed else distributed.from_rank0(clock.elapsed())
            if recorded:
                record_clock(run.run_dir, run.step, run.elapsed)
            progress.update(1)
            finished = self.finished(run)
            at_log = run.step % config.log_interval == 0 or finished
            at_val = run.step % config.val_interval == 0 or finished
            stopping = distributed.any_rank(stop.requested())  # all ranks stop at the same step
            # The one host sync between log lines, on purpose: reading the finite flag.
            if (at_log or at_val or stopping) and not distributed.all_ranks(run.finite).item():
                raise UserError(f"loss is not finite (nan or inf) near step {run.step}: run stopped; "
                                f"the last good checkpoint is in {run.checkpoints}")
            if at_log:
                progress.set_postfix(self.log_training(run, meter))
            if at_val:
                with meter.paused(), clock.paused():
                    metrics = self.validate(run)
                    self.measure_peak_again(run, meter)
                target = config.stop_at
                if target and target.reached(metrics):
                    run.log(f"stop-at = {target} reached at step {run.step} (val {target.metric} "
                            f"{metrics[target.metric]:.4f}): {run.elapsed / 60:.2f} minutes of training, "
                            f"{run.tokens:,} tokens")
                    break
            if stopping:
                if not at_val:
                    self.save(run, "latest")
                reason = stop.reason or "a stop request on another rank"
                run.log(f"stopped by {reason} at step {run.step}; checkpoint saved in {run.checkpoints}")
                break
        progress.close()
        if config.budget_seconds and run.elapsed >= config.budget_seconds:
            run.log(f"time-budget = {config.time_budget} spent at step {run.step}")
        return not stopping

    def replayed_clock(self) -> list[float] | None:
        """replay-clock's seconds after each step, checked to reach the run's end (the budget spent, or
        max-iters): a record that stops short comes from a run that was stopped before its end."""
        if not self.config.replay_clock:
            return None
        path = Path(self.config.replay_clock)
        seconds = read_clock_record(path)
        if len(seconds) < self.config.max_iters and (not seconds or seconds[-1] < self.config.budget_seconds):
            reached = f"{seconds[-1]:.1f} s" if seconds else "nothing"
            raise UserError(f"replay-clock = {path}: it records {len(seconds)} steps ({reached}), short of "
                            f"time-budget = {self.config.time_budget}: the run it records was stopped before its end")
        return seconds

    @property
    def best_metric(self) -> str:
        return chosen_metric(self.config, self.task)

    def check_metric_names(self, run: Run):
        """The metrics stop-at and best-metric name are ones the task's validation has, before the first
        step (one validation batch tells)."""
        named = [(f"stop-at = {self.config.stop_at}", self.config.stop_at.metric)] if self.config.stop_at else []
        named += [(f"best-metric = {self.best_metric}", self.best_metric)] if self.config.best_metric else []
        if not named:
            return
        names = self.task.evaluate(run.compiled, self.task.eval_batches("val", 1), self.autocast)
        for setting, metric in named:
            if metric not in names:
                raise UserError(f"{setting}: task-type = {self.task.name} validates "
                                f"{', '.join(name for name in names if name != 'examples')}, not {metric}")

    def finished(self, run: Run) -> bool:
        """At max-iters, or when the time budget is spent."""
        budget = self.config.budget_seconds
        return run.step >= self.config.max_iters or bool(budget and run.elapsed >= budget)

    def budget_share(self, run: Run) -> float:
        """The share of time-budget trained so far (0 without one): what the schedules follow."""
        return self.config.budget_share(run.elapsed)

    def train_step(self, run: Run, batches, meter: "Throughput"):
        """One optimizer step over its micro-batches (grad-accum-steps, or batch-ramp's), of rows of
        seq-len (or seq-len-curriculum's); no host sync."""
        config, share = self.config, self.budget_share(run)
        run.lr = learning_rate(run.step, share, config, run.resumed_at)
        progress = Progress(run.step, share)
        accumulation = micro_batches(run.step, share, config)
        length = sequence_length(run.step, share, config)
        for group in run.optimizer.param_groups:
            group["lr"] = run.lr * group["lr_scale"]
        for micro in range(accumulation):
            run.position, batch = next(batches)
            if length < config.seq_len:
                batch = cut_rows(batch, length)
            run.tokens += batch["input_ids"].numel() * self.world_size
            last = micro == accumulation - 1
            with nullcontext() if last or self.world_size == 1 else run.compiled.no_sync():
                with self.autocast, record_function(PHASES.forward):
                    loss, statistics = self.task.loss(run.compiled, batch, progress)
                with record_function(PHASES.backward):
                    run.scaler.scale(loss / accumulation).backward()
            meter.add(loss, statistics)
            run.finite &= torch.isfinite(loss.detach())
        if config.grad_clip > 0:
            with record_function(PHASES.clip):
                run.scaler.unscale_(run.optimizer)
                nn.utils.clip_grad_norm_(run.model.parameters(), config.grad_clip)
        with record_function(PHASES.optimizer):
            run.scaler.step(run.optimizer)
            run.scaler.update()
            run.optimizer.zero_grad(set_to_none=True)
        run.step += 1

    def throughput_meter(self, run: Run) -> "Throughput":
        """MFU is against the peak hardware.peak_flops gives, on rank 0 (the one that logs)."""
        peak, source = 1.0, None
        if self.rank == 0:
            peak, source = hardware.peak_flops(self.device, self.dtype, self.config.peak_tflops)
            run.log(f"mfu against a {str(self.dtype).removeprefix('torch.')} matmul peak of "
                    f"{peak / 1e12:.3g} TFLOP/s, {source}")
        per_token = flops_per_token(unwrap(run.model).config, self.config.seq_len, self.task.predictions_per_token,
                                    self.task.last_layer_share)
        meter = Throughput(per_token, peak, self.world_size, self.device, run.tokens,
                           peak_measured=source == hardware.MEASURED_NOW)
        if run.log_sums is not None:
            meter.restore(run.log_sums)
        return meter

    def log_training(self, run: Run, meter: "Throughput") -> dict[str, str]:
        """The train line and scalars since the last one; returns what the progress bar shows."""
        loss, statistics, tokens_per_sec, mfu = meter.read(run.tokens, restart=run.step % self.config.log_interval == 0)
        if mfu > 1 or meter.reads == 1:
            with meter.paused():
                mfu *= self.measure_peak_again(run, meter)
        metrics = {name: value for name, value in self.task.metrics(loss, statistics).items() if name != "loss"}
        line = f"step {run.step} | loss {loss:.4f} | lr {run.lr:.2e} | {tokens_per_sec:,.0f} tok/s | mfu {mfu:.1%}"
        line += "".join(f" | {name} {metric_text(value)}" for name, value in metrics.items())
        course = self.task.progress_metrics()
        line += "".join(f" | {name.replace('_', ' ')} {value:.3f}" for name, value in course.items())
        metrics |= course
        shown = {"loss": f"{loss:.3f}"}
        if self.config.budget_seconds:
            left = max(0.0, self.config.budget_seconds - run.elapsed)
            shown["left"] = f"{int(left // 60)}:{int(left % 60):02d}"
            line += f" | {shown['left']} of time-budget left"
        run.log(line)
        scalars = {"loss": loss, "lr": run.lr, "tokens": run.tokens, "tokens_per_sec": tokens_per_sec,
                   "mfu": mfu, "elapsed": run.elapsed} | metrics
        run.log.scalars(run.step, {f"train/{name}": value for name, value in scalars.items()})
        return shown

    def measure_peak_again(self, run: Run, meter: "Throughput") -> float:
        """The matmul peak measured once more where it was measured (rank 0, no peak-tflops, no published
        figure), the higher one kept: a host that stalls a core for part of a second halves the start's
        half-second measurement, and every MFU after would read twice as high. So the first log line,
        every validation and any MFU above 100% measure again, one try each (a sixth of a second; the
        caller pauses the meter). Says so when the peak rose by more than 10%; returns the factor that
        rescales an MFU read against the old peak."""
        if not meter.peak_measured:
            return 1.0
        old = meter.peak_flops
        meter.peak_flops = max(old, hardware.matmul_flops_once(self.device, self.dtype))
        if meter.peak_flops > 1.1 * old:
            run.log(f"note: the matmul peak measured now, {meter.peak_flops / 1e12:.3g} TFLOP/s, is above the "
                    f"{old / 1e12:.3g} measured before (the machine was busier then): mfu is against it from here")
        return old / meter.peak_flops

    def validate(self, run: Run):
        """Validation metrics in the log, predictions shown, best.pt and checkpoint.pt saved; returns the metrics."""
        task = self.task
        # Past DDP: evaluation needs no gradient sync, and ranks may see different batch counts.
        model = run.compiled.module if isinstance(run.compiled, DistributedDataParallel) else run.compiled
        metrics = task.evaluate(model, task.eval_batches("val", self.config.val_iters), self.autocast)
        run.log(f"step {run.step} | " + " | ".join(f"val {name} {metric_text(value)}"
                                                   for name, value in metrics.items()))
        if not math.isfinite(metrics["loss"]):  # never a best checkpoint, nor one to resume
            raise UserError(f"validation loss is not finite (nan or inf) at step {run.step}: run stopped; "
                            f"the last good checkpoint is in {run.checkpoints}")
        scalars = {f"val/{name}": value for name, value in metrics.items()} | {"val/tokens": run.tokens,
                                                                               "val/elapsed": run.elapsed}
        run.log.scalars(run.step, scalars)
        if self.rank == 0:
            run.log(task.show_predictions(model, self.autocast))
        score = metrics[self.best_metric]
        score = None if score is None else float(score)  # a numpy scalar would not load with weights_only
        if improves(score, run.best, lower_is_better(self.best_metric)):
            run.best = score
            self.save(run, "best")
        self.save(run, "latest")
        return metrics

    def save(self, run: Run, kind: str):
        """best.pt, or checkpoint.pt with the older ones rotated; rank 0 writes, with every
        rank's random states and training sums since the last log line, and the others wait until it has."""
        per_rank = distributed.every_rank((checkpoints.random_states(self.task.random_generator),
                                           self.meter.since_log() if self.meter else None))
        rng_per_rank = [rng for rng, _ in per_rank]
        if self.rank == 0:
            directory = run.checkpoints
            directory.mkdir(parents=True, exist_ok=True)
            state = checkpoints.make_state(
                task=self.task.name, weights=unwrap(run.model).state_dict(), model_config=unwrap(run.model).config,
                vocab=self.task.vocab, config=self.config.to_dict(),
                step=run.step, tokens=run.tokens, optimizer=run.optimizer.state_dict(),
                data_position=run.position, rng_per_rank=rng_per_rank, best=run.best, elapsed=run.elapsed,
                data=self.task.data_source, start=run.start, lineage=run.lineage,
                log_sums_per_rank=[sums for _, sums in per_rank], decay_branch=run.decay_branch,
                autocast=str(self.dtype).removeprefix("torch."))
            if kind == "best":
                checkpoints.save(directory / "best.pt", state)
            else:
                checkpoints.save_latest(directory, state, self.config.max_checkpoints)
                if in_stable_phase(run.step, self.budget_share(run), self.config):
                    checkpoints.keep_as(directory / "checkpoint.pt", directory / "stable.pt")
        if torch.distributed.is_initialized():
            torch.distributed.barrier()

    # ------------------------------------------------------------------------- scoring a checkpoint

    def restored_model(self, saved: dict, checkpoint_path: Path) -> nn.Module:
        """The task's model with every weight of a checkpoint of this task (`saved`, as loaded)."""
        return self.starter.restored_model(saved, checkpoint_path)

    def test(self, checkpoint_path: Path, saved: dict) -> dict:
        """Score a checkpoint (`saved`, as loaded) on the test split and save the metrics in its run
        directory; write the predictions where the task gives them: as a submission file where the
        labels are hidden (GLUE), then instead of scores; for the user's own test file, beside them."""
        model = self.restored_model(saved, checkpoint_path)
        run_dir = checkpoints.run_dir_of(checkpoint_path) or checkpoint_path.parent
        step = saved["step"]
        written = []
        for name, lines in (self.task.submission(model, "test", self.autocast) or {}).items():
            target = run_dir / f"test_predictions_step{step}_{name}"
            atomic_write(target, lambda temp, lines=lines: temp.write_text("\n".join(lines) + "\n"))
            print(f"wrote {len(lines) - 1} predictions to {target}")
            written.append(str(target))
        if not self.task.labels_known("test"):
            print("the test labels are hidden: predictions only, no scores")
            return {"predictions": written}
        batches = self.task.eval_batches("test", self.config.test_iters or None)
        metrics = self.task.evaluate(model, batches, self.autocast)
        metrics = {"checkpoint": str(checkpoint_path), "step": step,
                   **{f"test_{name}": value for name, value in metrics.items()}}
        target = run_dir / f"test_metrics_step{step}.json"
        atomic_write(target, lambda temp: temp.write_text(json.dumps(metrics, indent=2) + "\n"))
        print(json.dumps(metrics, indent=2))
        print(f"saved {target}", file=sys.stderr)
        return metrics


# ----------------------------------------------------------------------------- helpers of the loop

def finished_marker(run_dir: Path) -> Path:
    """RUN/finished, written when the run reaches its end, never when it is stopped (a stop file,
    SIGTERM: it saves and exits 0 all the same) or fails: how a caller such as scripts/glue.py
    tells a complete run from one to resume."""
    return run_dir / "finished"


def cut_rows(batch: dict, length: int) -> dict:
    """A device batch of plain MLM rows cut into rows of `length` tokens (seq-len-curriculum). A
    piece of a row's padding keeps its first slot visible: attention needs one key a row, and the
    slot, a special token, is never picked for prediction."""
    ids = batch["input_ids"].reshape(-1, length)
    mask = batch["attention_mask"]
    if mask is not None:
        mask = mask.reshape(-1, length).clone()
        mask[:, 0] = True
    documents = batch.get("document_ids")
    if documents is not None:  # a piece of a document starts again at position 0
        batch = {**batch, "document_ids": documents.reshape(-1, length)}
    return {**batch, "input_ids": ids, "attention_mask": mask}


def improves(score: float | None, best: float | None, lower_is_better: bool) -> bool:
    """Whether a validation's score makes its checkpoint best.pt. An undefined score (None: a
    correlation of constant predictions) is no score: it beats none, and any score beats it; until
    a score is defined, the latest checkpoint is best.pt, so a run always leaves one."""
    if best is None:
        return True
    if score is None:
        return False
    return score < best if lower_is_better else score > best


def unwrap(model: nn.Module) -> nn.Module:
    """The plain model under torch.compile and DistributedDataParallel wrappers."""
    model = getattr(model, "_orig_mod", model)
    model = getattr(model, "module", model)
    return getattr(model, "_orig_mod", model)


# ----------------------------------------------------------------------------- the meter and the clock

class Throughput:
    """Sums the loss and the task's statistics on the device (no host sync per step) and reads the
    figures at a log line."""

    def __init__(self, flops_per_token: float, peak_flops: float, world_size: int, device: torch.device,
                 tokens: int, peak_measured: bool = False):
        self.flops_per_token = flops_per_token
        self.peak_flops = peak_flops
        self.peak_measured = peak_measured  # peak_flops is a measurement, which a later one may raise
        self.reads = 0  # log lines read: the first one measures the peak again
        self.world_size = world_size
        self.loss_sum = torch.zeros((), device=device)
        self.micro_steps = 0
        self.reset(tokens)

    def reset(self, tokens: int):
        self.loss_sum.zero_()
        self.statistics = 0
        self.micro_steps = 0
        self.since, self.since_tokens, self.pause = time.perf_counter(), tokens, 0.0

    def add(self, loss: torch.Tensor, statistics: torch.Tensor):
        self.loss_sum += loss.detach().float()
        self.statistics = self.statistics + statistics.detach().double()
        self.micro_steps += 1

    @contextmanager
    def paused(self):
        started = time.perf_counter()
        try:
            yield
        finally:
            self.pause += time.perf_counter() - started

    def read(self, tokens: int, restart: bool = True) -> tuple[float, torch.Tensor, float, float]:
        """Mean loss over all ranks' micro-batches, their summed statistics (on the CPU), tokens/s
        of all ranks, and MFU per rank since the last read; then starts counting afresh, unless
        restart is False (a run's last line, off the log interval: a resumed run goes on summing)."""
        self.reads += 1
        elapsed = time.perf_counter() - self.since - self.pause
        loss_sum, statistics = self.loss_sum.clone(), self.statistics.clone()  # this rank's stay for since_log
        if torch.distributed.is_initialized():
            torch.distributed.all_reduce(loss_sum)
            torch.distributed.all_reduce(statistics)
            loss_sum /= self.world_size
        mean_loss = loss_sum.item() / self.micro_steps
        tokens_per_sec = (tokens - self.since_tokens) / elapsed
        mfu = self.flops_per_token * tokens_per_sec / self.world_size / self.peak_flops
        if restart:
            self.reset(tokens)
        return mean_loss, statistics.cpu(), tokens_per_sec, mfu

    def since_log(self) -> dict:
        """This rank's sums since the last log line: a checkpoint keeps them, so that the first line
        after a resume averages the same steps as an uninterrupted run's."""
        statistics = self.statistics.cpu() if isinstance(self.statistics, torch.Tensor) else None
        return {"loss_sum": self.loss_sum.cpu(), "statistics": statistics, "micro_steps": self.micro_steps}

    def restore(self, sums: dict):
        """Go on from since_log()'s sums."""
        self.loss_sum.copy_(sums["loss_sum"])
        statistics = sums["statistics"]
        self.statistics = 0 if statistics is None else statistics.to(self.loss_sum.device)
        self.micro_steps = sums["micro_steps"]


class Clock:
    """Training time of a run: seconds so far, from a resumed run's count on, pauses left out."""
    now = staticmethod(time.monotonic)  # tests put a fake clock here

    def __init__(self, elapsed: float = 0.0):
        self.before = elapsed
        self.started = self.now()

    def elapsed(self) -> float:
        return self.before + self.now() - self.started

    @contextmanager
    def paused(self):
        """Time inside is not charged: validation and its checkpoints."""
        self.before = self.elapsed()
        try:
            yield
        finally:
            self.started = self.now()


CLOCK_RECORD = "clock.tsv"  # in the run directory


def start_clock_record(run_dir: Path, resumed_at: int):
    """runN/clock.tsv: the training seconds after each step, as the schedules read them, one line a
    step (rank 0's, appended as it goes: record_clock), so that replay-clock can repeat a time-budget
    run exactly. A resume cuts the lines past its step: those steps are taken again."""
    path = run_dir / CLOCK_RECORD
    kept = read_clock_record(path)[:resumed_at] if path.exists() else []
    path.write_text("step\tseconds\n" + "".join(f"{step}\t{seconds!r}\n" for step, seconds in enumerate(kept, 1)),
                    encoding="utf-8")


def record_clock(run_dir: Path, step: int, seconds: float):
    with (run_dir / CLOCK_RECORD).open("a", encoding="utf-8") as file:
        file.write(f"{step}\t{seconds!r}\n")


def read_clock_record(path: Path) -> list[float]:
    """A clock.tsv's seconds, step 1 first; one line naming the file where it is not one."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as error:
        raise UserError(f"{path}: cannot read the clock record ({getattr(error, 'strerror', None) or error})") from None
    if not lines or lines[0] != "step\tseconds":
        raise UserError(f"{path}: not a run's clock record (its first line is not 'step<TAB>seconds')")
    seconds = []
    for number, line in enumerate(lines[1:], 2):
        fields = line.split("\t")
        try:
            step, value = int(fields[0]), float(fields[1])
        except (ValueError, IndexError):
            raise UserError(f"{path}:{number}: expected a step and its seconds, got {line!r}") from None
        if step != len(seconds) + 1 or not math.isfinite(value) or value < (seconds[-1] if seconds else 0.0):
            raise UserError(f"{path}:{number}: expected step {len(seconds) + 1} and seconds that never fall, "
                            f"got {line!r}")
        seconds.append(value)
    return seconds
