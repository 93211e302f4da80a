"""User-facing errors: one line naming the file, key or value, exit code 2, no traceback."""
import errno
import functools
import os
import signal
import sys
from contextlib import contextmanager
from pathlib import Path

# How a Rust library's I/O error (std::io::Error) names a full disk: "No space left on device (os error 28)".
RUST_NO_SPACE = f"(os error {errno.ENOSPC})"


class UserError(Exception):
    """A mistake in the user's input (file, key, value), reported in one line."""


SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"


def full_path(path) -> Path:
    """The absolute path an error line names, `..` folded but links kept as the user wrote them."""
    return Path(os.path.abspath(path))


def shown_path(path) -> Path:
    """A path as a command takes it from here: under the working directory relative to it, else full."""
    full = full_path(path)
    try:
        return full.relative_to(Path.cwd())
    except ValueError:
        return full


def script_command(name: str) -> str:
    """How to run one of the repository's scripts from the working directory, for an error line's
    next step: `python scripts/NAME` in the repository, its full path from elsewhere."""
    return f"python {shown_path(SCRIPTS / name)}"


def no_space_left(error: BaseException | None) -> bool:
    """Whether the error or one it came from is ENOSPC (torch.save wraps it in a RuntimeError; a Rust
    library such as safetensors raises its own kind, the OS error only in its message)."""
    while error is not None:
        if isinstance(error, OSError) and error.errno == errno.ENOSPC:
            return True
        if not isinstance(error, OSError) and RUST_NO_SPACE in str(error):
            return True
        error = error.__cause__ or error.__context__
    return False


def unwritable_place(error: BaseException | None) -> OSError | None:
    """The error, or one it came from, that says a file or folder may not be written or read (a
    read-only mount, no permission): the machine's state, not a bug."""
    while error is not None:
        if isinstance(error, OSError) and error.errno in (errno.EROFS, errno.EACCES, errno.EPERM) and error.filename:
            return error
        error = error.__cause__ or error.__context__
    return None


@contextmanager
def naming_a_full_disk(path):
    """A full disk while writing `path` becomes a UserError naming it."""
    try:
        yield
    except Exception as error:
        if no_space_left(error):
            raise UserError(f"no space left on device writing {path}") from None
        raise


def interrupt_quietly_while_starting():
    """Until exit_on_user_error's wrapper runs (torch alone takes seconds to import), Ctrl-C is
    one line and exit code 130 rather than a KeyboardInterrupt traceback from inside an import."""
    signal.signal(signal.SIGINT, interrupted_while_starting)


def interrupted_while_starting(signum, frame):
    print("interrupted", file=sys.stderr, flush=True)
    os._exit(130)  # nothing was made yet that needs cleaning up


def exit_on_user_error(main):
    """Wrap a script's main so a UserError (or a full disk, or a place it may not write) prints
    `error: ...` and exits with code 2."""
    @functools.wraps(main)
    def wrapper(*args, **kwargs):
        if signal.getsignal(signal.SIGINT) is interrupted_while_starting:  # from here on: KeyboardInterrupt
            signal.signal(signal.SIGINT, signal.default_int_handler)
        try:
            return main(*args, **kwargs)
        except UserError as error:
            print(f"error: {error}", file=sys.stderr)
            sys.exit(2)
        except Exception as error:
            refused = unwritable_place(error)
            if refused is not None:
                print(f"error: {refused.filename}: {refused.strerror.lower()}", file=sys.stderr)
                sys.exit(2)
            if not no_space_left(error):
                raise
            print("error: no space left on device", file=sys.stderr)
            sys.exit(2)
        except KeyboardInterrupt:
            print("interrupted", file=sys.stderr)
            sys.exit(130)
    return wrapper
