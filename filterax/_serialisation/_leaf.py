"""How one leaf becomes an entry of filterax's format and back: what the
default `filter_spec` callables do with the file objects of that format
(`_filterax.py`)."""

from __future__ import annotations

import io
import math
import struct
from typing import Any

import jax
import jax.tree_util as jtu
import numpy as np
from jax.core import Tracer

from .._tree._filters import is_ref
from ._arrays import (
    PYTHON_SCALAR_TYPES,
    as_like_scalar,
    describe_like,
    empty_buffer,
    finish_array,
    host_copy,
    is_array_template,
    is_jax_template,
    is_key_dtype,
    jax_converts,
    key_layout,
    python_scalar_kind,
    restore_keys,
)
from ._fingerprint import describe_value
from ._framing import (
    ARRAY_KINDS,
    BIG_ENDIAN_HOST,
    EntryMeta,
    dtype_from_name,
    dtype_name,
)
from ._io import LeafReader
from ._kinds import (
    JAX_ARRAY,
    KEY_ARRAY,
    NUMPY_ARRAY,
    NUMPY_SCALAR,
    OBJECT,
    RAW,
    STORED_ARRAY_KINDS,
)
from ._messages import SerialisationError, leaf_note, shape_str
from ._npy import starts_npy_record
from ._numpy import read_record_leaf, record_bytes

__all__ = ["decode_leaf", "encode_leaf", "entry_as_npy"]

_SCALAR_FORMATS = {"float": struct.Struct("<d"), "complex": struct.Struct("<dd")}
_SCALAR_SIZES = {"bool": 1, "float": 8, "complex": 16}


def _wire_bytes(array: np.ndarray) -> memoryview:
    """`array`'s data as C-ordered little-endian bytes (a view when possible)."""
    array = np.ascontiguousarray(array)
    if array.dtype.byteorder == ">" or (
        BIG_ENDIAN_HOST and array.dtype.byteorder == "="
    ):
        array = array.byteswap()
    # A uint8 view: the buffer protocol does not know `ml_dtypes` such as bfloat16.
    return array.reshape(-1).view(np.uint8).data


def _array_entry(
    path: str, kind: str, array: np.ndarray, **extra: Any
) -> tuple[EntryMeta, memoryview]:
    name = dtype_name(array.dtype)
    if name is None:
        raise TypeError(
            f"cannot serialise the leaf at {path}: dtype {array.dtype} is not "
            "supported (only boolean, integer, floating and complex dtypes are)."
        )
    data = _wire_bytes(array)
    return EntryMeta(path, kind, name, tuple(array.shape), len(data), extra), data


def encode_leaf(path: str, leaf: Any) -> tuple[EntryMeta, bytes | memoryview]:
    """The entry (header and data) that stores `leaf`, at key path `path`."""
    if is_ref(leaf):
        # A Ref is stored as its current value; loading makes a new Ref.
        leaf = leaf[...]
    if isinstance(leaf, jax.Array):
        if isinstance(leaf, Tracer):
            raise TypeError(
                f"cannot serialise the leaf at {path}: it is a traced array. "
                "Call tree_serialise_leaves outside of jit/grad/vmap."
            )
        if leaf.is_deleted():
            raise ValueError(
                f"cannot serialise the leaf at {path}: its array has been deleted "
                "(by `.delete()`, or by donating it to a jitted function). Save "
                "it before deleting or donating it."
            )
        key = is_key_dtype(leaf.dtype)
        data = host_copy(jax.random.key_data(leaf) if key else leaf)
        if data is None:
            raise TypeError(
                f"cannot serialise the leaf at {path}: it is split across "
                f"processes (process {jax.process_index()} holds only part of "
                "it), and tree_serialise_leaves writes one file from the values "
                "one process holds. Save it with filterax.checkpoint, where "
                "every process writes its own shards (or gather it first with "
                "jax.experimental.multihost_utils.process_allgather)."
            )
        if key:
            impl = str(jax.random.key_impl(leaf))
            return _array_entry(path, KEY_ARRAY, data, impl=impl)
        return _array_entry(path, JAX_ARRAY, data)
    if isinstance(leaf, np.ndarray):
        return _array_entry(path, NUMPY_ARRAY, leaf)
    if isinstance(leaf, np.generic):
        return _array_entry(path, NUMPY_SCALAR, np.asarray(leaf))
    kind = python_scalar_kind(leaf)
    if kind == "bool":
        data = bytes([leaf])
    elif kind == "int":
        data = int(leaf).to_bytes(
            int(leaf).bit_length() // 8 + 1, "little", signed=True
        )
    elif kind == "float":
        data = _SCALAR_FORMATS["float"].pack(leaf)
    elif kind == "complex":
        data = _SCALAR_FORMATS["complex"].pack(leaf.real, leaf.imag)
    else:
        children = jtu.tree_leaves(leaf)
        is_node = len(children) != 1 or children[0] is not leaf
        if is_node and any(isinstance(c, (jax.Array, np.ndarray)) for c in children):
            raise TypeError(
                f"default_serialise_filter_spec was given a {type(leaf).__name__} "
                f"node at {path} that contains arrays (made a leaf by `is_leaf`); "
                "its arrays would be lost. Drop that `is_leaf`, or pass a "
                "filter_spec callable that saves the node's contents."
            )
        # Described (as `filterax.checkpoint` describes static leaves), not
        # stored: loading takes the leaf from `like`.
        extra = {"type": type(leaf).__name__, "value": describe_value(leaf)}
        return EntryMeta(path, OBJECT, "", (), 0, extra), b""
    return EntryMeta(path, kind, kind, (), len(data)), data


