"""The model's architecture as data: ModelConfig, the variants it takes, the rule of an attention
shape, and what each task-type is (TASK_KINDS: the head it puts on the encoder, the model class that
holds its weights, the transformers classes an export of it is, whether it takes a teacher; GLUE's
label names). Torch-free, so that config.py checks a run's keys against it and the data preparers read
it without importing torch; model.py builds the network from it. A new task is its module in
src/tasks/, its line here and its line in tasks.TASK_CLASSES (the class that trains it); config.py,
the export, the import and the ONNX code read its line here.
"""
from dataclasses import dataclass, replace

IGNORE_INDEX = -100  # the label of a token no loss scores (PyTorch's cross_entropy default)
# The variants ModelConfig takes; config.py checks a run's keys against the same tuples.
NORMS = ("postln", "preln", "rmsnorm")
POSITIONS = ("learned", "rope", "sinusoidal")
FEED_FORWARDS = ("gelu", "geglu")
ROPE_THETA = 10_000.0  # RoPE's base as published (Su et al. 2021)
POOLINGS = ("cls", "mean")
# The fields that fix the network but for what a head's data decides (label names and counts, the pad
# id): a non-BERT export's config.json carries them under these names, and its import reads them back.
NETWORK_FIELDS = ("vocab_size", "max_len", "d_model", "heads", "n_layer", "d_ff", "dropout", "segments",
                  "layer_norm_eps", "norm", "position", "rope_theta", "feed_forward", "causal", "sentence_classes",
                  "pooling")


@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int
    max_len: int = 512
    d_model: int = 768
    heads: int = 12
    n_layer: int = 12
    d_ff: int = 3072
    dropout: float = 0.1
    segments: int = 2  # token type vocabulary, as in BERT
    pad_id: int = 0
    num_labels: int = 2
    layer_norm_eps: float = 1e-12
    norm: str = "postln"  # postln: BERT; preln: LayerNorm before each sublayer; rmsnorm: preln with RMSNorm
    # learned: a table added to the embeddings; sinusoidal: a fixed sin/cos table added to them;
    # rope: rotary, in attention
    position: str = "learned"
    rope_theta: float = ROPE_THETA  # rope's base: larger turns slower, for longer contexts
    feed_forward: str = "gelu"  # gelu: BERT's; geglu: gated, GELU(x W) * (x V)
    causal: bool = False  # each position attends to itself and earlier ones only
    sentence_classes: int = 0  # BertForPreTraining: 2 for next-sentence or sentence-order prediction
    generator_heads: int = 0  # ElectraForPreTraining: the generator's heads, of the same width as ours
    pooling: str = "cls"  # BertForSequenceClassification: cls (BERT) or mean of the real tokens' states
    label_names: tuple[str, ...] = ()  # BertForTokenClassification: what each output means (B-PER), from its data
    multi_label: bool = False  # BertForSequenceClassification: any number of the classes, a sigmoid each

    def __post_init__(self):
        for name, choices in (("norm", NORMS), ("position", POSITIONS), ("feed_forward", FEED_FORWARDS),
                              ("pooling", POOLINGS)):
            if getattr(self, name) not in choices:
                raise ValueError(f"{name} {getattr(self, name)!r} is not one of {choices}")
        problem = attention_shape_problem(self.d_model, self.heads, self.position)
        if problem:
            raise ValueError(problem)

    @property
    def pre_norm(self) -> bool:
        return self.norm != "postln"


def attention_shape_problem(d_model: int, heads: int, position: str) -> str | None:
    """What is wrong with an attention shape, in INI keys, or None; config.py checks a run's keys with it too."""
    if d_model % heads:
        return f"d-model = {d_model} is not divisible by heads = {heads}"
    if position == "rope" and d_model // heads % 2:
        return f"position = rope needs an even head width, but d-model / heads = {d_model} / {heads} is odd"
    return None


# ----------------------------------------------------------------------------- the tasks

PRE_TRAINING, CLASSIFICATION, TOKENS, ANSWERS, EMBEDDING, ENCODER = (
    "pre-training", "classification", "tokens", "answers", "embedding", "encoder")


