"""src/packed_files.py: the container of shards and token streams: the header written last comes
first, a file is whole or absent, equal inputs give equal bytes, and a damaged or missing file is
one line naming it."""
import zlib

import msgpack
import numpy as np
import pytest

from packed_files import (HeaderFirstFile, ShardError, guarded, header_member, is_whole, open_stream, read_header,
                          unpacker)

HEADER = {"format": "test", "samples": 3}
BLOCKS = [{"tokens": np.arange(n, dtype=np.uint16).tobytes()} for n in (5, 7, 9)]


def write(path, header=HEADER, blocks=BLOCKS):
    writer = HeaderFirstFile(path)
    for block in blocks:
        writer.write(block)
    writer.finish(header)
    return path


def read_all(path) -> list:
    with open_stream(path) as stream:
        return guarded(path, lambda: list(unpacker(stream)))


def test_the_header_written_last_is_read_first(tmp_path):
    path = write(tmp_path / "data.msgpack.gz")
    header, *blocks = read_all(path)
    assert header == HEADER | {"body_bytes": header["body_bytes"]} and blocks == BLOCKS
    assert is_whole(path, header)  # the file is as long as the size the header records
    assert [each.name for each in tmp_path.iterdir()] == ["data.msgpack.gz"]  # no temporary file left


def test_equal_inputs_give_byte_identical_files(tmp_path):
    assert write(tmp_path / "a.msgpack.gz").read_bytes() == write(tmp_path / "b.msgpack.gz").read_bytes()


def test_an_aborted_file_leaves_nothing(tmp_path):
    writer = HeaderFirstFile(tmp_path / "data.msgpack.gz")
    writer.write(BLOCKS[0])
    writer.abort()
    assert list(tmp_path.iterdir()) == []


def test_plain_msgpack_reads_as_well_as_gzip(tmp_path):
    path = tmp_path / "plain.msgpack"
    path.write_bytes(b"".join(msgpack.packb(item, use_bin_type=True) for item in [HEADER, *BLOCKS]))
    assert read_all(path) == [HEADER, *BLOCKS]


@pytest.mark.parametrize("damage", ["truncated", "garbage"])
def test_a_damaged_file_is_one_line_naming_it(tmp_path, damage):
    path = write(tmp_path / "data.msgpack.gz")
    whole = path.read_bytes()
    path.write_bytes(whole[:len(whole) // 2] if damage == "truncated" else b"\x1f\x8b" + bytes(range(256)) * 4)
    with pytest.raises(ShardError, match=f"^{path}: truncated or corrupt file \\("):
        read_all(path)


def test_a_missing_file_is_one_line_naming_it(tmp_path):
    with pytest.raises(ShardError, match=f"^{tmp_path / 'absent.msgpack'}: cannot read"):
        open_stream(tmp_path / "absent.msgpack")


def header_compressed_elsewhere(path, level: int, strategy: int) -> dict:
    """Rewrite the file's header member as another zlib (another version, zlib-ng) might compress the
    same header: equal when gunzipped, another length on disk. Returns the header."""
    header = read_header(path)
    whole, ours = path.read_bytes(), header_member(header)
    assert whole.startswith(ours)
    packer = zlib.compressobj(level, zlib.DEFLATED, 31, 9, strategy)  # wbits 31: a gzip member
    theirs = packer.compress(msgpack.packb(header, use_bin_type=True)) + packer.flush()
    assert len(theirs) != len(ours)
    path.write_bytes(theirs + whole[len(ours):])
    return header


@pytest.mark.parametrize("level, strategy", [(0, zlib.Z_DEFAULT_STRATEGY), (9, zlib.Z_HUFFMAN_ONLY)])
def test_a_file_whose_header_another_zlib_compressed_is_whole_and_reads_the_same(tmp_path, level, strategy):
    path = write(tmp_path / "data.msgpack.gz")
    header = header_compressed_elsewhere(path, level, strategy)
    assert is_whole(path, header) and read_all(path) == [header, *BLOCKS]


def test_a_cut_file_is_not_whole_whatever_compressed_its_header(tmp_path):
    path = write(tmp_path / "data.msgpack.gz")
    header = read_header(path)
    whole = path.read_bytes()
    path.write_bytes(whole[:-1])
    assert read_header(path) == header and not is_whole(path, header)
    path.write_bytes(whole + b"\0")  # nor one with bytes after its end
    assert not is_whole(path, header)
    path.write_bytes(whole)
    header = header_compressed_elsewhere(path, 0, zlib.Z_DEFAULT_STRATEGY)
    path.write_bytes(path.read_bytes()[:-1])
    assert not is_whole(path, header)
