"""Export a checkpoint to a Hugging Face transformers directory: every architecture, every task.

Example:
    python scripts/export_hf.py --cp demo/runs/run0/checkpoints/best.pt -o demo/hf-mlm

BERT's own architecture becomes transformers' BERT classes (BertForMaskedLM,
BertForSequenceClassification, ...); any other (pre-LN, RoPE, GeGLU, mean pooling, ...) a model
whose code travels in the directory, loaded with trust_remote_code=True. The directory also holds
the tokenizer (tokenizer.json, vocab.txt), the label names and a model card (README.md). It is
written whole into a temporary directory first, then renamed into place.
"""
import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

import torch
from safetensors.torch import save_file

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))
import checkpoint as checkpoints  # noqa: E402
import hf_export  # noqa: E402
from errors import UserError, exit_on_user_error  # noqa: E402
from model import BertForMaskedLM, BertForPreTraining, BertForSequenceClassification, ModelConfig  # noqa: E402
from model import BertForCausalLM, ElectraForPreTraining  # noqa: E402

MODEL_CLASSES = {"mlm": BertForMaskedLM, "clm": BertForCausalLM, "electra": ElectraForPreTraining}


def check_weights(path: Path, checkpoint: dict):
    """The weights fit the checkpoint's architecture and hold the whole encoder: a damaged file is
    named, not exported."""
    config = ModelConfig(**checkpoint["model_config"])
    kind = MODEL_CLASSES.get(checkpoint["task"], BertForSequenceClassification)
    if checkpoint["task"] == "mlm" and config.sentence_classes:
        kind = BertForPreTraining
    with torch.device("meta"):  # shapes only: nothing allocated, nothing initialised
        reference = kind(config)
    checkpoints.check_shapes(path, checkpoint["model"], reference)
    weights = checkpoint["model"]
    missing = [name for name in reference.state_dict() if name.startswith("encoder.") and name not in weights]
    if missing:
        raise UserError(f"{path}: a damaged checkpoint: weights missing: {', '.join(missing[:3])}")


def check_output(out_dir: Path, force: bool):
    if out_dir.exists() and not out_dir.is_dir():
        raise UserError(f"{out_dir}: exists and is not a directory")
    if out_dir.is_dir() and any(out_dir.iterdir()) and not force:
        raise UserError(f"{out_dir}: exists and is not empty; add --force to replace it")


def directory_files(checkpoint_path: Path, checkpoint: dict) -> dict[str, str]:
    files = {"config.json": json.dumps(hf_export.hf_config(checkpoint), indent=2) + "\n",
             "README.md": hf_export.model_card(checkpoint, checkpoint_path),
             **hf_export.tokenizer_files(checkpoints.vocab_of(checkpoint), checkpoint["model_config"]["max_len"])}
    if not hf_export.is_native(checkpoint):
        files |= hf_export.code_files()
    return files


def export(checkpoint_path: Path, out_dir: Path, force: bool = False) -> list[str]:
    """Writes the directory; returns the names of its files."""
    checkpoint = checkpoints.load(checkpoint_path)
    hf_export.check_exportable(checkpoint_path, checkpoint)
    check_weights(checkpoint_path, checkpoint)
    check_output(out_dir, force)
    files = directory_files(checkpoint_path, checkpoint)
    try:
        out_dir.parent.mkdir(parents=True, exist_ok=True)
        temp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    except OSError as error:
        raise UserError(f"{out_dir}: cannot create the output directory ({error.strerror})") from None
    try:
        save_file(hf_export.exported_weights(checkpoint), temp / "model.safetensors", metadata={"format": "pt"})
        for name, text in files.items():
            (temp / name).write_text(text, encoding="utf-8")
        replace_directory(temp, out_dir)
    except OSError as error:
        raise UserError(f"{out_dir}: cannot write ({error.strerror})") from None
    finally:
        shutil.rmtree(temp, ignore_errors=True)
    return sorted(path.name for path in out_dir.iterdir())


def replace_directory(new: Path, out_dir: Path):
    """out_dir := new; an old out_dir (--force) is moved aside first and removed once new is in place."""
    old = None
    if out_dir.exists():
        old = out_dir.with_name(f".{out_dir.name}.old")
        shutil.rmtree(old, ignore_errors=True)
        out_dir.rename(old)
    new.rename(out_dir)
    if old is not None:
        shutil.rmtree(old)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cp", type=Path, required=True,
                        help="our checkpoint: pre-trained (mlm, clm, electra), fine-tuned, or imported")
    parser.add_argument("-o", "--output", type=Path, required=True, help="directory to write")
    parser.add_argument("--force", action="store_true", help="replace an output directory that is not empty")
    return parser.parse_args(argv)


@exit_on_user_error
def main(argv=None):
    args = parse_args(argv)
    names = export(args.cp, args.output, args.force)
    print(f"wrote {args.output}: {', '.join(names)}")


if __name__ == "__main__":
    main()
