"""The inner `jax.jit`s of `filter_jit`, shared by every wrapper of one function,
and what leaves their traces.

A `Compiled` holds the two traced bodies (direct and keyed routes) for one
function and `Policy`, plus the state that lets repeated calls skip work (the
route chosen, the last static key). It is found again from the function:

- a plain Python function by identity, through a weak reference, so its
  compiled code is freed with it;
- any other callable (a Module, a bound method, a `Partial`, a transform's
  wrapper) by its `StaticPart`: its arrays are traced arguments, so two
  Modules of the same structure share compiled code. These entries are kept
  in a bounded LRU.

A body returns `REROUTE`, before running the function, when the call needs
another route: the direct body when a leaf could be a Python scalar (JAX gives
`1.0` the signature of a weakly typed 0-d array, and a later call passing a
scalar must key on its value) or lies on an `Auto` mesh; the keyed body when
the leaves lie on an `Auto` mesh but the key lacks their shardings (see
`_layout.follow_arguments`). The compilation cached for it returns `REROUTE`
at once, and the wrapper changes route for good.

Outputs: `filter_output` returns the output itself when every leaf is an
array and no node is a Module (JAX rebuilds it in C++), else a `MixedOutput`
(arrays as children, the `StaticPart` as node data). A Ref in the output that
came in as an argument leaves as an `InputRef` marker; `rebuild` puts the very
Ref back, rebuilds Modules with a builder (`_tree._rebuild`) and remembers them
(`_describe`), so passing them back in costs no flattening.
"""

from __future__ import annotations

import collections
import functools
import threading
import types
import weakref
from collections.abc import Callable, Sequence
from gc import disable as _pause_collector, enable as _resume_collector, isenabled
from typing import Any

import jax
import jax.tree_util as jtu

from .._caches import register_cache_clearer
from .._tree._filters import is_ref
from .._tree._split import (
    STATIC,
    TRACER,
    MixedOutput,
    StaticPart,
    clear_leaf_kinds,
    flatten,
    leaf_kinds,
    mark_input_refs,
    split,
    split_leaves,
)
from ._describe import (
    CallKey,
    clear_memo,
    module_parts,
    remember_outputs,
    unpack_key,
)
from ._layout import clear as clear_canonical, follow_arguments, on_auto_mesh
from ._policy import Policy, silence_donation_warnings

__all__ = ["REROUTE", "Compiled", "compiled_for", "rebuild"]

_MAX_STATIC_ENTRIES = 256


