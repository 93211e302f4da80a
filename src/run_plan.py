"""The small grammars of the keys that plan a run's course: time-budget, lr-scheduler, mask-rate,
seq-len-curriculum and stop-at, each read from its text into a value (config.py checks each key with
the same function that the trainer and optimizer read it with)."""
import re
from typing import Any, Callable, NamedTuple


DURATION = re.compile(r"(\d+(?:\.\d*)?|\.\d+)\s*([smh])")
SECONDS_PER_UNIT = {"s": 1, "m": 60, "h": 3600}


def duration_seconds(text: str) -> float | None:
    """Seconds in '90s', '30m', '1.5h' or '0' (no budget); None when the text is none of these."""
    text = text.strip().lower()
    if text in ("0", ""):
        return 0.0
    match = DURATION.fullmatch(text)
    return float(match.group(1)) * SECONDS_PER_UNIT[match.group(2)] if match else None


class Schedule(NamedTuple):
    """An lr-scheduler value read: its name and arguments (steplr's step and gamma, one-cycle's peak,
    wsd's decay share and shape)."""
    name: str
    step: int = 0
    gamma: float = 1.0
    peak: float = 0.5
    decay: float = 0.2  # 20% with 1 - sqrt matches a cosine's loss (Hägele et al. 2024)
    shape: str = "sqrt"


WSD_SHAPES = ("sqrt", "linear")
SCHEDULER_FORMS = ("cosine, linear, none (constant), steplr:STEP:GAMMA (STEP a positive integer, GAMMA in (0, 1]), "
                   "one-cycle[:PEAK] (PEAK in (0, 1)) or wsd[:DECAY[:SHAPE]] (DECAY in (0, 1], SHAPE sqrt or linear)")


def parses(parse: Callable[[str], Any], text: str) -> bool:
    """Whether a parse_* function reads the value (the Rule of a key with a small grammar); the
    code that uses the key reads it with the same function."""
    try:
        parse(text)
    except ValueError:
        return False
    return True


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
        return f"{self.metric}:{self.value:g}"


def parse_target(text: str) -> Target | None:
    """The Target of 'METRIC:VALUE' (accuracy:0.35), or None for ''."""
    if not text.strip():
        return None
    metric, separator, value = text.strip().lower().rpartition(":")
    if not (separator and re.fullmatch(r"[a-z_]+", metric)):
        raise ValueError(f"not a target: {text!r}")
    return Target(metric, float(value))


class Curriculum(NamedTuple):
    """A seq-len-curriculum value read: rows of `length` tokens for the first `share` of the run."""
    length: int
    share: float


def parse_curriculum(text: str) -> Curriculum | None:
    """The Curriculum of 'LENGTH:SHARE' (64:0.5), or None for ''."""
    if not text.strip():
        return None
    length, separator, share = text.strip().partition(":")
    curriculum = Curriculum(int(length), float(share)) if separator else None
    if curriculum is None or curriculum.length < 2 or not 0 < curriculum.share <= 1:
        raise ValueError(f"not a curriculum: {text!r}")
    return curriculum
