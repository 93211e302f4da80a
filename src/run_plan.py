"""The run's course: the small grammars of the keys that plan it (time-budget, lr-scheduler,
mask-rate, seq-len-curriculum, stop-at), each a frozen value read once from its text (Config's load
reads them, and writes each back as its text); and the course itself, the learning rate, the mask
rate, the batch ramp, the length curriculum and the run's length, each a pure function of the step,
the share of the time budget spent and the run's Config (`config` below: this room imports nothing of
the project, config.py imports it).
"""
import dataclasses
import math
import re
from typing import Callable, NamedTuple


def number_text(number: float) -> str:
    """A number as short as it reads back exactly: 0.15, 1e-05, 0.7000000000000001."""
    short = f"{number:g}"
    return short if float(short) == number else repr(float(number))


class Duration(NamedTuple):
    """A time-budget value read: seconds, and the unit it was written in (0: no budget)."""
    seconds: float
    unit: str = "s"

    def __str__(self) -> str:
        return number_text(self.seconds / SECONDS_PER_UNIT[self.unit]) + self.unit if self.seconds else "0"


DURATION = re.compile(r"(\d+(?:\.\d*)?|\.\d+)\s*([smh])")
SECONDS_PER_UNIT = {"s": 1, "m": 60, "h": 3600}
DURATION_FORMS = "a duration such as 90s, 30m or 2h (0: no budget)"


def parse_duration(text: str) -> Duration:
    """The Duration of '90s', '30m', '1.5h' or '0' (no budget)."""
    text = text.strip().lower()
    if text in ("0", ""):
        return Duration(0.0)
    match = DURATION.fullmatch(text)
    if not match:
        raise ValueError(f"not a duration: {text!r}")
    return Duration(float(match.group(1)) * SECONDS_PER_UNIT[match.group(2)], match.group(2))


class Schedule(NamedTuple):
    """An lr-scheduler value read: its name and arguments (steplr's step and gamma, one-cycle's peak,
    wsd's decay share and shape)."""
    name: str
    step: int = 0
    gamma: float = 1.0
    peak: float = 0.5
    decay: float = 0.2  # 20% with 1 - sqrt matches a cosine's loss (Hägele et al. 2024)
    shape: str = "sqrt"

    def __str__(self) -> str:
        """The shortest text that reads back the same: arguments at their defaults left off the end."""
        defaults = Schedule._field_defaults
        if self.name == "steplr":
            return f"steplr:{self.step}:{number_text(self.gamma)}"
        if self.name == "one-cycle" and self.peak != defaults["peak"]:
            return f"one-cycle:{number_text(self.peak)}"
        if self.name == "wsd" and self.shape != defaults["shape"]:
            return f"wsd:{number_text(self.decay)}:{self.shape}"
        if self.name == "wsd" and self.decay != defaults["decay"]:
            return f"wsd:{number_text(self.decay)}"
        return self.name


WSD_SHAPES = ("sqrt", "linear")
SCHEDULER_FORMS = ("cosine, linear, none (constant), steplr:STEP:GAMMA (STEP a positive integer, GAMMA in (0, 1]), "
                   "one-cycle[:PEAK] (PEAK in (0, 1)) or wsd[:DECAY[:SHAPE]] (DECAY in (0, 1], SHAPE sqrt or linear)")