def _read_array(
    handle: LeafReader, dtype: str, shape: tuple[int, ...], for_jax: bool
) -> np.ndarray:
    meta, reader = handle.meta, handle.format_reader
    native = dtype_from_name(dtype)
    if math.prod(shape) * native.itemsize != meta.nbytes:
        raise SerialisationError(
            f"{reader.name}: entry {meta.path} is corrupted ({meta.nbytes} bytes "
            f"of data for {shape_str(dtype, shape)})."
        )
    if reader.can_read_into(meta):
        # Straight into the destination: no intermediate copy of the leaf.
        buffer = empty_buffer(shape, native, aligned=for_jax)
        handle.take(
            lambda meta: reader.read_data_into(meta, buffer.reshape(-1).view(np.uint8))
        )
    else:  # a stream of unknown length: the data is allocated as it arrives
        data = handle.take(reader.read_data)
        buffer = np.frombuffer(data, np.uint8).view(native).reshape(shape)
    if BIG_ENDIAN_HOST:
        buffer.byteswap(inplace=True)
    return buffer


def _decode_python_scalar(handle: LeafReader, kind: str, like: Any) -> Any:
    return as_like_scalar(_python_scalar(handle, kind), like)


def _python_scalar(handle: LeafReader, kind: str) -> Any:
    meta, reader = handle.meta, handle.format_reader
    if _SCALAR_SIZES.get(kind, meta.nbytes) != meta.nbytes or meta.nbytes == 0:
        raise SerialisationError(
            f"{reader.name}: entry {meta.path} is not a valid {kind} "
            f"({meta.nbytes} bytes)."
        )
    data = bytes(handle.take(reader.read_data))
    value: Any
    if kind == "bool":
        if data not in (b"\x00", b"\x01"):
            raise SerialisationError(
                f"{reader.name}: entry {meta.path} is not a valid bool."
            )
        value = data == b"\x01"
    elif kind == "int":
        value = int.from_bytes(data, "little", signed=True)
    else:
        value = _SCALAR_FORMATS[kind].unpack(data)
        value = value[0] if kind == "float" else complex(*value)
    return value


def _converted_for_jax(
    handle: LeafReader, dtype: Any, shape: tuple[int, ...]
) -> np.ndarray | None:
    """For a JAX `like` of `dtype[shape]`: the entry's value converted as JAX
    converts its inputs, when the entry holds what JAX would turn into
    `dtype` (a NumPy `float64` array or a Python number with x64 disabled,
    as Equinox's `jnp.asarray` loads them); `None` otherwise (nothing read)."""
    meta = handle.meta
    if meta.kind in ARRAY_KINDS and meta.shape == shape:
        if not jax_converts(dtype_from_name(meta.dtype), dtype):
            return None
        return _read_array(handle, meta.dtype, meta.shape, for_jax=False).astype(dtype)
    if meta.kind in _PYTHON_SCALAR_DTYPES and shape == ():
        if not jax_converts(_PYTHON_SCALAR_DTYPES[meta.kind], dtype):
            return None
        value = _python_scalar(handle, meta.kind)
        try:
            return np.asarray(value, dtype)
        except OverflowError:  # an int too large for the dtype
            return None
    return None


# The NumPy dtype of each kind of Python scalar (before JAX canonicalises it).
_PYTHON_SCALAR_DTYPES = {
    "bool": np.dtype(bool),
    "int": np.dtype(np.int64),
    "float": np.dtype(np.float64),
    "complex": np.dtype(np.complex128),
}


# Which stored values a Python scalar of each kind takes, when they convert
# to it exactly (an `int` saved where `like` now has a `float`, a 0-d array
# saved where `like` has a Python scalar).
_WIDENINGS = {
    "float": ("int", "b", "u", "i", "f"),
    "complex": ("int", "float", "b", "u", "i", "f", "c"),
    "int": ("b", "u", "i"),
}


