"""Compare training runs: validation curves per group of runs (mean and spread over seeds) and a
markdown table of final and best values, with Welch's t-test between the groups.

Examples:
    python scripts/compare_runs.py wiki/runs/run0 wiki/runs/run1 wiki/runs/run2 wiki/runs/run3
    python scripts/compare_runs.py wiki/runs/run* --group-by mask-rate dropout --metric loss -o mask-study

Groups: runs with the same values of the --group-by keys (config keys; `processes`, the number
of processes config.ini records; `start`, the checkpoint a run started from, or none). Without
--group-by, the keys whose values differ between the runs, leaving out those that differ from
one repetition to the next or only say where files are and how the run is logged: seed,
max-iters (a shorter run is the same experiment stopped earlier), base-dir, vocab,
log-interval, val-interval, max-checkpoints, wandb, dist-master-addr, dist-master-port,
async-to-device and case. Name one with --group-by to group by it after all.

Writes OUTDIR/val_loss_vs_step.png, OUTDIR/val_loss_vs_tokens.png and so on for every val/*
metric (each group's mean with a +-1 std band over its runs, and every run as a thin line), and
OUTDIR/summary.md, also printed. "Final" is the value at the last validation step that every
run reached, so runs of different lengths are compared at the same step; "best" is the lowest
loss (the highest value of other metrics) up to that step. p is Welch's t-test on the final
values of each group against the first group (that of the first run given), not corrected for
multiple comparisons; it is - where either group has fewer than 2 runs. Runs scored with --test
add a table per test metric (the latest test_metrics_step*.json in the run directory); --target
METRIC:VALUE a table of the steps, tokens and minutes of training each group took to reach it. Grouped
by start, the test tables gain the tokens of pre-training behind each start (its checkpoint's lineage)
and OUTDIR/test_<metric>_vs_pretraining_tokens.png plots each start's score against them, random
weights as a band: the curve of a budget study. A run
without validation scalars (it died before its first validation) is left out with a warning. A
resumed run's event files are merged: from the step it resumed at on, the later file's values
replace the earlier ones.
"""
import argparse
import difflib
import json
import math
import sys
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))
from atomic import atomic_write  # noqa: E402
from config import FINE_TUNING_TASKS, INI_KEYS, ini_text  # noqa: E402
from errors import UserError, exit_on_user_error  # noqa: E402
from ini import load_config  # noqa: E402
from run_log import run_provenance  # noqa: E402
from run_plan import Target, lower_is_better, parse_target  # noqa: E402

PROCESSES_KEY = "processes"
START_KEY = "start"
GROUP_KEYS = [*INI_KEYS.values(), PROCESSES_KEY, START_KEY]
NOT_GROUPED_BY_DEFAULT = {"seed", "max-iters", "base-dir", "vocab", "log-interval", "val-interval",
                          "max-checkpoints", "wandb", "dist-master-addr", "dist-master-port",
                          "async-to-device", "case"}
TOKENS_TAG = "val/tokens"  # the x axis of the token plots, not a metric
ELAPSED_TAG = "val/elapsed"  # training seconds at each validation, not a metric
TEST_COUNT_TAG = "test/examples"  # how many examples --test scored, not a metric
MISSING = "–"


@dataclass
class RunData:
    path: Path
    settings: dict[str, str]  # config key -> value as config.ini writes it
    scalars: dict[str, tuple[np.ndarray, np.ndarray]]  # tag -> (steps, values), by step
    tests: dict[str, float] = field(default_factory=dict)  # test/accuracy -> value, from the latest --test

    @property
    def last_step(self) -> int:
        return max((int(steps[-1]) for steps, _ in self.scalars.values()), default=0)

    def metrics(self) -> list[str]:
        return [tag for tag in self.scalars if tag.startswith("val/") and tag not in (TOKENS_TAG, ELAPSED_TAG)]


# ----------------------------------------------------------------------------- reading runs

def read_settings(config_path: Path) -> dict[str, str]:
    """Every config key's value as text, and from its comment lines the number of processes and
    the checkpoint the run started from."""
    settings = {key: ini_text(value) for key, value in load_config(config_path, []).to_dict().items()}
    settings[PROCESSES_KEY], settings[START_KEY] = run_provenance(config_path.read_text(encoding="utf-8"))
    return settings


