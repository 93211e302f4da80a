"""src/run_start.py: the rule for --cp (resume its run or start a new one from its weights), the
settings a resumed run keeps, a run that fails to start leaving no directory, and dtype = auto's
rule. Resuming exactly is tested through whole runs in test_trainer.py."""
import re
import resource
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import hardware
import main
from config import Config
from errors import UserError
from run_start import RunStarter, check_same_global_batch, check_same_measure, resumes

MAIN = Path(__file__).resolve().parent.parent / "src" / "main.py"


@pytest.mark.parametrize("saved, config, expected", [
    ({"task": "mlm", "optimizer": {}}, Config(), True),
    ({"task": "mlm", "optimizer": None}, Config(), False),  # an imported model: a starting point
    ({"task": "mlm", "optimizer": {}}, Config(task_type="sst2"), False),  # pre-training to fine-tune
    ({"task": "mlm", "optimizer": {}}, Config(sentence_objective="nsp"), False),  # new heads
])
def test_the_rule_for_cp(saved, config, expected):
    class Task:
        name = config.task_type
    checkpoint = {**saved, "model_config": {"sentence_classes": 0}}
    assert resumes(checkpoint, Task(), config) is expected


def test_a_resumed_run_keeps_only_the_task_s_measuring_keys():
    class CausalTask:
        measuring_keys = ("seq_len",)
    saved = {"mask_rate": 0.15, "seq_len": 128}  # saved_settings of a causal-LM checkpoint
    check_same_measure(Path("c.pt"), saved, CausalTask(), Config(mask_rate="0.3"))  # not a key it measures by
    with pytest.raises(UserError, match=r"^c\.pt: the run has seq-len = 128, the config 64; a resumed run keeps it "
                                        r"\(to start a new run from these weights, add --switch-training\)$"):
        check_same_measure(Path("c.pt"), saved, CausalTask(), Config(seq_len=64))


def test_a_run_that_fails_while_announcing_itself_leaves_no_directory(mlm_workdir, monkeypatch):
    config = main.load_config(None, [])
    starter = RunStarter(config, main.make_task(config), torch.float32)

    def full_disk(run):
        raise UserError("no space left on device writing config.ini")
    monkeypatch.setattr(starter, "announce", full_disk)
    with pytest.raises(UserError):
        starter.start(None, None, switch_training=False, load_optimizer=True)
    assert not Path("runs").exists() or not any(Path("runs").iterdir())


@pytest.mark.parametrize("option, value", [("--d-model", "1000000"), ("--d-ff", "1000000000"),
                                           ("--n-layer", "100000")])
def test_a_model_too_large_for_the_machine_is_one_line_before_anything_is_allocated(mlm_workdir, capsys, option,
                                                                                    value):
    """Refused in well under a second: the size is computed from the shape, nothing is built."""
    with pytest.raises(SystemExit) as exit_info:
        main.main([option, value])
    assert exit_info.value.code == 2
    error = capsys.readouterr().err.strip()
    assert f"{option.removeprefix('--')} = {value}" in error and "more than this machine's memory" in error
    assert error.count("\n") == 0 and "--memory-limit-gib GIB" in error
    assert not Path("runs").exists() or not any(Path("runs").iterdir())


def test_a_model_over_the_address_space_limit_is_one_line_not_an_allocator_traceback(mlm_workdir):
    """`ulimit -v` 2 GiB on a larger machine: 5,000 layers of the test model take 2.4 GiB to train."""
    limit = 2 * 2**30
    if hardware.machine_memory() < 2 * limit:
        pytest.skip("the machine's own memory would refuse the model first")
    run = subprocess.run([sys.executable, str(MAIN), "--n-layer", "5000", "--device", "cpu"], capture_output=True,
                         text=True, preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_AS, (limit, limit)))
    assert run.returncode == 2, run.stderr
    assert re.fullmatch(r"error: .*n-layer = 5000 .* more than what this process's address-space limit leaves "
                        r"\([\d.]+ GiB; ulimit -v sets it\)\n", run.stderr)
    assert not Path("runs").exists() or not any(Path("runs").iterdir())


def test_the_memory_limit_is_a_key(mlm_workdir, capsys):
    with pytest.raises(SystemExit):
        main.main(["--memory-limit-gib", "0.001"])  # the small test model needs a few MiB
    assert "GiB (4 x " in capsys.readouterr().err


