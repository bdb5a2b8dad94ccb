"""`filter_shard_map`: `jax.shard_map` over the arrays of arbitrary pytrees.

`jax.shard_map` takes arrays only: a Module holding a function, a string or an
int among the arguments fails. Here the arguments and the function itself are
split once (`_tree._split.split`): their arrays are what `jax.shard_map` maps, split
by the `PartitionSpec` covering each (the function's own arrays replicated,
`P()`), and everything else rides along in the static part, merged back on
each device. The output is split the same way inside the mapped function:
its arrays leave through `jax.shard_map` with their `out_specs`, the rest
comes back as the very Python values the trace produced.

A call runs through one module-level `jax.jit` whose static argument is the
call's `_Plan` (static parts, mesh, specs): called outside any trace, the
mapped program is compiled once per plan (an eager `jax.shard_map` compiles on
every call); inside `filter_jit`, `filter_grad` or `filter_vmap` it is
inlined like any nested `jax.jit`.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from typing import Any, TypeVar, overload

import jax
import jax.tree_util as jtu
from jax.core import Tracer
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

from .._caches import register_cache_clearer
from .._compat import traceback_boundary
from .._module import FunctionWrapper
from .._tree._filters import is_ref
from .._tree._split import MixedOutput, StaticPart, split
from .._tree._structure import path_text
from ._axes import flatten_spec_prefix, specs_for_leaves

__all__ = ["ShardMapWrapper", "filter_shard_map"]

_F = TypeVar("_F", bound=Callable[..., Any])
_WHO = "filter_shard_map"
_REPLICATED = PartitionSpec()


def _is_partition_spec(spec: Any) -> bool:
    """A leaf of a spec prefix: a `PartitionSpec`, or `None` (replicated)."""
    return spec is None or isinstance(spec, PartitionSpec)


class Specs:
    """A prefix of `PartitionSpec`s as the user gave it (`tree`), hashable by
    its flattened form: it is static data of the wrapper and of the plan."""

    __slots__ = ("_key", "tree")

    def __init__(self, tree: Any, name: str):
        self.tree = tree
        self._key = flatten_spec_prefix(
            tree,
            _is_partition_spec,
            f"{_WHO}: {name}",
            "a spec prefix holds jax.sharding.PartitionSpecs (or None for P(), "
            "replicated).",
        )
        try:
            hash(self._key)
        except TypeError:
            raise TypeError(
                f"{_WHO}: {name} must be a hashable pytree of PartitionSpecs."
            ) from None

    def __eq__(self, other: object) -> bool:
        return type(other) is Specs and other._key == self._key

    def __hash__(self) -> int:
        return hash(self._key)

    def __repr__(self) -> str:
        return repr(self.tree)


class _Plan:
    """What one call fixes, and the static argument of `_run`: the static
    parts of the function and of `(args, kwargs)`, the mesh (`None`: the one
    set by `jax.set_mesh`), one spec per argument array, the output specs."""

    __slots__ = ("_hash", "call", "check_vma", "fun", "in_specs", "mesh", "out_specs")

    def __init__(
        self,
        fun: StaticPart,
        call: StaticPart,
        mesh: Mesh | None,
        in_specs: tuple[PartitionSpec, ...],
        out_specs: Specs,
        check_vma: bool,
    ):
        self.fun = fun
        self.call = call
        self.mesh = mesh
        self.in_specs = in_specs
        self.out_specs = out_specs
        self.check_vma = check_vma
        self._hash = hash((fun, call, mesh, in_specs, out_specs, check_vma))

    def _key(self) -> tuple:
        return (
            self.fun,
            self.call,
            self.mesh,
            self.in_specs,
            self.out_specs,
            self.check_vma,
        )

    def __eq__(self, other: object) -> bool:
        return type(other) is _Plan and (
            other is self or (other._hash == self._hash and other._key() == self._key())
        )

    def __hash__(self) -> int:
        return self._hash


def _mesh_shape(mesh: Any) -> dict[Any, int]:
    return dict(mesh.shape)


def _check_spec(
    spec: PartitionSpec, shape: tuple[int, ...], sizes: dict[Any, int], where: str
) -> None:
    """`ValueError` naming `where` when `spec` does not fit an array of
    `shape` on a mesh of axis `sizes`."""
    if len(spec) > len(shape):
        raise ValueError(
            f"{_WHO}: the spec {spec} at {where} has {len(spec)} entries, but the "
            f"array there has shape {shape} ({len(shape)} dimensions)."
        )
    for dimension, entry in enumerate(spec):
        names = entry if isinstance(entry, tuple) else (entry,)
        names = tuple(name for name in names if name is not None)
        unknown = [name for name in names if name not in sizes]
        if unknown:
            raise ValueError(
                f"{_WHO}: the spec {spec} at {where} names the mesh axis "
                f"{unknown[0]!r}, which the mesh (axes {tuple(sizes)}) does not have."
            )
        split_into = math.prod(sizes[name] for name in names)
        if shape[dimension] % split_into:
            raise ValueError(
                f"{_WHO}: the spec {spec} at {where} splits dimension {dimension} "
                f"(of size {shape[dimension]}) into {split_into} parts, which does "
                "not divide it."
            )


def _output_path(out: Any, index: int) -> str:
    """The key path of the `index`-th leaf of `out`, as text (for errors)."""
    path, _ = jtu.tree_leaves_with_path(out)[index]
    return path_text("the output", path)


def _explicit(mesh: Any) -> bool:
    return any(kind == AxisType.Explicit for kind in mesh.axis_types)


def _laid_out(leaf: Any, spec: PartitionSpec, mesh: Any) -> Any:
    """On `Explicit` mesh axes `jax.shard_map` wants each input already laid
    out as its spec says: `leaf`, resharded if it is not."""
    current = jax.typeof(leaf).sharding.spec
    padded = (*spec, *(None,) * (leaf.ndim - len(spec)))
    if tuple(current) == padded:
        return leaf
    if isinstance(mesh, Mesh):
        return jax.sharding.reshard(leaf, NamedSharding(mesh, spec))
    return jax.sharding.reshard(leaf, spec)


def _mapped_body(
    plan: _Plan, out_specs: list[Any], statics: list[StaticPart], sizes: dict
) -> Callable[[list[Any], list[Any]], list[Any]]:
    """The function `jax.shard_map` traces on each device. It fills
    `out_specs` (the list given to `jax.shard_map` as its `out_specs`, which
    JAX reads once the function has returned) with one spec per output array,
    and `statics` with the output's static part."""

    def body(fun_dynamic: list[Any], dynamic: list[Any]) -> list[Any]:
        fun = plan.fun.merge(fun_dynamic)
        args, kwargs = plan.call.merge(dynamic)
        out = fun(*args, **kwargs)
        leaves, specs, _ = specs_for_leaves(
            plan.out_specs.tree,
            out,
            name=f"{_WHO}: out_specs",
            root="the output",
            is_spec=_is_partition_spec,
        )
        arrays, static = split(out)
        chosen = []
        for index, (is_dynamic, leaf, spec) in enumerate(
            zip(static.mask, leaves, specs)
        ):
            if not is_dynamic:
                continue
            if is_ref(leaf):
                raise TypeError(
                    f"{_WHO}: the output at {_output_path(out, index)} is a "
                    "jax.Ref; return its value (`ref[...]`) instead."
                )
            spec = _REPLICATED if spec is None else spec
            if len(spec) > leaf.ndim:
                _check_spec(spec, tuple(leaf.shape), sizes, _output_path(out, index))
            chosen.append(spec)
        out_specs[:] = chosen
        statics[:] = [static]
        return arrays

    return body


