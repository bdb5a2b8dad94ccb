"""How one leaf is stored and restored: the default `filter_spec` callables of
`tree_serialise_leaves` and `tree_deserialise_leaves` (for Equinox's format,
`_equinox.py` restores the leaf)."""

from __future__ import annotations

import io
import math
import struct
from typing import Any, BinaryIO

import jax
import jax.tree_util as jtu
import numpy as np
from jax.core import Tracer

from .._filters import is_ref
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
from ._equinox import decode_equinox_leaf
from ._format import (
    ARRAY_KINDS,
    BIG_ENDIAN_HOST,
    EntryMeta,
    dtype_from_name,
    dtype_name,
)
from ._io import LeafReader, LeafWriter, NpyLeafReader
from ._messages import SerialisationError, leaf_note, shape_str
from ._npy import NpyReader, starts_npy_record
from ._source import Source

__all__ = [
    "default_deserialise_filter_spec",
    "default_serialise_filter_spec",
    "entry_as_npy",
]

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


def _encode_leaf(path: str, leaf: Any) -> tuple[EntryMeta, bytes | memoryview]:
    """The entry `default_serialise_filter_spec` writes for `leaf`."""
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
            return _array_entry(path, "key_array", data, impl=impl)
        return _array_entry(path, "jax_array", data)
    if isinstance(leaf, np.ndarray):
        return _array_entry(path, "numpy_array", leaf)
    if isinstance(leaf, np.generic):
        return _array_entry(path, "numpy_scalar", np.asarray(leaf))
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
        return EntryMeta(path, "object", "", (), 0, {"type": type(leaf).__name__}), b""
    return EntryMeta(path, kind, kind, (), len(data)), data


def default_serialise_filter_spec(f: BinaryIO, leaf: Any) -> None:
    """Saves one leaf: the default `filter_spec` of
    [`tree_serialise_leaves`][filterax.tree_serialise_leaves].

    JAX and NumPy arrays, NumPy scalars and Python `bool`/`int`/`float`/`complex`
    are stored exactly; typed key arrays as their key data plus implementation
    name. Any other leaf (a string, a function) is recorded as present but not
    stored: loading keeps the `like` leaf. Custom `filter_spec` callables call it
    for the leaves they do not handle themselves. Given any other binary file,
    it writes what Equinox's does: `numpy.save` of an array or scalar leaf,
    nothing for any other.

    **Arguments:**

    - `f`: the file object `tree_serialise_leaves` passed to the callable (or
      any binary file).
    - `leaf`: the leaf to save.

    **Returns:** `None`.

    **Raises:** `TypeError` naming the key path for arrays of unsupported dtype
    (object, string), traced arrays, and `is_leaf` nodes that contain arrays.

    ```python
    >>> import io
    >>> import jax.numpy as jnp
    >>> import filterax as fx
    >>> def skip_buffers(f, leaf):  # store nothing for int arrays
    ...     if leaf.dtype != jnp.int32:
    ...         fx.default_serialise_filter_spec(f, leaf)
    >>> def keep_buffers(f, like):
    ...     if like.dtype == jnp.int32:
    ...         return like
    ...     return fx.default_deserialise_filter_spec(f, like)
    >>> tree = {"w": jnp.ones(2), "step": jnp.array(7)}
    >>> file = io.BytesIO()
    >>> fx.tree_serialise_leaves(file, tree, skip_buffers)
    >>> _ = file.seek(0)
    >>> fx.tree_deserialise_leaves(file, {"w": jnp.zeros(2), "step": jnp.array(0)}, keep_buffers)
    {'step': Array(0, dtype=int32, weak_type=True), 'w': Array([1., 1.], dtype=float32)}

    ```
    """
    if not isinstance(f, LeafWriter):
        _save_as_numpy(f, leaf)
        return
    f.write_entry(*_encode_leaf(f.path, leaf))


def _save_as_numpy(f: BinaryIO, leaf: Any) -> None:
    """`default_serialise_filter_spec` given another file object: writes what
    Equinox's does, a `numpy.save` record for an array or scalar leaf and
    nothing for any other."""
    if is_ref(leaf):
        leaf = leaf[...]
    if isinstance(leaf, jax.Array) and not isinstance(leaf, Tracer):
        data = host_copy(leaf)
        np.save(f, np.asarray(leaf) if data is None else data)
    elif isinstance(leaf, (jax.Array, np.ndarray, np.generic)) or python_scalar_kind(
        leaf
    ):
        np.save(f, np.asarray(leaf))


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
    if meta.kind in ARRAY_KINDS or meta.kind == "key_array":
        value = _read_array(handle, meta.dtype, meta.shape, for_jax=False)
    elif meta.kind in _PYTHON_SCALAR_DTYPES:
        value = _python_scalar(handle, meta.kind)
    else:
        handle.take(handle.format_reader.read_data)
        return b""
    out = io.BytesIO()
    np.save(out, value)
    return out.getvalue()


