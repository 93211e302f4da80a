"""src/config.py: each key's type, rule and default, the rules between keys, the paths and copies a
Config gives, our templates and config.ini.example, and the original project's files (ini.py reads them:
test_ini.py)."""
import dataclasses
from pathlib import Path

import pytest
import torch

from checkpoints import saved_settings
from config import CROSS_FIELD_RULES, INI_KEYS, Config, key_groups
from ini import load_config
from errors import UserError
from legacy import IGNORED_KEYS
from test_ini import load_error, write_config

ROOT = Path(__file__).resolve().parent.parent
TEMPLATES = sorted((ROOT / "etc" / "templates").glob("config_*.ini"))

ORIGINAL_MLM = """\
task-type = mlm
seq-len = 128
batch-size = 100
val-interval = 100
d-model = 768
heads = 12
n-layer = 6
dropout = 0.35

async-to-device: true
fused-adamw: true
compile: true

learning-rate = 1.0e-3
min-learning-rate = 5e-5
warmup-iters = 1000
lr-decay-iters = 45_000
max-iters = 60_000
weight-decay = 0.01

case = dickens # TODO: rename
base-dir = wiki
# supports round-robin of datasets
dataset-pattern = train_weke_128_*.msgpack
val-dataset-pattern = val_weke_128_*.msgpack
# DDP
dist-master-addr = 127.0.0.1
dist-master-port = 12233
# misc
max-checkpoints = 1
wandb = false
"""

ORIGINAL_SST2 = """\
task-type = sst2
seq-len = 128
batch-size = 64
val-interval = 200
d-model = 768
heads = 12
n-layer = 6
dropout = 0.0

async-to-device: true
fused-adamw: true
compile: true

learning-rate = 6e-5
min-learning-rate = 1e-7
warmup-iters = 300
lr-decay-iters = 8000
max-iters = 10000
weight-decay = 0.02

case = dickens # change to something meaningful
base-dir = wiki
# for sst2, the file names are hardcoded in sst2_dataset.py
# dataset-pattern = train_weke_256_*.msgpack
# val-dataset-pattern = val_weke_256_*.msgpack
# DDP
dist-master-addr = 127.0.0.1
dist-master-port = 12233
# misc
max-checkpoints = 1
wandb = false
"""


def test_original_mlm_block_parses_to_typed_values(tmp_path):
    config = load_config(write_config(tmp_path, ORIGINAL_MLM), [])
    assert config.task_type == "mlm"
    assert config.batch_size == 100 and config.d_model == 768 and config.heads == 12
    assert config.dropout == 0.35
    assert config.async_to_device is True and config.fused_adamw is True and config.compile is True
    assert config.learning_rate == 1e-3 and config.min_learning_rate == 5e-5
    assert config.lr_decay_iters == 45_000 and config.max_iters == 60_000
    assert not hasattr(config, "case")  # read and ignored: task-type decides
    assert config.dataset_pattern == "train_weke_128_*.msgpack"
    assert config.dist_master_addr == "127.0.0.1" and config.dist_master_port == 12233
    assert config.wandb is False
    assert config.vocab_path == Path("wiki") / "vocab"
    assert config.datasets_path == Path("wiki/datasets") and config.runs_dir == Path("wiki/runs")
    assert config.feed_forward_size == 4 * 768


def test_original_sst2_block_parses_to_typed_values(tmp_path):
    config = load_config(write_config(tmp_path, ORIGINAL_SST2), [])
    assert config.task_type == "sst2"
    assert config.dropout == 0.0 and isinstance(config.dropout, float)
    assert config.learning_rate == 6e-5 and config.min_learning_rate == 1e-7
    assert config.lr_decay_iters == 8000 and config.max_iters == 10_000
    assert config.weight_decay == 0.02
    assert config.dataset_pattern == Config().dataset_pattern  # commented out in the file


@pytest.mark.parametrize("template", TEMPLATES, ids=lambda path: path.name)
def test_every_template_loads(template):
    assert isinstance(load_config(template, []), Config)


def test_templates_exist():
    assert {path.name for path in TEMPLATES} >= {"config_mlm.ini", "config_sst2.ini", "config_cpu.ini"}


@pytest.mark.parametrize("template, original", [("config_mlm.ini", ORIGINAL_MLM),
                                                ("config_sst2.ini", ORIGINAL_SST2)])
def test_templates_keep_the_original_values(tmp_path, template, original):
    """Every value of the original's template, but its data label: ours reads the shards README's commands
    make (train_wiki_128_*), where the original's read train_weke_128_*."""
    ours = load_config(ROOT / "etc" / "templates" / template, []).to_dict()
    theirs = load_config(write_config(tmp_path, original), []).to_dict()
    original_keys = [key for line in original.splitlines() if line and not line.startswith("#")
                     if (key := line.split("=")[0].split(":")[0].strip()) not in IGNORED_KEYS]
    labelled = {key: value.replace("_weke_", "_wiki_") for key, value in theirs.items() if key.endswith("pattern")}
    assert {key: ours[key] for key in original_keys} == {key: labelled.get(key, theirs[key]) for key in original_keys}


