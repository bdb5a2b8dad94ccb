"""`filter_vmap` and `if_array`: vectorising over the arrays of arbitrary pytrees.

Also home to the helpers that resolve a pytree *prefix* of axis specs
(`in_axes`, `out_axes`) against a full pytree, naming key paths in errors;
`filter_pmap` and `filter_shard` reuse them.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Hashable, Sequence
from typing import Any, TypeVar, overload

import jax
import jax.numpy as jnp
import jax.tree_util as jtu

from ._bound_method import BoundMethod
from ._filters import is_array
from ._static import Static

__all__ = ["filter_vmap", "if_array"]

_F = TypeVar("_F", bound=Callable[..., Any])

AxisSpec = int | None | Callable[[Any], "int | None"]


class if_array:  # noqa: N801 - a function-like name, as in Equinox
    """An axis spec: `axis` for array leaves, `None` (broadcast) for the rest.

    For the `in_axes` and `out_axes` of [`filter_vmap`][filterax.filter_vmap]
    and [`filter_pmap`][filterax.filter_pmap]; `if_array(0)` is their default.

    **Arguments:**

    - `axis`: the axis to map over for arrays.

    **Returns:** a callable `leaf -> axis or None`.

    **Raises:** `TypeError` if `axis` is not an int.

    ```python
    >>> import jax.numpy as jnp
    >>> import filterax as fx
    >>> spec = fx.if_array(1)
    >>> spec(jnp.zeros((2, 3))), spec("relu")
    (1, None)

    ```
    """

    __slots__ = ("axis",)

    def __init__(self, axis: int):
        if not isinstance(axis, int) or isinstance(axis, bool):
            raise TypeError(f"if_array: axis must be an int, got {axis!r}.")
        self.axis = axis

    def __call__(self, leaf: Any) -> int | None:
        return self.axis if is_array(leaf) else None

    def __eq__(self, other: object) -> bool:
        return type(other) is if_array and other.axis == self.axis

    def __hash__(self) -> int:
        return hash((if_array, self.axis))

    def __repr__(self) -> str:
        return f"if_array({self.axis})"


# The default `in_axes` and `out_axes` of `filter_vmap` and `filter_pmap`.
DEFAULT_AXES = if_array(0)


# --- Resolving a prefix of specs against a pytree ----------------------------------


def _is_spec(spec: Any) -> bool:
    # `None` is a spec (broadcast), not an empty subtree; a callable is applied
    # to leaves, even when it is also a pytree (a callable Module).
    return spec is None or isinstance(spec, int) or callable(spec)


def _one_level(tree: Any) -> tuple[list[tuple[Any, Any]], Any] | None:
    """`tree`'s children as `(key, child)` pairs plus a description of its node,
    or `None` for a leaf."""
    try:
        children, aux = jtu.flatten_one_level_with_keys(tree)
    except ValueError:
        return None
    if len(children) == 1 and children[0][1] is tree:  # a leaf
        return None
    return list(children), (type(tree), aux, tuple(key for key, _ in children))


def _prefix_mismatch(
    prefix: Any,
    tree: Any,
    is_spec: Callable[[Any], bool],
    describe_path: Callable[[jtu.KeyPath], str],
) -> str:
    """Where and how `prefix` fails to be a pytree prefix of `tree`."""
    path: tuple = ()
    while True:
        prefix_level, tree_level = _one_level(prefix), _one_level(tree)
        where = describe_path(path)
        if prefix_level is None or tree_level is None:
            return f"at {where}: {prefix!r} where the pytree has {tree!r}"
        if prefix_level[1] != tree_level[1]:
            return (
                f"at {where}: a {type(prefix).__name__} with keys "
                f"{[jtu.keystr((k,)) for k, _ in prefix_level[0]]} where the pytree "
                f"has a {type(tree).__name__} with keys "
                f"{[jtu.keystr((k,)) for k, _ in tree_level[0]]}"
            )
        for (key, prefix_child), (_, tree_child) in zip(prefix_level[0], tree_level[0]):
            if is_spec(prefix_child):
                continue
            try:
                jtu.tree_structure(prefix_child, is_leaf=is_spec).flatten_up_to(
                    tree_child
                )
            except (ValueError, TypeError):
                prefix, tree, path = prefix_child, tree_child, (*path, key)
                break
        else:  # pragma: no cover - flatten_up_to failed somewhere above
            return f"below {where}"


def broadcast_prefix(
    prefix: Any,
    tree: Any,
    *,
    name: str,
    root: str,
    describe_path: Callable[[jtu.KeyPath], str],
    is_spec: Callable[[Any], bool] = _is_spec,
) -> list[tuple[jtu.KeyPath, Any, Any]]:
    """Pairs every leaf of `tree` with the spec that applies to it.

    **Arguments:**

    - `prefix`: a pytree prefix of `tree` whose leaves (as told by `is_spec`)
      are specs.
    - `tree`: the full pytree.
    - `name`, `root`: how to name `prefix` and `tree` in errors.
    - `describe_path`: how to name a key path into `tree` in errors.

    **Returns:** `(key path, leaf, spec)` for each leaf of `tree`, in
    flattening order.

    **Raises:** `ValueError` saying where `prefix` is not a prefix of `tree`.
    """
    spec_leaves, spec_treedef = jtu.tree_flatten_with_path(prefix, is_leaf=is_spec)
    try:
        subtrees = spec_treedef.flatten_up_to(tree)
    except (ValueError, TypeError):
        detail = _prefix_mismatch(prefix, tree, is_spec, describe_path)
        raise ValueError(
            f"{name} must be a pytree prefix of {root}, but differs {detail}."
        ) from None
    pairs = []
    for (spec_path, spec), subtree in zip(spec_leaves, subtrees):
        for leaf_path, leaf in jtu.tree_leaves_with_path(subtree):
            pairs.append(((*spec_path, *leaf_path), leaf, spec))
    return pairs


def resolve_axis(spec: Any, leaf: Any, name: str, where: str) -> int | None:
    """The axis `spec` gives `leaf` (at `where`, for `name` in errors): a
    non-negative int or `None`. Non-arrays always get `None`: they are
    broadcast, never mapped."""
    axis = spec(leaf) if callable(spec) else spec
    if axis is not None and (not isinstance(axis, int) or isinstance(axis, bool)):
        raise ValueError(
            f"{name} at {where}: an axis spec must be an int, None, or a callable "
            f"returning one of those; got {axis!r}."
        )
    if axis is None or not is_array(leaf):
        return None
    ndim = leaf.ndim
    if not -ndim <= axis < ndim:
        raise ValueError(
            f"{name} at {where}: axis {axis} is out of range for an array of shape "
            f"{tuple(leaf.shape)}."
        )
    return axis % ndim


def call_path(path: jtu.KeyPath) -> str:
    """`args[0].weight` or `kwargs['key']` for a path into `(args, kwargs)`."""
    if not path:
        return "the arguments"
    head = "args" if path[0] == jtu.SequenceKey(0) else "kwargs"
    return head + jtu.keystr(path[1:])


def output_path(path: jtu.KeyPath) -> str:
    """`out[1]['loss']` for a path into a function's output."""
    return "out" + jtu.keystr(path)


