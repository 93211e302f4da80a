"""Import: a Hugging Face directory (a transformers BERT, an ELECTRA discriminator, or what
hf_export.py wrote) as a checkpoint of ours, its architecture and task read from config.json and its
weights (scripts/import_hf.py is the command line). The counterpart of hf_export.py."""
import dataclasses
import json
import warnings
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file

import checkpoints
import model as our_models
from architecture import NETWORK_FIELDS, USER_CLASS_TASKS, kind_of, label_names as label_names_of
from atomic import check_output_file
from config import CLASSIFICATION_TASKS, RULES, Config
from errors import UserError
from hardware import check_fits_memory
from model import BertForPreTraining, ModelConfig, estimated_parameters
from vocab import Vocab, load_tokenizer_json, load_vocab, read_json_object, read_small_text
from interop.hf_weights import from_hf

# What each model type must have to be ours: transformers' BERT, ELECTRA's discriminator (the same
# encoder), and the directories export_hf.py writes for the other architectures.
NATIVE_CHECKS = {"hidden_act": "gelu", "position_embedding_type": "absolute"}
MODEL_TYPES = ("bert", "electra", "bert-variant")
# export_hf.py's classes for the other architectures, and the task each holds.
VARIANT_TASKS = {"BertVariantForMaskedLM": "mlm", "BertVariantForPreTraining": "mlm", "BertVariantForCausalLM": "clm",
                 "BertVariantForSequenceClassification": "classify", "BertVariantModel": "encoder",
                 "BertVariantForTokenClassification": "ner", "BertVariantForQuestionAnswering": "squad"}
# The sentence-transformers modules an embedding model of ours holds (hf_export's), by their class's name.
EMBEDDING_MODULES = ("Transformer", "Pooling", "Normalize")
# The Pooling module's flag for each of its modes, in its config.json (a newer one may write pooling_mode).
POOLING_FLAGS = {"cls": "pooling_mode_cls_token", "mean": "pooling_mode_mean_tokens",
                 "max": "pooling_mode_max_tokens", "mean_sqrt_len": "pooling_mode_mean_sqrt_len_tokens",
                 "weightedmean": "pooling_mode_weightedmean_tokens", "lasttoken": "pooling_mode_lasttoken"}
# config.json's key for each ModelConfig field of the shape: transformers' names, or (an export of
# ours) ModelConfig's own.
NATIVE_SHAPE = {"vocab_size": "vocab_size", "max_len": "max_position_embeddings", "d_model": "hidden_size",
                "heads": "num_attention_heads", "n_layer": "num_hidden_layers", "d_ff": "intermediate_size",
                "segments": "type_vocab_size"}
VARIANT_SHAPE = {field: field for field in NATIVE_SHAPE}


def read_config(directory: Path) -> dict:
    path = directory / "config.json"
    config = read_json_object(path, "the model's settings")
    if config.get("model_type") not in MODEL_TYPES:
        raise UserError(f"{path}: model_type is {config.get('model_type')!r}; this program reads "
                        f"{', '.join(MODEL_TYPES)}")
    check_shape(path, config)
    width = config.get("hidden_size")
    if config["model_type"] == "electra" and config.get("embedding_size", width) != width:
        raise UserError(f"{path}: embedding_size {config['embedding_size']} differs from hidden_size {width}; "
                        f"this program's embeddings are as wide as its layers")
    for key, expected in NATIVE_CHECKS.items():
        if config["model_type"] != "bert-variant" and config.get(key, expected) != expected:
            raise UserError(f"{path}: {key} is {config[key]!r}; this program's BERT has {expected!r}")
    if not isinstance(config.get("id2label", {}), dict):
        raise UserError(f"{path}: id2label is a {type(config['id2label']).__name__}; expected an object")
    return config


def shape_keys(config: dict) -> dict[str, str]:
    """config.json's key for each ModelConfig field of the shape."""
    return VARIANT_SHAPE if config["model_type"] == "bert-variant" else NATIVE_SHAPE


def check_shape(path: Path, config: dict):
    """Each size a whole number above 0 (the segment vocabulary may be left out), the heads dividing
    the width: named by key before anything of that size is allocated."""
    keys = shape_keys(config)
    for field, key in keys.items():
        value = config.get(key)
        if value is None and field == "segments":
            continue
        if value is None:
            raise UserError(f"{path}: {key} is missing")
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise UserError(f"{path}: {key} is {value!r}; expected a whole number above 0")
    if config[keys["d_model"]] % config[keys["heads"]]:
        raise UserError(f"{path}: {keys['d_model']} {config[keys['d_model']]} is not divisible by "
                        f"{keys['heads']} {config[keys['heads']]}")


def read_vocab(directory: Path) -> Vocab:
    """vocab.txt, or the WordPiece vocabulary inside tokenizer.json; lower-casing as the directory's
    tokenizer files say."""
    if (directory / "vocab.txt").is_file() or not (directory / "tokenizer.json").is_file():
        return load_vocab(directory)
    return load_tokenizer_json(directory / "tokenizer.json")