def test_cpu_template_is_small_and_uses_the_demo_corpus():
    config = load_config(ROOT / "etc" / "templates" / "config_cpu.ini", [])
    assert (config.base_dir, config.d_model, config.heads, config.n_layer) == ("demo", 128, 2, 2)
    assert str(config.time_budget) == "8m" and config.budget_seconds == 480 and config.compile is False
    assert config.val_dataset_pattern == "val_imdb_128_*.msgpack"


def test_cpu_fine_tuning_template_matches_the_pre_training_architecture():
    pretrain = load_config(ROOT / "etc" / "templates" / "config_cpu.ini", []).to_dict()
    finetune = load_config(ROOT / "etc" / "templates" / "config_sst2_cpu.ini", []).to_dict()
    architecture = ["seq-len", "d-model", "heads", "n-layer", "d-ff", "norm", "position", "feed-forward"]
    assert {key: finetune[key] for key in architecture} == {key: pretrain[key] for key in architecture}


def test_example_groups_the_keys_as_the_config_does():
    groups, keys = [], {}
    for line in (ROOT / "config.ini.example").read_text(encoding="utf-8").splitlines():
        if line.startswith("# --- "):
            groups.append(line.strip("# -"))
        elif line and line[0].isalpha():
            keys.setdefault(groups[-1], []).append(line.split("=")[0].strip())
    assert [(title, keys[title]) for title in groups] == [
        (title, [INI_KEYS[each.name] for each in members]) for title, members in key_groups()]


def test_example_lists_every_key_at_its_default():
    lines = (ROOT / "config.ini.example").read_text(encoding="utf-8").splitlines()
    keys = {line.split("=")[0].strip() for line in lines if line and line[0].isalpha()}
    assert keys == set(Config().to_dict())
    assert load_config(ROOT / "config.ini.example", []) == Config()


def test_float_with_underscores(tmp_path):
    assert load_config(write_config(tmp_path, "learning-rate = 1_000.5"), []).learning_rate == 1000.5


@pytest.mark.parametrize("text", ["on", "ON", "1", "Yes", "true"])
def test_boolean_spellings(tmp_path, text):
    assert load_config(write_config(tmp_path, f"wandb = {text}"), []).wandb is True


@pytest.mark.parametrize("line, expected", [
    ("seq-len = abc", "seq-len = 'abc': expected an integer"),
    ("seq-len = 1e3", "seq-len = '1e3': expected an integer"),
    ("dropout = lots", "dropout = 'lots': expected a number"),
    ("dropout = nan", "dropout = 'nan': expected a number"),
    ("dropout = 1.5", "dropout = 1.5: expected a number in [0, 1)"),
    ("seq-len = 4", "seq-len = 4: expected an integer in [8, 2048]"),
    ("mask-rate = 0", "mask-rate = '0': expected a rate in (0, 1)"),
    ("mask-rate = 0.15:0.3", "mask-rate = '0.15:0.3': expected a rate in (0, 1), or START:END[@AT]: START falling"),
    ("learning-rate = 0", "learning-rate = 0.0: expected a number > 0"),
    ("layer-lr-decay = 0", "layer-lr-decay = 0.0: expected a number in (0, 1]"),
    ("layer-lr-decay = 1.2", "layer-lr-decay = 1.2: expected a number in (0, 1]"),
    ("dist-master-port = 70000", "dist-master-port = 70000: expected an integer in [1, 65535]"),
    ("task-type = bert", "task-type = 'bert': expected one of mlm, clm, electra, distill, cola, sst2, mrpc, qqp, stsb, "
                         "mnli, qnli, rte, wnli, classify"),
    ("device = gpu", "device = 'gpu': expected auto, cpu, cuda or cuda:N"),
    ("compile = maybe", "compile = 'maybe': expected a boolean"),
])
def test_bad_values_name_file_line_key_and_value(tmp_path, line, expected):
    message = load_error(tmp_path, f"# first line\n{line}\n")
    assert message.startswith(f"{tmp_path / 'config.ini'}:2: {expected}")


def test_cross_field_errors_name_the_file(tmp_path):
    path = tmp_path / "config.ini"
    assert load_error(tmp_path, "d-model = 100\nheads = 12\n") == \
        f"{path}: d-model = 100 is not divisible by heads = 12"
    assert "min-learning-rate" in load_error(tmp_path, "learning-rate = 1e-5\nmin-learning-rate = 1e-4")
    assert "lr-decay-iters" in load_error(tmp_path, "warmup-iters = 500\nlr-decay-iters = 100")
    assert load_error(tmp_path, "logit-weight = 0.5\n") == \
        f"{path}: logit-weight = 0.5 goes with task-type = distill, not mlm"


def test_cross_field_rules_are_named_and_say_their_rule():
    names = [rule.__name__ for rule in CROSS_FIELD_RULES]
    assert "<lambda>" not in names
    assert all(rule.__doc__ and rule.__doc__.strip() for rule in CROSS_FIELD_RULES)
    assert len(set(names)) == len(names)


