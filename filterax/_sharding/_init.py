"""`sharded_init`: a constructor run compiled, each array made on its shard."""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Callable
from typing import Any, NamedTuple, TypeVar

import jax
import jax.numpy as jnp
import jax.tree_util as jtu

from .._compat import jaxpr_as_fun
from .._eval_shape import filter_eval_shape
from .._mapping._shard import mesh_context
from .._tree._filters import is_array
from .._tree._split import split
from ._rules import Rules, flat_shardings

__all__ = ["sharded_init"]

_T = TypeVar("_T")


def sharded_init(
    make: Callable[..., _T],
    mesh: jax.sharding.Mesh,
    rules: Rules,
    *,
    stages: int = 1,
    mapped: bool = False,
    strict: bool = True,
) -> Callable[..., _T]:
    """Wraps a constructor so that it builds its arrays directly on their
    shardings.

    The returned function first evaluates `make(*args, **kwargs)` abstractly
    (no array is made) to find the shardings of its arrays with
    [`sharding_of`][filterax.sharding_of], then runs it once compiled
    (`jax.jit` of its array part, with those shardings as `out_shardings`):
    each device computes only its own shard of each parameter, so no
    parameter is ever whole on one device and a model larger than one
    device's memory can be built (on `Explicit` axes too: the constructor
    runs on `Auto` axes inside, where the partitioner splits its work).
    Everything that is not an array (static fields, functions) is rebuilt
    around the arrays. The values are those `make` gives when run eagerly
    with the same arguments.

    **Arguments:**

    - `make`: any callable returning a pytree: a Module class, a function, a
      [`filter_vmap`][filterax.filter_vmap]ped constructor (its layers get the
      leading `"stack"` axis).
    - `mesh`: the `jax.sharding.Mesh`, with `Auto` or `Explicit` axes.
    - `rules`: the rules of [`sharding_of`][filterax.sharding_of].
    - `stages`: in how many compiled stages to build the arrays, each making a
      run of consecutive output arrays of about equal size per device (XLA
      drops the computation of the others), so that the temporaries of only
      one stage are alive at a time. With one stage (the default) the arrays
      are made by one compilation, and a device's peak can reach about twice
      its share of the model (XLA:CPU's random number generator keeps
      temporaries a few times as large as its output); in `n` stages it is
      the share plus the last stage's temporaries: about 1.2 times the share
      with `stages=8` for a model of many arrays, for one compilation per
      stage. A single array larger than a stage is still made whole by its
      own stage, so a stacked model (one array per parameter) needs `mapped`.
    - `mapped`: declares that `make` maps every array argument along its
      leading axis, as a [`filter_vmap`][filterax.filter_vmap]ped constructor
      does with its default `in_axes` (`make(keys)[i]` depends on `keys[i]`
      alone): with `stages=n`, the stack is then built in `n` runs of its
      leading axis, each written into the arrays already placed on their
      shardings, so the peak is about `1 + 4 / n` times the share, for two
      compilations. The values are those of one call of `make` (checked
      bit-for-bit in the tests for `nn` layers). The stack's axis must not be
      split over the mesh.
    - `strict`: as for [`sharding_of`][filterax.sharding_of]: `False` turns
      its refusal of unused rules and misfitting declared axes into a
      `FilteraxWarning`.

    **Returns:** a function taking `make`'s arguments and returning what
    `make` returns, with every array placed on its sharding.

    **Raises:** `TypeError` if `make` is not callable or `mapped` not a bool,
    `ValueError` if `stages` is not a positive int; what `sharding_of` raises, when the function is
    called and before anything is computed; with `mapped`, `ValueError` when
    the array arguments do not share one leading length, an output array
    lacks that leading axis, or a rule splits it.

    ```python
    >>> import jax
    >>> import filterax as fx
    >>> mesh = jax.make_mesh((4, 2), ("data", "model"))
    >>> make = fx.sharded_init(fx.nn.Linear, mesh, {"out": "model", "in": "data"})
    >>> linear = make(16, 8, key=jax.random.key(0))
    >>> linear.weight.sharding.spec, linear.bias.sharding.spec
    (P('model', 'data'), P('model',))
    >>> linear.weight.addressable_shards[0].data.shape
    (4, 4)
    >>> stack = fx.sharded_init(
    ...     fx.filter_vmap(lambda key: fx.nn.Linear(16, 8, key=key)),
    ...     mesh,
    ...     {"stack": None, "out": "model"},
    ...     stages=2,
    ...     mapped=True,
    ... )(jax.random.split(jax.random.key(0), 6))
    >>> stack.weight.shape, stack.weight.sharding.spec
    ((6, 8, 16), P(None, 'model', None))

    ```
    """
    if not callable(make):
        raise TypeError(f"sharded_init: `make` must be callable, got {make!r}.")
    if isinstance(stages, bool) or not isinstance(stages, int) or stages < 1:
        raise ValueError(
            f"sharded_init: `stages` must be a positive int, got {stages!r}."
        )
    if not isinstance(mapped, bool):
        raise TypeError(f"sharded_init: `mapped` must be a bool, got {mapped!r}.")
    if not isinstance(strict, bool):
        raise TypeError(f"sharded_init: `strict` must be a bool, got {strict!r}.")

    @functools.wraps(make)
    def init(*args: Any, **kwargs: Any) -> _T:
        return _plan(
            make, mesh, rules, stages, args, kwargs, mapped=mapped, strict=strict
        ).build()

    return init


