"""The inner `jax.jit`s of `filter_jit`, shared by every wrapper of one function.

A `Compiled` holds the two traced bodies (direct and keyed routes) for one
function and donation mode, plus the state that lets repeated calls skip work
(the route chosen, the last static key). It is found again from the function
itself:

- a plain Python function by identity, through a weak reference, so its
  compiled code is freed with it;
- any other callable (a Module, a bound method, a `Partial`, a transform's
  wrapper) by its *static part*: its treedef and non-array leaves. Its arrays
  are traced arguments, so two Modules of the same structure (a model and its
  updated copy, say) share compiled code, as do the clones JAX makes when it
  unflattens a wrapper. These entries are kept in a bounded LRU.
"""

from __future__ import annotations

import collections
import functools
import threading
import types
import weakref
from collections.abc import Callable
from typing import Any

import jax

from .._caches import register_cache_clearer
from .._mapping._shard import recording_constraints
from .._split import StaticPart, clear_leaf_kinds, flatten, split
from ._direct import check_direct_call
from ._donate import DonateMode, silence_donation_warnings
from ._groups import GroupOrder
from ._keyed import CallKey, unpack_key
from ._layout import KEYED_CALL, Layout, auto_mesh_of, follow_arguments
from ._memo import clear as clear_memo
from ._outputs import filter_output

__all__ = ["Compiled", "compiled_for"]

_MAX_STATIC_ENTRIES = 256


class Compiled:
    """The inner `jax.jit`s of one function, for one donation mode.

    `keyed(key, *groups)` and `direct(*groups)`, with the groups of `order`
    (see `_groups`). `direct_ok` is
    `None` until the first call picks a route (see `_api`), and turns false,
    for good, once a call needed the keyed route. `last_call` is the static
    key of the last keyed call, which the next call most likely shares.
    `made_for` is what it was made for: a weak reference to a plain function,
    or a callable's `StaticPart`. `layout` is the `in_shardings` and
    `out_shardings` the bodies apply (`None`: none given).
    """

    __slots__ = (
        "__weakref__",
        "direct",
        "direct_ok",
        "keyed",
        "last_call",
        "layout",
        "made_for",
        "order",
    )

    def __init__(
        self,
        keyed: Any,
        direct: Any,
        made_for: weakref.ref | StaticPart,
        order: GroupOrder,
        layout: Layout | None = None,
    ):
        self.keyed = keyed
        self.order = order
        self.direct = direct
        self.direct_ok: bool | None = None
        self.last_call: CallKey | None = None
        self.made_for = made_for
        self.layout = layout

    def is_for_function(self, fun: Any) -> bool:
        """Whether this was made for the plain function `fun`."""
        made_for = self.made_for
        return type(made_for) is weakref.ReferenceType and made_for() is fun


def _new_compiled(
    made_for: weakref.ref | StaticPart,
    name: str,
    qualname: str,
    mode: DonateMode,
    layout: Layout | None,
) -> Compiled:
    """Builds the inner jitted functions for a plain function (`made_for` a
    weak reference to it) or another callable (`made_for` its `StaticPart`).

    The bodies, which JAX keeps as long as the jitted functions live, never
    hold a plain function strongly: they must not keep it alive.
    """
    if isinstance(made_for, StaticPart):
        fun_source: Callable[[list[Any]], Any] = made_for.merge
        n_fun = made_for.num_dynamic
    else:
        fun_source = lambda _: made_for()  # noqa: E731
        n_fun = 0

    def resolve(fun_dynamic: list[Any]) -> Any:
        fun = fun_source(fun_dynamic)
        if mode.silences_warning:
            silence_donation_warnings()
        return fun

    def call(
        fun: Any, args: tuple, kwargs: dict, concrete: tuple[tuple, dict] | None
    ) -> Any:
        if layout is not None:
            return layout.call(fun, args, kwargs)
        mesh = None if concrete is None else auto_mesh_of(concrete)
        if mesh is None:
            return fun(*args, **kwargs)
        # Arrays on an `Auto` mesh: outputs shaped like an argument follow
        # its layout (see `follow_arguments`).
        with recording_constraints() as recorded:
            out = fun(*args, **kwargs)
        return follow_arguments(out, concrete, mesh, recorded)  # type: ignore[arg-type]

    order = GroupOrder(mode)

    def keyed(key: Any, *groups: list[Any]) -> Any:
        concrete = KEYED_CALL.call
        fun_dynamic, dynamic = order.keyed_inside(groups, n_fun)
        args, kwargs = unpack_key(key, dynamic)
        out = call(resolve(fun_dynamic), args, kwargs, concrete)
        return filter_output(out, lambda: [*fun_dynamic, *dynamic])

    def direct(*groups: Any) -> Any:
        fun_dynamic, args, kwargs = order.direct_inside(groups)
        concrete = check_direct_call()
        out = call(resolve(fun_dynamic), args, kwargs, concrete)
        return filter_output(out, lambda: flatten((fun_dynamic, args, kwargs))[0])

    # Named after `fun`, for readable jaxprs, HLO and profiles.
    for body in (keyed, direct):
        body.__name__ = name
        body.__qualname__ = qualname
    compiled = Compiled(
        jax.jit(keyed, static_argnums=0, donate_argnums=order.keyed_donated),
        jax.jit(direct, donate_argnums=order.direct_donated),
        made_for,
        order,
        layout,
    )
    _LIVE.add(compiled)
    return compiled


