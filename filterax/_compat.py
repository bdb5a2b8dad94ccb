"""Every use of JAX internals in filterax lives here.

`tests/test_compat.py` checks each of them, so a JAX release that moves or
changes one fails loudly there instead of somewhere deep in a transform.
"""

from __future__ import annotations

import contextlib
import os
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

from jax._src import (
    core as _jax_core,
    traceback_util as _jax_traceback_util,
    tree_util as _jax_tree_util,
)
from jax.interpreters import ad, batching, mlir

_C = TypeVar("_C", bound=Callable[..., Any])

# The jaxpr types that `jax.extend.core` re-exports, read from where they are
# defined: importing `jax.extend` imports Pallas too, the largest part of what
# `import filterax` would add to `import jax` (`benchmarks/bench_import.py`).
# `test_compat` checks that each is the object `jax.extend.core` names.
ClosedJaxpr = _jax_core.ClosedJaxpr
Jaxpr = _jax_core.Jaxpr
Var = _jax_core.Var
jaxpr_as_fun = _jax_core.jaxpr_as_fun
jaxprs_in_params = _jax_core.jaxprs_in_params

# What JAX raises at trace time when it cannot infer an output sharding on
# `Explicit` mesh axes (a gather of split indices under `vmap`, say); it has
# no public name.
ShardingTypeError = _jax_core.ShardingTypeError

# The folder of the package. Its frames are left out of the tracebacks that
# JAX filters (`jax_traceback_filtering`, on by default), as JAX leaves out its
# own: an error raised in a user's function under a filtered transform shows
# the user's lines, not filterax's. One registration covers every module.
FILTERAX_DIRECTORY = os.path.dirname(os.path.abspath(__file__))
_jax_traceback_util.register_exclusion(FILTERAX_DIRECTORY)


def shown_in_tracebacks(filename: str) -> bool:
    """Whether JAX keeps frames of `filename` in the tracebacks it filters, and
    in the frames its debugger (`jax.debug.breakpoint`) shows: not for JAX's
    own files nor for filterax's (registered above)."""
    return _jax_traceback_util.include_filename(filename)


def traceback_boundary(fun: _C) -> _C:
    """`fun` as a point below which JAX filters tracebacks (JAX's
    `api_boundary`, as on `jax.jit`'s wrappers).

    JAX filters the traceback of an error when it leaves the outermost
    boundary, dropping the frames of registered folders (JAX's, and
    `FILTERAX_DIRECTORY`) below it. Frames above it are the user's when the
    boundary is the public entry point of a transform; otherwise the frames of
    filterax between the user and JAX's own boundary would stay. Nested
    boundaries are cheap: only the outermost filters.
    """
    return _jax_traceback_util.api_boundary(fun)


# The start of the warning JAX emits when a donated buffer cannot be reused for
# an output. Its text is not an API; the filters that silence it match on it.
DONATION_WARNING = "Some donated buffers were not usable"


@contextlib.contextmanager
def donation_warning_ignored(ignore: bool = True) -> Iterator[None]:
    """Ignores JAX's unusable-donation warning inside the block (when `ignore`)."""
    if not ignore:
        yield
        return
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=DONATION_WARNING)
        yield


def register_dataclass_node(
    cls: type, data_fields: Sequence[str], meta_fields: Sequence[str]
) -> None:
    """Registers `cls` with JAX's C++ dataclass pytree node in every registry.

    The public `jax.tree_util.register_dataclass` insists that the data and meta
    fields are exactly the class's `__init__` fields. `Module` adds one extra
    meta field, the unflatten marker, so that `cls(**fields)` issued by JAX's
    unflatten can be told apart from a user's constructor call. The C++ node
    gives `Module` flattening at the speed of a plain registered dataclass,
    with `GetAttrKey` key paths.
    """
    for registry in _jax_tree_util._all_registries:
        registry.register_dataclass_node(cls, list(data_fields), list(meta_fields))


