"""`store_dce` and `inspect_dce`: which values did the compiler remove as dead
code?"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Hashable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.core import Tracer

from .._pretty import tree_pformat
from .._tree._filters import combine, is_array, is_key_array, partition

__all__ = ["inspect_dce", "store_dce"]


class _Removed:
    """Prints as `<DCE'd>` in place of an array the compiler removed."""

    def __repr__(self) -> str:
        return "<DCE'd>"


class _Entry:
    """One traced call of `store_dce`: the structure stored, and which of its
    arrays a run of the compiled program has computed."""

    def __init__(self, structs: list[jax.ShapeDtypeStruct], treedef: Any, static: Any):
        self.structs = structs
        self.treedef = treedef
        self.static = static
        self.alive = [False] * len(structs)

    def tree(self) -> Any:
        leaves = [
            struct if alive else _Removed()
            for struct, alive in zip(self.structs, self.alive)
        ]
        return combine(jax.tree.unflatten(self.treedef, leaves), self.static)


# name -> serial -> entry, in the order the calls were traced.
_ENTRIES: dict[Hashable, dict[int, _Entry]] = {}
_SERIALS = itertools.count()


def _inside_jit() -> bool:
    return isinstance(jnp.asarray(0) + 0, Tracer)


def _mark_alive(value: np.ndarray, *, entry: _Entry, position: int) -> np.ndarray:
    entry.alive[position] = True
    return value


def _observed(leaf: jax.Array, entry: _Entry, position: int) -> jax.Array:
    """`leaf`, passed through a host callback that records that it was computed.
    A pure callback whose output is unused is removed with the dead code."""
    mark = functools.partial(_mark_alive, entry=entry, position=position)
    if is_key_array(leaf):
        data = _observed(jax.random.key_data(leaf), entry, position)
        return jax.random.wrap_key_data(data, impl=jax.random.key_impl(leaf))
    struct = jax.ShapeDtypeStruct(leaf.shape, leaf.dtype)
    return jax.pure_callback(mark, struct, leaf, vmap_method="expand_dims")


def store_dce(x: Any, name: Hashable = None) -> Any:
    """Records, for each array of `x`, whether the compiled program still
    computes it or removed it as dead code; see
    [`inspect_dce`][filterax.debug.inspect_dce].

    Use inside a JIT-compiled function, as the identity. Each time JAX traces
    this call a new entry is made; running the compiled program fills it in.
    Non-array leaves are kept as they are.

    **Arguments:**

    - `x`: any pytree.
    - `name`: any hashable label, to inspect this call's entries apart from
      others'.

    **Returns:** `x`, unchanged.

    **Raises:** `RuntimeError` outside of JIT, where nothing is removed.

    ```python
    >>> import jax
    >>> import filterax as fx
    >>> @jax.jit
    ... def f(x):
    ...     used, unused = fx.debug.store_dce((x * 2, x + 1), name="doc")
    ...     return used
    >>> _ = f(1.0)
    >>> fx.debug.inspect_dce("doc")
    Found 1 call to `filterax.debug.store_dce`.
    Entry 0:
    (f32[], <DCE'd>)

    ```
    """
    if not _inside_jit():
        raise RuntimeError(
            "store_dce: call it inside a JIT-compiled function (`jax.jit`, "
            "`filterax.filter_jit`); outside of JIT nothing is removed as dead code."
        )
    dynamic, static = partition(x, is_array)
    leaves, treedef = jax.tree.flatten(dynamic)
    structs = [jax.ShapeDtypeStruct(leaf.shape, leaf.dtype) for leaf in leaves]
    entry = _Entry(structs, treedef, static)
    _ENTRIES.setdefault(name, {})[next(_SERIALS)] = entry
    observed = [_observed(leaf, entry, i) for i, leaf in enumerate(leaves)]
    return combine(jax.tree.unflatten(treedef, observed), static)


def inspect_dce(name: Hashable = None) -> None:
    """Prints what [`store_dce`][filterax.debug.store_dce] recorded: each traced
    call's pytree, with `<DCE'd>` in place of the arrays the compiler removed.

    Run the compiled function first: an array shows as removed until a run
    has computed it.

    **Arguments:**

    - `name`: the label given to `store_dce` (default `None`).

    **Returns:** `None`; the report goes to standard output.

    **Raises:** `RuntimeError` inside of JIT.

    ```python
    >>> import filterax as fx
    >>> fx.debug.inspect_dce("a label never stored")
    Found 0 calls to `filterax.debug.store_dce`.

    ```
    """
    if _inside_jit():
        raise RuntimeError(
            "inspect_dce: call it outside of JIT, after running the compiled "
            "function that called `store_dce`."
        )
    entries = list(_ENTRIES.get(name, {}).values())
    calls = "call" if len(entries) == 1 else "calls"
    print(f"Found {len(entries)} {calls} to `filterax.debug.store_dce`.")
    for number, entry in enumerate(entries):
        print(f"Entry {number}:")
        print(tree_pformat(entry.tree(), struct_as_array=True))