def _run_mapped(plan: _Plan, fun_dynamic: list[Any], dynamic: list[Any]) -> MixedOutput:
    mesh = plan.mesh if plan.mesh is not None else jax.sharding.get_abstract_mesh()
    sizes = _mesh_shape(mesh)
    fun_specs = [_REPLICATED] * len(fun_dynamic)
    if _explicit(mesh):
        fun_dynamic = [_laid_out(leaf, _REPLICATED, mesh) for leaf in fun_dynamic]
        dynamic = [
            _laid_out(leaf, spec, mesh) for leaf, spec in zip(dynamic, plan.in_specs)
        ]
    out_specs: list[Any] = []
    statics: list[StaticPart] = []
    mapped = jax.shard_map(
        _mapped_body(plan, out_specs, statics, sizes),
        mesh=plan.mesh,
        in_specs=(fun_specs, list(plan.in_specs)),
        out_specs=out_specs,
        check_vma=plan.check_vma,
    )
    arrays = mapped(fun_dynamic, dynamic)
    return MixedOutput(arrays, statics[0])


# One `jax.jit` for every call: its static argument, the plan, keys the cache.
_run: Any = jax.jit(_run_mapped, static_argnums=0)


@register_cache_clearer
def _clear_shard_map_cache() -> None:
    _run.clear_cache()


