"""Refs inside differentiated and rematerialised functions.

JAX refuses to write a value that carries a perturbation into a Ref that is not
itself being differentiated, and repeats the writes of a `jax.checkpoint`-ed
function when its backward pass recomputes it. The filtered transforms hand the
function a `RefView` in place of each Ref found in its arguments:

- under differentiation, a write stores the value with `stop_gradient` applied
  (state such as running statistics is never differentiated: its gradient is
  `None`);
- under `filter_checkpoint`, a write is an error that says why.

A `RefView` is a pytree node whose only child is the Ref, so nested transforms
still see (and trace) the Ref itself, and the view is rebuilt around it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.tree_util as jtu

from .._tree._filters import is_ref, register_ref_like

__all__ = ["RefView", "shield_refs", "unshield_refs"]

STOP_GRADIENT, READ_ONLY = "stop_gradient", "read_only"


def _stop_gradient(value: Any) -> Any:
    return jtu.tree_map(jax.lax.stop_gradient, value)


class RefView:
    """Stands in for a `jax.Ref` inside a filtered transform: reads go to the
    Ref; writes are stop-gradient-ed (`mode="stop_gradient"`) or refused
    (`mode="read_only"`, naming `where`)."""

    __slots__ = ("mode", "ref", "where")

    def __init__(self, ref: Any, mode: str, where: str):
        self.ref = ref
        self.mode = mode
        self.where = where

    def _writable(self, operation: str) -> None:
        if self.mode == READ_ONLY:
            raise ValueError(
                f"filter_checkpoint: the function {operation} the Ref at "
                f"{self.where}. A checkpointed function is run again when its "
                "backward pass recomputes it, so the write would happen twice. "
                "Write to the Ref outside the checkpointed function (return the "
                "new value from it), or do not checkpoint this function."
            )

    def __getitem__(self, index: Any) -> Any:
        return self.ref[index]

    def __setitem__(self, index: Any, value: Any) -> None:
        self._writable("writes to")
        self.ref[index] = _stop_gradient(value)

    def addupdate(self, value: Any, index: Any = ...) -> None:
        self._writable("updates")
        self.ref.addupdate(_stop_gradient(value), index)

    @property
    def shape(self) -> tuple[int, ...]:
        return self.ref.shape

    @property
    def dtype(self) -> Any:
        return self.ref.dtype

    @property
    def ndim(self) -> int:
        return self.ref.ndim

    @property
    def size(self) -> int:
        return self.ref.size

    def __repr__(self) -> str:
        return repr(self.ref)


def _unflatten_view(aux: tuple[str, str], children: Any) -> RefView:
    (ref,) = children
    return RefView(ref, *aux)


jtu.register_pytree_with_keys(
    RefView,
    lambda view: (((jtu.GetAttrKey("ref"), view.ref),), (view.mode, view.where)),
    _unflatten_view,
    flatten_func=lambda view: ((view.ref,), (view.mode, view.where)),
)
register_ref_like(RefView)


def _has_ref(leaves: list[Any]) -> bool:
    return any(map(is_ref, leaves))


def shield_refs(
    tree: Any, mode: str, describe: Callable[[tuple], str] | None = None
) -> Any:
    """`tree` with each Ref leaf replaced by a `RefView` (`tree` itself when it
    holds none, which costs one flatten). `describe(path)` names a Ref's key
    path, for the errors of read-only views."""
    leaves = jtu.tree_leaves(tree)
    if not _has_ref(leaves):
        return tree

    def shield(path: tuple, leaf: Any) -> Any:
        if not is_ref(leaf):
            return leaf
        where = describe(path) if describe else jtu.keystr(path)
        if isinstance(leaf, RefView):  # already a view: the stricter mode wins
            return RefView(
                leaf.ref, READ_ONLY if READ_ONLY in (mode, leaf.mode) else mode, where
            )
        return RefView(leaf, mode, where)

    return jtu.tree_map_with_path(shield, tree, is_leaf=_is_view)


def _is_view(node: Any) -> bool:
    return isinstance(node, RefView)


def unshield_refs(tree: Any) -> Any:
    """Undoes `shield_refs` in what a function returns: the Refs themselves
    come back, never a view."""
    if not any(
        isinstance(leaf, RefView) for leaf in jtu.tree_leaves(tree, is_leaf=_is_view)
    ):
        return tree
    return jtu.tree_map(
        lambda node: node.ref if isinstance(node, RefView) else node,
        tree,
        is_leaf=_is_view,
    )
