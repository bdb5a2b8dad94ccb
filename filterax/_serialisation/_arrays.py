"""What both checkpoint formats need to turn bytes into leaves like `like`'s:
describing a `like` leaf, PRNG key layouts, buffers the device can adopt, and
placing a restored array where, and as weakly typed as, `like`'s was."""

from __future__ import annotations

import contextlib
import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .._tree._filters import is_ref
from ._messages import shape_str, with_article

__all__ = [
    "as_like_scalar",
    "as_weak",
    "describe_like",
    "empty_buffer",
    "finish_array",
    "host_copy",
    "is_array_template",
    "is_jax_template",
    "is_key_dtype",
    "key_impl_of",
    "key_layout",
    "place",
    "python_scalar_kind",
    "restore_keys",
]

_TEMPLATE_TYPES = (jax.Array, jax.ShapeDtypeStruct, np.ndarray, np.generic)


def is_array_template(like: Any) -> bool:
    """Whether `like` stands for an array (its shape and dtype are checked)."""
    return isinstance(like, _TEMPLATE_TYPES)


def is_jax_template(like: Any) -> bool:
    """Whether `like` stands for a JAX array (restored as one, on a device)."""
    return isinstance(like, (jax.Array, jax.ShapeDtypeStruct))


def is_key_dtype(dtype: Any) -> bool:
    return dtype is not None and jnp.issubdtype(dtype, jax.dtypes.prng_key)


def jax_converts(stored: np.dtype, wanted: Any) -> bool:
    """Whether JAX turns values of NumPy dtype `stored` into `wanted` (its
    canonical dtype: `float64` into `float32` with x64 disabled), so that a
    JAX leaf of dtype `wanted` may load them, as Equinox's `jnp.asarray`
    does. Raw-byte dtypes (`V`) never convert."""
    return stored.kind != "V" and jax.dtypes.canonicalize_dtype(stored) == wanted


# The Python scalar types by kind name; `bool` before `int`, which it subclasses.
PYTHON_SCALAR_TYPES: dict[str, type] = {
    "bool": bool,
    "int": int,
    "float": float,
    "complex": complex,
}


def python_scalar_kind(leaf: Any) -> str | None:
    # `np.float64` subclasses `float`, so NumPy scalars are ruled out first.
    if isinstance(leaf, np.generic):
        return None
    for kind, cls in PYTHON_SCALAR_TYPES.items():
        if isinstance(leaf, cls):
            return kind
    return None


def as_like_scalar(value: Any, like: Any) -> Any:
    """`value` as an instance of `like`'s type when that is a subclass of a
    Python scalar type (e.g. an `IntEnum`) that accepts it, else `value`."""
    if type(like) in (bool, int, float, complex):
        return value
    try:
        return type(like)(value)
    except Exception:
        return value


@functools.cache
def key_layout(impl: str) -> tuple[Any, tuple[int, ...]]:
    """The key dtype of PRNG implementation `impl` and the trailing shape of
    one key's data; `ValueError`/`TypeError` for an unknown `impl`."""
    key = jax.eval_shape(lambda: jax.random.key(0, impl=impl))
    data = jax.eval_shape(lambda: jax.random.key_data(jax.random.key(0, impl=impl)))
    return key.dtype, tuple(data.shape)


@functools.cache
def _impl_of_key_dtype(dtype: Any) -> str:
    return str(jax.random.key_impl(jnp.zeros((), dtype)))


def key_impl_of(like: Any) -> str:
    """The PRNG implementation name of a key array or key `ShapeDtypeStruct`."""
    if isinstance(like, jax.Array):
        return str(jax.random.key_impl(like))
    return _impl_of_key_dtype(like.dtype)


def describe_like(like: Any) -> str:
    """What `like` holds at a leaf, for error messages."""
    if is_ref(like):
        return f"a Ref holding {describe_like(like[...])}"
    dtype = getattr(like, "dtype", None)
    if is_jax_template(like) and is_key_dtype(dtype):
        return f"a {key_impl_of(like)} key array of shape {tuple(like.shape)}"
    if is_array_template(like):
        return with_article(
            f"{shape_str(str(np.dtype(dtype)), tuple(np.shape(like)))} array"
        )
    kind = python_scalar_kind(like)
    return f"a Python {kind}" if kind else f"a {type(like).__name__} (not an array)"


def _slice_key(index: tuple[Any, ...]) -> tuple[Any, ...]:
    # Slices are unhashable before Python 3.12.
    return tuple(
        (part.start, part.stop, part.step) if isinstance(part, slice) else part
        for part in index
    )


def _fresh_view(data: jax.Array) -> jax.Array:
    """A new array object on the buffer of the single-device array `data`:
    reading it on the host caches the copy (where one is made, on GPUs and
    TPUs) on this short-lived object, not on `data`, which the array it
    belongs to keeps for as long as it lives."""
    return jax.make_array_from_single_device_arrays(data.shape, data.sharding, [data])


