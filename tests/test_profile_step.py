"""scripts/profile_step.py: the trainer's own step under torch.profiler, as markdown tables."""
import pytest

import hardware
import profile_step


@pytest.fixture
def quick_peak(monkeypatch):
    monkeypatch.setattr(hardware, "measure_matmul_flops", lambda device, dtype: 1e12)  # not what is tested


def table(output: str, header: str) -> list[list[str]]:
    """The rows of the markdown table whose first header cell is `header`."""
    lines = output.split(f"| {header} |", 1)[1].split("\n\n", 1)[0].splitlines()[2:]
    return [[cell.strip() for cell in line.strip("|").split("|")] for line in lines]


def test_profiles_the_phases_and_operators_of_the_training_step(mlm_workdir, quick_peak, capsys):
    profile_step.main(["--warmup", "1", "--steps", "2", "--rows", "5"])
    output = capsys.readouterr().out
    assert output.startswith("2 x 64, batch 16 x 64, mlm, device cpu, float32, compile false: ")
    phases = table(output, "phase")
    assert [row[0] for row in phases] == ["forward", "backward", "gradient clip", "optimizer",
                                          "the step (timed without the profiler)"]
    assert sum(float(row[2].rstrip("%")) for row in phases[:4]) == pytest.approx(100, abs=0.5)
    operators = table(output, "operator")
    assert len(operators) == 5 and any("aten::mm" in row[0] or "aten::addmm" in row[0] for row in operators)
    assert not (mlm_workdir / "runs").exists()


def test_profiles_fine_tuning_too(mlm_workdir, quick_peak, rotten_tomatoes, capsys):
    import make_demo
    make_demo.write_sst2(mlm_workdir / "datasets", rotten_tomatoes, seed=123)
    profile_step.main(["--task-type", "sst2", "--warmup", "0", "--steps", "1", "--grad-clip", "0"])
    phases = table(capsys.readouterr().out, "phase")
    assert [row[0] for row in phases][:3] == ["forward", "backward", "optimizer"]


@pytest.mark.parametrize("arguments, message", [
    (["--steps", "0"], "--steps and --rows >= 1"),
    (["--mask-rate", "2"], "mask-rate"),
])
def test_bad_arguments_are_one_line(mlm_workdir, arguments, message, capsys):
    with pytest.raises(SystemExit) as stopped:
        profile_step.main(arguments)
    assert stopped.value.code == 2
    error = capsys.readouterr().err
    assert error.startswith("error: ") and message in error and error.count("\n") == 1
