"""src/tasks/teacher.py: a checkpoint of ours teaches as the transformers directory it was imported
from, and a teacher of another vocabulary is refused in one line."""
import torch

import main
from conftest import one_error_line
from interop import hf_import
from tasks.distill_task import RelationEncoder
from tasks.teacher import load_teacher
from test_distill_task import DISTILL, save_teacher
from vocab import load_vocab


def test_a_checkpoint_of_ours_teaches_as_the_directory_it_was_imported_from(vocab_dir, tmp_path):
    directory = save_teacher(vocab_dir / "vocab.txt", tmp_path / "teacher")
    hf_import.convert(directory, tmp_path / "teacher.pt")
    vocab, device = load_vocab(vocab_dir), torch.device("cpu")
    ids = torch.randint(5, vocab.size, (2, 16))
    real = torch.ones_like(ids, dtype=torch.bool)
    real[1, 10:] = False
    with torch.no_grad():
        outputs = [load_teacher(path, vocab, 64, device, RelationEncoder)(ids, real, layer=1)
                   for path in (directory, tmp_path / "teacher.pt")]
    assert outputs[0].shape == (3, 2, 3, 16, 16)  # q, k, v x batch x the teacher's 3 heads of 16
    torch.testing.assert_close(outputs[0], outputs[1], rtol=0, atol=0)


def test_a_teacher_of_another_vocabulary_is_one_line(mlm_workdir, capsys):
    teacher = save_teacher(mlm_workdir / "vocab" / "vocab.txt", mlm_workdir / "teacher")
    tokens = (teacher / "vocab.txt").read_text(encoding="utf-8").splitlines()
    tokens[-2], tokens[-1] = tokens[-1], tokens[-2]  # as many tokens, other ids
    (teacher / "vocab.txt").write_text("\n".join(tokens) + "\n", encoding="utf-8")
    line = one_error_line(capsys, lambda: main.main([*DISTILL, "--teacher", str(teacher)]))
    assert "not the vocabulary of teacher" in line and str(teacher) in line
