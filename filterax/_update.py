"""`apply_updates`: add optimizer updates to a model's parameters."""

from __future__ import annotations

from typing import Any

import jax.tree_util as jtu
import numpy as np

from ._ad._nondiff import NonDifferentiable
from ._tree._filters import is_array, is_array_like, is_ref
from ._tree._structure import path_text, prefix_difference
from ._typing import PyTree

__all__ = ["apply_updates"]


def _is_update_leaf(update: Any) -> bool:
    # `None` stands for a whole subtree left alone; a `NonDifferentiable` in the
    # updates is never looked into, as the model's wrapper is never updated.
    return update is None or isinstance(update, NonDifferentiable)


def _add(path: jtu.KeyPath, update: Any, value: Any) -> Any:
    if update is None or isinstance(value, NonDifferentiable) or is_ref(value):
        # Frozen values and state (Refs) are never optimised.
        return value
    where = path_text("", path)
    if not is_array_like(value):
        kind = "an array" if is_array(update) else f"a {type(update).__name__}"
        held = "None" if value is None else type(value).__name__
        swapped = (
            " Are the arguments swapped? apply_updates takes the model first, "
            "then the updates."
            if value is None
            else ""
        )
        raise TypeError(
            f"apply_updates: the update at {where} is {kind}, but the model holds "
            f"{held} there; expected an array or a Python number "
            f"(use `None` to leave it alone).{swapped}"
        )
    if is_array(update) and np.shape(update) != np.shape(value):
        raise ValueError(
            f"apply_updates: the update at {where} has shape {np.shape(update)}, but "
            f"the parameter there has shape {np.shape(value)}. An update must "
            "match its parameter's shape: it is never broadcast into a new one."
        )
    try:
        new = value + update
    except (TypeError, ValueError) as error:
        # Plain built-in types: subclasses may not take a single message.
        kind = TypeError if isinstance(error, TypeError) else ValueError
        raise kind(
            f"apply_updates: cannot add the update at {where}: {error}"
        ) from error
    if is_array(value) and new.dtype != value.dtype:
        # A bfloat16 parameter stays bfloat16 under a float32 update.
        new = new.astype(value.dtype)
    return new


def apply_updates(model: PyTree, updates: PyTree) -> PyTree:
    """Adds `updates` to the parameters of `model`, e.g. an optimizer's output.

    For each leaf of `updates`: `None` leaves the model's value as it is;
    anything else is added to it, as in Equinox, and must meet an array or a
    Python number there (not a string or a function). The sum keeps the
    parameter's dtype (a bfloat16 parameter stays bfloat16), and an array
    update must have the parameter's shape. A
    [`NonDifferentiable`][filterax.NonDifferentiable] or a `jax.Ref` in `model`
    is never changed, whatever `updates` holds there: frozen values and state
    are not parameters.

    **Arguments:**

    - `model`: a pytree, typically a Module.
    - `updates`: a pytree with the structure of `model`, or a prefix of it with
      `None` in place of whole subtrees (as [`filter_grad`][filterax.filter_grad]
      and `optax` produce).

    **Returns:** the updated copy of `model`.

    **Raises:** `ValueError` naming the key path when `updates` does not match
    the structure of `model`, or when an array update's shape differs from the
    parameter's; `TypeError` naming the key path when an update meets a model
    value it cannot be added to (a string, a function...).

    ```python
    >>> import jax.numpy as jnp
    >>> import filterax as fx
    >>> model = {"w": jnp.ones(2), "act": "relu", "frozen": fx.NonDifferentiable(jnp.ones(2))}
    >>> updates = {"w": jnp.full(2, 0.5), "act": None, "frozen": None}
    >>> new = fx.apply_updates(model, updates)
    >>> new["w"], new["act"]
    (Array([1.5, 1.5], dtype=float32), 'relu')

    ```
    """
    try:
        return jtu.tree_map_with_path(_add, updates, model, is_leaf=_is_update_leaf)
    except ValueError:
        difference = prefix_difference(updates, model, _is_update_or_leaf)
        if difference is None:
            raise
        raise ValueError(
            "apply_updates: `updates` must have the structure of `model`, or a "
            "prefix of it with `None` for subtrees left alone; at "
            f"{difference.where()} `updates` has {difference.detail}."
        ) from None


def _is_update_or_leaf(update: Any) -> bool:
    # A prefix leaf of `updates`: `None`, a wrapper, or any non-node value.
    return _is_update_leaf(update) or jtu.treedef_is_leaf(jtu.tree_structure(update))
