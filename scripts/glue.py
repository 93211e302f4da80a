"""The GLUE table for a pre-trained checkpoint: fine-tune every task with several seeds, score each
task's best checkpoint on its dev split(s), write the table, and the GLUE server's submission files.

Examples:
    python scripts/glue.py --cp runs/run0/checkpoints/best.pt --glue-dir glue
    python scripts/glue.py --cp CKPT --glue-dir glue --tasks sst2 mrpc --seeds 5 -o glue_results
    python scripts/glue.py --cp CKPT --glue-dir glue --ddp --nproc 4 --learning-rate 1e-4

Each task's recipe comes from --recipe (etc/templates/glue.ini: an [all] section and one per task);
any other --KEY VALUE is a config key that overrides it for every task. Runs go to OUTDIR/runs/
TASK-seedN; a task and seed already scored are not run again, so the same command after a stop
(Ctrl-C, a crash, a lost machine) goes on where it was. With --from-mnli, RTE, MRPC and STS-B start
from the best MNLI run of the same seed (as MosaicBERT and ModernBERT do), so MNLI runs first.
"""
import argparse
import configparser
import json
import shutil
import statistics
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))
import checkpoint as checkpoints  # noqa: E402
import glue_data  # noqa: E402
import glue_metrics  # noqa: E402
import glue_tasks  # noqa: E402
import pair_encoding  # noqa: E402
from atomic import atomic_write  # noqa: E402
from classification_task import ClassificationTask, Part  # noqa: E402
from errors import UserError, exit_on_user_error  # noqa: E402
from hardware import select_device  # noqa: E402
from config import known_name, typed_value  # noqa: E402
from ini import load_config, parse_overrides  # noqa: E402
from trainer import Trainer  # noqa: E402
from vocab import load_vocab  # noqa: E402

TASK_ORDER = ("mnli", "cola", "sst2", "mrpc", "qqp", "stsb", "qnli", "rte", "wnli")  # MNLI first: --from-mnli
FROM_MNLI = ("rte", "mrpc", "stsb")
RECIPE = ROOT / "etc" / "templates" / "glue.ini"


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="Other options are config keys (--KEY VALUE) for every task's run.")
    parser.add_argument("--cp", type=Path, required=True, help="the pre-trained checkpoint to fine-tune")
    parser.add_argument("--glue-dir", type=Path, required=True,
                        help="GLUE's data: a folder per task, Hugging Face parquet (sst2/) or GLUE TSV (SST-2/)")
    parser.add_argument("--tasks", nargs="+", default=list(TASK_ORDER), help="tasks to run (default: all nine)")
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
    """The tasks asked for, by GLUE's names, in the order they run; ax comes with mnli."""
    tasks = {glue_tasks.glue_task(name).name for name in names}
    if "ax" in tasks:
        raise UserError("--tasks ax: AX has no training data; its predictions come with mnli")
    return [name for name in TASK_ORDER if name in tasks]


def read_recipe(path: Path) -> dict[str, dict[str, str]]:
    """Section -> {key: value}; [all] applies to every task, a task's section overrides it."""
    parser = configparser.ConfigParser(inline_comment_prefixes=("#",), interpolation=None)
    try:
        if not parser.read(path, encoding="utf-8"):
            raise UserError(f"{path}: recipe not found")
    except configparser.Error as error:
        raise UserError(f"{path}: not a recipe file ({error.__class__.__name__}: {error.message})") from None
    unknown = [name for name in parser.sections() if name != "all" and name not in glue_tasks.TASKS]
    if unknown:
        raise UserError(f"{path}: section [{unknown[0]}] is not a GLUE task; sections: [all], "
                        f"{', '.join(f'[{name}]' for name in TASK_ORDER)}")
    recipe = {name: dict(parser[name]) for name in parser.sections()}
    for section, settings in recipe.items():
        for key, value in settings.items():
            where = f"{path}: [{section}]"
            typed_value(known_name(key, where), value, where)
    return recipe


def available_tasks(glue_dir: Path, tasks: list[str], skip_missing: bool) -> list[str]:
    """The tasks whose training and dev data are there; the rest stop the runner, or are skipped."""
    missing = []
    for name in tasks:
        task = glue_tasks.TASKS[name]
        try:
            for split in ("train", *task.dev_splits):
                glue_data.find_split_files(glue_dir, task, split)
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


