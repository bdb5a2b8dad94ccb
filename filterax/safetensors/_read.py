"""Reading one tensor into a leaf like `like`'s: onto its sharding, each
distinct shard this process's devices hold read on its own and freed once on
its devices, so that no host buffer ever holds more of a sharded tensor than
one shard of it."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator
from typing import Any

import jax
import numpy as np
import safetensors

from .._serialisation import SerialisationError
from .._serialisation._arrays import (
    as_weak,
    place,
    replicated_on_every_device,
    restore_keys,
    with_devices,
)
from .._tree._filters import is_ref

__all__ = ["Reader", "read_leaf", "tensor_reader"]

# `reader(index)`: the part `index` (a tuple of slices) of one stored tensor,
# on the host, in the dtype it is loaded as.
Reader = Callable[[tuple[slice, ...]], np.ndarray]


def whole(shape: tuple[int, ...]) -> tuple[slice, ...]:
    return (slice(None),) * len(shape)


@contextlib.contextmanager
def tensor_reader(
    file: str, name: str, shape: tuple[int, ...], dtype: Any
) -> Iterator[Reader]:
    """Opens the safetensors file `file` and yields a `Reader` of its tensor
    `name` (of shape `shape`), cast to `dtype`.

    The file is open for one tensor at a time: safetensors maps it into
    memory, and the pages a read touches stay resident until it is closed.
    Closed after each tensor, the process never holds more of the file than
    (the parts it reads of) one tensor; opened once per tensor, not per
    shard, as each opening parses the file's whole header."""
    try:
        opened = safetensors.safe_open(file, framework="numpy")
    except (OSError, safetensors.SafetensorError) as error:
        raise SerialisationError(f"cannot read {file}: {error}") from None
    with opened as handle:
        stored = handle.get_slice(name)

        def read(index: tuple[slice, ...]) -> np.ndarray:
            if math.prod(shape) == 0:  # safetensors cannot slice empty tensors
                wanted = tuple(
                    len(range(*part.indices(n))) for part, n in zip(index, shape)
                )
                return np.zeros(wanted, dtype)
            try:
                # A copy in memory of its own, not a view of the mapped file.
                part = stored[index] if index else stored[...]
            except safetensors.SafetensorError as error:
                raise SerialisationError(
                    f"cannot read the tensor {name!r} from {file}: {error}"
                ) from None
            return np.asarray(part).astype(dtype, copy=False)

        yield read


def _slice_key(index: tuple[slice, ...]) -> tuple[Any, ...]:
    # Slices are unhashable before Python 3.12.
    return tuple((part.start, part.stop, part.step) for part in index)


def _sharded(
    shape: tuple[int, ...], sharding: jax.sharding.Sharding, read: Reader
) -> jax.Array:
    """The array of global shape `shape` on `sharding`, built shard by shard:
    each distinct shard this process's devices hold is read once, copied to
    every device holding it, and freed before the next is read."""
    indices = sharding.addressable_devices_indices_map(shape)
    devices_of: dict[tuple[Any, ...], list[Any]] = {}
    index_of: dict[tuple[Any, ...], tuple[slice, ...]] = {}
    for device, index in indices.items():
        index = tuple(index) if index is not None else whole(shape)
        devices_of.setdefault(_slice_key(index), []).append(device)
        index_of[_slice_key(index)] = index
    shards: dict[Any, jax.Array] = {}
    for key, devices in devices_of.items():
        host = read(index_of[key])
        for device in devices:
            shards[device] = jax.device_put(host, device)
        # The copies are asynchronous and keep `host` alive until done:
        # waiting bounds host memory to one shard at a time.
        jax.block_until_ready([shards[device] for device in devices])
        del host
    return jax.make_array_from_single_device_arrays(
        shape, sharding, [shards[device] for device in indices]
    )


def _concrete_sharding(sharding: Any, where: str) -> jax.sharding.Sharding | None:
    """`sharding` with devices (see `with_devices`). With no sharding in a
    multi-process run, replicated on every device."""
    if sharding is None:
        return None if jax.process_count() == 1 else replicated_on_every_device()
    return with_devices(sharding, where, "load")


def _target_sharding(like: Any, where: str) -> jax.sharding.Sharding | None:
    """The sharding a JAX leaf loads onto: a struct's, or a concrete array's
    when it was placed explicitly; `None` for the default device."""
    if isinstance(like, jax.ShapeDtypeStruct):
        return _concrete_sharding(like.sharding, where)
    try:
        committed = like.committed
        sharding = like.sharding
    except RuntimeError:  # deleted or donated: nothing to place it by
        return _concrete_sharding(None, where)
    return _concrete_sharding(sharding if committed else None, where)


def read_leaf(
    like_leaf: Any,
    read: Reader,
    shape: tuple[int, ...],
    key_impl: str | None,
    where: str,
) -> Any:
    """The leaf of `like_leaf`'s kind holding the tensor `read` reads (of
    global shape `shape`, its key data for a key array of implementation
    `key_impl`): a JAX array on its sharding, a NumPy array or scalar, or a
    new `jax.Ref` holding the array where `like` has one."""
    like = like_leaf[...] if is_ref(like_leaf) else like_leaf
    if isinstance(like, (np.ndarray, np.generic)):
        host = read(whole(shape))
        return host[()] if isinstance(like, np.generic) else host
    if key_impl is not None:
        # Keys are small: read whole, then placed as `like` is.
        loaded = restore_keys(read(whole(shape)), key_impl, like)
    else:
        sharding = _target_sharding(like, where)
        if sharding is None:
            loaded = place(read(whole(shape)), like)
        else:
            loaded = _sharded(shape, sharding, read)
            if getattr(like, "weak_type", False):
                loaded = as_weak(loaded)
    wants_ref = is_ref(like_leaf) or bool(getattr(like_leaf, "is_ref", False))
    return jax.new_ref(loaded) if wants_ref else loaded
