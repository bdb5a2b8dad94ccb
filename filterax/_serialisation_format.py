"""The on-disk format of `tree_serialise_leaves`: framing, checksums, validation.

This module knows nothing about pytrees or JAX: it reads and writes a header
(the list of key paths) and a sequence of entries, each described by an
[`EntryMeta`][] and followed by its data. The format itself is specified in
`docs/serialisation-format.md` and, briefly, in `filterax/_serialisation.py`.

Entry lengths are used only once their header's checksum has matched; the
header length, which must be read before its checksum, is capped and read in
chunks. So a corrupted file never makes the reader allocate much more than the
file holds, or skip an absurd amount.
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

__all__ = [
    "ARRAY_KINDS",
    "FORMAT_VERSION",
    "MAGIC",
    "EntryMeta",
    "FormatReader",
    "FormatWriter",
    "SerialisationError",
    "dtype_from_name",
    "dtype_name",
    "shape_str",
    "with_article",
]

MAGIC = b"\x89FLTRAX\n"
FOOTER_MAGIC = b"FLTRXEND"
FORMAT_VERSION = 1

# `<` everywhere: the format is little-endian whatever the host is.
_PREAMBLE = struct.Struct("<8sII")  # magic, version, flags
_U64 = struct.Struct("<Q")
_U32 = struct.Struct("<I")
_FOOTER = struct.Struct("<8sQ")  # footer magic, entry count
# Data moves in chunks: the checksum of a chunk is taken while it is still in
# cache, and a non-blocking raw stream never sees one huge write.
_CHUNK = 1 << 22
# Metadata lengths above these can only come from corruption; refusing them
# keeps a damaged length field from triggering a huge allocation.
_MAX_HEADER_BYTES = 1 << 32
_MAX_ENTRY_META_BYTES = 1 << 24
BIG_ENDIAN_HOST = sys.byteorder == "big"


class SerialisationError(ValueError):
    """Raised when a file cannot be read as a filterax checkpoint, or does not
    match the `like` pytree it is loaded into.

    The message names the file and, where there is one, the key path of the
    offending leaf. Being a `ValueError`, it is caught by `except ValueError`.

    **Arguments:** the message, as for `ValueError`.

    **Returns:** an exception instance, to raise.

    ```python
    >>> import io
    >>> import filterax as fx
    >>> try:
    ...     fx.tree_deserialise_leaves(io.BytesIO(b"not a checkpoint"), [1.0])
    ... except fx.SerialisationError as error:
    ...     print(error)
    <BytesIO>: not a filterax checkpoint (starts with b'not a ch', expected b'\\x89FLTRAX\\n'); was it written by `tree_serialise_leaves`?

    ```
    """


# Kinds of entry that hold an ordinary (non-key) array; they load into one another.
ARRAY_KINDS = frozenset({"jax_array", "numpy_array", "numpy_scalar"})


def shape_str(dtype: str, shape: tuple[int, ...]) -> str:
    return f"{dtype}[{','.join(map(str, shape))}]"


def with_article(phrase: str) -> str:
    # "a uint32 array" is said with a consonant sound, "an int32 array" not.
    vowel_sound = phrase[:1] in "aeiou" and not phrase.startswith(("uint", "uni"))
    return f"{'an' if vowel_sound else 'a'} {phrase}"


@dataclasses.dataclass(frozen=True)
class EntryMeta:
    """What an entry header says about the data that follows it."""

    path: str  # `jax.tree_util.keystr` of the leaf
    kind: str  # type tag, see `filterax/_serialisation.py`
    dtype: str  # dtype name (`dtype_name`), or "" for entries without one
    shape: tuple[int, ...]
    nbytes: int
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)  # e.g. "impl"

    def describe(self) -> str:
        """What the entry holds, for error messages."""
        if self.kind == "key_array":
            data = shape_str(self.dtype, self.shape)
            return f"a {self.extra.get('impl')} key array (key data {data})"
        if self.kind in ARRAY_KINDS:
            return with_article(f"{shape_str(self.dtype, self.shape)} array")
        if self.kind == "object":
            return f"no data (a {self.extra.get('type', 'non-array')} leaf was saved)"
        if self.kind == "raw":
            return f"{self.nbytes} bytes written by a custom filter_spec callable"
        if self.kind in ("bool", "int", "float", "complex"):
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
    def from_json(cls, raw: bytes, where: str) -> EntryMeta:
        try:
            record = json.loads(raw)
            path = record.pop("path")
            kind = record.pop("kind")
            dtype = record.pop("dtype")
            shape = tuple(int(n) for n in record.pop("shape"))
            nbytes = int(record.pop("nbytes"))
            valid = (
                isinstance(path, str)
                and isinstance(kind, str)
                and isinstance(dtype, str)
                and nbytes >= 0
                and all(n >= 0 for n in shape)
            )
        except (ValueError, TypeError, KeyError, AttributeError):
            valid = False
        if not valid:
            raise SerialisationError(f"{where}: malformed entry header {raw[:200]!r}.")
        return cls(path, kind, dtype, shape, nbytes, record)


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


def _crc(*parts: bytes) -> int:
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
        for start in range(0, len(view), _CHUNK):
            chunk = view[start : start + _CHUNK]
            crc = zlib.crc32(chunk, crc)
            self._write_all(chunk)
        self._write_all(_U32.pack(crc))
        self._count += 1

    def write_footer(self) -> None:
        footer = _FOOTER.pack(FOOTER_MAGIC, self._count)
        self._write_all(footer + _U32.pack(_crc(footer)))


class FormatReader:
    """Reads one checkpoint from a binary stream, in the order it was written.

    `name` describes the file in error messages.
    """

    def __init__(self, stream: IO[bytes], name: str):
        self._stream = stream
        self.name = name
        self._count = 0
        self._readinto = getattr(stream, "readinto", None)

    def _fail(self, message: str) -> SerialisationError:
        return SerialisationError(f"{self.name}: {message}")

    def _read_exact_into(self, view: memoryview, what: str) -> None:
        filled = 0
        while filled < len(view):
            if self._readinto is not None:
                got = self._readinto(view[filled:])
            else:
                chunk = self._stream.read(len(view) - filled)
                got = len(chunk)
                view[filled : filled + got] = chunk
            if not got:
                raise self._fail(
                    f"file is truncated: it ends inside {what} "
                    f"({filled} of {len(view)} bytes present)."
                )
            filled += got

    def _read_exact(self, size: int, what: str) -> bytes:
        # In chunks, so that a damaged length field (not yet checked against
        # its checksum) costs no more memory than the file actually holds.
        if size <= _CHUNK:
            buffer = bytearray(size)
            self._read_exact_into(memoryview(buffer), what)
            return bytes(buffer)
        parts = []
        for start in range(0, size, _CHUNK):
            part = bytearray(min(_CHUNK, size - start))
            try:
                self._read_exact_into(memoryview(part), what)
            except SerialisationError:
                raise self._fail(
                    f"file is truncated: it ends inside {what} (fewer than "
                    f"{size} bytes present)."
                ) from None
            parts.append(part)
        return b"".join(parts)

    def read_header(self) -> list[str]:
        """Checks magic number, version and header checksum; returns the key
        paths of the entries, in file order."""
        preamble = self._read_exact(_PREAMBLE.size, "the preamble")
        magic, version, flags = _PREAMBLE.unpack(preamble)
        if magic != MAGIC:
            raise self._fail(
                f"not a filterax checkpoint (starts with {magic!r}, expected "
                f"{MAGIC!r}); was it written by `tree_serialise_leaves`?"
            )
        if version != FORMAT_VERSION:
            raise self._fail(
                f"format version {version} is not supported (this filterax "
                f"reads version {FORMAT_VERSION}); it was probably written by "
                "a newer filterax."
            )
        length = self._read_exact(_U64.size, "the header")
        (size,) = _U64.unpack(length)
        if size > _MAX_HEADER_BYTES:
            raise self._fail(f"header is corrupted (claims {size} bytes).")
        body = self._read_exact(size, "the header")
        (crc,) = _U32.unpack(self._read_exact(_U32.size, "the header checksum"))
        if crc != _crc(preamble, length, body):
            raise self._fail("header is corrupted (checksum mismatch).")
        if flags != 0:
            raise self._fail(
                f"uses format flags {flags:#x}, which this filterax does not "
                "understand; it was probably written by a newer filterax."
            )
        paths = json.loads(body)["leaves"]
        return [str(path) for path in paths]

    def read_entry_meta(self, expected_path: str) -> EntryMeta:
        """Reads and checks the next entry header, which must be for
        `expected_path`."""
        what = f"the header of entry {expected_path}"
        length = self._read_exact(_U32.size, what)
        (size,) = _U32.unpack(length)
        if size > _MAX_ENTRY_META_BYTES:
            raise self._fail(f"{what} is corrupted (claims {size} bytes).")
        raw = self._read_exact(size, what)
        (crc,) = _U32.unpack(self._read_exact(_U32.size, what))
        if crc != _crc(length, raw):
            raise self._fail(f"{what} is corrupted (checksum mismatch).")
        meta = EntryMeta.from_json(raw, f"{self.name}: {what}")
        if meta.path != expected_path:
            raise self._fail(
                f"expected entry {expected_path} next, found entry {meta.path}; "
                "the file is inconsistent with its own header."
            )
        self._count += 1
        return meta

    def read_data_into(self, meta: EntryMeta, buffer: np.ndarray | bytearray) -> None:
        """Fills `buffer` (exactly `meta.nbytes` long) with the entry's data,
        checking its checksum."""
        view = memoryview(buffer).cast("B")
        if len(view) != meta.nbytes:  # a bug in the caller, not in the file
            raise AssertionError(f"{meta.path}: {len(view)} bytes for {meta.nbytes}")
        what = f"the data of entry {meta.path}"
        crc = 0
        for start in range(0, len(view), _CHUNK):
            chunk = view[start : start + _CHUNK]
            self._read_exact_into(chunk, what)
            crc = zlib.crc32(chunk, crc)  # while the chunk is still in cache
        (stored,) = _U32.unpack(self._read_exact(_U32.size, what))
        if stored != crc:
            raise self._fail(f"{what} is corrupted (checksum mismatch).")

    def read_data(self, meta: EntryMeta) -> bytes:
        buffer = bytearray(meta.nbytes)
        self.read_data_into(meta, buffer)
        return bytes(buffer)

    def skip_data(self, meta: EntryMeta) -> None:
        """Moves past the entry's data (and its checksum) without checking it."""
        remaining = meta.nbytes + _U32.size
        try:
            seekable = self._stream.seekable()
        except (AttributeError, ValueError):
            seekable = False
        if seekable:
            # Seeking past the end succeeds silently: the footer check that
            # follows catches a truncated file.
            self._stream.seek(remaining, 1)
            return
        scratch = bytearray(min(remaining, _CHUNK))
        while remaining:
            step = min(remaining, len(scratch))
            self._read_exact_into(memoryview(scratch)[:step], f"entry {meta.path}")
            remaining -= step

    def read_footer(self) -> None:
        footer = self._read_exact(_FOOTER.size, "the footer")
        (crc,) = _U32.unpack(self._read_exact(_U32.size, "the footer"))
        magic, count = _FOOTER.unpack(footer)
        if magic != FOOTER_MAGIC or crc != _crc(footer) or count != self._count:
            raise self._fail("footer is corrupted or the entries are inconsistent.")