def read_weights(directory: Path, shapes_only: bool = False) -> dict[str, torch.Tensor]:
    """The directory's tensors; with shapes_only, of safetensors' shapes on the meta device (nothing
    read but the header: what a graph's metadata needs)."""
    if (directory / "model.safetensors").is_file():
        try:
            if shapes_only:
                with safe_open(directory / "model.safetensors", "pt") as tensors:
                    return {name: torch.empty(tensors.get_slice(name).get_shape(), device="meta")
                            for name in tensors.keys()}
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


def architecture_of(path: Path, config: dict, vocab: Vocab, task: str, weights: dict) -> ModelConfig:
    """The ModelConfig config.json describes; a value ModelConfig refuses is one line naming the file."""
    shape = {field: config[key] for field, key in shape_keys(config).items() if key in config}
    common = {"pad_id": vocab.pad_id, "causal": task == "clm", "num_labels": len(config.get("id2label", {})) or 2,
              "label_names": output_names(config, task),
              "multi_label": config.get("problem_type") == "multi_label_classification"}
    if config["model_type"] == "bert-variant":
        settings = {name: config[name] for name in NETWORK_FIELDS if name in config}
    else:
        settings = {"dropout": config.get("hidden_dropout_prob", 0.1),
                    "layer_norm_eps": config.get("layer_norm_eps", 1e-12),
                    "sentence_classes": 2 if task == "mlm" and "pooler.weight" in weights else 0}
    try:
        return ModelConfig(**settings | shape | common)
    except (TypeError, ValueError) as error:
        raise UserError(f"{path}: {error}") from None


def embedding_settings(directory: Path, max_len: int) -> dict | None:
    """A sentence-transformers directory's pooling (cls or mean) and max_seq_length (within the
    position table's max_len), as ModelConfig and Config name them; None for a plain transformers
    directory (no modules.json)."""
    path = directory / "modules.json"
    if not path.is_file():
        return None
    try:
        modules = json.loads(read_small_text(path, "the sentence-transformers modules"))
        kinds = [module["type"].rsplit(".", 1)[-1] for module in modules]
        pooling_folder = next(module["path"] for module in modules if module["type"].endswith("Pooling"))
    except (ValueError, TypeError, KeyError, AttributeError, StopIteration, RecursionError):
        raise UserError(f"{path}: expected a list of modules with type and path, a Pooling among them") from None
    extra = [kind for kind in kinds if kind not in EMBEDDING_MODULES]
    if extra:
        raise UserError(f"{path}: a {extra[0]} module, which this program's embeddings do not have (they are "
                        f"{', '.join(EMBEDDING_MODULES)})")
    pooling_file = directory / pooling_folder / "config.json"
    pooling = read_json_object(pooling_file, "the pooling settings")
    modes = [pooling["pooling_mode"]] if isinstance(pooling.get("pooling_mode"), str) else [
        mode for mode, flag in POOLING_FLAGS.items() if pooling.get(flag)]
    if modes not in (["cls"], ["mean"]):
        raise UserError(f"{pooling_file}: pooling {' + '.join(modes) or 'none'}; this program pools cls or mean")
    return {"pooling": modes[0], "seq_len": cut_length(directory / "sentence_bert_config.json", max_len)}


def cut_length(path: Path, max_len: int) -> int:
    """The length sentence-transformers cuts texts to (max_seq_length, at most max_len): the run's
    seq-len, so seq-len's rule holds for it, checked here to name the file and its key."""
    length = read_json_object(path, "the sentence-transformers settings").get("max_seq_length") \
        if path.is_file() else None
    if length is None:
        return max_len
    rule = RULES["seq_len"]
    if type(length) is not int or not rule.check(min(length, max_len)):  # `type is`: true is a bool, not a length
        raise UserError(f"{path}: max_seq_length = {json.dumps(length)}: expected an integer {rule.text} "
                        f"(it becomes seq-len)")
    return min(length, max_len)


def label_names(config: dict) -> tuple[str, ...]:
    """id2label's names in the ids' order."""
    labels = config.get("id2label", {})
    try:
        return tuple(str(labels[key]) for key in sorted(labels, key=int))
    except ValueError:
        raise UserError(f"id2label's keys are {sorted(labels)[:3]}; expected the label ids 0, 1, ...") from None


def output_names(config: dict, task: str) -> tuple[str, ...]:
    """What a model's outputs are named: a token classifier's tags; a classify(_pair) model's classes,
    but where they are only their numbers (as such a model without names exports them)."""
    if task == "ner":
        return label_names(config)
    names = label_names(config) if task in USER_CLASS_TASKS else ()
    return () if names == label_names_of(task, len(names)) else names


