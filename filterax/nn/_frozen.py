"""Parameters that a layer hands to `jax.numpy` or `jax.lax`, frozen or not."""

from __future__ import annotations

from typing import Any

from .._ad import NonDifferentiable

__all__ = ["unfrozen"]


def unfrozen(parameter: Any) -> Any:
    """`parameter`, or the array inside it if it was frozen.

    Arithmetic operators unwrap a `NonDifferentiable` themselves, but `lax`
    and most `jax.numpy` functions take arrays only. Reading through `.value`
    keeps the frozen array out of every gradient.
    """
    if isinstance(parameter, NonDifferentiable):
        return parameter.value
    return parameter
