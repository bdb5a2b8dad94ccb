"""Forward mode allowed, reverse mode refused with a message of ours.

JAX offers no public hook that runs when a function is transposed, except
`jax.custom_derivatives.linear_call`, whose transpose is traced lazily, when
the backward pass is built. `forward_mode_only` wraps a pure function in a
`jax.custom_jvp` whose rule is the function's own JVP with each output tangent
passed through such a `linear_call`: the identity going forward, a `TypeError`
with our message going backward. The primal computation is untouched, so the
forward pass compiles to exactly what the function alone compiles to.

`linear_call` has no batching rule in JAX 0.10. When the tangents are batched
(`vmap` of `jvp`), the guard is applied inside a `jax.custom_batching.custom_vmap`
rule, which sees the whole batch as one unbatched array.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
from jax.custom_batching import custom_vmap
from jax.custom_derivatives import linear_call

from .._tree._filters import is_inexact_array

__all__ = ["forward_mode_only"]


def _identity(_: Any, tangents: list[Any]) -> list[Any]:
    return tangents


def _refuse(message: str) -> Callable[[Any, Any], Any]:
    def transpose(_: Any, cotangents: Any) -> Any:
        raise TypeError(message)

    return transpose


def _guard(tangents: list[Any], message: str) -> list[Any]:
    try:
        return linear_call(_identity, _refuse(message), (), tangents)
    except NotImplementedError as error:
        if "linear_call" not in str(error):
            raise
    return _batched_guard(message)(tangents)


def _batched_guard(message: str) -> custom_vmap:
    @custom_vmap
    def guard(tangents: list[Any]) -> list[Any]:
        return linear_call(_identity, _refuse(message), (), tangents)

    @guard.def_vmap
    def rule(
        axis_size: int, in_batched: list[Any], tangents: list[Any]
    ) -> tuple[list[Any], list[Any]]:
        return _guard(tangents, message), in_batched[0]

    return guard


def guard_tangents(tangents: Sequence[Any], message: str) -> list[Any]:
    """`tangents` unchanged; transposing raises `TypeError(message)`."""
    tangents = list(tangents)
    positions = [i for i, t in enumerate(tangents) if is_inexact_array(t)]
    if not positions:
        return tangents
    guarded = _guard([tangents[i] for i in positions], message)
    for i, t in zip(positions, guarded):
        tangents[i] = t
    return tangents


def forward_mode_only(
    fn: Callable[[list[Any], list[Any], list[Any]], list[Any]],
    hoisted: Sequence[Any],
    refs: Sequence[Any],
    args: Sequence[Any],
    message: str,
) -> list[Any]:
    """`fn(hoisted, refs, args)`, differentiable in forward mode only.

    `fn` must close over no traced value: pass values in `hoisted` and Refs in
    `refs` (see `_jaxpr.trace_body`). Reverse mode raises `TypeError(message)`
    when its backward pass is built; with Refs, `fn` is left to JAX's own
    rules.
    """

    if refs:
        # JAX cannot discharge a Ref's effects out of a `custom_jvp` (no rule
        # for `custom_jvp_call`), so a body with Refs is called as it is.
        return fn(list(hoisted), list(refs), list(args))

    @jax.custom_jvp
    def call(hoisted: list[Any], refs: list[Any], args: list[Any]) -> list[Any]:
        return fn(hoisted, refs, args)

    @call.defjvp
    def call_jvp(primals: tuple, tangents: tuple) -> tuple[list[Any], list[Any]]:
        hoisted, refs, args = primals
        hoisted_dot, _, args_dot = tangents
        outs, out_tangents = jax.jvp(
            lambda h, a: fn(h, refs, a), (hoisted, args), (hoisted_dot, args_dot)
        )
        return outs, guard_tangents(out_tangents, message)

    return call(list(hoisted), list(refs), list(args))
