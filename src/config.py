"""Training settings: one typed Config, the keys' names and types, the rule for each key and between
keys (ini.py reads files and the command line into it), and the model (model.ModelConfig) a Config describes."""
import difflib
import math
import re
import types
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Callable, NamedTuple, get_args

from architecture import (ANSWERS, CLASSIFICATION, EMBEDDING, FEED_FORWARDS, NORMS, POOLINGS, POSITIONS, ROPE_THETA,
                          TASK_KINDS, TOKENS, USER_CLASS_TASKS, ModelConfig, attention_shape_problem, tasks_of)
from errors import UserError
from run_plan import GRAMMARS, Curriculum, Duration, MaskRate, Schedule, Target


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


def one_of(*choices: str) -> Rule:
    return Rule(lambda value: value in choices, "one of " + ", ".join(choices))


# Sets of task-types, from architecture.TASK_KINDS' one line each (task-type itself is checked against
# TASK_KINDS as a config is made).
CLASSIFICATION_TASKS = tasks_of(CLASSIFICATION)
FINE_TUNING_TASKS = tasks_of(CLASSIFICATION, TOKENS, ANSWERS, EMBEDDING)
SENTENCE_TASKS = tuple(name for name, kind in TASK_KINDS.items() if kind.single_text)  # one text per example
TAUGHT_TASKS = tuple(name for name, kind in TASK_KINDS.items() if kind.taught)  # the tasks that take a teacher
LABELLED_FILE_KEYS = ("train_file", "validation_file", "test_file")  # classify(_pair) on your own files
SENTENCE_OBJECTIVES = ("none", "nsp", "sop")  # the names a shard's pairs are labelled for too (shards.PAIRS)


def curriculum_problem(values: dict) -> str | None:
    """A curriculum cuts whole rows of plain MLM batches into equal pieces."""
    curriculum = text = values["seq_len_curriculum"]
    if curriculum is None:
        return None
    if curriculum.length >= values["seq_len"] or values["seq_len"] % curriculum.length:
        return (f"seq-len-curriculum = {text}: {curriculum.length} must divide seq-len = {values['seq_len']} "
                f"and be shorter")
    if values["task_type"] != "mlm" or values["masking"] != "dynamic" or values["sentence_objective"] != "none":
        return (f"seq-len-curriculum = {text} goes with task-type = mlm, masking = dynamic and "
                f"sentence-objective = none: stored masks and sentence pairs do not survive cutting rows")
    return None


def replacement_shares_problem(values: dict) -> str | None:
    """The shares of picked tokens shown as [MASK] and as a random token must leave room for the rest."""
    replace_mask, replace_random = values["mask_replace_mask"], values["mask_replace_random"]
    if replace_mask + replace_random > 1 + 1e-9:  # 0.7 + 0.3 may round up
        return f"mask-replace-mask = {replace_mask} plus mask-replace-random = {replace_random} exceed 1"
    return None


def mask_rate_problem(values: dict) -> str | None:
    """A falling mask-rate needs masks drawn as the run goes (dynamic, by a task that masks); one that
    steps down at the decay needs the decay of wsd."""
    rate = text = values["mask_rate"]
    if not rate.falls:
        return None
    if values["masking"] != "dynamic" or values["task_type"] not in ("mlm", "electra"):
        return (f"mask-rate = {text} falls along the run: it goes with masking = dynamic and task-type = mlm or "
                f"electra, not masking = {values['masking']}, task-type = {values['task_type']}")
    if rate.at == "decay" and values["lr_scheduler"].name != "wsd":
        return f"mask-rate = {text} steps down where wsd's decay begins, but lr-scheduler = {values['lr_scheduler']}"
    return None


