"""The framing of filterax's file format: header, entries, footer, checksums,
validation.

This module knows nothing about pytrees or JAX: it reads and writes a header
(the list of key paths) and a sequence of entries, each described by an
[`EntryMeta`][] and followed by its data. The format is specified in
`docs/serialisation-format.md`, and summarised in `_filterax.py`.

Every length read from a file is checked before it is used: against the bytes
left in the file when the stream knows them (see `_source.py`), and the
entry lengths also against their entry header's checksum.
"""

from __future__ import annotations

import dataclasses
import json
import struct
import sys
import zlib
from typing import IO, Any

import jax.numpy as jnp
import numpy as np

from ._kinds import ARRAY_KINDS, KEY_ARRAY, OBJECT, PYTHON_SCALAR_KINDS, RAW
from ._messages import SerialisationError, shape_str, with_article
from ._source import CHUNK, Source

__all__ = [
    "ARRAY_KINDS",
    "BIG_ENDIAN_HOST",
    "MAGIC",
    "EntryMeta",
    "FormatReader",
    "FormatWriter",
    "dtype_from_name",
    "dtype_name",
]

MAGIC = b"\x89FLTRAX\n"
FOOTER_MAGIC = b"FLTRXEND"
FORMAT_VERSION = 1

# `<` everywhere: the format is little-endian whatever the host is.
_PREAMBLE = struct.Struct("<8sII")  # magic, version, flags
_U64 = struct.Struct("<Q")
_U32 = struct.Struct("<I")
_FOOTER = struct.Struct("<8sQ")  # footer magic, entry count
# Metadata lengths above these can only come from corruption. They matter
# where the stream's length is unknown; otherwise that length is the bound.
_MAX_HEADER_BYTES = 1 << 32
_MAX_ENTRY_META_BYTES = 1 << 24
BIG_ENDIAN_HOST = sys.byteorder == "big"


def _json_type(value: Any) -> str:
    if isinstance(value, bool):
        return "a JSON boolean"
    if value is None:
        return "null"
    for cls, name in (
        (str, "a JSON string"),
        ((int, float), "a JSON number"),
        (list, "a JSON list"),
        (dict, "a JSON object"),
    ):
        if isinstance(value, cls):
            return name
    return type(value).__name__


def _parse_json(raw: bytes) -> tuple[Any, str | None]:
    """The decoded document, or a description of why `raw` is not JSON."""
    try:
        return json.loads(raw), None
    except ValueError as error:  # UnicodeDecodeError included
        return None, f"it is not valid JSON ({error})"


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _entry_problem(record: Any) -> str | None:
    """What is wrong with a decoded entry header, or `None`."""
    if not isinstance(record, dict):
        return f"it is {_json_type(record)}, not an object"
    for field in ("path", "kind", "dtype", "shape", "nbytes"):
        if field not in record:
            return f'it has no "{field}" field'
    for field in ("path", "kind", "dtype", "impl", "type"):
        if field in record and not isinstance(record[field], str):
            return f'"{field}" is {_json_type(record[field])}, not a string'
    shape = record["shape"]
    if not isinstance(shape, list) or not all(map(_is_count, shape)):
        return (
            f'"shape" is {json.dumps(shape)[:80]}, not a list of non-negative integers'
        )
    if not _is_count(record["nbytes"]):
        return f'"nbytes" is {json.dumps(record["nbytes"])[:80]}, not a non-negative integer'
    return None


@dataclasses.dataclass(frozen=True)
class EntryMeta:
    """What an entry header says about the data that follows it."""

    path: str  # `jax.tree_util.keystr` of the leaf
    kind: str  # type tag, see `_filterax.py`
    dtype: str  # dtype name (`dtype_name`), or "" for entries without one
    shape: tuple[int, ...]
    nbytes: int
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)  # e.g. "impl"

    def describe(self) -> str:
        """What the entry holds, for error messages."""
        if self.kind == KEY_ARRAY:
            data = shape_str(self.dtype, self.shape)
            return f"a {self.extra.get('impl')} key array (key data {data})"
        if self.kind in ARRAY_KINDS:
            return with_article(f"{shape_str(self.dtype, self.shape)} array")
        if self.kind == OBJECT:
            return f"no data (a {self.extra.get('type', 'non-array')} leaf was saved)"
        if self.kind == RAW:
            return f"{self.nbytes} bytes written by a custom filter_spec callable"
        if self.kind in PYTHON_SCALAR_KINDS:
            return f"a Python {self.kind}"
        return f"an entry of unknown kind {self.kind!r}"

    def to_json(self) -> bytes:
        record = {
            "path": self.path,
            "kind": self.kind,
            "dtype": self.dtype,
            "shape": list(self.shape),
            "nbytes": self.nbytes,
            **self.extra,
        }
        return json.dumps(record, separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, raw: bytes, source: Source, what: str) -> EntryMeta:
        record, problem = _parse_json(raw)
        problem = problem or _entry_problem(record)
        if problem is not None:
            raise source.fail(f"{what} is malformed: {problem}.")
        record = dict(record)
        return cls(
            record.pop("path"),
            record.pop("kind"),
            record.pop("dtype"),
            tuple(record.pop("shape")),
            record.pop("nbytes"),
            record,
        )


