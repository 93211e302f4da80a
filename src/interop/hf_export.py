"""A checkpoint as a Hugging Face transformers directory, for every architecture and task.

BERT's own architecture (post-LN, learned positions, GELU, [CLS] pooling) becomes transformers'
native classes (BertForMaskedLM, BertForSequenceClassification, ...; ELECTRA's discriminator
ElectraForPreTraining). Any other becomes a model whose code travels in the directory, loaded with
trust_remote_code=True: etc/hf/'s two files adapt inputs and outputs to src/model.py, with its
siblings architecture.py and cpu_kernels.py, copied as they are, so the exported model cannot drift
from ours.
"""
import json
import re
from pathlib import Path

import torch

import checkpoints
from architecture import NETWORK_FIELDS, TASK_KINDS, kind_of, label_names
from config import CLASSIFICATION_TASKS, FINE_TUNING_TASKS
from errors import UserError
from model import INIT_STD
from vocab import SPECIAL_TOKEN_NAMES, Vocab, tokenizer_config
from interop.hf_weights import to_hf

SOURCE = Path(__file__).resolve().parent.parent  # src/, the core whose model files an export copies
TEMPLATES = SOURCE.parent / "etc" / "hf"
ADAPTERS = ("configuration_bert_variant.py", "modeling_bert_variant.py")
# The program's model code, copied as it is: model.py imports torch and its siblings architecture.py
# and cpu_kernels.py alone.
MODEL_FILES = ("model.py", "architecture.py", "cpu_kernels.py")
# An embedding model's sentence-transformers modules: the directory's encoder, its pooling, the
# scaling to length 1 (which has no settings, so no folder).
SENTENCE_TRANSFORMERS_MODULES = (("", "Transformer"), ("1_Pooling", "Pooling"), ("2_Normalize", "Normalize"))
# Every file an export writes (bert_variant_layers.py: an earlier export's model code), and the folders
# with theirs: --force replaces a directory that holds these alone.
EXPORT_FILES = ("config.json", "model.safetensors", "README.md", "vocab.txt", "tokenizer.json",
                "tokenizer_config.json", "special_tokens_map.json", *ADAPTERS, *MODEL_FILES, "bert_variant_layers.py",
                "modules.json", "sentence_bert_config.json", "config_sentence_transformers.json")
EXPORT_FOLDERS = {"1_Pooling": ("config.json",), "onnx": ("model.onnx", "model_qint8.onnx", "quantization.json")}
# The model card's own words, which tell an earlier export from a model downloaded with the same file names.
CARD_MARK = "Exported by the BERT-from-scratch program's `scripts/export_hf.py`"
# Settings transformers' BERT expresses, with BERT's value; pooling only matters to classifiers.
BERT_ARCHITECTURE = {"norm": "postln", "position": "learned", "feed_forward": "gelu"}
# Weights a transformers directory never holds: ELECTRA's generator, which fine-tuning drops.
GENERATOR = ("generator.", "generator_input.", "generator_head.")

# The tasks a directory holds (a distilled student as an encoder: as_exported).
EXPORTED_TASKS = tuple(task for task in (*TASK_KINDS, "encoder") if task != "distill")
# The Auto class each exported class answers to.
AUTO_CLASSES = {"BertVariantModel": "AutoModel", "BertVariantForMaskedLM": "AutoModelForMaskedLM",
                "BertVariantForPreTraining": "AutoModelForPreTraining",
                "BertVariantForCausalLM": "AutoModelForCausalLM",
                "BertVariantForSequenceClassification": "AutoModelForSequenceClassification",
                "BertVariantForTokenClassification": "AutoModelForTokenClassification",
                "BertVariantForQuestionAnswering": "AutoModelForQuestionAnswering"}
