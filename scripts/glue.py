"""The GLUE table for a pre-trained checkpoint: fine-tune every task with several seeds, score each
task's best checkpoint on its dev split(s), write the table, and the GLUE server's submission files.
Named entities, SQuAD and sentence embeddings (--tasks ner squad squad_v2 embed, their data in
--glue-dir's ner/, squad/, squad_v2/, embed/) join the same table: a model's whole report card.

Examples:
    python scripts/glue.py --cp runs/run0/checkpoints/best.pt --glue-dir glue
    python scripts/glue.py --cp CKPT --glue-dir glue --tasks sst2 mrpc --seeds 5 -o glue_results
    python scripts/glue.py --cp CKPT --glue-dir data --tasks sst2 ner squad embed -o report
    python scripts/glue.py --cp CKPT --glue-dir glue --ddp --nproc 4 --learning-rate 1e-4

Each task's recipe comes from --recipe (etc/templates/glue.ini: an [all] section and one per task);
any other --KEY VALUE is a config key that overrides it for every task. Every task's settings are
checked before the first run trains, with its data as its run checks them (SQuAD's doc-stride
beside seq-len). Runs go to OUTDIR/runs/TASK-seedN; a task and seed already scored are not run
again, so the same command after a stop (Ctrl-C, SIGTERM, a stop file, a crash, a lost machine)
goes on where it was; a run that was stopped is resumed, never scored. OUTDIR keeps
what made its scores (made_by.json: the checkpoint's checksum, --glue-dir, every setting), and a
command that differs is refused rather than mixed in; one glue.py at a time works in OUTDIR. With
--from-mnli, RTE, MRPC and STS-B start from the best MNLI run of the same seed (as MosaicBERT and
ModernBERT do), so MNLI runs first.
"""
import argparse
import configparser
import hashlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))
import checkpoints  # noqa: E402
import child_processes  # noqa: E402
from atomic import atomic_write  # noqa: E402
from config import INI_KEYS, Config, ini_text, known_name, typed_value  # noqa: E402
from errors import UserError, exit_on_user_error  # noqa: E402
from ini import load_config, parse_overrides  # noqa: E402
from main import make_task  # noqa: E402
from run_log import UNDEFINED, lock_directory, lock_run_dir, metric_text  # noqa: E402
from run_plan import with_run_length  # noqa: E402
from trainer import Trainer, finished_marker, improves  # noqa: E402
from vocab import write_vocab_directory  # noqa: E402
from tasks import embed_data  # noqa: E402
from tasks import glue_data  # noqa: E402
from tasks import glue_metrics  # noqa: E402
from tasks import glue_tasks  # noqa: E402
from tasks import pair_encoding  # noqa: E402
from tasks import squad_data  # noqa: E402
from tasks import token_data  # noqa: E402
from tasks import task_class  # noqa: E402
from tasks.classification_task import Part  # noqa: E402

TASK_ORDER = ("mnli", "cola", "sst2", "mrpc", "qqp", "stsb", "qnli", "rte", "wnli")  # MNLI first: --from-mnli
FROM_MNLI = ("rte", "mrpc", "stsb")
# The report card's other tasks, run after GLUE's when --tasks names them, and the scores the table
# shows of each, as fractions (SQuAD's, percentages in its logs, are divided by 100).
BEYOND_GLUE = {"ner": ("f1", "precision", "recall"), "squad": ("exact", "f1"),
               "squad_v2": ("exact", "f1", "HasAns_f1", "NoAns_f1"), "embed": ("spearman", "ndcg@10", "recall@10")}
IN_PERCENT = ("squad", "squad_v2")
RECIPE = ROOT / "etc" / "templates" / "glue.ini"
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)  # passed on to the run training: it saves and exits
STOPPED_EXIT_CODE = 130  # Ctrl-C's: stopped, the same command goes on