def _header_problem(document: Any) -> str | None:
    if not isinstance(document, dict):
        return f"it is {_json_type(document)}, not an object"
    if "leaves" not in document:
        return 'it has no "leaves" field'
    leaves = document["leaves"]
    if not isinstance(leaves, list):
        return f'"leaves" is {_json_type(leaves)}, not a list'
    for index, path in enumerate(leaves):
        if not isinstance(path, str):
            return f'"leaves"[{index}] is {_json_type(path)}, not a string'
    return None


_DTYPES_BY_NAME: dict[str, np.dtype] = {}


def dtype_name(dtype: np.dtype) -> str | None:
    """The name stored for `dtype`, or `None` when the format cannot hold it
    (object, string, structured and other non-numeric dtypes)."""
    name = dtype.name
    try:
        known = dtype_from_name(name)
    except TypeError:
        return None
    # Compare without byte order: data is always stored little-endian.
    same = known == (dtype.newbyteorder("=") if dtype.byteorder == ">" else dtype)
    return name if same and known.kind in "biufcV" and known.fields is None else None


def dtype_from_name(name: str) -> np.dtype:
    """The native dtype called `name` (NumPy's or one of `ml_dtypes`' such as
    `bfloat16`); `TypeError` if there is none."""
    try:
        return _DTYPES_BY_NAME[name]
    except KeyError:
        pass
    try:
        dtype = np.dtype(jnp.dtype(name))
    except (TypeError, ValueError, AttributeError):
        raise TypeError(f"unknown dtype {name!r}") from None
    if dtype.kind == "V" and dtype.name != name:  # e.g. "V2" for unknown names
        raise TypeError(f"unknown dtype {name!r}")
    _DTYPES_BY_NAME[name] = dtype
    return dtype


def _crc(*parts: bytes | bytearray) -> int:
    crc = 0
    for part in parts:
        crc = zlib.crc32(part, crc)
    return crc


class FormatWriter:
    """Writes the framing of one checkpoint to a binary stream, in order:
    `write_header`, then `write_entry` once per path, then `write_footer`."""

    def __init__(self, stream: IO[bytes]):
        self._stream = stream
        self._count = 0

    def _write_all(self, data: bytes | memoryview) -> None:
        view = memoryview(data).cast("B")
        while view:
            written = self._stream.write(view)
            if written is None:  # a non-blocking raw stream that is full
                raise BlockingIOError("the file object would block")
            view = view[written:]

    def write_header(self, paths: list[str]) -> None:
        body = json.dumps({"leaves": paths}, separators=(",", ":")).encode()
        preamble = _PREAMBLE.pack(MAGIC, FORMAT_VERSION, 0)
        length = _U64.pack(len(body))
        self._write_all(
            preamble + length + body + _U32.pack(_crc(preamble, length, body))
        )

    def write_entry(self, meta: EntryMeta, data: bytes | memoryview) -> None:
        """Writes `meta` and then `data`, which must be `meta.nbytes` long."""
        view = memoryview(data).cast("B")
        if len(view) != meta.nbytes:  # a bug in the caller, not in the file
            raise AssertionError(f"{meta.path}: {len(view)} bytes for {meta.nbytes}")
        raw = meta.to_json()
        length = _U32.pack(len(raw))
        self._write_all(length + raw + _U32.pack(_crc(length, raw)))
        crc = 0
        for start in range(0, len(view), CHUNK):
            chunk = view[start : start + CHUNK]
            crc = zlib.crc32(chunk, crc)
            self._write_all(chunk)
        self._write_all(_U32.pack(crc))
        self._count += 1

    def write_footer(self) -> None:
        footer = _FOOTER.pack(FOOTER_MAGIC, self._count)
        self._write_all(footer + _U32.pack(_crc(footer)))


