"""The command line: every user mistake ends with exit code 2 and one line `error: ...` on stderr,
never a traceback; --help exits 0. Each case is a real `python src/main.py` process. And the
modules a run imports: only its own."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import house_numbers
import main
from config import INI_KEYS, ini_text, key_groups
from house_numbers import FINE_TUNING_MODULES, PRE_TRAINING_MODULES
from vocab import SPECIAL_TOKENS

ROOT = Path(__file__).resolve().parent.parent

# name -> (arguments, what the error line must contain); {checkpoint}, {workdir} are filled in.
# Run as real processes. A config's own mistakes answer before torch is imported (under half a second);
# the checkpoint and shard cases pay about two seconds of CPU for it.
PROCESS_ERRORS = {
    "unknown config key": (["--config", "{workdir}/typo.ini"],
                           "unknown key 'lerning-rate' (did you mean 'learning-rate'?)"),
    "missing config.ini": ([], "config.ini not found"),  # run in an empty directory
    "bad override value": (["--batch-size", "many"], "--batch-size many: expected an integer"),
    "missing checkpoint": (["--cp", "nothing.pt"], "nothing.pt: checkpoint not found"),
    "no matching shard": (["--dataset-pattern", "train_nothing_*.msgpack"],
                          "no shard file matches train_nothing_*.msgpack"),
    "other architecture": (["--cp", "{checkpoint}", "--d-model", "128"],
                           "d-model = 64 in the checkpoint but 128"),
    "other vocabulary": (["--cp", "{checkpoint}", "--vocab", "{workdir}/other_vocab.txt"], "another vocabulary"),
    "corrupt checkpoint": (["--cp", "{workdir}/corrupt.pt"], "corrupt.pt: not a readable checkpoint"),
}
# The same path through main(), called in this process.
IN_PROCESS_ERRORS = {
    "missing --config file": (["--config", "{workdir}/nothing.ini"], "nothing.ini: config file not found"),
    "unknown option": (["--lerning-rate", "1e-3"], "--lerning-rate: unknown option (did you mean --learning-rate?)"),
    "override out of range": (["--dropout", "1.5"], "--dropout 1.5: expected a number in [0, 1)"),
    "foreign checkpoint": (["--cp", "{workdir}/foreign.pt"], "foreign.pt: not a checkpoint of this program"),
    "--test without --cp": (["--test"], "--test needs a checkpoint"),
    "--switch-training without --cp": (["--switch-training"], "--switch-training needs a checkpoint: --cp PATH"),
    "--dont-load-optimizer with --test": (["--cp", "{checkpoint}", "--test", "--dont-load-optimizer"],
                                          "--dont-load-optimizer starts training; --test only scores --cp"),
    "checkpoint with fewer layers": (["--cp", "{checkpoint}", "--n-layer", "3"],
                                     "n-layer = 2 in the checkpoint but 3"),
}


def make_error_inputs(workdir: Path) -> None:
    """A config with a typo, a vocabulary with two tokens swapped, a random and a foreign .pt file."""
    config = (workdir / "config.ini").read_text(encoding="utf-8")
    (workdir / "typo.ini").write_text(config.replace("learning-rate = ", "lerning-rate = ", 1), encoding="utf-8")
    tokens = (workdir / "vocab" / "vocab.txt").read_text(encoding="utf-8").splitlines()
    tokens[100], tokens[101] = tokens[101], tokens[100]  # same size and architecture, other ids
    (workdir / "other_vocab.txt").write_text("\n".join(tokens) + "\n", encoding="utf-8")
    (workdir / "corrupt.pt").write_bytes(os.urandom(4096))
    torch.save({"weights": torch.zeros(3)}, workdir / "foreign.pt")


@pytest.fixture(scope="module")
def outcomes(mlm_workdir_factory, mlm_trained_run, tmp_path_factory) -> dict:
    """Every case of PROCESS_ERRORS plus --help, run as processes side by side: name -> CompletedProcess;
    and the "workdir" they ran in, the "checkpoint" they used."""
    workdir = mlm_workdir_factory(tmp_path_factory.mktemp("errors") / "work")
    empty = tmp_path_factory.mktemp("empty")
    make_error_inputs(workdir)
    checkpoint = mlm_trained_run / "runs" / "run0" / "checkpoints" / "checkpoint.pt"
    cases = {name: args for name, (args, _) in PROCESS_ERRORS.items()} | {"--help": ["--help"]}
    processes = {}
    for name, args in cases.items():
        cwd = empty if name == "missing config.ini" else workdir
        args = [arg.format(checkpoint=checkpoint, workdir=workdir) for arg in args]
        processes[name] = subprocess.Popen([sys.executable, str(ROOT / "src" / "main.py"), *args], cwd=cwd,
                                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    results = {}
    for name, process in processes.items():
        try:
            stdout, stderr = process.communicate(timeout=180)
        except subprocess.TimeoutExpired:
            process.kill()
            stdout, stderr = process.communicate()
        results[name] = subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)
    results["workdir"], results["checkpoint"] = workdir, checkpoint
    return results


def check_error_line(stderr: str, expected: str) -> None:
    assert "Traceback" not in stderr, stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), stderr
    assert expected in lines[0]


@pytest.mark.parametrize("case", PROCESS_ERRORS)
def test_user_error_is_one_line_with_exit_code_2(outcomes, case):
    result = outcomes[case]
    check_error_line(result.stderr, PROCESS_ERRORS[case][1])
    assert result.returncode == 2


@pytest.mark.parametrize("case", IN_PROCESS_ERRORS)
def test_user_error_in_process(outcomes, case, monkeypatch, capsys, keep_signal_handlers):
    monkeypatch.chdir(outcomes["workdir"])
    args, expected = IN_PROCESS_ERRORS[case]
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        main.main([arg.format(checkpoint=outcomes["checkpoint"], workdir=outcomes["workdir"]) for arg in args])
    assert exit_info.value.code == 2
    check_error_line(capsys.readouterr().err, expected)


def test_failed_start_leaves_no_run_directory(outcomes):
    assert not (outcomes["workdir"] / "runs").exists()


def test_help_exits_0_and_lists_the_options(outcomes):
    result = outcomes["--help"]
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage:")
    for option in ("--config", "--cp", "--test", "--KEY VALUE"):
        assert option in result.stdout
    assert result.stderr == ""


def test_help_lists_every_key_with_its_type_default_and_meaning(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main.main(["--help"])
    assert exit_info.value.code == 0
    shown = capsys.readouterr().out
    for title, members in key_groups():
        assert f"\n{title}:\n" in shown
        for each in members:
            line = next(line for line in shown.splitlines() if line.startswith(f"  --{INI_KEYS[each.name]} "))
            assert each.metadata["meaning"] in line and f"(default {ini_text(each.default) or '(empty)'})" in line


# A newcomer's first errors, each met in a directory of its own as a new user meets it (a template
# copied to config.ini, then `python src/main.py`): name -> (template, files made first, arguments,
# what the one line must say, {here} the directory's full path, {scripts} the repository's scripts).
NEWCOMER_ERRORS = {
    "no vocabulary": ("config.ini.example", [], [],
                      ["{here}/vocab: cannot read vocabulary (not found); make one: "
                       "python {scripts}/train_vocab.py -i YOUR_TEXT -o {here}/vocab"]),
    "no vocabulary in the template's base dir": ("etc/templates/config_mlm.ini", [], [],
                                                 ["{here}/wiki/vocab: cannot read vocabulary (not found)",
                                                  "python {scripts}/train_vocab.py -i YOUR_TEXT -o {here}/wiki/vocab"]),
    "no demo": ("etc/templates/config_cpu.ini", [], [],
                ["{here}/demo/vocab: cannot read vocabulary (not found); build the demo: "
                 "python {scripts}/make_demo.py -o {here}/demo"]),
    "no shards": ("config.ini.example", ["vocab/vocab.txt"], [],
                  ["{here}/datasets: no shard file matches train_*.msgpack (no such directory); make shards: "
                   "python {scripts}/prepare_mlm_dataset.py -i INPUT -l LABEL -o {here}/datasets -m 128 "
                   "-v {here}/vocab; the pattern must match the names it writes, train_LABEL_128_*.msgpack.gz"]),
    "a pattern that matches none of the shards there": (
        "etc/templates/config_mlm.ini", ["wiki/vocab/vocab.txt", "wiki/datasets/train_imdb_128_123.msgpack.gz"], [],
        ["{here}/wiki/datasets: no shard file matches train_wiki_128_*.msgpack "
         "(shard files there: train_imdb_128_123.msgpack.gz); make shards: python {scripts}/prepare_mlm_dataset.py",
         "-o {here}/wiki/datasets -m 128 -v {here}/wiki/vocab;", "train_LABEL_128_*.msgpack.gz"]),
    "no checkpoint, no runs": ("config.ini.example", [], ["--cp", "runs/run0/checkpoints/checkpoint.pt"],
                               ["{here}/runs/run0/checkpoints/checkpoint.pt: checkpoint not found; no runs/ directory "
                                "here yet: a training run writes {here}/runs/runN/checkpoints/checkpoint.pt"]),
    "no checkpoint by that name": ("etc/templates/config_mlm.ini", ["wiki/runs/run0/checkpoints/checkpoint.pt"],
                                   ["--cp", "wiki/runs/run0/checkpoint.pt"],
                                   ["{here}/wiki/runs/run0/checkpoint.pt: checkpoint not found; newest checkpoints "
                                    "in {here}/wiki/runs: wiki/runs/run0/checkpoints/checkpoint.pt"]),
}


def newcomer_directory(directory: Path, template: str, files: list[str]) -> Path:
    """The template as config.ini, a small vocabulary as each vocab.txt, the other files empty."""
    directory.mkdir(parents=True)
    (directory / "config.ini").write_text((ROOT / template).read_text(encoding="utf-8"), encoding="utf-8")
    tokens = [*SPECIAL_TOKENS, *"abcdefghijklmnopqrstuvwxyz"]
    for name in files:
        (directory / name).parent.mkdir(parents=True, exist_ok=True)
        (directory / name).write_text("\n".join(tokens) + "\n" if name.endswith("vocab.txt") else "", encoding="utf-8")
    return directory.resolve()


def tree(directory: Path) -> set[Path]:
    return {path.relative_to(directory) for path in directory.rglob("*")}


@pytest.fixture(scope="module")
def newcomer_outcomes(tmp_path_factory) -> dict:
    """Each case of NEWCOMER_ERRORS run as a process, side by side: name -> (directory, files before
    it ran, CompletedProcess)."""
    started = {}
    for number, (name, (template, files, args, _)) in enumerate(NEWCOMER_ERRORS.items()):
        directory = newcomer_directory(tmp_path_factory.mktemp("newcomer") / f"user{number}", template, files)
        started[name] = directory, tree(directory), subprocess.Popen(
            [sys.executable, str(ROOT / "src" / "main.py"), *args], cwd=directory, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True)
    outcomes = {}
    for name, (directory, before, process) in started.items():
        try:
            stdout, stderr = process.communicate(timeout=180)
        except subprocess.TimeoutExpired:
            process.kill()
            stdout, stderr = process.communicate()
        outcomes[name] = directory, before, subprocess.CompletedProcess(process.args, process.returncode, stdout,
                                                                        stderr)
    return outcomes


@pytest.mark.parametrize("case", NEWCOMER_ERRORS)
def test_a_newcomers_first_error_names_the_full_path_and_what_to_run(newcomer_outcomes, case):
    directory, before, result = newcomer_outcomes[case]
    assert result.returncode == 2, result.stderr
    for expected in NEWCOMER_ERRORS[case][3]:
        check_error_line(result.stderr, expected.format(here=directory, scripts=ROOT / "scripts"))
    assert str(directory) in result.stderr and not result.stdout
    assert tree(directory) == before  # nothing written: no runs/ directory, no run


@pytest.mark.parametrize("delay", [0.3, 0.8])
def test_ctrl_c_while_starting_is_one_line_and_exit_130(mlm_workdir_factory, tmp_path, delay):
    """Seconds pass importing torch before main() runs: Ctrl-C then is one line too."""
    workdir = mlm_workdir_factory(tmp_path / "work")
    process = subprocess.Popen([sys.executable, str(ROOT / "src" / "main.py")], cwd=workdir,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(delay)
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=60)
    assert (process.returncode, stderr) == (130, "interrupted\n")
    assert not (workdir / "runs").exists()


# What a run reads: the project's modules it imports, held in scripts/house_numbers.py, which counts
# their lines. A module added to these paths is a decision (issue 39 set 26 modules for pre-training;
# cores.py, the cgroup's quota of cores and memory, made it 27), not an accident.
IMPORTED_BY_A_RUN = f"""
import atexit, json, pathlib, sys
sys.path.insert(0, {str(ROOT / 'src')!r})
source = pathlib.Path({str(ROOT / 'src')!r})
def ours(module) -> bool:
    return source in pathlib.Path(getattr(module, "__file__", None) or "/").parents
