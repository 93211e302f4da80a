"""The checkpoint format in one place: what a checkpoint holds, writing it (atomically) and
reading it (tensors and plain types only), whether it fits a model, and rotation.

A checkpoint is a dict saved with torch.save. Its "optimizer" is None for a starting point
(hf_import.py's output) rather than a run to resume.
"""
import hashlib
import os
import re
import shutil
import warnings
import dataclasses
from dataclasses import asdict, fields
from pathlib import Path

import torch
from torch import nn

from architecture import ROPE_THETA, ModelConfig
from atomic import atomic_write
from config import FIELD_TYPES, GRAMMAR_KEYS, Config, typed_value
from errors import UserError, full_path, shown_path
from vocab import Vocab

FORMAT = 1
SHOWN_CHECKPOINTS = 3  # the newest that an error line for a missing checkpoint names
MODEL_FIELDS = tuple(field.name for field in fields(ModelConfig))
# ModelConfig fields as users know them: INI keys, or what sets them.
MODEL_FIELD_NAMES = {"max_len": "position table size", "vocab_size": "vocabulary size", "pad_id": "[PAD] id",
                     "layer_norm_eps": "layer-norm epsilon", "segments": "segment vocabulary size"}
# What every checkpoint holds (make_state writes each, imported ones included), of the type a run
# reads back: a checkpoint edited by hand is refused in one line, not with a traceback halfway
# through the start.
NONE = type(None)
KEY_TYPES = {"task": str, "step": int, "tokens": int, "model": dict, "optimizer": (dict, NONE),
             "model_config": dict, "vocab_checksum": str, "vocab": list, "vocab_lowercase": bool, "config": dict,
             "data_position": (dict, NONE), "rng_per_rank": list, "best": (float, int, NONE),
             "elapsed": (float, int), "data": (str, dict, NONE), "start": (str, NONE), "lineage": list,
             "imported_from": (str, NONE), "log_sums_per_rank": list, "decay_branch": bool, "autocast": (str, NONE),
             "checksum": str}
# Free to differ between a checkpoint and the run starting from it: pre-training heads come and go.
FREE_MODEL_FIELDS = ("dropout", "num_labels", "causal", "sentence_classes", "generator_heads", "label_names")
# Free to differ in a new run from a checkpoint's weights, not in a resumed or scored one: a
# longer-context phase lengthens the position table and raises RoPE's base; a multi-label head
# starts fresh on a single-label one's encoder, but a model is scored as the kind it is.
PHASE_MODEL_FIELDS = ("max_len", "rope_theta", "multi_label")
# ModelConfig fields younger than the format, with the value a checkpoint without one was trained with.
ADDED_MODEL_FIELDS = {"rope_theta": ROPE_THETA, "label_names": (), "multi_label": False}
# Entries younger than the format, with the value a checkpoint without one means.
ADDED_KEYS = {"decay_branch": False, "autocast": None}


def make_state(*, task: str, weights: dict, model_config: ModelConfig, vocab: Vocab, config: dict, step: int = 0,
               tokens: int = 0, optimizer: dict | None = None, data_position: dict | None = None,
               rng_per_rank: list | None = None, best: float | None = None, elapsed: float = 0.0,
               data: str | dict | None = None, start: str | None = None, lineage: list | None = None,
               imported_from: str | None = None, log_sums_per_rank: list | None = None,
               decay_branch: bool = False, autocast: str | None = None) -> dict:
    """Everything a checkpoint holds: the model's weights (state dict) and architecture, the run's
    settings (Config.to_dict()); to resume, the optimizer, data position, one dict of random states
    and of the log's sums per rank, and the seconds of training so far (what a time budget counts);
    its history: the data it trained on (a text: the shards' pattern; or the sha256 of each of the
    user's files by key and path, task.files_record, which a resume checks), the checkpoint it started
    from and that one's lineage, or the directory it was imported from; decay_branch: the run is
    --decay-from's, its lr-scheduler computed when it branched (a resume reads it from here); autocast:
    the dtype the run's steps ran in (a resume under dtype = auto keeps it)."""
    return {"format": FORMAT, "task": task, "step": step, "tokens": tokens, "model": weights,
            "optimizer": optimizer, "config": config, "model_config": asdict(model_config),
            "vocab_checksum": vocab.checksum, "vocab": list(vocab.tokens), "vocab_lowercase": vocab.lowercase,
            "data_position": data_position, "rng_per_rank": rng_per_rank or [], "best": best, "elapsed": elapsed,
            "data": data, "start": start, "lineage": lineage or [], "imported_from": imported_from,
            "log_sums_per_rank": log_sums_per_rank or [], "decay_branch": decay_branch, "autocast": autocast}