class Stopped(Exception):
    """A run was stopped before its end (Ctrl-C, SIGTERM, a stop file): it is resumed, not scored."""


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="Other options are config keys (--KEY VALUE) for every task's run.")
    parser.add_argument("--cp", type=Path, required=True, help="the pre-trained checkpoint to fine-tune")
    parser.add_argument("--glue-dir", type=Path, required=True,
                        help="GLUE's data: a folder per task, Hugging Face parquet (sst2/) or GLUE TSV (SST-2/)")
    parser.add_argument("--tasks", nargs="+", default=list(TASK_ORDER),
                        help=f"tasks to run (default: GLUE's nine; also {', '.join(BEYOND_GLUE)})")
    parser.add_argument("--seeds", type=int, default=3, help="fine-tuning runs per task (default 3)")
    parser.add_argument("--recipe", type=Path, default=RECIPE, help=f"per-task settings (default {RECIPE.name})")
    parser.add_argument("--from-mnli", action="store_true", help="start RTE, MRPC and STS-B from MNLI's best run")
    parser.add_argument("--skip-missing", action="store_true",
                        help="leave out tasks whose data is not in --glue-dir (default: stop and list them)")
    parser.add_argument("--ddp", action="store_true", help="train each run in --nproc processes")
    parser.add_argument("--nproc", type=int, help="processes per run with --ddp")
    parser.add_argument("-o", "--output", type=Path, default=Path("glue_results"),
                        help="directory for the runs, the table and the submission (default glue_results)")
    args, overrides = parser.parse_known_args(argv)
    if args.seeds < 1:
        raise UserError(f"--seeds {args.seeds}: expected at least 1")
    args.tasks = ordered_tasks(args.tasks)
    return args, overrides


def ordered_tasks(names: list[str]) -> list[str]:
    """The tasks asked for, by GLUE's names, in the order they run (GLUE's, then the others); ax comes with mnli."""
    tasks = {name if name in BEYOND_GLUE else glue_tasks.glue_task(name).name for name in names}
    if "ax" in tasks:
        raise UserError("--tasks ax: AX has no training data; its predictions come with mnli")
    return [name for name in (*TASK_ORDER, *BEYOND_GLUE) if name in tasks]


def read_recipe(path: Path) -> dict[str, dict[str, Any]]:
    """Section -> {field: typed value}; [all] applies to every task, a task's section overrides it."""
    parser = configparser.ConfigParser(inline_comment_prefixes=("#",), interpolation=None)
    try:
        if not parser.read(path, encoding="utf-8-sig"):
            raise UserError(f"{path}: recipe not found")
    except configparser.Error as error:
        raise UserError(f"{path}: not a recipe file ({error.__class__.__name__}: {error.message})") from None
    unknown = [name for name in parser.sections()
               if name != "all" and name not in glue_tasks.TASKS and name not in BEYOND_GLUE]
    if unknown:
        raise UserError(f"{path}: section [{unknown[0]}] is not a task of the runner; sections: [all], "
                        f"{', '.join(f'[{name}]' for name in (*TASK_ORDER, *BEYOND_GLUE))}")
    recipe = {}
    for section in parser.sections():
        where = f"{path}: [{section}]"
        names = {known_name(key, where): value for key, value in parser[section].items()}
        recipe[section] = {name: typed_value(name, value, where) for name, value in names.items() if name}
    return recipe


class Recipe:
    """Each task's settings: --recipe's [all], then its [TASK], then the command line's --KEY VALUE,
    each remembered with where it was set, so that a bad one is named where the user wrote it."""

    def __init__(self, path: Path, overrides: list[str]):
        self.path = path
        self.sections = read_recipe(path)
        self.overrides, self.override_origins = parse_overrides(overrides)

    def from_file(self, task: str) -> dict[str, Any]:
        return self.sections.get("all", {}) | self.sections.get(task, {})

    def settings(self, task: str) -> dict[str, Any]:
        return self.from_file(task) | self.overrides

    def as_text(self, task: str) -> dict[str, str]:
        """The task's settings as INI text, by key, sorted: what OUTDIR/made_by.json records."""
        return {INI_KEYS[name]: ini_text(value) for name, value in sorted(self.settings(task).items())}

    def check(self, task: str, where: dict[str, Any]) -> Config:
        """The config the task's runs will read, checked now, before any run trains."""
        origins = ({name: f"{self.path}: [all]" for name in self.sections.get("all", {})}
                   | {name: f"{self.path}: [{task}]" for name in self.sections.get(task, {})} | self.override_origins)
        return Config(**(where | self.settings(task)), sources=(f"{self.path}: [{task}]",), origins=origins)


