"""Training in two CPU processes (gloo): the same losses as one process with twice the batch, one
run directory, exact resume, a failed rank ends the run, and torchrun runs the same main.py, on one
machine and on two (rehearsed on loopback)."""
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

import make_demo
from test_trainer import load, scalars

ROOT = Path(__file__).resolve().parent.parent
MAIN = ROOT / "src" / "main.py"
TIMEOUT = 120  # seconds for any one command; the runs here take a few


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def start_main(workdir: Path, *args: str, nproc: int | None = 2) -> subprocess.Popen:
    """python src/main.py [--ddp --nproc N] ARGS in workdir, on a free port."""
    launch = ["--ddp", "--nproc", str(nproc)] if nproc else []
    return subprocess.Popen([sys.executable, str(MAIN), *launch, "--dist-master-port", str(free_port()), *args],
                            cwd=workdir, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(process: subprocess.Popen) -> subprocess.CompletedProcess:
    stdout, stderr = process.communicate(timeout=TIMEOUT)
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


def run_main(workdir: Path, *args: str, nproc: int | None = 2) -> subprocess.CompletedProcess:
    return finish(start_main(workdir, *args, nproc=nproc))


def train_losses(run_dir: Path) -> list[float]:
    return [value for _, value in scalars(run_dir)["train/loss"]]


@pytest.fixture(scope="module")
def sst2_base_dir(tmp_path_factory, vocab_dir, rotten_tomatoes) -> Path:
    base = tmp_path_factory.mktemp("sst2")
    shutil.copytree(vocab_dir, base / "vocab")
    make_demo.write_sst2(base / "datasets", rotten_tomatoes, seed=123)
    return base


def test_two_processes_give_the_losses_of_one_with_twice_the_batch(sst2_base_dir, mlm_config, tmp_path):
    """Global batch i is the same set of samples for any number of processes (each rank takes every
    world-size-th sample of it), and DDP averages the gradients of equal-sized halves: so the
    per-step loss curves agree. Fine-tuning (sst2: a mean over sentences) makes this exact;
    MLM's per-rank means over different numbers of masked tokens would weigh them differently."""
    runs, processes = {}, []
    for nproc, batch_size in ((None, 16), (2, 8)):
        workdir = tmp_path / f"nproc{nproc}"
        shutil.copytree(sst2_base_dir, workdir)
        mlm_config(workdir, task_type="sst2", batch_size=batch_size, dropout=0.0, max_iters=6,
                   lr_decay_iters=6, warmup_iters=2, val_interval=6, val_iters=2, learning_rate=1e-3)
        processes.append(start_main(workdir, nproc=nproc))
        runs[nproc] = workdir / "runs" / "run0"
    for result in map(finish, processes):
        assert result.returncode == 0, result.stderr
    single, double = train_losses(runs[None]), train_losses(runs[2])
    assert len(single) == len(double) == 6
    assert single[0] != single[-1]  # the model did train
    assert np.allclose(single, double, rtol=0, atol=1e-5), (single, double)  # 6e-8 measured
    log = (runs[2] / "logs" / "log.txt").read_text(encoding="utf-8")
    assert "global batch 16 (8 x 1 accumulation x 2 processes)" in log
    # the one-process run resumed by two processes at its batch-size would double the global batch
    result = run_main(tmp_path / "nprocNone", "--cp", "runs/run0/checkpoints/checkpoint.pt", "--max-iters", "8")
    assert result.returncode == 2 and result.stderr.strip().endswith(
        "the run's global batch is 16 (16 x 1 accumulation x 1 process), this resume's 32 (16 x 1 accumulation "
        "x 2 processes); a resumed fine-tuning keeps batch-size x grad-accum-steps x processes"), result.stderr


def test_two_process_run_stops_together_writes_one_run_and_resumes_exactly(mlm_workdir_factory, tmp_path):
    """A `stop` file, seen by whichever rank looks first, stops both at step 1 with one checkpoint
    (rank 0's, holding both ranks' random states); resuming with --ddp continues each rank's data
    and masks exactly (dropout included), in the same run directory with the same log."""
    settings = dict(max_iters=6, lr_decay_iters=6, warmup_iters=2, val_interval=3, val_iters=2)
    straight = mlm_workdir_factory(tmp_path / "straight", **settings)
    resumed = mlm_workdir_factory(tmp_path / "resumed", **settings)
    (resumed / "stop").touch()
    processes = [start_main(straight), start_main(resumed)]  # side by side: faster
    for result in map(finish, processes):
        assert result.returncode == 0, result.stderr
    checkpoints = resumed / "runs" / "run0" / "checkpoints"
    assert load(checkpoints / "checkpoint.pt")["step"] == 1
    result = run_main(resumed, "--cp", "runs/run0/checkpoints/checkpoint.pt")
    assert result.returncode == 0, result.stderr

    assert sorted(p.name for p in (resumed / "runs").iterdir()) == ["run0"]
    assert len(list((resumed / "runs" / "run0" / "logs").glob("log*.txt"))) == 1
    checkpoint = load(checkpoints / "checkpoint.pt")
    assert checkpoint["step"] == 6
    assert len(checkpoint["rng_per_rank"]) == 2
    assert not torch.equal(checkpoint["rng_per_rank"][0]["mask"], checkpoint["rng_per_rank"][1]["mask"])
    log = (resumed / "runs" / "run0" / "logs" / "log.txt").read_text(encoding="utf-8")
    assert re.search(r"stopped by (the file ./stop|a stop request on another rank) at step 1;", log)
    assert "resuming runs/run0/checkpoints/checkpoint.pt at step 1" in log
    # TensorBoard keeps both sessions' scalars: step 1, then 2-6 after the resume.
    expected = train_losses(straight / "runs" / "run0")
    assert np.allclose(train_losses(resumed / "runs" / "run0"), expected, rtol=0, atol=1e-5)


def test_a_user_error_in_the_ranks_is_one_line_with_exit_code_2(mlm_workdir_factory, tmp_path):
    workdir = mlm_workdir_factory(tmp_path / "work")
    result = run_main(workdir, "--dataset-pattern", "train_nothing_*.msgpack")
    assert result.returncode == 2
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert errors == [line for line in errors if "no shard file matches train_nothing_*.msgpack" in line]
    assert len(errors) == 1, result.stderr
    assert "Traceback" not in result.stderr


def test_a_busy_port_is_one_line_naming_the_key(mlm_workdir_factory, tmp_path):
    workdir = mlm_workdir_factory(tmp_path / "work")
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = subprocess.run([sys.executable, str(MAIN), "--ddp", "--nproc", "2", "--dist-master-port", str(port)],
                                cwd=workdir, capture_output=True, text=True, timeout=TIMEOUT)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"error: dist-master-port = {port}: the port is in use (Address already in use); choose a free one"]
    assert not (workdir / "runs").exists()