def named_in_axes(
    fun: Callable[..., Any], in_axes: Any, args: tuple, kwargs: dict
) -> tuple[Any, dict[str, Any]]:
    """The `in_axes` prefixes of `args` and of each keyword argument.

    A dict `in_axes` names parameters (positional ones by the signature of
    `fun`); every other argument, and every keyword argument when `in_axes` is
    not a dict, gets `if_array(0)`.
    """
    default = if_array(0)
    if not isinstance(in_axes, dict):
        if isinstance(in_axes, list):
            in_axes = tuple(in_axes)
        return in_axes, dict.fromkeys(kwargs, default)
    unused = dict(in_axes)
    try:
        names = list(inspect.signature(fun).parameters)
    except (TypeError, ValueError):
        names = []
    positional = tuple(unused.pop(name, default) for name, _ in zip(names, args))
    positional += (default,) * (len(args) - len(positional))
    keyword = {name: unused.pop(name, default) for name in kwargs}
    if unused:
        raise ValueError(
            f"in_axes names {sorted(unused)}, which are not arguments of this call."
        )
    return positional, keyword


def batch_size(
    mapped: Sequence[tuple[str, Any, int]], axis_size: int | None, who: str
) -> int | None:
    """The common size of the mapped axes, checked against `axis_size`.

    `mapped` holds `(path, array, axis)` triples.
    """
    sizes: dict[int, list[str]] = {}
    if axis_size is not None:
        sizes[axis_size] = ["axis_size"]
    for path, leaf, axis in mapped:
        sizes.setdefault(leaf.shape[axis], []).append(f"{path} (axis {axis})")
    if len(sizes) > 1:
        listing = "; ".join(
            f"size {size}: {', '.join(paths[:3])}{', ...' if len(paths) > 3 else ''}"
            for size, paths in sizes.items()
        )
        raise ValueError(
            f"{who}: the mapped axes disagree on the batch size: {listing}."
        )
    if not sizes:
        raise ValueError(
            f"{who}: nothing to map over: no argument leaf is an array with an "
            "integer in_axes, so the batch size is unknown. Pass axis_size=..."
        )
    return next(iter(sizes))


# --- Outputs -----------------------------------------------------------------------

