"""Rebuilding a pytree of a known structure, many times, faster than JAX does.

`treedef.unflatten` builds every Module node by calling its class with the
fields as keywords, which runs `__init__`: about a microsecond per node, paid
again on every call of a `filter_jit` function that returns a model. A
*builder* is Python source generated once for one structure (treedef, where
the dynamic leaves sit, the static leaves): it creates Module nodes with
`object.__new__` and fills their `__dict__` directly, builds tuples, lists,
dicts, `None` and namedtuples with literals, and leaves every other node type
to JAX's unflatten of that subtree. That is what unflattening a Module does
anyway (the values were checked when the tree was first built, inside the
trace), so the result is the same tree of new objects.

Modules are recognised by duck typing (a registered `__filterax_plan__` naming
their data and static fields), so this module imports nothing from filterax
but `_compat`. Each builder is checked once against JAX's unflatten before it is used.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from typing import Any

import jax.tree_util as jtu

from .._compat import same_structure

__all__ = ["flatten", "make_builder"]

# `jax.tree_util.tree_flatten` is a Python function calling this C++ method.
flatten = jtu.default_registry.flatten

# A structure this large is rebuilt by JAX: the source would take longer to
# compile than it saves.
_MAX_NODES = 20_000


class _Source:
    """The statements of one builder and the objects its source refers to."""

    def __init__(self, mask: bytes, static: Sequence[Any]):
        self.mask = mask
        self.static = static
        self.lines: list[str] = []
        self.constants: dict[str, Any] = {}
        self.leaf = 0  # position among all leaves
        self.static_index = 0
        self.dynamic_index = 0

    def constant(self, value: Any) -> str:
        name = f"_k{len(self.constants)}"
        self.constants[name] = value
        return name

    def next_leaf(self) -> str:
        dynamic = self.mask[self.leaf]
        self.leaf += 1
        if dynamic:
            self.dynamic_index += 1
            return f"_d[{self.dynamic_index - 1}]"
        self.static_index += 1
        return f"_s[{self.static_index - 1}]"

    def node(self, treedef: Any) -> str:
        """An expression for the subtree `treedef`, consuming its leaves."""
        data = treedef.node_data()
        if data is None:
            return self.next_leaf()
        cls, aux = data
        if cls is type(None):
            return "None"
        if cls is tuple or cls is list:
            items = [self.node(child) for child in treedef.children()]
            if cls is list:
                return f"[{', '.join(items)}]"
            return self._tuple(items)
        if cls is dict:
            items = [self.node(child) for child in treedef.children()]
            pairs = (f"{self.constant(key)}: {item}" for key, item in zip(aux, items))
            return f"{{{', '.join(pairs)}}}"
        plan = cls.__dict__.get("__filterax_plan__")
        if plan is not None and plan.registered:
            return self._module(cls, aux, plan, treedef)
        if issubclass(cls, tuple) and hasattr(cls, "_fields") and aux is None:
            items = [self.node(child) for child in treedef.children()]
            return f"_tuple_new({self.constant(cls)}, {self._tuple(items)})"
        leaves = [self.next_leaf() for _ in range(treedef.num_leaves)]
        return f"{self.constant(treedef.unflatten)}([{', '.join(leaves)}])"

    @staticmethod
    def _tuple(items: list[str]) -> str:
        return f"({', '.join(items)}{',' if len(items) == 1 else ''})"

    def _module(self, cls: type, aux: tuple, plan: Any, treedef: Any) -> str:
        items = [self.node(child) for child in treedef.children()]
        stores = [
            f"_f[{name!r}] = {item}" for name, item in zip(plan.data_fields, items)
        ] + [
            f"_f[{name!r}] = {self.constant(value)}"
            for name, value in zip(plan.meta_fields, aux)
        ]
        variable = f"_n{len(self.lines)}"
        # Storing into the new instance's own `__dict__` is the cheapest way
        # past the frozen `__setattr__`.
        self.lines.append(
            "; ".join(
                [
                    f"{variable} = _new({self.constant(cls)})",
                    f"_f = {variable}.__dict__",
                ]
                + stores
            )
        )
        return variable


def make_builder(
    treedef: Any, mask: bytes, static: Sequence[Any]
) -> Callable[[Sequence[Any]], Any] | None:
    """A function rebuilding the tree of `treedef` from its dynamic leaves
    (`mask` has a non-zero byte where one goes; `static` holds the others, in
    order), or `None` when JAX's own unflatten is as good (no Module in it, or
    too large a structure)."""
    if treedef.num_nodes > _MAX_NODES:
        return None
    source = _Source(mask, static)
    result = source.node(treedef)
    if not source.lines:
        return None
    body = "\n".join(f"    {line}" for line in [*source.lines, f"return {result}"])
    names = ", ".join(["_new", "_tuple_new", "_s", *source.constants])
    text = f"def _outer({names}):\n  def build(_d):\n{body}\n  return build\n"
    namespace: dict[str, Any] = {}
    exec(compile(text, "<filterax rebuild>", "exec"), namespace)  # noqa: S102
    build = namespace["_outer"](
        object.__new__,
        tuple.__new__,
        tuple(static),
        *source.constants.values(),
    )
    return build if _agrees_with_jax(build, treedef, mask) else None


def _agrees_with_jax(
    build: Callable[[Sequence[Any]], Any], treedef: Any, mask: bytes
) -> bool:
    """Whether `build` gives the structure JAX's unflatten gives, with each
    dynamic leaf in its place: a guard against node types registered in ways
    the source does not foresee (say a namedtuple with its own flatten rule)."""
    probes = [object() for kind in mask if kind]
    try:
        leaves, rebuilt = flatten(build(probes))
        dynamic = [leaf for leaf, kind in zip(leaves, mask) if kind]
        return same_structure(rebuilt, treedef) and all(
            map(operator.is_, dynamic, probes)
        )
    except Exception:
        return False
