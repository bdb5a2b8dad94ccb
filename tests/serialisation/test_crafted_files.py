"""Checkpoints crafted to lie: sizes beyond the file, malformed headers, bad
checksums in every kind of entry. Loading must fail with a `SerialisationError`
naming the file and what is wrong, and must not allocate what the file claims."""

from __future__ import annotations

import dataclasses
import io
import json
import re
import struct
import tracemalloc
import zlib
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import filterax as fx

# --- a checkpoint taken apart and put back together -----------------------------------


@dataclasses.dataclass
class Entry:
    meta: dict
    data: bytes
    data_crc: int | None = None  # None: the right one


@dataclasses.dataclass
class Checkpoint:
    """A checkpoint parsed as `docs/serialisation-format.md` describes it, to be
    changed and rebuilt with consistent checksums (unless told otherwise)."""

    version: int
    flags: int
    header: bytes
    entries: list[Entry]

    @classmethod
    def parse(cls, data: bytes) -> Checkpoint:
        _, version, flags, length = struct.unpack_from("<8sIIQ", data)
        header = data[24 : 24 + length]
        offset = 24 + length + 4
        entries = []
        for _ in json.loads(header)["leaves"]:
            (size,) = struct.unpack_from("<I", data, offset)
            meta = json.loads(data[offset + 4 : offset + 4 + size])
            start = offset + 4 + size + 4
            entries.append(Entry(meta, data[start : start + meta["nbytes"]]))
            offset = start + meta["nbytes"] + 4
        return cls(version, flags, header, entries)

    def build(self, *, header_crc: bool = True) -> bytes:
        head = struct.pack(
            "<8sIIQ", b"\x89FLTRAX\n", self.version, self.flags, len(self.header)
        )
        head += self.header
        parts = [head, struct.pack("<I", zlib.crc32(head) if header_crc else 0)]
        for entry in self.entries:
            raw = json.dumps(entry.meta).encode()
            framed = struct.pack("<I", len(raw)) + raw
            parts += [framed, struct.pack("<I", zlib.crc32(framed)), entry.data]
            crc = zlib.crc32(entry.data) if entry.data_crc is None else entry.data_crc
            parts.append(struct.pack("<I", crc))
        footer = b"FLTRXEND" + struct.pack("<Q", len(self.entries))
        parts += [footer, struct.pack("<I", zlib.crc32(footer))]
        return b"".join(parts)


def save(tree: Any, **kwargs: Any) -> bytes:
    file = io.BytesIO()
    fx.tree_serialise_leaves(file, tree, **kwargs)
    return file.getvalue()


def failing_load_peak(load: Callable[[], Any]) -> tuple[int, str]:
    """The peak bytes allocated while `load()` fails with a SerialisationError,
    and the error's message."""
    tracemalloc.start()
    try:
        with pytest.raises(fx.SerialisationError) as error:
            load()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return peak, str(error.value)


# --- sizes beyond the file ---------------------------------------------------------------


def raw_reader(f: Any, like: Any) -> Any:
    return f.read()


HUGE = 10**12  # a terabyte, in a file of a few hundred bytes


@pytest.mark.parametrize(
    "tree, like, filter_spec",
    [
        ([7], [0], fx.default_deserialise_filter_spec),
        ([jnp.ones(3)], [jnp.zeros(3)], fx.default_deserialise_filter_spec),
        (["relu"], ["relu"], fx.default_deserialise_filter_spec),
        (["raw"], [0], raw_reader),
    ],
    ids=["int", "array", "object", "raw"],
)
@pytest.mark.parametrize("nbytes", [2**31, HUGE])
@pytest.mark.parametrize("seekable", [True, False], ids=["seekable", "stream"])
def test_an_entry_claiming_more_data_than_the_file_holds_allocates_nothing(
    tree: list,
    like: list,
    filter_spec: Any,
    nbytes: int,
    seekable: bool,
    read_only_stream: Any,
) -> None:
    if filter_spec is raw_reader:
        data = save(tree, filter_spec=lambda f, leaf: f.write(leaf.encode()))
    else:
        data = save(tree)
    checkpoint = Checkpoint.parse(data)
    checkpoint.entries[0].meta["nbytes"] = nbytes
    crafted = checkpoint.build()
    assert len(crafted) < 1000

    def load() -> Any:
        stream = io.BytesIO(crafted) if seekable else read_only_stream(crafted)
        return fx.tree_deserialise_leaves(stream, like, filter_spec)

    peak, message = failing_load_peak(load)
    assert peak < 2**24
    assert "entry [0]" in message
    if seekable:
        assert f"needs {nbytes + 4} bytes, but only" in message


