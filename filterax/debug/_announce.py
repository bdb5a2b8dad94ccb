"""`announce_transform`: the identity, announcing each transform applied to
its argument."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import jax

from .._compat import define_identity_primitive
from .._tree._filters import is_array

__all__ = ["announce_transform"]

_T = TypeVar("_T")


def _say(stack: tuple[str, ...], params: dict[str, Any]) -> None:
    name = params["name"]
    text = ":".join(stack)
    params["announce"](text if name is None else f"({name}) {text}")


def _on_interpret(how: str, params: dict[str, Any]) -> None:
    _say((*params["stack"], how), params)


def _on_transform(which: str, params: dict[str, Any]) -> dict[str, Any]:
    if params["intermediates"] and which != "jvp_t":
        # A JVP is announced once, as `jvp`, before it splits in two.
        _say((*params["stack"], "jvp" if which == "jvp_p" else which), params)
    return {**params, "stack": (*params["stack"], which)}


_announce_p = define_identity_primitive(
    "filterax_announce_transform",
    on_interpret=_on_interpret,
    on_transform=_on_transform,
)


def announce_transform(
    x: _T,
    name: str | None = None,
    intermediates: bool = False,
    announce: Callable[[str], Any] = print,
) -> _T:
    """Returns `x` unchanged, announcing each JAX transform applied to it: a
    debugging aid, as Equinox's (its output is not a stable interface).

    Each announcement names the transforms in the order they were applied,
    ending with how the result was finally computed: `impl` (run eagerly),
    `abstract` (traced, e.g. by `jit`) or `mlir` (compiled). Transforms are
    `vmap`, `jvp_p` (the primal of a JVP), `jvp_t` (its tangent) and
    `transpose` (reverse mode transposes the tangent). Only the array leaves
    of `x` are followed.

    **Arguments:**

    - `x`: any pytree.
    - `name`: shown as `(name)` before each announcement, to tell several
      apart.
    - `intermediates`: also announce each transform as it is applied, not
      only the final computations.
    - `announce`: called with each announcement (default `print`).

    **Returns:** `x`.

    ```python
    >>> import jax, jax.numpy as jnp
    >>> import filterax as fx
    >>> def f(x):
    ...     return jnp.sin(fx.debug.announce_transform(x, name="x")).sum()
    >>> _ = jax.vmap(f)(jnp.ones((2, 3)))
    (x) vmap:impl
    >>> _ = jax.jit(f)(jnp.ones(3))
    (x) abstract
    (x) mlir

    ```
    """
    leaves, treedef = jax.tree.flatten(x)
    positions = [i for i, leaf in enumerate(leaves) if is_array(leaf)]
    if not positions:
        return x
    outs = _announce_p.bind(
        *(leaves[i] for i in positions),
        stack=(),
        name=name,
        intermediates=intermediates,
        announce=announce,
    )
    for i, out in zip(positions, outs):
        leaves[i] = out
    return jax.tree.unflatten(treedef, leaves)