atexit.register(lambda: print(json.dumps([name for name, module in sys.modules.items() if ours(module)])))
import main
main.main(sys.argv[1:])
"""


def modules_imported(workdir: Path, *args: str) -> set[str]:
    result = subprocess.run([sys.executable, "-c", IMPORTED_BY_A_RUN, *args], cwd=workdir, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    return set(json.loads(result.stdout.strip().splitlines()[-1]))


def test_a_pre_training_run_imports_only_its_own_modules(mlm_workdir):
    imported = modules_imported(mlm_workdir, "--max-iters", "1", "--val-interval", "1", "--val-iters", "1")
    assert imported == PRE_TRAINING_MODULES, (imported - PRE_TRAINING_MODULES, PRE_TRAINING_MODULES - imported)


def test_a_fine_tuning_run_imports_only_its_own_modules(mlm_workdir, rotten_tomatoes):
    import make_demo
    make_demo.write_sst2(mlm_workdir / "datasets", rotten_tomatoes, seed=123)
    imported = modules_imported(mlm_workdir, "--task-type", "sst2", "--max-iters", "1", "--val-interval", "1")
    assert imported == FINE_TUNING_MODULES, (imported - FINE_TUNING_MODULES, FINE_TUNING_MODULES - imported)


# main.py reads the config before torch: its mistakes, --help and --ddp's launcher on cpu answer without it.
WITHOUT_TORCH = f"""
import sys
sys.path.insert(0, {str(ROOT / 'src')!r})
import launcher, main
try:
    main.main(sys.argv[1:])