def parse_scheduler(text: str) -> Schedule:
    """The Schedule of 'cosine', 'linear', 'none', 'steplr:STEP:GAMMA', 'one-cycle[:PEAK]' or
    'wsd[:DECAY[:SHAPE]]'."""
    name, *arguments = text.strip().lower().split(":")
    try:
        if name in ("cosine", "linear", "none") and not arguments:
            return Schedule(name)
        if name == "steplr" and len(arguments) == 2:
            step, gamma = int(arguments[0]), float(arguments[1])
            if step >= 1 and 0 < gamma <= 1:
                return Schedule(name, step=step, gamma=gamma)
        if name == "one-cycle" and len(arguments) <= 1:
            peak = float(arguments[0]) if arguments else Schedule._field_defaults["peak"]
            if 0 < peak < 1:
                return Schedule(name, peak=peak)
        if name == "wsd" and len(arguments) <= 2:
            decay = float(arguments[0]) if arguments else Schedule._field_defaults["decay"]
            shape = arguments[1] if len(arguments) == 2 else Schedule._field_defaults["shape"]
            if 0 < decay <= 1 and shape in WSD_SHAPES:
                return Schedule(name, decay=decay, shape=shape)
    except ValueError:
        pass
    raise ValueError(f"not a scheduler: {text!r}")


class MaskRate(NamedTuple):
    """A mask-rate value read: `start` falls to `end` along the run (a straight line), or steps down
    to it at `at` (a share of the run, or "decay": where wsd's decay begins); one rate when equal."""
    start: float
    end: float
    at: float | str | None = None

    @property
    def falls(self) -> bool:
        return self.start != self.end

    def __str__(self) -> str:
        if not self.falls:
            return number_text(self.start)
        at = "" if self.at is None else "@" + (self.at if self.at == "decay" else number_text(self.at))
        return f"{number_text(self.start)}:{number_text(self.end)}{at}"


MASK_RATE_FORMS = ("a rate in (0, 1), or START:END[@AT]: START falling to END (not above START) along the run, "
                   "or stepping down to it at AT (a share of the run in (0, 1), or decay: where wsd's decay begins)")


def parse_mask_rate(text: str) -> MaskRate:
    """The MaskRate of '0.15', '0.3:0.15' (a straight line over the run), '0.3:0.15@0.8' or
    '0.3:0.15@decay' (a step)."""
    rates, step, at = text.strip().lower().partition("@")
    start, falls, end = rates.partition(":")
    try:
        switch = at if at == "decay" else float(at) if step else None
        rate = MaskRate(float(start), float(end if falls else start), switch)
    except ValueError:
        rate = None
    if rate is None or not 0 < rate.end <= rate.start < 1 or step and not falls \
            or isinstance(rate.at, float) and not 0 < rate.at < 1:
        raise ValueError(f"not a mask rate: {text!r}")
    return rate


def lower_is_better(metric: str) -> bool:
    """Whether a smaller value of a metric is better: losses and perplexities; accuracies, F1,
    correlations are better larger."""
    return "loss" in metric or "perplexity" in metric


class Target(NamedTuple):
    """A stop-at value read: a validation metric and the value that ends the run."""
    metric: str
    value: float

    def reached(self, metrics: dict[str, float | None]) -> bool:
        """Whether the validation's metric is at the target; an undefined one (None) is at none."""
        measured = metrics[self.metric]
        if measured is None:
            return False
        return measured <= self.value if lower_is_better(self.metric) else measured >= self.value

    def __str__(self) -> str:
        return f"{self.metric}:{number_text(self.value)}"


TARGET_FORMS = "METRIC:VALUE, a validation metric and a number (accuracy:0.35), or nothing"


def parse_target(text: str) -> Target | None:
    """The Target of 'METRIC:VALUE' (accuracy:0.35), or None for ''."""
    if not text.strip():
        return None
    metric, separator, value = text.strip().lower().rpartition(":")
    if not (separator and re.fullmatch(r"[a-z_]+", metric)):
        raise ValueError(f"not a target: {text!r}")
    target = Target(metric, float(value))
    if not math.isfinite(target.value):
        raise ValueError(f"not a target: {text!r}")
    return target


class Curriculum(NamedTuple):
    """A seq-len-curriculum value read: rows of `length` tokens for the first `share` of the run."""
    length: int
    share: float

    def __str__(self) -> str:
        return f"{self.length}:{number_text(self.share)}"


CURRICULUM_FORMS = ("LENGTH:SHARE, rows of LENGTH tokens (a length that divides seq-len) for that share of the "
                    "run in (0, 1] (64:0.5), or nothing")