class _Reroute:
    """What a body returns for a call that needs another route."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "REROUTE"


REROUTE = _Reroute()
jtu.register_pytree_node(_Reroute, lambda _: ((), None), lambda _, __: REROUTE)


class Compiled:
    """The inner `jax.jit`s of one function, for one `Policy`:
    `keyed(key, *groups)` and `direct(*groups)` (groups as `Policy` orders
    them). `direct_ok` is `None` until the first call picks a route, and
    turns false, for good, once a call needed the keyed route. `last_call`
    is the static key of the last keyed call; `with_shardings` whether keys
    carry the leaves' shardings. `made_for`: a weak reference to a plain
    function, or a callable's `StaticPart`."""

    __slots__ = (
        "__weakref__",
        "direct",
        "direct_ok",
        "keyed",
        "last_call",
        "made_for",
        "policy",
        "with_shardings",
    )

    def __init__(
        self,
        made_for: weakref.ref | StaticPart,
        policy: Policy,
        name: str,
        qualname: str,
    ):
        self.made_for = made_for
        self.policy = policy
        self.direct_ok: bool | None = None
        self.last_call: CallKey | None = None
        self.with_shardings = False
        # The bodies, which JAX keeps as long as the jitted functions live,
        # never hold a plain function strongly.
        if isinstance(made_for, StaticPart):
            fun_source: Callable[[list[Any]], Any] = made_for.merge
            n_fun = made_for.num_dynamic
        else:
            fun_source = lambda _: made_for()  # noqa: E731
            n_fun = 0
        layout = policy.layout

        def call(fun_dynamic: list[Any], args: tuple, kwargs: dict, by_id: Any) -> Any:
            fun: Any = fun_source(fun_dynamic)
            if policy.silences:
                silence_donation_warnings()
            if layout is not None:
                return layout.call(fun, args, kwargs)
            if by_id is None:
                return fun(*args, **kwargs)
            return follow_arguments(fun, args, kwargs, by_id)

        def keyed(key: CallKey, *groups: list[Any]) -> Any:
            fun_dynamic, dynamic = policy.keyed_inside(groups, n_fun)
            shardings, by_id = key.shardings, None
            if shardings is not None:
                leaves = [*fun_dynamic, *dynamic]
                by_id = {
                    id(leaf): s for leaf, s in zip(leaves, shardings) if s is not None
                }
            elif layout is None and on_auto_mesh(dynamic):
                return REROUTE
            args, kwargs = unpack_key(key, dynamic)
            out = call(fun_dynamic, args, kwargs, by_id)
            return filter_output(out, lambda: [*fun_dynamic, *dynamic])

        def direct(*groups: Any) -> Any:
            fun_dynamic, args, kwargs = policy.direct_inside(groups)
            leaves = flatten((args, kwargs))[0]
            if _scalar_like(leaves) or (layout is None and on_auto_mesh(leaves)):
                return REROUTE
            out = call(fun_dynamic, args, kwargs, None)
            return filter_output(out, lambda: flatten((fun_dynamic, args, kwargs))[0])

        # Named after the function, for readable jaxprs, HLO and profiles.
        for body in (keyed, direct):
            body.__name__ = name
            body.__qualname__ = qualname
        self.keyed: Any = jax.jit(
            keyed, static_argnums=0, donate_argnums=policy.keyed_donated
        )
        self.direct: Any = jax.jit(direct, donate_argnums=policy.direct_donated)
        _LIVE.add(self)

    def is_for_function(self, fun: Any) -> bool:
        """Whether this was made for the plain function `fun`."""
        made_for = self.made_for
        return type(made_for) is weakref.ReferenceType and made_for() is fun


# id(fun) -> (weak reference to fun, {(donate mode, layout): Compiled}). Keyed by
# identity, as a function's `==` is identity anyway. The weak reference's
# callback drops the entry (and with it the jitted functions and their
# compiled code) once `fun` is garbage collected. One entry per function means
# that `filter_jit(f)(x)` in a loop compiles once, as `jax.jit(f)(x)` does.
_BY_IDENTITY: dict[int, tuple[weakref.ref, dict[Policy, Compiled]]] = {}
# (static part, policy) -> Compiled, most recently used last.
_BY_STATIC_PART: collections.OrderedDict[tuple[StaticPart, Policy], Compiled] = (
    collections.OrderedDict()
)
_LIVE: weakref.WeakSet[Compiled] = weakref.WeakSet()
_LOCK = threading.RLock()


def _forget(
    fun_id: int,
    ref: weakref.ref,
    entries: dict[int, tuple[weakref.ref, dict[Policy, Compiled]]] = _BY_IDENTITY,
) -> None:
    # Runs from garbage collection, possibly while this thread holds the lock;
    # dict operations are atomic, so no lock is taken. `entries` is bound
    # here: at interpreter exit the module's globals may be gone first.
    entry = entries.get(fun_id)
    if entry is not None and entry[0] is ref:
        entries.pop(fun_id, None)


def _names(fun: Any) -> tuple[str, str]:
    name = getattr(fun, "__name__", None)
    if not isinstance(name, str):
        name = type(fun).__name__
    qualname = getattr(fun, "__qualname__", None)
    if not isinstance(qualname, str):
        qualname = name
    return name, qualname


