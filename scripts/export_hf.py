"""Export a checkpoint to a Hugging Face transformers directory: every architecture, every task.

Examples:
    python scripts/export_hf.py --cp demo/runs/run0/checkpoints/best.pt -o demo/hf-mlm
    python scripts/export_hf.py --cp demo/runs/run1/checkpoints/best.pt -o demo/hf-sst2 --quantize int8

BERT's own architecture becomes transformers' BERT classes (BertForMaskedLM,
BertForSequenceClassification, ...); any other (pre-LN, RoPE, GeGLU, mean pooling, ...) a model
whose code travels in the directory, loaded with trust_remote_code=True. The directory also holds
the tokenizer (tokenizer.json, vocab.txt), the label names and a model card (README.md). It is
written whole into a hidden workspace beside it first, then renamed into place: Ctrl-C or SIGTERM
leaves nothing, and a workspace a killed export left, the next export to the same place removes.
--force replaces an earlier export and nothing else (never the directory holding the checkpoint).
With --onnx it also holds onnx/model.onnx, checked against our model in onnxruntime; with
--quantize int8 the int8 graph beside it, both scored on the run's validation split (onnx_export.py).
"""
import argparse
import contextlib
import fcntl
import json
import os
import re
import shutil
import signal
import sys
import tempfile
from pathlib import Path

import torch
from safetensors.torch import save_file

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))
import checkpoints  # noqa: E402
from atomic import process_alive, sync_directory  # noqa: E402
from config import Config  # noqa: E402
from errors import UserError, exit_on_user_error, naming_a_full_disk  # noqa: E402
from model import ModelConfig  # noqa: E402
from task import chosen_metric  # noqa: E402
from interop import hf_export, onnx_export  # noqa: E402
from interop.hf_import import model_class  # noqa: E402
from interop.onnx_model import onnx_class  # noqa: E402
from tasks import task_class  # noqa: E402

ONNX_FILE = "onnx/model.onnx"  # where optimum and sentence-transformers' ONNX backend look


def check_weights(path: Path, checkpoint: dict):
    """The weights fit the checkpoint's architecture and hold the whole encoder: a damaged file is
    named, not exported."""
    config = ModelConfig(**checkpoint["model_config"])
    with torch.device("meta"):  # shapes only: nothing allocated, nothing initialised
        reference = model_class(checkpoint["task"], config)(config)
    checkpoints.check_shapes(path, checkpoint["model"], reference)
    weights = checkpoint["model"]
    missing = [name for name in reference.state_dict() if name.startswith("encoder.") and name not in weights]
    if missing:
        raise UserError(f"{path}: a damaged checkpoint: weights missing: {', '.join(missing[:3])}")


def check_output(out_dir: Path, checkpoint_path: Path, force: bool):
    """The output is new, empty, or (with --force) an earlier export and nothing else: never the
    directory the checkpoint is in, nor one holding anything an export does not write."""
    if out_dir.exists() and not out_dir.is_dir():
        raise UserError(f"{out_dir}: exists and is not a directory")
    if not out_dir.is_dir() or not any(out_dir.iterdir()):
        return
    if checkpoint_path.resolve().is_relative_to(out_dir.resolve()):
        raise UserError(f"{out_dir}: holds the checkpoint {checkpoint_path}; export to another directory")
    if not force:
        raise UserError(f"{out_dir}: exists and is not empty; add --force to replace it")
    problem = hf_export.not_an_export(out_dir)
    if problem:
        raise UserError(f"{out_dir}: {problem}; --force replaces only an earlier export")


def directory_files(checkpoint_path: Path, checkpoint: dict) -> dict[str, str]:
    files = {"config.json": json.dumps(hf_export.hf_config(checkpoint), indent=2) + "\n",
             "README.md": hf_export.model_card(checkpoint, checkpoint_path),
             **hf_export.tokenizer_files(checkpoints.vocab_of(checkpoint), checkpoint["model_config"]["max_len"])}
    if not hf_export.is_native(checkpoint):
        files |= hf_export.code_files()
    if checkpoint["task"] == "embed":
        files |= hf_export.sentence_transformers_files(checkpoint)
    return files


