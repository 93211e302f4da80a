"""Tests for config.py and ini.py: the original project's INI files, our templates, overrides and errors."""
import dataclasses
from pathlib import Path

import pytest
import torch

from checkpoint import saved_settings
from config import INI_KEYS, Config, key_groups
from ini import load_config
from errors import UserError
from legacy import IGNORED_KEYS

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


def write_config(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "config.ini"
    path.write_text(text, encoding="utf-8")
    return path


def load_error(tmp_path: Path, text: str, overrides: list[str] = ()) -> str:
    with pytest.raises(UserError) as error:
        load_config(write_config(tmp_path, text), list(overrides))
    message = str(error.value)
    assert "\n" not in message
    return message


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
    ours = load_config(ROOT / "etc" / "templates" / template, []).to_dict()
    theirs = load_config(write_config(tmp_path, original), []).to_dict()
    original_keys = [key for line in original.splitlines() if line and not line.startswith("#")
                     if (key := line.split("=")[0].split(":")[0].strip()) not in IGNORED_KEYS]
    assert {key: ours[key] for key in original_keys} == {key: theirs[key] for key in original_keys}


def test_cpu_template_is_small_and_uses_the_demo_corpus():
    config = load_config(ROOT / "etc" / "templates" / "config_cpu.ini", [])
    assert (config.base_dir, config.d_model, config.heads, config.n_layer) == ("demo", 128, 2, 2)
    assert config.time_budget == "8m" and config.budget_seconds == 480 and config.compile is False
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


def test_colon_and_equals_separators_split_at_the_first(tmp_path):
    config = load_config(write_config(tmp_path, "device = cuda:0\ncompile: yes\nseq_len: 1_024\n"), [])
    assert config.device == "cuda:0" and config.compile is True and config.seq_len == 1024


def test_keys_ignore_case_and_underscores_and_sections_are_ignored(tmp_path):
    text = "[train]\nLearning_Rate = 3e-4\n\n   # indented comment\n[model]\nN-LAYER = 2\n"
    config = load_config(write_config(tmp_path, text), [])
    assert config.learning_rate == 3e-4 and config.n_layer == 2


def test_float_with_underscores(tmp_path):
    assert load_config(write_config(tmp_path, "learning-rate = 1_000.5"), []).learning_rate == 1000.5


@pytest.mark.parametrize("text", ["on", "ON", "1", "Yes", "true"])
def test_boolean_spellings(tmp_path, text):
    assert load_config(write_config(tmp_path, f"wandb = {text}"), []).wandb is True


def test_unknown_key_names_file_line_and_suggests(tmp_path):
    message = load_error(tmp_path, "seq-len = 64\n\n# comment\n\nlerning_rate = 1e-3\n")
    assert message == (f"{tmp_path / 'config.ini'}:5: unknown key 'lerning-rate' "
                       "(did you mean 'learning-rate'?)")


def test_a_byte_order_mark_before_the_first_key_is_ignored(tmp_path):
    path = tmp_path / "config.ini"
    path.write_bytes(b"\xef\xbb\xbftask-type = mlm\nseq-len = 64\n")
    assert load_config(path, []).seq_len == 64


@pytest.mark.parametrize("line, expected", [
    ("seq-len = abc", "seq-len = 'abc': expected an integer"),
    ("seq-len = 1e3", "seq-len = '1e3': expected an integer"),
    ("dropout = lots", "dropout = 'lots': expected a number"),
    ("dropout = nan", "dropout = 'nan': expected a number"),
    ("dropout = 1.5", "dropout = 1.5: expected a number in [0, 1)"),
    ("seq-len = 4", "seq-len = 4: expected an integer in [8, 2048]"),
    ("mask-rate = 0", "mask-rate = 0.0: expected a number in (0, 1)"),
    ("learning-rate = 0", "learning-rate = 0.0: expected a number > 0"),
    ("layer-lr-decay = 0", "layer-lr-decay = 0.0: expected a number in (0, 1]"),
    ("layer-lr-decay = 1.2", "layer-lr-decay = 1.2: expected a number in (0, 1]"),
    ("dist-master-port = 70000", "dist-master-port = 70000: expected an integer in [1, 65535]"),
    ("task-type = bert", "task-type = 'bert': expected one of mlm, clm, electra, cola, sst2, mrpc, qqp, stsb, "
                         "mnli, qnli, rte, wnli, classify"),
    ("device = gpu", "device = 'gpu': expected auto, cpu, cuda or cuda:N"),
    ("compile = maybe", "compile = 'maybe': expected a boolean"),
])
def test_bad_values_name_file_line_key_and_value(tmp_path, line, expected):
    message = load_error(tmp_path, f"# first line\n{line}\n")
    assert message.startswith(f"{tmp_path / 'config.ini'}:2: {expected}")


def test_line_without_separator(tmp_path):
    assert load_error(tmp_path, "seq-len 64\n").endswith("config.ini:1: line is not 'key = value'")


def test_duplicate_key_names_both_lines(tmp_path):
    message = load_error(tmp_path, "seq-len = 64\nheads = 2\nseq_len = 32\n")
    assert message.endswith("config.ini:3: key 'seq-len' given twice (first on line 1)")


def test_cross_field_errors_name_the_file(tmp_path):
    path = tmp_path / "config.ini"
    assert load_error(tmp_path, "d-model = 100\nheads = 12\n") == \
        f"{path}: d-model = 100 is not divisible by heads = 12"
    assert "min-learning-rate" in load_error(tmp_path, "learning-rate = 1e-5\nmin-learning-rate = 1e-4")
    assert "lr-decay-iters" in load_error(tmp_path, "warmup-iters = 500\nlr-decay-iters = 100")


def test_variant_keys(tmp_path):
    assert load_config(write_config(tmp_path, "d-model = 128\nfeed-forward = geglu\n"), []).feed_forward_size == 344
    assert load_config(write_config(tmp_path, "d-model = 128\n"), []).feed_forward_size == 512
    assert load_error(tmp_path, "norm = layernorm\n").endswith(
        "norm = 'layernorm': expected one of postln, preln, rmsnorm")
    assert load_error(tmp_path, "d-model = 96\nheads = 32\nposition = rope\n").endswith(
        "position = rope needs an even head width, but d-model / heads = 96 / 32 is odd")


def test_overrides_win_over_the_file(tmp_path):
    path = write_config(tmp_path, "learning-rate = 1e-3\nseq-len = 128\ncompile = true\n")
    config = load_config(path, ["--learning-rate", "3e-4", "--compile=false", "--seq_len", "64",
                                "--wandb", "--seed", "7"])
    assert config.learning_rate == 3e-4 and config.compile is False and config.seq_len == 64
    assert config.wandb is True and config.seed == 7


def test_override_can_fix_an_invalid_file_value(tmp_path):
    # validation runs once on the final values, not on the file alone
    path = write_config(tmp_path, "d-model = 100\n")
    assert load_config(path, ["--d-model", "96"]).d_model == 96


@pytest.mark.parametrize("overrides, expected", [
    (["--lerning-rate", "1"], "--lerning-rate: unknown option (did you mean --learning-rate?)"),
    (["--seq-len", "abc"], "--seq-len abc: expected an integer"),
    (["--seq-len"], "--seq-len: missing value"),
    (["--seq-len", "--compile"], "--seq-len: missing value"),
    (["--dropout=1.5"], "--dropout 1.5: expected a number in [0, 1)"),
    (["seq-len", "64"], "'seq-len': expected an option like --key value"),
    (["--max-iters", "7", "--max_iters", "9"], "--max-iters: given twice on the command line"),
])
def test_override_errors(tmp_path, overrides, expected):
    assert load_error(tmp_path, "", overrides) == expected


def test_missing_default_config_says_how_to_make_one(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UserError, match="config.ini not found in .*: copy config.ini.example "
                                        "to config.ini or pass --config PATH"):
        load_config(None, [])


def test_default_config_is_read_from_the_current_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write_config(tmp_path, "n-layer = 3\n")
    assert load_config(None, []).n_layer == 3


def test_missing_explicit_config(tmp_path):
    with pytest.raises(UserError, match=r"nope\.ini: config file not found$"):
        load_config(tmp_path / "nope.ini", [])


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


def test_a_key_alone_on_a_line_is_true_and_only_for_flags(tmp_path):
    config = load_config(write_config(tmp_path, "compile\nasync-to-device   # a comment\nfused-adamw: false\n"), [])
    assert (config.compile, config.async_to_device, config.fused_adamw) == (True, True, False)
    assert load_error(tmp_path, "seq-len\n").endswith("config.ini:1: key 'seq-len' has no value "
                                                      "(only true/false keys may stand alone)")


def test_local_config_overrides_config_and_both_are_named(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("config.ini").write_text("seq-len = 128\nbatch-size = 100\nd-model = 768\n")
    Path("local_config.ini").write_text("seq-len = 32\nbatch-size = 16\n")
    config = load_config(None, ["--batch-size", "8"])
    assert (config.seq_len, config.batch_size, config.d_model) == (32, 8, 768)
    assert config.sources == ("config.ini", "local_config.ini")
    Path("local_config.ini").write_text("seq-len = 32\nseq-len = 16\n")
    with pytest.raises(UserError, match="local_config.ini:2: key 'seq-len' given twice"):
        load_config(None, [])
    assert load_config(Path("config.ini"), []).seq_len == 128  # --config names the one file to read


def test_aliases_of_the_original_keys_and_values(tmp_path):
    config = load_config(write_config(tmp_path, "task-type = gpt\nn-layers = 3\n"), ["-t", "cola"])
    assert (config.task_type, config.n_layer) == ("cola", 3)
    assert load_config(write_config(tmp_path, "task-type = gpt\n"), []).task_type == "clm"


@pytest.mark.parametrize("line, expected", [
    ("dataset-percentage = 0", "dataset-percentage = 0.0: expected a number in (0, 1]"),
    ("val-dataset-percentage = 1.5", "val-dataset-percentage = 1.5: expected a number in (0, 1]"),
    ("lr-scheduler = steplr:10", "lr-scheduler = 'steplr:10': expected cosine, none or steplr:STEP:GAMMA"),
    ("lr-scheduler = linear", "lr-scheduler = 'linear': expected cosine, none or steplr:STEP:GAMMA"),
    ("lr-scheduler = steplr:0:0.5", "lr-scheduler = 'steplr:0:0.5': expected cosine"),
    ("run-id = a/b", "run-id = 'a/b': expected a directory name"),
    ("run-id = ..", "run-id = '..': expected a directory name"),
    ("dist-backend = mpi", "dist-backend = 'mpi': expected one of auto, nccl, gloo"),
    ("test-iters = -1", "test-iters = -1: expected an integer >= 0"),
])
def test_bad_values_of_the_new_keys(tmp_path, line, expected):
    assert expected in load_error(tmp_path, f"{line}\n")


def test_the_learning_rate_schedulers():
    from optimizer import learning_rate
    base = Config(learning_rate=1e-3, min_learning_rate=1e-5, warmup_iters=10, lr_decay_iters=100, max_iters=100)
    constant = dataclasses.replace(base, lr_scheduler="none")
    assert learning_rate(4, 0, constant) == pytest.approx(1e-3 * 5 / 11)  # warmup as before
    assert learning_rate(10, 0, constant) == learning_rate(99, 0, constant) == 1e-3
    stepped = dataclasses.replace(base, lr_scheduler="steplr:20:0.5")
    assert [learning_rate(step, 0, stepped) for step in (10, 29, 30, 50)] == pytest.approx([1e-3, 1e-3, 5e-4, 2.5e-4])
    ramped = dataclasses.replace(base, resume_warmup_iters=4)
    assert learning_rate(60, 0, ramped, resumed_at=60) == pytest.approx(learning_rate(60, 0, base) / 5)
    assert learning_rate(64, 0, ramped, resumed_at=60) == learning_rate(64, 0, base)


def test_datasets_dir_lies_under_base_dir_unless_absolute(tmp_path):
    relative = load_config(write_config(tmp_path, "base-dir = wiki\ndatasets-dir = datasets\n"), [])
    assert relative.datasets_path == Path("wiki/datasets")
    absolute = load_config(write_config(tmp_path, f"base-dir = wiki\ndatasets-dir = {tmp_path / 'data'}\n"), [])
    assert absolute.datasets_path == tmp_path / "data"


def test_the_original_projects_ignored_keys_load_and_set_nothing(tmp_path):
    config = load_config(write_config(tmp_path, "case = dickens\nflash\n"), ["--flash", "false"])
    assert config == Config() and not config.given