except SystemExit as end:
    print(end.code, "torch" in sys.modules)
"""


@pytest.mark.parametrize("args, code", [(["--batch-size", "many"], 2), (["--help"], 0),
                                        (["--ddp", "--nproc", "0"], 2)], ids=["config mistake", "help", "ddp"])
def test_a_config_mistake_help_and_the_launcher_on_cpu_answer_without_importing_torch(tmp_path, args, code):
    (tmp_path / "config.ini").write_text("device = cpu\n", encoding="utf-8")
    result = subprocess.run([sys.executable, "-c", WITHOUT_TORCH, *args], cwd=tmp_path, capture_output=True,
                            text=True, timeout=60)
    assert result.stdout.splitlines()[-1] == f"{code} False", (result.stdout, result.stderr)


def test_house_numbers_counts_the_runs_modules_and_finds_no_circle(capsys):
    house_numbers.main()
    lines = capsys.readouterr().out.splitlines()
    rows = {line.split(" | ")[0].strip("| "): line.split(" | ")[1:] for line in lines if line.startswith("| ")}
    assert rows["pre-training (mlm)"][0] == str(len(PRE_TRAINING_MODULES))
    counts = house_numbers.counted(PRE_TRAINING_MODULES)
    assert counts["lines"] == counts["code"] + counts["docstrings"] + counts["comments"] + counts["blank"]
    assert counts["lines"] == sum(len(house_numbers.module_path(name).read_text().splitlines())
                                  for name in PRE_TRAINING_MODULES)
    chain = house_numbers.longest_chain()  # a circle would end it with an error
    assert lines[-1].endswith(" -> ".join(chain))


def test_the_core_imports_no_wing_but_main_which_composes_a_run():
    """src/*.py is the engine; the tasks, the corpus preparation and the interop stand in wings of their
    own (src/tasks/, src/corpus/, src/interop/) that only main.py picks from."""
    assert house_numbers.core_imports_of_wings() == []
    rooms = house_numbers.house()
    assert set(rooms) == {"core", "tasks", "corpus", "interop"}


def test_a_wing_imports_another_only_one_way():
    """tasks -> corpus (a teacher's transfer-data), tasks -> interop (a published teacher); no wing imports
    back: the wings stand in one order, as the core's modules do."""
    graph = house_numbers.import_graph()
    between = {(house_numbers.wing_of(name), house_numbers.wing_of(each)) for name, imported in graph.items()
               for each in imported}
    wings = {pair for pair in between if None not in pair and pair[0] != pair[1]}
    assert wings == {("tasks", "corpus"), ("tasks", "interop")}
