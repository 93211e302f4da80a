"""User-facing errors: one line naming the file, key or value, exit code 2, no traceback."""
import functools
import sys


class UserError(Exception):
    """A mistake in the user's input (file, key, value), reported in one line."""


def exit_on_user_error(main):
    """Wrap a script's main so a UserError prints `error: ...` and exits with code 2."""
    @functools.wraps(main)
    def wrapper(*args, **kwargs):
        try:
            return main(*args, **kwargs)
        except UserError as error:
            print(f"error: {error}", file=sys.stderr)
            sys.exit(2)
        except KeyboardInterrupt:
            print("interrupted", file=sys.stderr)
            sys.exit(130)
    return wrapper
