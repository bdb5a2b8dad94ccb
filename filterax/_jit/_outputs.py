"""What leaves a `filter_jit` trace: arrays, and everything else in the treedef.

Inside the trace, `filter_output` returns the output itself when every leaf is
an array and no node is a Module (JAX rebuilds it in C++), and otherwise a
`MixedOutput`: the array leaves as its children, and the output's `StaticPart`
(treedef, where the arrays sit, the other leaves) as static node data. Its
Modules are rebuilt by a generated builder (`_rebuild`), cheaper than JAX's
unflatten, and remembered by identity (`_memo`), so that passing them back in
costs no flattening. Python's garbage collector is paused while an output is
rebuilt (see `MixedOutput.rebuild`).

JAX refuses to return a `jax.Ref` from a compiled function. A Ref in the output
that came in as an argument is replaced by an `InputRef` marker naming its
position among the traced inputs; `MixedOutput.rebuild` puts the very Ref
object that went in back in its place.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from gc import (
    disable as _pause_collector,
    enable as _resume_collector,
    isenabled as _collector_running,
)
from typing import Any

import jax.tree_util as jtu

from .._filters import is_ref
from .._split import (
    STATIC,
    TRACER,
    StaticPart,
    flatten,
    leaf_kinds,
    mark_input_refs,
    split_leaves,
)
from ._memo import remember_outputs

__all__ = ["MixedOutput", "filter_output"]


class MixedOutput:
    """An output with non-array leaves, as it leaves the compiled function."""

    __slots__ = ("arrays", "static")

    def __init__(self, arrays: list[Any], static: StaticPart):
        self.arrays = arrays
        self.static = static

    def rebuild(self, inputs: Callable[[], Sequence[Any]]) -> Any:
        """The output; `inputs()` gives the flattened traced inputs of the call,
        needed only when the output returns input Refs.

        Python's garbage collector is paused while the output is built. A
        training step returns as many new Modules as it was given, and the
        caller frees the old ones as soon as it rebinds its variables; each
        free takes one off the collector's count of new objects. Left running,
        the collector would start a young collection in the middle of every
        large rebuild (past its threshold of new objects, 700 by default,
        arrays included), and promote the live outputs towards the costly full
        collections. Paused, the count rises and falls again before anything
        is allocated, so a loop that replaces its model never collects; a
        program that keeps its outputs collects at its next allocation, as it
        would have anyway.
        """
        running = _collector_running()
        if running:
            _pause_collector()
        try:
            out = self.static.merge_restoring_refs(self.arrays, inputs)
            remember_outputs(out, self.static, self.arrays)
        finally:
            if running:
                _resume_collector()
        return out


jtu.register_pytree_node(
    MixedOutput,
    lambda out: ((out.arrays,), out.static),
    lambda static, children: MixedOutput(children[0], static),
)


def filter_output(out: Any, traced_inputs: Callable[[], Sequence[Any]]) -> Any:
    """Inside the trace: `out` itself when all its leaves are arrays, else a
    `MixedOutput`. `traced_inputs()` gives the traced inputs, in the order that
    `InputRef` positions count."""
    leaves, treedef = flatten(out)
    kinds = leaf_kinds(leaves)
    if TRACER in kinds and any(map(is_ref, leaves)):
        leaves = mark_input_refs(leaves, traced_inputs(), "filter_jit")
        kinds = leaf_kinds(leaves)
    arrays, part = split_leaves(leaves, treedef, kinds)
    if STATIC not in kinds and not part.module_parts():
        return out
    return MixedOutput(arrays, part)
