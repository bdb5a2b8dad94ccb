"""`SymbolicZero`: the explicit "no perturbation here" marker for tangents and
cotangents."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np

from .._tree._filters import is_array

__all__ = ["SymbolicZero", "cotangent_dtype", "is_none_or_zero", "zero_cotangent"]


def cotangent_dtype(dtype: Any) -> np.dtype:
    """The dtype of a tangent or cotangent for values of `dtype`: `dtype` itself
    for floating and complex dtypes, `jax.dtypes.float0` for everything else
    (integers, booleans, PRNG keys)."""
    if jnp.issubdtype(dtype, np.inexact):
        return np.dtype(dtype)
    return np.dtype(jax.dtypes.float0)


def _checked_shape(shape: Any) -> tuple[int, ...]:
    try:
        sizes = tuple(shape)
    except TypeError:
        raise TypeError(
            f"SymbolicZero: shape must be a sequence of sizes, got {shape!r}."
        ) from None
    for size in sizes:
        if isinstance(size, bool) or not isinstance(size, (int, np.integer)):
            raise TypeError(
                f"SymbolicZero: shape {shape!r} has the size {size!r}; every size "
                "must be an int."
            )
        if size < 0:
            raise ValueError(
                f"SymbolicZero: shape {shape!r} has the negative size {size}."
            )
    return tuple(int(size) for size in sizes)


class SymbolicZero:
    """A zero tangent or cotangent known to be zero before any computation runs.

    Pass it wherever a transform accepts a tangent or cotangent (in
    [`filter_vjp`][filterax.filter_vjp]'s `vjp_fn`, in
    [`filter_jvp`][filterax.filter_jvp]'s `tangents`) to say "nothing flows
    through here": unlike an array of zeros, the transform then does no work for
    that position. `None` means the same; a `SymbolicZero` additionally records
    the shape and dtype it stands for.

    It is not a registered pytree node, so every tree utility treats it as a
    leaf; it is hashable, so it may be static under `jit`.

    **Arguments:**

    - `shape`: the shape of the value it stands for.
    - `dtype`: the dtype of that value or of its cotangent; integer, boolean and
      PRNG-key dtypes are recorded as `jax.dtypes.float0`, the cotangent dtype
      JAX uses for them.

    **Returns:** the marker; `.materialize()` turns it into concrete zeros.

    **Raises:** `TypeError` when a size is not an int; `ValueError` when a size
    is negative.

    ```python
    >>> import jax.numpy as jnp
    >>> import filterax as fx
    >>> zero = fx.SymbolicZero((2,), jnp.float32)
    >>> zero
    SymbolicZero(shape=(2,), dtype=float32)
    >>> zero.materialize()
    Array([0., 0.], dtype=float32)
    >>> fx.SymbolicZero((), jnp.int32).dtype
    dtype([('float0', 'V')])

    ```
    """

    __slots__ = ("shape", "dtype")
    shape: tuple[int, ...]
    dtype: np.dtype

    def __treescope_repr__(self, path: str | None, subtree_renderer: Any) -> Any:
        """Treescope's display hook (the optional extra): shown by name, with
        array summaries, even before a Module has been displayed."""
        # Imported here: `import filterax` must not import treescope.
        from .._treescope import render_constructor

        attributes = {"shape": self.shape, "dtype": self.dtype}
        return render_constructor(
            self, attributes, path, subtree_renderer, coloured=False
        )

    def __init__(self, shape: Sequence[int], dtype: Any):
        object.__setattr__(self, "shape", _checked_shape(shape))
        object.__setattr__(self, "dtype", cotangent_dtype(dtype))

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("SymbolicZero is immutable.")

    def materialize(self) -> Any:
        """Concrete zeros of this shape and dtype.

        **Returns:** a JAX array of zeros, or a NumPy array of dtype `float0`
        (JAX arrays cannot hold `float0`).

        ```python
        >>> import jax.numpy as jnp
        >>> import filterax as fx
        >>> fx.SymbolicZero((), jnp.int32).materialize().dtype
        dtype([('float0', 'V')])

        ```
        """
        if self.dtype == jax.dtypes.float0:
            return np.zeros(self.shape, dtype=jax.dtypes.float0)
        return jnp.zeros(self.shape, dtype=self.dtype)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, SymbolicZero):
            return NotImplemented
        return self.shape == other.shape and self.dtype == other.dtype

    def __hash__(self) -> int:
        return hash((SymbolicZero, self.shape, self.dtype))

    def __repr__(self) -> str:
        dtype = "float0" if self.dtype == jax.dtypes.float0 else self.dtype.name
        return f"SymbolicZero(shape={self.shape}, dtype={dtype})"


def is_none_or_zero(x: Any) -> bool:
    """Whether `x` is `None` or a `SymbolicZero`: a tangent or cotangent that
    carries nothing. Used as `is_leaf` so that either may stand for a subtree."""
    return x is None or isinstance(x, SymbolicZero)


def _zero_for(leaf: Any) -> SymbolicZero | None:
    if is_array(leaf):
        return SymbolicZero(leaf.shape, leaf.dtype)
    return None


def zero_cotangent(tree: Any) -> Any:
    """A cotangent for `tree` that is zero everywhere, symbolically.

    **Arguments:**

    - `tree`: any pytree, typically the output of a function given to
      [`filter_vjp`][filterax.filter_vjp].

    **Returns:** `tree`'s structure with every array leaf replaced by a
    [`SymbolicZero`][filterax.SymbolicZero] of its shape and cotangent dtype
    (`float0` for integer, boolean and key arrays), and every other leaf by
    `None`.

    ```python
    >>> import jax, jax.numpy as jnp
    >>> import filterax as fx
    >>> fx.zero_cotangent({"loss": jnp.zeros(()), "step": jnp.arange(3), "tag": "x"})
    {'loss': SymbolicZero(shape=(), dtype=float32),
     'step': SymbolicZero(shape=(3,), dtype=float0),
     'tag': None}

    ```
    """
    return jtu.tree_map(_zero_for, tree)