def test_an_array_entry_whose_size_disagrees_with_its_shape_allocates_nothing() -> None:
    checkpoint = Checkpoint.parse(save([jnp.ones(3)]))
    checkpoint.entries[0].meta["shape"] = [10**9]
    like = [jax.ShapeDtypeStruct((10**9,), jnp.float32)]
    peak, message = failing_load_peak(
        lambda: fx.tree_deserialise_leaves(io.BytesIO(checkpoint.build()), like)
    )
    assert peak < 2**24
    assert (
        "entry [0] is corrupted (12 bytes of data for float32[1000000000])" in message
    )


def test_a_header_claiming_more_bytes_than_the_file_holds_is_named() -> None:
    data = bytearray(save([1.0]))
    data[16:24] = struct.pack("<Q", 10**12)
    with pytest.raises(
        fx.SerialisationError,
        match=r"<BytesIO>: file is truncated or corrupted: the header needs "
        r"1000000000004 bytes, but only \d+ remain",
    ):
        fx.tree_deserialise_leaves(io.BytesIO(bytes(data)), [0.0])


# --- the header's schema --------------------------------------------------------------------


@pytest.mark.parametrize(
    "header, problem",
    [
        (b"not json", "it is not valid JSON"),
        (b"\xff\xfe", "it is not valid JSON"),
        (b'{"leaves": 5}', '"leaves" is a JSON number, not a list'),
        (b"[1, 2]", "it is a JSON list, not an object"),
        (b'"leaves"', "it is a JSON string, not an object"),
        (b"{}", 'it has no "leaves" field'),
        (b'{"leaves": ["[0]", 7]}', r'"leaves"\[1\] is a JSON number, not a string'),
        (b'{"leaves": [null]}', r'"leaves"\[0\] is null, not a string'),
    ],
)
def test_a_malformed_header_is_a_clear_error(header: bytes, problem: str) -> None:
    checkpoint = Checkpoint.parse(save([1.0]))
    checkpoint.header = header
    with pytest.raises(
        fx.SerialisationError,
        match=rf"^<BytesIO>: the header is malformed: {problem}.*expected a JSON "
        r'object \{"leaves": \[key path, \.\.\.\]\}\.$',
    ):
        fx.tree_deserialise_leaves(io.BytesIO(checkpoint.build()), [0.0])


def test_a_malformed_header_in_a_file_names_the_file(tmp_path: Any) -> None:
    checkpoint = Checkpoint.parse(save([1.0]))
    checkpoint.header = b'{"leaves": 5}'
    path = tmp_path / "model.eqx"
    path.write_bytes(checkpoint.build())
    with pytest.raises(
        fx.SerialisationError,
        match=rf"^{re.escape(repr(str(path)))}: the header is malformed",
    ):
        fx.tree_deserialise_leaves(path, [0.0])


def test_extra_header_fields_are_ignored() -> None:
    checkpoint = Checkpoint.parse(save([1.0]))
    checkpoint.header = b'{"leaves": ["[0]"], "written_by": "a newer filterax"}'
    assert fx.tree_deserialise_leaves(io.BytesIO(checkpoint.build()), [0.0]) == [1.0]


