"""The file container of prepared data (MLM shards, token-id streams): a gzip stream of msgpack objects,
a header first; written atomically, read with one-line errors for truncated or corrupt files.
"""
import gzip
import io
import os
import secrets
import shutil
import zlib
from pathlib import Path

import msgpack
import numpy as np

from atomic import temp_path
from errors import UserError, naming_a_full_disk

DTYPES = {"uint16": np.uint16, "int32": np.int32}
GZIP_MAGIC = b"\x1f\x8b"
COMPRESS_LEVEL = 6  # zlib's default: level 9 is much slower for a few percent
CORRUPT_ERRORS = (EOFError, zlib.error, gzip.BadGzipFile, msgpack.UnpackException, msgpack.ExtraData,
                  msgpack.FormatError, msgpack.StackError, KeyError, TypeError, ValueError, IndexError)


class ShardError(UserError):
    """A shard or token stream that is truncated, corrupt, or made for another config."""


def dtype_name(dtype) -> str:
    return np.dtype(dtype).name


def corrupt(path, detail) -> ShardError:
    return ShardError(f"{path}: truncated or corrupt file ({detail})")


# ---------------------------------------------------------------------------------------------
# Writing: header last, file complete or absent


class HeaderFirstFile:
    """A gzip msgpack file whose header is written last but stored first, renamed into place whole.

    Objects go to a temporary gzip file next to the target; finish(header) writes a second
    temporary file holding a gzip member with the header followed by the first file's bytes, then
    renames it onto the target. abort() removes both, so an interrupted run leaves nothing.
    """

    def __init__(self, path):
        self.path = Path(path)
        self.body_path = self._temp_path(".body")
        self.body_raw = self.body_path.open("wb")
        # mtime=0 and no file name in the gzip header: equal inputs give byte-identical files.
        self.body = gzip.GzipFile(filename="", fileobj=self.body_raw, mode="wb",
                                  compresslevel=COMPRESS_LEVEL, mtime=0)
        self.packer = msgpack.Packer(use_bin_type=True)

    def _temp_path(self, suffix: str) -> Path:
        """A new temp file next to the target (atomic.temp_path: a later run on this host removes it
        if this process was killed), with the umask's permissions."""
        while True:
            path = temp_path(self.path, f".{secrets.token_hex(6)}{suffix}")
            try:
                os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
                return path
            except FileExistsError:
                continue

    def write(self, obj) -> None:
        with naming_a_full_disk(self.path):
            self.body.write(self.packer.pack(obj))

    def finish(self, header: dict) -> None:
        """Write the file with the header first; the header records the body's size (body_bytes),
        so a reader can tell a whole file from a cut one by its size alone (is_whole)."""
        final_temp = None
        try:
            with naming_a_full_disk(self.path):
                self.body.close()
                self.body_raw.close()
                header = header | {"body_bytes": self.body_path.stat().st_size}
                final_temp = self._temp_path("")
                with final_temp.open("wb") as out:
                    out.write(header_member(header))
                    with self.body_path.open("rb") as body:
                        shutil.copyfileobj(body, out, 1 << 20)
            os.replace(final_temp, self.path)
        finally:
            self.abort()
            if final_temp is not None:
                final_temp.unlink(missing_ok=True)

    def abort(self) -> None:
        """Remove the temporary body, even where closing it fails (a full disk fails the flush)."""
        for close in (self.body.close, self.body_raw.close):
            try:
                close()
            except OSError:
                pass
        self.body_path.unlink(missing_ok=True)


def header_member(header: dict) -> bytes:
    """The gzip member a file starts with: its header, the same bytes for the same header."""
    buffer = io.BytesIO()
    with gzip.GzipFile(filename="", fileobj=buffer, mode="wb", compresslevel=COMPRESS_LEVEL, mtime=0) as head:
        head.write(msgpack.packb(header, use_bin_type=True))
    return buffer.getvalue()


# ---------------------------------------------------------------------------------------------
# Reading


def open_stream(path):
    """Binary reader over the file's msgpack bytes, gunzipping when it starts with gzip magic."""
    try:
        with open(path, "rb") as probe:
            gzipped = probe.read(2) == GZIP_MAGIC
        return gzip.open(path, "rb") if gzipped else open(path, "rb")
    except OSError as error:
        raise ShardError(f"{path}: cannot read ({error.strerror or error})") from None


def unpacker(stream) -> msgpack.Unpacker:
    return msgpack.Unpacker(stream, raw=False, max_buffer_size=256 << 20, read_size=1 << 20)


def guarded(path, reader, *args):
    """reader(*args), with the errors of a damaged file turned into a ShardError naming the file."""
    try:
        return reader(*args)
    except ShardError:
        raise
    except CORRUPT_ERRORS as error:
        raise corrupt(path, f"{error.__class__.__name__}: {error}") from None


def first_member(path) -> tuple[bytes, int] | None:
    """The gunzipped bytes of the file's first gzip member and that member's length on disk; None for a
    file that does not start with a whole gzip member."""
    member = zlib.decompressobj(wbits=31)  # gzip; stops at the end of the first member
    data, read = b"", 0
    with open(path, "rb") as file:
        if file.read(2) != GZIP_MAGIC:
            return None
        file.seek(0)
        while not member.eof and (raw := file.read(1 << 16)):
            read += len(raw)
            data += member.decompress(raw)
    return (data, read - len(member.unused_data)) if member.eof else None


def read_header(path) -> dict | None:
    """The header a file of ours starts with, from its first gzip member alone (a file cut short
    further on still shows it); None for another file (the original project's shards)."""
    try:
        data, _ = first_member(path) or (b"", 0)
        if not data or not (0x80 <= data[0] <= 0x8F or data[0] in (0xDE, 0xDF)):  # a map
            return None
        header = msgpack.unpackb(data, raw=False)
    except (OSError, *CORRUPT_ERRORS):
        return None
    return header if isinstance(header, dict) else None


def is_whole(path, header: dict) -> bool:
    """Whether the file is as long as its header member plus the body size the header records
    (body_bytes): a cut copy is not. The header member's length is the one on disk, not that of
    compressing the header again here: another zlib (another version, zlib-ng) gives other bytes."""
    body_bytes = header.get("body_bytes")
    if not isinstance(body_bytes, int):
        return False
    try:
        _, header_bytes = first_member(path) or (b"", None)
    except zlib.error:  # a damaged header member
        return False
    return header_bytes is not None and Path(path).stat().st_size == header_bytes + body_bytes