def available_tasks(glue_dir: Path, tasks: list[str], skip_missing: bool) -> list[str]:
    """The tasks whose training and dev data are there; the rest stop the runner, or are skipped."""
    missing = []
    for name in tasks:
        try:
            check_task_data(glue_dir, name)
        except UserError as error:
            missing.append((name, str(error)))
    if missing and not skip_missing:
        found = [name for name in tasks if name not in dict(missing)]
        raise UserError(f"{glue_dir}: no data for {', '.join(name for name, _ in missing)} "
                        f"(found: {', '.join(found) or 'none'}); {missing[0][1]}; "
                        f"add --skip-missing to run the others")
    for name, problem in missing:
        print(f"skipping {name}: {problem}")
    return [name for name in tasks if name not in dict(missing)]


def check_task_data(glue_dir: Path, name: str):
    """The task's training and dev files are there (a UserError saying what is missing, where not)."""
    if name == "ner":
        for split in ("train", "validation"):
            token_data.find_files(glue_dir, split)
    elif name in ("squad", "squad_v2"):
        for split in ("train", "validation"):
            squad_data.find_files(glue_dir, name, split)
    elif name == "embed":
        embed_data.pair_files(glue_dir)
        if not (embed_data.has_similarity(glue_dir, "validation") or embed_data.qrels_file(glue_dir, "validation")):
            raise UserError(f"{embed_data.folder_of(glue_dir)}: no embed validation split (stsb/ or retrieval/)")
    else:
        task = glue_tasks.TASKS[name]
        for split in ("train", *task.dev_splits):
            glue_data.find_split_files(glue_dir, task, split)