def host_copy(array: jax.Array) -> np.ndarray | None:
    """The value of `array` on the host, assembled from the shards this
    process holds, each distinct shard read once; `None` when this process
    does not hold every element (the array is split across processes).

    Unlike `numpy.asarray(array)`, no host copy stays cached on `array`
    afterwards: the copy lives as long as the returned NumPy array."""
    shards = array.addressable_shards
    distinct = {}
    for shard in shards:
        distinct.setdefault(_slice_key(shard.index), shard)
    covered = sum(math.prod(shard.data.shape) for shard in distinct.values())
    if covered != math.prod(array.shape):
        return None
    if len(distinct) == 1:
        (shard,) = distinct.values()
        return np.asarray(_fresh_view(shard.data))
    out = np.empty(array.shape, array.dtype)
    for shard in distinct.values():
        out[shard.index] = np.asarray(_fresh_view(shard.data))
    return out


# XLA's CPU client adopts a host buffer aligned to this many bytes as the
# array's own memory instead of copying it.
_XLA_ALIGNMENT = 64


def empty_buffer(shape: tuple[int, ...], dtype: np.dtype, aligned: bool) -> np.ndarray:
    """An uninitialised C-ordered array, aligned for adoption by XLA if asked."""
    if not aligned:
        return np.empty(shape, dtype)
    nbytes = math.prod(shape) * dtype.itemsize
    raw = np.empty(nbytes + _XLA_ALIGNMENT, np.uint8)
    start = -raw.ctypes.data % _XLA_ALIGNMENT
    return raw[start : start + nbytes].view(dtype).reshape(shape)


@functools.partial(jax.jit, static_argnums=1)
def _weakly_typed(array: jax.Array, zero: complex) -> jax.Array:
    # An update of a weakly typed array is as weakly typed as the array it
    # updates: Python zeros, broadcast, with every element replaced.
    return jnp.broadcast_to(zero, array.shape).at[...].set(array)


@functools.cache
def _python_zero(dtype: np.dtype) -> complex | None:
    """The Python number whose weakly typed JAX array has dtype `dtype`, or
    `None` where there is none (weak types come only from Python numbers)."""
    zero = np.zeros((), dtype).item()
    if isinstance(zero, bool) or not isinstance(zero, (int, float, complex)):
        return None
    return zero if jnp.result_type(type(zero)) == dtype else None


def as_weak(placed: jax.Array) -> jax.Array:
    """`placed` as a weakly typed array of the same dtype and placement (as
    is, where its dtype has no weak form)."""
    zero = _python_zero(np.dtype(placed.dtype))
    if zero is None:
        return placed
    if placed.ndim == 0:
        # `jnp.asarray` of a Python number is the public way to build one.
        weak = jnp.asarray(np.asarray(placed).item())
    else:
        weak = _weakly_typed(placed, zero)
    if placed.committed and weak.sharding != placed.sharding:
        weak = jax.device_put(weak, placed.sharding)
    return weak


def place(array: Any, like: Any) -> jax.Array:
    """Puts a restored array where `like` was: on its sharding when `like` was
    placed explicitly (committed), otherwise uncommitted on the default device;
    weakly typed when `like` is, so that the restored pytree does not make
    `filter_jit` retrace."""
    sharding = None
    if isinstance(like, jax.ShapeDtypeStruct):
        sharding = like.sharding
    else:
        with contextlib.suppress(Exception):  # tracers have no placement
            if like.committed:
                sharding = like.sharding
    placed = (
        jax.device_put(array) if sharding is None else jax.device_put(array, sharding)
    )
    if getattr(like, "weak_type", False):
        placed = as_weak(placed)
    # The transfer is asynchronous and keeps the host buffer alive until done:
    # waiting bounds host memory to one leaf instead of all leaves in flight.
    return placed.block_until_ready()


def finish_array(values: np.ndarray, like: Any) -> Any:
    """The restored leaf of `like`'s type holding host array `values`: a placed
    JAX array, a NumPy scalar or `values` itself."""
    if is_jax_template(like):
        return place(values, like)
    return values[()] if isinstance(like, np.generic) else values


def restore_keys(data: np.ndarray, impl: str, like: Any) -> jax.Array:
    """The key array of PRNG implementation `impl` whose key data is `data`,
    placed as `like` is."""
    return place(jax.random.wrap_key_data(jnp.asarray(data), impl=impl), like)


def replicated_on_every_device() -> jax.sharding.NamedSharding:
    """Every device of every process holding the whole array: where an array
    goes in a multi-process run when nothing says otherwise."""
    mesh = jax.sharding.Mesh(np.array(jax.devices()), ("devices",))
    return jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())


def with_devices(sharding: Any, where: str, action: str) -> Any:
    """`sharding` with devices: a `NamedSharding` over an abstract mesh (what
    `jax.eval_shape` gives on `Explicit` axes) takes the mesh set with
    `jax.set_mesh`, when it is that mesh; any other sharding is returned as
    it is. `where` (a key path) and `action` (`"restore"`, `"load"`) word the
    error for an abstract mesh that no set mesh resolves."""
    mesh = getattr(sharding, "mesh", None)
    if not (
        isinstance(sharding, jax.sharding.NamedSharding)
        and isinstance(mesh, jax.sharding.AbstractMesh)
    ):
        return sharding
    current = jax.sharding.get_mesh()
    if current.empty or current.abstract_mesh != mesh:
        raise ValueError(
            f"cannot {action} the leaf at {where}: `like` gives it a sharding on "
            f"an abstract mesh ({mesh}), which names no devices. {action.capitalize()} "
            "under `with jax.set_mesh(mesh):` for that mesh, or give `like` "
            "concrete shardings."
        )
    return jax.sharding.NamedSharding(
        current, sharding.spec, memory_kind=sharding.memory_kind
    )