def stage(checkpoint: dict) -> dict:
    """One stage of training in a model's history: its task, steps, tokens and data (as text)."""
    return {"task": checkpoint["task"], "step": checkpoint["step"], "tokens": checkpoint["tokens"],
            "data": data_text(checkpoint["data"]), "imported_from": checkpoint["imported_from"]}


def data_text(data: str | dict | None) -> str | None:
    """A checkpoint's data as a model's history names it: a text as it is; the record of the user's
    files as each one's key and path (train-file train.csv, validation-file dev.csv)."""
    if not isinstance(data, dict):
        return data
    return ", ".join(f"{key} {name}" for key, files in data.items() for name in files)


def lineage(checkpoint: dict) -> list[dict]:
    """Every stage of training behind a checkpoint's weights, the first first: a run started from
    another checkpoint's weights keeps that checkpoint's lineage (checkpoint "lineage")."""
    return [*checkpoint["lineage"], stage(checkpoint)]


def save(path: Path, state: dict):
    atomic_write(path, lambda temp: save_to_file(state, temp, path))


def save_to_file(state: dict, temp: Path, path: Path):
    """torch.save to temp, with the state's checksum, through a Python file, so that a full disk's
    OSError stays attached to the RuntimeError torch raises; then temp is read back as load() reads
    it, so a state the safe load would refuse (a numpy scalar, say) never becomes `path`."""
    with open(temp, "wb") as file:
        torch.save({**state, "checksum": checksum(state)}, file)
    try:
        torch.load(temp, map_location="cpu", weights_only=True, mmap=True)  # mmap: the pickle, not the tensors
    except Exception as error:  # weights_only's refusal is an UnpicklingError; any other failure too
        refused = re.search(r"Unsupported global: GLOBAL (\S+)", str(error))
        reason = f"it holds a {refused.group(1)}" if refused else error.__class__.__name__
        raise RuntimeError(f"{path}: not saved: the checkpoint would not load safely ({reason})") from None


def checksum(state: dict) -> str:
    """sha256 of everything a checkpoint holds, its "checksum" entry left out: each tensor's dtype,
    shape and bytes, each other value's type and repr (exact for floats), in the state's order."""
    digest = hashlib.sha256()

    def add(value):
        if isinstance(value, torch.Tensor):
            digest.update(f"tensor {value.dtype} {tuple(value.shape)};".encode())
            digest.update(value.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy())
        elif isinstance(value, (dict, list, tuple)):
            digest.update(f"{type(value).__name__} {len(value)};".encode())
            for item in value.items() if isinstance(value, dict) else value:
                add(item)
        else:
            digest.update(f"{type(value).__name__} {value!r};".encode())

    add({key: value for key, value in state.items() if key != "checksum"})
    return digest.hexdigest()


def load(path: Path, mmap: bool = False, runs_dir: Path | None = None) -> dict:
    """A checkpoint of ours, loaded safely: torch.load with weights_only never runs pickled code.
    mmap: tensors are read from the file only when used (a quick look at the settings).
    runs_dir: where the run's config keeps runs, for the line that says a checkpoint is missing."""
    if not path.is_file():
        raise UserError(f"{full_path(path)}: checkpoint not found; {checkpoints_nearby(path, runs_dir)}")
    try:
        with warnings.catch_warnings():  # a damaged file can make torch warn too: the error line says it all
            warnings.simplefilter("ignore")
            state = torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except Exception as error:  # torch raises many kinds for a bad file
        raise UserError(f"{path}: not a readable checkpoint ({error.__class__.__name__})") from None
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise UserError(f"{path}: not a checkpoint of this program (format {FORMAT} expected)")
    missing = [key for key in KEY_TYPES if key not in state and key not in ADDED_KEYS]
    if missing:
        raise UserError(f"{path}: a damaged checkpoint, without {', '.join(missing)}")
    check_types(path, ADDED_KEYS | state)
    # mmap: a quick look at the settings; the full load that follows checks the sum.
    if not mmap and state["checksum"] != checksum(state):
        raise UserError(f"{path}: a damaged checkpoint: its contents do not match the checksum saved with them")
    state = ADDED_KEYS | state  # after the sum: it covers what was saved
    state["model_config"] = ADDED_MODEL_FIELDS | state["model_config"]
    return state