class Runner:
    """Runs, scores and remembers each (task, seed); OUTDIR/scores/TASK-seedN.json marks one done."""

    def __init__(self, args, overrides: list[str]):
        self.args, self.overrides = args, overrides
        self.out = args.output
        self.recipe = Recipe(args.recipe, overrides)
        self.durations: list[float] = []

    def check_settings(self, tasks: list[str]):
        """Every task's config, as its runs will read it: a bad value stops here, before the first
        run trains, named in the recipe file or the option that set it. Then what each run checks
        as it starts, with its data: a setting that does not fit the data (SQuAD's doc-stride beside
        seq-len) stops here too, not after the tasks before it have trained."""
        configs = {task: self.recipe.check(task, self.given_by_runner(task)) for task in tasks}
        saved = checkpoints.load(self.args.cp, mmap=True)
        for task, config in configs.items():
            try:
                self.check_run_start(checkpoints.with_architecture(config, saved), checkpoints.vocab_of(saved))
            except UserError as error:
                raise UserError(f"{task}: {error}") from None

    def check_run_start(self, config: Config, vocab):
        """A run's own checks before it trains, on the CPU: its task reads and encodes the training
        and validation data with the run's settings, and its schedule takes the run's length."""
        processes = self.args.nproc if self.args.ddp and self.args.nproc else 1
        task = task_class(config.task_type)(config, vocab, torch.device("cpu"), 0, processes)
        with_run_length(config, task.train_examples() if config.epochs else 0, processes)
        task.check_data(("val",))

    def given_by_runner(self, task: str) -> dict[str, Any]:
        """The keys a run gets from the runner: its task, its data, OUTDIR for its run directory."""
        return {"task_type": task, "base_dir": str(self.out.resolve()), "glue_dir": str(self.args.glue_dir.resolve())}

    def prepare(self, tasks: list[str]):
        """Each task's config file, and OUTDIR/vocab from the checkpoint, so every run reads the
        vocabulary it was trained with, and cases text as it did."""
        for task in tasks:
            self.write_config_file(task)
        write_vocab_directory(self.out / "vocab", checkpoints.vocab_of(checkpoints.load(self.args.cp, mmap=True)))

    def run_dir(self, task: str, seed: int) -> Path:
        return self.out / "runs" / f"{task}-seed{seed}"

    def score_file(self, task: str, seed: int) -> Path:
        return self.out / "scores" / f"{task}-seed{seed}.json"

    def run_all(self, tasks: list[str]):
        jobs = [(task, seed) for task in tasks for seed in range(1, self.args.seeds + 1)]
        for number, (task, seed) in enumerate(jobs, start=1):
            if self.score_file(task, seed).is_file():
                continue
            left = len(jobs) - number + 1
            estimate = f", about {statistics.mean(self.durations) * left / 60:.0f} min left" if self.durations else ""
            print(f"[{number}/{len(jobs)}] {task} seed {seed}{estimate}", flush=True)
            started = time.monotonic()
            self.train(task, seed)
            self.score(task, seed)
            self.durations.append(time.monotonic() - started)

    def config_file(self, task: str) -> Path:
        return self.out / "recipes" / f"{task}.ini"

    def write_config_file(self, task: str):
        """OUTDIR/recipes/TASK.ini: the recipe's [all] and [TASK] with the task, the data and the output."""
        settings = self.given_by_runner(task) | self.recipe.from_file(task)
        text = "".join(f"{INI_KEYS[name]} = {ini_text(value)}\n" for name, value in settings.items())
        path = self.config_file(task)
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, lambda temp: temp.write_text(text, encoding="utf-8"))

    def overrides_for(self, seed: int) -> list[str]:
        """What a run's command line adds to its task's config file."""
        return ["--seed", str(seed), *self.overrides]

    def train(self, task: str, seed: int):
        """Train the run to its end: resumed where it stopped, started again where it stopped
        before its first checkpoint; nothing to do where it finished (stopped while scoring)."""
        run_dir = self.run_dir(task, seed)
        if finished_marker(run_dir).is_file():
            return
        latest = run_dir / "checkpoints" / "checkpoint.pt"
        if run_dir.exists() and not latest.is_file():
            with lock_run_dir(run_dir):  # refused while a process still trains in it
                shutil.rmtree(run_dir)
        command = [sys.executable, str(ROOT / "src" / "main.py"), *self.process_options(),
                   "--config", str(self.config_file(task)), *self.overrides_for(seed), "--run-id", run_dir.name]
        command += ["--cp", str(latest)] if latest.is_file() else ["--cp", str(self.start_checkpoint(task, seed)),
                                                                    "--switch-training"]
        code = run_training(command)
        if code != 0:
            raise UserError(f"{task} seed {seed}: the run stopped (exit code {code}); its log is in "
                            f"{run_dir / 'logs'}; run the same command again to go on")
        if not finished_marker(run_dir).is_file():  # a stop file, or a signal sent to the run alone
            raise Stopped(f"{task} seed {seed} was stopped before its end; its checkpoint is in "
                          f"{run_dir / 'checkpoints'}")

    def start_checkpoint(self, task: str, seed: int) -> Path:
        if self.args.from_mnli and task in FROM_MNLI and "mnli" in self.args.tasks:
            return self.run_dir("mnli", seed) / "checkpoints" / "best.pt"
        return self.args.cp.resolve()

    def process_options(self) -> list[str]:
        if not self.args.ddp:
            return []
        return ["--ddp"] + ([] if self.args.nproc is None else ["--nproc", str(self.args.nproc)])

    def score(self, task: str, seed: int):
        """The best checkpoint's metrics on the dev split(s), and its predictions on the hidden test split(s)."""
        best = self.run_dir(task, seed) / "checkpoints" / "best.pt"
        saved = checkpoints.load(best)
        config = checkpoints.with_architecture(load_config(self.config_file(task), self.overrides_for(seed)), saved)
        trainer = Trainer(config, make_task(config))
        task_object = trainer.task
        model = trainer.restored_model(saved, best)
        metrics = task_object.evaluate(model, task_object.eval_batches("val", None), trainer.autocast)
        result = {"task": task, "seed": seed, "checkpoint": str(best), "step": saved["step"], "metrics": metrics,
                  "predictions": self.test_predictions(trainer, model, task, seed)}
        target = self.score_file(task, seed)
        target.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(target, lambda temp: temp.write_text(json.dumps(result, indent=2) + "\n"))
        print(f"{task} seed {seed}: " + ", ".join(f"{name} {metric_text(value)}" for name, value in metrics.items()
                                                   if isinstance(value, float) or value is None), flush=True)

    def test_predictions(self, trainer: Trainer, model, task: str, seed: int) -> dict[str, str]:
        """The server's files for the hidden test split(s), and AX's with MNLI, under the run directory."""
        files = trainer.task.submission(model, "test", trainer.autocast) or {}
        if task == "mnli" and has_split(self.args.glue_dir, "ax", "test"):
            files |= ax_submission(trainer, model, self.args.glue_dir)
        written = {}
        for name, lines in files.items():
            target = self.run_dir(task, seed) / "submission" / name
            target.parent.mkdir(parents=True, exist_ok=True)
            atomic_write(target, lambda temp, lines=lines: temp.write_text("\n".join(lines) + "\n"))
            written[name] = str(target)
        return written

    def results(self, tasks: list[str]) -> list[dict]:
        return [json.loads(self.score_file(task, seed).read_text()) for task in tasks
                for seed in range(1, self.args.seeds + 1)]