def check_size(path: Path, config: dict, architecture: ModelConfig, memory_limit: float | None):
    """The weights, held twice while converting, must fit the machine: refused before reading them."""
    keys = [key for field, key in shape_keys(config).items() if field != "heads" and key in config]
    source = f"{path} ({', '.join(f'{key} {config[key]}' for key in keys)})"
    check_fits_memory(estimated_parameters(architecture), copies=2, limit_gib=memory_limit, source=source,
                      flag="--memory-limit-gib")


def task_of(config: dict, weights: dict) -> str:
    """What the directory holds: a classifier (its fine-tuning task, when it is one of ours), a
    causal LM, an MLM model (with a pooler and sentence head: BertForPreTraining, as
    bert-base-uncased is published), or an encoder alone (ELECTRA's discriminator too)."""
    if config.get("replaced_token_detection"):
        task = "encoder"
    elif config["model_type"] == "bert-variant":
        task = VARIANT_TASKS.get((config.get("architectures") or ["BertVariantModel"])[0], "encoder")
    elif "qa_outputs.weight" in weights:
        task = "squad"
    elif (config.get("architectures") or [""])[0] == "BertForTokenClassification":
        task = "ner"
    elif "classifier.weight" in weights:
        task = "classify"
    elif "head.bias" in weights:
        task = "clm" if config.get("is_decoder") else "mlm"
    else:
        task = "encoder"
    if task == "classify":
        return config["finetuning_task"] if config.get("finetuning_task") in CLASSIFICATION_TASKS else "sst2"
    if task == "squad" and config.get("finetuning_task") == "squad_v2":
        return "squad_v2"
    return task


def model_class(task: str, architecture: ModelConfig) -> type:
    """model.py's class that holds a checkpoint's weights (export_hf.py checks them against it too)."""
    if task == "mlm" and architecture.sentence_classes:
        return BertForPreTraining
    return getattr(our_models, kind_of(task).model)


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


def convert(directory: Path, output: Path, memory_limit: float | None = None) -> dict:
    """memory_limit: GiB the model may take (None: this machine's memory)."""
    check_output_file(output, "checkpoint file")
    state, report = read_model(directory, memory_limit)
    checkpoints.save(output, state)
    return report


def read_model(directory: Path, memory_limit: float | None = None, shapes_only: bool = False) -> tuple[dict, dict]:
    """The checkpoint a directory makes (checkpoints.make_state's contents), in memory, and what
    became of its weights: {"task", "unused", "fresh"}. A distillation's teacher is read so, unsaved;
    an ONNX graph's metadata with shapes_only (the weights on the meta device, the file unread)."""
    config_file = directory / "config.json"
    config = read_config(directory)
    vocab = read_vocab(directory)
    if vocab.size != config["vocab_size"]:
        raise UserError(f"{directory}: the vocabulary has {vocab.size} tokens but config.json says "
                        f"{config['vocab_size']}")
    check_size(config_file, config, architecture_of(config_file, config, vocab, "encoder", {}), memory_limit)
    weights, unused = our_weights(config, read_weights(directory, shapes_only))
    task = task_of(config, weights)
    architecture = architecture_of(config_file, config, vocab, task, weights)
    embedding = embedding_settings(directory, architecture.max_len) if task == "encoder" else None
    seq_len = architecture.max_len
    if embedding is not None:  # a sentence-transformers model: its pooling, and the length it cuts texts to
        task, architecture = "embed", dataclasses.replace(architecture, pooling=embedding["pooling"])
        seq_len = embedding["seq_len"]
    with torch.device("meta"):  # names and shapes only: the weights are the file's
        model = model_class(task, architecture)(architecture)
    check_shapes(directory, weights, model)
    missing = [name for name in model.state_dict() if name not in weights]
    unexpected = [name for name in weights if name not in model.state_dict()]
    if any(name.startswith("encoder.") for name in missing + unexpected):
        raise UserError(f"{directory}: weights do not fit a BERT: missing {missing[:3]}, unexpected {unexpected[:3]}")
    kept = {name: tensor for name, tensor in weights.items() if name not in unexpected}  # ELECTRA's detector
    settings = Config(task_type="mlm" if task == "encoder" else task, seq_len=seq_len,
                      d_model=architecture.d_model, heads=architecture.heads,
                      n_layer=architecture.n_layer, d_ff=architecture.d_ff,
                      num_labels=max(2, architecture.num_labels),  # STS-B's one output is the task's own
                      dropout=architecture.dropout,
                      norm=architecture.norm, position=architecture.position,
                      feed_forward=architecture.feed_forward, pooling=architecture.pooling,
                      sentence_objective="nsp" if architecture.sentence_classes else "none")
    state = checkpoints.make_state(task=task, weights=kept, model_config=architecture, vocab=vocab,
                                   config=settings.to_dict(), imported_from=str(directory))
    fresh = [name for name in missing if not name.startswith("encoder.")]
    return state, {"task": task, "unused": unused + unexpected, "fresh": fresh}