def own_files_problem(values: dict) -> str | None:
    """classify and classify_pair read the user's files: train-file and validation-file together; the
    other file keys and the columns only with them (a GLUE task reads glue-dir's layout). One score a
    text (num-labels = 1) comes from the user's files, and has no class names."""
    regression = values["num_labels"] == 1 and values["task_type"] in USER_CLASS_TASKS
    if regression and values["multi_label"]:
        return "multi-label = true is any number of classes an example, but num-labels = 1 is one score a text"
    if regression and values["labels"].strip():
        return f"labels = {values['labels'].strip()} names classes, but num-labels = 1 is one score a text (regression)"
    if regression and not values["train_file"]:
        return ("num-labels = 1 (one score a text: regression) reads its numbers from your own files: "
                "set train-file and validation-file")
    given = [name for name in (*LABELLED_FILE_KEYS, "text_column", "text_pair_column", "multi_label") if values[name]]
    given += ["label_column"] if values["label_column"] != "label" else []
    if not given:
        return None
    if values["task_type"] not in USER_CLASS_TASKS:
        return (f"{INI_KEYS[given[0]]} goes with task-type = classify or classify_pair, not {values['task_type']} "
                f"(a GLUE task reads glue-dir's layout)")
    if bool(values["train_file"]) != bool(values["validation_file"]):
        return "train-file and validation-file go together: a run trains on one and scores on the other"
    if not values["train_file"]:
        return f"{INI_KEYS[given[0]]} goes with train-file"
    if values["text_pair_column"] and values["task_type"] != "classify_pair":
        return f"text-pair-column goes with task-type = classify_pair, not {values['task_type']}"
    return None


def warms_up(values: dict) -> bool:
    """Whether warmup-iters applies: every schedule but one-cycle, whose rise is its warmup."""
    return values["lr_scheduler"].name != "one-cycle"


def replay_clock_problem(values: dict) -> str | None:
    """replay-clock plays back a time budget's clock: a run without a budget has none to replay."""
    if values["replay_clock"] and not values["time_budget"].seconds:
        return f"replay-clock = {values['replay_clock']} goes with a time-budget (the run it repeats had one)"
    return None


def shape_problem(values: dict) -> str | None:
    """d-model splits evenly into heads, and a rope head's width is even (architecture's rule)."""
    return attention_shape_problem(values["d_model"], values["heads"], values["position"])


def rope_theta_problem(values: dict) -> str | None:
    """rope-theta tunes rotary positions: another position has no use for it."""
    if values["rope_theta"] == ROPE_THETA or values["position"] == "rope":
        return None
    return f"rope-theta = {values['rope_theta']:g} goes with position = rope, not position = {values['position']}"


def static_masking_problem(values: dict) -> str | None:
    """Stored (static) masks are mlm's: other tasks mask as they go or not at all."""
    if values["masking"] == "dynamic" or values["task_type"] == "mlm":
        return None
    return f"masking = static goes with task-type = mlm, not {values['task_type']}"


def sentence_objective_problem(values: dict) -> str | None:
    """A sentence objective (nsp, sop) trains alongside mlm only."""
    if values["sentence_objective"] == "none" or values["task_type"] == "mlm":
        return None
    return f"sentence-objective = {values['sentence_objective']} goes with task-type = mlm, not {values['task_type']}"


def epochs_problem(values: dict) -> str | None:
    """epochs counts passes over a fine-tuning's data; pre-training counts max-iters."""
    if not values["epochs"] or values["task_type"] in FINE_TUNING_TASKS:
        return None
    return (f"epochs = {values['epochs']} goes with a fine-tuning task, not task-type = {values['task_type']} "
            f"(use max-iters)")


def run_length_problem(values: dict) -> str | None:
    """A run has one length: epochs or a time-budget, not both."""
    if not (values["epochs"] and values["time_budget"].seconds):
        return None
    return f"epochs = {values['epochs']} and time-budget = {values['time_budget']}: give one run length, not both"


def distill_teacher_problem(values: dict) -> str | None:
    """distill learns from a teacher, so it needs one."""
    if values["task_type"] != "distill" or values["teacher"]:
        return None
    return ("task-type = distill needs teacher = PATH (a transformers or sentence-transformers directory, "
            "or a checkpoint)")


def logit_weight_problem(values: dict) -> str | None:
    """logit-weight weighs distill's match of the teacher's logits: other tasks have none."""
    if not values["logit_weight"] or values["task_type"] == "distill":
        return None
    return f"logit-weight = {values['logit_weight']:g} goes with task-type = distill, not {values['task_type']}"


def teacher_problem(values: dict) -> str | None:
    """A teacher goes only with the tasks that learn from one (TAUGHT_TASKS)."""
    if not values["teacher"] or values["task_type"] in TAUGHT_TASKS:
        return None
    return (f"teacher = {values['teacher']} goes with task-type = distill, embed or a classification task, "
            f"not {values['task_type']}")


