"""src/errors.py: a user's mistake or a full disk is one line and exit code 2, Ctrl-C one line and
exit code 130; our bugs keep their traceback."""
import errno
import signal
from pathlib import Path

import pytest
from safetensors import SafetensorError

from errors import (UserError, exit_on_user_error, full_path, interrupt_quietly_while_starting,
                    interrupted_while_starting, naming_a_full_disk, no_space_left, script_command)

ROOT = Path(__file__).resolve().parent.parent


def full_disk() -> OSError:
    return OSError(errno.ENOSPC, "No space left on device")


def exit_of(main, capsys) -> tuple[int, str]:
    """The exit code and stderr of a script's main wrapped by exit_on_user_error."""
    with pytest.raises(SystemExit) as stopped:
        exit_on_user_error(main)()
    return stopped.value.code, capsys.readouterr().err


def test_a_user_error_is_one_line_and_exit_code_2(capsys):
    def main():
        raise UserError("config.ini:3: unknown key 'lerning-rate'")
    assert exit_of(main, capsys) == (2, "error: config.ini:3: unknown key 'lerning-rate'\n")


def test_a_full_disk_found_inside_another_error_is_one_line_too(capsys):
    def main():
        try:
            raise full_disk()
        except OSError as error:
            raise RuntimeError("PytorchStreamWriter failed writing file") from error  # as torch.save wraps it
    assert exit_of(main, capsys) == (2, "error: no space left on device\n")


@pytest.mark.parametrize("code, words", [(errno.EROFS, "read-only file system"), (errno.EACCES, "permission denied")])
def test_a_place_this_process_may_not_write_is_one_line(capsys, code, words):
    def main():
        raise OSError(code, words.capitalize(), "/mnt/ro/runs/run0")  # as Path.mkdir raises it
    assert exit_of(main, capsys) == (2, f"error: /mnt/ro/runs/run0: {words}\n")


def test_an_os_error_without_a_file_keeps_its_traceback():
    def main():
        raise OSError(errno.EACCES, "Permission denied")
    with pytest.raises(OSError):
        exit_on_user_error(main)()


def test_ctrl_c_is_one_line_and_exit_code_130(capsys):
    def main():
        raise KeyboardInterrupt
    assert exit_of(main, capsys) == (130, "interrupted\n")


def test_our_bugs_keep_their_traceback():
    def main():
        raise ZeroDivisionError("a bug")
    with pytest.raises(ZeroDivisionError):
        exit_on_user_error(main)()


def test_the_wrapper_returns_what_main_returns():
    assert exit_on_user_error(lambda value: value * 2)(21) == 42


def test_a_full_disk_while_writing_names_the_file_and_other_errors_pass(tmp_path):
    with pytest.raises(UserError, match=f"^no space left on device writing {tmp_path / 'log.txt'}$"):
        with naming_a_full_disk(tmp_path / "log.txt"):
            raise full_disk()
    with pytest.raises(PermissionError):
        with naming_a_full_disk(tmp_path / "log.txt"):
            raise PermissionError(errno.EACCES, "Permission denied")


def test_no_space_left_follows_the_chain_of_causes():
    wrapped = RuntimeError("outer")
    wrapped.__cause__ = ValueError("middle")
    wrapped.__cause__.__context__ = full_disk()
    assert no_space_left(wrapped) and no_space_left(full_disk())
    assert not no_space_left(RuntimeError("outer")) and not no_space_left(OSError(errno.EACCES, "denied"))


def test_a_full_disk_in_a_rust_librarys_error_is_one_line(capsys):
    """safetensors (and tokenizers) raise their own kind, the OS error only in its message."""
    def main():
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")
    assert exit_of(main, capsys) == (2, "error: no space left on device\n")
    assert not no_space_left(SafetensorError("Error while serializing: I/O error: Permission denied (os error 13)"))


def test_main_hands_ctrl_c_back_to_keyboard_interrupt_after_starting(keep_signal_handlers):
    interrupt_quietly_while_starting()
    assert signal.getsignal(signal.SIGINT) is interrupted_while_starting
    handler = exit_on_user_error(lambda: signal.getsignal(signal.SIGINT))()
    assert handler is signal.default_int_handler


def test_a_next_step_names_a_script_as_it_runs_from_the_working_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)  # a fresh clone
    assert script_command("train_vocab.py") == "python scripts/train_vocab.py"
    monkeypatch.chdir(tmp_path)  # elsewhere: the script's full path
    assert script_command("train_vocab.py") == f"python {ROOT / 'scripts' / 'train_vocab.py'}"


def test_full_path_folds_dots_from_the_working_directory(tmp_path, monkeypatch):
    (tmp_path / "here").mkdir()
    monkeypatch.chdir(tmp_path / "here")
    assert full_path("../wiki/vocab") == Path.cwd().parent / "wiki" / "vocab"
