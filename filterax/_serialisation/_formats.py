"""The registered serialisation formats, and the default `filter_spec`
callables, which hand each leaf to the format of the file object they are
given.

Adding a format: a module declaring a `Format` (see `_registry.py`), and its
instance in `FORMATS` below. Input is tried against the formats in this
order; a format that takes any file object comes last.
"""

from __future__ import annotations

from typing import Any, BinaryIO

from ._equinox import EQUINOX
from ._filterax import FILTERAX
from ._numpy import NUMPY
from ._registry import Registry

__all__ = [
    "FORMATS",
    "default_deserialise_filter_spec",
    "default_serialise_filter_spec",
]

FORMATS = Registry(FILTERAX, EQUINOX, NUMPY, written=FILTERAX)


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
    FORMATS.leaf_output_format(f).save_leaf(f, leaf)


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
    return FORMATS.leaf_input_format(f).load_leaf(f, like)