def compiled_for(
    fun: Any, policy: Policy, known: Compiled | None = None
) -> tuple[Compiled, list[Any]]:
    """The shared `Compiled` for `fun` and `policy`, and the arrays inside
    `fun` (traced arguments of every call). `known` (the `Compiled` of the
    wrapper a copy is made from) is checked first: it is the one when `fun`
    is the same plain function, or a callable of the same static part."""
    if isinstance(fun, types.FunctionType):
        if known is not None and known.is_for_function(fun):
            return known, []
        with _LOCK:
            fun_id = id(fun)
            entry = _BY_IDENTITY.get(fun_id)
            if entry is None or entry[0]() is not fun:
                entry = (weakref.ref(fun, functools.partial(_forget, fun_id)), {})
                _BY_IDENTITY[fun_id] = entry
            compiled = entry[1].get(policy)
            if compiled is None:
                compiled = entry[1][policy] = Compiled(entry[0], policy, *_names(fun))
            return compiled, []
    fun_dynamic, fun_static = split(fun)
    if known is not None and known.made_for == fun_static:
        return known, fun_dynamic
    key = (fun_static, policy)
    with _LOCK:
        compiled = _BY_STATIC_PART.get(key)
        if compiled is None:
            compiled = _BY_STATIC_PART[key] = Compiled(fun_static, policy, *_names(fun))
            if len(_BY_STATIC_PART) > _MAX_STATIC_ENTRIES:
                _BY_STATIC_PART.popitem(last=False)
        else:
            _BY_STATIC_PART.move_to_end(key)
    return compiled, fun_dynamic


def _scalar_like(leaves: list[Any]) -> bool:
    """Inside the direct trace: whether a leaf has the signature JAX gives a
    Python scalar (weakly typed 0-d, or 0-d boolean). Such a compilation
    would be hit by a later call passing a scalar, which must be static."""
    for leaf in leaves:
        aval = jax.typeof(leaf)
        if not getattr(aval, "ndim", 1) and (
            getattr(aval, "weak_type", False) or aval.dtype == bool
        ):
            return True
    return False


def filter_output(out: Any, traced_inputs: Callable[[], Sequence[Any]]) -> Any:
    """Inside the trace: `out` itself when all its leaves are arrays and no
    node is a Module, else a `MixedOutput`. `traced_inputs()` gives the traced
    inputs, in the order that `InputRef` positions count."""
    leaves, treedef = flatten(out)
    kinds = leaf_kinds(leaves)
    if TRACER in kinds and any(map(is_ref, leaves)):
        leaves = mark_input_refs(leaves, traced_inputs(), "filter_jit")
        kinds = leaf_kinds(leaves)
    arrays, part = split_leaves(leaves, treedef, kinds)
    if STATIC not in kinds and not module_parts(part):
        return out
    return MixedOutput(arrays, part)


def rebuild(out: MixedOutput, inputs: Callable[[], Sequence[Any]]) -> Any:
    """The output a `MixedOutput` stands for; `inputs()` gives the flattened
    traced inputs of the call, needed only when it returns input Refs. Its
    Modules are remembered (see `_describe`)."""
    # The collector waits while a step's new Modules are built: the caller
    # frees the old ones right after, so its count of new objects falls back
    # before it would start a collection (left running, `bench_training_loop`
    # measured an Adam step 42% slower, mostly in full collections).
    running = isenabled()
    if running:
        _pause_collector()
    try:
        tree = out.static.merge_restoring_refs(out.arrays, inputs)
        remember_outputs(tree, out.static, out.arrays)
    finally:
        if running:
            _resume_collector()
    return tree


@register_cache_clearer
def _clear_jit_caches() -> None:
    for compiled in list(_LIVE):
        compiled.keyed.clear_cache()
        compiled.direct.clear_cache()
    with _LOCK:
        _BY_STATIC_PART.clear()
    clear_leaf_kinds()
    clear_memo()
    clear_canonical()