# Where transformers' own classes fit, for the model card's load line.
AUTO_NAMES = {"BertForMaskedLM": "AutoModelForMaskedLM", "BertForPreTraining": "AutoModelForPreTraining",
              "BertLMHeadModel": "AutoModelForCausalLM", "ElectraForPreTraining": "AutoModelForPreTraining",
              "BertModel": "AutoModel", "BertForSequenceClassification": "AutoModelForSequenceClassification",
              "BertForTokenClassification": "AutoModelForTokenClassification",
              "BertForQuestionAnswering": "AutoModelForQuestionAnswering"} | AUTO_CLASSES


TAGS = {"mlm": "tags: [bert, fill-mask]", "embed": "tags: [bert, sentence-transformers, sentence-similarity]"}


def is_native(checkpoint: dict) -> bool:
    """Whether transformers' own BERT (or ELECTRA) classes hold the model exactly."""
    saved = checkpoint["model_config"]
    bert = all(saved.get(key, value) == value for key, value in BERT_ARCHITECTURE.items())
    return bert and (checkpoint["task"] not in CLASSIFICATION_TASKS or saved.get("pooling", "cls") == "cls")


def architecture(checkpoint: dict) -> str:
    """The transformers class the directory holds."""
    task, saved = checkpoint["task"], checkpoint["model_config"]
    if task == "mlm" and saved.get("sentence_classes"):
        return "BertForPreTraining" if is_native(checkpoint) else "BertVariantForPreTraining"
    kind = kind_of(task)
    return kind.native if is_native(checkpoint) else kind.variant


def as_exported(checkpoint: dict) -> dict:
    """The checkpoint as its directory holds it: a distilled student (distill_task.py) is an encoder alone."""
    return checkpoint | {"task": "encoder"} if checkpoint["task"] == "distill" else checkpoint


def check_exportable(path: Path, checkpoint: dict):
    if checkpoint["task"] not in EXPORTED_TASKS:
        raise UserError(f"{path}: a {checkpoint['task']} checkpoint has no transformers counterpart; "
                        f"export takes {', '.join(EXPORTED_TASKS)}")


def exported_weights(checkpoint: dict) -> dict:
    """The weights under the directory's names: transformers' for native classes, ours otherwise
    (the tied decoder and ELECTRA's generator left out)."""
    weights = {name: tensor for name, tensor in checkpoint["model"].items()
               if not name.startswith(GENERATOR) and name != "head.token_embedding.weight"}
    if not is_native(checkpoint):
        return {name: tensor.contiguous() for name, tensor in weights.items()}
    if checkpoint["task"] in ("encoder", "embed"):
        weights = {name: tensor for name, tensor in weights.items() if name.startswith(("encoder.", "pooler."))}
    if checkpoint["task"] == "embed":
        weights |= identity_pooler(checkpoint["model_config"]["d_model"])
    theirs = to_hf(weights)
    if checkpoint["task"] == "electra":
        return {re.sub(r"^bert\.", "electra.", name): tensor for name, tensor in theirs.items()}
    return theirs


def identity_pooler(width: int) -> dict:
    """BertModel's pooler as the identity (its output tanh of [CLS]'s state) for an embedding model,
    which has none: sentence-transformers pools the tokens and never reads it, but every loader (its
    ONNX backend too, which takes no add_pooling_layer) then finds all of BertModel's weights."""
    return {"pooler.weight": torch.eye(width), "pooler.bias": torch.zeros(width)}


# ----------------------------------------------------------------------------------------- config.json

def hf_config(checkpoint: dict) -> dict:
    config = native_config(checkpoint) if is_native(checkpoint) else variant_config(checkpoint)
    config["architectures"] = [architecture(checkpoint)]
    if checkpoint["task"] in FINE_TUNING_TASKS:
        config["finetuning_task"] = checkpoint["task"]
    if checkpoint["task"] in CLASSIFICATION_TASKS or checkpoint["model_config"]["label_names"]:
        saved = checkpoint["model_config"]
        names = label_names(checkpoint["task"], saved["num_labels"], saved["label_names"])
        config["id2label"] = {str(index): name for index, name in enumerate(names)}
        config["label2id"] = {name: index for index, name in enumerate(names)}
        if len(names) == 1:
            config["problem_type"] = "regression"
        if saved["multi_label"]:
            config["problem_type"] = "multi_label_classification"  # the pipeline's sigmoid a class
    return config


