"""The argument handling the differentiation transforms share. (`FunctionWrapper`,
the base of the callable pytrees they return, lives in `_module`: the mapping
transforms use it too.)"""

from __future__ import annotations

import inspect
import sys
import warnings
from collections.abc import Callable
from typing import Any

import jax.tree_util as jtu

from .._compat import shown_in_tracebacks
from .._warnings import NoDifferentiableLeafWarning
from ._nondiff import NonDifferentiable, is_non_differentiable
from ._perturbation import describe_leaf

__all__ = ["first_argument", "unpack_aux", "warn_if_nothing_differentiable"]


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


def _first_parameter(fun: Callable[..., Any]) -> str | None:
    try:
        parameters = list(inspect.signature(fun).parameters.values())
    except (TypeError, ValueError):  # builtins and others without a signature
        return None
    if parameters and parameters[0].kind in (
        inspect.Parameter.POSITIONAL_ONLY,
        inspect.Parameter.POSITIONAL_OR_KEYWORD,
    ):
        return parameters[0].name
    return None


def _describe_argument(value: Any) -> str:
    leaves = jtu.tree_leaves(value)
    if len(leaves) == 1 and leaves[0] is value:
        return describe_leaf(value)
    if not leaves:
        return f"a {type(value).__name__} without leaves"
    kinds = sorted({_leaf_kind(leaf) for leaf in leaves[:16]})
    shown = ", ".join(kinds[:3]) + (", ..." if len(kinds) > 3 else "")
    count = "1 leaf is" if len(leaves) == 1 else f"{len(leaves)} leaves are"
    return f"a {type(value).__name__} whose {count}: {shown}"


def _leaf_kind(leaf: Any) -> str:
    dtype = getattr(leaf, "dtype", None)
    if dtype is not None and hasattr(leaf, "shape"):
        return f"{dtype} array"
    return f"Python {type(leaf).__name__}"


def _user_stacklevel() -> int:
    """The `stacklevel` for a `warnings.warn` called by this function's caller
    that names the first frame of user code: frames of filterax and of JAX
    (those their traceback filtering hides) are stepped over."""
    level = 2  # `warnings.warn`'s caller, the function calling this one
    frame = sys._getframe(2)
    while frame is not None and not shown_in_tracebacks(frame.f_code.co_filename):
        frame, level = frame.f_back, level + 1
    return level


def warn_if_nothing_differentiable(
    differentiable: Any,
    value: Any,
    fun: Callable[..., Any],
    name: str,
    what: str,
) -> None:
    """Gives a `NoDifferentiableLeafWarning` when `differentiable` (the
    differentiable part of `value`, what `name` differentiates) has no leaf
    although `value` has leaves, none of them frozen on purpose (in a
    `NonDifferentiable`): every gradient would silently be `None`. `what`
    names `value` for the message ("the first argument", "the primals")."""
    if jtu.tree_leaves(differentiable):
        return
    leaves = jtu.tree_leaves(value, is_leaf=is_non_differentiable)
    if not leaves or any(isinstance(leaf, NonDifferentiable) for leaf in leaves):
        # Nothing to differentiate, or frozen on purpose: no mistake to flag.
        return
    function = getattr(fun, "__name__", None) or type(fun).__name__
    parameter = _first_parameter(fun) if what == "the first argument" else None
    named = f" (`{parameter}`)" if parameter else ""
    warnings.warn(
        f"{name}: {what} of `{function}`{named} "
        f"{'hold' if what.endswith('s') else 'holds'} no differentiable leaf "
        f"({_describe_argument(value)}), so every gradient is None or "
        f"zero. {name} differentiates with respect to the floating-point and "
        "complex arrays (outside NonDifferentiable) of "
        f"{what}: are the arguments in the wrong order, or are the parameters "
        "integer arrays? Where this is meant, silence it with "
        '`warnings.filterwarnings("ignore", category=fx.NoDifferentiableLeafWarning)`.',
        NoDifferentiableLeafWarning,
        stacklevel=_user_stacklevel(),
    )