def transfer_data_problem(values: dict) -> str | None:
    """transfer-data is texts a teacher labels, for a task of single texts or embed."""
    if not values["transfer_data"] or (values["teacher"] and values["task_type"] in (*SENTENCE_TASKS, "embed")):
        return None
    return (f"transfer-data = {values['transfer_data']} goes with a teacher and a task of single texts "
            f"({', '.join(SENTENCE_TASKS)}, embed), not task-type = {values['task_type']}"
            + ("" if values["teacher"] else " without one"))


def batch_ramp_problem(values: dict) -> str | None:
    """A batch ramp grows the step in micro-batches, so it needs grad-accum-steps above 1."""
    if not values["batch_ramp"] or values["grad_accum_steps"] > 1:
        return None
    return (f"batch-ramp = {values['batch_ramp']} needs grad-accum-steps above 1: the ramp grows the step from one "
            f"micro-batch to grad-accum-steps of them")


def batch_ramp_epochs_problem(values: dict) -> str | None:
    """A batch ramp changes the steps an epoch takes, so it goes with max-iters, not epochs."""
    if not (values["batch_ramp"] and values["epochs"]):
        return None
    return (f"batch-ramp = {values['batch_ramp']} and epochs = {values['epochs']}: a ramp changes the steps an "
            f"epoch takes; give max-iters instead")


def min_learning_rate_problem(values: dict) -> str | None:
    """min-learning-rate is the floor the schedule decays to, so it is not above learning-rate."""
    if values["min_learning_rate"] <= values["learning_rate"]:
        return None
    return f"min-learning-rate = {values['min_learning_rate']} is above learning-rate = {values['learning_rate']}"


def decay_iters_problem(values: dict) -> str | None:
    """The decay ends after the warmup, when warmup-iters counts (no warmup-ratio, epochs or one-cycle)."""
    if (values["lr_decay_iters"] >= values["warmup_iters"] or values["warmup_ratio"] or values["epochs"]
            or not warms_up(values)):
        return None
    return f"lr-decay-iters = {values['lr_decay_iters']} is below warmup-iters = {values['warmup_iters']}"


def warmup_within_budget_problem(values: dict) -> str | None:
    """A time-budgeted run's max-iters reaches the end of its warmup, or it stops before warming up."""
    if not values["time_budget"].seconds or values["max_iters"] >= values["warmup_iters"] or not warms_up(values):
        return None
    return (f"time-budget = {values['time_budget']} with max-iters = {values['max_iters']} below "
            f"warmup-iters = {values['warmup_iters']}: the run would stop before warming up")


# Checks between keys, run in this order after the per-key ones: each gives a message, or None when it holds.
CROSS_FIELD_RULES = (
    replay_clock_problem,
    shape_problem,
    rope_theta_problem,
    replacement_shares_problem,
    static_masking_problem,
    sentence_objective_problem,
    epochs_problem,
    run_length_problem,
    distill_teacher_problem,
    logit_weight_problem,
    teacher_problem,
    transfer_data_problem,
    own_files_problem,
    curriculum_problem,
    mask_rate_problem,
    batch_ramp_problem,
    batch_ramp_epochs_problem,
    min_learning_rate_problem,
    decay_iters_problem,
    warmup_within_budget_problem,
)


def check_unique_names(names: tuple[str, ...], where: str):
    """Each output's name its own: two ids of one name would leave one output never trained."""
    twice = sorted({name for name in names if names.count(name) > 1}, key=names.index)
    if twice:
        raise UserError(f"{where}: {', '.join(twice)} named twice; each label needs a name of its own")


def key(default, meaning: str, rule: Rule | None = None, *, group: str | None = None):
    """A config key: its default, what it means (one line for --help), its rule, and, on the first
    key of a group, the group's title as config.ini.example heads it."""
    return field(default=default, metadata={"meaning": meaning, "rule": rule, "group": group})