def native_config(checkpoint: dict) -> dict:
    saved = checkpoint["model_config"]
    config = {"model_type": "bert", "vocab_size": saved["vocab_size"], "hidden_size": saved["d_model"],
              "num_hidden_layers": saved["n_layer"], "num_attention_heads": saved["heads"],
              "intermediate_size": saved["d_ff"], "hidden_act": "gelu",
              "hidden_dropout_prob": saved["dropout"], "attention_probs_dropout_prob": saved["dropout"],
              "max_position_embeddings": saved["max_len"], "type_vocab_size": saved["segments"],
              "layer_norm_eps": saved["layer_norm_eps"], "pad_token_id": saved["pad_id"],
              "initializer_range": INIT_STD, "position_embedding_type": "absolute"}
    if checkpoint["task"] == "clm":
        config["is_decoder"] = True
    if checkpoint["task"] == "electra":
        config |= {"model_type": "electra", "embedding_size": saved["d_model"]}
    return config


def variant_config(checkpoint: dict) -> dict:
    saved = checkpoint["model_config"]
    auto_map = {"AutoConfig": "configuration_bert_variant.BertVariantConfig"}
    classes = {architecture(checkpoint), "BertVariantModel", "BertVariantForSequenceClassification"}
    if checkpoint["task"] == "mlm":
        classes.add("BertVariantForMaskedLM")
    for name in sorted(classes):
        auto_map[AUTO_CLASSES[name]] = f"modeling_bert_variant.{name}"
    return {"model_type": "bert-variant", "auto_map": auto_map, "pad_token_id": saved["pad_id"],
            "initializer_range": INIT_STD, "replaced_token_detection": checkpoint["task"] == "electra",
            **{field: saved[field] for field in NETWORK_FIELDS if field in saved}}


# ----------------------------------------------------------------------------------------- code files

def code_files() -> dict[str, str]:
    """The remote code: etc/hf's adapters, and src/'s MODEL_FILES as they are."""
    return {name: (TEMPLATES / name).read_text(encoding="utf-8") for name in ADAPTERS} | {
        name: (SOURCE / name).read_text(encoding="utf-8") for name in MODEL_FILES}


def sentence_transformers_files(checkpoint: dict) -> dict[str, str]:
    """What makes an embedding model's directory one that sentence_transformers.SentenceTransformer
    loads as it is: the modules and the pooling the model was trained with."""
    saved = checkpoint["model_config"]
    modules = [{"idx": number, "name": str(number), "path": path, "type": f"sentence_transformers.models.{kind}"}
               for number, (path, kind) in enumerate(SENTENCE_TRANSFORMERS_MODULES)]
    pooling = {"word_embedding_dimension": saved["d_model"], "pooling_mode_cls_token": saved["pooling"] == "cls",
               "pooling_mode_mean_tokens": saved["pooling"] == "mean", "pooling_mode_max_tokens": False,
               "pooling_mode_mean_sqrt_len_tokens": False}
    settings = {"max_seq_length": saved["max_len"], "do_lower_case": False}
    as_json = lambda value: json.dumps(value, indent=2) + "\n"  # noqa: E731
    return {"modules.json": as_json(modules), "1_Pooling/config.json": as_json(pooling),
            "sentence_bert_config.json": as_json(settings),
            "config_sentence_transformers.json": as_json({"similarity_fn_name": "cosine"})}


# ----------------------------------------------------------------------------------------- tokenizer, card

def tokenizer_files(vocab: Vocab, max_len: int) -> dict[str, str]:
    """vocab.txt and tokenizer.json (BERT's [CLS] a [SEP] b [SEP], segment ids 0 and 1), so that
    AutoTokenizer gives the fast tokenizer the program itself uses."""
    return {"vocab.txt": "\n".join(vocab.tokens) + "\n",
            "tokenizer.json": vocab.pair_tokenizer().to_str(pretty=True) + "\n",
            "tokenizer_config.json": json.dumps(tokenizer_config(vocab.lowercase, max_len), indent=2) + "\n",
            "special_tokens_map.json": json.dumps(SPECIAL_TOKEN_NAMES, indent=2) + "\n"}