def _decode_npy_bytes(handle: LeafReader, like: Any, mismatch: Any) -> Any:
    """The leaf a custom `filter_spec` stored as `numpy.save` bytes (as
    Equinox's default does), read as an Equinox checkpoint's record is."""
    data = handle.take(handle.format_reader.read_data)
    if not starts_npy_record(bytes(data[:8])):
        raise mismatch()
    name = f"{handle.format_reader.name}, entry {handle.meta.path}"
    return _decode_npy_record(
        io.BytesIO(data), name, handle.path, handle.key_path, like
    )


def _decode_npy_record(
    stream: BinaryIO, name: str, path: str, key_path: Any, like: Any
) -> Any:
    """The leaf of the type of `like` in the `.npy` record at the start of
    `stream` (outside any Equinox checkpoint: errors do not call it one)."""
    reader = NpyReader(Source(stream, name), context="")
    return decode_equinox_leaf(NpyLeafReader(reader, path, key_path), like)


def _decode_leaf(handle: LeafReader, like: Any) -> Any:
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
        meta.kind == "raw"
        and meta.nbytes
        and (is_array_template(like) or python_scalar_kind(like) is not None)
    ):
        return _decode_npy_bytes(handle, like, mismatch)
    like_dtype = getattr(like, "dtype", None)
    if is_array_template(like) and is_key_dtype(like_dtype):
        impl = meta.extra.get("impl")
        if meta.kind != "key_array" or not isinstance(impl, str):
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
    if meta.kind == "object" or (meta.kind == "raw" and meta.nbytes == 0):
        handle.take(handle.format_reader.read_data)  # checks the (empty) data
        return like
    raise mismatch()


def default_deserialise_filter_spec(f: BinaryIO, like: Any) -> Any:
    """Loads one leaf: the default `filter_spec` of
    [`tree_deserialise_leaves`][filterax.tree_deserialise_leaves].

    The restored leaf has the type of `like`: a JAX array (on `like`'s sharding
    when `like` was committed to one, otherwise on the default device), a NumPy
    array or scalar, or a Python scalar of `like`'s type. A
    `jax.ShapeDtypeStruct` `like` gives a JAX array, so a model built with
    `jax.eval_shape` can be loaded without first allocating it. Non-array
    leaves (strings, functions) are returned from `like` unchanged. A leaf a
    custom `filter_spec` saved with `numpy.save` (as Equinox's default does) is
    read as such; so is the next record of any other binary file given as `f`.

    **Arguments:**

    - `f`: the file object `tree_deserialise_leaves` passed to the callable (or
      any binary file positioned at a `.npy` record).
    - `like`: the leaf of `like` at this position.

    **Returns:** the restored leaf.

    **Raises:** [`SerialisationError`][filterax.SerialisationError] naming the
    key path when the stored value does not match `like` (kind, shape, dtype or
    PRNG implementation) or its data is corrupted or truncated.

    ```python
    >>> import io
    >>> import jax, jax.numpy as jnp
    >>> import filterax as fx
    >>> file = io.BytesIO()
    >>> fx.tree_serialise_leaves(file, {"w": jnp.arange(3.0)})
    >>> _ = file.seek(0)
    >>> like = jax.eval_shape(lambda: {"w": jnp.zeros(3)})
    >>> fx.tree_deserialise_leaves(file, like, fx.default_deserialise_filter_spec)
    {'w': Array([0., 1., 2.], dtype=float32)}

    ```
    """
    if isinstance(f, LeafReader):
        return _decode_leaf(f, like)
    if isinstance(f, NpyLeafReader):
        return decode_equinox_leaf(f, like)
    # Another file object: read as Equinox's default reads, one record.
    name = getattr(f, "name", None)
    label = repr(name) if isinstance(name, str) else f"<{type(f).__name__}>"
    return _decode_npy_record(f, label, "at the file's position", None, like)
