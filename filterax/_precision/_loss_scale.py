"""Loss scaling for low-precision gradients: `NoOpLossScale`,
`StaticLossScale`, `DynamicLossScale`; and `all_finite` and `select_tree`, to
skip a step whose gradients overflowed.

The scale (and the dynamic scale's counter) are array leaves, so a training
step compiled by `filter_jit` takes a changed scale without compiling again,
and `adjust` is written with `jnp.where`, never a Python branch on an array.
"""

from __future__ import annotations

from typing import Any, TypeVar

import jax
import jax.numpy as jnp
import jax.tree_util as jtu
from jaxtyping import Array, Bool, Float, Int

from .._module import Module, field
from .._tree._filters import is_array, is_inexact_array
from .._tree._structure import describe_value, path_text, structure_difference
from .._tree._utilities import tree_at

__all__ = [
    "DynamicLossScale",
    "NoOpLossScale",
    "StaticLossScale",
    "all_finite",
    "select_tree",
]

_T = TypeVar("_T")
_Scale = TypeVar("_Scale", bound="_LossScale")


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _scale_array(value: Any, argument: str) -> Array:
    """`value` as a float32 scalar array, checked to be positive when it is a
    Python number (an array may be traced)."""
    if _is_number(value) and not value > 0:
        raise ValueError(f"{argument} must be positive; got {value!r}.")
    return jnp.asarray(value, jnp.float32)


def _unscale_leaf(leaf: Any, scale: Array) -> Any:
    if not is_inexact_array(leaf):
        return leaf
    dtype = jnp.result_type(leaf)
    if jnp.issubdtype(dtype, jnp.floating) and jnp.finfo(dtype).bits < 32:
        leaf = jnp.asarray(leaf, jnp.float32)  # too narrow to hold the result
    return leaf / scale.astype(jnp.finfo(jnp.result_type(leaf)).dtype)


class _LossScale(Module):
    """What every loss scale does with its scale; subclasses say how it
    changes."""

    loss_scale: Float[Array, ""]

    def scale(self, tree: _T) -> _T:
        """Multiplies every floating (or complex) array of `tree` by the loss
        scale, in that array's own dtype; other leaves are left alone.

        **Arguments:**

        - `tree`: a pytree, typically the loss.

        **Returns:** a pytree of the same structure.
        """
        return jtu.tree_map(
            lambda x: (
                x * self.loss_scale.astype(jnp.finfo(jnp.result_type(x)).dtype)
                if is_inexact_array(x)
                else x
            ),
            tree,
        )

    def unscale(self, tree: _T) -> _T:
        """Divides every floating (or complex) array of `tree` by the loss
        scale, first casting arrays narrower than float32 (bfloat16, float16)
        to float32; other leaves (`None` gradients included) are left alone.

        **Arguments:**

        - `tree`: a pytree, typically the gradients of a scaled loss.

        **Returns:** a pytree of the same structure.
        """
        return jtu.tree_map(lambda x: _unscale_leaf(x, self.loss_scale), tree)

    def adjust(self: _Scale, grads_finite: Any) -> _Scale:
        """The loss scale for the next step, given whether this step's gradients
        were all finite.

        **Arguments:**

        - `grads_finite`: a boolean scalar (array), e.g. from
          [`all_finite`][filterax.all_finite].

        **Returns:** a loss scale of the same type.
        """
        del grads_finite
        return self


class NoOpLossScale(_LossScale):
    """A loss scale of one that never changes: the loss scale to use with
    float32 or bfloat16 training, so that one training step serves every
    precision.

    **Arguments:** none.

    **Returns:** the loss scale. Its `unscale` still casts gradients narrower
    than float32 to float32, as every loss scale's does.

    ```python
    >>> import jax.numpy as jnp
    >>> import filterax as fx
    >>> scale = fx.NoOpLossScale()
    >>> scale.scale(jnp.array(3.0)), scale.unscale(jnp.array(2.0, jnp.bfloat16)).dtype
    (Array(3., dtype=float32), dtype('float32'))

    ```
    """

    def __init__(self) -> None:
        self.loss_scale = jnp.ones((), jnp.float32)