def not_an_export(directory: Path) -> str | None:
    """Why a directory is not an earlier export, which --force may replace, or None: what it holds
    beside an export's files, or a README.md that is not our model card."""
    foreign = sorted(entry.name for entry in directory.iterdir() if not is_exported(entry))
    if foreign:
        return f"holds {foreign[0]}, which no export writes"
    card = directory / "README.md"
    if not card.is_file():
        return "has no README.md, the model card every export writes"
    with card.open("rb") as file:
        opening = file.read(4096)  # the mark is in the card's first lines
    return None if CARD_MARK.encode() in opening else "has a README.md that is not an export's model card"


def is_exported(entry: Path) -> bool:
    """A file an export writes, or one of its folders holding nothing else."""
    if entry.is_symlink():
        return False
    if entry.is_dir():
        return entry.name in EXPORT_FOLDERS and all(
            inner.name in EXPORT_FOLDERS[entry.name] and inner.is_file() and not inner.is_symlink()
            for inner in entry.iterdir())
    return entry.name in EXPORT_FILES and entry.is_file()


def model_card(checkpoint: dict, checkpoint_path: Path) -> str:
    """README.md: the architecture, the training behind the weights, and how to load them."""
    saved, task, name = checkpoint["model_config"], checkpoint["task"], architecture(checkpoint)
    remote = "" if is_native(checkpoint) else ", trust_remote_code=True"
    auto = AUTO_NAMES.get(name, "AutoModel")
    lines = ["---", "library_name: transformers", TAGS.get(task, "tags: [bert]"), "---",
             f"# {name}", "", f"{CARD_MARK} from `{checkpoint_path.name}`.", "", "## Architecture", "",
             f"{saved['n_layer']} layers, width {saved['d_model']}, {saved['heads']} heads, feed-forward "
             f"{saved['d_ff']} ({saved.get('feed_forward', 'gelu')}), norm {saved.get('norm', 'postln')}, "
             f"positions {saved.get('position', 'learned')} (up to {saved['max_len']} tokens), "
             f"vocabulary {saved['vocab_size']} WordPiece tokens.",
             "" if is_native(checkpoint) else "\nNot BERT's own layout, so the model's code travels in this "
             "directory (`model.py`, `architecture.py` and `cpu_kernels.py` are the program's own, as they are).",
             "", "## Training", ""]
    lines += [f"- {stage_line(stage)}" for stage in checkpoints.lineage(checkpoint)]
    if task in FINE_TUNING_TASKS and checkpoint["best"] is not None:
        metric = checkpoints.saved_settings(checkpoint).get("best_metric") or "score"
        lines += ["", f"Best validation {metric} on {task}: {checkpoint['best']:.4f}."]
    lines += ["", "## Load", "", "```python", f"from transformers import AutoTokenizer, {auto}",
              "tokenizer = AutoTokenizer.from_pretrained(DIRECTORY)",
              f"model = {auto}.from_pretrained(DIRECTORY{remote})", "```", ""]
    if task == "embed":
        lines += ["BertModel's pooler is the identity (tanh of [CLS]'s state): the embedding model has none, and "
                  "sentence-transformers does not use it.", ""] if is_native(checkpoint) else []
        lines += [f"Sentence embeddings ({saved['pooling']} pooling, length 1: compare them by cosine):", "",
                  "```python", "from sentence_transformers import SentenceTransformer",
                  f"model = SentenceTransformer(DIRECTORY{remote})",
                  "embeddings = model.encode([\"a sentence\", \"another\"])", "```", ""]
    return "\n".join(lines)


def stage_line(stage: dict) -> str:
    if stage["imported_from"]:
        return f"imported from {stage['imported_from']}"
    data = f" on `{stage['data']}`" if stage["data"] else ""
    return f"{stage['task']}: {stage['step']:,} steps, {stage['tokens']:,} tokens{data}"
