"""Distillation (distill_task.py): MiniLMv2's relation loss against a loop over heads and positions,
a student of another width, depth and heads learning from a transformers teacher, and its checkpoint
starting a fine-tuning; with logit-weight, the predictions' KL against a loop, a teacher's MLM head
read as transformers' BertForMaskedLM predicts, and a teacher without one refused. The teacher
itself (read from a checkpoint or a directory, its vocabulary checked): test_teacher.py."""
import math
import shutil
from pathlib import Path

import pytest
import torch
from transformers import AutoModel, BertConfig, BertModel
from transformers import BertForMaskedLM as TheirMaskedLM

import export_hf
from interop import hf_import
import main
import make_demo
from conftest import assert_resumes_exactly_mid_epoch, one_error_line
from checkpoints import load as load_checkpoint
from tasks.distill_task import RelationEncoder, prediction_kl, relation_losses, visibility
from model import ModelConfig
from vocab import load_vocab

# Of another width, depth and heads than the student (conftest's MLM_SETTINGS: 64 wide, 2 heads, 2
# layers); weights spread wider than BERT's 0.02, so that its relations are far from uniform.
TEACHER = {"hidden_size": 48, "num_attention_heads": 3, "num_hidden_layers": 3, "intermediate_size": 96,
           "max_position_embeddings": 128, "initializer_range": 0.1}
DISTILL = ["--task-type", "distill", "--relation-heads", "4"]  # 4 divides both widths; 3 (the teacher's) does not


def save_teacher(vocab_file: Path, directory: Path, model_class: type = BertModel) -> Path:
    """A random transformers BertModel (or another BERT class) with the vocabulary of vocab_file, as a
    teacher directory."""
    torch.manual_seed(0)
    vocab_size = sum(1 for _ in vocab_file.open(encoding="utf-8"))
    model_class(BertConfig(vocab_size=vocab_size, **TEACHER)).save_pretrained(directory)
    shutil.copy(vocab_file, directory / "vocab.txt")
    return directory


def hand_relation_kl(teacher: torch.Tensor, student: torch.Tensor, real: torch.Tensor, relation_heads: int) -> float:
    """KL(teacher || student) of one relation, as the paper writes it: per sequence, relation head
    and real query, over the real keys; averaged over the sequences' real queries and the heads."""
    def joined(states, row):  # [heads, length, head_width] -> [length, width]
        return states[row].transpose(0, 1).reshape(states.shape[2], -1)

    def distribution(states, row, head, query, keys):
        width = states.shape[1] * states.shape[3] // relation_heads
        vectors = joined(states, row)[:, head * width:(head + 1) * width]
        scores = torch.tensor([vectors[query] @ vectors[key] / math.sqrt(width) for key in keys])
        return torch.softmax(scores, 0)

    total, terms = 0.0, 0
    for row in range(real.shape[0]):
        keys = [key for key in range(real.shape[1]) if real[row, key]]
        for head in range(relation_heads):
            for query in keys:
                target = distribution(teacher, row, head, query, keys)
                predicted = distribution(student, row, head, query, keys)
                total += float((target * (target.log() - predicted.log())).sum())
                terms += 1
    return total / terms


def test_relation_loss_matches_a_loop_over_heads_and_positions():
    torch.manual_seed(0)
    teacher = torch.randn(3, 2, 4, 6, 6)  # q, k, v x batch 2, 4 heads of 6: 24 wide, 6 positions
    student = torch.randn(3, 2, 3, 6, 4)  # 3 heads of 4: 12 wide
    real = torch.tensor([[True] * 6, [True] * 4 + [False] * 2])  # the second row padded
    losses = relation_losses(teacher, student, visibility(real, None), real, relation_heads=2)
    expected = [hand_relation_kl(teacher[part], student[part], real, 2) for part in range(3)]
    torch.testing.assert_close(losses, torch.tensor(expected), rtol=1e-4, atol=1e-6)
    assert relation_losses(teacher, teacher, visibility(real, None), real, 2).abs().max() < 1e-5


