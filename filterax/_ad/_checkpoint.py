"""`filter_checkpoint`: rematerialisation (`jax.checkpoint`) for functions of
arbitrary pytrees."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax

from .._compat import traceback_boundary
from .._module import FunctionWrapper
from .._tree._filters import is_array
from .._tree._split import StaticPart, split
from .._tree._structure import argument_path
from ._refs import READ_ONLY, shield_refs, unshield_refs

__all__ = ["filter_checkpoint"]


class _Checkpointed(FunctionWrapper):
    _transform_name = "filter_checkpoint"

    @traceback_boundary
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        prevent_cse, policy = self.options
        # Refs are read-only in here: the backward pass runs `fun` again, which
        # would repeat its writes.
        call = shield_refs((args, kwargs), READ_ONLY, argument_path)
        dynamic, call_static = split(call)
        fun = self.fun

        def dynamic_part(dynamic: list[Any]) -> tuple[list[Any], StaticPart]:
            call_args, call_kwargs = call_static.merge(dynamic)
            return split(unshield_refs(fun(*call_args, **call_kwargs)), is_array)

        checkpointed = jax.checkpoint(
            dynamic_part, prevent_cse=prevent_cse, policy=policy
        )
        out_dynamic, out_static = checkpointed(dynamic)
        return out_static.merge(out_dynamic)


def filter_checkpoint(
    fun: Callable | None = None,
    *,
    prevent_cse: bool = True,
    policy: Callable[..., bool] | None = None,
) -> Callable:
    """Gradient checkpointing (`jax.checkpoint`) for functions of any pytrees.

    When differentiated in reverse mode, the intermediate values of `fun` are
    not stored for the backward pass but recomputed from its inputs, trading
    compute for memory. Array leaves of the arguments are traced; every other
    leaf is passed through as a Python value. `fun` may return any pytree. It
    may read the `jax.Ref`s in its arguments but not write them: the backward
    pass runs it again, which would repeat the writes.

    **Arguments:**

    - `fun`: the function to checkpoint, called as `fun(*args, **kwargs)`.
    - `prevent_cse`: stop XLA's common-subexpression elimination from undoing
      the rematerialisation (see `jax.checkpoint`). Setting it to `False` is
      safe, and faster, inside `jax.lax.scan`.
    - `policy`: which intermediates may be saved rather than recomputed; one of
      `jax.checkpoint_policies`.

    Use as `filter_checkpoint(fun)`, `@filter_checkpoint` or
    `@filter_checkpoint(policy=...)`.

    **Returns:** a function with `fun`'s signature and outputs.

    **Raises:** `ValueError` naming the Ref's key path when `fun` writes to a
    Ref in its arguments.

    ```python
    >>> import jax.numpy as jnp
    >>> import filterax as fx
    >>> @fx.filter_checkpoint
    ... def block(params, x):
    ...     return jnp.tanh(params["w"] * x) if params["act"] == "tanh" else x
    >>> params = {"w": jnp.ones(()) * 2, "act": "tanh"}
    >>> fx.filter_grad(lambda p: block(p, 0.5))(params)
    {'act': None, 'w': Array(0.2099..., dtype=float32)}

    ```
    """
    if fun is None:
        return functools.partial(
            filter_checkpoint, prevent_cse=prevent_cse, policy=policy
        )
    return _Checkpointed(fun, (prevent_cse, policy))
