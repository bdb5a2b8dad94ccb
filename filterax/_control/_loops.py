"""`filter_fori_loop` and `filter_while_loop` over any pytree."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal, TypeVar

import jax
import jax.numpy as jnp
from jax.core import Tracer

from .._compat import traceback_boundary
from .._tree._structure import describe_value
from ._checkpointed import checkpointed_while
from ._guard import forward_mode_only
from ._jaxpr import TracedBody, trace_body
from ._parts import (
    Parts,
    array_avals,
    check_count,
    check_unchanged,
    split_parts,
    strong_type,
)

__all__ = ["filter_fori_loop", "filter_while_loop"]

Carry = TypeVar("Carry")

_KINDS = ("lax", "bounded", "checkpointed")

_LAX_REVERSE_MESSAGE = (
    '{where}: reverse-mode differentiation (grad, vjp) of a loop with kind="lax" '
    "is not supported: `lax.while_loop` keeps no record of its steps. Pass "
    '`max_steps=...` with kind="bounded" (every step stored), or use '
    'kind="checkpointed" (at most `checkpoints` carries stored, steps '
    "recomputed)."
)

_FORI_REVERSE_MESSAGE = (
    "filter_fori_loop: reverse-mode differentiation (grad, vjp) needs the loop "
    "bounds to be known when tracing (Python ints or concrete arrays), but "
    "`lower` or `upper` is traced. Make them static, or use filter_while_loop "
    'with kind="bounded" (and `max_steps`) or kind="checkpointed".'
)


class _Carry:
    """The carry of a loop: its `Parts`, the body and condition wrapped to take
    and return flat arrays, with the carry rule checked on each trace."""

    def __init__(self, where: str, init: Any):
        self.where = where
        self.arrays, self.parts = split_parts(init)

    def check(self, before: list[Any], after_tree: Any) -> list[Any]:
        after, after_parts = split_parts(after_tree)
        check_unchanged(
            self.where, "carry", self.parts.merge(before), self.parts, before,
            after_tree, after_parts, after, "given vs returned",
        )  # fmt: skip
        return after

    def merge(self, arrays: list[Any]) -> Any:
        return self.parts.merge(arrays)


def _condition(where: str, parts: Parts, cond_fun: Callable) -> Callable:
    def flat_cond(*arrays: Any) -> jax.Array:
        go = cond_fun(parts.merge(list(arrays)))
        shape, dtype = getattr(go, "shape", None), getattr(go, "dtype", None)
        if isinstance(go, bool):
            return jnp.asarray(go)
        if shape != () or dtype != jnp.bool_:
            raise TypeError(
                f"{where}: `cond_fun` must return a boolean scalar; got "
                f"{describe_value(go)}."
            )
        return go

    return flat_cond


@traceback_boundary
def filter_while_loop(
    cond_fun: Callable[[Carry], Any],
    body_fun: Callable[[Carry], Carry],
    init_val: Carry,
    *,
    kind: Literal["lax", "bounded", "checkpointed"] = "lax",
    max_steps: int | None = None,
    checkpoints: int | None = None,
) -> Carry:
    """Runs `body_fun` while `cond_fun` holds, carrying any pytree, as
    `jax.lax.while_loop` does for arrays.

    Array leaves (key arrays included) of `init_val` are traced; every other
    leaf is static. A `jax.Ref` is shared, not copied: the body may read and
    write it and must give back the same Ref.

    **Arguments:**

    - `cond_fun`: `cond_fun(carry) -> bool scalar`.
    - `body_fun`: `body_fun(carry) -> carry`, keeping the carry's structure,
      non-array leaves and array shapes and dtypes.
    - `init_val`: the initial carry.
    - `kind`: how reverse mode works.
        - `"lax"`: `jax.lax.while_loop`. Forward mode (`jvp`) only; reverse
          mode raises when its backward pass is built.
        - `"bounded"`: at most `max_steps` steps (required), every step stored
          as `jax.lax.scan` would: simple and fast, memory grows with
          `max_steps`.
        - `"checkpointed"`: at most `checkpoints` carries stored (default 16)
          whether or not the number of steps is known; the backward pass
          recomputes steps from them (O(n log n) steps while `checkpoints` is
          at least log2 of the number of steps n). Reverse mode only.
    - `max_steps`: stop after this many steps even if `cond_fun` still holds.
    - `checkpoints`: the buffer size of `kind="checkpointed"`.

    **Returns:** the final carry, with the same static leaves and Refs as
    `init_val`.

    **Raises:** `TypeError` naming the key path under `carry` when the body
    changes the carry, or when `cond_fun` does not return a boolean scalar;
    `ValueError` for an unknown `kind`, `kind="bounded"` without `max_steps`,
    or `checkpoints` with another kind; in reverse mode, `TypeError` for
    `kind="lax"`, and for `kind="checkpointed"` when the body writes a Ref
    (recomputing steps would repeat the write).

    ```python
    >>> import jax, jax.numpy as jnp
    >>> import filterax as fx
    >>> def halve(state):
    ...     x, steps, name = state
    ...     return x / 2, steps + 1, name
    >>> x, steps, name = fx.filter_while_loop(
    ...     lambda state: state[0] > 1, halve, (jnp.array(20.0), jnp.array(0), "x"))
    >>> float(x), int(steps), name
    (0.625, 5, 'x')
    >>> def loss(w):
    ...     y, _, _ = fx.filter_while_loop(
    ...         lambda s: s[0] < 10, lambda s: (s[0] * w, s[1] + 1, s[2]),
    ...         (jnp.array(1.0), jnp.array(0), "y"), kind="checkpointed")
    ...     return y
    >>> float(jax.grad(loss)(2.0))  # y = w**4 once w**4 >= 10
    32.0

    ```
    """
    where = "filter_while_loop"
    if kind not in _KINDS:
        raise ValueError(
            f"{where}: kind must be one of {', '.join(map(repr, _KINDS))}; got {kind!r}."
        )
    if kind == "bounded" and max_steps is None:
        raise ValueError(
            f'{where}: kind="bounded" needs `max_steps`, the number of steps it '
            'stores for reverse mode. For an unknown number of steps use kind="checkpointed".'
        )
    if checkpoints is not None and kind != "checkpointed":
        raise ValueError(
            f'{where}: `checkpoints` is for kind="checkpointed" only; got '
            f"kind={kind!r}."
        )
    max_steps = check_count(where, "max_steps", max_steps, minimum=0)
    checkpoints = check_count(where, "checkpoints", checkpoints, minimum=1)

    carry = _Carry(where, init_val)
    flat_cond = _condition(where, carry.parts, cond_fun)

    def flat_body(*arrays: Any) -> list[Any]:
        return carry.check(list(arrays), body_fun(carry.merge(list(arrays))))

    strong = [strong_type(x) for x in carry.arrays]
    avals = array_avals(strong)
    body = trace_body(flat_body, *avals)
    if kind == "bounded":
        assert max_steps is not None
        final = _bounded(flat_cond, body, strong, max_steps)
    else:
        cond = trace_body(flat_cond, *avals)
        if kind == "lax":
            final = _lax_while(where, cond, body, strong, max_steps)
        else:
            final = checkpointed_while(
                cond,
                body,
                strong,
                max_steps,
                16 if checkpoints is None else checkpoints,
            )
    return carry.merge(final)


def _lax_while(
    where: str,
    cond: TracedBody,
    body: TracedBody,
    carry: list[Any],
    max_steps: int | None,
) -> list[Any]:
    num_hoisted, num_refs = len(body.hoisted), len(body.refs)

    def run(hoisted: list[Any], refs: list[Any], c: list[Any]) -> list[Any]:
        body_h, cond_h = hoisted[:num_hoisted], hoisted[num_hoisted:]
        body_r, cond_r = refs[:num_refs], refs[num_refs:]

        def step(c: list[Any]) -> list[Any]:
            return body.call(body_h, body_r, *c)

        def holds(c: list[Any]) -> jax.Array:
            return cond.call(cond_h, cond_r, *c)[0]

        if max_steps is None:
            return jax.lax.while_loop(holds, step, c)
        final, _ = jax.lax.while_loop(
            lambda s: holds(s[0]) & (s[1] < max_steps),
            lambda s: (step(s[0]), s[1] + 1),
            (c, jnp.int32(0)),
        )
        return final

    return forward_mode_only(
        run,
        [*body.hoisted, *cond.hoisted],
        [*body.refs, *cond.refs],
        carry,
        _LAX_REVERSE_MESSAGE.format(where=where),
    )


def _bounded(
    cond: Callable[..., jax.Array],
    body: TracedBody,
    carry: list[Any],
    max_steps: int,
) -> list[Any]:
    """`max_steps` steps of a `lax.scan`, each running the body only while the
    condition has held so far."""

    def step(c: list[Any]) -> list[Any]:
        return body.call(body.hoisted, body.refs, *c)

    def scan_step(state: tuple, _: None) -> tuple[tuple, None]:
        c, running = state
        running = running & cond(*c)
        if body.refs:
            c = _masked_step(step, body.refs, running, c)
        else:  # a finished loop computes nothing more
            c = jax.lax.cond(running, step, lambda c: list(c), c)
        return (c, running), None

    (final, _), _ = jax.lax.scan(scan_step, (carry, jnp.bool_(True)), length=max_steps)
    return final


def _masked_step(
    step: Callable[[list[Any]], list[Any]],
    refs: list[Any],
    running: jax.Array,
    c: list[Any],
) -> list[Any]:
    """One step of a body that reads or writes Refs, always run, its effects
    undone once the loop has finished: reverse mode cannot go through a
    `lax.cond` whose branches touch Refs (JAX 0.10)."""
    before = [r[...] for r in refs]
    after = step(c)
    for r, value in zip(refs, before):
        r[...] = jnp.where(running, r[...], value)
    return [jnp.where(running, new, old) for new, old in zip(after, c)]


@traceback_boundary
def filter_fori_loop(
    lower: Any,
    upper: Any,
    body_fun: Callable[[Any, Carry], Carry],
    init_val: Carry,
    *,
    unroll: int | bool | None = None,
) -> Carry:
    """Runs `val = body_fun(i, val)` for `i` from `lower` to `upper - 1`,
    carrying any pytree, as `jax.lax.fori_loop` does for arrays.

    With bounds known when tracing (Python ints or concrete arrays), this is
    a `lax.scan` and reverse-mode differentiable; with traced bounds it is a
    while loop, differentiable in forward mode only.

    **Arguments:**

    - `lower`, `upper`: the loop bounds (integers or integer scalar arrays).
    - `body_fun`: `body_fun(i, val) -> val`, keeping the carry's structure,
      non-array leaves and array shapes and dtypes.
    - `init_val`: the initial carry; arrays traced, other leaves static, Refs
      shared.
    - `unroll`: as for `jax.lax.fori_loop`.

    **Returns:** the final carry.

    **Raises:** `TypeError` naming the key path under `carry` when the body
    changes the carry; in reverse mode with traced bounds, a `TypeError`
    saying what to do instead.

    ```python
    >>> import jax.numpy as jnp
    >>> import filterax as fx
    >>> total, name = fx.filter_fori_loop(
    ...     0, 4, lambda i, val: (val[0] + i, val[1]), (jnp.array(0), "sum"))
    >>> int(total), name
    (6, 'sum')

    ```
    """
    where = "filter_fori_loop"
    carry = _Carry(where, init_val)

    def flat_body(i: Any, arrays: list[Any]) -> list[Any]:
        return carry.check(list(arrays), body_fun(i, carry.merge(list(arrays))))

    if not (_is_traced(lower) or _is_traced(upper)):
        final = jax.lax.fori_loop(lower, upper, flat_body, carry.arrays, unroll=unroll)
        return carry.merge(final)

    strong = [strong_type(x) for x in carry.arrays]
    i_aval = jax.ShapeDtypeStruct((), jnp.result_type(lower, upper))
    body = trace_body(lambda i, *c: flat_body(i, list(c)), i_aval, *array_avals(strong))

    def run(hoisted: list[Any], refs: list[Any], args: list[Any]) -> list[Any]:
        lo, hi, *c = args
        return jax.lax.fori_loop(
            lo, hi, lambda i, c: body.call(hoisted, refs, i, *c), c, unroll=unroll
        )

    args = [jnp.asarray(lower, i_aval.dtype), jnp.asarray(upper, i_aval.dtype), *strong]
    final = forward_mode_only(run, body.hoisted, body.refs, args, _FORI_REVERSE_MESSAGE)
    return carry.merge(final)


def _is_traced(x: Any) -> bool:
    return isinstance(x, Tracer)