# id(fun) -> (weak reference to fun, {(donate mode, layout): Compiled}). Keyed by
# identity, as a function's `==` is identity anyway. The weak reference's
# callback drops the entry (and with it the jitted functions and their
# compiled code) once `fun` is garbage collected. One entry per function means
# that `filter_jit(f)(x)` in a loop compiles once, as `jax.jit(f)(x)` does.
_Options = tuple[DonateMode, "Layout | None"]
_BY_IDENTITY: dict[int, tuple[weakref.ref, dict[_Options, Compiled]]] = {}
# (static part, mode, layout) -> Compiled, most recently used last.
_BY_STATIC_PART: collections.OrderedDict[
    tuple[StaticPart, DonateMode, Layout | None], Compiled
] = collections.OrderedDict()
_LIVE: weakref.WeakSet[Compiled] = weakref.WeakSet()
_LOCK = threading.RLock()


def _forget(
    fun_id: int,
    ref: weakref.ref,
    entries: dict[int, tuple[weakref.ref, dict[_Options, Compiled]]] = _BY_IDENTITY,
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
    fun: Any,
    mode: DonateMode,
    known: Compiled | None = None,
    layout: Layout | None = None,
) -> tuple[Compiled, list[Any]]:
    """The shared `Compiled` for `fun` (with `layout`'s shardings) and the
    arrays inside `fun` (traced arguments of every call). `known` (the
    `Compiled` of the wrapper a copy is made from) is checked first: it is the
    one when `fun` is the same plain function, or a callable of the same
    static part; a copy keeps its layout."""
    if known is not None:
        layout = known.layout
    if isinstance(fun, types.FunctionType):
        if known is not None and known.is_for_function(fun):
            return known, []
        return _compiled_by_identity(fun, *_names(fun), mode, layout), []
    fun_dynamic, fun_static = split(fun)
    if known is not None and known.made_for == fun_static:
        return known, fun_dynamic
    key = (fun_static, mode, layout)
    with _LOCK:
        compiled = _BY_STATIC_PART.get(key)
        if compiled is None:
            compiled = _new_compiled(fun_static, *_names(fun), mode, layout)
            _BY_STATIC_PART[key] = compiled
            if len(_BY_STATIC_PART) > _MAX_STATIC_ENTRIES:
                _BY_STATIC_PART.popitem(last=False)
        else:
            _BY_STATIC_PART.move_to_end(key)
    return compiled, fun_dynamic


def _compiled_by_identity(
    fun: Any, name: str, qualname: str, mode: DonateMode, layout: Layout | None
) -> Compiled:
    with _LOCK:
        fun_id = id(fun)
        entry = _BY_IDENTITY.get(fun_id)
        if entry is None or entry[0]() is not fun:
            entry = (weakref.ref(fun, functools.partial(_forget, fun_id)), {})
            _BY_IDENTITY[fun_id] = entry
        compiled = entry[1].get((mode, layout))
        if compiled is None:
            compiled = _new_compiled(entry[0], name, qualname, mode, layout)
            entry[1][mode, layout] = compiled
        return compiled


@register_cache_clearer
def _clear_jit_caches() -> None:
    for compiled in list(_LIVE):
        compiled.keyed.clear_cache()
        compiled.direct.clear_cache()
    with _LOCK:
        _BY_STATIC_PART.clear()
    clear_leaf_kinds()
    clear_memo()