class StaticLossScale(_LossScale):
    """A loss scale that never changes.

    **Arguments:**

    - `scale`: the factor the loss is multiplied by (positive).

    **Returns:** the loss scale; its `loss_scale` is a float32 scalar array.

    **Raises:** `ValueError` when `scale` is not positive.

    ```python
    >>> import jax.numpy as jnp
    >>> import filterax as fx
    >>> scale = fx.StaticLossScale(2.0**8)
    >>> scale.scale(jnp.array(0.5)), scale.unscale([jnp.array(256.0)])
    (Array(128., dtype=float32), [Array(1., dtype=float32)])

    ```
    """

    def __init__(self, scale: Any):
        self.loss_scale = _scale_array(scale, "StaticLossScale(scale=...)")


class DynamicLossScale(_LossScale):
    """A loss scale that shrinks when gradients overflow and grows while they
    do not: the loss scale for float16 training.

    On a step whose gradients are not all finite, `adjust` divides the scale by
    `factor` (never below `min_scale`) and restarts the counter; after `period`
    finite steps in a row it multiplies the scale by `factor` (while the result
    is finite). Skip the update of a non-finite step with
    [`select_tree`][filterax.select_tree].

    **Arguments:**

    - `scale`: the starting scale (positive).
    - `period`: the number of finite steps in a row after which the scale grows.
    - `factor`: what the scale is multiplied or divided by (greater than one).
    - `min_scale`: the smallest scale (positive).

    **Returns:** the loss scale; its `loss_scale` (float32) and `counter`
    (int32, the finite steps since the scale last changed) are scalar arrays.

    **Raises:** `ValueError` for a non-positive `scale` or `min_scale`, a
    `period` below one, or a `factor` not above one.

    ```python
    >>> import jax.numpy as jnp
    >>> import filterax as fx
    >>> scale = fx.DynamicLossScale(2.0**15, period=2)
    >>> scale = scale.adjust(jnp.array(False))  # an overflow: halve it
    >>> float(scale.loss_scale)
    16384.0
    >>> scale = scale.adjust(jnp.array(True)).adjust(jnp.array(True))
    >>> float(scale.loss_scale), int(scale.counter)
    (32768.0, 0)

    ```
    """

    counter: Int[Array, ""]
    period: int = field(static=True)
    factor: float = field(static=True)
    min_scale: float = field(static=True)

    def __init__(
        self,
        scale: Any = 2.0**15,
        period: int = 2000,
        factor: float = 2,
        min_scale: float = 1.0,
    ):
        if isinstance(period, bool) or not isinstance(period, int) or period < 1:
            raise ValueError(
                f"DynamicLossScale(period=...) must be an int of at least 1; got "
                f"{period!r}."
            )
        if not _is_number(factor) or not factor > 1:
            raise ValueError(
                f"DynamicLossScale(factor=...) must be a number above 1; got "
                f"{factor!r}."
            )
        if not _is_number(min_scale) or not min_scale > 0:
            raise ValueError(
                f"DynamicLossScale(min_scale=...) must be a positive number; got "
                f"{min_scale!r}."
            )
        self.loss_scale = _scale_array(scale, "DynamicLossScale(scale=...)")
        self.counter = jnp.zeros((), jnp.int32)
        self.period = period
        self.factor = factor
        self.min_scale = min_scale

    def adjust(self, grads_finite: Any) -> DynamicLossScale:
        """The loss scale for the next step, given whether this step's gradients
        were all finite. Compiles to selects (no Python branch on arrays), so
        it runs inside [`filter_jit`][filterax.filter_jit].

        **Arguments:**

        - `grads_finite`: a boolean scalar (array), e.g. from
          [`all_finite`][filterax.all_finite].

        **Returns:** the new `DynamicLossScale`.
        """
        finite = jnp.asarray(grads_finite, bool)
        count = self.counter + 1
        grow = finite & (count >= self.period)
        grown = self.loss_scale * self.factor
        grown = jnp.where(jnp.isfinite(grown), grown, self.loss_scale)
        shrunk = jnp.maximum(self.loss_scale / self.factor, self.min_scale)
        scale = jnp.where(finite, jnp.where(grow, grown, self.loss_scale), shrunk)
        counter = jnp.where(finite & ~grow, count, 0).astype(jnp.int32)
        return tree_at(
            lambda s: (s.loss_scale, s.counter),
            self,
            (scale.astype(jnp.float32), counter),
        )


