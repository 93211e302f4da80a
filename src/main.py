"""Pre-train a BERT with masked language modelling, or fine-tune one, as config.ini says.

    python src/main.py                          # train as ./config.ini says
    python src/main.py --cp runs/run0/checkpoints/checkpoint.pt   # resume, or fine-tune from it
    python src/main.py --cp runs/run0/checkpoints/best.pt --test  # score on the test split
    python src/main.py --learning-rate 3e-4     # any config key can be overridden
"""
import argparse
import sys
from pathlib import Path

from classification_dataset import ClassificationTask
from config import Config, load_config
from errors import UserError, exit_on_user_error
from mlm_dataset import MaskedLMTask
from trainer import Trainer, select_device
from vocab import load_vocab

TASKS = {"mlm": MaskedLMTask, "sst2": ClassificationTask, "classify": ClassificationTask}


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="Other options are config keys: --KEY VALUE overrides config.ini.")
    parser.add_argument("--config", type=Path, help="config file (default: ./config.ini)")
    parser.add_argument("--cp", type=Path, help="checkpoint to resume from or to fine-tune")
    parser.add_argument("--test", action="store_true", help="evaluate --cp on the test split and exit")
    return parser.parse_known_args(argv)


def make_task(config: Config, rank: int = 0, world_size: int = 1):
    if config.task_type not in TASKS:
        raise UserError(f"task-type = {config.task_type}: this version trains {', '.join(TASKS)}")
    vocab = load_vocab(config.vocab_path)
    device = select_device(config.device)
    return TASKS[config.task_type](config, vocab, device, rank, world_size)


def run(config: Config, checkpoint: Path | None, test: bool, rank: int = 0, world_size: int = 1):
    trainer = Trainer(config, make_task(config, rank, world_size), rank, world_size)
    if test:
        if checkpoint is None:
            raise UserError("--test needs a checkpoint: --cp PATH")
        return trainer.test(checkpoint)
    return trainer.fit(checkpoint)


@exit_on_user_error
def main(argv=None):
    args, overrides = parse_args(sys.argv[1:] if argv is None else argv)
    config = load_config(args.config, overrides)
    run(config, args.cp, args.test)


if __name__ == "__main__":
    main()