def same_structure(a: Any, b: Any) -> bool:
    """Whether two treedefs (`jax.tree_util.PyTreeDef`) are equal, the classes
    of their nodes included.

    JAX's `PyTreeDef.__eq__` skips the class and field names of C++ dataclass
    nodes, which `Module`s are: the structures of two Module classes with the
    same number of fields and equal static values compare equal. The hash of a
    treedef does cover them, so equal hashes are asked for as well.

    ```python
    >>> import jax
    >>> import filterax as fx
    >>> from filterax._compat import same_structure
    >>> class Scale(fx.Module):
    ...     w: float
    >>> class Shift(fx.Module):
    ...     w: float
    >>> a, b = jax.tree.structure(Scale(1.0)), jax.tree.structure(Shift(1.0))
    >>> same_structure(a, b), same_structure(a, jax.tree.structure(Scale(2.0)))
    (False, True)

    ```
    """
    return a == b and hash(a) == hash(b)


def outputs_depending_on_inputs(closed_jaxpr: Any) -> list[bool]:
    """For each output of a jaxpr, whether it depends on any of its inputs (a
    conservative answer: an equation with any such input makes all its outputs
    depend on them).

    Uses the jaxpr data structures of `jax.extend.core` (`Var`), which JAX
    documents as unstable.
    """
    jaxpr = closed_jaxpr.jaxpr
    live: set[Any] = set(jaxpr.invars)
    for equation in jaxpr.eqns:
        if any(isinstance(v, Var) and v in live for v in equation.invars):
            live.update(equation.outvars)
    return [isinstance(v, Var) and v in live for v in jaxpr.outvars]


def define_identity_primitive(
    name: str,
    *,
    on_interpret: Callable[[str, dict[str, Any]], None],
    on_transform: Callable[[str, dict[str, Any]], dict[str, Any]],
) -> Any:
    """A primitive that returns its array operands unchanged and reports each
    way JAX interprets it, for `filterax.debug.announce_transform`.

    `on_interpret(how, params)` is called when the primitive is evaluated
    (`"impl"`), traced into a jaxpr (`"abstract"`) or lowered (`"mlir"`).
    `on_transform(which, params)` is called when a transform rewrites it
    (`"vmap"`, `"jvp_p"` for the primal, `"jvp_t"` for the tangent,
    `"transpose"`) and returns the parameters of the rewritten binding.

    Uses the rule tables of `jax.interpreters` (`ad`, `batching`, `mlir`),
    which JAX keeps for primitive authors but does not promise to keep stable.
    """
    primitive = _jax_core.Primitive(name)
    primitive.multiple_results = True

    def impl(*operands: Any, **params: Any) -> list[Any]:
        on_interpret("impl", params)
        return list(operands)

    def abstract_eval(*avals: Any, **params: Any) -> list[Any]:
        on_interpret("abstract", params)
        return list(avals)

    def lowering(ctx: Any, *operands: Any, **params: Any) -> list[Any]:
        on_interpret("mlir", params)
        return list(operands)

    def batch(operands: Any, dims: Any, **params: Any) -> tuple[Any, Any]:
        return primitive.bind(*operands, **on_transform("vmap", params)), dims

    def jvp(primals: Any, tangents: Any, **params: Any) -> tuple[Any, Any]:
        primals_out = primitive.bind(*primals, **on_transform("jvp_p", params))
        tangents = [ad.instantiate_zeros(t) for t in tangents]
        tangents_out = primitive.bind(*tangents, **on_transform("jvp_t", params))
        return primals_out, tangents_out

    def transpose(cotangents: Any, *operands: Any, **params: Any) -> list[Any]:
        cotangents = [ad.instantiate_zeros(c) for c in cotangents]
        return primitive.bind(*cotangents, **on_transform("transpose", params))

    primitive.def_impl(impl)
    primitive.def_abstract_eval(abstract_eval)
    mlir.register_lowering(primitive, lowering)
    batching.primitive_batchers[primitive] = batch
    ad.primitive_jvps[primitive] = jvp
    ad.primitive_transposes[primitive] = transpose
    return primitive