def run_training(command: list[str]) -> int:
    """Run a training process that dies with this one however this one ends (kill -9 too: the
    kernel's parent-death signal, as --ddp's ranks die with their launcher) and that SIGINT or
    SIGTERM to this one stops cleanly: passed on, the run saves and exits, then Stopped is raised."""
    parent, received, child = os.getpid(), [], None

    def pass_on(signum, frame):
        received.append(signal.Signals(signum).name)
        if child is not None:
            child.send_signal(signum)
    previous = {signum: signal.signal(signum, pass_on) for signum in STOP_SIGNALS}
    try:
        child = subprocess.Popen(command, preexec_fn=lambda: child_processes.die_with_parent(parent))
        if received:  # asked to stop while the child was starting
            child.send_signal(signal.SIGTERM)
        code = child.wait()
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    if received:
        raise Stopped(f"by {received[0]}")
    return code


def has_split(glue_dir: Path, task: str, split: str) -> bool:
    try:
        glue_data.find_split_files(glue_dir, glue_tasks.TASKS[task], split)
    except UserError:
        return False
    return True


def ax_submission(trainer: Trainer, model, glue_dir: Path) -> dict[str, list[str]]:
    """AX.tsv: the MNLI model's predictions on the diagnostic set."""
    task = trainer.task
    examples = glue_data.read_split(glue_dir, "ax", "test")
    encoded = pair_encoding.encode_examples(task.vocab, examples.first, examples.second, task.config.seq_len)
    predictions = task.predict(model, Part("test", examples, encoded), trainer.autocast)
    return {"AX.tsv": glue_tasks.submission_lines(glue_tasks.TASKS["ax"], predictions, examples.index)}


# ----------------------------------------------------------------------------- the output directory

def locked_output(out: Path):
    """OUTDIR, made where needed, with an OS lock held until this process ends, however it ends: a
    second glue.py on the same OUTDIR is refused instead of deleting the runs the first one trains."""
    if out.exists() and not out.is_dir():
        raise UserError(f"{out}: not a directory (-o names the directory for the runs and the table)")
    try:
        out.mkdir(parents=True, exist_ok=True)
        (out / ".lock").touch()
    except OSError as error:
        raise UserError(f"{out}: cannot write there ({error.strerror or error})") from None
    return lock_directory(out, "another glue.py is working in it")


def made_by(args, recipe: Recipe) -> dict:
    """What OUTDIR's scores come from: the checkpoint's bytes, the data, every setting of every task's runs."""
    with args.cp.open("rb") as file:
        checksum = hashlib.file_digest(file, "sha256").hexdigest()
    return {"checkpoint": str(args.cp.resolve()), "checkpoint sha256": checksum,
            "glue-dir": str(args.glue_dir.resolve()), "from-mnli": args.from_mnli,
            "processes": f"--ddp --nproc {args.nproc or 'one per GPU'}" if args.ddp else "1",
            "settings": {task: recipe.as_text(task) for task in (*TASK_ORDER, *BEYOND_GLUE)
                         if task in TASK_ORDER or task in args.tasks}}


