"""Variants end to end through main.py: pre-norm + rotary + GEGLU trains and says so in its
checkpoint, and what does not fit is refused."""

import pytest

import main
import hardware
from test_trainer import load, scalars


@pytest.fixture(autouse=True)
def skip_flops_measurement(monkeypatch):
    monkeypatch.setattr(hardware, "measure_matmul_flops", lambda device, dtype: 1e12)


def val_losses(run_dir) -> list[float]:
    return [value for _, value in scalars(run_dir)["val/loss"]]


def test_pre_norm_rotary_geglu_model_learns_and_says_so_in_its_checkpoint(mlm_workdir):
    run_dir = main.run(main.load_config(None, ["--norm", "rmsnorm", "--position", "rope",
                                               "--feed-forward", "geglu", "--max-iters", "30",
                                               "--lr-decay-iters", "30"]), None, False)
    losses = val_losses(run_dir)
    assert losses[-1] < losses[0] - 0.5
    model_config = load(run_dir / "checkpoints" / "checkpoint.pt")["model_config"]
    assert (model_config["norm"], model_config["position"], model_config["feed_forward"]) == \
        ("rmsnorm", "rope", "geglu")
    assert model_config["d_ff"] == 128  # d-ff given in the test config; the default would be 8/3 d
    assert "encoder.embeddings.position.weight" not in load(run_dir / "checkpoints" / "checkpoint.pt")["model"]


def test_a_checkpoint_of_another_variant_is_refused(mlm_workdir, capsys):
    main.run(main.load_config(None, ["--norm", "preln", "--max-iters", "2"]), None, False)
    with pytest.raises(SystemExit) as exit_info:  # a key the config leaves out comes from the checkpoint
        main.main(["--cp", "runs/run0/checkpoints/checkpoint.pt", "--max-iters", "4", "--norm", "postln"])
    assert exit_info.value.code == 2
    assert "norm = preln in the checkpoint but postln from the config" in capsys.readouterr().err


def test_sentence_objective_needs_masked_lm(mlm_workdir, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main.main(["--task-type", "clm", "--sentence-objective", "nsp"])
    assert exit_info.value.code == 2
    assert "sentence-objective = nsp goes with task-type = mlm, not clm" in capsys.readouterr().err