@pytest.mark.parametrize(
    "change, problem",
    [
        ({"shape": "3"}, r'"shape" is "3", not a list of non-negative integers'),
        ({"shape": [-1]}, r'"shape" is \[-1\], not a list'),
        ({"shape": [1.5]}, r'"shape" is \[1.5\], not a list'),
        ({"nbytes": -4}, r'"nbytes" is -4, not a non-negative integer'),
        ({"nbytes": True}, r'"nbytes" is true, not a non-negative integer'),
        ({"kind": 3}, r'"kind" is a JSON number, not a string'),
        ({"impl": ["x"]}, r'"impl" is a JSON list, not a string'),
        ({"path": None}, r'"path" is null, not a string'),
    ],
)
def test_a_malformed_entry_header_is_a_clear_error(change: dict, problem: str) -> None:
    checkpoint = Checkpoint.parse(save({"w": jnp.ones(3)}))
    checkpoint.entries[0].meta.update(change)
    with pytest.raises(
        fx.SerialisationError,
        match=rf"^<BytesIO>: the header of entry \['w'\] is malformed: {problem}",
    ):
        fx.tree_deserialise_leaves(io.BytesIO(checkpoint.build()), {"w": jnp.zeros(3)})


def test_an_entry_header_without_a_field_is_a_clear_error() -> None:
    checkpoint = Checkpoint.parse(save({"w": jnp.ones(3)}))
    del checkpoint.entries[0].meta["dtype"]
    with pytest.raises(
        fx.SerialisationError, match=r'malformed: it has no "dtype" field'
    ):
        fx.tree_deserialise_leaves(io.BytesIO(checkpoint.build()), {"w": jnp.zeros(3)})


# --- checksums ---------------------------------------------------------------------------------


def test_a_corrupted_version_is_blamed_on_corruption_not_on_a_newer_writer() -> None:
    data = bytearray(save([1.0]))
    data[8] ^= 0x04  # version 1 becomes 5; the header checksum no longer matches
    with pytest.raises(fx.SerialisationError) as error:
        fx.tree_deserialise_leaves(io.BytesIO(bytes(data)), [0.0])
    assert "header is corrupted (checksum mismatch)" in str(error.value)
    assert "version" not in str(error.value)


@pytest.mark.parametrize(
    "tree, like",
    [
        (["relu"], ["gelu"]),  # an object entry: no data, checksum 0
        ([7], [0]),
        ([jnp.ones(2)], [jnp.zeros(2)]),
        ([jax.random.key(1)], [jax.random.key(0)]),
    ],
    ids=["object", "int", "array", "key"],
)
def test_the_data_checksum_of_every_entry_kind_is_checked(
    tree: list, like: list
) -> None:
    checkpoint = Checkpoint.parse(save(tree))
    checkpoint.entries[0].data_crc = 0xDEADBEEF
    with pytest.raises(
        fx.SerialisationError,
        match=r"the data of entry \[0\] is corrupted \(checksum mismatch\)",
    ):
        fx.tree_deserialise_leaves(io.BytesIO(checkpoint.build()), like)


def test_a_skipped_entry_is_checked_when_the_stream_is_read_through(
    read_only_stream,
) -> None:
    checkpoint = Checkpoint.parse(save({"a": np.arange(3), "b": np.ones(2)}))
    checkpoint.entries[0].data_crc = 0xDEADBEEF
    keep_a = {"a": lambda f, like: like, "b": fx.default_deserialise_filter_spec}
    like = {"a": np.zeros(3, int), "b": np.zeros(2)}
    with pytest.raises(fx.SerialisationError, match=r"entry \['a'\] is corrupted"):
        fx.tree_deserialise_leaves(read_only_stream(checkpoint.build()), like, keep_a)


def test_serialisation_errors_are_also_runtime_errors() -> None:
    with pytest.raises(RuntimeError, match="not a filterax checkpoint"):
        fx.tree_deserialise_leaves(io.BytesIO(b"garbage!" * 4), [0.0])
