"""The tasks wing: every task-type's class, with its data readers and metrics (the objectives of
pre-training and the fine-tuning tasks), and the table main.py picks a run's task from. Each row
imports its class when a run names it, so a run reads only its own task's modules; what the rest of
the program asks of a task-type (its head, its export, whether it fine-tunes) is its row of
architecture.TASK_KINDS.
"""


def masked_lm() -> type:
    from tasks.mlm_task import MaskedLMTask
    return MaskedLMTask


def causal_lm() -> type:
    from tasks.clm_task import CausalLMTask
    return CausalLMTask


def electra() -> type:
    from tasks.electra_task import ElectraTask
    return ElectraTask


def distillation() -> type:
    from tasks.distill_task import DistillationTask
    return DistillationTask


def classification() -> type:
    from tasks.classification_task import ClassificationTask
    return ClassificationTask


def token_classification() -> type:
    from tasks.token_task import TokenClassificationTask
    return TokenClassificationTask


def question_answering() -> type:
    from tasks.squad_task import QuestionAnsweringTask
    return QuestionAnsweringTask


def embedding() -> type:
    from tasks.embed_task import EmbeddingTask
    return EmbeddingTask


# A task-type -> the function that imports its class; its keys are architecture.TASK_KINDS'.
TASK_CLASSES = {
    "mlm": masked_lm, "clm": causal_lm, "electra": electra, "distill": distillation,
    **dict.fromkeys(("cola", "sst2", "mrpc", "qqp", "stsb", "mnli", "qnli", "rte", "wnli", "classify",
                     "classify_pair"), classification),
    "ner": token_classification, "squad": question_answering, "squad_v2": question_answering, "embed": embedding,
}


def task_class(task_type: str) -> type:
    """The class of a task-type's task, its module imported now. The trainer knows a task only through
    task.Task."""
    return TASK_CLASSES[task_type]()