def export(checkpoint_path: Path, out_dir: Path, force: bool = False, onnx: bool = False,
           quantize: bool = False) -> list[str]:
    """Writes the directory (where out_dir leads, if a symbolic link), with onnx/model.onnx checked
    against our model where `onnx`, and its int8 graph scored beside it where `quantize`; returns the
    names of its files."""
    onnx = onnx or quantize  # the int8 graph is made from the checked float32 one
    if onnx:
        onnx_export.require_onnx()
    checkpoint = hf_export.as_exported(checkpoints.load(checkpoint_path))
    hf_export.check_exportable(checkpoint_path, checkpoint)
    if onnx:
        onnx_export.check_graphable(checkpoint, checkpoint_path)
    if quantize:
        onnx_export.check_quantizable(checkpoint, checkpoint_path)
    check_weights(checkpoint_path, checkpoint)
    files = directory_files(checkpoint_path, checkpoint)
    target = out_dir.resolve()  # a link stays a link; the directory it leads to is replaced
    remove_left_workspaces(target)  # first: an earlier export one of them held goes back into place
    check_output(out_dir, checkpoint_path, force)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        temp, lock = new_workspace(target.parent, f".{target.name}.")
    except OSError as error:
        raise UserError(f"{out_dir}: cannot create the output directory ({error.strerror})") from None
    try:
        with naming_a_full_disk(out_dir / "model.safetensors"):
            save_file(hf_export.exported_weights(checkpoint), temp / "model.safetensors", metadata={"format": "pt"})
        for name, text in files.items():
            (temp / name).parent.mkdir(exist_ok=True)
            with naming_a_full_disk(out_dir / name):
                (temp / name).write_text(text, encoding="utf-8")
        if onnx:
            with naming_a_full_disk(out_dir / ONNX_FILE):
                onnx_export.write_onnx(checkpoint, checkpoints.vocab_of(checkpoint), temp / ONNX_FILE,
                                       out_dir / ONNX_FILE)
        if quantize:
            with naming_a_full_disk(out_dir / onnx_export.QUANTIZED_FILE):
                onnx_export.write_quantized(temp / ONNX_FILE,
                                            lambda graphs: validation_scores(checkpoint, checkpoint_path, graphs))
        finish(temp)
        replace_directory(temp, target)
    except OSError as error:
        raise UserError(f"{out_dir}: cannot write ({error.strerror})") from None
    finally:
        remove_workspace(temp, lock)
    return sorted(str(path.relative_to(target)) for path in target.rglob("*") if path.is_file())


def validation_scores(checkpoint: dict, checkpoint_path: Path, graphs: dict[str, Path]) -> dict:
    """Each graph's metrics on the run's validation split, read as the run read it (its settings,
    its data paths from the working directory), and the name of the task's headline metric."""
    settings = checkpoints.saved_settings(checkpoint) | {"teacher": "", "transfer_data": ""}  # scoring alone
    config = Config(**settings, sources=(f"{checkpoint_path}'s settings",))
    shape = ModelConfig(**checkpoint["model_config"])
    try:
        task = task_class(checkpoint["task"])(config, checkpoints.vocab_of(checkpoint), torch.device("cpu"))
        task.take_checkpoint_labels(tuple(checkpoint["model_config"]["label_names"]), kept=True)  # its outputs' names
        scores = {kind: task.evaluate(onnx_class(checkpoint["task"])(path, shape), task.eval_batches("val", None),
                                      contextlib.nullcontext()) for kind, path in graphs.items()}
    except UserError as error:
        raise UserError(f"--quantize scores the graphs on the run's validation split, its paths read from "
                        f"{Path.cwd()}: {error}") from None
    return scores | {"metric": chosen_metric(config, task)}


def finish(directory: Path):
    """The permissions the umask gives new files, where mkdtemp makes 0700 and safetensors 0600
    (private to their owner), and every file on disk before the rename makes them the export."""
    mask = os.umask(0)
    os.umask(mask)
    for path in directory.iterdir():
        if path.is_dir():
            finish(path)
            continue
        path.chmod(0o666 & ~mask)
        with open(path, "rb+") as file:
            os.fsync(file.fileno())
    directory.chmod(0o777 & ~mask)
    sync_directory(directory)