def test_variant_keys(tmp_path):
    assert load_config(write_config(tmp_path, "d-model = 128\nfeed-forward = geglu\n"), []).feed_forward_size == 344
    assert load_config(write_config(tmp_path, "d-model = 128\n"), []).feed_forward_size == 512
    assert load_error(tmp_path, "norm = layernorm\n").endswith(
        "norm = 'layernorm': expected one of postln, preln, rmsnorm")
    assert load_error(tmp_path, "d-model = 96\nheads = 32\nposition = rope\n").endswith(
        "position = rope needs an even head width, but d-model / heads = 96 / 32 is odd")
    assert load_config(write_config(tmp_path, "rope-theta = 160_000\n"), []).rope_theta == 160_000
    assert load_error(tmp_path, "position = learned\nrope-theta = 160000\n").endswith(
        "rope-theta = 160000 goes with position = rope, not position = learned")
    assert load_error(tmp_path, "rope-theta = 0\n").endswith("rope-theta = 0.0: expected a number > 0")


def test_dict_round_trip_survives_safe_torch_load(tmp_path):
    config = load_config(write_config(tmp_path, ORIGINAL_MLM), ["--vocab", "v/vocab.txt"])
    torch.save({"config": config.to_dict()}, tmp_path / "checkpoint.pt")
    restored = torch.load(tmp_path / "checkpoint.pt", weights_only=True)["config"]
    assert Config(**saved_settings({"config": restored})) == config
    assert Config(**saved_settings({"config": restored})).vocab_path == Path("v/vocab.txt")


def test_a_replaced_copy_is_validated():
    config = Config()
    smaller = dataclasses.replace(config, d_model=64, heads=2, d_ff=100)
    assert (smaller.d_model, smaller.feed_forward_size, config.d_model) == (64, 100, 256)
    with pytest.raises(UserError, match="not divisible"):
        dataclasses.replace(config, heads=7)


def test_direct_construction_is_validated():
    with pytest.raises(UserError, match="batch-size = 0: expected an integer >= 1"):
        Config(batch_size=0)


def test_describe_lines_load_back(tmp_path):
    config = Config(task_type="sst2", compile=True, vocab="")
    lines = config.describe()
    assert "compile = true" in lines and "task-type = sst2" in lines and "vocab =" in lines
    assert load_config(write_config(tmp_path, "\n".join(lines)), []) == config


# ----------------------------------------------------------------------------- the original project's files

ORIGINAL_TEMPLATES = ROOT.parent / "shared" / "seed-project" / "templates"


@pytest.mark.skipif(not ORIGINAL_TEMPLATES.is_dir(), reason="needs ../shared/seed-project/templates")
@pytest.mark.parametrize("name", ["config_template.ini", "config_mlm.ini", "config_sst2.ini", "config_cola.ini",
                                  "config_gpt.ini", "local_config_template.ini"])
def test_the_original_templates_load(name):
    config = load_config(ORIGINAL_TEMPLATES / name, [])
    assert config.base_dir == "wiki"


def test_aliases_of_the_original_keys_and_values(tmp_path):
    config = load_config(write_config(tmp_path, "task-type = gpt\nn-layers = 3\n"), ["-t", "cola"])
    assert (config.task_type, config.n_layer) == ("cola", 3)
    assert load_config(write_config(tmp_path, "task-type = gpt\n"), []).task_type == "clm"


@pytest.mark.parametrize("line, expected", [
    ("dataset-percentage = 0", "dataset-percentage = 0.0: expected a number in (0, 1]"),
    ("val-dataset-percentage = 1.5", "val-dataset-percentage = 1.5: expected a number in (0, 1]"),
    ("lr-scheduler = steplr:10", "lr-scheduler = 'steplr:10': expected cosine, linear, none (constant)"),
    ("lr-scheduler = linear:3", "lr-scheduler = 'linear:3': expected cosine, linear, none"),
    ("lr-scheduler = steplr:0:0.5", "lr-scheduler = 'steplr:0:0.5': expected cosine"),
    ("run-id = a/b", "run-id = 'a/b': expected a directory name"),
    ("run-id = ..", "run-id = '..': expected a directory name"),
    ("dist-backend = mpi", "dist-backend = 'mpi': expected one of auto, nccl, gloo"),
    ("test-iters = -1", "test-iters = -1: expected an integer >= 0"),
])
def test_bad_values_of_the_new_keys(tmp_path, line, expected):
    assert expected in load_error(tmp_path, f"{line}\n")


def test_datasets_dir_lies_under_base_dir_unless_absolute(tmp_path):
    relative = load_config(write_config(tmp_path, "base-dir = wiki\ndatasets-dir = datasets\n"), [])
    assert relative.datasets_path == Path("wiki/datasets")
    absolute = load_config(write_config(tmp_path, f"base-dir = wiki\ndatasets-dir = {tmp_path / 'data'}\n"), [])
    assert absolute.datasets_path == tmp_path / "data"
