"""`filter_cond` and `filter_switch`: `lax.cond`/`lax.switch` over any pytree."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax

from .._compat import traceback_boundary
from ._parts import first_difference, same_avals, split_parts

__all__ = ["filter_cond", "filter_switch"]


class _Output:
    """What one branch returned, recorded while `lax` traces it."""

    __slots__ = ("arrays", "parts", "tree")

    def __init__(self, tree: Any):
        self.tree = tree
        self.arrays, self.parts = split_parts(tree)

    def matches(self, other: _Output) -> bool:
        return self.parts.same_layout(other.parts) and same_avals(
            self.arrays, other.arrays
        )


def _branches(
    where: str,
    names: Sequence[str],
    branches: Sequence[Callable[..., Any]],
    operands: tuple[Any, ...],
    call: Callable[[list[Callable[[list[Any]], list[Any]]], list[Any]], list[Any]],
) -> Any:
    """Runs `call(flat_branches, operand_arrays)` (a `lax.cond` or
    `lax.switch`), checks that every branch returned the same kind of output,
    and rebuilds it."""
    operand_arrays, operand_parts = split_parts(operands)
    outputs: dict[int, _Output] = {}

    def flat(
        index: int, branch: Callable[..., Any]
    ) -> Callable[[list[Any]], list[Any]]:
        def run(arrays: list[Any]) -> list[Any]:
            output = _Output(branch(*operand_parts.merge(arrays)))
            outputs[index] = output
            return output.arrays

        return run

    flat_branches = [flat(i, b) for i, b in enumerate(branches)]
    try:
        out_arrays = call(flat_branches, operand_arrays)
    except TypeError:
        # `lax` refuses branches whose arrays differ; say where they do.
        _check_agree(where, names, outputs)
        raise
    _check_agree(where, names, outputs)
    first = outputs[min(outputs)]
    return first.parts.merge(out_arrays)


def _check_agree(where: str, names: Sequence[str], outputs: dict[int, _Output]) -> None:
    traced = sorted(outputs)
    if not traced:
        return
    reference = outputs[traced[0]]
    for index in traced[1:]:
        other = outputs[index]
        if reference.matches(other):
            continue
        difference = first_difference(reference.tree, other.tree)
        place = "" if difference is None else f" at {difference.where('out')}"
        detail = "" if difference is None else f": {difference.detail}"
        raise TypeError(
            f"{where}: {names[traced[0]]} and {names[index]} return different "
            f"outputs{place} ({names[traced[0]]} vs {names[index]}){detail}. The "
            "branches' arrays must agree in structure, shape and dtype, and their "
            "other leaves must be equal (the same Refs, for Refs)."
        ) from None


@traceback_boundary
def filter_cond(
    pred: Any,
    true_fun: Callable[..., Any],
    false_fun: Callable[..., Any],
    *operands: Any,
) -> Any:
    """Calls `true_fun(*operands)` if `pred` holds, else `false_fun(*operands)`,
    with any pytrees as operands and outputs, as `jax.lax.cond` does for
    arrays.

    Array leaves of the operands (key arrays included) are traced; every other
    leaf reaches the branches as it is; Refs are shared.

    **Arguments:**

    - `pred`: a boolean scalar (array or Python bool).
    - `true_fun`, `false_fun`: the branches. Their outputs' arrays must agree
      in structure, shape and dtype, and their other leaves must be equal.
    - `*operands`: passed to the branch that runs.

    **Returns:** the output of the branch taken; its non-array leaves are the
    Python values the branches returned.

    **Raises:** `TypeError` naming the branches and the key path (under `out`)
    where their outputs differ.

    ```python
    >>> import jax.numpy as jnp
    >>> import filterax as fx
    >>> def grow(x, name):
    ...     return {"x": x * 2, "name": name}
    >>> def shrink(x, name):
    ...     return {"x": x / 2, "name": name}
    >>> fx.filter_cond(jnp.array(True), grow, shrink, jnp.array(3.0), "x")
    {'name': 'x', 'x': Array(6., dtype=float32, weak_type=True)}

    ```
    """

    def call(flat: list[Callable], arrays: list[Any]) -> list[Any]:
        return jax.lax.cond(pred, flat[0], flat[1], arrays)

    return _branches(
        "filter_cond", ("true_fun", "false_fun"), (true_fun, false_fun), operands, call
    )


@traceback_boundary
def filter_switch(
    index: Any, branches: Sequence[Callable[..., Any]], *operands: Any
) -> Any:
    """Calls `branches[index](*operands)` with any pytrees as operands and
    outputs, as `jax.lax.switch` does for arrays (`index` is clamped to the
    valid range).

    **Arguments:**

    - `index`: an integer scalar (array or Python int).
    - `branches`: a non-empty sequence of callables. Their outputs' arrays must
      agree in structure, shape and dtype, and their other leaves must be
      equal.
    - `*operands`: passed to the branch that runs; arrays traced, other leaves
      as they are, Refs shared.

    **Returns:** the output of the branch taken.

    **Raises:** `TypeError` naming the two branches and the key path (under
    `out`) where their outputs differ; `ValueError` for an empty `branches`.

    ```python
    >>> import jax.numpy as jnp
    >>> import filterax as fx
    >>> branches = [lambda x: (x + 1, "add"), lambda x: (x * 10, "add")]
    >>> fx.filter_switch(jnp.array(1), branches, jnp.array(2))
    (Array(20, dtype=int32, weak_type=True), 'add')

    ```
    """
    branches = list(branches)
    if not branches:
        raise ValueError("filter_switch: `branches` must not be empty.")

    def call(flat: list[Callable], arrays: list[Any]) -> list[Any]:
        return jax.lax.switch(index, flat, arrays)

    names = [f"branch {i}" for i in range(len(branches))]
    return _branches("filter_switch", names, branches, operands, call)