def _widened_scalar(handle: LeafReader, kind: str, mismatch: Any) -> Any:
    """A Python scalar of `kind` from an entry of another kind that converts
    to it exactly; `mismatch()` is raised otherwise (nothing read)."""
    meta = handle.meta
    allowed = _WIDENINGS.get(kind, ())
    if meta.kind in ("int", "float") and meta.kind in allowed:
        value = _python_scalar(handle, meta.kind)
    elif (
        meta.kind in ARRAY_KINDS
        and meta.shape == ()
        and dtype_from_name(meta.dtype).kind in allowed
    ):
        value = _read_array(handle, meta.dtype, (), for_jax=False)[()].item()
    else:
        raise mismatch()
    converted = PYTHON_SCALAR_TYPES[kind](value)
    if converted != value:  # an int too large for a float, say
        raise mismatch()
    return converted


def entry_as_npy(handle: LeafReader) -> bytes:
    """A typed entry as the bytes `numpy.save` writes for its value (what
    Equinox's default `filter_spec` stores), for a `filter_spec` callable that
    reads the leaf as a file (`numpy.load(f)`). Key arrays give their key
    data; a leaf stored as present but empty gives no bytes."""
    meta = handle.meta
    value: Any
    if meta.kind in STORED_ARRAY_KINDS:
        value = _read_array(handle, meta.dtype, meta.shape, for_jax=False)
    elif meta.kind in _PYTHON_SCALAR_DTYPES:
        value = _python_scalar(handle, meta.kind)
    else:
        handle.take(handle.format_reader.read_data)
        return b""
    return record_bytes(value)


def _decode_npy_bytes(handle: LeafReader, like: Any, mismatch: Any) -> Any:
    """The leaf a custom `filter_spec` stored as `numpy.save` bytes (as
    Equinox's default does), read as an Equinox checkpoint's record is."""
    data = handle.take(handle.format_reader.read_data)
    if not starts_npy_record(bytes(data[:8])):
        raise mismatch()
    name = f"{handle.format_reader.name}, entry {handle.meta.path}"
    return read_record_leaf(io.BytesIO(data), name, handle.path, handle.key_path, like)


def decode_leaf(handle: LeafReader, like: Any) -> Any:
    """The leaf of the type of `like` that the entry holds."""
    meta = handle.meta
    name = handle.format_reader.name

    def mismatch() -> SerialisationError:
        return SerialisationError(
            f"{name}: entry {meta.path} holds {meta.describe()}, but `like` "
            f"has {describe_like(like)} there." + leaf_note(handle.key_path, "mismatch")
        )

    if is_ref(like):
        template = like[...]
        if not is_array_template(template):
            raise mismatch()
        return jax.new_ref(_decode_leaf_as(handle, template, mismatch))
    return _decode_leaf_as(handle, like, mismatch)


def _decode_leaf_as(handle: LeafReader, like: Any, mismatch: Any) -> Any:
    """The leaf the entry holds, of the type of `like` (not a Ref)."""
    meta = handle.meta
    if (
        meta.kind == RAW
        and meta.nbytes
        and (is_array_template(like) or python_scalar_kind(like) is not None)
    ):
        return _decode_npy_bytes(handle, like, mismatch)
    like_dtype = getattr(like, "dtype", None)
    if is_array_template(like) and is_key_dtype(like_dtype):
        impl = meta.extra.get("impl")
        if meta.kind != KEY_ARRAY or not isinstance(impl, str):
            raise mismatch()
        try:
            key_dtype, trailing = key_layout(impl)
        except (ValueError, TypeError):
            raise SerialisationError(
                f"{handle.format_reader.name}: entry {meta.path} holds keys of "
                f"PRNG implementation {impl!r}, which this JAX does not know."
            ) from None
        if key_dtype != like_dtype or meta.shape != (*like.shape, *trailing):
            raise mismatch()
        data = _read_array(handle, meta.dtype, meta.shape, for_jax=True)
        return restore_keys(data, impl, like)
    if is_array_template(like):
        if is_jax_template(like) and meta.dtype != dtype_name(np.dtype(like_dtype)):
            converted = _converted_for_jax(handle, like_dtype, tuple(np.shape(like)))
            if converted is None:
                raise mismatch()
            return finish_array(converted, like)
        if (
            meta.kind not in ARRAY_KINDS
            or meta.dtype != dtype_name(np.dtype(like_dtype))
            or meta.shape != tuple(np.shape(like))
        ):
            raise mismatch()
        for_jax = is_jax_template(like)
        array = _read_array(handle, meta.dtype, meta.shape, for_jax)
        if not for_jax and array.dtype != like_dtype:  # a non-native byte order
            array = array.astype(like_dtype)
        return finish_array(array, like)
    kind = python_scalar_kind(like)
    if kind is not None:
        if meta.kind == kind:
            return _decode_python_scalar(handle, kind, like)
        return as_like_scalar(_widened_scalar(handle, kind, mismatch), like)
    if meta.kind == OBJECT or (meta.kind == RAW and meta.nbytes == 0):
        handle.take(handle.format_reader.read_data)  # checks the (empty) data
        return like
    raise mismatch()