class ShardMapWrapper(FunctionWrapper):
    """What `filter_shard_map` returns: a pytree whose child is the wrapped
    function and whose static data are the mesh and specs. As a decorator in
    a class body, `model.method` is a pytree holding `model`, which is then
    the first argument (split per `in_specs`)."""

    _transform_name = _WHO
    _keeps_annotations = False  # the mapped function takes other shapes

    def __init__(
        self,
        fun: Callable[..., Any],
        mesh: Mesh | None,
        in_specs: Specs,
        out_specs: Specs,
        check_vma: bool,
    ):
        super().__init__(fun, (mesh, in_specs, out_specs, check_vma))
        self.mesh = mesh
        self.in_specs = in_specs
        self.out_specs = out_specs
        self.check_vma = check_vma

    @classmethod
    def _from_options(cls, fun: Callable[..., Any], options: tuple) -> ShardMapWrapper:
        return cls(fun, *options)

    def _argument_specs(
        self, args: tuple, kwargs: dict, static: StaticPart, sizes: dict
    ) -> tuple[PartitionSpec, ...]:
        """One spec per array of `(args, kwargs)` (keyword arguments
        replicated), each checked against its array."""
        leaves, specs, _ = specs_for_leaves(
            (self.in_specs.tree, dict.fromkeys(kwargs)),
            (args, kwargs),
            name=f"{_WHO}: in_specs",
            root="args",
            is_spec=_is_partition_spec,
            describe=_describe_argument,
        )
        chosen = []
        paths: Sequence[Any] | None = None
        for index, (is_dynamic, leaf, spec) in enumerate(
            zip(static.mask, leaves, specs)
        ):
            if not is_dynamic:
                continue
            spec = _REPLICATED if spec is None else spec
            shape = tuple(getattr(leaf, "shape", ()))
            try:
                _check_spec(spec, shape, sizes, "")
            except ValueError:
                paths = paths or [
                    path for path, _ in jtu.tree_leaves_with_path((args, kwargs))
                ]
                _check_spec(spec, shape, sizes, _describe_argument(paths[index]))
            chosen.append(spec)
        return tuple(chosen)

    @traceback_boundary
    def __call__(self, /, *args: Any, **kwargs: Any) -> Any:
        mesh = self.mesh
        if mesh is None and jax.sharding.get_abstract_mesh().empty:
            raise ValueError(
                f"{_WHO}: no mesh: pass mesh=..., or call inside "
                "`with jax.set_mesh(mesh):`."
            )
        sizes = _mesh_shape(
            mesh if mesh is not None else jax.sharding.get_abstract_mesh()
        )
        fun_dynamic, fun_static = split(self.fun)
        dynamic, call_static = split((args, kwargs))
        in_specs = self._argument_specs(args, kwargs, call_static, sizes)
        plan = _Plan(
            fun_static, call_static, mesh, in_specs, self.out_specs, self.check_vma
        )
        # JAX traces arrays on `Explicit` axes only under a mesh context,
        # which cannot be entered inside a trace (there the caller's holds).
        enter_mesh = (
            isinstance(mesh, Mesh)
            and _explicit(mesh)
            and jax.sharding.get_abstract_mesh().empty
            and not any(isinstance(leaf, Tracer) for leaf in (*fun_dynamic, *dynamic))
        )
        if enter_mesh:
            with jax.set_mesh(mesh):
                out = _run(plan, fun_dynamic, dynamic)
        else:
            out = _run(plan, fun_dynamic, dynamic)
        return out.static.merge(out.arrays)


def _describe_argument(path: Sequence[Any]) -> str:
    """`args[0]['w']` or `kwargs['x']` for a key path into `(args, kwargs)`."""
    if not path:
        return "the arguments"
    head = "args" if path[0] == jtu.SequenceKey(0) else "kwargs"
    return path_text(head, path[1:])


