"""Training settings: one typed Config, the keys' names and types, the rule for each key and between
keys (ini.py reads files and the command line into it)."""
import difflib
import math
import re
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Callable, NamedTuple

from errors import UserError


class Rule(NamedTuple):
    check: Callable[[Any], bool]
    text: str  # what is expected, after "expected a number"


def at_least(low) -> Rule:
    return Rule(lambda value: value >= low, f">= {low}")


def above(low) -> Rule:
    return Rule(lambda value: value > low, f"> {low}")


def within(low, high, brackets: str = "[]") -> Rule:
    """Interval in maths notation: '[)' includes low and excludes high."""
    def check(value) -> bool:
        above_low = low < value if brackets[0] == "(" else low <= value
        below_high = value < high if brackets[1] == ")" else value <= high
        return above_low and below_high
    return Rule(check, f"in {brackets[0]}{low}, {high}{brackets[1]}")


DURATION = re.compile(r"(\d+(?:\.\d*)?|\.\d+)\s*([smh])")
SECONDS_PER_UNIT = {"s": 1, "m": 60, "h": 3600}


def duration_seconds(text: str) -> float | None:
    """Seconds in '90s', '30m', '1.5h' or '0' (no budget); None when the text is none of these."""
    text = text.strip().lower()
    if text in ("0", ""):
        return 0.0
    match = DURATION.fullmatch(text)
    return float(match.group(1)) * SECONDS_PER_UNIT[match.group(2)] if match else None


def one_of(*choices: str) -> Rule:
    return Rule(lambda value: value in choices, "one of " + ", ".join(choices))


# The tasks; main.py maps each name to its task class.
CLASSIFICATION_TASKS = ("sst2", "cola", "classify")
TASK_TYPES = ("mlm", "clm", "electra", *CLASSIFICATION_TASKS)
# Other names for keys and values, as the project this one replaces spelled them.
KEY_ALIASES = {"n_layers": "n_layer", "t": "task_type"}
VALUE_ALIASES = {"task_type": {"gpt": "clm"}}
# The model variants; model.py checks ModelConfig against the same tuples.
NORMS = ("postln", "preln", "rmsnorm")
POSITIONS = ("learned", "rope", "sinusoidal")
FEED_FORWARDS = ("gelu", "geglu")
POOLINGS = ("cls", "mean")
SENTENCE_OBJECTIVES = ("none", "nsp", "sop")  # also what a shard's sentence pairs are labelled for

# One table for every per-field check; fields not listed accept any value of their type.
RULES = {
    "task_type": one_of(*TASK_TYPES),
    "seq_len": within(8, 2048),
    "batch_size": at_least(1),
    "grad_accum_steps": at_least(1),
    "val_interval": at_least(1),
    "val_iters": at_least(1),
    "log_interval": at_least(1),
    "d_model": at_least(1),
    "heads": at_least(1),
    "n_layer": at_least(1),
    "d_ff": at_least(0),
    "dropout": within(0, 1, "[)"),
    "norm": one_of(*NORMS),
    "position": one_of(*POSITIONS),
    "feed_forward": one_of(*FEED_FORWARDS),
    "sentence_objective": one_of(*SENTENCE_OBJECTIVES),
    "pooling": one_of(*POOLINGS),
    "dtype": one_of("auto", "bfloat16", "float16", "float32"),
    "device": Rule(lambda value: re.fullmatch(r"auto|cpu|cuda(:\d+)?", value) is not None,
                   "auto, cpu, cuda or cuda:N"),
    "learning_rate": above(0),
    "min_learning_rate": at_least(0),
    "warmup_iters": at_least(0),
    "lr_decay_iters": at_least(0),
    "max_iters": at_least(1),
    "test_iters": at_least(0),
    "resume_warmup_iters": at_least(0),
    "dataset_percentage": within(0, 1, "(]"),
    "val_dataset_percentage": within(0, 1, "(]"),
    "lr_scheduler": Rule(lambda value: scheduler_problem(value) is None,
                         "cosine, none or steplr:STEP:GAMMA (STEP a positive integer, GAMMA in (0, 1])"),
    "run_id": Rule(lambda value: value == "" or re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", value) is not None,
                   "a directory name: letters, digits, '.', '_' or '-', no path separator"),
    "dist_backend": one_of("auto", "nccl", "gloo"),
    "peak_tflops": at_least(0),
    "weight_decay": at_least(0),
    "layer_lr_decay": within(0, 1, "(]"),
    "beta1": within(0, 1, "[)"),
    "beta2": within(0, 1, "[)"),
    "grad_clip": at_least(0),
    "mask_rate": within(0, 1, "()"),
    "masking": one_of("dynamic", "static"),
    "mask_replace_mask": within(0, 1),
    "mask_replace_random": within(0, 1),
    "seed": at_least(0),  # numpy seeds must be non-negative
    "base_dir": Rule(bool, "a non-empty path"),
    "num_labels": at_least(2),
    "dist_master_port": within(1, 65535),
    "max_checkpoints": at_least(1),
    "generator_width": within(0, 1, "(]"),
    "detection_weight": above(0),
    "time_budget": Rule(lambda value: duration_seconds(value) is not None,
                        "a duration such as 90s, 30m or 2h (0: no budget)"),
}


