"""NumPy's format: one `.npy` record, as `numpy.save` writes it, in any
binary file.

It is what the default `filter_spec` callables write and read when given a
file object that no other format owns (as Equinox's defaults do), and how
filterax's format stores a leaf that a custom callable saved with
`numpy.save`. Records are read by `_npy.py` and `_npy_leaf.py`.
"""

from __future__ import annotations

import io
from typing import Any, BinaryIO

import jax
import numpy as np
from jax.core import Tracer

from .._tree._filters import is_ref
from ._arrays import host_copy, python_scalar_kind
from ._npy import NpyReader
from ._npy_leaf import KeyPath, NpyLeafReader, decode_npy_leaf
from ._registry import Format
from ._source import Source, file_label

__all__ = ["NUMPY", "NumpyFormat", "read_record_leaf", "record_bytes"]


class NumpyFormat(Format):
    """One `.npy` record per leaf, in any binary file."""

    def writes_leaf_to(self, file: Any) -> bool:
        return True  # any binary file: this format is the last one tried

    def reads_leaf_from(self, file: Any) -> bool:
        return True

    def save_leaf(self, file: BinaryIO, leaf: Any) -> None:
        """A `numpy.save` record of an array or scalar leaf; nothing for any
        other leaf (Equinox's rule)."""
        if is_ref(leaf):
            leaf = leaf[...]
        if isinstance(leaf, jax.Array) and not isinstance(leaf, Tracer):
            data = host_copy(leaf)
            np.save(file, np.asarray(leaf) if data is None else data)
        elif isinstance(
            leaf, (jax.Array, np.ndarray, np.generic)
        ) or python_scalar_kind(leaf):
            np.save(file, np.asarray(leaf))

    def load_leaf(self, file: BinaryIO, like: Any) -> Any:
        """The leaf in the record at `file`'s position, read as Equinox's
        default reads it."""
        return read_record_leaf(
            file, file_label(file), "at the file's position", None, like
        )


def read_record_leaf(
    stream: BinaryIO, name: str, path: str, key_path: KeyPath | None, like: Any
) -> Any:
    """The leaf of the type of `like` in the `.npy` record at the start of
    `stream`, named `name` in errors (which, outside an Equinox checkpoint,
    do not call it one)."""
    reader = NpyReader(Source(stream, name), context="")
    return decode_npy_leaf(NpyLeafReader(reader, path, key_path), like)


def record_bytes(value: Any) -> bytes:
    """The `.npy` record `numpy.save` writes for `value`."""
    out = io.BytesIO()
    np.save(out, value)
    return out.getvalue()


NUMPY = NumpyFormat()