def logged_losses(run_dir: Path) -> list[float]:
    lines = (run_dir / "logs" / "log.txt").read_text(encoding="utf-8").splitlines()
    return [float(line.split("| loss ")[1].split()[0]) for line in lines if "| loss " in line]


def distill(workdir: Path, steps: int, teacher_class: type = BertModel, *options: str) -> Path:
    teacher = save_teacher(workdir / "vocab" / "vocab.txt", workdir / "teacher", teacher_class)
    overrides = [*DISTILL, "--teacher", str(teacher), "--max-iters", str(steps), "--lr-decay-iters", str(steps),
                 "--learning-rate", "1e-2", "--warmup-iters", "2", "--val-interval", str(steps), "--batch-size", "8",
                 *options]
    return main.run(main.load_config(Path("config.ini"), overrides), None, False)


def test_a_student_of_another_shape_learns_the_teachers_relations(mlm_workdir, skip_flops_measurement):
    losses = logged_losses(distill(mlm_workdir, 20))
    assert len(losses) == 20
    assert sum(losses[-3:]) < 0.9 * sum(losses[:3]), losses


def test_the_students_checkpoint_starts_a_fine_tuning(mlm_workdir, rotten_tomatoes, skip_flops_measurement):
    student = distill(mlm_workdir, 2) / "checkpoints" / "checkpoint.pt"
    make_demo.write_sst2(mlm_workdir / "datasets", rotten_tomatoes[:200], seed=123)
    config = main.load_config(Path("config.ini"), ["--task-type", "sst2", "--max-iters", "2", "--val-interval", "2"])
    run_dir = main.run(config, student, False)
    log = (run_dir / "logs" / "log.txt").read_text(encoding="utf-8")
    assert f"loaded the encoder of {student} (distill step 2)" in log
    assert "newly initialised: pooler.weight, pooler.bias, classifier.weight, classifier.bias" in log
    assert "not used: nothing" in log  # every weight of the student is the encoder's
    assert "step 2 | loss" in log


@pytest.mark.parametrize("teacher_class, logit_weight", [(BertModel, 0), (TheirMaskedLM, 1)])
def test_distillation_resumes_exactly(mlm_workdir_factory, vocab_dir, tmp_path, monkeypatch, keep_signal_handlers,
                                      skip_flops_measurement, teacher_class, logit_weight):
    """With logit-weight, the masks drawn after the resume too."""
    teacher = save_teacher(vocab_dir / "vocab.txt", tmp_path / "teacher", teacher_class)
    settings = {"task-type": "distill", "teacher": teacher, "relation-heads": 4, "batch-size": 8, "warmup-iters": 2,
                "lr-decay-iters": 6, "logit-weight": logit_weight}
    assert_resumes_exactly_mid_epoch(lambda name: mlm_workdir_factory(tmp_path / name, **settings), monkeypatch, 6)


def test_the_student_exports_as_an_encoder_that_transformers_loads(mlm_workdir, tmp_path, skip_flops_measurement):
    student = distill(mlm_workdir, 2) / "checkpoints" / "checkpoint.pt"
    export_hf.export(student, tmp_path / "hf")
    theirs = AutoModel.from_pretrained(tmp_path / "hf", trust_remote_code=True).eval()  # rope, pre-LN: our code
    saved = load_checkpoint(student)
    ours = RelationEncoder(ModelConfig(**saved["model_config"])).eval()
    ours.load_state_dict(saved["model"])
    ids = torch.randint(5, saved["model_config"]["vocab_size"], (2, 16))
    with torch.no_grad():
        torch.testing.assert_close(theirs(ids).last_hidden_state, ours.encoder(ids), rtol=1e-4, atol=1e-4)
    back, report = hf_import.read_model(tmp_path / "hf")
    assert report["task"] == "encoder"
    assert all(torch.equal(back["model"][name], tensor) for name, tensor in saved["model"].items())


