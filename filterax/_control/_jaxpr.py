"""A body traced once to a jaxpr, with what it closes over made explicit.

`jax.custom_jvp` and `jax.custom_vjp` must not close over values that are
being differentiated, and a body's parameters usually are (an RNN's weights).
`trace_body` traces a flat function once with `jax.make_jaxpr`, keeps the Refs
it closes over as constants (a Ref is shared, never differentiated) and hands
every other closed-over value back as an explicit input, so that the custom
rules can see it and differentiate with respect to it. Evaluating the jaxpr
again inside `lax` never runs the user's Python a second time.

`writes_refs` says whether a traced body writes a Ref that it did not create.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax

from .._compat import ClosedJaxpr, Jaxpr, jaxpr_as_fun, jaxprs_in_params
from .._tree._filters import is_ref
from .._tree._split import interleave

__all__ = ["TracedBody", "trace_body", "writes_refs"]

# `jax.ref.swap` (also behind `ref[...] = x`) and `jax.ref.addupdate`.
_REF_WRITES = frozenset({"swap", "addupdate"})


class TracedBody:
    """A flat function traced once. `call(hoisted, refs, *args)` evaluates it,
    with `hoisted` and `refs` in place of the values and the Refs it closed
    over (`self.hoisted`, `self.refs` when it was traced).

    Refs are passed explicitly too: a Ref created inside a differentiated
    function is a tracer of that differentiation, which a custom rule must
    receive as an input rather than close over.
    """

    __slots__ = ("closed", "hoisted", "ref_mask", "refs")

    def __init__(self, closed: ClosedJaxpr):
        self.closed = closed
        self.ref_mask = bytes(map(is_ref, closed.consts))
        self.refs = [c for c in closed.consts if is_ref(c)]
        self.hoisted = [c for c in closed.consts if not is_ref(c)]

    def call(
        self, hoisted: Sequence[Any], refs: Sequence[Any], *args: Any
    ) -> list[Any]:
        consts = interleave(self.ref_mask, refs, hoisted)
        return list(jaxpr_as_fun(ClosedJaxpr(self.closed.jaxpr, consts))(*args))

    @property
    def writes_refs(self) -> bool:
        return writes_refs(self.closed.jaxpr)


def trace_body(fn: Callable[..., Sequence[Any]], *example_args: Any) -> TracedBody:
    """Traces `fn` (flat arrays in, a flat list of arrays out) once."""
    return TracedBody(jax.make_jaxpr(fn)(*example_args))


def writes_refs(jaxpr: Jaxpr) -> bool:
    """Whether `jaxpr` writes a Ref it was given or closed over.

    A Ref that the jaxpr creates itself (`jax.new_ref` inside the body) and
    writes is local state: repeating the body repeats those writes harmlessly.
    Inside nested jaxprs (a `lax.scan` in the body) every written Ref input
    counts, as the nested jaxpr cannot tell where its inputs came from.
    """
    outer = {id(v) for v in (*jaxpr.constvars, *jaxpr.invars)}
    return _writes(jaxpr, outer)


def _writes(jaxpr: Jaxpr, outer: set[int]) -> bool:
    for eqn in jaxpr.eqns:
        if eqn.primitive.name in _REF_WRITES and id(eqn.invars[0]) in outer:
            return True
        for sub in jaxprs_in_params(eqn.params):
            if _writes(sub, {id(v) for v in (*sub.constvars, *sub.invars)}):
                return True
    return False