@dataclass(frozen=True)
class Config:
    """Every setting of a run, grouped as config.ini.example groups them. INI keys are the field
    names with '-' for '_'; config.ini.example says more about each."""
    task_type: str = key("mlm", "mlm, clm, electra, distill (from a teacher): pre-training; a GLUE task (cola, "
                         "sst2, mrpc, qqp, stsb, mnli, qnli, rte, wnli), classify or classify_pair (your own "
                         "classes of a text or a pair), ner (a tag per word), squad or squad_v2 (answers from a "
                         "context), embed (sentence embeddings): fine-tuning",
                         Rule(lambda value: value in TASK_KINDS, "one of " + ", ".join(TASK_KINDS)), group="Task")
    sentence_objective: str = key("none", "mlm only: none, nsp (next sentence) or sop (sentence order)",
                                  one_of(*SENTENCE_OBJECTIVES))
    num_labels: int = key(2, "classify, classify_pair: their classes, or 1: a score to predict (regression, on "
                          "train-file's numbers); a GLUE task has its own", at_least(1))
    tag_column: str = key("ner_tags", "ner: the tags' parquet column; in CoNLL text ner_tags is the last column, "
                          "pos_tags the 2nd, chunk_tags the 3rd, or a column number", Rule(bool, "a column"))
    labels: str = key("", "ner: the tag names in the ids' order; classify(_pair): the class names in the ids' order; "
                      "comma-separated; empty: from the data")
    train_file: str = key("", "classify(_pair): your own training examples, a .csv, .tsv, .jsonl or .parquet file "
                          "with a text (two) and a label column (with validation-file; in place of glue-dir's layout)")
    validation_file: str = key("", "classify(_pair): the examples each validation scores (best.pt goes by them)")
    test_file: str = key("", "classify(_pair): the examples --test scores, writing each one's prediction and its "
                         "probability beside the scores (without a label column, those alone)")
    text_column: str = key("", "classify, with train-file: the text's column; empty: text, else sentence "
                           "(classify_pair: the first text's; empty: text, else sentence1)")
    text_pair_column: str = key("", "classify_pair, with train-file: the second text's column; empty: text_pair, "
                                "else sentence2")
    label_column: str = key("label", "classify(_pair), with train-file: the label's column (names or numbers)",
                            Rule(bool, "a column name"))
    multi_label: bool = key(False, "classify(_pair), with train-file: any number of the classes an example (a list "
                                   "of names, or names between commas; none: empty), a sigmoid each")
    doc_stride: int = key(32, "squad: the pieces two windows of a long context share (run_qa's 128 goes with "
                          "seq-len 384)", at_least(0))
    max_query_length: int = key(64, "squad: a question's pieces beyond this are cut", at_least(1))
    max_answer_length: int = key(30, "squad: the longest answer predicted, in pieces", at_least(1))
    null_score_threshold: float = key(0.0, "squad_v2: answer nothing where [CLS]'s score beats the best span's "
                                      "by more than this")
    pooling: str = key("cls", "what the classifier (or embed's embedding) reads: cls ([CLS]'s state) or mean (of "
                       "the real tokens)", one_of(*POOLINGS))
    temperature: float = key(0.05, "embed: the contrastive loss divides cosine similarities by this "
                             "(sentence-transformers' scale 20)", within(0, 1, "(]"))
    generator_width: float = key(0.25, "electra: the generator's share of the heads", within(0, 1, "(]"))
    detection_weight: float = key(50.0, "electra: loss = generator MLM + this x replaced-token detection",
                                  above(0))
    teacher: str = key("", "distill: the teacher, a transformers BERT or sentence-transformers directory or a "
                       "checkpoint .pt; a classification task: a classifier of its classes whose outputs the "
                       "student learns (mean squared error of the logits) besides the labels; embed: an "
                       "embedding model whose cosine similarities the student learns; the run's vocab "
                       "must be the teacher's")
    transfer_data: str = key("", "a single-sentence task or embed, with a teacher: unlabelled text (a file, "
                             "directory or pattern, in any format prepare_mlm_dataset.py reads) whose sentences "
                             "the teacher labels and the student learns too")
    teacher_layer: int = key(0, "distill: the teacher layer (from 1) whose self-attention relations the "
                             "student's last layer learns; 0: its last", at_least(0))
    relation_heads: int = key(0, "distill: the relation heads q, k and v are re-split into on both sides (each "
                              "width divisible by it); 0: the teacher's heads", at_least(0))
    logit_weight: float = key(0.0, "distill: the weight of the KL from the teacher's MLM predictions at masked "
                              "tokens to the student's, beside the relations (both then read masked input; the "
                              "teacher needs an MLM head); 0: the relations alone", at_least(0))

    base_dir: str = key(".", "holds vocab/, datasets/ and runs/", Rule(bool, "a non-empty path"), group="Files")
    vocab: str = key("", "vocab.txt or its directory; empty: base-dir/vocab")
    datasets_dir: str = key("", "shards and fine-tuning files, under base-dir unless absolute; empty: "
                                "base-dir/datasets")
    glue_dir: str = key("", "fine-tuning data: a folder per task (sst2/ or SST-2/, ner/, squad/); under base-dir "
                            "unless absolute; empty: the datasets directory")
    dataset_pattern: str = key("train_*.msgpack", "training shards in the datasets directory")
    val_dataset_pattern: str = key("val_*.msgpack", "validation shards")
    test_dataset_pattern: str = key("test_*.msgpack", "test shards")
    dataset_percentage: float = key(1.0, "a seeded, fixed share of the training samples", within(0, 1, "(]"))
    val_dataset_percentage: float = key(1.0, "the same for validation", within(0, 1, "(]"))
    run_id: str = key("", "the run directory's name under base-dir/runs; empty: the next free runN",
                      Rule(lambda value: value == "" or re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", value) is not None,
                           "a directory name: letters, digits, '.', '_' or '-', no path separator"))

    seq_len: int = key(128, "tokens per sequence, [CLS] and [SEP] included", within(8, 2048),
                       group="Batches and evaluation")
    batch_size: int = key(32, "sequences per micro-batch, per process", at_least(1))
    # MLM samples fill seq-len, so only fine-tuning batches gain from grouping by length.
    length_grouping: bool = key(True, "fine-tuning: training batches of sentences of similar length")
    grad_accum_steps: int = key(1, "micro-batches summed into one optimizer step", at_least(1))
    seq_len_curriculum: Curriculum | None = key(None, "pre-training: LENGTH:SHARE cuts each row into rows of "
                                                "LENGTH tokens for that share of the run, then trains on whole "
                                                "rows (64:0.5); empty: whole rows")
    batch_ramp: float = key(0.0, "pre-training: steps grow from one micro-batch to grad-accum-steps of them by this "
                                 "share of the run (Cramming: 0.6); 0: every step has grad-accum-steps",
                            within(0, 1))
    val_interval: int = key(100, "validate every this many optimizer steps", at_least(1))
    val_iters: int = key(20, "pre-training: batches per validation (fine-tuning scores the whole dev split)",
                         at_least(1))
    test_iters: int = key(0, "batches scored by --test; 0: the whole test split", at_least(0))
    best_metric: str = key("", "the validation metric best.pt goes by (f1_macro, accuracy, loss, spearman, ...; "
                               "lowest for a loss or perplexity, else highest); empty: the task's own (a GLUE "
                               "task's score, F1 for ner and squad, the loss in pre-training)",
                           Rule(lambda value: re.fullmatch(r"[a-z0-9_@]*", value) is not None,
                                "a validation metric's name (f1_macro, accuracy, loss), or nothing"))
    log_interval: int = key(10, "print the training loss every this many steps", at_least(1))
    mask_rate: MaskRate = key(MaskRate(0.15, 0.15), "share of the tokens picked for prediction; START:END falls "
                              "along the run, START:END@AT steps down at AT (a share of the run, or decay: where "
                              "wsd's decay begins); validation masks at END")
    masking: str = key("dynamic", "dynamic: a fresh mask every batch; static: the masks stored in the shards",
                       one_of("dynamic", "static"))
    whole_word_masking: bool = key(False, "pick whole words: a piece and the ## pieces after it")
    mask_replace_mask: float = key(0.8, "share of the picked tokens shown as [MASK]", within(0, 1))
    mask_replace_random: float = key(0.1, "share shown as a random token; the rest stay unchanged", within(0, 1))

    d_model: int = key(256, "hidden size", at_least(1), group="Model")
    heads: int = key(4, "attention heads", at_least(1))
    n_layer: int = key(4, "encoder layers", at_least(1))
    d_ff: int = key(0, "feed-forward width; 0: the parameters of 4 x d-model with gelu", at_least(0))
    dropout: float = key(0.1, "dropout probability", within(0, 1, "[)"))
    # Not BERT's post-LN with learned positions: on a small budget those stay on the unigram
    # plateau (etc/results/pretraining.md). --norm postln --position learned is BERT.
    norm: str = key("preln", "postln (BERT), preln, or rmsnorm (preln with RMSNorm)", one_of(*NORMS))
    position: str = key("rope", "learned (BERT), sinusoidal, or rope (rotary, in attention)", one_of(*POSITIONS))
    feed_forward: str = key("gelu", "gelu (BERT) or geglu (gated GELU)", one_of(*FEED_FORWARDS))
    rope_theta: float = key(ROPE_THETA, "RoPE's base: position p turns feature pair i by p / rope-theta^(2i / head "
                            "width); a longer-context phase raises it (Ettin: 160000 at 8192 tokens)", above(0))

    learning_rate: float = key(1e-3, "peak rate, reached after warmup-iters", above(0),
                               group="Optimizer and learning-rate schedule")
    min_learning_rate: float = key(1e-4, "the rate at the end of the decay", at_least(0))
    warmup_iters: int = key(300, "linear warm-up steps", at_least(0))
    warmup_ratio: float = key(0.0, "warm-up as a share of the run's steps (replaces warmup-iters); 0: warmup-iters",
                              within(0, 1, "[)"))
    lr_scheduler: Schedule = key(Schedule("cosine"), "after warmup: cosine or linear decay to min-learning-rate, "
                                 "none (constant), steplr:STEP:GAMMA; one-cycle[:PEAK], up from min-learning-rate to "
                                 "the peak at that share of the run (default 0.5) and down again, no warmup; or "
                                 "wsd[:DECAY[:SHAPE]], constant until the last DECAY share of the run (0.2), then "
                                 "down along 1 - sqrt (or linear), the last checkpoint before it kept as stable.pt")
    lr_decay_iters: int = key(10_000, "the step where the decay reaches min-learning-rate (without a time budget)",
                              at_least(0))
    resume_warmup_iters: int = key(0, "after a resume, ramp the rate back up over this many steps", at_least(0))
    max_iters: int = key(10_000, "optimizer steps in the whole run (with a time budget: a cap)", at_least(1))
    epochs: float = key(0.0, "fine-tuning: the run's length in passes over the training examples (sets max-iters "
                             "and lr-decay-iters); 0: max-iters", at_least(0))
    stop_at: Target | None = key(None, "end the run at the first validation where METRIC reaches VALUE "
                                 "(accuracy:0.35, loss:4): time to a target, as MLPerf compares recipes; empty: never")
    time_budget: Duration = key(Duration(0.0), "training time for the whole run (90s, 30m, 2h); 0: none")
    replay_clock: str = key("", "a time-budget run's clock.tsv (runs/runN/clock.tsv): this run's steps take its "
                                "recorded seconds instead of the clock's, and so repeat that run exactly; empty: the "
                                "clock")
    optimizer: str = key("adamw", "adamw, or stable-adamw: AdamW with Adafactor's update clipping per tensor "
                                  "(ModernBERT's; stable without grad-clip)", one_of("adamw", "stable-adamw"))
    weight_decay: float = key(0.01, "AdamW weight decay, on 2-D weights only", at_least(0))
    layer_lr_decay: float = key(1.0, "each encoder layer's share of the rate of the one above; 1: one rate",
                                within(0, 1, "(]"))
    beta1: float = key(0.9, "AdamW beta1", within(0, 1, "[)"))
    beta2: float = key(0.999, "AdamW beta2", within(0, 1, "[)"))
    grad_clip: float = key(1.0, "clip the gradient norm to this; 0: no clipping", at_least(0))
    seed: int = key(1337, "for weights, masking and data order", at_least(0))  # numpy seeds are non-negative

    device: str = key("auto", "auto, cpu, cuda or cuda:N",
                      Rule(lambda value: re.fullmatch(r"auto|cpu|cuda(:\d+)?", value) is not None,
                           "auto, cpu, cuda or cuda:N"), group="Speed")
    dtype: str = key("auto", "auto, bfloat16, float16 or float32; auto: bf16 where the GPU or CPU has it, else "
                     "float16 on CUDA, float32 on a CPU",
                     one_of("auto", "bfloat16", "float16", "float32"))
    compile: bool = key(False, "torch.compile: slow first steps, faster after")
    deterministic: bool = key(False, "torch's deterministic algorithms: on CUDA a run repeats bit for bit, some "
                                     "kernels slower (as transformers' full_determinism); the CPU's already do")
    fused_adamw: bool = key(True, "the fused AdamW kernel (optimizer = adamw)")
    async_to_device: bool = key(True, "pinned host memory and non-blocking copies to the GPU")
    peak_tflops: float = key(0.0, "the matmul peak MFU is measured against; 0: published (CUDA) or measured",
                             at_least(0))
    memory_limit_gib: float = key(0.0, "refuse a model whose weights, gradients and AdamW moments need more; "
                                       "0: the machine's memory", at_least(0))

    dist_master_addr: str = key("127.0.0.1", "rendezvous address of the processes of one run",
                                group="Several GPUs (torchrun / DDP) and bookkeeping")
    dist_master_port: int = key(12233, "rendezvous port", within(1, 65535))
    dist_backend: str = key("auto", "auto (nccl on CUDA, gloo on CPU), nccl or gloo", one_of("auto", "nccl", "gloo"))
    max_checkpoints: int = key(1, "newest checkpoints kept in the run directory", at_least(1))
    wandb: bool = key(False, "also log to Weights & Biases")
    # Not keys: the config files read, in order, and where each key they or the command line set
    # came from ('file:line' or '--key'), for messages.
    sources: tuple[str, ...] = field(default=(), compare=False, metadata={"ini": False})
    origins: dict[str, str] = field(default_factory=dict, compare=False, metadata={"ini": False})

    def __post_init__(self):
        """The one check of every key and between keys, also for a copy made by dataclasses.replace;
        a key with a small grammar given as text (Config(time_budget="30m") in code) is read here."""
        source = self.sources[-1] if self.sources else "config"
        for name in GRAMMAR_KEYS:
            if isinstance(getattr(self, name), str):
                object.__setattr__(self, name, typed_value(name, getattr(self, name), self.origins.get(name, source)))
        validate(vars(self), self.origins, source)

    @property
    def given(self) -> frozenset[str]:
        """The keys the config files or the command line set."""
        return frozenset(self.origins)

    @property
    def given_labels(self) -> tuple[str, ...]:
        """`labels` as names in the ids' order (empty: the data names them)."""
        names = tuple(name for name in re.split(r"\s*,\s*", self.labels.strip()) if name)
        check_unique_names(names, f"labels = {self.labels.strip()}")
        return names

    @property
    def vocab_path(self) -> Path:
        return Path(self.vocab) if self.vocab else Path(self.base_dir) / "vocab"

    @property
    def datasets_path(self) -> Path:
        """datasets-dir under base-dir; an absolute path stays as it is."""
        return Path(self.base_dir) / (self.datasets_dir or "datasets")

    @property
    def glue_path(self) -> Path:
        """glue-dir under base-dir, or the datasets directory."""
        return Path(self.base_dir) / self.glue_dir if self.glue_dir else self.datasets_path

    @property
    def runs_dir(self) -> Path:
        return Path(self.base_dir) / "runs"

    def share_of(self, split: str) -> float:
        """dataset-percentage for train, val-dataset-percentage for val; the test split is whole."""
        return {"train": self.dataset_percentage, "val": self.val_dataset_percentage}.get(split, 1.0)

    @property
    def budget_seconds(self) -> float:
        """time-budget in seconds; 0 when there is none."""
        return self.time_budget.seconds

    def budget_share(self, elapsed: float) -> float:
        """The share of time-budget that `elapsed` seconds of training spend (0 without one): what
        the schedules follow."""
        budget = self.budget_seconds
        return elapsed / budget if budget else 0.0

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
        """INI key -> plain value, the form a person reads (config.ini, checkpoints; a key with a small
        grammar as its text); safe for torch.load(weights_only=True)."""
        return {INI_KEYS[name]: plain_value(getattr(self, name)) for name in FIELD_TYPES}

    def describe(self) -> list[str]:
        """'key = value' lines in INI syntax, for the log."""
        return [f"{key} = {ini_text(value)}".rstrip() for key, value in self.to_dict().items()]