def replace_directory(new: Path, out_dir: Path):
    """out_dir := new. An earlier export (--force) is moved into a directory of its own beside it
    first, moved back if the rename fails, and removed once new is in place."""
    if not out_dir.exists():
        new.rename(out_dir)
        sync_directory(out_dir.parent)
        return
    aside, lock = new_workspace(out_dir.parent, f".{out_dir.name}.old.")
    try:
        out_dir.rename(aside / out_dir.name)
        try:
            new.rename(out_dir)
        except BaseException:  # an OSError, or Ctrl-C or SIGTERM between the two renames
            (aside / out_dir.name).rename(out_dir)  # the earlier export stays
            raise
    finally:
        remove_workspace(aside, lock)
        sync_directory(out_dir.parent)


def new_workspace(parent: Path, prefix: str) -> tuple[Path, int]:
    """A new hidden directory in `parent`, named with this process's id, and a descriptor that holds its
    lock while the export lives: what tells a workspace a killed export left from a running one's."""
    path = Path(tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}.", dir=parent))
    descriptor = os.open(path, os.O_RDONLY)
    fcntl.flock(descriptor, fcntl.LOCK_EX)
    return path, descriptor


def remove_workspace(path: Path, lock: int):
    shutil.rmtree(path, ignore_errors=True)
    os.close(lock)  # its lock goes with it


def remove_left_workspaces(target: Path):
    """Remove the workspaces beside `target` that exports killed before their cleanup left (kill -9, a
    lost machine): those whose process is gone and whose lock no process holds (a running export's is
    never touched, on this machine or another sharing the disk)."""
    workspace = re.compile(rf"\.{re.escape(target.name)}\.(?P<aside>old\.)?(?P<pid>\d+)\.[a-z0-9_]{{8}}")
    if not target.parent.is_dir():
        return
    for entry in target.parent.iterdir():
        found = workspace.fullmatch(entry.name)
        if found and entry.is_dir() and not entry.is_symlink() and not process_alive(int(found["pid"])):
            with contextlib.suppress(OSError):  # one that cannot be removed stays, as it was
                remove_left_workspace(entry, target, bool(found["aside"]))


def remove_left_workspace(entry: Path, target: Path, aside: bool):
    """Remove a workspace whose lock is free; an earlier export it holds aside (its export was killed
    between moving it and putting the new one in place) goes back where nothing took its place."""
    descriptor = os.open(entry, os.O_RDONLY)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)  # BlockingIOError: a running export's
        earlier = entry / target.name
        if aside and earlier.is_dir() and not os.path.lexists(target):
            earlier.rename(target)
        shutil.rmtree(entry)
    finally:
        os.close(descriptor)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cp", type=Path, required=True,
                        help="our checkpoint: pre-trained (mlm, clm, electra), fine-tuned, or imported")
    parser.add_argument("-o", "--output", type=Path, required=True, help="directory to write")
    parser.add_argument("--force", action="store_true",
                        help="replace an earlier export in the output directory (never anything else)")
    parser.add_argument("--onnx", action="store_true",
                        help="also onnx/model.onnx, kept only if onnxruntime's outputs equal ours "
                             f"(within {onnx_export.TOLERANCE:g}, relative past 1); needs: {onnx_export.INSTALL}")
    parser.add_argument("--quantize", choices=["int8"],
                        help=f"also {onnx_export.QUANTIZED_FILE} (implies --onnx): onnxruntime's dynamic int8, "
                             f"with the size and validation scores of both graphs in "
                             f"{onnx_export.QUANTIZATION_REPORT} (the run's validation data must be at hand)")
    return parser.parse_args(argv)


@exit_on_user_error
def main(argv=None):
    args = parse_args(argv)
    names = export(args.cp, args.output, args.force, args.onnx, args.quantize == "int8")
    print(f"wrote {args.output}: {', '.join(names)}")
    if args.quantize:
        report = json.loads((args.output / onnx_export.QUANTIZATION_REPORT).read_text(encoding="utf-8"))
        print(onnx_export.quantization_line(report))


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # SIGTERM stops as Ctrl-C does: nothing is left
    main()