def checkpoints_nearby(path: Path, runs_dir: Path | None = None) -> str:
    """For a checkpoint path that is not there: the newest checkpoints of the runs/ directory it
    likely meant (one in the path, the config's, one beside it, the working directory's), or
    where a training run writes one."""
    full = full_path(path)
    places = [folder for folder in full.parents if folder.name == "runs"]
    places += ([full_path(runs_dir)] if runs_dir is not None else []) + [full.parent / "runs", full_path("runs")]
    runs = next((folder for folder in places if folder.is_dir()), None)
    if runs is None:
        written = full_path(runs_dir if runs_dir is not None else "runs") / "runN" / "checkpoints" / "checkpoint.pt"
        return f"no runs/ directory here yet: a training run writes {written}"
    found = sorted((file for file in runs.glob("*/checkpoints/*.pt") if file.is_file()),
                   key=lambda file: file.stat().st_mtime, reverse=True)
    if not found:
        return f"{runs} holds no checkpoint yet: a training run writes runN/checkpoints/checkpoint.pt there"
    more = f" and {len(found) - SHOWN_CHECKPOINTS} more" if len(found) > SHOWN_CHECKPOINTS else ""
    return f"newest checkpoints in {runs}: {', '.join(map(str, map(shown_path, found[:SHOWN_CHECKPOINTS])))}{more}"


def saved_settings(checkpoint: dict) -> dict:
    """The run's config as Config field names -> values, each key with a small grammar read from its
    text (a checkpoint stores them by INI key, as config.ini has them); keys this program no longer
    has are left out."""
    settings = {key.replace("-", "_"): value for key, value in checkpoint["config"].items()
                if key.replace("-", "_") in FIELD_TYPES}
    return {name: typed_value(name, value, "a checkpoint's settings") if name in GRAMMAR_KEYS else value
            for name, value in settings.items()}



def check_types(path: Path, state: dict):
    """Each entry of the type a run reads back."""
    for key, kind in KEY_TYPES.items():
        if not isinstance(state[key], kind):
            raise UserError(f"{path}: a damaged checkpoint: {key} is a {type(state[key]).__name__}")
    missing = [key for key in MODEL_FIELDS if key not in state["model_config"] and key not in ADDED_MODEL_FIELDS]
    if missing:
        raise UserError(f"{path}: a damaged checkpoint: its model_config lacks {', '.join(missing)}")
    if not all(isinstance(tensor, torch.Tensor) for tensor in state["model"].values()):
        raise UserError(f"{path}: a damaged checkpoint: its model holds values that are not tensors")


# The config keys of the architecture; each is also the ModelConfig field that stores it.
ARCHITECTURE_KEYS = ("d_model", "heads", "n_layer", "d_ff", "norm", "position", "rope_theta", "feed_forward")


def with_architecture(config: Config, checkpoint: dict) -> Config:
    """The config with the checkpoint's architecture for each key that neither the config files nor
    the command line set, so a fine-tuning config need not repeat them (one that does must agree:
    check_compatible names a key that differs)."""
    saved = checkpoint["model_config"]
    taken = {key: saved[key] for key in ARCHITECTURE_KEYS if key not in config.given}
    return dataclasses.replace(config, **taken)


def restore_model(path: Path, kinds: dict[str, type]) -> tuple[nn.Module, Vocab, dict]:
    """The model a checkpoint holds, with its vocabulary, for inference; `kinds` maps the
    task names this caller accepts to model classes."""
    checkpoint = load(path)
    if checkpoint["task"] not in kinds:
        raise UserError(f"{path}: a {checkpoint['task']} checkpoint; expected {' or '.join(kinds)}")
    model = kinds[checkpoint["task"]](ModelConfig(**checkpoint["model_config"]))
    missing = load_weights(model, checkpoint["model"], path, strict=False)  # unused heads (NSP) may stay behind
    if missing:
        raise UserError(f"{path}: weights missing for {type(model).__name__}: {', '.join(missing[:5])}")
    return model.eval(), vocab_of(checkpoint), checkpoint