def model_config(config: Config, vocab, max_len: int | None = None, **heads) -> ModelConfig:
    """The encoder a run's config and vocabulary describe, with the heads its task asks for
    (`causal`, `sentence_classes`, `generator_heads`, `num_labels`: ModelConfig's fields). max_len,
    the size of the position table, is seq-len, or a checkpoint's where that is larger (bert-base
    has 512): a longer seq-len than the checkpoint's lengthens the table (checkpoints.load_pretrained)."""
    return ModelConfig(vocab_size=vocab.size, max_len=max(max_len or 0, config.seq_len), d_model=config.d_model,
                       heads=config.heads, n_layer=config.n_layer, d_ff=config.feed_forward_size,
                       dropout=config.dropout, pad_id=vocab.pad_id, norm=config.norm, position=config.position,
                       rope_theta=config.rope_theta, feed_forward=config.feed_forward, pooling=config.pooling,
                       **heads)


def value_type(annotation) -> type:
    """The type a key's values have: Curriculum for `Curriculum | None`."""
    if isinstance(annotation, types.UnionType):
        return next(kind for kind in get_args(annotation) if kind is not type(None))
    return annotation


FIELD_TYPES = {field.name: value_type(field.type) for field in fields(Config) if field.metadata.get("ini", True)}
GRAMMAR_KEYS = tuple(name for name, kind in FIELD_TYPES.items() if kind in GRAMMARS)
DEFAULTS = {name: field.default for field in fields(Config) if (name := field.name) in FIELD_TYPES}
RULES = {field.name: field.metadata["rule"] for field in fields(Config) if field.metadata.get("rule")}
INI_KEYS = {name: name.replace("_", "-") for name in FIELD_TYPES}
TYPE_NAMES = {int: "INT", float: "NUMBER", str: "TEXT", bool: "BOOL"}


