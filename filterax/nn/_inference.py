"""`inference_mode`: switches every `inference` flag in a model at once."""

from __future__ import annotations

from typing import Any, TypeVar

import jax.tree_util as jtu
import numpy as np

from .._tree._utilities import tree_at

__all__ = ["inference_mode"]

_T = TypeVar("_T")


def _with_flags(node: Any, value: bool) -> Any:
    """`node` with its `inference` attribute, and those of every node inside it
    (the flags of nested layers included: a layer holding a `Dropout`), set to
    `value`."""

    def has_flag(child: Any) -> bool:
        return child is not node and hasattr(child, "inference")

    node = jtu.tree_map(
        lambda child: _with_flags(child, value) if has_flag(child) else child,
        node,
        is_leaf=has_flag,
    )
    if hasattr(node, "inference"):
        node = tree_at(lambda flagged: flagged.inference, node, value)
    return node


def inference_mode(pytree: _T, value: bool = True) -> _T:
    """A copy of `pytree` with every layer's `inference` flag set to `value`.

    Layers that behave differently in training and inference
    ([`Dropout`][filterax.nn.Dropout], [`BatchNorm`][filterax.nn.BatchNorm],
    [`SpectralNorm`][filterax.nn.SpectralNorm], ...) have an `inference`
    field; this sets all of them, however deeply nested.

    **Arguments:**

    - `pytree`: any pytree (a model), named as in Equinox
      (`inference_mode(pytree=model)`).
    - `value`: `True` for inference, `False` to go back to training.

    **Returns:** the modified copy (`pytree` itself is unchanged).

    **Raises:** `TypeError` when `value` is not a bool.

    ```python
    >>> import filterax as fx
    >>> model = fx.nn.Sequential([fx.nn.Dropout(0.1), fx.nn.Dropout(0.2)])
    >>> [layer.inference for layer in fx.nn.inference_mode(model)]
    [True, True]
    >>> [layer.inference for layer in model]
    [False, False]

    ```
    """
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"inference_mode: `value` must be a bool, got {value!r}.")
    return _with_flags(pytree, bool(value))


def tree_inference(pytree: _T, value: bool) -> _T:
    """Deprecated (as in Equinox, which does not warn either): use
    [`inference_mode`][filterax.nn.inference_mode].

    **Arguments:**

    - `pytree`: any pytree.
    - `value`: the value of every `inference` flag.

    **Returns:** `inference_mode(pytree, value)`.

    ```python
    >>> import filterax as fx
    >>> fx.tree_inference(fx.nn.Dropout(0.5), True).inference
    True

    ```
    """
    return inference_mode(pytree, value)