def pretraining_tokens(start: str) -> float | None:
    """The tokens of pre-training behind a start's weights: every stage of the checkpoint's lineage that
    is not a fine-tuning; 0 for random weights (start none); None where the checkpoint is gone, unreadable,
    or records none (an imported model), with a warning."""
    if start == "none":
        return 0
    import checkpoints
    try:
        state = checkpoints.load(Path(start), mmap=True)  # mmap: the lineage without the weights
    except UserError as error:
        print(f"warning: {error}; its pre-training tokens are unknown", file=sys.stderr)
        return None
    tokens = sum(stage["tokens"] for stage in checkpoints.lineage(state) if stage["task"] not in FINE_TUNING_TASKS)
    if not tokens:
        print(f"warning: {start}: records no tokens of pre-training (an imported model?)", file=sys.stderr)
    return tokens or None


def read_test_metrics(run_dir: Path) -> dict[str, float]:
    """The numbers of the run's latest test_metrics_step*.json, as test/NAME."""
    files = sorted(run_dir.glob("test_metrics_step*.json"), key=lambda path: path.stat().st_mtime)
    if not files:
        return {}
    try:
        metrics = json.loads(files[-1].read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise UserError(f"{files[-1]}: not a test metrics file ({error})") from None
    return {f"test/{name.removeprefix('test_')}": float(value) for name, value in metrics.items()
            if name.startswith("test_") and isinstance(value, (int, float))}


def read_event_file(path: Path) -> tuple[float, dict[str, list[tuple[int, float]]]]:
    """(time of its first event, tag -> [(step, value)]); a truncated file yields what it holds."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    events = EventAccumulator(str(path), size_guidance={"scalars": 0})
    events.Reload()
    try:
        started = events.FirstEventTimestamp()
    except ValueError:  # an empty or unreadable file
        return math.inf, {}
    return started, {tag: [(event.step, event.value) for event in events.Scalars(tag)]
                     for tag in events.Tags()["scalars"]}


def merge_event_files(files: list[dict[str, list[tuple[int, float]]]]) -> dict[str, dict[int, float]]:
    """One run's scalars from its event files in the order they were written. A resumed run's
    file replaces whatever the earlier ones logged from its first step on (logged after the
    checkpoint it resumed from), so a step logged twice keeps the latest value."""
    merged: dict[str, dict[int, float]] = {}
    for scalars in files:
        steps = [step for points in scalars.values() for step, _ in points]
        if not steps:
            continue
        first = min(steps)
        merged = {tag: {step: value for step, value in points.items() if step < first}
                  for tag, points in merged.items()}
        for tag, points in scalars.items():
            merged.setdefault(tag, {}).update(points)
    return merged


def read_scalars(logs: Path) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    files = sorted((read_event_file(path) for path in logs.glob("events.out.tfevents.*")), key=lambda file: file[0])
    merged = merge_event_files([scalars for _, scalars in files])
    return {tag: (np.array(sorted(points)), np.array([points[step] for step in sorted(points)]))
            for tag, points in merged.items() if points}


def load_run(path: Path) -> RunData:
    config_path, logs = path / "config.ini", path / "logs"
    if not config_path.is_file() and not logs.is_dir():
        raise UserError(f"{path}: not a run directory (no config.ini and no logs/)")
    if not config_path.is_file():
        raise UserError(f"{path}: no config.ini, so its settings (and group) are unknown")
    return RunData(path, read_settings(config_path), read_scalars(logs) if logs.is_dir() else {},
                   read_test_metrics(path))


def comparable_runs(runs: list[RunData]) -> tuple[list[RunData], list[str]]:
    """The runs with validation scalars, and a note for each one left out."""
    kept, left_out = [], []
    for run in runs:
        if run.metrics():
            kept.append(run)
        else:
            left_out.append(f"{run.path}: no validation scalars (stopped before its first validation, "
                            f"at step {run.last_step})")
    if not kept:
        raise UserError("no run to compare: none of them has validation scalars")
    return kept, left_out


# ----------------------------------------------------------------------------- grouping

def checked_group_keys(keys: list[str]) -> list[str]:
    """--group-by keys in config.ini spelling; an unknown one is a UserError naming it."""
    spelled = [key.strip().lower().replace("_", "-") for key in keys]
    for key in spelled:
        if key not in GROUP_KEYS:
            close = difflib.get_close_matches(key, GROUP_KEYS, n=1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            raise UserError(f"--group-by {key}: not a config key{hint}")
    return spelled


def differing_keys(runs: list[RunData]) -> list[str]:
    """The default grouping: keys whose values differ, but not per-repetition or bookkeeping ones."""
    return [key for key in runs[0].settings if key not in NOT_GROUPED_BY_DEFAULT
            and len({run.settings[key] for run in runs}) > 1]


def group_runs(runs: list[RunData], keys: list[str]) -> dict[str, list[RunData]]:
    """Label ('mask-rate=0.3, dropout=0.1') -> its runs; groups in order of their first run."""
    groups: dict[str, list[RunData]] = {}
    for run in runs:
        label = ", ".join(f"{key}={run.settings[key]}" for key in keys) or "all runs"
        groups.setdefault(label, []).append(run)
    return groups


def metric_tags(runs: list[RunData], requested: list[str] | None) -> list[str]:
    """val/* tags to compare: those asked for ('loss' or 'val/loss'), else every one present."""
    present = list(dict.fromkeys(tag for run in runs for tag in run.metrics()))
    if not requested:
        return present
    tags = [name if name.startswith("val/") else f"val/{name}" for name in requested]
    for tag in tags:
        if tag not in present:
            available = ", ".join(present)
            raise UserError(f"--metric {tag.removeprefix('val/')}: no run has {tag} (they have {available})")
    return tags


# ----------------------------------------------------------------------------- statistics

def value_at(run: RunData, tag: str, step: int) -> float:
    """The run's value at its last validation at or before `step`."""
    steps, values = run.scalars[tag]
    return float(values[np.searchsorted(steps, step, side="right") - 1])


def best_until(run: RunData, tag: str, step: int) -> float:
    steps, values = run.scalars[tag]
    values = values[steps <= step]
    return float(values.min() if lower_is_better(tag) else values.max())


def common_last_step(runs: list[RunData], tag: str) -> int:
    """The last step all runs reached: comparing at it is fair to runs of different lengths."""
    step = min(int(run.scalars[tag][0][-1]) for run in runs)
    for run in runs:
        first = int(run.scalars[tag][0][0])
        if first > step:
            raise UserError(f"{run.path}: its first {tag} is at step {first}, after another run "
                            f"ended (step {step}): no common step to compare them at")
    return step


def mean_and_std(values: list[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (nan for a single value)."""
    values = np.asarray(values, dtype=float)
    return float(values.mean()), (float(values.std(ddof=1)) if len(values) > 1 else math.nan)


def welch_p_value(first: list[float], second: list[float]) -> float:
    """Welch's t-test (unequal variances); nan where a side has fewer than 2 values."""
    from scipy.stats import ttest_ind
    if len(first) < 2 or len(second) < 2:
        return math.nan
    with warnings.catch_warnings():  # identical values: scipy warns and returns nan, which we show
        warnings.simplefilter("ignore", RuntimeWarning)
        return float(ttest_ind(first, second, equal_var=False).pvalue)


# ----------------------------------------------------------------------------- the table

def number(value: float, digits: str = ".4f") -> str:
    return MISSING if math.isnan(value) else format(value, digits)


def mean_std_text(values: list[float], digits: str = ".4f") -> str:
    mean, std = mean_and_std(values)
    return f"{number(mean, digits)} ± {number(std, digits)}"


def steps_reached(runs: list[RunData]) -> str:
    low, high = min(run.last_step for run in runs), max(run.last_step for run in runs)
    return str(low) if low == high else f"{low}–{high}"


def metric_table(groups: dict[str, list[RunData]], tag: str) -> list[str]:
    """The markdown section of one metric: heading, what final and best mean, one row per group."""
    groups = {label: [run for run in runs if tag in run.scalars] for label, runs in groups.items()}
    groups = {label: runs for label, runs in groups.items() if runs}
    runs = [run for members in groups.values() for run in members]
    step = common_last_step(runs, tag)
    best = "lowest" if lower_is_better(tag) else "highest"
    first_label = next(iter(groups))
    lines = [f"## {tag}: final at step {step}, the last step all {len(runs)} runs reached", "",
             f"Best: the {best} value up to step {step}. p: Welch's t-test on the final values "
             f"against the first group ({first_label}).", "",
             "| group | runs | final mean ± std | best mean ± std | steps reached | p vs first group |",
             "|---|---:|---:|---:|---:|---:|"]
    first_finals = [value_at(run, tag, step) for run in groups[first_label]]
    for label, members in groups.items():
        finals = [value_at(run, tag, step) for run in members]
        bests = [best_until(run, tag, step) for run in members]
        p_value = MISSING if label == first_label else number(welch_p_value(first_finals, finals), ".3g")
        lines.append(f"| {label} | {len(members)} | {mean_std_text(finals)} | {mean_std_text(bests)} "
                     f"| {steps_reached(members)} | {p_value} |")
    return lines + [""]


def million(count: float | None) -> float:
    return math.nan if count is None else count / 1e6


def test_values(groups: dict[str, list[RunData]], tag: str) -> dict[str, list[float]]:
    """Group label -> the test metric of its runs scored on test; groups without any left out."""
    groups = {label: [run.tests[tag] for run in runs if tag in run.tests] for label, runs in groups.items()}
    return {label: values for label, values in groups.items() if values}


def test_table(groups: dict[str, list[RunData]], tag: str, tokens: dict[str, float | None] | None = None) -> list[str]:
    """The markdown section of one test metric: one row per group with runs scored on test, and with
    `tokens` (grouped by start) the pre-training behind each group's start."""
    groups = test_values(groups, tag)
    first_label = next(iter(groups))
    header, rule = "| group | runs | mean ± std | p vs first group |", "|---|---:|---:|---:|"
    if tokens is not None:
        header, rule = f"| group | pre-training tokens (M) {header[len('| group '):]}", f"{rule}---:|"
    lines = [f"## {tag}: the latest --test of each run", "",
             f"p: Welch's t-test against the first group ({first_label}).", "", header, rule]
    for label, values in groups.items():
        p_value = MISSING if label == first_label else number(welch_p_value(groups[first_label], values), ".3g")
        trained = "" if tokens is None else f" {number(million(tokens[label]), '.3g')} |"
        lines.append(f"| {label} |{trained} {len(values)} | {mean_std_text(values)} | {p_value} |")
    return lines + [""]


def time_to_target(run: RunData, target: Target) -> tuple[int, float, float] | None:
    """(step, tokens, minutes of training) at the run's first validation that reached the target, or None;
    minutes are nan for a run that did not log its training time (made before val/elapsed was)."""
    tag = f"val/{target.metric}"
    steps, values = run.scalars[tag]
    reached = [step for step, value in zip(steps, values) if target.reached({target.metric: value})]
    if not reached:
        return None
    step = int(reached[0])
    at = {name: dict(zip(*run.scalars[name])) if name in run.scalars else {} for name in (TOKENS_TAG, ELAPSED_TAG)}
    return step, at[TOKENS_TAG].get(step, math.nan), at[ELAPSED_TAG].get(step, math.nan) / 60


def target_table(groups: dict[str, list[RunData]], target: Target) -> list[str]:
    """Steps, tokens and minutes to the target per group: MLPerf's comparison of recipes. A run is
    counted at its first validation at or past the target, so the resolution is val-interval."""
    tag = f"val/{target.metric}"
    lines = [f"## time to target: {tag} {'<=' if lower_is_better(tag) else '>='} {target.value:g}", "",
             "Each run at its first validation that reached the target; means over the runs that reached it.", "",
             "| group | reached | steps | tokens (M) | minutes of training |", "|---|---:|---:|---:|---:|"]
    for label, runs in groups.items():
        times = [time_to_target(run, target) for run in runs if tag in run.scalars]
        reached = [found for found in times if found is not None]
        columns = [MISSING] * 3
        if reached:
            steps, tokens, minutes = zip(*reached)
            columns = [mean_std_text(steps, ".0f"), mean_std_text([count / 1e6 for count in tokens], ".1f"),
                       mean_std_text(minutes, ".1f")]
        lines.append(f"| {label} | {len(reached)} of {len(times)} | {' | '.join(columns)} |")
    return lines + [""]


def summary_markdown(groups: dict[str, list[RunData]], tags: list[str], left_out: list[str],
                     target: Target | None = None, tokens: dict[str, float | None] | None = None) -> str:
    count = sum(len(runs) for runs in groups.values())
    lines = [f"# Comparison of {count} runs in {len(groups)} groups", ""]
    for label, runs in groups.items():
        lines.append(f"- {label}: {', '.join(str(run.path) for run in runs)}")
    lines += [f"- left out: {note}" for note in left_out] + [""]
    for tag in tags:
        lines += metric_table(groups, tag)
    if target is not None:
        lines += target_table(groups, target)
    for tag in dict.fromkeys(tag for runs in groups.values() for run in runs for tag in run.tests):
        lines += test_table(groups, tag, tokens)
    return "\n".join(lines)


# ----------------------------------------------------------------------------- plots

def curve(run: RunData, tag: str, x_axis: str) -> tuple[np.ndarray, np.ndarray]:
    """(x, values) of one run: x is the step, or the tokens trained on by then."""
    steps, values = run.scalars[tag]
    if x_axis == "step":
        return steps, values
    tokens = dict(zip(*run.scalars[TOKENS_TAG]))
    return np.array([tokens.get(step, np.nan) for step in steps]), values


def mean_curve(runs: list[RunData], tag: str, x_axis: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """x, mean and std at every step a run of the group reached, over the runs that reached it:
    a shorter run drops out of the mean where it ends (std 0 where one run is left)."""
    by_step = [dict(zip(run.scalars[tag][0].tolist(), zip(*curve(run, tag, x_axis)))) for run in runs]
    rows = []
    for step in sorted(set().union(*by_step)):
        points = np.array([points[step] for points in by_step if step in points])  # (runs, [x, value])
        std = points[:, 1].std(ddof=1) if len(points) > 1 else 0.0
        rows.append((points[:, 0].mean(), points[:, 1].mean(), std))
    return tuple(np.array(column) for column in zip(*rows))


def plot_metric(groups: dict[str, list[RunData]], tag: str, x_axis: str, path: Path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    figure, axes = plt.subplots(figsize=(8, 5))
    for index, (label, runs) in enumerate(groups.items()):
        runs = [run for run in runs if tag in run.scalars]
        if not runs:
            continue
        color = f"C{index % 10}"
        for run in runs:
            axes.plot(*curve(run, tag, x_axis), color=color, linewidth=0.7, alpha=0.4)
        x, mean, std = mean_curve(runs, tag, x_axis)
        axes.plot(x, mean, color=color, linewidth=2, label=f"{label} ({len(runs)} runs)")
        axes.fill_between(x, mean - std, mean + std, color=color, alpha=0.2, linewidth=0)
    axes.set_xlabel("tokens trained on" if x_axis == "tokens" else "step")
    axes.set_ylabel(tag)
    axes.set_title(f"{tag} against {x_axis}: group mean ± 1 std, thin lines single runs")
    axes.grid(alpha=0.3)
    axes.legend(fontsize="small")
    figure.tight_layout()
    atomic_write(path, lambda temp: figure.savefig(temp, format="png", dpi=110))
    plt.close(figure)


def plot_against_pretraining(groups: dict[str, list[RunData]], tag: str, tokens: dict[str, float | None],
                             path: Path) -> bool:
    """A test metric against the pre-training tokens behind each group's start: the scaling curve of a
    budget study. Each start's mean ± 1 std and its runs as dots; random weights (start none) a band.
    False (nothing written) without at least one pre-trained start and one more group to set it against."""
    values = {label: runs for label, runs in test_values(groups, tag).items() if tokens[label] is not None}
    trained = sorted((tokens[label], label) for label in values if tokens[label] > 0)
    if not trained or len(values) < 2:
        return False
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    figure, axes = plt.subplots(figsize=(8, 5))
    x = np.array([count / 1e6 for count, _ in trained])
    means, stds = zip(*(mean_and_std(values[label]) for _, label in trained))
    axes.errorbar(x, means, yerr=np.nan_to_num(stds), color="C0", marker="o", capsize=4, linewidth=1.5,
                  label="pre-trained starts: mean ± 1 std")
    for count, (_, label), mean in zip(x, trained, means):
        axes.scatter([count] * len(values[label]), values[label], color="C0", s=12, alpha=0.5)
        axes.annotate(start_name(groups[label][0]), (count, mean),
                      textcoords="offset points", xytext=(6, -12), fontsize="small")
    for index, (label, runs) in enumerate((label, runs) for label, runs in values.items() if tokens[label] == 0):
        mean, std = mean_and_std(runs)
        axes.axhline(mean, color=f"C{index + 1}", linestyle="--", label=f"{label} ({len(runs)} runs)")
        axes.axhspan(mean - np.nan_to_num(std), mean + np.nan_to_num(std), color=f"C{index + 1}", alpha=0.15)
    if len(set(x)) > 1:
        axes.set_xscale("log")
        axes.xaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
    axes.set_xlabel("millions of tokens of pre-training behind the start")
    axes.set_ylabel(tag)
    axes.set_title(f"{tag} against pre-training: mean ± 1 std over each start's runs, dots single runs")
    axes.grid(alpha=0.3)
    axes.legend(fontsize="small")
    figure.tight_layout()
    atomic_write(path, lambda temp: figure.savefig(temp, format="png", dpi=110))
    plt.close(figure)
    return True


def start_name(run: RunData) -> str:
    """A start as a point's label: its run's name (runs/T/checkpoints/best.pt -> T best.pt), or the file's."""
    path = Path(run.settings[START_KEY])
    return f"{path.parent.parent.name} {path.name}" if path.parent.name == "checkpoints" else path.name


def write_plots(groups: dict[str, list[RunData]], tags: list[str], out_dir: Path,
                tokens: dict[str, float | None] | None = None) -> list[Path]:
    runs = [run for members in groups.values() for run in members]
    x_axes = ["step"]
    if all(TOKENS_TAG in run.scalars for run in runs):
        x_axes.append("tokens")
    else:
        print(f"warning: some runs have no {TOKENS_TAG} (made before it was logged): no plots against tokens",
              file=sys.stderr)
    written = []
    for tag in tags:
        for x_axis in x_axes:
            path = out_dir / f"{tag.replace('/', '_')}_vs_{x_axis}.png"
            plot_metric(groups, tag, x_axis, path)
            written.append(path)
    test_tags = dict.fromkeys(tag for run in runs for tag in run.tests if tag != TEST_COUNT_TAG)
    for tag in test_tags if tokens is not None else []:
        path = out_dir / f"{tag.replace('/', '_')}_vs_pretraining_tokens.png"
        if plot_against_pretraining(groups, tag, tokens, path):
            written.append(path)
    return written


# ----------------------------------------------------------------------------- command line

def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", type=Path, metavar="RUN_DIR", help="run directories (base-dir/runs/runN)")
    parser.add_argument("--group-by", nargs="+", metavar="KEY",
                        help="config keys that define the groups (default: the keys that differ, see above)")
    parser.add_argument("--metric", nargs="+", metavar="NAME",
                        help="validation metrics to compare, e.g. loss accuracy (default: every val/* scalar)")
    parser.add_argument("-o", "--output", type=Path, default=Path("comparison"), metavar="OUTDIR",
                        help="directory for the plots and summary.md (default: ./comparison)")
    parser.add_argument("--target", metavar="METRIC:VALUE",
                        help="a table of the steps, tokens and minutes each group took to reach it (accuracy:0.35)")
    return parser.parse_args(argv)


def checked_target(text: str | None, runs: list[RunData]) -> Target | None:
    try:
        target = parse_target(text or "")
    except ValueError:
        raise UserError(f"--target {text}: expected METRIC:VALUE, a validation metric and a number "
                        f"(accuracy:0.35)") from None
    if target is not None and not any(f"val/{target.metric}" in run.scalars for run in runs):
        raise UserError(f"--target {text}: no run has val/{target.metric}")
    return target


@exit_on_user_error
def main(argv=None) -> str:
    args = parse_args(argv)
    group_keys = checked_group_keys(args.group_by) if args.group_by else None
    runs, left_out = comparable_runs([load_run(path) for path in args.runs])
    for note in left_out:
        print(f"warning: {note}; left out", file=sys.stderr)
    tags = metric_tags(runs, args.metric)
    target = checked_target(args.target, runs)
    keys = group_keys if group_keys is not None else differing_keys(runs)
    groups = group_runs(runs, keys)
    tokens = {label: pretraining_tokens(members[0].settings[START_KEY]) for label, members in groups.items()} \
        if START_KEY in keys else None
    try:
        args.output.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise UserError(f"{args.output}: cannot create output directory ({error.strerror})") from None
    written = write_plots(groups, tags, args.output, tokens)
    summary = summary_markdown(groups, tags, left_out, target, tokens)
    summary_path = args.output / "summary.md"
    atomic_write(summary_path, lambda temp: temp.write_text(summary, encoding="utf-8"))
    print(summary)
    print(f"wrote {summary_path} and {len(written)} plots in {args.output}", file=sys.stderr)
    return summary


if __name__ == "__main__":
    main()