def vocab_of(checkpoint: dict) -> Vocab:
    """The vocabulary a checkpoint carries, with its casing."""
    return Vocab(tuple(checkpoint["vocab"]), lowercase=checkpoint["vocab_lowercase"])


def load_weights(model: nn.Module, weights: dict, path: Path, strict: bool = True) -> list[str]:
    """model.load_state_dict(weights), with a weight of another shape, or (strict) one missing or
    unknown, named in one line; returns the names of the model's weights that were missing."""
    check_shapes(path, weights, model)
    missing, unexpected = model.load_state_dict(weights, strict=False)
    if strict and (missing or unexpected):
        names = ", ".join((missing or unexpected)[:3])
        raise UserError(f"{path}: a damaged checkpoint: weights {'missing' if missing else 'unknown'}: {names}")
    return missing


def check_shapes(path: Path, weights: dict, model: nn.Module):
    """Each of the weights that the model has too is of the model's shape."""
    own = model.state_dict()
    for name, tensor in weights.items():
        if name in own and own[name].shape != tensor.shape:
            raise UserError(f"{path}: a damaged checkpoint: {name} has shape {list(tensor.shape)}, "
                            f"its model's is {list(own[name].shape)}")


def check_compatible(path: Path, checkpoint: dict, vocab: Vocab, current: ModelConfig, new_phase: bool = False):
    """The checkpoint's model must be the one the config describes, with the same vocabulary; in a
    new phase (a new run from its weights) its context may grow (PHASE_MODEL_FIELDS)."""
    if checkpoint["vocab_checksum"] != vocab.checksum:
        raise UserError(f"{path}: made with another vocabulary than {vocab.path} (checksum differs)")
    if vocab_of(checkpoint).lowercase != vocab.lowercase:
        casing = {True: "lower-cases text", False: "keeps the case of text"}
        raise UserError(f"{path}: its vocabulary {casing[not vocab.lowercase]}, {vocab.path} {casing[vocab.lowercase]} "
                        f"(do_lower_case in tokenizer_config.json beside it says which)")
    saved = checkpoint["model_config"]
    for key, value in asdict(current).items():
        if key in FREE_MODEL_FIELDS or (new_phase and key in PHASE_MODEL_FIELDS) or \
                (key == "pooling" and "classifier.weight" not in checkpoint["model"]):
            continue  # a classifier's pooling is chosen when fine-tuning starts
        stored = saved[key]
        if stored != value:
            name = MODEL_FIELD_NAMES.get(key, key.replace("_", "-"))
            raise UserError(f"{path}: {name} = {stored} in the checkpoint but {value} "
                            f"from the config and vocabulary")


def load_pretrained(model: nn.Module, checkpoint: dict, path: Path, log):
    """Start from a checkpoint's weights. The encoder must be complete; a head the checkpoint
    lacks, one that does not fit (another number of labels) or one whose outputs have other names
    (another tag set) starts fresh. The log says which."""
    own = model.state_dict()
    weights = checkpoint["model"] | longer_position_tables(checkpoint["model"], own)
    fitting = {name: tensor for name, tensor in weights.items() if name in own and own[name].shape == tensor.shape}
    saved_names, names = tuple(checkpoint["model_config"]["label_names"]), tuple(model.config.label_names)
    other_kind = checkpoint["model_config"]["multi_label"] != model.config.multi_label
    other_outputs = (saved_names != names or other_kind) and any(not name.startswith("encoder.") for name in fitting)
    if other_outputs:  # a head's outputs mean the names they were trained for
        fitting = {name: tensor for name, tensor in fitting.items() if name.startswith("encoder.")}
    missing, _ = model.load_state_dict(fitting, strict=False)
    loaded = {own[name].data_ptr() for name in fitting}
    missing = [name for name in missing if own[name].data_ptr() not in loaded]  # tied to a loaded weight
    if any(name.startswith("encoder.") for name in missing):
        raise UserError(f"{path}: encoder weights missing or of another shape: {', '.join(missing[:5])}")
    unused = sorted({name.split(".")[0] + ".*" for name in checkpoint["model"] if name not in fitting})
    log(f"loaded the encoder of {path} ({checkpoint['task']} step {checkpoint['step']})")
    log(f"  newly initialised: {', '.join(missing) or 'nothing'}")
    log(f"  not used: {', '.join(unused) or 'nothing'}")
    if other_outputs and other_kind:
        kinds = {False: "one class an example (softmax)", True: "any number of classes (multi-label)"}
        log(f"  a new head: the checkpoint's picks {kinds[not model.config.multi_label]}, this run's "
            f"{kinds[model.config.multi_label]}")
    elif other_outputs:
        log(f"  a new head: the checkpoint's labels ({', '.join(saved_names) or 'unnamed'}) are not this run's "
            f"({', '.join(names)})")
    log_longer_context(checkpoint["model_config"], model.config, log)


