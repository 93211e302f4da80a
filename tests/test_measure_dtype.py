"""scripts/measure_dtype.py: float32 against bf16 at each size asked, beside dtype = auto's rule; a
device without bf16 and bad sizes are one line."""
import pytest

import hardware
import measure_dtype
from conftest import one_error_line


def test_each_size_is_a_row_of_both_dtypes_and_the_rules_choice(mlm_workdir, monkeypatch, capsys):
    monkeypatch.setattr(hardware, "cpu_supports_bf16", lambda: True)
    measure_dtype.main(["--sizes", "1x32", "2x64", "--steps", "1"])
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ") and "x" in line[:10]]
    assert [row.split(" | ")[0] for row in rows] == ["| 1 x 32", "| 2 x 64"]
    assert all(row.endswith("| bfloat16 |") and row.count("|") == 6 for row in rows), rows
    assert not (mlm_workdir / "runs").exists()


@pytest.mark.parametrize("argv, message", [
    (["--sizes", "2by64"], "error: --sizes 2by64: expected n-layer x d-model, such as 2x128"),
    (["--steps", "0"], "error: --steps 0: expected at least 1"),
])
def test_bad_options_are_one_line(mlm_workdir, capsys, argv, message):
    assert one_error_line(capsys, lambda: measure_dtype.main(argv)) == message


def test_a_cpu_without_bf16_has_nothing_to_compare(mlm_workdir, monkeypatch, capsys):
    monkeypatch.setattr(hardware, "cpu_supports_bf16", lambda: False)
    assert one_error_line(capsys, lambda: measure_dtype.main([])) == \
        "error: device cpu has no bf16: dtype = auto runs float32 here, nothing to compare"
