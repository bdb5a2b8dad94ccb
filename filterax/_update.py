"""`apply_updates`: add optimizer updates to a model's arrays."""

from __future__ import annotations

from typing import Any

import jax.tree_util as jtu

from ._filters import is_array, is_array_like
from ._nondiff import NonDifferentiable

__all__ = ["apply_updates"]


def _is_update_leaf(update: Any) -> bool:
    # `None` stands for a whole subtree left alone; a `NonDifferentiable` in the
    # updates is never looked into, as the model's wrapper is never updated.
    return update is None or isinstance(update, NonDifferentiable)


def _where_text(path: jtu.KeyPath) -> str:
    return jtu.keystr(path) if path else "the root"


def _one_level(tree: Any) -> tuple[list[tuple[jtu.KeyPath, Any]], Any]:
    """The children of `tree` with their key paths, and its one-level treedef."""
    return jtu.tree_flatten_with_path(tree, is_leaf=lambda child: child is not tree)


def _is_leaf_def(treedef: Any) -> bool:
    return treedef.num_nodes == 1 and treedef.num_leaves == 1


def _structure_error(updates: Any, model: Any, path: jtu.KeyPath = ()) -> ValueError:
    """Describes the first place where `updates` stops matching `model`."""
    update_children, update_def = _one_level(updates)
    model_children, model_def = _one_level(model)
    if not _is_update_leaf(updates) and update_def == model_def:
        for (keys, update_child), (_, model_child) in zip(
            update_children, model_children
        ):
            try:
                jtu.tree_structure(update_child, is_leaf=_is_update_leaf).flatten_up_to(
                    model_child
                )
            except (ValueError, TypeError):
                return _structure_error(update_child, model_child, (*path, *keys))
    if _is_leaf_def(update_def) or _is_update_leaf(updates):
        found = type(updates).__name__
    else:
        found = f"{type(updates).__name__} {update_def}"
    expected = type(model).__name__
    if not _is_leaf_def(model_def):
        expected += f" {model_def}"
    return ValueError(
        "apply_updates: `updates` must have the structure of `model`, or a prefix "
        f"of it with `None` for subtrees left alone; at {_where_text(path)} "
        f"`updates` has {found} where `model` has {expected}."
    )


def apply_updates(model: Any, updates: Any) -> Any:
    """Adds `updates` to the arrays of `model`, e.g. an optimizer's output.

    For each leaf of `updates`: an array is added to the model's value at the
    same place; `None`, or any non-array value, leaves the model's value as it
    is. A [`NonDifferentiable`][filterax.NonDifferentiable] in `model` is never
    changed, whatever `updates` holds there.

    **Arguments:**

    - `model`: a pytree, typically a Module.
    - `updates`: a pytree with the structure of `model`, or a prefix of it with
      `None` in place of whole subtrees (as [`filter_grad`][filterax.filter_grad]
      and `optax` produce).

    **Returns:** the updated copy of `model`.

    **Raises:** `ValueError` naming the key path when `updates` does not match
    the structure of `model`; `TypeError` naming the key path when an array
    update meets a model value that is neither an array nor a Python number, or
    cannot be added to it (e.g. mismatched shapes).

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

    def apply(path: jtu.KeyPath, update: Any, value: Any) -> Any:
        if not is_array(update) or isinstance(value, NonDifferentiable):
            return value
        if not is_array_like(value):
            raise TypeError(
                f"apply_updates: the update at {_where_text(path)} is an array, but "
                f"the model holds {type(value).__name__} there; expected an array "
                "or a Python number (use `None` to leave it alone)."
            )
        try:
            return value + update
        except (TypeError, ValueError) as error:
            # Plain built-in types: subclasses may not take a single message.
            kind = TypeError if isinstance(error, TypeError) else ValueError
            raise kind(
                f"apply_updates: cannot add the update at {_where_text(path)}: {error}"
            ) from error

    try:
        return jtu.tree_map_with_path(apply, updates, model, is_leaf=_is_update_leaf)
    except ValueError:
        try:
            jtu.tree_structure(updates, is_leaf=_is_update_leaf).flatten_up_to(model)
        except (ValueError, TypeError):
            raise _structure_error(updates, model) from None
        raise