_STATIC_OUT, _MAPPED_OUT, _UNMAPPED_OUT = 0, 1, 2


def split_mapped_output(
    out: Any, out_axes: Any, who: str
) -> tuple[list[Any], list[Any], Static]:
    """Inside the mapped function: `(mapped arrays, unmapped arrays, box)`.

    Mapped arrays leave the transformation at axis 0 (moved afterwards, see
    `rebuild_mapped_output`); unmapped arrays with axis `None`; non-array
    leaves, the treedef and the requested axes ride in the box.
    """
    treedef = jtu.tree_structure(out)
    pairs = broadcast_prefix(
        out_axes,
        out,
        name=f"{who}: out_axes",
        root="the output",
        describe_path=output_path,
    )
    mapped, unmapped, static, kinds, axes, paths = [], [], [], [], [], []
    for path, leaf, spec in pairs:
        where = output_path(path)
        if not is_array(leaf):
            kinds.append(_STATIC_OUT)
            static.append(leaf)
            continue
        axis = spec(leaf) if callable(spec) else spec
        if axis is None:
            kinds.append(_UNMAPPED_OUT)
            unmapped.append(leaf)
            paths.append(where)
        elif isinstance(axis, int) and not isinstance(axis, bool):
            kinds.append(_MAPPED_OUT)
            mapped.append(leaf)
            axes.append((axis, where))
        else:
            raise ValueError(
                f"{who}: out_axes at {where}: an axis spec must be an int, None, or "
                f"a callable returning one of those; got {axis!r}."
            )
    info = (treedef, tuple(kinds), tuple(static), tuple(axes), tuple(paths))
    return mapped, unmapped, Static(info)


def rebuild_mapped_output(
    mapped: list[Any], unmapped: list[Any], box: Static, who: str
) -> Any:
    """Moves each mapped output's batch axis where `out_axes` asked, and
    rebuilds the output pytree."""
    treedef, kinds, static, axes, _ = box.value
    moved = []
    for leaf, (axis, where) in zip(mapped, axes):
        if not -leaf.ndim <= axis < leaf.ndim:
            raise ValueError(
                f"{who}: out_axes at {where} is {axis}, out of range for the "
                f"batched output of shape {tuple(leaf.shape)}."
            )
        moved.append(leaf if axis % leaf.ndim == 0 else jnp.moveaxis(leaf, 0, axis))
    iters = {
        _STATIC_OUT: iter(static),
        _MAPPED_OUT: iter(moved),
        _UNMAPPED_OUT: iter(unmapped),
    }
    return treedef.unflatten([next(iters[kind]) for kind in kinds])


def unmapped_output_error(error: ValueError, paths: Sequence[str], who: str) -> None:
    """Re-raises JAX's "output was batched" error naming the outputs at fault."""
    raise ValueError(
        f"{who}: out_axes is None for the output(s) at {', '.join(paths)}, but "
        "at least one of them depends on the mapped inputs. Give them an integer "
        "axis (or if_array(0))."
    ) from error


# --- filter_vmap ---------------------------------------------------------------------


class _VmapWrapper:
    """What `filter_vmap` returns."""

    def __init__(
        self,
        fun: Callable[..., Any],
        in_axes: Any,
        out_axes: Any,
        axis_name: Hashable | None,
        axis_size: int | None,
    ):
        self._fun = fun
        self._in_axes = in_axes
        self._out_axes = out_axes
        self._axis_name = axis_name
        self._axis_size = axis_size
        self.__wrapped__ = fun
        for attribute in ("__module__", "__name__", "__qualname__", "__doc__"):
            try:
                setattr(self, attribute, getattr(fun, attribute))
            except AttributeError:
                pass

    def __call__(self, /, *args: Any, **kwargs: Any) -> Any:
        who = "filter_vmap"
        args_axes, kwargs_axes = named_in_axes(self._fun, self._in_axes, args, kwargs)
        pairs = broadcast_prefix(
            (args_axes, kwargs_axes),
            (args, kwargs),
            name=f"{who}: in_axes",
            root="the arguments",
            describe_path=call_path,
        )
        treedef = jtu.tree_structure((args, kwargs))
        dynamic, dynamic_axes, static, is_dynamic, mapped = [], [], [], [], []
        for path, leaf, spec in pairs:
            axis = resolve_axis(spec, leaf, f"{who}: in_axes", call_path(path))
            if is_array(leaf):
                dynamic.append(leaf)
                dynamic_axes.append(axis)
                is_dynamic.append(True)
                if axis is not None:
                    mapped.append((call_path(path), leaf, axis))
            else:
                static.append(leaf)
                is_dynamic.append(False)
        batch_size(mapped, self._axis_size, who)
        fun, out_axes = self._fun, self._out_axes

        def mapped_fun(dynamic_leaves: list[Any]) -> Any:
            dynamic_iter, static_iter = iter(dynamic_leaves), iter(static)
            leaves = [next(dynamic_iter if d else static_iter) for d in is_dynamic]
            call_args, call_kwargs = treedef.unflatten(leaves)
            return split_mapped_output(fun(*call_args, **call_kwargs), out_axes, who)

        vmapped = jax.vmap(
            mapped_fun,
            in_axes=(dynamic_axes,),
            out_axes=(0, None, None),
            axis_name=self._axis_name,
            axis_size=self._axis_size,
        )
        try:
            mapped_out, unmapped_out, box = vmapped(dynamic)
        except ValueError as error:
            if "but output was batched" in str(error):
                # Trace again, shapes only, with every output mapped, to name
                # the outputs that were declared unmapped.
                everything_mapped = jax.vmap(
                    mapped_fun,
                    in_axes=(dynamic_axes,),
                    axis_name=self._axis_name,
                    axis_size=self._axis_size,
                )
                _, _, box = jax.eval_shape(everything_mapped, dynamic)
                unmapped_output_error(error, box.value[4], who)
            raise
        return rebuild_mapped_output(mapped_out, unmapped_out, box, who)

    def __get__(self, instance: Any, owner: type | None = None) -> Any:
        # As a decorator in a class body: `model.method` is a pytree holding
        # `model`, which is then the first argument (mapped per `in_axes`).
        if instance is None:
            return self
        return BoundMethod(self, instance)

    def __repr__(self) -> str:
        return f"<filter_vmap of {getattr(self, '__qualname__', self._fun)!s}>"