@overload
def filter_shard_map(
    fun: _F,
    *,
    mesh: Mesh | None = None,
    in_specs: Any,
    out_specs: Any,
    check_vma: bool = True,
) -> _F: ...


@overload
def filter_shard_map(
    fun: None = None,
    *,
    mesh: Mesh | None = None,
    in_specs: Any,
    out_specs: Any,
    check_vma: bool = True,
) -> Callable[[_F], _F]: ...


def filter_shard_map(
    fun: Any = None,
    *,
    mesh: Mesh | None = None,
    in_specs: Any,
    out_specs: Any,
    check_vma: bool = True,
) -> Any:
    """Maps `fun` over the shards of the arrays of arbitrary pytrees
    (`jax.shard_map` for any pytree).

    Each array leaf of the positional arguments is split over the mesh as the
    `PartitionSpec` covering it says, and `fun` sees its shard; every other
    leaf (functions, strings, ints...) is passed to every device as it is.
    Arrays inside `fun` itself (a Module, a bound method) and in keyword
    arguments are replicated (`P()`). The arrays of the output are put
    together from the shards as `out_specs` says; its other leaves come back
    as the Python values the trace produced. Collectives (`jax.lax.psum`,
    `pmean`, `all_gather`...) name the mesh axes. On `Explicit` mesh axes,
    arguments laid out otherwise than their spec are resharded first.

    Called outside any trace, the mapped program is compiled once per
    structure (as with `filter_jit`); inside `filter_jit`, `filter_grad` or
    `filter_vmap`, it becomes part of the enclosing program.

    Differentiating through it: inside `fun`, each device sees its shard of
    the batch; reduce a loss with `jax.lax.pmean` (not `psum`) over the data
    axis *inside* the differentiated function, or the gradients of replicated
    parameters come out summed over the devices, N times too large.

    **Arguments:**

    - `fun`: the function to map. Omit it to get a decorator.
    - `mesh`: the `jax.sharding.Mesh`; omit it under `jax.set_mesh`.
    - `in_specs`: a pytree prefix of the tuple of positional arguments (a
      method decorated in its class body counts `self` first) whose leaves are
      `PartitionSpec`s, or `None` for `P()` (replicated). Non-array leaves
      ignore their spec.
    - `out_specs`: likewise, a prefix of the output.
    - `check_vma`: as for `jax.shard_map`: check (and track) which values vary
      over which mesh axes.

    **Returns:** the mapped function, a pytree whose child is `fun`.

    **Raises:** `TypeError` if a leaf of `in_specs` or `out_specs` is no
    `PartitionSpec`. When called: `ValueError` naming the key path if the
    specs are not a prefix of the arguments or output, if a spec has more
    entries than its array has dimensions, names an axis the mesh lacks, or
    splits a dimension into parts that do not divide it; `ValueError` without
    a mesh.

    ```python
    >>> import jax, jax.numpy as jnp
    >>> from jax.sharding import PartitionSpec as P
    >>> import filterax as fx
    >>> mesh = jax.make_mesh((jax.device_count(),), ("data",))
    >>> @fx.filter_shard_map(mesh=mesh, in_specs=(P(), P("data")), out_specs=P())
    ... def total(params, x):
    ...     local = params["scale"] * jnp.sum(x)
    ...     return jax.lax.psum(local, "data"), params["name"]
    >>> total({"scale": jnp.array(2.0), "name": "sum"}, jnp.arange(16.0))
    (Array(240., dtype=float32), 'sum')

    ```
    """
    in_specs_tree = Specs(in_specs, "in_specs")
    out_specs_tree = Specs(out_specs, "out_specs")
    if mesh is not None and not isinstance(mesh, Mesh):
        raise TypeError(f"{_WHO}: mesh must be a jax.sharding.Mesh, got {mesh!r}.")
    if fun is None:
        return functools.partial(
            filter_shard_map,
            mesh=mesh,
            in_specs=in_specs,
            out_specs=out_specs,
            check_vma=check_vma,
        )
    if not callable(fun):
        raise TypeError(f"{_WHO}: expected a callable, got {fun!r}.")
    return ShardMapWrapper(fun, mesh, in_specs_tree, out_specs_tree, check_vma)
