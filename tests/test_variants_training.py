"""Variants end to end through main.py: pre-norm + rotary + GEGLU and causal LM train, resume,
fine-tune, and refuse what does not fit."""
import subprocess
import sys

import pytest
import torch

import main
import hardware
from test_trainer import ROOT, load, scalars


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


def test_causal_lm_learns_next_tokens_and_resumes(mlm_workdir):
    run_dir = main.run(main.load_config(None, ["--task-type", "clm", "--max-iters", "60",
                                               "--lr-decay-iters", "60", "--val-interval", "10"]), None, False)
    losses = val_losses(run_dir)
    accuracy = [value for _, value in scalars(run_dir)["val/accuracy"]]
    assert losses[-1] < losses[0] - 0.5 and accuracy[-1] > accuracy[0]
    checkpoint = load(run_dir / "checkpoints" / "checkpoint.pt")
    assert checkpoint["task"] == "clm" and checkpoint["model_config"]["causal"] is True
    # Nothing is masked, so another mask-rate cannot change what the run measures: it resumes.
    main.run(main.load_config(None, ["--task-type", "clm", "--max-iters", "70", "--lr-decay-iters", "60",
                                     "--mask-rate", "0.3"]), run_dir / "checkpoints" / "checkpoint.pt", False)
    assert load(run_dir / "checkpoints" / "checkpoint.pt")["step"] == 70
    assert "resuming" in (run_dir / "logs" / "log.txt").read_text()


def test_masked_lm_can_start_from_a_causal_checkpoint(mlm_workdir):
    """The comparison of objectives fine-tunes both; the encoder weights carry over, attention
    becomes bidirectional."""
    clm = main.run(main.load_config(None, ["--task-type", "clm", "--max-iters", "2"]), None, False)
    mlm = main.run(main.load_config(None, ["--max-iters", "2"]), clm / "checkpoints" / "checkpoint.pt", False)
    assert load(mlm / "checkpoints" / "checkpoint.pt")["model_config"]["causal"] is False
    assert "loaded the encoder of" in (mlm / "logs" / "log.txt").read_text()


def test_causal_lm_reads_the_original_ids_of_static_shards(mlm_static_base_dir, mlm_config, tmp_path, monkeypatch,
                                                           keep_signal_handlers):
    mlm_config(tmp_path, task_type="clm", base_dir=mlm_static_base_dir)
    monkeypatch.chdir(tmp_path)
    config = main.load_config(None, ["--base-dir", str(mlm_static_base_dir)])
    task = main.make_task(config)
    batch = next(task.eval_batches("val", 1))
    assert "positions" not in batch and not (batch["input_ids"] == task.vocab.mask_id).any()
    result = subprocess.run([sys.executable, str(ROOT / "src" / "main.py"), "--masking", "static"], cwd=tmp_path,
                            capture_output=True, text=True)
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "masking = static goes with task-type = mlm, not clm" in result.stderr


def test_sentence_objective_needs_masked_lm(mlm_workdir, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main.main(["--task-type", "clm", "--sentence-objective", "nsp"])
    assert exit_info.value.code == 2
    assert "sentence-objective = nsp goes with task-type = mlm, not clm" in capsys.readouterr().err


def test_old_checkpoints_without_variant_keys_still_load(mlm_workdir):
    # Checkpoints from before the variant keys were all BERT's architecture; the defaults now differ.
    run_dir = main.run(main.load_config(None, ["--max-iters", "2", "--norm", "postln", "--position", "learned"]),
                       None, False)
    path = run_dir / "checkpoints" / "checkpoint.pt"
    checkpoint = load(path)
    for key in ("norm", "position", "feed_forward", "causal", "sentence_classes"):
        del checkpoint["model_config"][key]
    del checkpoint["checksum"]  # nor did they hold a checksum
    torch.save(checkpoint, path)
    main.run(main.load_config(None, ["--max-iters", "3"]), path, False)
    assert load(path)["step"] == 3
