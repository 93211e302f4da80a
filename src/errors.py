"""User-facing errors: one line naming the file, key or value, exit code 2, no traceback."""
import errno
import functools
import sys
from contextlib import contextmanager


class UserError(Exception):
    """A mistake in the user's input (file, key, value), reported in one line."""


def no_space_left(error: BaseException | None) -> bool:
    """Whether the error or one it came from is ENOSPC (torch.save wraps it in a RuntimeError)."""
    while error is not None:
        if isinstance(error, OSError) and error.errno == errno.ENOSPC:
            return True
        error = error.__cause__ or error.__context__
    return False


@contextmanager
def naming_a_full_disk(path):
    """A full disk while writing `path` becomes a UserError naming it."""
    try:
        yield
    except Exception as error:
        if no_space_left(error):
            raise UserError(f"no space left on device writing {path}") from None
        raise


def exit_on_user_error(main):
    """Wrap a script's main so a UserError (or a full disk) prints `error: ...` and exits with code 2."""
    @functools.wraps(main)
    def wrapper(*args, **kwargs):
        try:
            return main(*args, **kwargs)
        except UserError as error:
            print(f"error: {error}", file=sys.stderr)
            sys.exit(2)
        except Exception as error:
            if not no_space_left(error):
                raise
            print("error: no space left on device", file=sys.stderr)
            sys.exit(2)
        except KeyboardInterrupt:
            print("interrupted", file=sys.stderr)
            sys.exit(130)
    return wrapper
