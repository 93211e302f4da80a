"""Export a checkpoint to a Hugging Face transformers directory.

Example:
    python scripts/export_hf.py --cp demo/runs/run0/checkpoints/best.pt -o demo/hf-mlm

Writes config.json, model.safetensors, vocab.txt, tokenizer_config.json and
special_tokens_map.json, so that transformers.BertForMaskedLM (an MLM checkpoint) or
BertForSequenceClassification (a fine-tuned one) and BertTokenizerFast load the directory
with from_pretrained, with no missing or unexpected weights.
"""
import argparse
import json
import os
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))
import checkpoint as checkpoints  # noqa: E402
from atomic import atomic_write  # noqa: E402
from config import CLASSIFICATION_TASKS  # noqa: E402
from errors import UserError, exit_on_user_error  # noqa: E402
from hf_weights import to_hf  # noqa: E402
from model import (INIT_STD, BertForMaskedLM, BertForPreTraining, BertForSequenceClassification,  # noqa: E402
                   ModelConfig)
from vocab import Vocab  # noqa: E402

# An ELECTRA checkpoint exports its discriminator, the encoder that fine-tuning keeps; an imported
# BertModel (task "encoder") goes back as one, with its pooler.
ARCHITECTURES = ({"mlm": "BertForMaskedLM", "electra": "BertModel", "encoder": "BertModel"}
                 | {task: "BertForSequenceClassification" for task in CLASSIFICATION_TASKS})
# Model settings transformers' BERT cannot express, with the value BERT has.
BERT_ONLY = {"norm": "postln", "position": "learned", "feed_forward": "gelu", "pooling": "cls"}


def check_exportable(path: Path, checkpoint: dict):
    if checkpoint["task"] not in ARCHITECTURES:
        raise UserError(f"{path}: a {checkpoint['task']} checkpoint; export takes {', '.join(ARCHITECTURES)}")
    for key, bert_value in BERT_ONLY.items():
        value = checkpoint["model_config"].get(key, bert_value)
        if value != bert_value:
            raise UserError(f"{path}: {key} = {value}: transformers' BERT has only {key} = {bert_value}")


def check_weights(path: Path, checkpoint: dict):
    """The weights fit the checkpoint's architecture and hold the whole encoder: a damaged file is
    named, not exported."""
    config = ModelConfig(**checkpoint["model_config"])
    kind = BertForMaskedLM if checkpoint["task"] == "mlm" else BertForSequenceClassification
    if checkpoint["task"] == "mlm" and config.sentence_classes:
        kind = BertForPreTraining
    with torch.device("meta"):  # shapes only: nothing allocated, nothing initialised
        reference = kind(config)
    checkpoints.check_shapes(path, checkpoint["model"], reference)
    weights = checkpoint["model"]
    missing = [name for name in reference.state_dict() if name.startswith("encoder.") and name not in weights]
    if missing:
        raise UserError(f"{path}: a damaged checkpoint: weights missing: {', '.join(missing[:3])}")


def hf_config(checkpoint: dict) -> dict:
    model = checkpoint["model_config"]
    architecture = "BertForPreTraining" if model.get("sentence_classes") else ARCHITECTURES[checkpoint["task"]]
    config = {"architectures": [architecture], "model_type": "bert",
              "vocab_size": model["vocab_size"], "hidden_size": model["d_model"],
              "num_hidden_layers": model["n_layer"], "num_attention_heads": model["heads"],
              "intermediate_size": model["d_ff"], "hidden_act": "gelu",
              "hidden_dropout_prob": model["dropout"], "attention_probs_dropout_prob": model["dropout"],
              "max_position_embeddings": model["max_len"], "type_vocab_size": model["segments"],
              "layer_norm_eps": model["layer_norm_eps"], "pad_token_id": model["pad_id"],
              "initializer_range": INIT_STD, "position_embedding_type": "absolute"}
    if checkpoint["task"] in CLASSIFICATION_TASKS:
        config["id2label"] = {str(i): f"LABEL_{i}" for i in range(model["num_labels"])}
        config["label2id"] = {f"LABEL_{i}": i for i in range(model["num_labels"])}
    return config


def tokenizer_files(vocab: Vocab, max_len: int) -> dict[str, str]:
    special = {"unk_token": "[UNK]", "sep_token": "[SEP]", "pad_token": "[PAD]", "cls_token": "[CLS]",
               "mask_token": "[MASK]"}
    config = {"tokenizer_class": "BertTokenizer", "do_lower_case": vocab.lowercase,
              "model_max_length": max_len, **special}
    return {"vocab.txt": "\n".join(vocab.tokens) + "\n",
            "tokenizer_config.json": json.dumps(config, indent=2) + "\n",
            "special_tokens_map.json": json.dumps(special, indent=2) + "\n"}


def export(checkpoint_path: Path, out_dir: Path):
    checkpoint = checkpoints.load(checkpoint_path)
    check_weights(checkpoint_path, checkpoint)
    check_exportable(checkpoint_path, checkpoint)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise UserError(f"{out_dir}: cannot create output directory ({error.strerror})") from None
    weights = checkpoint["model"]
    if ARCHITECTURES[checkpoint["task"]] == "BertModel":
        weights = {name: tensor for name, tensor in weights.items() if name.startswith(("encoder.", "pooler."))}
    weights = to_hf(weights)
    atomic_write(out_dir / "model.safetensors", lambda temp: save_file(weights, temp, metadata={"format": "pt"}))
    files = {"config.json": json.dumps(hf_config(checkpoint), indent=2) + "\n",
             **tokenizer_files(Vocab(tuple(checkpoint["vocab"])), checkpoint["model_config"]["max_len"])}
    for name, text in files.items():
        atomic_write(out_dir / name, lambda temp, text=text: temp.write_text(text, encoding="utf-8"))
    return sorted(os.listdir(out_dir))


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cp", type=Path, required=True,
                        help="our checkpoint (mlm, sst2, classify, an imported encoder, or electra: its discriminator)")
    parser.add_argument("-o", "--output", type=Path, required=True, help="directory to write")
    return parser.parse_args(argv)


@exit_on_user_error
def main(argv=None):
    args = parse_args(argv)
    names = export(args.cp, args.output)
    print(f"wrote {args.output}: {', '.join(names)}")


if __name__ == "__main__":
    main()
