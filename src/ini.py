"""Reading a run's settings: INI files, then `--key value` overrides, into a validated Config.

The INI dialect: `key = value` or `key: value`, a key alone on a line for true, `#` comments,
`45_000`; older config files load unchanged (legacy.py has their other key names and the keys that
mean nothing now), and so does a ./local_config.ini beside ./config.ini that overrides it.
"""
import re
from pathlib import Path
from typing import Any

from config import FIELD_TYPES, INI_KEYS, Config, known_name, typed_value
from errors import UserError

LOCAL_CONFIG = Path("local_config.ini")  # read after ./config.ini, overriding it


def load_config(path: Path | None, overrides: list[str]) -> Config:
    """Read the INI file (./config.ini, then ./local_config.ini if there, when path is None),
    apply overrides; the Config validates the result."""
    paths = config_files(path)
    values, origins = {}, {}
    for file in paths:  # a later file overrides an earlier one
        file_values, file_origins = read_ini(file)
        values |= file_values
        origins |= file_origins
    override_values, override_origins = parse_overrides(overrides)
    values |= override_values
    origins |= override_origins
    return Config(**values, sources=tuple(map(str, paths)), origins=origins)


def config_files(path: Path | None) -> list[Path]:
    """The files to read: the one named, or ./config.ini and ./local_config.ini where it exists."""
    if path is not None:
        return [find_config_file(path)]
    local = [LOCAL_CONFIG] if LOCAL_CONFIG.is_file() else []
    return [find_config_file(None)] + local


def find_config_file(path: Path | None) -> Path:
    if path is None:
        path = Path("config.ini")
        if not path.is_file():
            raise UserError(f"config.ini not found in {Path.cwd()}: "
                            "copy config.ini.example to config.ini or pass --config PATH")
    elif not Path(path).is_file():
        raise UserError(f"{path}: config file not found")
    return Path(path)


def read_ini(path: Path) -> tuple[dict[str, Any], dict[str, str]]:
    """Typed values and their origins ('file:line') for the keys the file sets."""
    values, origins, first_lines = {}, {}, {}
    for number, line in enumerate(read_text(path).splitlines(), start=1):
        line = line.split("#", 1)[0].strip()
        if not line or (line.startswith("[") and line.endswith("]")):
            continue  # sections carry no meaning here; tolerated for old files
        origin = f"{path}:{number}"
        key, text = split_key_value(line, origin)
        name = known_name(key, origin)
        if name is None:
            continue
        if text is None:  # a key alone on a line: a flag set to true
            if FIELD_TYPES[name] is not bool:
                raise UserError(f"{origin}: key '{INI_KEYS[name]}' has no value (only true/false keys may stand alone)")
            text = "true"
        if name in first_lines:
            raise UserError(f"{origin}: key '{INI_KEYS[name]}' given twice "
                            f"(first on line {first_lines[name]})")
        first_lines[name], origins[name] = number, origin
        values[name] = typed_value(name, text, origin)
    return values, origins


def read_text(path: Path) -> str:
    try:  # utf-8-sig: a byte-order mark (Windows editors write one) is not part of the first key
        return path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError:
        raise UserError(f"{path}: not a UTF-8 text file") from None


def split_key_value(line: str, origin: str) -> tuple[str, str | None]:
    """Split at the first '=' or ':', so `device = cuda:0` and `compile: true` both work; a
    single word alone gives (key, None)."""
    separator = re.search("[=:]", line)
    if separator is None:
        if re.fullmatch(r"[A-Za-z][A-Za-z0-9_-]*", line):
            return line, None
        raise UserError(f"{origin}: line is not 'key = value'")
    if not line[:separator.start()].strip():
        raise UserError(f"{origin}: line is not 'key = value'")
    return line[:separator.start()].strip(), line[separator.end():].strip()


def parse_overrides(args: list[str]) -> tuple[dict[str, Any], dict[str, str]]:
    """`--key value` or `--key=value`; a bare boolean flag (`--compile`) means true."""
    values, origins = {}, {}
    position = 0
    while position < len(args):
        arg = args[position]
        position += 1
        if not arg.startswith("-") or arg == "-":
            raise UserError(f"{arg!r}: expected an option like --key value")
        key, has_value, text = arg.lstrip("-").partition("=")
        name = known_name(key, origin=None)
        option = "--" + (name or key.lower()).replace("_", "-")
        if not has_value:
            if position < len(args) and not args[position].startswith("--"):
                text = args[position]
                position += 1
            elif name is None or FIELD_TYPES[name] is bool:  # a key that means nothing here may stand alone too
                text = "true"
            else:
                raise UserError(f"{option}: missing value")
        if name is None:
            continue
        if name in values:  # as in a file: the same key twice is a mistake, not an override
            raise UserError(f"{option}: given twice on the command line")
        values[name], origins[name] = typed_value(name, text, option), option
    return values, origins
