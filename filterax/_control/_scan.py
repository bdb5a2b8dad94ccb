"""`filter_scan`: `lax.scan` over any pytree."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import jax
import jax.numpy as jnp
import jax.tree_util as jtu

from .._compat import traceback_boundary
from .._tree._filters import is_array
from .._tree._structure import describe_value, path_text
from ._jaxpr import trace_body
from ._parts import Parts, check_count, check_unchanged, split_parts, strong_type

__all__ = ["filter_scan"]

Carry = TypeVar("Carry")
X = TypeVar("X")
Y = TypeVar("Y")


@traceback_boundary
def filter_scan(
    f: Callable[[Carry, X], tuple[Carry, Y]],
    init: Carry,
    xs: X = None,
    length: int | None = None,
    *,
    reverse: bool = False,
    unroll: int | bool = 1,
    checkpoints: int | None = None,
) -> tuple[Carry, Y]:
    """Scans `f` over the leading axis of the arrays in `xs`, carrying any
    pytree, as `jax.lax.scan` does for arrays.

    Array leaves (key arrays included) of `init` and `xs` are traced; every
    other leaf is static and reaches `f` as it is. A `jax.Ref` is shared, not
    copied: `f` may read and write it, and must give back the same Ref in the
    carry. `NonDifferentiable` contents are traced and get `None` gradients.

    **Arguments:**

    - `f`: `f(carry, x) -> (carry, y)`. The carry it returns must have the
      structure, non-array leaves and array shapes and dtypes of the one it
      was given.
    - `init`: the initial carry.
    - `xs`: a pytree whose arrays are sliced along axis 0, one slice per step
      (all of the same length); its other leaves, and its Refs, reach every
      step whole. A Module whose arrays were stacked by
      [`filter_vmap`][filterax.filter_vmap] of a constructor gives one layer
      per step ("scan over layers"). `None` for no inputs.
    - `length`: the number of steps; needed when `xs` holds no array.
    - `reverse`, `unroll`: as for `jax.lax.scan`.
    - `checkpoints`: `None` stores what `jax.lax.scan` stores for reverse
      mode. An integer `k` splits the scan into about `k` segments and stores
      only the carries between them, recomputing each segment's steps in the
      backward pass: memory about `k + length / k` steps, so best near
      `sqrt(length)`. Recomputing a body that writes a Ref would repeat its
      writes: such a body runs as with `None`, and differentiating the scan
      raises an error.

    **Returns:** `(carry, ys)`: the final carry, and the `y`s with their
    arrays stacked along a new axis 0 (their other leaves returned once, as
    the single trace of `f` produced them).

    **Raises:** `TypeError` naming the key path under `carry` when `f` changes
    the carry, or when differentiated with `checkpoints` given and `f`
    writes a Ref; `ValueError` when the arrays of `xs` differ in length (naming
    the leaf) or no length can be found.

    ```python
    >>> import jax.numpy as jnp
    >>> import filterax as fx
    >>> def step(carry, x):
    ...     total, label = carry
    ...     return (total + x, label), total + x
    >>> (total, label), partial_sums = fx.filter_scan(
    ...     step, (jnp.array(0.0), "sum"), jnp.arange(4.0))
    >>> total, label, partial_sums
    (Array(6., dtype=float32), 'sum', Array([0., 1., 3., 6.], dtype=float32))

    ```
    """
    carry_arrays, carry_parts = split_parts(init)
    x_arrays, x_parts = split_parts(xs)
    length = _scan_length(xs, x_arrays, length)
    check_count("filter_scan", "checkpoints", checkpoints, minimum=1)
    y_parts: list[Parts] = []

    def step(carry_in: list[Any], x_in: list[Any]) -> tuple[list[Any], list[Any]]:
        carry = carry_parts.merge(carry_in)
        out = f(carry, x_parts.merge(x_in))
        if not (isinstance(out, (tuple, list)) and len(out) == 2):
            raise TypeError(
                "filter_scan: `f` must return a pair `(carry, y)`; got "
                f"{describe_value(out)}."
            )
        new_carry, y = out
        new_arrays, new_parts = split_parts(new_carry)
        check_unchanged(
            "filter_scan", "carry", carry, carry_parts, carry_in,
            new_carry, new_parts, new_arrays, "given vs returned",
        )  # fmt: skip
        y_arrays, parts = split_parts(y)
        y_parts[:] = [parts]  # `lax.scan` retraces for weak types: keep the last
        return new_arrays, y_arrays

    if checkpoints is None or length == 0:
        final, ys = jax.lax.scan(
            step, carry_arrays, x_arrays, length, reverse=reverse, unroll=unroll
        )
    else:
        final, ys = _checkpointed_scan(
            step, carry_arrays, x_arrays, length, reverse, unroll, checkpoints
        )
    return carry_parts.merge(final), y_parts[0].merge(ys)


def _scan_length(xs: Any, x_arrays: Sequence[Any], length: int | None) -> int:
    """The one length of the arrays of `xs` (and `length`, if given)."""
    lengths: set[int | None] = {x.shape[0] if x.ndim else None for x in x_arrays}
    if len(lengths) == 1 and None not in lengths:
        found = int(next(iter(lengths)) or 0)
        if length is not None and int(length) != found:
            path = _array_paths(xs)[0]
            raise ValueError(
                f"filter_scan: length={length}, but {path_text('xs', path)} has "
                f"length {found}."
            )
        return found
    if not lengths:
        if length is None:
            raise ValueError(
                "filter_scan: `xs` holds no array, so the number of steps is "
                "unknown: pass `length`."
            )
        return int(length)
    first = x_arrays[0]
    first_where = path_text("xs", _array_paths(xs)[0])
    for path, array in zip(_array_paths(xs), x_arrays):
        where = path_text("xs", path)
        if array.ndim == 0:
            raise ValueError(
                f"filter_scan: {where} is a scalar array ({describe_value(array)}), "
                "but the arrays of `xs` are sliced along axis 0. Give it a leading "
                "axis, or close over it in `f` to pass it whole."
            )
        if array.shape[0] != first.shape[0]:
            raise ValueError(
                "filter_scan: the arrays of `xs` are sliced along axis 0, so they "
                f"must have one length, but {first_where} has length "
                f"{first.shape[0]} ({describe_value(first)}) and {where} has "
                f"length {array.shape[0]} ({describe_value(array)})."
            )
    raise AssertionError("unreachable")  # pragma: no cover


def _array_paths(xs: Any) -> list[tuple]:
    return [path for path, leaf in jtu.tree_flatten_with_path(xs)[0] if is_array(leaf)]


# --- Checkpointed scan ----------------------------------------------------------


def _checkpointed_scan(
    step: Callable[[list[Any], list[Any]], tuple[list[Any], list[Any]]],
    carry: list[Any],
    xs: list[Any],
    length: int,
    reverse: bool,
    unroll: int | bool,
    checkpoints: int,
) -> tuple[list[Any], list[Any]]:
    """A scan of `length` steps as an outer scan over segments whose inner
    scans are `jax.checkpoint`ed: reverse mode stores the carry between
    segments and recomputes one segment at a time."""
    carry = [strong_type(c) for c in carry]
    x_slices = [jax.ShapeDtypeStruct(x.shape[1:], x.dtype) for x in xs]
    num_carry = len(carry)

    def flat_step(*args: Any) -> list[Any]:
        new_carry, ys = step(list(args[:num_carry]), list(args[num_carry:]))
        return [*new_carry, *ys]

    body = trace_body(flat_step, *carry, *x_slices)

    def run(hoisted: list[Any], refs: list[Any], args: list[Any]) -> list[Any]:
        carry_in, xs_in = args[:num_carry], args[num_carry:]

        def inner(c: list[Any], x: list[Any]) -> tuple[list[Any], list[Any]]:
            outs = body.call(hoisted, refs, *c, *x)
            return outs[:num_carry], outs[num_carry:]

        if body.writes_refs:
            final, ys = jax.lax.scan(
                inner, carry_in, xs_in, length, reverse=reverse, unroll=unroll
            )
        else:
            final, ys = _segmented(
                inner, carry_in, xs_in, length, reverse, unroll, checkpoints
            )
        return [*final, *ys]

    if body.writes_refs:
        outs = _refusing_derivatives(run, body.hoisted, body.refs, [*carry, *xs])
    else:
        outs = run(body.hoisted, body.refs, [*carry, *xs])
    return outs[:num_carry], outs[num_carry:]


_REF_WRITES_MESSAGE = (
    "filter_scan(checkpoints=k) cannot be differentiated when the body writes "
    "a Ref: the backward pass would recompute steps from checkpoints and "
    "repeat those writes (forward mode is refused too: JAX offers no separate "
    "rule for it). Use checkpoints=None (every step stored, nothing "
    "recomputed), or move the state out of the Ref into the carry."
)


def _refusing_derivatives(
    run: Callable[[list[Any], list[Any], list[Any]], list[Any]],
    hoisted: list[Any],
    refs: list[Any],
    args: list[Any],
) -> list[Any]:
    """`run(hoisted, refs, args)` (a scan of a Ref-writing body, not
    recomputed), under a `jax.custom_vjp` whose forward pass raises
    filterax's error. JAX calls that forward pass under `jax.jvp` as well,
    before refusing forward mode of a `custom_vjp` itself."""

    @jax.custom_vjp
    def guarded(hoisted: list[Any], refs: list[Any], args: list[Any]) -> list[Any]:
        return run(hoisted, refs, args)

    def refuse(*_: Any) -> Any:
        raise TypeError(_REF_WRITES_MESSAGE)

    guarded.defvjp(refuse, refuse)
    return guarded(hoisted, refs, args)


def _segmented(
    inner: Callable[[list[Any], list[Any]], tuple[list[Any], list[Any]]],
    carry: list[Any],
    xs: list[Any],
    length: int,
    reverse: bool,
    unroll: int | bool,
    checkpoints: int,
) -> tuple[list[Any], list[Any]]:
    segment = -(-length // checkpoints)  # ceil: at most `checkpoints` segments
    full, tail = divmod(length, segment)

    def run_segment(steps: int, prevent_cse: bool) -> Callable:
        def run(c: list[Any], x: list[Any]) -> tuple[list[Any], list[Any]]:
            return jax.lax.scan(
                inner, c, x, length=steps, reverse=reverse, unroll=unroll
            )

        return jax.checkpoint(run, prevent_cse=prevent_cse)

    def run_head(c: list[Any]) -> tuple[list[Any], list[Any]]:
        # Inside `lax.scan`, `prevent_cse` is not needed (see `jax.checkpoint`).
        head_xs = [x[: full * segment].reshape(full, segment, *x.shape[1:]) for x in xs]
        c, ys = jax.lax.scan(
            run_segment(segment, False), c, head_xs, length=full, reverse=reverse
        )
        return c, [y.reshape(full * segment, *y.shape[2:]) for y in ys]

    def run_tail(c: list[Any]) -> tuple[list[Any], list[Any]]:
        return run_segment(tail, True)(c, [x[full * segment :] for x in xs])

    if tail == 0:
        return run_head(carry)
    if reverse:
        carry, tail_ys = run_tail(carry)
        carry, head_ys = run_head(carry)
    else:
        carry, head_ys = run_head(carry)
        carry, tail_ys = run_tail(carry)
    return carry, [jnp.concatenate([h, t]) for h, t in zip(head_ys, tail_ys)]
