"""fill_mask.py: the top-k candidates of an MLM checkpoint, and its bad inputs."""
import pytest

import checkpoints
import fill_mask
from test_checkpoints import small_state


def test_top_k_lists_k_candidates_per_mask(tmp_path, capsys):
    checkpoints.save(tmp_path / "c.pt", small_state())
    fill_mask.main(["--cp", str(tmp_path / "c.pt"), "-k", "3", "a [MASK] b [MASK]"])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "a [MASK] b [MASK]"
    assert [line.split(":")[0] for line in lines[1:]] == ["  [MASK] 1", "  [MASK] 2"]
    assert all(len(line.split(":")[1].split()) == 6 for line in lines[1:])  # 3 tokens with 3 probabilities


@pytest.mark.parametrize("k", ["0", "-1", "99999"])
def test_top_k_outside_the_vocabulary_is_one_line(tmp_path, capsys, k):
    checkpoints.save(tmp_path / "c.pt", small_state())
    with pytest.raises(SystemExit) as exit_info:
        fill_mask.main(["--cp", str(tmp_path / "c.pt"), "-k", k, "a [MASK]"])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err == f"error: -k {k}: expected 1 to 8 (the vocabulary's size)\n"