def longer_position_tables(weights: dict, own: dict) -> dict:
    """Each learned position table the model has more rows of than the checkpoint, filled with
    copies of the trained rows one after another, as BERT's 512 are copied to reach 4,096
    (Longformer): a longer-context phase starts from positions that mean something."""
    longer = {}
    for name, table in weights.items():
        if name.endswith("embeddings.position.weight") and name in own and own[name].shape[0] > table.shape[0]:
            copies = -(-own[name].shape[0] // table.shape[0])
            longer[name] = table.repeat(copies, 1)[:own[name].shape[0]]
    return longer


def log_longer_context(saved: dict, current, log):
    """A new phase at a longer context says what changed: its positions and RoPE's base."""
    if current.max_len > saved["max_len"]:
        how = {"learned": "the learned table's rows copied on", "rope": "rotary angles computed",
               "sinusoidal": "the sinusoidal table computed"}[current.position]
        log(f"  positions: {saved['max_len']} in the checkpoint, {current.max_len} now ({how})")
    if current.position == "rope" and current.rope_theta != saved["rope_theta"]:
        log(f"  rope-theta: {saved['rope_theta']:g} in the checkpoint, {current.rope_theta:g} now")


def save_latest(directory: Path, state: dict, keep: int):
    """checkpoint.pt := state; with keep > 1 the one it replaces stays as checkpoint-STEP.pt, and
    keep-1 such older ones are kept. Once written, checkpoint.pt exists at every moment: the new
    file is complete on disk before the old one gets its second name (a hard link) and before the
    rename makes the new one the latest."""
    latest = directory / "checkpoint.pt"

    def keep_previous():
        if keep > 1 and latest.exists():
            # mmap: reads the step without loading the tensors
            step = torch.load(latest, map_location="cpu", weights_only=True, mmap=True)["step"]
            keep_as(latest, directory / f"checkpoint-{step}.pt")

    atomic_write(latest, lambda temp: save_to_file(state, temp, latest), before_rename=keep_previous)
    older = sorted(directory.glob("checkpoint-*.pt"), key=lambda p: int(p.stem.split("-")[1]))
    for stale in older[:max(0, len(older) - (keep - 1))]:
        stale.unlink()


def keep_as(source: Path, target: Path):
    """target := source as a second name of the same file (a copy where the file system has no hard
    links), written as every file is: a rotated checkpoint-STEP.pt, or stable.pt (the last before
    wsd's decay)."""
    def link(temp: Path):
        try:
            os.link(source, temp)
        except OSError:
            shutil.copyfile(source, temp)
    atomic_write(target, link)


def run_dir_of(path: Path) -> Path | None:
    """The run a checkpoint belongs to: runs/runN/checkpoints/checkpoint.pt -> runs/runN."""
    parent = path.resolve().parent
    return parent.parent if parent.name == "checkpoints" else None


def random_states(task_generator: torch.Generator | None) -> dict:
    """This process's random states, with the task's own generator's (task.Task.random_generator, an
    MLM's masks) where it has one: what a checkpoint keeps per rank for exact resume."""
    state = {"torch": torch.get_rng_state()}
    if task_generator is not None:
        state["mask"] = task_generator.get_state()
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def restore_random_states(state: dict, task_generator: torch.Generator | None):
    """One rank's random states, as random_states() saved them (a checkpoint of any task before this
    layout holds a "mask" state too: a task without a generator leaves it)."""
    torch.set_rng_state(state["torch"])
    if task_generator is not None and "mask" in state:
        task_generator.set_state(state["mask"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])