def check_made_by(out: Path, current: dict):
    """OUTDIR's runs and scores come from one checkpoint, one data set and one recipe
    (OUTDIR/made_by.json): where it holds any, a command that differs is refused, naming the
    difference, rather than mixing its scores in; where it holds none, this command is recorded."""
    record = out / "made_by.json"
    if any(out.glob("runs/*")) or any(out.glob("scores/*")):
        if not record.is_file():
            raise UserError(f"{out}: holds runs but no {record.name} saying what made them (an older glue.py "
                            f"wrote them); choose another -o, or remove {out}")
        try:
            recorded = json.loads(record.read_text(encoding="utf-8"))
        except ValueError as error:
            raise UserError(f"{record}: not a record of what made the runs ({error})") from None
        difference = first_difference(recorded if isinstance(recorded, dict) else {}, current)
        if difference:
            raise UserError(f"{out}: holds runs made with {difference}; choose another -o, "
                            f"or remove {out} to start again")
    atomic_write(record, lambda temp: temp.write_text(json.dumps(current, indent=2) + "\n", encoding="utf-8"))


def first_difference(recorded: dict, current: dict) -> str | None:
    """What OUTDIR's record holds that this command does not, in words; None when they agree."""
    if recorded.get("checkpoint sha256") != current["checkpoint sha256"]:
        return (f"the checkpoint {recorded.get('checkpoint')} (sha256 {str(recorded.get('checkpoint sha256'))[:12]}), "
                f"not {current['checkpoint']} (sha256 {current['checkpoint sha256'][:12]})")
    for name in ("glue-dir", "from-mnli", "processes"):
        if recorded.get(name) != current[name]:
            return f"{name} {recorded.get(name)}, not {current[name]}"
    for task, settings in current["settings"].items():
        old = recorded.get("settings", {}).get(task, {})
        for key in sorted(old.keys() | settings.keys()):
            if old.get(key) != settings.get(key):
                return f"{key} = {old.get(key, '(not set)')} for {task}, not {settings.get(key, '(not set)')}"
    return None


# ----------------------------------------------------------------------------- the table

def summary(results: list[dict]) -> dict:
    """Per dev result (cola, mnli_matched, ...): each metric's median, min and max over the seeds
    where it is defined (None where it is in none), the seeds where it is not (a correlation of
    constant predictions: no score, so not counted as one), and the two averages over the medians."""
    by_result: dict[str, dict[str, list[float | None]]] = {}
    for result in results:
        if result["task"] in BEYOND_GLUE:
            scale = 100 if result["task"] in IN_PERCENT else 1
            scores = by_result.setdefault(result["task"], {})
            for metric in BEYOND_GLUE[result["task"]]:
                value = result["metrics"][metric]
                scores.setdefault(metric, []).append(None if value is None else value / scale)
            continue
        task = glue_tasks.TASKS[result["task"]]
        for number, dev in enumerate(task.dev_results.values()):
            suffix = "" if number == 0 else "_mismatched"
            for metric in task.metrics:
                by_result.setdefault(dev, {}).setdefault(metric, []).append(result["metrics"][metric + suffix])
    defined = {dev: {metric: [value for value in values if value is not None] for metric, values in metrics.items()}
               for dev, metrics in by_result.items()}
    medians = {dev: {metric: float(np.median(values)) if values else None for metric, values in metrics.items()}
               for dev, metrics in defined.items()}
    spread = {dev: {metric: (min(values), max(values)) if values else None for metric, values in metrics.items()}
              for dev, metrics in defined.items()}
    undefined = {dev: {metric: values.count(None) for metric, values in metrics.items()}
                 for dev, metrics in by_result.items()}
    return {"medians": medians, "spread": spread, "undefined_seeds": undefined,
            "cramming_average": glue_metrics.cramming_average(medians),
            "leaderboard_average": glue_metrics.leaderboard_average(medians)}


def table(results: list[dict], args) -> str:
    facts = summary(results)
    beyond = any(task in BEYOND_GLUE for task in args.tasks)
    lines = [f"# {'Dev' if beyond else 'GLUE dev'} results of {args.cp}", "",
             f"Median over {args.seeds} fine-tuning seed(s), min-max in brackets, in percent. Recipe: "
             f"{args.recipe}{' (RTE, MRPC and STS-B from MNLI)' if args.from_mnli else ''}.", "",
             "| task | metric | median | min-max |", "|---|---|---:|---:|"]
    for dev, metrics in facts["medians"].items():
        for metric, median in metrics.items():
            cells = table_cells(median, facts["spread"][dev][metric], args.seeds, facts["undefined_seeds"][dev][metric])
            lines.append(f"| {dev} | {metric} | {cells} |")
    for name, title in (("cramming_average", "GLUE average as Cramming and the BERT paper count it "
                                             "(no WNLI; MNLI-m and -mm as two; F1, Spearman, MCC, accuracy)"),
                        ("leaderboard_average", "GLUE average as the leaderboard counts it (nine task scores, each "
                                                "the mean of its metrics, MNLI's the mean of -m and -mm)")):
        value = facts[name]
        lines.append("")
        lines.append(f"{title}: " + (f"**{100 * value:.1f}**" if value is not None else
                                     f"n/a ({why_no_average(facts)})"))
    return "\n".join(lines) + "\n"


