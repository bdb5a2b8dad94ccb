"""The argument handling the differentiation transforms share. (`FunctionWrapper`,
the base of the callable pytrees they return, lives in `_module`: the mapping
transforms use it too.)"""

from __future__ import annotations

from typing import Any

from ._perturbation import describe_leaf

__all__ = ["first_argument", "unpack_aux"]


def unpack_aux(result: Any, name: str) -> tuple[Any, Any]:
    """Splits `(value, aux)` returned by a `has_aux=True` function."""
    if not (isinstance(result, (tuple, list)) and len(result) == 2):
        raise TypeError(
            f"{name} was given has_aux=True, so `fun` must return a pair "
            f"(output, aux); it returned {describe_leaf(result)}."
        )
    return result[0], result[1]


def first_argument(args: tuple, kwargs: dict, name: str) -> tuple[Any, tuple]:
    """The argument a transform differentiates, with the remaining positional
    arguments; a clear error if it was not given positionally."""
    if args:
        return args[0], args[1:]
    if kwargs:
        raise TypeError(
            f"Functions wrapped with {name} must have their first argument passed "
            "positionally: it is the one differentiated, but the function was "
            f"called with keyword arguments only ({', '.join(kwargs)})."
        )
    raise TypeError(
        f"Functions wrapped with {name} must have their first argument passed "
        "positionally: it is the one differentiated, but the function was called "
        "with no arguments."
    )