class Runner:
    """Runs, scores and remembers each (task, seed); OUTDIR/scores/TASK-seedN.json marks one done."""

    def __init__(self, args, overrides: list[str]):
        self.args, self.overrides = args, overrides
        self.out = args.output
        self.recipe = read_recipe(args.recipe)
        self.durations: list[float] = []

    def prepare(self, tasks: list[str]):
        """Each task's config file, and OUTDIR/vocab from the checkpoint, so every run reads the
        vocabulary it was trained with."""
        for task in tasks:
            self.write_config_file(task)
        saved = checkpoints.load(self.args.cp, mmap=True)
        vocab_file = self.out / "vocab" / "vocab.txt"
        vocab_file.parent.mkdir(parents=True, exist_ok=True)
        text = "\n".join(saved["vocab"]) + "\n"
        if not vocab_file.is_file() or vocab_file.read_text(encoding="utf-8") != text:
            atomic_write(vocab_file, lambda temp: temp.write_text(text, encoding="utf-8"))

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
        where = {"task-type": task, "base-dir": str(self.out.resolve()), "glue-dir": str(self.args.glue_dir.resolve())}
        settings = where | self.recipe.get("all", {}) | self.recipe.get(task, {})
        text = "".join(f"{key} = {value}\n" for key, value in settings.items())
        path = self.config_file(task)
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, lambda temp: temp.write_text(text, encoding="utf-8"))

    def overrides_for(self, seed: int) -> list[str]:
        """What a run's command line adds to its task's config file."""
        return ["--seed", str(seed), *self.overrides]

    def train(self, task: str, seed: int):
        run_dir = self.run_dir(task, seed)
        latest = run_dir / "checkpoints" / "checkpoint.pt"
        if run_dir.exists() and not latest.is_file():
            shutil.rmtree(run_dir)  # stopped before its first checkpoint: start it again
        command = [sys.executable, str(ROOT / "src" / "main.py"), *self.process_options(),
                   "--config", str(self.config_file(task)), *self.overrides_for(seed), "--run-id", run_dir.name]
        command += ["--cp", str(latest)] if latest.is_file() else ["--cp", str(self.start_checkpoint(task, seed)),
                                                                    "--switch-training"]
        result = subprocess.run(command)
        if result.returncode != 0:
            raise UserError(f"{task} seed {seed}: the run stopped (exit code {result.returncode}); its log is in "
                            f"{run_dir / 'logs'}; run the same command again to go on")

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
        task_object = ClassificationTask(config, load_vocab(self.out / "vocab"), select_device(config.device))
        trainer = Trainer(config, task_object)
        model = trainer.starter.restored_model(saved, best)
        metrics = task_object.evaluate(model, task_object.eval_batches("val", None), trainer.autocast)
        result = {"task": task, "seed": seed, "checkpoint": str(best), "step": saved["step"], "metrics": metrics,
                  "predictions": self.test_predictions(trainer, model, task, seed)}
        target = self.score_file(task, seed)
        target.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(target, lambda temp: temp.write_text(json.dumps(result, indent=2) + "\n"))
        print(f"{task} seed {seed}: " + ", ".join(f"{name} {value:.4f}" for name, value in metrics.items()
                                                   if isinstance(value, float)), flush=True)

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


# ----------------------------------------------------------------------------- the table

def summary(results: list[dict]) -> dict:
    """Per dev result (cola, mnli_matched, ...): each metric's median, min and max over seeds, and the
    two averages over the medians."""
    by_result: dict[str, dict[str, list[float]]] = {}
    for result in results:
        task = glue_tasks.TASKS[result["task"]]
        for number, dev in enumerate(task.dev_results.values()):
            suffix = "" if number == 0 else "_mismatched"
            for metric in task.metrics:
                by_result.setdefault(dev, {}).setdefault(metric, []).append(result["metrics"][metric + suffix])
    medians = {dev: {metric: float(np.median(values)) for metric, values in metrics.items()}
               for dev, metrics in by_result.items()}
    spread = {dev: {metric: (min(values), max(values)) for metric, values in metrics.items()}
              for dev, metrics in by_result.items()}
    return {"medians": medians, "spread": spread, "cramming_average": glue_metrics.cramming_average(medians),
            "leaderboard_average": glue_metrics.leaderboard_average(medians)}


def table(results: list[dict], args) -> str:
    facts = summary(results)
    lines = [f"# GLUE dev results of {args.cp}", "",
             f"Median over {args.seeds} fine-tuning seed(s), min-max in brackets, in percent. Recipe: "
             f"{args.recipe}{' (RTE, MRPC and STS-B from MNLI)' if args.from_mnli else ''}.", "",
             "| task | metric | median | min-max |", "|---|---|---:|---:|"]
    for dev, metrics in facts["medians"].items():
        for metric, median in metrics.items():
            low, high = facts["spread"][dev][metric]
            lines.append(f"| {dev} | {metric} | {100 * median:.1f} | {100 * low:.1f}-{100 * high:.1f} |")
    for name, title in (("cramming_average", "GLUE average as Cramming and the BERT paper count it "
                                             "(no WNLI; MNLI-m and -mm as two; F1, Spearman, MCC, accuracy)"),
                        ("leaderboard_average", "GLUE average as the leaderboard counts it (nine task scores, each "
                                                "the mean of its metrics, MNLI's the mean of -m and -mm)")):
        value = facts[name]
        lines.append("")
        lines.append(f"{title}: " + (f"**{100 * value:.1f}**" if value is not None else "n/a (not every task ran)"))
    return "\n".join(lines) + "\n"


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
        task = glue_tasks.TASKS[result["task"]]
        score = glue_metrics.task_score(task, result["metrics"])
        if result["predictions"] and (result["task"] not in best or score > best[result["task"]][0]):
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
    parse_overrides(overrides)  # a bad key or value stops here, before anything is written
    tasks = available_tasks(args.glue_dir, args.tasks, args.skip_missing)
    runner = Runner(args, overrides)
    runner.prepare(tasks)
    try:
        runner.run_all(tasks)
    except KeyboardInterrupt:
        print("\nstopped: run the same command again to go on where it stopped", file=sys.stderr)
        sys.exit(130)
    write_outputs(runner.results(tasks), args)


if __name__ == "__main__":
    main()
