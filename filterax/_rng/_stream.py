"""`RngStream`: a key and a counter, so that code asks for keys instead of
threading and splitting them by hand."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .._module import Module
from .._tree._filters import is_key_array, is_ref

__all__ = ["RngStream"]

_COUNT_DTYPE = jnp.uint32


def _as_typed_key(key: Any) -> jax.Array:
    """A typed key array from a typed key, a legacy `uint32[..., 2]` key, or an
    integer seed."""
    if is_key_array(key):
        return key
    if isinstance(key, (int, np.integer)) and not isinstance(key, bool):
        return jax.random.key(int(key))
    if isinstance(key, (jax.Array, np.ndarray)) and key.dtype == np.uint32:
        return jax.random.wrap_key_data(jnp.asarray(key))
    raise TypeError(
        "RngStream needs a typed key (`jax.random.key(seed)`), a legacy uint32 "
        f"key (`jax.random.PRNGKey(seed)`) or an integer seed; got {key!r}."
    )


class RngStream(Module):
    """A stream of PRNG keys: each call returns a new key.

    Holds a typed key and a counter `n` in a `jax.Ref`; `stream()` returns
    `jax.random.fold_in(key, n)` and advances `n`. Because the counter is a Ref,
    the stream advances in place under [`filter_jit`][filterax.filter_jit],
    inside `jax.lax.scan` bodies and [`filter_scan`][filterax.filter_scan]: the
    keys are the same as in an eager run of the same calls, and no key has to
    be threaded through the program by hand. The key and the counter are never
    differentiated.

    **Arguments:**

    - `key`: a typed key (`jax.random.key(seed)`), a legacy `uint32` key, or an
      integer seed.

    **Returns:** the stream, a Module: it can be stored in a model, passed to
    transforms and serialised (with its counter).

    ```python
    >>> import jax
    >>> import filterax as fx
    >>> stream = fx.RngStream(jax.random.key(0))
    >>> first, second = stream(), stream()
    >>> bool((jax.random.key_data(first) == jax.random.key_data(
    ...     jax.random.fold_in(jax.random.key(0), 0))).all())
    True
    >>> int(stream.count[...])
    2

    ```
    """

    key: jax.Array
    count: Any

    def __init__(self, key: Any, *, count: Any = None):
        self.key = _as_typed_key(key)
        if count is None:
            count = jax.new_ref(jnp.zeros(self.key.shape, _COUNT_DTYPE))
        elif not is_ref(count):
            count = jax.new_ref(jnp.asarray(count, _COUNT_DTYPE))
        if count.shape != self.key.shape:
            raise ValueError(
                f"RngStream: the counter has shape {count.shape} but the key has "
                f"shape {self.key.shape}; they must agree."
            )
        self.count = count

    def __call__(self) -> jax.Array:
        """The next key of the stream.

        **Returns:** `jax.random.fold_in(key, n)` for the current count `n`,
        which is then advanced by one.

        ```python
        >>> import jax
        >>> import filterax as fx
        >>> stream = fx.RngStream(0)
        >>> stream().dtype
        key<fry>
        >>> int(stream.count[...])
        1

        ```
        """
        if self.key.shape != ():
            raise ValueError(
                f"This RngStream holds a batch of {self.key.shape} keys (made by "
                "`split`); call it inside `filter_vmap`, which gives each example "
                "its own stream."
            )
        n = self.count[...]
        self.count[...] = n + 1
        return jax.random.fold_in(self.key, n)

    def split(self, num: int) -> RngStream:
        """A batch of `num` independent streams, stacked along axis 0, for
        [`filter_vmap`][filterax.filter_vmap] (each example gets one stream).

        Draws one key from this stream and splits it, so this stream advances
        by one.

        **Arguments:**

        - `num`: the number of streams.

        **Returns:** an `RngStream` whose key and counter have shape `(num,)`.

        ```python
        >>> import jax, jax.numpy as jnp
        >>> import filterax as fx
        >>> streams = fx.RngStream(0).split(4)
        >>> streams.key.shape
        (4,)
        >>> fx.filter_vmap(lambda s: jax.random.normal(s()))(streams).shape
        (4,)

        ```
        """
        keys = jax.random.split(self(), num)
        return RngStream(keys)