def test_a_resumed_fine_tuning_keeps_its_global_batch():
    saved = {"config": Config(batch_size=16).to_dict(), "rng_per_rank": [{}], "data_position": {"epoch": 0, "batch": 5}}
    check_same_global_batch(Path("c.pt"), saved, Config(batch_size=8), world_size=2)  # 8 x 2 processes: the same
    check_same_global_batch(Path("c.pt"), saved, Config(batch_size=4, grad_accum_steps=2), world_size=2)
    with pytest.raises(UserError, match=r"^c\.pt: the run's global batch is 16 \(16 x 1 accumulation x 1 process\), "
                                        r"this resume's 32 \(16 x 1 accumulation x 2 processes\)"):
        check_same_global_batch(Path("c.pt"), saved, Config(batch_size=16), world_size=2)
    pre_training = {**saved, "data_position": {"epoch": 0, "sample": 80}}  # counted in samples: any batch goes on
    check_same_global_batch(Path("c.pt"), pre_training, Config(batch_size=16), world_size=2)


def test_a_decay_branch_resumed_by_plain_cp_goes_on_with_the_decay_it_was_given(mlm_workdir, training_losses,
                                                                                skip_flops_measurement):
    """--decay-from computes the branch's lr-scheduler (wsd:0.5 here); resumed by --cp with the same
    options (lr-scheduler = wsd:0.25 among them), it reads that schedule from the checkpoint, not from
    the config, and trains loss for loss as the branch that was never stopped."""
    from test_trainer import wsd_run
    main.main(wsd_run("--run-id", "stable"))
    stable = Path("runs/stable/checkpoints/stable.pt")
    training_losses.clear()
    main.main(wsd_run("--run-id", "whole", "--decay-from", str(stable)))
    whole = list(training_losses)
    training_losses.clear()
    main.main(wsd_run("--run-id", "stopped", "--decay-from", str(stable), max_iters=6))
    main.main(wsd_run("--cp", "runs/stopped/checkpoints/checkpoint.pt"))
    assert training_losses == pytest.approx(whole, rel=0, abs=1e-5) and len(whole) == 4
    log = Path("runs/stopped/logs/log.txt").read_text()
    assert "resuming runs/stopped/checkpoints/checkpoint.pt at step 6 with the decay --decay-from gave it: " \
           "lr-scheduler = wsd:0.5" in log


@pytest.mark.parametrize("bf16, chosen", [(True, torch.bfloat16), (False, torch.float32)])
def test_dtype_auto_on_a_cpu_is_a_rule_of_its_bf16_and_times_nothing(monkeypatch, bf16, chosen):
    monkeypatch.setattr(hardware, "cpu_supports_bf16", lambda: bf16)
    monkeypatch.setattr(hardware.time, "perf_counter", lambda: pytest.fail("dtype = auto timed something"))
    dtype, reason = hardware.auto_dtype(torch.device("cpu"))
    assert dtype == chosen and reason
    assert hardware.select_dtype("auto", torch.device("cpu")) == chosen
    assert hardware.select_dtype("float32", torch.device("cpu")) == torch.float32


@pytest.mark.parametrize("bf16, name", [(True, "bfloat16"), (False, "float32")])
def test_dtype_auto_says_its_choice_and_reason_and_a_resume_keeps_the_dtype_its_run_ran_in(
        mlm_workdir, monkeypatch, bf16, name):
    """The rule's choice in the log and the checkpoint; a checkpoint whose run ran in the other dtype
    (a run an earlier version timed) resumes in that one where this CPU runs it."""
    import checkpoints
    monkeypatch.setattr(hardware, "cpu_supports_bf16", lambda: bf16)
    main.main(["--dtype", "auto", "--max-iters", "2", "--val-interval", "2", "--val-iters", "1"])
    log = Path("runs/run0/logs/log.txt").read_text(encoding="utf-8")
    assert f"dtype = auto: {name} (" in log and f"autocast {name};" in log
    path = Path("runs/run0/checkpoints/checkpoint.pt")
    saved = checkpoints.load(path)
    assert saved["autocast"] == name
    other = "bfloat16" if name == "float32" else "float32"
    checkpoints.save(path, {**saved, "autocast": other})
    main.main(["--dtype", "auto", "--max-iters", "4", "--val-interval", "2", "--val-iters", "1", "--cp", str(path)])
    kept = other if bf16 else name  # a CPU without bf16 runs a bf16 run's resume in float32
    assert checkpoints.load(path)["autocast"] == kept
    log = Path("runs/run0/logs/log.txt").read_text(encoding="utf-8")
    assert f"autocast {kept};" in log.split("resuming")[1]
    if bf16:
        assert f"dtype = auto: {other} (the dtype the resumed run ran in)" in log