def _mesh_context(mesh: jax.sharding.Mesh) -> Any:
    """`jax.set_mesh(mesh)` where `mesh` has `Explicit` axes and no mesh is
    set: arrays typed on such axes are traced and run under their mesh."""
    explicit = jax.sharding.AxisType.Explicit in mesh.axis_types
    if explicit and jax.sharding.get_abstract_mesh().empty:
        return mesh_context(mesh)
    return contextlib.nullcontext()


def _auto_inside(fun: Callable[..., Any], out_shardings: list[Any]) -> Any:
    """`fun`, run on `Auto` axes where `jax.set_mesh` set `Explicit` ones.

    There every intermediate of a constructor would be typed replicated and
    computed whole on each device; on `Auto` axes the partitioner computes
    only each device's part of the outputs."""
    if jax.sharding.AxisType.Explicit in jax.sharding.get_abstract_mesh().axis_types:
        return jax.sharding.auto_axes(fun, out_sharding=out_shardings)
    return fun


def _compiled_peak(lowered: Any) -> int:
    analysis = lowered.compile().memory_analysis()
    return int(
        analysis.argument_size_in_bytes
        + analysis.output_size_in_bytes
        + analysis.temp_size_in_bytes
        - analysis.alias_size_in_bytes
    )


class _Plan(NamedTuple):
    """How `sharded_init` builds one call's arrays in whole-array stages: the
    compiled stages (each a jitted function of `inputs` and the positions of
    the output arrays it makes), the bytes per device of each output array,
    and the non-array rest of the output."""

    mesh: jax.sharding.Mesh
    stages: list[tuple[Any, list[int]]]
    inputs: list[Any]
    sizes: list[int]
    out_static: Any

    def build(self) -> Any:
        built: list[Any] = [None] * len(self.sizes)
        with _mesh_context(self.mesh):
            for stage, group in self.stages:
                for index, array in zip(group, stage(self.inputs)):
                    built[index] = array
        return self.out_static.merge(built)

    def peak_bytes_per_device(self) -> int:
        """Over the stages, the arrays that earlier stages built plus the
        stage's own arguments, outputs and temporaries (XLA's compiled
        memory analysis)."""
        built = peak = 0
        with _mesh_context(self.mesh):
            for stage, group in self.stages:
                peak = max(peak, built + _compiled_peak(stage.lower(self.inputs)))
                built += sum(self.sizes[index] for index in group)
        return peak


class _MappedPlan(NamedTuple):
    """How `sharded_init(..., mapped=True)` builds a stack: `fill` places
    zeros on the output shardings, then `chunk` overwrites one run of the
    stack's leading axis at each of `starts` (the last run may overlap the
    one before: its rows are the same values again)."""

    mesh: jax.sharding.Mesh
    fill: Any
    chunk: Any
    inputs: list[Any]
    starts: list[int]
    sizes: list[int]
    out_static: Any

    def build(self) -> Any:
        with _mesh_context(self.mesh):
            buffers = self.fill()
            for start in self.starts:
                buffers = self.chunk(buffers, self.inputs, start)
        return self.out_static.merge(buffers)

    def peak_bytes_per_device(self) -> int:
        with _mesh_context(self.mesh):
            buffers = self.fill.eval_shape()
            return max(
                _compiled_peak(self.fill.lower()),
                _compiled_peak(self.chunk.lower(buffers, self.inputs, 0)),
            )


