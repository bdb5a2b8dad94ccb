"""Reading NumPy `.npy` records: what the Equinox format (`_equinox.py`) and
the NumPy format (`_numpy.py`) are made of.

A checkpoint written by Equinox's `tree_serialise_leaves` has no header and
no key paths: it is `.npy` records, one after another, one per array or
Python-scalar leaf of the saved pytree in its flattening order (other leaves
write nothing). Each record is the magic `b"\\x93NUMPY"`, a version (1.0,
2.0 or 3.0), a little-endian header length (`u16` in version 1, `u32` after),
a Python-literal header dict (`descr`, `fortran_order`, `shape`) and the raw
data.

NumPy's own header parser reads the dict (it evaluates literals only); the
lengths are checked against the bytes left in the file before anything is
allocated, and records holding pickled objects are refused.
"""

from __future__ import annotations

import dataclasses
import io
import math
import struct
import tokenize
from typing import Any

import numpy as np

from ._messages import leaf_note, shape_str, with_article
from ._source import CHUNK, Source

__all__ = ["NPY_MAGIC", "NpyReader", "NpyRecord", "starts_npy_record"]

NPY_MAGIC = b"\x93NUMPY"
_LENGTH_FIELDS = {
    1: struct.Struct("<H"),
    2: struct.Struct("<I"),
    3: struct.Struct("<I"),
}
# NumPy's own default bound on a header it will parse; real headers of plain
# arrays are about a hundred bytes.
_MAX_HEADER_BYTES = 10_000


def starts_npy_record(start: bytes) -> bool:
    """Whether `start` (8 bytes) opens a `.npy` record of a known version."""
    return (
        len(start) >= 8
        and start[:6] == NPY_MAGIC
        and start[6] in _LENGTH_FIELDS
        and start[7] == 0
    )


@dataclasses.dataclass(frozen=True)
class NpyRecord:
    """What a record header says about the data that follows it."""

    dtype: np.dtype  # as stored, byte order included
    shape: tuple[int, ...]
    fortran_order: bool

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize

    def describe(self) -> str:
        if self.dtype.kind == "V":  # what NumPy writes for bfloat16, float8, int4
            name = f"V{self.dtype.itemsize} (raw {self.dtype.itemsize}-byte)"
        else:
            name = self.dtype.newbyteorder("=").name
        return with_article(f"{shape_str(name, self.shape)} array")


class NpyReader:
    """Reads the records of an Equinox checkpoint from a `Source`, in order."""

    def __init__(
        self,
        source: Source,
        context: str = " (an Equinox checkpoint, read in the order of `like`'s leaves)",
    ):
        self.source = source
        self.name = source.name
        self.count = 0
        self.context = context  # how its records map to leaves, for errors

    def read_record(self, path: str, key_path: tuple[Any, ...] | None) -> NpyRecord:
        """Reads and checks the header of the next record, for leaf `path`."""
        source = self.source
        if source.at_end():
            if self.count == 0:
                raise source.fail(
                    "file is truncated: there is no data where the checkpoint "
                    "should start."
                )
            raise source.fail(
                f"file is truncated, or `like` has more array leaves than were "
                f"saved: it ends before the NumPy record of leaf {path} (after "
                f"{self.count} records)." + leaf_note(key_path, "missing")
            )
        what = f"the NumPy record of leaf {path}"
        start = source.read_exact(8, what)
        if not starts_npy_record(bytes(start)):
            raise source.fail(
                f"{what} is corrupted, or `like` differs from the saved pytree: "
                f"found {bytes(start)!r} where a NumPy record should start "
                f"(record {self.count})." + leaf_note(key_path, "mismatch")
            )
        length_field = source.read_exact(_LENGTH_FIELDS[start[6]].size, what)
        (size,) = _LENGTH_FIELDS[start[6]].unpack(length_field)
        if size > _MAX_HEADER_BYTES:
            raise source.fail(f"{what} is corrupted (its header claims {size} bytes).")
        header = source.read_exact(size, what)
        parse = (
            np.lib.format.read_array_header_1_0
            if start[6] == 1
            else np.lib.format.read_array_header_2_0
        )
        try:
            shape, fortran_order, dtype = parse(
                io.BytesIO(bytes(length_field + header)),
                max_header_size=_MAX_HEADER_BYTES,
            )
        except (ValueError, SyntaxError, TypeError, tokenize.TokenError) as error:
            # NumPy tokenises the header's dict, which a corrupted byte may
            # leave unterminated (`TokenError`).
            raise source.fail(f"{what} has a malformed header: {error}") from None
        if dtype.hasobject:
            raise source.fail(
                f"{what} holds pickled Python objects (NumPy dtype object), which "
                "are never loaded: unpickling can run arbitrary code. (Equinox "
                "writes these for Python ints beyond 64 bits.)"
            )
        if dtype.fields is not None or dtype.subdtype is not None:
            raise source.fail(f"{what} holds a structured array ({dtype}).")
        if dtype.kind not in "biufcV":
            raise source.fail(f"{what} holds {dtype} data, not numbers.")
        record = NpyRecord(dtype, tuple(int(n) for n in shape), bool(fortran_order))
        source.require(record.nbytes, f"the data of leaf {path}")
        self.count += 1
        return record

    def can_read_into(self, record: NpyRecord) -> bool:
        """As `FormatReader.can_read_into`."""
        return self.source.can_allocate(record.nbytes)

    def read_data_into(self, path: str, buffer: np.ndarray) -> None:
        view = buffer.reshape(-1).view(np.uint8).data.cast("B")
        for start in range(0, len(view), CHUNK):
            self.source.read_exact_into(
                view[start : start + CHUNK], f"the data of leaf {path}"
            )

    def read_data(self, path: str, record: NpyRecord) -> bytearray:
        return self.source.read_exact(record.nbytes, f"the data of leaf {path}")