def attention_shape_problem(d_model: int, heads: int, position: str) -> str | None:
    """What is wrong with an attention shape, in INI keys, or None; model.py checks ModelConfig with it too."""
    if d_model % heads:
        return f"d-model = {d_model} is not divisible by heads = {heads}"
    if position == "rope" and d_model // heads % 2:
        return f"position = rope needs an even head width, but d-model / heads = {d_model} / {heads} is odd"
    return None


def scheduler_problem(text: str) -> str | None:
    """What is wrong with an lr-scheduler value, or None; optimizer.py reads it with parse_scheduler."""
    try:
        parse_scheduler(text)
    except ValueError as error:
        return str(error)
    return None


def parse_scheduler(text: str) -> tuple[str, int, float]:
    """('cosine' | 'none' | 'steplr', step, gamma) from 'cosine', 'none' or 'steplr:STEP:GAMMA'."""
    name, *arguments = text.strip().lower().split(":")
    if name in ("cosine", "none") and not arguments:
        return name, 0, 1.0
    if name == "steplr" and len(arguments) == 2:
        step, gamma = int(arguments[0]), float(arguments[1])
        if step >= 1 and 0 < gamma <= 1:
            return name, step, gamma
    raise ValueError(f"not a scheduler: {text!r}")


def replacement_shares_problem(replace_mask: float, replace_random: float) -> str | None:
    """The shares of picked tokens shown as [MASK] and as a random token must leave room for the rest."""
    if replace_mask + replace_random > 1 + 1e-9:  # 0.7 + 0.3 may round up
        return f"mask-replace-mask = {replace_mask} plus mask-replace-random = {replace_random} exceed 1"
    return None


# Checks between fields, run after the per-field ones: each gives a message, or None when it holds.
CROSS_FIELD_RULES = (
    lambda v: attention_shape_problem(v["d_model"], v["heads"], v["position"]),
    lambda v: replacement_shares_problem(v["mask_replace_mask"], v["mask_replace_random"]),
    lambda v: None if v["masking"] == "dynamic" or v["task_type"] == "mlm" else
    f"masking = static goes with task-type = mlm, not {v['task_type']}",
    lambda v: None if v["sentence_objective"] == "none" or v["task_type"] == "mlm" else
    f"sentence-objective = {v['sentence_objective']} goes with task-type = mlm, not {v['task_type']}",
    lambda v: None if v["min_learning_rate"] <= v["learning_rate"] else
    f"min-learning-rate = {v['min_learning_rate']} is above learning-rate = {v['learning_rate']}",
    lambda v: None if v["lr_decay_iters"] >= v["warmup_iters"] else
    f"lr-decay-iters = {v['lr_decay_iters']} is below warmup-iters = {v['warmup_iters']}",
    lambda v: None if not duration_seconds(v["time_budget"]) or v["max_iters"] >= v["warmup_iters"] else
    f"time-budget = {v['time_budget']} with max-iters = {v['max_iters']} below warmup-iters = {v['warmup_iters']}: "
    f"the run would stop before warming up",
)