def why_no_average(facts: dict) -> str:
    """Why an average has no value: a task missing, or one whose metric no seed defined."""
    undefined = [dev for dev, metrics in facts["medians"].items() if None in metrics.values()]
    return f"{', '.join(undefined)}: undefined in every seed" if undefined else "not every task ran"


def table_cells(median: float | None, spread: tuple[float, float] | None, seeds: int, undefined: int) -> str:
    """A metric's median and min-max cells, in percent; seeds where it is undefined are said, not counted."""
    if median is None:
        return f"undefined | {UNDEFINED} in all {seeds} seeds"
    low, high = spread
    note = f"; {undefined} of {seeds} seeds {UNDEFINED}, left out" if undefined else ""
    return f"{100 * median:.1f} | {100 * low:.1f}-{100 * high:.1f}{note}"


def write_outputs(results: list[dict], args) -> None:
    out = args.output
    atomic_write(out / "results.md", lambda temp: temp.write_text(table(results, args), encoding="utf-8"))
    report = {"checkpoint": str(args.cp), "recipe": str(args.recipe), "seeds": args.seeds, "runs": results,
              **summary(results)}
    atomic_write(out / "results.json", lambda temp: temp.write_text(json.dumps(report, indent=2) + "\n"))
    print(table(results, args))
    print(f"wrote {out / 'results.md'} and {out / 'results.json'}")
    write_submission(results, out)


def write_submission(results: list[dict], out: Path) -> None:
    """Each task's files from its best seed (by the task's GLUE score) into OUTDIR/submission and its zip."""
    best: dict[str, tuple[float, dict]] = {}
    for result in results:
        if not result["predictions"]:  # the test labels are known, or a task beyond GLUE
            continue
        score = glue_metrics.task_score(glue_tasks.TASKS[result["task"]], result["metrics"])
        if result["task"] not in best or improves(score, best[result["task"]][0], lower_is_better=False):
            best[result["task"]] = (score, result)
    if not best:
        return  # the test labels are known (not GLUE's own test sets): nothing to submit
    folder = out / "submission"
    folder.mkdir(parents=True, exist_ok=True)
    for _, result in best.values():
        for name, path in result["predictions"].items():
            shutil.copyfile(path, folder / name)
    archive = out / "submission.zip"

    def zipped(temp: Path):
        with zipfile.ZipFile(temp, "w", zipfile.ZIP_DEFLATED) as bundle:
            for path in sorted(folder.glob("*.tsv")):
                bundle.write(path, path.name)
    atomic_write(archive, zipped)
    print(f"wrote the GLUE server's files to {folder} and {archive}")


@exit_on_user_error
def main(argv=None):
    args, overrides = parse_args(sys.argv[1:] if argv is None else argv)
    if not args.cp.is_file():
        raise UserError(f"{args.cp}: checkpoint not found")
    runner = Runner(args, overrides)  # a bad key or value stops here, before anything is written
    tasks = available_tasks(args.glue_dir, args.tasks, args.skip_missing)
    runner.check_settings(tasks)
    with locked_output(args.output):
        check_made_by(args.output, made_by(args, runner.recipe))
        runner.prepare(tasks)
        try:
            runner.run_all(tasks)
        except (KeyboardInterrupt, Stopped) as stop:
            print(f"\nstopped: {f'{stop}; ' if str(stop) else ''}run the same command again to go on where it stopped",
                  file=sys.stderr)
            sys.exit(STOPPED_EXIT_CODE)
        write_outputs(runner.results(tasks), args)


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # between runs, SIGTERM stops as Ctrl-C does
    main()