def key_groups() -> list[tuple[str, list]]:
    """(title, the fields under it), in config.ini.example's order."""
    groups = []
    for each in fields(Config):
        if each.name not in FIELD_TYPES:
            continue
        if each.metadata["group"]:
            groups.append((each.metadata["group"], []))
        groups[-1][1].append(each)
    return groups


def key_reference() -> str:
    """Every key with its type, default and meaning, by group: the body of `main.py --help`."""
    lines = []
    for title, members in key_groups():
        lines.append(f"{title}:")
        for each in members:
            option = f"--{INI_KEYS[each.name]} {TYPE_NAMES.get(FIELD_TYPES[each.name], 'TEXT')}"
            default = ini_text(each.default) or "(empty)"
            lines.append(f"  {option:<32} {each.metadata['meaning']} (default {default})")
        lines.append("")
    return "\n".join(lines)


TYPE_NOUNS = {int: "an integer", float: "a number", str: "a string",
              bool: "a boolean (true/false, yes/no, on/off, 1/0)"}
BOOLEANS = {"true": True, "yes": True, "on": True, "1": True,
            "false": False, "no": False, "off": False, "0": False}


def known_name(key: str, origin: str | None) -> str | None:
    """Field name for an INI key or option (case-insensitive, '_' = '-'); None for a key of the
    original project's files that means nothing here (accepted, then left out); else a UserError."""
    name = key.strip().lower().replace("-", "_")
    if name not in FIELD_TYPES:
        import legacy  # read only for a key of the original project's files
        name = legacy.current_name(name)
    if name is None or name in FIELD_TYPES:
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
    if kind is str and isinstance(value, str) and name in RULES and not RULES[name].check(value):
        import legacy  # read only for a value this program spells otherwise
        value = legacy.current_value(name, value)
    try:
        return convert(kind, value)
    except (KeyError, ValueError):
        expected = GRAMMARS[kind].forms if kind in GRAMMARS else TYPE_NOUNS[kind]
        raise UserError(f"{located(origin, name, value)}: expected {expected}") from None


def convert(kind: type, value: Any) -> Any:
    if kind in GRAMMARS:  # a value read, or its text (None: "")
        if isinstance(value, kind):
            return value
        if value is not None and not isinstance(value, str):
            raise ValueError(value)
        return GRAMMARS[kind].parse(value or "")
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


def plain_value(value: Any) -> Any:
    """A value as a checkpoint stores it: a key with a small grammar as its text."""
    return ini_text(value) if value is None or type(value) in GRAMMARS else value


def ini_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return "" if value is None else str(value)