def test_the_predictions_kl_matches_a_loop_over_the_masked_slots():
    torch.manual_seed(0)
    teacher, student = torch.randn(2, 3, 11), torch.randn(2, 3, 11)  # batch 2, 3 slots, a vocabulary of 11
    labelled = torch.tensor([[True, True, False], [True, False, False]])  # unused slots hold no prediction
    terms = []
    for row, slot in labelled.nonzero().tolist():
        target, predicted = torch.softmax(teacher[row, slot], 0), torch.softmax(student[row, slot], 0)
        terms.append(float((target * (target.log() - predicted.log())).sum()))
    torch.testing.assert_close(prediction_kl(teacher, student, labelled), torch.tensor(sum(terms) / len(terms)))
    assert prediction_kl(teacher, teacher, labelled).abs() < 1e-6


def test_a_teachers_mlm_head_predicts_as_transformers_bert_for_masked_lm(vocab_dir, tmp_path):
    """Read from a BertForMaskedLM directory, the teacher's q, k, v and its predictions at the masked
    positions come from one pass; the predictions are transformers' logits at those positions."""
    directory = save_teacher(vocab_dir / "vocab.txt", tmp_path / "teacher", TheirMaskedLM)
    vocab = load_vocab(vocab_dir)
    state = hf_import.read_model(directory)[0]
    ours = RelationEncoder(ModelConfig(**state["model_config"]), mlm_head=True).eval()
    ours.load_state_dict(state["model"])
    ids = torch.randint(5, vocab.size, (2, 16))
    real = torch.ones_like(ids, dtype=torch.bool)
    real[1, 12:] = False
    positions = torch.tensor([[1, 4, 9], [2, 3, 11]])
    with torch.no_grad():
        projections, logits = ours(ids, real, layer=1, positions=positions)
        theirs = TheirMaskedLM.from_pretrained(directory).eval()(ids, attention_mask=real.long()).logits
    torch.testing.assert_close(projections, ours(ids, real, layer=1), rtol=0, atol=0)
    torch.testing.assert_close(logits, theirs.gather(1, positions[..., None].expand(-1, -1, vocab.size)),
                               rtol=1e-4, atol=1e-4)


def test_with_logit_weight_the_student_learns_the_teachers_predictions_too(mlm_workdir, tmp_path,
                                                                            skip_flops_measurement):
    run_dir = distill(mlm_workdir, 20, TheirMaskedLM, "--logit-weight", "1")
    losses = logged_losses(run_dir)
    assert sum(losses[-3:]) < 0.9 * sum(losses[:3]), losses
    log = (run_dir / "logs" / "log.txt").read_text(encoding="utf-8")
    assert "| val logit_kl " in log and "| val accuracy " in log and "predictions " in log
    student = run_dir / "checkpoints" / "checkpoint.pt"
    saved = load_checkpoint(student)
    assert "head.bias" in saved["model"] and saved["config"]["logit-weight"] == 1.0
    export_hf.export(student, tmp_path / "hf")  # as an encoder: the head stays behind
    back, report = hf_import.read_model(tmp_path / "hf")
    assert report["task"] == "encoder" and "head.bias" not in back["model"]


def test_logit_weight_with_a_teacher_without_an_mlm_head_is_one_line(mlm_workdir, capsys):
    teacher = save_teacher(mlm_workdir / "vocab" / "vocab.txt", mlm_workdir / "teacher")
    line = one_error_line(capsys, lambda: main.main([*DISTILL, "--teacher", str(teacher), "--logit-weight", "1"]))
    assert line == (f"error: logit-weight = 1: teacher = {teacher} has no MLM head (a task-type = encoder "
                    f"model); give a BertForMaskedLM directory or an mlm checkpoint, or logit-weight = 0")