@overload
def filter_vmap(
    fun: _F,
    *,
    in_axes: Any = ...,
    out_axes: Any = ...,
    axis_name: Hashable | None = None,
    axis_size: int | None = None,
) -> _F: ...


@overload
def filter_vmap(
    fun: None = None,
    *,
    in_axes: Any = ...,
    out_axes: Any = ...,
    axis_name: Hashable | None = None,
    axis_size: int | None = None,
) -> Callable[[_F], _F]: ...


def filter_vmap(
    fun: Any = None,
    *,
    in_axes: Any = DEFAULT_AXES,
    out_axes: Any = DEFAULT_AXES,
    axis_name: Hashable | None = None,
    axis_size: int | None = None,
) -> Any:
    """Vectorises `fun` over the arrays of arbitrary pytrees.

    By default every array leaf of the arguments is mapped over its leading
    axis and everything else is broadcast; outputs are stacked along axis 0.
    Non-array leaves are always broadcast (passed as they are), whatever their
    spec. Typed key arrays are mapped like any other array. Arrays inside `fun`
    itself (a Module, a bound method) are broadcast: to map over a model, pass
    it as an argument.

    **Arguments:**

    - `fun`: the function to vectorise. Omit it to get a decorator.
    - `in_axes`: a pytree prefix of the positional arguments (a tuple, one entry
      per argument) whose leaves are an int (the axis to map over), `None`
      (broadcast) or a callable `leaf -> int | None`. An int or callable alone
      applies to every argument. A dict maps parameter names to such specs;
      unnamed arguments get `if_array(0)`. Keyword arguments get `if_array(0)`
      unless a dict `in_axes` names them.
    - `out_axes`: likewise, a pytree prefix of the output: where the mapped axis
      goes in each output array; `None` for outputs that do not depend on the
      mapped inputs.
    - `axis_name`: a name for the mapped axis, for collectives such as
      `jax.lax.psum`.
    - `axis_size`: the batch size; needed only when no argument is mapped.

    **Returns:** the vectorised function.

    **Raises:** when called, `ValueError` if the mapped axes disagree on the
    batch size (naming each argument's key path and size), if nothing is mapped
    and `axis_size` is missing, or if an axis spec is invalid or out of range.

    ```python
    >>> import jax.numpy as jnp
    >>> import filterax as fx
    >>> @fx.filter_vmap(in_axes=(0, None))
    ... def affine(x, params):
    ...     return params["w"] * x + params["b"], params["name"]
    >>> out, name = affine(jnp.arange(3.0), {"w": 2.0, "b": jnp.ones(()), "name": "f"})
    >>> out, name
    (Array([1., 3., 5.], dtype=float32), 'f')

    ```
    """
    if fun is None:
        return functools.partial(
            filter_vmap,
            in_axes=in_axes,
            out_axes=out_axes,
            axis_name=axis_name,
            axis_size=axis_size,
        )
    if not callable(fun):
        raise TypeError(f"filter_vmap: expected a callable, got {fun!r}.")
    return _VmapWrapper(fun, in_axes, out_axes, axis_name, axis_size)