def parse_curriculum(text: str) -> Curriculum | None:
    """The Curriculum of 'LENGTH:SHARE' (64:0.5), or None for ''."""
    if not text.strip():
        return None
    length, separator, share = text.strip().partition(":")
    curriculum = Curriculum(int(length), float(share)) if separator else None
    if curriculum is None or curriculum.length < 2 or not 0 < curriculum.share <= 1:
        raise ValueError(f"not a curriculum: {text!r}")
    return curriculum


class Grammar(NamedTuple):
    """How a key's value is read from its text, and what the text may be (for the error)."""
    parse: Callable[[str], object]
    forms: str


# The types of the keys with a small grammar (config.py's fields), each read by its parse_*.
GRAMMARS = {Duration: Grammar(parse_duration, DURATION_FORMS), Schedule: Grammar(parse_scheduler, SCHEDULER_FORMS),
            MaskRate: Grammar(parse_mask_rate, MASK_RATE_FORMS), Target: Grammar(parse_target, TARGET_FORMS),
            Curriculum: Grammar(parse_curriculum, CURRICULUM_FORMS)}


# ----------------------------------------------------------------------------- the course

def learning_rate(step: int, budget_share: float, config, resumed_at: int | None = None) -> float:
    """The rate for `step`: lr-scheduler's shape over the run (the share of the time budget spent,
    0..1, when the config has a budget, else the step); after a resume at step `resumed_at`, ramped
    back up over resume-warmup-iters steps."""
    schedule = config.lr_scheduler
    if schedule.name == "one-cycle":
        rate = one_cycle(run_progress(step, budget_share, config), schedule.peak, config)
    elif schedule.name == "wsd":
        rate = warmup(step, config) * warmup_stable_decay(run_progress(step, budget_share, config), schedule, config)
    elif schedule.name in ("cosine", "linear"):
        decay = cosine_decay if schedule.name == "cosine" else linear_decay
        rate = warmup(step, config) * decay(decay_progress(step, budget_share, config), config)
    else:
        rate = warmup(step, config) * config.learning_rate
        if schedule.name == "steplr":
            rate *= schedule.gamma ** (max(0, step - config.warmup_iters) // schedule.step)
    if resumed_at is not None and config.resume_warmup_iters:
        rate *= min(1.0, (step - resumed_at + 1) / (config.resume_warmup_iters + 1))
    return rate


def warmup(step: int, config) -> float:
    """The share of the rate during warmup-iters: a linear ramp, then 1."""
    return min(1.0, (step + 1) / (config.warmup_iters + 1))


def decay_progress(step: int, budget_share: float, config) -> float:
    """How far the decay has gone, 0..1: the share of the time budget spent, so that the floor comes
    exactly when time runs out (Cramming's budget schedules); without a budget, the share of the
    steps from warmup-iters to lr-decay-iters."""
    if config.budget_seconds:
        return min(max(budget_share, 0.0), 1.0)
    steps = max(1, config.lr_decay_iters - config.warmup_iters)
    return min(max((step - config.warmup_iters) / steps, 0.0), 1.0)


def run_progress(step: int, budget_share: float, config) -> float:
    """The share of the run done, 0..1: of the time budget, else of lr-decay-iters steps."""
    done = budget_share if config.budget_seconds else step / max(1, config.lr_decay_iters)
    return min(max(done, 0.0), 1.0)


def cosine_decay(progress: float, config) -> float:
    """learning-rate at progress 0 down to min-learning-rate at 1 along a half cosine."""
    return config.min_learning_rate + 0.5 * (1 + math.cos(math.pi * progress)) * (
        config.learning_rate - config.min_learning_rate)


def linear_decay(progress: float, config) -> float:
    """learning-rate at progress 0 down to min-learning-rate at 1 along a straight line."""
    return config.learning_rate - progress * (config.learning_rate - config.min_learning_rate)


def warmup_stable_decay(progress: float, schedule: Schedule, config) -> float:
    """learning-rate until the last `decay` share of the run, then down to min-learning-rate at its
    end along 1 - sqrt (Hägele et al. 2024, as ModernBERT and Ettin decay) or a straight line. Any
    checkpoint of the stable phase can be decayed into a finished model, or trained on for longer."""
    into = (progress - (1 - schedule.decay)) / schedule.decay
    if into <= 0:
        return config.learning_rate
    left = 1 - (math.sqrt(into) if schedule.shape == "sqrt" else into)
    return config.min_learning_rate + left * (config.learning_rate - config.min_learning_rate)


def in_stable_phase(step: int, budget_share: float, config) -> bool:
    """Whether the rate at `step` is wsd's constant one, the decay not begun."""
    schedule = config.lr_scheduler
    return schedule.name == "wsd" and run_progress(step, budget_share, config) < 1 - schedule.decay


def one_cycle(progress: float, peak: float, config) -> float:
    """The triangle of Cramming's budget schedule: a straight line from min-learning-rate up to
    learning-rate at `peak` (a share of the run), then straight down to min-learning-rate at the end."""
    low, high = config.min_learning_rate, config.learning_rate
    if progress < peak:
        return low + (high - low) * progress / peak
    return high - (high - low) * (progress - peak) / (1 - peak)


class Progress(NamedTuple):
    """Where a training step stands in its run, as the trainer hands it to a task: what a task's own
    schedule follows (the MLM's falling mask rate)."""
    step: int
    budget_share: float  # of time-budget trained (0 without one)


def mask_rate(step: int, budget_share: float, config) -> float:
    """The share of the tokens masked at `step`: mask-rate's START falling to END along a straight
    line over the run, or stepping down at its AT (a share of the run, or where wsd's decay begins);
    a higher rate early teaches more per step, a lower one late matches what the model is used on
    (Ettin and mmBERT mask 30% then less in the decay)."""
    rate = config.mask_rate
    progress = run_progress(step, budget_share, config)
    if rate.at is None:
        return rate.start + progress * (rate.end - rate.start)
    switch = 1 - config.lr_scheduler.decay if rate.at == "decay" else rate.at
    return rate.start if progress < switch else rate.end


def micro_batches(step: int, budget_share: float, config) -> int:
    """Micro-batches in the step: grad-accum-steps; under batch-ramp a staircase from one up to
    grad-accum-steps, reached at that share of the run (Cramming ramps the batch so; an early step
    on a small batch teaches as much as a late one on a large batch)."""
    if not config.batch_ramp:
        return config.grad_accum_steps
    share = run_progress(step, budget_share, config) / config.batch_ramp
    return min(config.grad_accum_steps, 1 + math.floor((config.grad_accum_steps - 1) * share))


def sequence_length(step: int, budget_share: float, config) -> int:
    """The row length of the step: seq-len-curriculum's LENGTH for its SHARE of the run, else seq-len
    (short rows first: a small model learns local context sooner, as BabyLM's entries found)."""
    curriculum = config.seq_len_curriculum
    if curriculum and run_progress(step, budget_share, config) < curriculum.share:
        return curriculum.length
    return config.seq_len


def with_run_length(config, train_examples: int, world_size: int):
    """epochs and warmup-ratio as steps: max-iters and lr-decay-iters the steps of `epochs` passes over
    the training examples at the global batch (a last short batch counts), warmup-iters the
    warmup-ratio share of them. A config with neither is returned as it is."""
    steps = config.max_iters
    if config.epochs:
        per_step = config.batch_size * config.grad_accum_steps * world_size
        steps = max(1, math.ceil(config.epochs * train_examples / per_step))
        config = dataclasses.replace(config, max_iters=steps, lr_decay_iters=steps,
                                     warmup_iters=min(config.warmup_iters, steps))
    if config.warmup_ratio:
        config = dataclasses.replace(config, warmup_iters=round(config.warmup_ratio * steps))
    return config
