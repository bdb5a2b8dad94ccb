"""Restoring one leaf of `like` from the next NumPy `.npy` record of a stream
(records read by `_npy.py`): what the Equinox and NumPy formats read.

Records carry no key paths or leaf kinds, so `like` decides what is read, as
Equinox's `tree_deserialise_leaves` does: an array or Python-scalar leaf reads
the next record, any other leaf reads nothing (Equinox wrote nothing for it).
A typed key array in `like` reads its key data (Equinox cannot save typed
keys; code that uses it saves `jax.random.key_data(key)`), and a Ref reads
nothing, as Equinox 0.13.8 treats Refs as non-array leaves.
"""

from __future__ import annotations

import io
from typing import Any

import jax
import numpy as np

from .._tree._filters import is_ref
from ._arrays import (
    PYTHON_SCALAR_TYPES,
    as_like_scalar,
    describe_like,
    empty_buffer,
    finish_array,
    is_array_template,
    is_jax_template,
    is_key_dtype,
    jax_converts,
    key_impl_of,
    key_layout,
    python_scalar_kind,
    restore_keys,
)
from ._messages import SerialisationError, leaf_note
from ._npy import NpyReader, NpyRecord

__all__ = ["NpyLeafReader", "decode_npy_leaf"]

KeyPath = tuple[Any, ...]


class NpyLeafReader(io.RawIOBase):
    """The binary file a loading `filter_spec` callable receives for one leaf
    stored as `.npy` records: the stream from the leaf's record on (as
    Equinox passes its checkpoint's stream, so `numpy.load(file)` reads the
    record). `default_deserialise_filter_spec` reads one record through it."""

    def __init__(self, reader: NpyReader, path: str, key_path: KeyPath | None):
        super().__init__()
        self.npy_reader = reader
        self.path = path
        self.key_path = key_path

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        return self.npy_reader.source.read_some_into(memoryview(buffer).cast("B"))

    def seekable(self) -> bool:
        return self.npy_reader.source.seekable

    def seek(self, offset: int, whence: int = 0) -> int:
        return self.npy_reader.source.seek(offset, whence)

    def tell(self) -> int:
        return self.npy_reader.source.tell()


# The NumPy dtype kinds a Python scalar of `like` accepts: its own, and those
# whose values it holds exactly (checked value by value), as Equinox's
# `type(like)(value)` loads a hyperparameter saved as `1` into a `1.0` field.
_SCALAR_DTYPE_KINDS = {"bool": "b", "int": "biu", "float": "biuf", "complex": "biufc"}


def _exactly(converted: Any, original: Any) -> bool:
    """Whether a conversion kept the value (NaN counts as kept)."""
    same = converted == original
    return bool(np.all(same | (original != original)))


def _same_element_type(stored: np.dtype, wanted: np.dtype) -> bool:
    if stored.kind == "V":
        # NumPy writes dtypes it does not know (bfloat16, float8_*, int4) as
        # raw bytes of their size; only `like` can say what they are.
        return wanted.kind == "V" and wanted.itemsize == stored.itemsize
    return stored.newbyteorder("=") == wanted


def _read_values(
    handle: NpyLeafReader, record: NpyRecord, dtype: np.dtype, for_jax: bool
) -> np.ndarray:
    """The record's data as a C-ordered array of native `dtype`."""
    reader = handle.npy_reader
    shape = record.shape[::-1] if record.fortran_order else record.shape
    if reader.can_read_into(record):
        values = empty_buffer(shape, dtype, aligned=for_jax)
        reader.read_data_into(handle.path, values)
    else:  # a stream of unknown length: the data is allocated as it arrives
        data = reader.read_data(handle.path, record)
        values = np.frombuffer(data, np.uint8).view(dtype).reshape(shape)
    if record.dtype.kind != "V" and not record.dtype.isnative:
        values.byteswap(inplace=True)
    if record.fortran_order:
        values = np.ascontiguousarray(values.T)
    return values


def _read_matching(
    handle: NpyLeafReader,
    like: Any,
    dtype: np.dtype,
    shape: tuple[int, ...],
    for_jax: bool,
) -> np.ndarray:
    """Reads the next record, which must hold `dtype[shape]` data; for a JAX
    `like` (`for_jax`), data that JAX would convert to `dtype` does too (a
    NumPy float64 record, or a Python number, with x64 disabled), as
    Equinox's `jnp.asarray` does."""
    reader = handle.npy_reader
    record = reader.read_record(handle.path, handle.key_path)
    if record.shape == shape and _same_element_type(record.dtype, dtype):
        return _read_values(handle, record, dtype, for_jax)
    mismatch = SerialisationError(
        f"{reader.name}: the NumPy record of leaf {handle.path} holds "
        f"{record.describe()}, but `like` has {describe_like(like)} there"
        f"{reader.context}." + leaf_note(handle.key_path, "mismatch")
    )
    if for_jax and record.shape == shape and jax_converts(record.dtype, dtype):
        native = record.dtype.newbyteorder("=")
        return _read_values(handle, record, native, for_jax).astype(dtype)
    if (
        isinstance(like, np.generic)
        and record.shape == shape
        and record.dtype.kind in "biufc"
        and dtype.kind in "biufc"
    ):
        # A NumPy scalar, which Equinox converts to `like`'s type: loaded when
        # the conversion is exact (an int64 record into a float64 leaf).
        native = record.dtype.newbyteorder("=")
        values = _read_values(handle, record, native, for_jax)
        with np.errstate(all="ignore"):
            converted = values.astype(dtype)
            if _exactly(converted.astype(native), values):
                return converted
    raise mismatch


def _read_python_scalar(handle: NpyLeafReader, like: Any, kind: str) -> Any:
    reader = handle.npy_reader
    record = reader.read_record(handle.path, handle.key_path)
    if record.shape != () or record.dtype.kind not in _SCALAR_DTYPE_KINDS[kind]:
        raise SerialisationError(
            f"{reader.name}: the NumPy record of leaf {handle.path} holds "
            f"{record.describe()}, but `like` has {describe_like(like)} there."
            + leaf_note(handle.key_path, "mismatch")
        )
    values = _read_values(handle, record, record.dtype.newbyteorder("="), for_jax=False)
    value = values.item()
    converted = PYTHON_SCALAR_TYPES[kind](value)
    if not _exactly(converted, value):  # an int beyond a float's precision
        raise SerialisationError(
            f"{reader.name}: the NumPy record of leaf {handle.path} holds "
            f"{value!r}, which `like`'s {kind} cannot hold exactly."
            + leaf_note(handle.key_path, "mismatch")
        )
    return as_like_scalar(converted, like)


def decode_npy_leaf(handle: NpyLeafReader, like: Any) -> Any:
    """The leaf at `handle.path`, of the type of `like`, from the next record."""
    if is_ref(like):
        return jax.new_ref(like[...])  # a new Ref: `like` is never shared
    dtype = getattr(like, "dtype", None)
    if is_array_template(like) and is_key_dtype(dtype):
        impl = key_impl_of(like)
        _, trailing = key_layout(impl)
        shape = (*like.shape, *trailing)
        data = _read_matching(handle, like, np.dtype(np.uint32), shape, for_jax=True)
        return restore_keys(data, impl, like)
    if is_array_template(like):
        for_jax = is_jax_template(like)
        values = _read_matching(
            handle, like, np.dtype(dtype), tuple(np.shape(like)), for_jax
        )
        return finish_array(values, like)
    kind = python_scalar_kind(like)
    if kind is not None:
        return _read_python_scalar(handle, like, kind)
    return like