def launch_two_ranks(mlm_workdir_factory, tmp_path):
    """An endless 2-process --ddp run in tmp_path/work: the launcher and the file its stderr goes to."""
    workdir = mlm_workdir_factory(tmp_path / "work", max_iters=100_000, lr_decay_iters=100_000,
                                  val_interval=100_000)
    stderr_path = tmp_path / "stderr.txt"
    with stderr_path.open("w") as stderr:
        launcher = subprocess.Popen([sys.executable, str(MAIN), "--ddp", "--nproc", "2",
                                     "--dist-master-port", str(free_port())],
                                    cwd=workdir, stdout=subprocess.DEVNULL, stderr=stderr)
    return launcher, stderr_path


def wait_until_training(launcher, stderr_path, workdir) -> str:
    """Wait for step 2 in the run's log; the launcher's `started 2 ...` line, which names the ranks' pids."""
    log = workdir / "runs" / "run0" / "logs" / "log.txt"
    deadline = time.monotonic() + TIMEOUT
    while not (log.exists() and "step 2 |" in log.read_text(encoding="utf-8")):
        assert launcher.poll() is None, stderr_path.read_text()
        assert time.monotonic() < deadline, "training did not start"
        time.sleep(0.2)
    return next(line for line in stderr_path.read_text().splitlines() if line.startswith("started 2"))


def test_a_rank_that_dies_ends_the_whole_run(mlm_workdir_factory, tmp_path):
    """Rank 1 killed mid-training: the launcher stops rank 0 too and names the rank."""
    launcher, stderr_path = launch_two_ranks(mlm_workdir_factory, tmp_path)
    try:
        started = wait_until_training(launcher, stderr_path, tmp_path / "work")
        rank1_pid = int(started.split("rank 1 pid ")[1])
        killed_at = time.monotonic()
        subprocess.run(["kill", "-KILL", str(rank1_pid)], check=True)
        code = launcher.wait(timeout=30)
    finally:
        if launcher.poll() is None:
            launcher.kill()
    assert time.monotonic() - killed_at < 10
    assert code != 0
    stderr = stderr_path.read_text()
    assert "error: rank 1 of 2 was killed by SIGKILL; the other ranks were stopped" in stderr
    assert "Traceback" not in stderr  # a survivor's traceback goes to the file the line names


