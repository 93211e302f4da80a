"""Turn a Hugging Face directory into a checkpoint of ours, to fine-tune or pre-train on.

Example:
    python scripts/import_hf.py -i bert-base-uncased/ -o wiki/bert-base.pt
    python src/main.py --cp wiki/bert-base.pt          # with task-type = sst2: fine-tune it

Reads config.json, the vocabulary (vocab.txt, or tokenizer.json alone) and model.safetensors (or
pytorch_model.bin, loaded safely) of a transformers BERT (BertModel, BertForMaskedLM,
BertForPreTraining, BertLMHeadModel, BertForSequenceClassification), an ELECTRA discriminator, or
any directory scripts/export_hf.py wrote. Heads the directory lacks start fresh when training
begins, and the log says so.
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
from config import CLASSIFICATION_TASKS, Config  # noqa: E402
from errors import UserError, exit_on_user_error  # noqa: E402
from hf_export import VARIANT_FIELDS  # noqa: E402
from hf_weights import from_hf  # noqa: E402
from model import (BertForCausalLM, BertForMaskedLM, BertForPreTraining, BertForSequenceClassification,  # noqa: E402
                   ModelConfig)
from vocab import SPECIAL_TOKENS, Vocab, load_vocab  # noqa: E402

# What each model type must have to be ours: transformers' BERT, ELECTRA's discriminator (the same
# encoder), and the directories export_hf.py writes for the other architectures.
NATIVE_CHECKS = {"hidden_act": "gelu", "position_embedding_type": "absolute"}
MODEL_TYPES = ("bert", "electra", "bert-variant")
# export_hf.py's classes for the other architectures, and the task each holds.
VARIANT_TASKS = {"BertVariantForMaskedLM": "mlm", "BertVariantForPreTraining": "mlm", "BertVariantForCausalLM": "clm",
                 "BertVariantForSequenceClassification": "classify", "BertVariantModel": "encoder"}
MODEL_CLASSES = {"mlm": BertForMaskedLM, "clm": BertForCausalLM, "encoder": BertForSequenceClassification}


def read_config(directory: Path) -> dict:
    path = directory / "config.json"
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise UserError(f"{path}: cannot read ({error.__class__.__name__})") from None
    if config.get("model_type") not in MODEL_TYPES:
        raise UserError(f"{path}: model_type is {config.get('model_type')!r}; this program reads "
                        f"{', '.join(MODEL_TYPES)}")
    if config["model_type"] == "electra" and config.get("embedding_size", config.get("hidden_size")) != config.get(
            "hidden_size"):
        raise UserError(f"{path}: embedding_size {config['embedding_size']} differs from hidden_size "
                        f"{config['hidden_size']}; this program's embeddings are as wide as its layers")
    for key, expected in NATIVE_CHECKS.items():
        if config["model_type"] != "bert-variant" and config.get(key, expected) != expected:
            raise UserError(f"{path}: {key} is {config[key]!r}; this program's BERT has {expected!r}")
    return config


def read_vocab(directory: Path) -> Vocab:
    """vocab.txt, or the WordPiece vocabulary inside tokenizer.json."""
    if (directory / "vocab.txt").is_file() or not (directory / "tokenizer.json").is_file():
        return load_vocab(directory)
    path = directory / "tokenizer.json"
    try:
        model = json.loads(path.read_text(encoding="utf-8"))["model"]
        tokens = tuple(sorted(model["vocab"], key=model["vocab"].get))
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise UserError(f"{path}: cannot read a WordPiece vocabulary ({error.__class__.__name__})") from None
    if model.get("type") != "WordPiece" or any(token not in tokens for token in SPECIAL_TOKENS):
        raise UserError(f"{path}: not a BERT WordPiece tokenizer (model type {model.get('type')!r})")
    return Vocab(tokens=tokens, path=path)


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


def native_architecture(config: dict, vocab: Vocab, task: str, weights: dict) -> ModelConfig:
    return ModelConfig(vocab_size=config["vocab_size"], max_len=config["max_position_embeddings"],
                       d_model=config["hidden_size"], heads=config["num_attention_heads"],
                       n_layer=config["num_hidden_layers"], d_ff=config["intermediate_size"],
                       dropout=config.get("hidden_dropout_prob", 0.1), segments=config.get("type_vocab_size", 2),
                       pad_id=vocab.pad_id, num_labels=len(config.get("id2label", {})) or 2,
                       layer_norm_eps=config.get("layer_norm_eps", 1e-12), causal=task == "clm",
                       sentence_classes=2 if task == "mlm" and "pooler.weight" in weights else 0)


def variant_architecture(config: dict, vocab: Vocab, task: str) -> ModelConfig:
    saved = {name: config[name] for name in VARIANT_FIELDS if name in config}
    return ModelConfig(**saved | {"pad_id": vocab.pad_id, "causal": task == "clm",
                                  "num_labels": len(config.get("id2label", {})) or 2})


def task_of(config: dict, weights: dict) -> str:
    """What the directory holds: a classifier (its fine-tuning task, when it is one of ours), a
    causal LM, an MLM model (with a pooler and sentence head: BertForPreTraining, as
    bert-base-uncased is published), or an encoder alone (ELECTRA's discriminator too)."""
    if config.get("replaced_token_detection"):
        task = "encoder"
    elif config["model_type"] == "bert-variant":
        task = VARIANT_TASKS.get((config.get("architectures") or ["BertVariantModel"])[0], "encoder")
    elif "classifier.weight" in weights:
        task = "classify"
    elif "head.bias" in weights:
        task = "clm" if config.get("is_decoder") else "mlm"
    else:
        task = "encoder"
    if task == "classify":
        return config["finetuning_task"] if config.get("finetuning_task") in CLASSIFICATION_TASKS else "sst2"
    return task


def model_class(task: str, architecture: ModelConfig) -> type:
    if task == "mlm" and architecture.sentence_classes:
        return BertForPreTraining
    return MODEL_CLASSES.get(task, BertForSequenceClassification)


def check_shapes(directory: Path, weights: dict, model) -> None:
    """config.json must describe the weights (hidden_size 128 over 64-wide weights does not)."""
    own = model.state_dict()
    for name, tensor in weights.items():
        if name in own and own[name].shape != tensor.shape:
            raise UserError(f"{directory / 'config.json'}: does not fit the weights: {name} has shape "
                            f"{list(tensor.shape)} in them, {list(own[name].shape)} by config.json")


def our_weights(config: dict, weights: dict) -> tuple[dict, list[str]]:
    """The weights under our names, and those we have no use for."""
    if config["model_type"] != "bert-variant":
        return from_hf(weights)
    if "head.bias" in weights:
        weights["head.token_embedding.weight"] = weights["encoder.embeddings.token.weight"]
    return weights, []


def convert(directory: Path, output: Path) -> dict:
    config = read_config(directory)
    vocab = read_vocab(directory)
    if vocab.size != config["vocab_size"]:
        raise UserError(f"{directory}: the vocabulary has {vocab.size} tokens but config.json says "
                        f"{config['vocab_size']}")
    weights, unused = our_weights(config, read_weights(directory))
    task = task_of(config, weights)
    if config["model_type"] == "bert-variant":
        architecture = variant_architecture(config, vocab, task)
    else:
        architecture = native_architecture(config, vocab, task, weights)
    model = model_class(task, architecture)(architecture)
    check_shapes(directory, weights, model)
    missing, unexpected = model.load_state_dict(weights, strict=False)
    if any(name.startswith("encoder.") for name in missing + unexpected):
        raise UserError(f"{directory}: weights do not fit a BERT: missing {missing[:3]}, unexpected {unexpected[:3]}")
    kept = {name: tensor for name, tensor in weights.items() if name not in unexpected}  # ELECTRA's detector
    settings = Config(task_type="mlm" if task == "encoder" else task, seq_len=architecture.max_len,
                      d_model=architecture.d_model, heads=architecture.heads,
                      n_layer=architecture.n_layer, d_ff=architecture.d_ff,
                      num_labels=architecture.num_labels, dropout=architecture.dropout,
                      norm=architecture.norm, position=architecture.position,
                      feed_forward=architecture.feed_forward, pooling=architecture.pooling,
                      sentence_objective="nsp" if architecture.sentence_classes else "none")
    checkpoints.save(output, checkpoints.make_state(task=task, weights=kept, model_config=architecture, vocab=vocab,
                                                    config=settings.to_dict(), imported_from=str(directory)))
    fresh = [name for name in missing if not name.startswith("encoder.")]
    return {"task": task, "unused": unused + unexpected, "fresh": fresh}


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