@dataclass(frozen=True)
class Config:
    """Every setting of a run. INI keys are the field names with '-' for '_'."""
    task_type: str = "mlm"  # mlm/clm/electra: pre-training; sst2/classify: single-sentence classification
    seq_len: int = 128
    batch_size: int = 32  # per process
    # Classification: training batches of similar-length sentences (less padding); MLM samples
    # are all padded to seq-len, so MLM ignores it.
    length_grouping: bool = True
    grad_accum_steps: int = 1
    val_interval: int = 100
    val_iters: int = 20  # batches per validation
    log_interval: int = 10
    d_model: int = 256
    heads: int = 4
    n_layer: int = 4
    d_ff: int = 0  # 0: as many parameters as 4 * d_model with gelu, see feed_forward_size
    dropout: float = 0.1
    # Not BERT's post-LN with learned positions: on a small budget those stay on the unigram
    # plateau (README: where the recipe differs from BERT's paper). --norm postln --position learned is BERT.
    norm: str = "preln"  # postln (BERT), preln (LayerNorm before each sublayer), rmsnorm (preln, RMSNorm)
    position: str = "rope"  # learned absolute positions (BERT), sinusoidal, or rope (rotary, in attention)
    feed_forward: str = "gelu"  # gelu (BERT), or geglu (gated GELU)
    sentence_objective: str = "none"  # with task-type mlm: nsp (next sentence) or sop (sentence order)
    # task-type electra: the generator has this share of the heads (at least one, each as wide, the
    # same depth), and the loss is generator MLM + detection-weight x replaced-token detection.
    generator_width: float = 0.25
    detection_weight: float = 50.0
    async_to_device: bool = True
    fused_adamw: bool = True
    compile: bool = False
    dtype: str = "auto"
    device: str = "auto"
    learning_rate: float = 1e-3  # pre-LN trains stably at rates BERT's post-LN does not (BERT: 1e-4)
    min_learning_rate: float = 1e-4
    warmup_iters: int = 300
    lr_decay_iters: int = 10_000
    max_iters: int = 10_000  # with a time budget: a cap on the steps, the budget decides the schedule
    # After warmup: cosine decay to min-learning-rate at lr-decay-iters; none: constant;
    # steplr:STEP:GAMMA: times GAMMA every STEP steps.
    lr_scheduler: str = "cosine"
    resume_warmup_iters: int = 0  # after a resume, ramp the rate back up over this many steps; 0: no ramp
    test_iters: int = 0  # batches scored by --test; 0: the whole test split
    # Training time for the whole run ("30m"); the learning rate decays with the share spent and the
    # run ends when it is. Validation is not charged. 0: no budget, max-iters and lr-decay-iters rule.
    time_budget: str = "0"
    weight_decay: float = 0.01
    # Each encoder layer learns at this share of the rate of the one above it, the embeddings at
    # the lowest; heads at the full rate. 1: one rate for all (ELECTRA fine-tunes with 0.8).
    layer_lr_decay: float = 1.0
    beta1: float = 0.9
    beta2: float = 0.999
    grad_clip: float = 1.0  # 0 disables clipping
    mask_rate: float = 0.15
    masking: str = "dynamic"  # dynamic: a fresh mask per batch; static: the masks stored in the shards
    whole_word_masking: bool = False  # pick whole words: a piece and the `##` pieces after it
    mask_replace_mask: float = 0.8  # share of the picked tokens shown as [MASK]
    mask_replace_random: float = 0.1  # shown as a random token; the rest stay unchanged
    seed: int = 1337
    # A legacy key: `case = dickens` selected MLM pre-training in the project this one replaces.
    # Accepted so old files load, otherwise ignored: task_type decides what runs.
    case: str = ""
    base_dir: str = "."
    vocab: str = ""  # vocab.txt or its directory; "" means base_dir/vocab
    datasets_dir: str = ""  # the shards' and classification files' directory; "": base_dir/datasets
    dataset_pattern: str = "train_*.msgpack"
    val_dataset_pattern: str = "val_*.msgpack"
    test_dataset_pattern: str = "test_*.msgpack"
    # A seeded, fixed share of the training (validation) samples, for quick runs on a small machine.
    dataset_percentage: float = 1.0
    val_dataset_percentage: float = 1.0
    run_id: str = ""  # the run directory's name under runs/; "": the next free runN
    num_labels: int = 2
    pooling: str = "cls"  # sst2/classify: what the classifier reads, cls (BERT) or mean (of the real tokens)
    dist_master_addr: str = "127.0.0.1"
    dist_master_port: int = 12233
    dist_backend: str = "auto"  # auto: nccl on CUDA, gloo on CPU
    max_checkpoints: int = 1
    wandb: bool = False
    # Accepted for old files: attention always runs PyTorch's fused kernels (scaled_dot_product_attention).
    flash: bool = True
    peak_tflops: float = 0.0  # the matmul peak MFU is measured against; 0: published (CUDA) or measured
    # Not a key: the config files read, in order, and the keys they or the command line set.
    sources: tuple[str, ...] = field(default=(), compare=False, metadata={"ini": False})
    given: frozenset[str] = field(default=frozenset(), compare=False, metadata={"ini": False})

    def __post_init__(self):
        validate(vars(self), {}, "config")

    @property
    def vocab_path(self) -> Path:
        return Path(self.vocab) if self.vocab else Path(self.base_dir) / "vocab"

    @property
    def datasets_path(self) -> Path:
        return Path(self.datasets_dir) if self.datasets_dir else Path(self.base_dir) / "datasets"

    @property
    def runs_dir(self) -> Path:
        return Path(self.base_dir) / "runs"

    def share_of(self, split: str) -> float:
        """dataset-percentage for train, val-dataset-percentage for val; the test split is whole."""
        return {"train": self.dataset_percentage, "val": self.val_dataset_percentage}.get(split, 1.0)

    @property
    def budget_seconds(self) -> float:
        """time-budget in seconds; 0 when there is none."""
        return duration_seconds(self.time_budget)

    @property
    def feed_forward_size(self) -> int:
        """d-ff, or by default 4 * d-model; for geglu, whose input matrix is twice as wide,
        8/3 * d-model rounded up to a multiple of 8: the same parameter count."""
        if self.d_ff:
            return self.d_ff
        if self.feed_forward == "geglu":
            return -(-8 * self.d_model // 3 // 8) * 8
        return 4 * self.d_model

    def to_dict(self) -> dict[str, Any]:
        """INI key -> plain value; safe for torch.save and torch.load(weights_only=True)."""
        return {INI_KEYS[name]: getattr(self, name) for name in FIELD_TYPES}

    @classmethod
    def from_dict(cls, settings: dict[str, Any], source: str = "saved config") -> "Config":
        """Rebuild from to_dict() output (or strings); missing keys take their defaults."""
        values = dict(DEFAULTS)
        for key, value in settings.items():
            name = known_name(key, source)
            values[name] = typed_value(name, value, source)
        validate(values, {}, source)
        return cls(**values)

    def replace(self, **changes) -> "Config":
        """A validated copy with some fields changed (field names with '_')."""
        changes = {INI_KEYS.get(name, name): value for name, value in changes.items()}
        return Config.from_dict(self.to_dict() | changes, source="Config.replace")

    def describe(self) -> list[str]:
        """'key = value' lines in INI syntax, for the log."""
        return [f"{key} = {ini_text(value)}".rstrip() for key, value in self.to_dict().items()]


FIELD_TYPES = {field.name: field.type for field in fields(Config) if field.metadata.get("ini", True)}
DEFAULTS = {name: field.default for field in fields(Config) if (name := field.name) in FIELD_TYPES}
INI_KEYS = {name: name.replace("_", "-") for name in FIELD_TYPES}
TYPE_NOUNS = {int: "an integer", float: "a number", str: "a string",
              bool: "a boolean (true/false, yes/no, on/off, 1/0)"}
BOOLEANS = {"true": True, "yes": True, "on": True, "1": True,
            "false": False, "no": False, "off": False, "0": False}


def known_name(key: str, origin: str | None) -> str:
    """Field name for an INI key or option (case-insensitive, '_' = '-'), or a UserError."""
    name = key.strip().lower().replace("-", "_")
    name = KEY_ALIASES.get(name, name)
    if name in FIELD_TYPES:
        return name
    ini_key = name.replace("_", "-")
    close = difflib.get_close_matches(ini_key, INI_KEYS.values(), n=1)
    if origin is None:  # a command-line override
        hint = f" (did you mean --{close[0]}?)" if close else ""
        raise UserError(f"--{ini_key}: unknown option{hint}")
    hint = f" (did you mean '{close[0]}'?)" if close else ""
    raise UserError(f"{origin}: unknown key '{ini_key}'{hint}")


def typed_value(name: str, value: Any, origin: str) -> Any:
    """Convert text (or an already typed value) to the field's type, or a UserError."""
    kind = FIELD_TYPES[name]
    if isinstance(value, str):
        value = VALUE_ALIASES.get(name, {}).get(value.strip().lower(), value)
    try:
        return convert(kind, value)
    except (KeyError, ValueError):
        raise UserError(f"{located(origin, name, value)}: expected {TYPE_NOUNS[kind]}") from None


def convert(kind: type, value: Any) -> Any:
    if isinstance(value, str) and kind is not str:
        value = value.strip()
        if kind is bool:
            return BOOLEANS[value.lower()]
        number = kind(value)  # int() and float() accept '45_000' and '1_000.5'
        if not math.isfinite(number):
            raise ValueError(value)
        return number
    if kind is float and type(value) in (int, float):
        return float(value)
    if type(value) is not kind:  # `type is` because bool is a subclass of int
        raise ValueError(value)
    return value


def validate(values: dict[str, Any], origins: dict[str, str], source: str) -> None:
    """Per-field rules, then cross-field ones; the first problem raises a UserError."""
    for name, rule in RULES.items():
        if not rule.check(values[name]):
            kind = FIELD_TYPES[name]
            expected = rule.text if kind is str else f"{TYPE_NOUNS[kind]} {rule.text}"
            where = located(origins.get(name, source), name, values[name])
            raise UserError(f"{where}: expected {expected}")
    for rule in CROSS_FIELD_RULES:
        problem = rule(values)
        if problem:
            raise UserError(f"{source}: {problem}")


def located(origin: str, name: str, value: Any) -> str:
    """'file:7: key = value' for files, '--key value' for command-line overrides."""
    if origin.startswith("--"):
        return f"{origin} {ini_text(value)}"
    shown = repr(value) if isinstance(value, str) else ini_text(value)
    return f"{origin}: {INI_KEYS[name]} = {shown}"


def ini_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)