def all_finite(tree: Any) -> Bool[Array, ""]:
    """Whether every floating (or complex) array of a pytree is finite: no
    infinity and no NaN.

    **Arguments:**

    - `tree`: any pytree, typically gradients; other leaves (`None`, integers)
      are ignored.

    **Returns:** a boolean scalar array (`True` for a tree with no floating
    array). It works under [`filter_jit`][filterax.filter_jit].

    ```python
    >>> import jax.numpy as jnp
    >>> import filterax as fx
    >>> fx.all_finite({"w": jnp.ones(2), "b": None})
    Array(True, dtype=bool)
    >>> fx.all_finite([jnp.array([1.0, jnp.inf]), jnp.array(3)])
    Array(False, dtype=bool)

    ```
    """
    checks = [
        jnp.all(jnp.isfinite(x)) for x in jtu.tree_leaves(tree) if is_inexact_array(x)
    ]
    if not checks:
        return jnp.array(True)
    return jnp.stack(checks).all()


def select_tree(pred: Any, on_true: _T, on_false: _T) -> _T:
    """Picks `on_true` or `on_false`, two pytrees of one structure, by a boolean
    scalar that may be traced: e.g. the updated model when the gradients were
    finite, the old one otherwise.

    Array leaves are selected elementwise (`jnp.where`), so the choice compiles
    into the step; non-array leaves (static fields, `None`) must be equal on
    both sides.

    **Arguments:**

    - `pred`: a boolean scalar (array).
    - `on_true`, `on_false`: pytrees of one structure, whose arrays agree in
      shape and dtype.

    **Returns:** a pytree of that structure.

    **Raises:** `TypeError` when `pred` is not a boolean scalar; `ValueError`
    naming the key path where the two trees differ in structure, in an array's
    shape or dtype, or in a non-array leaf.

    ```python
    >>> import jax.numpy as jnp
    >>> import filterax as fx
    >>> old, new = {"w": jnp.zeros(2)}, {"w": jnp.ones(2)}
    >>> fx.select_tree(fx.all_finite(new), new, old)
    {'w': Array([1., 1.], dtype=float32)}

    ```
    """
    if jnp.shape(pred) != () or jnp.result_type(pred) != jnp.bool_:
        raise TypeError(
            f"select_tree: `pred` must be a boolean scalar; got {describe_value(pred)}."
        )
    true_leaves, treedef = jtu.tree_flatten_with_path(on_true)
    false_leaves, false_def = jtu.tree_flatten(on_false)
    if treedef != false_def:
        difference = structure_difference(on_true, on_false)
        where = difference.where("") if difference else "the root"
        detail = difference.detail if difference else "different structures"
        raise ValueError(
            "select_tree: on_true and on_false must have one structure, but at "
            f"{where} they hold {detail}."
        )
    selected = []
    for (path, x), y in zip(true_leaves, false_leaves):
        if is_array(x) and is_array(y):
            if jnp.shape(x) != jnp.shape(y) or jnp.result_type(x) != jnp.result_type(y):
                raise ValueError(
                    f"select_tree: at {path_text('', path)} on_true holds "
                    f"{describe_value(x)} and on_false {describe_value(y)}; arrays "
                    "must agree in shape and dtype."
                )
            selected.append(x if x is y else jax.lax.select(pred, x, y))
        elif x is y or _equal(x, y):
            selected.append(x)
        else:
            raise ValueError(
                f"select_tree: at {path_text('', path)} on_true holds "
                f"{describe_value(x)} and on_false {describe_value(y)}; leaves "
                "that are not arrays must be equal on both sides."
            )
    return jtu.tree_unflatten(treedef, selected)


def _equal(x: Any, y: Any) -> bool:
    try:
        return bool(type(x) is type(y) and x == y)
    except Exception:  # noqa: BLE001 - an `==` that does not give a bool
        return False
