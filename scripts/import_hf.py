"""Turn a Hugging Face BERT directory into a checkpoint of ours, to fine-tune or pre-train on.

Example:
    python scripts/import_hf.py -i bert-base-uncased/ -o wiki/bert-base.pt
    python src/main.py --cp wiki/bert-base.pt          # with task-type = sst2: fine-tune it

Reads config.json, vocab.txt and model.safetensors (or pytorch_model.bin, loaded safely) of
a BertModel, BertForMaskedLM or BertForSequenceClassification. Heads the directory lacks
start fresh when training begins, and the log says so.
"""
import argparse
import json
import sys
import warnings
from pathlib import Path

import torch
from safetensors.torch import load_file

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))
import checkpoint as checkpoints  # noqa: E402
from config import Config  # noqa: E402
from errors import UserError, exit_on_user_error  # noqa: E402
from hf_weights import from_hf  # noqa: E402
from model import BertForMaskedLM, BertForPreTraining, BertForSequenceClassification, ModelConfig  # noqa: E402
from vocab import load_vocab  # noqa: E402


def read_config(directory: Path) -> dict:
    path = directory / "config.json"
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise UserError(f"{path}: cannot read ({error.__class__.__name__})") from None
    checks = {"model_type": "bert", "hidden_act": "gelu", "position_embedding_type": "absolute"}
    for key, expected in checks.items():
        if config.get(key, expected) != expected:
            raise UserError(f"{path}: {key} is {config[key]!r}; this program's BERT has {expected!r}")
    return config


def read_weights(directory: Path) -> dict[str, torch.Tensor]:
    if (directory / "model.safetensors").is_file():
        try:
            return load_file(directory / "model.safetensors")
        except Exception as error:  # safetensors raises its own kind for a truncated or damaged file
            raise UserError(f"{directory / 'model.safetensors'}: not readable ({error})") from None
    if (directory / "pytorch_model.bin").is_file():
        try:
            with warnings.catch_warnings():  # torch warns about a refused pickle too: the error line says it
                warnings.simplefilter("ignore")
                return torch.load(directory / "pytorch_model.bin", map_location="cpu", weights_only=True)
        except Exception as error:  # torch raises many kinds for a bad file
            raise UserError(f"{directory / 'pytorch_model.bin'}: not readable ({error.__class__.__name__})") from None
    raise UserError(f"{directory}: no model.safetensors or pytorch_model.bin")


def model_config(config: dict, vocab, sentence_classes: int) -> ModelConfig:
    return ModelConfig(vocab_size=config["vocab_size"], max_len=config["max_position_embeddings"],
                       d_model=config["hidden_size"], heads=config["num_attention_heads"],
                       n_layer=config["num_hidden_layers"], d_ff=config["intermediate_size"],
                       dropout=config.get("hidden_dropout_prob", 0.1), segments=config.get("type_vocab_size", 2),
                       pad_id=vocab.pad_id, num_labels=len(config.get("id2label", {})) or 2,
                       layer_norm_eps=config.get("layer_norm_eps", 1e-12), sentence_classes=sentence_classes)


def task_of(weights: dict) -> tuple[str, type]:
    """What the directory holds: a classifier, an MLM model with a pooler (BertForPreTraining,
    as bert-base-uncased is published), an MLM model, or an encoder alone."""
    if "classifier.weight" in weights:
        return "sst2", BertForSequenceClassification
    if "head.bias" in weights and "pooler.weight" in weights:
        return "mlm", BertForPreTraining
    if "head.bias" in weights:
        return "mlm", BertForMaskedLM
    return "encoder", BertForSequenceClassification  # has a pooler slot too; any head starts fresh


def check_shapes(directory: Path, weights: dict, model) -> None:
    """config.json must describe the weights (hidden_size 128 over 64-wide weights does not)."""
    own = model.state_dict()
    for name, tensor in weights.items():
        if name in own and own[name].shape != tensor.shape:
            raise UserError(f"{directory / 'config.json'}: does not fit the weights: {name} has shape "
                            f"{list(tensor.shape)} in them, {list(own[name].shape)} by config.json")


def convert(directory: Path, output: Path) -> dict:
    config = read_config(directory)
    vocab = load_vocab(directory)
    if vocab.size != config["vocab_size"]:
        raise UserError(f"{directory}: vocab.txt has {vocab.size} tokens but config.json says {config['vocab_size']}")
    weights, unused = from_hf(read_weights(directory))
    task, model_class = task_of(weights)
    architecture = model_config(config, vocab, sentence_classes=2 if model_class is BertForPreTraining else 0)
    model = model_class(architecture)
    check_shapes(directory, weights, model)
    missing, unexpected = model.load_state_dict(weights, strict=False)
    if any(name.startswith("encoder.") for name in missing) or unexpected:
        raise UserError(f"{directory}: weights do not fit a BERT: missing {missing[:3]}, unexpected {unexpected[:3]}")
    settings = Config(task_type="mlm" if task == "encoder" else task, seq_len=architecture.max_len,
                      d_model=architecture.d_model, heads=architecture.heads,
                      n_layer=architecture.n_layer, d_ff=architecture.d_ff,
                      num_labels=architecture.num_labels, dropout=architecture.dropout,
                      norm=architecture.norm, position=architecture.position,
                      feed_forward=architecture.feed_forward,
                      sentence_objective="nsp" if architecture.sentence_classes else "none")
    checkpoints.save(output, checkpoints.make_state(task=task, weights=weights, model_config=architecture, vocab=vocab,
                                                    config=settings.to_dict(), imported_from=str(directory)))
    return {"task": task, "unused": unused, "fresh": [name for name in missing if not name.startswith("encoder.")]}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-i", "--input", type=Path, required=True, help="a transformers BERT directory")
    parser.add_argument("-o", "--output", type=Path, required=True, help="the checkpoint file to write")
    return parser.parse_args(argv)


@exit_on_user_error
def main(argv=None):
    args = parse_args(argv)
    if not args.input.is_dir():
        raise UserError(f"{args.input}: not a directory")
    result = convert(args.input, args.output)
    print(f"wrote {args.output}: a {result['task']} checkpoint")
    if result["fresh"]:
        print(f"  not in {args.input} (start fresh when training): {', '.join(result['fresh'])}")
    if result["unused"]:
        print(f"  not used: {', '.join(result['unused'])}")


if __name__ == "__main__":
    main()
