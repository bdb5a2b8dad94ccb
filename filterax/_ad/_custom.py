"""`filter_custom_jvp` and `filter_custom_vjp`: custom derivative rules whose
arguments may be arbitrary pytrees, split automatically into differentiable and
non-differentiable parts."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import jax.tree_util as jtu
from jax.custom_derivatives import SymbolicZero as _JaxSymbolicZero

from .._compat import traceback_boundary
from .._module import copy_wrapped_attributes
from .._tree._filters import (
    combine,
    is_array,
    is_inexact_array,
    is_inexact_array_like,
    partition,
)
from .._tree._split import Static
from .._tree._structure import argument_path
from .._warnings import warn_deprecated
from ._nondiff import partition_differentiable
from ._perturbation import (
    LeafInfo,
    PerturbationError,
    match_perturbation,
    merge_differentiable,
    skeleton,
    split_differentiable,
)
from ._symbolic_zero import SymbolicZero, is_none_or_zero

__all__ = ["filter_custom_jvp", "filter_custom_vjp"]


def _jax_zero_to_none(tree: Any) -> Any:
    return jtu.tree_map(lambda t: None if isinstance(t, _JaxSymbolicZero) else t, tree)


def _differentiable_perturbations(
    perturbation: Any,
    structure: Any,
    diff_leaves: list[Any],
    zero: Callable[[Any], Any],
    kind: str,
    root: str,
    owner: str,
    ignore_non_differentiable: bool = False,
) -> list[Any]:
    """A user-given tangent/cotangent (the structure of what it perturbs, `None`
    or SymbolicZero anywhere), matched against `structure` (a `skeleton`), as
    a list over the differentiable leaves with `zero(leaf)` where nothing was
    given."""
    live = dict(
        match_perturbation(
            perturbation,
            structure,
            kind,
            root,
            owner=owner,
            keep_python_scalars=True,
            ignore_non_differentiable=ignore_non_differentiable,
        )
    )
    return [
        live[index] if index in live else zero(leaf)
        for index, leaf in enumerate(diff_leaves)
    ]


class BackwardRuleError(PerturbationError, RuntimeError):
    """A `filter_custom_vjp` backward rule returned a cotangent that does not
    fit `vjp_arg`. A `PerturbationError` (`ValueError`, `TypeError`) as
    filterax documents, and a `RuntimeError`, as Equinox raises."""


class MissingRuleError(RuntimeError, AttributeError):
    """A custom-derivative function called before its rule was registered. A
    `RuntimeError`, as filterax documents, and an `AttributeError`, as
    Equinox (through `jax.custom_jvp`) raises."""


def _zeros_where_missing(tangents: Any, primals: Any) -> Any:
    """`tangents` (a prefix of `primals` with `None` for "no (co)tangent")
    with zeros in place of each `None` at an inexact array: what the older,
    deprecated rule forms (`defjvp`, `defvjp`) receive, as in Equinox."""

    def fill(tangent: Any, primal: Any) -> Any:
        if tangent is not None and not isinstance(tangent, SymbolicZero):
            return tangent
        return jtu.tree_map(
            lambda leaf: jnp.zeros_like(leaf) if is_inexact_array(leaf) else None,
            primal,
        )

    return jtu.tree_map(fill, tangents, primals, is_leaf=is_none_or_zero)


class NonFirstArgumentError(RuntimeError, ValueError):
    """A `filter_custom_vjp` function is being differentiated with respect to an
    argument other than its first. A `RuntimeError`, as Equinox raises, and a
    `ValueError`, as filterax documented before."""


class filter_custom_jvp:
    """Defines a function with a custom forward-mode derivative rule, taking any
    pytrees as arguments.

    Like `jax.custom_jvp`, but there is no `nondiff_argnums`: positional
    arguments are split automatically. Their differentiable leaves (inexact
    arrays outside any `NonDifferentiable`) get tangents; every other leaf gets
    `None`, as does every differentiable leaf whose tangent is known to be zero.
    Keyword arguments are never differentiated. The function may return any
    pytree.

    **Arguments:**

    - `fn`: the function, called as `fn(*args, **kwargs)`.

    Then register the rule with `@f.def_jvp`: it is called as
    `fn_jvp(primals, tangents, **kwargs)`, where `primals` is the tuple of
    positional arguments and `tangents` matches it with `None` where there is no
    tangent. It returns `(out, t_out)`; `t_out` has `out`'s structure, with
    `None` allowed anywhere (meaning zero) and required at non-differentiable
    outputs.

    **Returns:** a callable with `fn`'s signature.

    **Raises:** `RuntimeError` when called before `def_jvp`; `ValueError` naming
    the key path (under `t_out`) when the rule's tangent does not fit `out`.

    ```python
    >>> import jax, jax.numpy as jnp
    >>> import filterax as fx
    >>> @fx.filter_custom_jvp
    ... def clipped_square(x, limit):
    ...     return jnp.minimum(x ** 2, limit)
    >>> @clipped_square.def_jvp
    ... def _(primals, tangents):
    ...     x, limit = primals
    ...     tx, _ = tangents  # `limit` is a Python float: its tangent is None
    ...     return clipped_square(x, limit), 2 * x * tx
    >>> fx.filter_grad(clipped_square)(jnp.ones(()) * 3, 4.0)
    Array(6., dtype=float32)

    ```
    """

    def __init__(self, fn: Callable):
        self.fn = fn
        self.fn_jvp: Callable | None = None
        copy_wrapped_attributes(self.__dict__, fn, annotations=True)
        self.__wrapped__ = fn
        self._custom = jax.custom_jvp(self._call_split)

    def _call_split(self, diff: Any, arrays: Any, objects: Static) -> Any:
        args, kwargs = merge_differentiable(diff, arrays, objects)
        return split_differentiable(self.fn(*args, **kwargs), is_inexact_array_like)

    def _jvp_split(self, primals: tuple, tangents: tuple) -> tuple[Any, Any]:
        assert self.fn_jvp is not None
        diff, arrays, objects = primals
        args, kwargs = merge_differentiable(diff, arrays, objects)
        # Tangents of non-differentiable inputs (including perturbed contents of
        # a NonDifferentiable) are dropped: they are held constant by contract.
        t_args, t_kwargs = _jax_zero_to_none(tangents[0])
        for path, _ in jtu.tree_flatten_with_path(t_kwargs)[0]:
            raise ValueError(
                "filter_custom_jvp never differentiates keyword arguments, but "
                f"kwargs{jtu.keystr(path)} is being differentiated. Pass it "
                "positionally, or mark it with NonDifferentiable."
            )
        out, t_out = self.fn_jvp(tuple(args), tuple(t_args), **kwargs)
        out_diff, out_arrays, out_objects = split_differentiable(
            out, is_inexact_array_like
        )
        diff_leaves, diff_def = jtu.tree_flatten(out_diff)
        t_out_diff = diff_def.unflatten(
            _differentiable_perturbations(
                t_out,
                skeleton(out, is_inexact_array_like),
                diff_leaves,
                _JaxSymbolicZero.from_primal_value,
                "tangent",
                "t_out",
                "output",
            )
        )
        t_out_arrays = jtu.tree_map(_JaxSymbolicZero.from_primal_value, out_arrays)
        return (out_diff, out_arrays, out_objects), (
            t_out_diff,
            t_out_arrays,
            out_objects,
        )

    def def_jvp(self, fn_jvp: Callable) -> Callable:
        """Registers the forward-mode rule `fn_jvp(primals, tangents, **kwargs)
        -> (out, t_out)`; see the class docstring.

        **Arguments:**

        - `fn_jvp`: the rule.

        **Returns:** `fn_jvp`, so this works as a decorator.

        ```python
        >>> import jax.numpy as jnp
        >>> import filterax as fx
        >>> @fx.filter_custom_jvp
        ... def double(x):
        ...     return 2 * x
        >>> _ = double.def_jvp(lambda primals, tangents: (double(*primals),
        ...                                               2 * tangents[0]))
        >>> fx.filter_jvp(double, (jnp.ones(2),), (jnp.ones(2),))[1]
        Array([2., 2.], dtype=float32)

        ```
        """
        self.fn_jvp = fn_jvp
        self._custom.defjvp(self._jvp_split, symbolic_zeros=True)
        return fn_jvp

    def defjvp(self, fn_jvp: Callable) -> None:
        """Deprecated (as in Equinox): registers a rule of the older form, whose
        `tangents` hold zeros, never `None`, for inexact arrays. Use
        [`def_jvp`][filterax.filter_custom_jvp.def_jvp].

        **Arguments:**

        - `fn_jvp`: the rule, `fn_jvp(primals, tangents, **kwargs) -> (out,
          t_out)`.

        **Returns:** `None`.

        ```python
        >>> import warnings
        >>> import jax.numpy as jnp
        >>> import filterax as fx
        >>> add = fx.filter_custom_jvp(lambda x, y: x + y)
        >>> with warnings.catch_warnings():
        ...     warnings.simplefilter("ignore", fx.FilteraxDeprecationWarning)
        ...     add.defjvp(lambda p, t: (add(*p), t[0] + t[1]))  # no None in t
        >>> fx.filter_jvp(add, (jnp.ones(2), jnp.ones(2)), (jnp.ones(2), None))[1]
        Array([1., 1.], dtype=float32)

        ```
        """
        warn_deprecated(
            "filter_custom_jvp.defjvp is deprecated (as in Equinox): use "
            "`def_jvp(fn_jvp)`, whose rule receives None for a zero tangent.",
            stacklevel=2,
        )

        def rule(primals: tuple, tangents: tuple, **kwargs: Any) -> Any:
            return fn_jvp(primals, _zeros_where_missing(tangents, primals), **kwargs)

        self.def_jvp(rule)

    def defjvps(self, *args: Any, **kwargs: Any) -> None:
        """Not available, as in Equinox: raises `NotImplementedError`. Use
        [`def_jvp`][filterax.filter_custom_jvp.def_jvp].

        ```python
        >>> import filterax as fx
        >>> try:
        ...     fx.filter_custom_jvp(abs).defjvps(None)
        ... except NotImplementedError:
        ...     print("use def_jvp")
        use def_jvp

        ```
        """
        raise NotImplementedError(
            "filter_custom_jvp.defjvps is not available (nor is it in Equinox): "
            "register one rule for all arguments with `def_jvp`."
        )

    @traceback_boundary
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.fn_jvp is None:
            raise MissingRuleError(
                f"filter_custom_jvp function {getattr(self.fn, '__name__', self.fn)!r}"
                " was called before its rule was registered with `.def_jvp`."
            )
        # Python scalars stay Python values (static), as in Equinox: a rule
        # or primal may branch on them.
        parts = split_differentiable((args, kwargs), is_inexact_array)
        return merge_differentiable(*self._custom(*parts))


class filter_custom_vjp:
    """Defines a function with a custom reverse-mode derivative rule, taking any
    pytrees as arguments.

    Only the first argument, `vjp_arg`, is differentiated (pack several values
    into it as a tuple). Use it as:

    ```
    @filter_custom_vjp
    def fn(vjp_arg, *args, **kwargs):
        return out  # any pytree

    @fn.def_fwd
    def fn_fwd(perturbed, vjp_arg, *args, **kwargs):
        return out, residuals  # residuals: any pytree

    @fn.def_bwd
    def fn_bwd(residuals, grad_obj, perturbed, vjp_arg, *args, **kwargs):
        return grad_vjp_arg
    ```

    - `perturbed` has `vjp_arg`'s structure with a bool per leaf: `True` for
      differentiable leaves (inexact arrays outside any `NonDifferentiable`)
      that are actually being differentiated, `False` everywhere else.
    - `grad_obj` has `out`'s structure with the output cotangent at
      differentiable leaves and `None` wherever it is zero or the leaf is not
      differentiable.
    - `grad_vjp_arg` has `vjp_arg`'s structure; `None` is accepted in place of
      any leaf or subtree (meaning zero). Whatever stands at a
      non-differentiable leaf (`None`, or the primal's value when the
      cotangent is built from `vjp_arg` with `tree_at`) is ignored, as in
      Equinox. A NumPy `float64` cotangent for a `float32` leaf is taken as
      `float32` when x64 is disabled, as JAX takes the primals.

    **Arguments:**

    - `fn`: the function.

    **Returns:** a callable with `fn`'s signature.

    **Raises:** `RuntimeError` when called before `def_fwd` and `def_bwd`;
    `ValueError` when a differentiable array in `*args`/`**kwargs` is being
    differentiated (naming its key path), or when `grad_vjp_arg` does not fit
    `vjp_arg` (naming the key path under `grad_vjp_arg`).

    ```python
    >>> import jax.numpy as jnp
    >>> import filterax as fx
    >>> @fx.filter_custom_vjp
    ... def scaled(params, factor):
    ...     return params["w"] * factor
    >>> @scaled.def_fwd
    ... def _(perturbed, params, factor):
    ...     return scaled(params, factor), None
    >>> @scaled.def_bwd
    ... def _(residuals, grad_obj, perturbed, params, factor):
    ...     return {"w": grad_obj * factor * 10, "tag": None}  # a deliberately odd rule
    >>> params = {"w": jnp.ones(()), "tag": "linear"}
    >>> fx.filter_grad(lambda p: scaled(p, 2.0))(params)
    {'tag': None, 'w': Array(20., dtype=float32)}

    ```
    """

    def __init__(self, fn: Callable):
        self.fn = fn
        self.fn_fwd: Callable | None = None
        self.fn_bwd: Callable | None = None
        copy_wrapped_attributes(self.__dict__, fn, annotations=True)
        self.__wrapped__ = fn
        self._custom = jax.custom_vjp(self._call_split)
        self._custom.defvjp(self._fwd_split, self._bwd_split, symbolic_zeros=True)

    def def_fwd(self, fn_fwd: Callable) -> Callable:
        """Registers the forward rule `fn_fwd(perturbed, vjp_arg, *args,
        **kwargs) -> (out, residuals)`; see the class docstring.

        **Arguments:**

        - `fn_fwd`: the rule.

        **Returns:** `fn_fwd`, so this works as a decorator.

        ```python
        >>> import filterax as fx
        >>> identity = fx.filter_custom_vjp(lambda x: x)
        >>> _ = identity.def_fwd(lambda perturbed, x: (x, None))

        ```
        """
        self.fn_fwd = fn_fwd
        return fn_fwd

    def def_bwd(self, fn_bwd: Callable) -> Callable:
        """Registers the backward rule `fn_bwd(residuals, grad_obj, perturbed,
        vjp_arg, *args, **kwargs) -> grad_vjp_arg`; see the class docstring.

        **Arguments:**

        - `fn_bwd`: the rule.

        **Returns:** `fn_bwd`, so this works as a decorator.

        ```python
        >>> import filterax as fx
        >>> identity = fx.filter_custom_vjp(lambda x: x)
        >>> _ = identity.def_bwd(lambda res, g, perturbed, x: g)

        ```
        """
        self.fn_bwd = fn_bwd
        return fn_bwd

    def defvjp(self, fn_fwd: Callable, fn_bwd: Callable) -> None:
        """Deprecated (as in Equinox): registers rules of the older form
        `fn_fwd(vjp_arg, *args, **kwargs) -> (out, residuals)` and
        `fn_bwd(residuals, grad_obj, vjp_arg, *args, **kwargs) -> grad_vjp_arg`,
        which take no `perturbed` argument, and whose `grad_obj` holds zeros,
        never `None`, for inexact arrays. Use `def_fwd` and `def_bwd`.

        **Arguments:**

        - `fn_fwd`, `fn_bwd`: the rules.

        **Returns:** `None`.

        ```python
        >>> import warnings
        >>> import jax.numpy as jnp
        >>> import filterax as fx
        >>> identity = fx.filter_custom_vjp(lambda x: x)
        >>> with warnings.catch_warnings():
        ...     warnings.simplefilter("ignore", fx.FilteraxDeprecationWarning)
        ...     identity.defvjp(lambda x: (x, None), lambda res, g, x: 2 * g)
        >>> fx.filter_grad(lambda x: identity(x).sum())(jnp.ones(2))
        Array([2., 2.], dtype=float32)

        ```
        """
        warn_deprecated(
            "filter_custom_vjp.defvjp is deprecated (as in Equinox): use "
            "`def_fwd(fn_fwd)` and `def_bwd(fn_bwd)`, whose rules also receive "
            "`perturbed`.",
            stacklevel=2,
        )

        def forward(perturbed: Any, *args: Any, **kwargs: Any) -> Any:
            del perturbed
            out, residuals = fn_fwd(*args, **kwargs)
            # The output too: the older rule gets zeros, never None, for the
            # cotangent of an inexact array, so their shapes are needed.
            return out, (out, residuals)

        def backward(
            residuals: Any, grad_obj: Any, perturbed: Any, *args: Any, **kwargs: Any
        ) -> Any:
            del perturbed
            out, residuals = residuals
            grad_obj = _zeros_where_missing(grad_obj, out)
            return fn_bwd(residuals, grad_obj, *args, **kwargs)

        self.def_fwd(forward)
        self.def_bwd(backward)

    def _call_split(
        self, vjp_diff: Any, args_diff: Any, arrays: Any, objects: Static
    ) -> Any:
        vjp_arg, args, kwargs = merge_differentiable(
            (vjp_diff, *args_diff), arrays, objects
        )
        return split_differentiable(self.fn(vjp_arg, *args, **kwargs))

    def _fwd_split(
        self, vjp_diff: Any, args_diff: Any, arrays: Any, objects: Static
    ) -> tuple[Any, Any]:
        assert self.fn_fwd is not None
        for path, primal in jtu.tree_flatten_with_path(args_diff)[0]:
            if primal.perturbed:
                raise NonFirstArgumentError(
                    "filter_custom_vjp only differentiates its first argument, but "
                    f"{argument_path(path)} of `fn(vjp_arg, *args, **kwargs)` is "
                    "being differentiated. Move it into the first argument (e.g. "
                    "pass a tuple), or mark it with NonDifferentiable."
                )
        diff_flags = jtu.tree_map(lambda primal: primal.perturbed, vjp_diff)
        # Which leaves of `vjp_arg` JAX differentiates, whatever type JAX hands
        # their primal values over as (a Python float, inside a trace).
        diff_mask = jtu.tree_map(lambda _: True, vjp_diff)
        diff_def = jtu.tree_structure(vjp_diff)
        vjp_diff, args_diff, arrays = jtu.tree_map(
            lambda primal: primal.value, (vjp_diff, args_diff, arrays)
        )
        vjp_arg, args, kwargs = merge_differentiable(
            (vjp_diff, *args_diff), arrays, objects
        )
        rest_flags = _falses_outside(diff_mask, vjp_arg)
        perturbed = combine(diff_flags, rest_flags)
        differentiable = combine(diff_mask, rest_flags)
        out, residuals = self.fn_fwd(perturbed, vjp_arg, *args, **kwargs)
        residual_arrays, residual_objects = partition(residuals, is_array)
        saved = (
            residual_arrays,
            Static((residual_objects, perturbed, differentiable, diff_def)),
            vjp_arg,
            args,
            kwargs,
        )
        # `vjp_arg`, `args` and `kwargs` may hold non-arrays, so they are saved
        # split like everything else that crosses a JAX boundary.
        saved = partition(saved, is_array)
        return split_differentiable(out), (saved[0], Static(saved[1]))

    def _bwd_split(self, saved: tuple, cotangent: tuple) -> tuple:
        assert self.fn_bwd is not None
        arrays, objects = saved
        (residual_arrays, static, vjp_arg, args, kwargs) = combine(
            arrays, objects.value
        )
        residual_objects, perturbed, differentiable, diff_def = static.value
        residuals = combine(residual_arrays, residual_objects)
        grad_obj = _jax_zero_to_none(cotangent[0])
        grad = self.fn_bwd(residuals, grad_obj, perturbed, vjp_arg, *args, **kwargs)
        # A `None` in `vjp_arg` (an optional argument, a Linear without bias)
        # is an empty subtree, as in its flags.
        structure = jtu.tree_map(
            lambda leaf, flag: LeafInfo(leaf, flag), vjp_arg, differentiable
        )
        try:
            perturbations = _differentiable_perturbations(
                grad,
                structure,
                [None] * diff_def.num_leaves,
                lambda _: None,
                "cotangent",
                "grad_vjp_arg",
                "argument",
                # As in Equinox: a rule may leave the primal's value (or a
                # zero) at a leaf that is not differentiated.
                ignore_non_differentiable=True,
            )
        except PerturbationError as error:
            raise BackwardRuleError(*error.args) from None
        grad_diff = diff_def.unflatten(perturbations)
        return grad_diff, None, None, None

    @traceback_boundary
    def __call__(self, vjp_arg: Any, /, *args: Any, **kwargs: Any) -> Any:
        if self.fn_fwd is None or self.fn_bwd is None:
            raise MissingRuleError(
                f"filter_custom_vjp function {getattr(self.fn, '__name__', self.fn)!r}"
                " was called before both `.def_fwd` and `.def_bwd` were used."
            )
        vjp_diff, vjp_rest = partition_differentiable(vjp_arg)
        args_diff, args_rest = partition_differentiable((args, kwargs))
        arrays, objects = partition((vjp_rest, *args_rest), is_array)
        out = self._custom(vjp_diff, args_diff, arrays, Static(objects))
        return merge_differentiable(*out)


def _falses_outside(mask: Any, tree: Any) -> Any:
    """`False` at every leaf of `tree` where `mask` (a prefix-shaped partition
    result with `None` elsewhere) has nothing."""
    return jtu.tree_map(
        lambda m, subtree: (
            None if m is not None else jtu.tree_map(lambda _: False, subtree)
        ),
        mask,
        tree,
        is_leaf=lambda x: x is None,
    )
