"""Pre-train a BERT with masked language modelling, or fine-tune one, as config.ini says.

    python src/main.py                          # train as ./config.ini says
    python src/main.py --cp runs/run0/checkpoints/checkpoint.pt   # resume, or fine-tune from it
    python src/main.py --cp runs/run0/checkpoints/best.pt --test  # score on the test split
    python src/main.py --cp CKPT --switch-training   # a new run from CKPT's weights, whatever its task
    python src/main.py --learning-rate 3e-4     # any config key can be overridden
    python src/main.py --ddp --nproc 8          # 8 processes (one per GPU) with DistributedDataParallel
    torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint HOST:PORT src/main.py
"""
from errors import interrupt_quietly_while_starting
if __name__ == "__main__":  # before the seconds of importing torch: Ctrl-C then is one line too
    interrupt_quietly_while_starting()

import argparse
import dataclasses
import os
import sys
from pathlib import Path

from config import Config, key_reference
from errors import UserError, exit_on_user_error
from ini import load_config
from run_plan import with_run_length
from vocab import load_run_vocab
from tasks import task_class

# torch and the modules that use it (the trainer, the start, checkpoints, the device) are imported
# where a run starts, below: --help, a config's mistake and --ddp's launcher answer without the
# seconds torch takes to import.


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="Every config key is an option too: --KEY VALUE overrides config.ini "
                                            "(config.ini.example says more about each).\n\n" + key_reference())
    parser.add_argument("--config", type=Path, help="config file (default: ./config.ini)")
    parser.add_argument("--cp", type=Path, help="checkpoint to resume from or to fine-tune")
    parser.add_argument("--test", action="store_true", help="evaluate --cp on the test split and exit")
    parser.add_argument("--switch-training", action="store_true",
                        help="start a new run from --cp's weights, task, data and schedule from the config")
    parser.add_argument("--decay-from", type=Path, metavar="CKPT",
                        help="a new run that goes on from a wsd run's stable-phase checkpoint (weights, optimizer, "
                             "data position, step), its rate decaying to min-learning-rate by max-iters (or by "
                             "the end of time-budget)")
    parser.add_argument("--dont-load-optimizer", action="store_true",
                        help="resume --cp's run with a fresh optimizer (weights, step and data position kept)")
    parser.add_argument("--ddp", action="store_true",
                        help="train in --nproc processes on this machine with DistributedDataParallel "
                             "(rendezvous at dist-master-addr:dist-master-port); not needed under torchrun")
    parser.add_argument("--nproc", type=int, help="processes for --ddp (default: one per GPU, else 1)")
    parser.add_argument("--dp", action="store_true", help=argparse.SUPPRESS)  # refused: see main()
    return parser.parse_known_args(argv)


def make_task(config: Config, rank: int = 0, world_size: int = 1):
    from hardware import select_device
    return task_class(config.task_type)(config, load_run_vocab(config), select_device(config.device), rank,
                                        world_size)


def run(config: Config, checkpoint: Path | None, test: bool, rank: int = 0, world_size: int = 1, *,
        switch_training: bool = False, load_optimizer: bool = True, decay: bool = False,
        stop=None):
    """Score --cp on the test split, or train (see Trainer.fit) and return the run directory.
    The checkpoint is read once, here; the architecture keys the config leaves out come from it.
    decay: the checkpoint is --decay-from's, and the run decays from it (decay_branch).
    stop: the trainer.StopRequest a caller asks the run to stop through (default: its own)."""
    import checkpoints
    from run_start import decay_branch, resumed_decay
    from trainer import Trainer
    saved = checkpoints.load(checkpoint, runs_dir=config.runs_dir) if checkpoint is not None else None
    if saved is not None:
        config = checkpoints.with_architecture(config, saved)
    task = make_task(config, rank, world_size)
    config = with_run_length(config, task.train_examples() if config.epochs else 0, world_size)
    if decay:
        config = decay_branch(config, saved, checkpoint, task.name)
    elif saved is not None:
        config = resumed_decay(config, saved, task, switch_training)
    trainer = Trainer(config, task, rank, world_size)
    if test:
        return trainer.test(checkpoint, saved)
    return trainer.fit(checkpoint, saved, switch_training=switch_training, load_optimizer=load_optimizer,
                       branch=decay, stop=stop)


def run_rank(config: Config, args: argparse.Namespace):
    """One rank of a distributed run (torchrun or --ddp set RANK, WORLD_SIZE, LOCAL_RANK)."""
    if args.test:
        raise UserError("--test runs in one process: leave out --ddp and torchrun")
    import distributed
    from hardware import select_device
    device = select_device(config.device)
    rank, world_size, local_rank = distributed.join(device, config.dist_backend)
    if device.type == "cuda":  # one GPU per rank
        config = dataclasses.replace(config, device=f"cuda:{local_rank}")
    run(config, args.cp or args.decay_from, args.test, rank, world_size, **start_options(args))


def start_options(args: argparse.Namespace) -> dict:
    """How --cp (or --decay-from) starts training, checked against the other flags."""
    chosen = [flag for flag, given in (("--switch-training", args.switch_training),
                                       ("--dont-load-optimizer", args.dont_load_optimizer)) if given]
    if args.decay_from is not None:
        others = [flag for flag, given in (("--cp", args.cp is not None), ("--test", args.test)) if given] + chosen
        if others:
            raise UserError(f"--decay-from and {others[0]}: --decay-from names the checkpoint and how the run "
                            f"starts from it; leave {others[0]} out")
        return {"decay": True}
    if args.test and args.cp is None:
        raise UserError("--test needs a checkpoint: --cp PATH")
    if chosen and args.cp is None:
        raise UserError(f"{chosen[0]} needs a checkpoint: --cp PATH")
    if chosen and args.test:
        raise UserError(f"{chosen[0]} starts training; --test only scores --cp: leave one out")
    return {"switch_training": args.switch_training, "load_optimizer": not args.dont_load_optimizer}


def launched_as_a_rank() -> bool:
    """True in a rank started by torchrun or by --ddp's launcher: both set RANK and WORLD_SIZE."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def gpus_of(device_name: str) -> int:
    """The GPUs --ddp gives a rank each: none where the config says cpu (and torch stays unread)."""
    if device_name == "cpu":
        return 0
    import torch
    from hardware import select_device
    return torch.cuda.device_count() if select_device(device_name).type == "cuda" else 0


@exit_on_user_error
def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    args, overrides = parse_args(argv)
    if args.dp:
        raise UserError("--dp (DataParallel) is not supported: use --ddp --nproc N, one process per GPU")
    config = load_config(args.config, overrides)
    options = start_options(args)
    if launched_as_a_rank():  # started by --ddp below, or by torchrun
        import rank_process  # a rank's side of its launcher, read by ranks alone
        rank_process.rank_main(lambda: run_rank(config, args))
    elif args.ddp:
        if args.test:
            raise UserError("--test runs in one process: leave out --ddp")
        gpus = gpus_of(config.device)
        nproc = args.nproc if args.nproc is not None else max(1, gpus)
        if nproc < 1:
            raise UserError(f"--nproc {nproc}: expected at least 1")
        if gpus and nproc > gpus:
            raise UserError(f"--nproc {nproc}: this machine has {gpus} GPU(s), one per process")
        import launcher  # the launcher's room, read by --ddp alone
        sys.exit(launcher.launch(argv, nproc, config.dist_master_addr, config.dist_master_port))
    else:
        run(config, args.cp or args.decay_from, args.test, **options)


if __name__ == "__main__":
    main()
