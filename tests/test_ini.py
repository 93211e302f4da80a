"""src/ini.py: which config files are read (./config.ini, ./local_config.ini, --config), the INI
dialect line by line, `--key value` overrides, and a one-line error for each mistake in them."""
from pathlib import Path

import pytest

from config import Config
from errors import UserError
from ini import load_config


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


# ----------------------------------------------------------------------------- which files

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


def test_a_file_that_is_not_utf8_is_one_line(tmp_path):
    path = tmp_path / "config.ini"
    path.write_bytes("seq-len = 64\n# caf\u00e9\n".encode("latin-1"))
    with pytest.raises(UserError, match=r"config\.ini: not a UTF-8 text file$"):
        load_config(path, [])


# ----------------------------------------------------------------------------- the INI dialect

def test_colon_and_equals_separators_split_at_the_first(tmp_path):
    config = load_config(write_config(tmp_path, "device = cuda:0\ncompile: yes\nseq_len: 1_024\n"), [])
    assert config.device == "cuda:0" and config.compile is True and config.seq_len == 1024


def test_keys_ignore_case_and_underscores_and_sections_are_ignored(tmp_path):
    text = "[train]\nLearning_Rate = 3e-4\n\n   # indented comment\n[model]\nN-LAYER = 2\n"
    config = load_config(write_config(tmp_path, text), [])
    assert config.learning_rate == 3e-4 and config.n_layer == 2


def test_a_byte_order_mark_before_the_first_key_is_ignored(tmp_path):
    path = tmp_path / "config.ini"
    path.write_bytes(b"\xef\xbb\xbftask-type = mlm\nseq-len = 64\n")
    assert load_config(path, []).seq_len == 64


def test_a_key_alone_on_a_line_is_true_and_only_for_flags(tmp_path):
    config = load_config(write_config(tmp_path, "compile\nasync-to-device   # a comment\nfused-adamw: false\n"), [])
    assert (config.compile, config.async_to_device, config.fused_adamw) == (True, True, False)
    assert load_error(tmp_path, "seq-len\n").endswith("config.ini:1: key 'seq-len' has no value "
                                                      "(only true/false keys may stand alone)")


def test_line_without_separator(tmp_path):
    assert load_error(tmp_path, "seq-len 64\n").endswith("config.ini:1: line is not 'key = value'")


def test_duplicate_key_names_both_lines(tmp_path):
    message = load_error(tmp_path, "seq-len = 64\nheads = 2\nseq_len = 32\n")
    assert message.endswith("config.ini:3: key 'seq-len' given twice (first on line 1)")


def test_unknown_key_names_file_line_and_suggests(tmp_path):
    message = load_error(tmp_path, "seq-len = 64\n\n# comment\n\nlerning_rate = 1e-3\n")
    assert message == (f"{tmp_path / 'config.ini'}:5: unknown key 'lerning-rate' "
                       "(did you mean 'learning-rate'?)")


def test_the_original_projects_ignored_keys_load_and_set_nothing(tmp_path):
    config = load_config(write_config(tmp_path, "case = dickens\nflash\n"), ["--flash", "false"])
    assert config == Config() and not config.given


# ----------------------------------------------------------------------------- overrides

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