class FormatReader:
    """Reads one checkpoint from a `Source`, in the order it was written."""

    def __init__(self, source: Source):
        self.source = source
        self.name = source.name
        self._count = 0

    def _fail(self, message: str) -> SerialisationError:
        return self.source.fail(message)

    def read_header(self) -> list[str]:
        """Checks magic number, header checksum, version and flags, and the
        header's schema; returns the key paths of the entries, in file order.

        The checksum comes before the version: every format version keeps
        this framing, so a version number is believed only once it is known
        to be intact."""
        source = self.source
        preamble = source.read_exact(_PREAMBLE.size, "the preamble")
        magic, version, flags = _PREAMBLE.unpack(preamble)
        if magic != MAGIC:
            raise self._fail(
                f"not a filterax checkpoint (starts with {bytes(magic)!r}, "
                f"expected {MAGIC!r})."
            )
        length = source.read_exact(_U64.size, "the header")
        (size,) = _U64.unpack(length)
        source.require(size + _U32.size, "the header")
        if size > _MAX_HEADER_BYTES:
            raise self._fail(f"header is corrupted (claims {size} bytes).")
        body = source.read_exact(size, "the header")
        (crc,) = _U32.unpack(source.read_exact(_U32.size, "the header checksum"))
        if crc != _crc(preamble, length, body):
            raise self._fail("header is corrupted (checksum mismatch).")
        if version != FORMAT_VERSION:
            raise self._fail(
                f"format version {version} is not supported (this filterax "
                f"reads version {FORMAT_VERSION}); it was written by a newer "
                "filterax."
            )
        if flags != 0:
            raise self._fail(
                f"uses format flags {flags:#x}, which this filterax does not "
                "understand; it was probably written by a newer filterax."
            )
        document, problem = _parse_json(bytes(body))
        problem = problem or _header_problem(document)
        if problem is not None:
            raise self._fail(
                f"the header is malformed: {problem}; expected a JSON object "
                '{"leaves": [key path, ...]}.'
            )
        return list(document["leaves"])

    def read_entry_meta(self, expected_path: str) -> EntryMeta:
        """Reads and checks the next entry header, which must be for
        `expected_path`, and that the file can hold the data it announces."""
        source = self.source
        what = f"the header of entry {expected_path}"
        length = source.read_exact(_U32.size, what)
        (size,) = _U32.unpack(length)
        source.require(size + _U32.size, what)
        if size > _MAX_ENTRY_META_BYTES:
            raise self._fail(f"{what} is corrupted (claims {size} bytes).")
        raw = source.read_exact(size, what)
        (crc,) = _U32.unpack(source.read_exact(_U32.size, what))
        if crc != _crc(length, raw):
            raise self._fail(f"{what} is corrupted (checksum mismatch).")
        meta = EntryMeta.from_json(bytes(raw), source, what)
        if meta.path != expected_path:
            raise self._fail(
                f"expected entry {expected_path} next, found entry {meta.path}; "
                "the file is inconsistent with its own header."
            )
        source.require(meta.nbytes + _U32.size, f"the data of entry {meta.path}")
        self._count += 1
        return meta

    def can_read_into(self, meta: EntryMeta) -> bool:
        """Whether a buffer of `meta.nbytes` may be allocated before reading
        (see `Source.can_allocate`)."""
        return self.source.can_allocate(meta.nbytes)

    def _check(self, meta: EntryMeta, crc: int) -> None:
        what = f"the data of entry {meta.path}"
        (stored,) = _U32.unpack(self.source.read_exact(_U32.size, what))
        if stored != crc:
            raise self._fail(f"{what} is corrupted (checksum mismatch).")

    def read_data_into(self, meta: EntryMeta, buffer: np.ndarray | bytearray) -> None:
        """Fills `buffer` (exactly `meta.nbytes` long) with the entry's data,
        checking its checksum."""
        view = (
            buffer.data if isinstance(buffer, np.ndarray) else memoryview(buffer)
        ).cast("B")
        if len(view) != meta.nbytes:  # a bug in the caller, not in the file
            raise AssertionError(f"{meta.path}: {len(view)} bytes for {meta.nbytes}")
        what = f"the data of entry {meta.path}"
        crc = 0
        for start in range(0, len(view), CHUNK):
            chunk = view[start : start + CHUNK]
            self.source.read_exact_into(chunk, what)
            crc = zlib.crc32(chunk, crc)  # while the chunk is still in cache
        self._check(meta, crc)

    def read_data(self, meta: EntryMeta) -> bytearray:
        """The entry's data, checked; allocated as it arrives when the
        stream's length is unknown."""
        data = self.source.read_exact(meta.nbytes, f"the data of entry {meta.path}")
        self._check(meta, zlib.crc32(data))
        return data

    def skip_data(self, meta: EntryMeta) -> None:
        """Moves past the entry's data and its checksum. A seekable stream
        seeks (the data is not checked); any other is read through, checking
        the checksum on the way."""
        what = f"the data of entry {meta.path}"
        if self.source.seekable:
            self.source.skip(meta.nbytes + _U32.size, what)
            return
        scratch = memoryview(bytearray(min(meta.nbytes, CHUNK)))
        crc, left = 0, meta.nbytes
        while left:
            step = min(left, len(scratch))
            self.source.read_exact_into(scratch[:step], what)
            crc = zlib.crc32(scratch[:step], crc)
            left -= step
        self._check(meta, crc)

    def read_footer(self) -> None:
        footer = self.source.read_exact(_FOOTER.size, "the footer")
        (crc,) = _U32.unpack(self.source.read_exact(_U32.size, "the footer"))
        magic, count = _FOOTER.unpack(footer)
        if magic != FOOTER_MAGIC or crc != _crc(footer) or count != self._count:
            raise self._fail("footer is corrupted or the entries are inconsistent.")