def _plan(
    make: Callable[..., Any],
    mesh: jax.sharding.Mesh,
    rules: Rules,
    stages: int,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    *,
    mapped: bool = False,
    strict: bool = True,
) -> _Plan | _MappedPlan:
    """How to build `make(*args, **kwargs)`: its stages compiled, ready to
    `build()` or to measure (`peak_bytes_per_device()`, for the benchmark and
    the tests)."""
    with _mesh_context(mesh):
        abstract = filter_eval_shape(make, *args, **kwargs)
        shardings, _ = flat_shardings(abstract, mesh, rules, strict=strict)
        # Only the array leaves of the output leave the compiled functions, in
        # the order of the abstract output's leaves.
        arrays_out = [
            (leaf, sharding)
            for leaf, sharding in zip(jtu.tree_leaves(abstract), shardings)
            if isinstance(leaf, jax.ShapeDtypeStruct)
        ]
        out_shardings = [sharding for _, sharding in arrays_out]
        sizes = [_bytes_per_device(leaf, sharding) for leaf, sharding in arrays_out]
        if mapped and stages > 1:
            return _mapped_plan(make, mesh, args, kwargs, arrays_out, sizes, stages)
        dynamic, static = split((make, args, kwargs), is_array)
        out_statics: list[Any] = []

        def arrays(traced: list[Any]) -> list[Any]:
            call_make, call_args, call_kwargs = static.merge(traced)
            out_dynamic, out_static = split(
                call_make(*call_args, **call_kwargs), is_array
            )
            out_statics.append(out_static)
            return out_dynamic

        # Traced once, whatever the number of stages; each stage compiles the
        # whole array part but keeps only its own outputs, and XLA drops the
        # computation of the others.
        closed = jax.make_jaxpr(_auto_inside(arrays, out_shardings))(dynamic)
        run = jaxpr_as_fun(closed)
        compiled = []
        for group in _stage_groups(sizes, stages) or [[]]:

            def stage(flat: list[Any], group: list[int] = group) -> list[Any]:
                outputs = run(*flat)
                return [outputs[index] for index in group]

            compiled.append(
                (jax.jit(stage, out_shardings=[out_shardings[i] for i in group]), group)
            )
        return _Plan(mesh, compiled, jtu.tree_leaves(dynamic), sizes, out_statics[-1])


def _mapped_plan(
    make: Callable[..., Any],
    mesh: jax.sharding.Mesh,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    arrays_out: list[tuple[jax.ShapeDtypeStruct, Any]],
    sizes: list[int],
    stages: int,
) -> _MappedPlan:
    mapped_in, static_in = split((args, kwargs), is_array)
    lengths = {jnp.shape(leaf)[0] if jnp.ndim(leaf) else None for leaf in mapped_in}
    if len(lengths) != 1 or None in lengths:
        raise ValueError(
            "sharded_init(mapped=True): every array argument must be mapped "
            "along a leading axis of one length; got shapes "
            f"{[jnp.shape(leaf) for leaf in mapped_in]}."
        )
    length = int(next(iter(lengths)) or 0)
    for leaf, sharding in arrays_out:
        if not leaf.shape or leaf.shape[0] != length:
            raise ValueError(
                "sharded_init(mapped=True): every output array must have the "
                f"mapped leading axis of length {length}; one has shape "
                f"{tuple(leaf.shape)}."
            )
        split_over = sharding.spec[0] if len(sharding.spec) else None
        if split_over is not None:
            raise ValueError(
                "sharded_init(mapped=True) builds the stack in runs of its "
                "leading axis, which must not be split over the mesh; a rule "
                f"splits it over {split_over!r}. Leave `mapped` off, or map "
                "the stack's axis to None."
            )
    out_shardings = [sharding for _, sharding in arrays_out]
    dynamic_make, static_make = split(make, is_array)
    size = -(-length // stages)
    starts = sorted({min(start, length - size) for start in range(0, length, size)})
    out_statics: list[Any] = []

    def fill() -> list[Any]:
        return [jnp.zeros(leaf.shape, leaf.dtype) for leaf, _ in arrays_out]

    def run(buffers: list[Any], inputs: list[Any], start: Any) -> list[Any]:
        make_leaves, mapped_leaves = inputs
        sliced = [
            jax.lax.dynamic_slice_in_dim(leaf, start, size, 0) for leaf in mapped_leaves
        ]
        call_args, call_kwargs = static_in.merge(sliced)
        made, out_static = split(
            static_make.merge(make_leaves)(*call_args, **call_kwargs), is_array
        )
        out_statics.append(out_static)
        return [
            jax.lax.dynamic_update_slice_in_dim(buffer, run_of, start, 0)
            for buffer, run_of in zip(buffers, made)
        ]

    chunk = jax.jit(
        _auto_inside(run, out_shardings),
        out_shardings=out_shardings,
        donate_argnums=0,
    )
    inputs = [dynamic_make, mapped_in]
    # Traced here, so that `out_static` is known before the first run.
    chunk.trace(jax.eval_shape(fill), inputs, 0)
    return _MappedPlan(
        mesh,
        jax.jit(_auto_inside(fill, out_shardings), out_shardings=out_shardings),
        chunk,
        inputs,
        starts,
        sizes,
        out_statics[-1],
    )


def _bytes_per_device(leaf: jax.ShapeDtypeStruct, sharding: Any) -> int:
    shape = sharding.shard_shape(tuple(leaf.shape))
    return math.prod(shape) * jax.numpy.dtype(leaf.dtype).itemsize


def _stage_groups(sizes: list[int], stages: int) -> list[list[int]]:
    """The output arrays' positions, in runs of consecutive arrays of about
    `sum(sizes) / stages` bytes each (an array larger than that alone)."""
    budget = sum(sizes) / stages
    groups: list[list[int]] = []
    current: list[int] = []
    filled = 0
    for index, size in enumerate(sizes):
        if current and filled + size > budget:
            groups.append(current)
            current, filled = [], 0
        current.append(index)
        filled += size
    if current:
        groups.append(current)
    return groups
