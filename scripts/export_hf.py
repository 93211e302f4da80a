"""Export a checkpoint to a Hugging Face transformers directory: every architecture, every task.

Examples:
    python scripts/export_hf.py --cp demo/runs/run0/checkpoints/best.pt -o demo/hf-mlm
    python scripts/export_hf.py --cp demo/runs/run1/checkpoints/best.pt -o demo/hf-sst2 --quantize int8

BERT's own architecture becomes transformers' BERT classes (BertForMaskedLM,
BertForSequenceClassification, ...); any other (pre-LN, RoPE, GeGLU, mean pooling, ...) a model
whose code travels in the directory, loaded with trust_remote_code=True. The directory also holds
the tokenizer (tokenizer.json, vocab.txt), the label names and a model card (README.md). It is
written whole into a temporary directory first, then renamed into place; --force replaces an
earlier export and nothing else (never the directory holding the checkpoint). With --onnx it also
holds onnx/model.onnx, checked against our model in onnxruntime; with --quantize int8 the int8 graph
beside it, both scored on the run's validation split (onnx_export.py).
"""
import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

import torch
from safetensors.torch import save_file

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))
import checkpoints  # noqa: E402
from atomic import sync_directory  # noqa: E402
import hf_export  # noqa: E402
import onnx_export  # noqa: E402
from errors import UserError, exit_on_user_error, naming_a_full_disk  # noqa: E402
from hf_import import model_class  # noqa: E402
from model import ModelConfig  # noqa: E402

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
    check_output(out_dir, checkpoint_path, force)
    files = directory_files(checkpoint_path, checkpoint)
    target = out_dir.resolve()  # a link stays a link; the directory it leads to is replaced
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        temp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
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
                onnx_export.write_quantized(checkpoint, checkpoint_path, temp / ONNX_FILE)
        finish(temp)
        replace_directory(temp, target)
    except OSError as error:
        raise UserError(f"{out_dir}: cannot write ({error.strerror})") from None
    finally:
        shutil.rmtree(temp, ignore_errors=True)
    return sorted(str(path.relative_to(target)) for path in target.rglob("*") if path.is_file())


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
    aside = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.old.", dir=out_dir.parent))
    try:
        out_dir.rename(aside / out_dir.name)
        try:
            new.rename(out_dir)
        except OSError:
            (aside / out_dir.name).rename(out_dir)  # the earlier export stays
            raise
    finally:
        shutil.rmtree(aside)
        sync_directory(out_dir.parent)


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
    main()