@dataclass(frozen=True)
class TaskKind:
    family: str  # one of the six above: what the model outputs, and how an export is scored
    model: str  # model.py's class that holds its weights
    native: str  # transformers' class of its export in BERT's own architecture
    variant: str  # export_hf.py's class of its export in any other architecture
    taught: bool = False  # takes a teacher
    single_text: bool = False  # a classification of one text per example (transfer-data's sentences fit it)


def classification(single_text: bool = False) -> TaskKind:
    return TaskKind(CLASSIFICATION, "BertForSequenceClassification", "BertForSequenceClassification",
                    "BertVariantForSequenceClassification", True, single_text)


def answers() -> TaskKind:
    return TaskKind(ANSWERS, "BertForQuestionAnswering", "BertForQuestionAnswering", "BertVariantForQuestionAnswering")


# Classification into the user's own classes, of one text or of a pair, read from the user's own files.
USER_CLASS_TASKS = ("classify", "classify_pair")
ENTAILMENT = ("entailment", "not_entailment")
NLI = ("entailment", "neutral", "contradiction")
# What class i of each GLUE task means, as GLUE names it (STS-B: one score); glue_tasks.py, the export
# and the import read it here.
GLUE_LABELS = {"cola": ("unacceptable", "acceptable"), "sst2": ("negative", "positive"),
               "mrpc": ("not_equivalent", "equivalent"), "qqp": ("not_duplicate", "duplicate"), "stsb": (),
               "mnli": NLI, "qnli": ENTAILMENT, "rte": ENTAILMENT,
               "wnli": ENTAILMENT[::-1]}  # WNLI's 1 is entailment, the reverse of QNLI and RTE
# "encoder" is no task-type: an imported BertModel, or a distilled student as exported.
ENCODER_KIND = TaskKind(ENCODER, "BertForSequenceClassification", "BertModel", "BertVariantModel")
TASK_KINDS = {
    "mlm": TaskKind(PRE_TRAINING, "BertForMaskedLM", "BertForMaskedLM", "BertVariantForMaskedLM"),
    "clm": TaskKind(PRE_TRAINING, "BertForCausalLM", "BertLMHeadModel", "BertVariantForCausalLM"),
    "electra": TaskKind(PRE_TRAINING, "ElectraForPreTraining", "ElectraForPreTraining", "BertVariantForPreTraining"),
    "distill": replace(ENCODER_KIND, family=PRE_TRAINING, taught=True),
    **{name: classification(single_text=name in ("cola", "sst2", "classify"))
       for name in (*GLUE_LABELS, *USER_CLASS_TASKS)},
    "ner": TaskKind(TOKENS, "BertForTokenClassification", "BertForTokenClassification",
                    "BertVariantForTokenClassification"),
    "squad": answers(),  # SQuAD v1.1
    "squad_v2": answers(),  # and v2.0, with unanswerable questions
    "embed": TaskKind(EMBEDDING, "BertForEmbedding", "BertModel", "BertVariantModel", taught=True),
}


def kind_of(task: str) -> TaskKind:
    """The kind of a checkpoint's task: a task-type's, or the encoder's."""
    return ENCODER_KIND if task == "encoder" else TASK_KINDS[task]


def tasks_of(*families: str) -> tuple[str, ...]:
    return tuple(name for name, kind in TASK_KINDS.items() if kind.family in families)


def label_names(task: str, num_labels: int, own: tuple[str, ...] = ()) -> tuple[str, ...]:
    """What class i of a task's classifier means: the model's own names where it has them (classes
    named by the user's data, NER's tags), else GLUE's label names, STS-B's one "similarity" score,
    or the class numbers of `classify` and `classify_pair` (their one "score" with num-labels = 1)."""
    if own:
        return tuple(own)
    if task in GLUE_LABELS:
        return GLUE_LABELS[task] or ("similarity",)
    return ("score",) if num_labels == 1 else tuple(str(label) for label in range(num_labels))
