"""src/architecture.py: every task-type's line names classes that exist (ours, and transformers' for
its export), a variant ModelConfig does not take is refused, an attention shape's rule in INI keys,
and what each output of a classifier is called."""
import pytest
import torch

from architecture import (ANSWERS, ENCODER_KIND, TASK_KINDS, attention_shape_problem, kind_of, label_names,
                          tasks_of)
from test_model_variants import tiny_config


def test_every_task_kind_names_classes_that_exist():
    """architecture.TASK_KINDS (what a task-type is) and tasks.TASK_CLASSES (the class that trains it)
    name the same task-types; each line's classes are real, and every export class is one
    transformers' Auto classes (or the model card's load line) know."""
    from interop import hf_export
    import model
    from tasks import TASK_CLASSES, task_class
    assert list(TASK_CLASSES) == list(TASK_KINDS)
    for name in TASK_KINDS:
        assert task_class(name).__module__.startswith("tasks."), name
    for kind in (*TASK_KINDS.values(), ENCODER_KIND):
        assert issubclass(getattr(model, kind.model), torch.nn.Module)
        assert kind.native in hf_export.AUTO_NAMES and kind.variant in hf_export.AUTO_CLASSES


def test_invalid_variants_are_refused():
    with pytest.raises(ValueError, match="norm"):
        tiny_config(300, norm="layernorm")
    with pytest.raises(ValueError, match="even head width"):
        tiny_config(300, d_model=60, heads=4, position="rope")


def test_an_attention_shape_is_refused_in_ini_keys_and_a_checkpoints_kind_is_its_task_types_or_the_encoders():
    assert attention_shape_problem(768, 12, "rope") is None
    assert attention_shape_problem(96, 32, "learned") is None  # an odd head width is for rope alone to refuse
    assert attention_shape_problem(100, 12, "learned") == "d-model = 100 is not divisible by heads = 12"
    assert attention_shape_problem(96, 32, "rope") == (
        "position = rope needs an even head width, but d-model / heads = 96 / 32 is odd")
    assert kind_of("encoder") is ENCODER_KIND and kind_of("squad") is TASK_KINDS["squad"]
    assert tasks_of(ANSWERS) == ("squad", "squad_v2")


def test_a_classifiers_outputs_are_named_by_its_own_labels_else_by_glue_else_by_number():
    assert label_names("sst2", 2, ("bad", "good")) == ("bad", "good")  # the model's own names first
    assert label_names("ner", 3, ("O", "B-PER", "I-PER")) == ("O", "B-PER", "I-PER")
    assert label_names("sst2", 2) == ("negative", "positive")
    assert label_names("mnli", 3) == ("entailment", "neutral", "contradiction")
    assert label_names("wnli", 2) == ("not_entailment", "entailment")  # WNLI's 1 is entailment
    assert label_names("stsb", 1) == ("similarity",)
    assert label_names("classify", 3) == ("0", "1", "2")
    assert label_names("classify_pair", 1) == ("score",)
