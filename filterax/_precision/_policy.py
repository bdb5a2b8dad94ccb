"""`Precision`, a mixed-precision policy, and `mixed_precision`, the wrapper
that applies one to a function's arguments and outputs."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar, overload

import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np

from .._compat import traceback_boundary
from .._module import BoundMethod, FunctionWrapper, Module, Partial, field
from .._tree._structure import describe_value, one_level, path_text, prefix_difference
from ._cast import cast_leaves, cast_selected
from ._dtypes import floating_dtype

__all__ = ["Precision", "mixed_precision"]

_F = TypeVar("_F", bound=Callable[..., Any])


def _is_spec_leaf(spec: Any) -> bool:
    return one_level(spec) is None


def _check_keep(keep: Any) -> None:
    """Refuses a `keep` whose leaves are not bools or predicates, naming the
    key path of the first such leaf."""
    for path, leaf in jtu.tree_flatten_with_path(keep, is_leaf=_is_spec_leaf)[0]:
        if not isinstance(leaf, (bool, np.bool_)) and not callable(leaf):
            raise TypeError(
                f"Precision(keep=...) must be a filter spec: a bool, a predicate "
                "`leaf -> bool`, or a pytree prefix of the first argument whose "
                f"leaves are bools or predicates; at {path_text('keep', path)} it "
                f"has {describe_value(leaf)}."
            )


class Precision(Module):
    """A mixed-precision policy: the dtype parameters are kept in, the dtype
    computations run in, and the dtype outputs are returned in.

    Use it with [`mixed_precision`][filterax.mixed_precision], or read its
    dtypes to call [`cast`][filterax.cast] yourself. It holds no arrays: passed
    to [`filter_jit`][filterax.filter_jit] it is static.

    **Arguments:**

    - `param`: the dtype of the parameters (what gradients come back in).
    - `compute`: the dtype the wrapped function computes in.
    - `output`: the dtype of the wrapped function's floating outputs.
    - `keep`: which leaves of the wrapped function's first argument (`self` for
      a bound method or a callable Module) stay in `param` while computing:
      `None` (none), a predicate `leaf -> bool`, or a pytree prefix of that
      argument whose leaves are bools or predicates, as for
      [`partition`][filterax.partition]; its predicates are called on floating
      arrays only. Normalisation parameters are the usual choice.

    Each dtype may be a dtype (`jnp.bfloat16`), its name, or a short name
    (`"bf16"`, `"f16"`, `"f32"`, `"f64"`).

    **Returns:** the policy, a frozen Module.

    **Raises:** `TypeError` naming the argument when a dtype is not a floating
    dtype, or naming the key path when a leaf of `keep` is neither a bool nor a
    predicate.

    ```python
    >>> import jax.numpy as jnp
    >>> import filterax as fx
    >>> policy = fx.Precision(compute="f16")
    >>> policy.param, policy.compute, policy.output
    (dtype('float32'), dtype('float16'), dtype('float32'))

    ```
    """

    param: np.dtype = field(static=True)
    compute: np.dtype = field(static=True)
    output: np.dtype = field(static=True)
    # A pytree child, not static: a prefix tree of bools (a dict, a Module) is
    # then compared and hashed leaf by leaf, which a dict field could not be.
    keep: Any

    def __init__(
        self,
        param: Any = jnp.float32,
        compute: Any = jnp.bfloat16,
        output: Any = jnp.float32,
        keep: Any = None,
    ):
        self.param = floating_dtype(param, "Precision(param=...)")
        self.compute = floating_dtype(compute, "Precision(compute=...)")
        self.output = floating_dtype(output, "Precision(output=...)")
        _check_keep(keep)
        self.keep = keep


def _cast_first(policy: Precision, first: Any, name: str) -> Any:
    """The first argument of the wrapped function (named `name` in errors)
    cast for computing: the leaves `policy.keep` selects to `param`, every
    other floating array to `compute`."""
    keep = policy.keep
    if keep is None:
        return cast_leaves(first, policy.compute)
    if not _is_spec_leaf(keep):
        difference = prefix_difference(keep, first, _is_spec_leaf)
        if difference is not None:
            raise ValueError(
                "Precision(keep=...) must be a pytree prefix of the wrapped "
                f"function's first argument, but at {difference.where(name)} "
                f"keep has {difference.detail}."
            )
    return cast_selected(first, keep, policy.param, policy.compute)


class _MixedPrecision(FunctionWrapper):
    _transform_name = "mixed_precision"

    @traceback_boundary
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        (policy,) = self.options
        fun, compute = self.fun, policy.compute
        head: tuple[Any, ...] = ()
        if isinstance(fun, BoundMethod):
            # The bound instance is the method's first argument.
            call = functools.partial(
                fun.__func__, _cast_first(policy, fun.__self__, "self")
            )
        elif isinstance(fun, Module) and not isinstance(fun, Partial):
            call = _cast_first(policy, fun, "self")  # `self` of its `__call__`
        else:
            # A function (its arrays, as in a `Partial`, computed in `compute`)
            # whose first positional argument is the one `keep` describes.
            call = cast_leaves(fun, compute)
            if args:
                head, args = (_cast_first(policy, args[0], "args[0]"),), args[1:]
        args, kwargs = cast_leaves((args, kwargs), compute, buffers=False)
        out = call(*head, *args, **kwargs)
        return cast_leaves(out, policy.output, buffers=False)


@overload
def mixed_precision(fun: _F, policy: Precision) -> _F: ...


@overload
def mixed_precision(fun: None = None, *, policy: Precision) -> Callable[[_F], _F]: ...


def mixed_precision(fun: Any = None, policy: Any = None) -> Any:
    """Wraps a function so that it computes in the policy's `compute` dtype and
    returns its floating outputs in the `output` dtype.

    Every floating array in the arguments (Modules included, and the bound
    Module of a method or a callable Module) is cast to `policy.compute`, except
    the leaves of the first argument that `policy.keep` selects, which are cast
    to `policy.param`; integers, key arrays, static fields and other leaves pass
    as they are. The floating arrays of the output are cast to `policy.output`.
    An [`nn.State`][filterax.nn.State], in the arguments or the output, keeps
    its dtypes: its buffers (running statistics) would lose their small updates
    in half precision.

    The wrapper is a pytree (its child is `fun`, so a bound method's Module stays
    visible) and composes with every filtered transform: under
    [`filter_grad`][filterax.filter_grad] the gradients with respect to
    parameters come back in their own (`param`) dtype; under
    [`filter_jit`][filterax.filter_jit] the casts are compiled in. Used as a
    decorator in a class body it wraps the method, `self` being its first
    argument.

    **Arguments:**

    - `fun`: the function, bound method or callable Module. Omit it to get a
      decorator: `@mixed_precision(policy=policy)`.
    - `policy`: a [`Precision`][filterax.Precision].

    **Returns:** the wrapped function.

    **Raises:** `TypeError` when `policy` is not a `Precision`; when called,
    `ValueError` naming the key path when `policy.keep` is not a prefix of the
    first argument.

    ```python
    >>> import jax, jax.numpy as jnp
    >>> import filterax as fx
    >>> linear = fx.nn.Linear(3, 2, key=jax.random.key(0))
    >>> fast = fx.mixed_precision(linear, fx.Precision(compute=jnp.bfloat16))
    >>> fast(jnp.ones(3)).dtype
    dtype('float32')
    >>> def loss(model, x):
    ...     return jnp.sum(model(x))
    >>> grads = fx.filter_grad(fx.mixed_precision(loss, fx.Precision()))(linear, jnp.ones(3))
    >>> grads.weight.dtype
    dtype('float32')

    ```
    """
    if not isinstance(policy, Precision):
        raise TypeError(
            "mixed_precision(fun, policy) needs a filterax.Precision as its "
            f"policy; got {describe_value(policy)}."
        )
    if fun is None:
        return functools.partial(mixed_precision, policy=policy)
    if not callable(fun):
        raise TypeError(
            f"mixed_precision(fun, policy): `fun` must be callable; got "
            f"{describe_value(fun)}."
        )
    return _MixedPrecision(fun, (policy,))