def test_torchrun_runs_the_same_main(mlm_workdir_factory, tmp_path):
    workdir = mlm_workdir_factory(tmp_path / "work", max_iters=2, lr_decay_iters=2, warmup_iters=1,
                                  val_interval=2, val_iters=2)
    result = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                             str(MAIN)], cwd=workdir, capture_output=True, text=True, timeout=TIMEOUT)
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in (workdir / "runs").iterdir()) == ["run0"]
    log = (workdir / "runs" / "run0" / "logs" / "log.txt").read_text(encoding="utf-8")
    assert "x 2 processes" in log
    assert load(workdir / "runs" / "run0" / "checkpoints" / "checkpoint.pt")["step"] == 2


def start_node(workdir: Path, port: int, job: str, *args: str, stderr=subprocess.PIPE) -> subprocess.Popen:
    """One machine's torchrun of a two-machine job (c10d rendezvous at 127.0.0.1:port), one process."""
    return subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1",
                             "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", job,
                             str(MAIN), *args], cwd=workdir, stdout=subprocess.DEVNULL, stderr=stderr, text=True)


def run_two_nodes(workdir: Path, job: str, *args: str):
    port = free_port()
    nodes = [start_node(workdir, port, job, *args) for _ in range(2)]
    results = [node.communicate(timeout=TIMEOUT)[1] for node in nodes]
    assert all(node.returncode == 0 for node in nodes), results


def children(pid: int) -> list[int]:
    return [int(child) for task in Path(f"/proc/{pid}/task").iterdir()
            for child in (task / "children").read_text().split()]


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="looks the processes up in /proc")
def test_two_machines_under_torchrun_train_resume_and_end_together_when_one_is_lost(mlm_workdir_factory, tmp_path):
    """Two torchrun launches on loopback stand for two machines: they train one run and resume it; when
    one machine's torchrun is killed its rank goes with it (no orphan writes on), and the other
    machine's rank ends with one line and a non-zero exit."""
    workdir = mlm_workdir_factory(tmp_path / "work", max_iters=2, lr_decay_iters=4, warmup_iters=1,
                                  val_interval=2, val_iters=1)
    run_two_nodes(workdir, "train")
    run_two_nodes(workdir, "resume", "--cp", "runs/run0/checkpoints/checkpoint.pt", "--max-iters", "3")
    assert sorted(p.name for p in (workdir / "runs").iterdir()) == ["run0"]
    assert "x 2 processes" in (workdir / "runs" / "run0" / "logs" / "log.txt").read_text(encoding="utf-8")
    assert load(workdir / "runs" / "run0" / "checkpoints" / "checkpoint.pt")["step"] == 3

    port, stderr_path = free_port(), tmp_path / "node0.txt"
    with stderr_path.open("w") as stderr:
        survivor = start_node(workdir, port, "lost", "--run-id", "lost", "--max-iters", "100000", stderr=stderr)
    lost = start_node(workdir, port, "lost", "--run-id", "lost", "--max-iters", "100000", stderr=subprocess.DEVNULL)
    try:
        log = workdir / "runs" / "lost" / "logs" / "log.txt"
        deadline = time.monotonic() + TIMEOUT
        while not (log.exists() and "step 2 |" in log.read_text(encoding="utf-8")):
            assert survivor.poll() is None and lost.poll() is None, stderr_path.read_text()
            assert time.monotonic() < deadline, "training did not start"
            time.sleep(0.2)
        ranks = children(lost.pid)
        lost.kill()
        assert survivor.wait(timeout=60) != 0
        assert not [pid for pid in ranks if Path(f"/proc/{pid}").exists() and process_state(pid) != "Z"]
    finally:
        for node in (survivor, lost):
            if node.poll() is None:
                node.kill()
    said = stderr_path.read_text()
    assert re.search(r"^error: rank [01]: another process of the job ended \(.+\); resume the job with --cp and "
                     r"its last checkpoint$", said, re.MULTILINE), said


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="looks the ranks up in /proc")
def test_ranks_die_with_their_launcher(mlm_workdir_factory, tmp_path):
    """kill -9 of the --ddp launcher: its ranks go too, and nobody writes the run any more."""
    launcher, stderr_path = launch_two_ranks(mlm_workdir_factory, tmp_path)
    started = wait_until_training(launcher, stderr_path, tmp_path / "work")
    ranks = [int(pid) for pid in re.findall(r"pid (\d+)", started)]
    launcher.kill()
    launcher.wait()
    deadline = time.monotonic() + 10
    while any(Path(f"/proc/{pid}").exists() and "Z" not in process_state(pid) for pid in ranks):
        if time.monotonic() > deadline:
            for pid in ranks:
                subprocess.run(["kill", "-KILL", str(pid)])
            raise AssertionError("the ranks outlived their launcher")
        time.sleep(0.2)


def process_state(pid: int) -> str:
    """R, S, Z...: the state /proc gives (a zombie has ended, its parent gone)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"
