"""Treescope display of filterax objects (the optional `treescope` extra).

[Treescope](https://treescope.readthedocs.io) renders a pytree as a foldable
HTML tree in notebooks, with a summary of each array (dtype, shape and value
statistics). This module teaches it filterax's types:

- a `Module` as `Name(field=..., ...)` over its `repr=True` fields, as its
  `repr` does, each layer type with its own background colour;
- `NonDifferentiable(value=...)`, `SymbolicZero(shape=..., dtype=...)`;
- an `nn.State` as its entries, named as in its `repr`
  (`Net.norm.batch_counter`);
- a `jax.Ref` as `Ref(...)` around its current value, and a typed PRNG key
  array as `key<fry>[3]` around its raw key data.

Nothing here runs on `import filterax`, which must not import treescope:
`Module.__treescope_repr__` imports this module the first time a Module is
displayed, and importing it registers the handlers for the other types in
treescope's registry.

May import: `treescope`, `jax`, and the filterax classes it displays
(`_ad` for `NonDifferentiable` and `SymbolicZero`, `nn` for `State`); nothing
imports it at module level.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.tree_util as jtu
from treescope import (
    canonical_aliases,
    formatting_util,
    renderers,
    rendering_parts,
    repr_lib,
    type_registries as _registries,
)

import filterax

from . import debug, nn
from ._ad import NonDifferentiable, SymbolicZero
from .nn import State

__all__ = ["render_module", "render_object", "set_up"]

_Renderer = renderers.TreescopeSubtreeRenderer
_Rendering = rendering_parts.Rendering

# The type of a `jax.new_ref` value and of a typed key array, taken from
# instances: JAX names neither class in its public API.
_REF_TYPE: type[Any] = jax.Ref
_KEY_ARRAY_TYPE: type[Any] = type(jax.random.key(0))


def _color(cls: type[Any]) -> str:
    # One stable background colour per class, so that layers of one type look
    # alike across a model.
    return formatting_util.color_from_string(cls.__qualname__)


def render_module(
    module: Any, path: str | None, subtree_renderer: _Renderer
) -> _Rendering:
    """Renders a Module as `Name(field=..., ...)` over its `repr=True` fields.

    **Arguments:**

    - `module`: the Module.
    - `path`: its path in the displayed tree (treescope's `path` argument).
    - `subtree_renderer`: renders each field (treescope's renderer).

    **Returns:** the treescope rendering.
    """
    attributes = {}
    for field in dataclasses.fields(module):
        if not field.repr:
            continue
        try:
            attributes[field.name] = getattr(module, field.name)
        except AttributeError:  # a field an unfinished __init__ has not set
            continue
    return repr_lib.render_object_constructor(
        object_type=type(module),
        attributes=attributes,
        path=path,
        subtree_renderer=subtree_renderer,
        color=_color(type(module)),
    )


def _render_non_differentiable(
    node: Any, path: str | None, subtree_renderer: _Renderer
) -> _Rendering:
    return repr_lib.render_object_constructor(
        object_type=NonDifferentiable,
        attributes={"value": node.value},
        path=path,
        subtree_renderer=subtree_renderer,
        color=_color(NonDifferentiable),
    )


def _render_symbolic_zero(
    node: Any, path: str | None, subtree_renderer: _Renderer
) -> _Rendering:
    return repr_lib.render_object_constructor(
        object_type=SymbolicZero,
        attributes={"shape": node.shape, "dtype": node.dtype},
        path=path,
        subtree_renderer=subtree_renderer,
    )


def _render_state(
    node: Any, path: str | None, subtree_renderer: _Renderer
) -> _Rendering | Any:
    try:
        children, _ = jtu.tree_flatten_with_path(node, is_leaf=lambda x: x is not node)
    except Exception:  # a superseded State: its repr says so
        return NotImplemented
    lines = []
    for key_path, value in children:
        (key,) = key_path
        name = key.key if isinstance(key, jtu.DictKey) else jtu.keystr(key_path)
        lines.append(
            rendering_parts.build_full_line_with_annotations(
                rendering_parts.siblings_with_annotations(
                    f"{name}=", subtree_renderer(value, path=None)
                ),
                ",",
            )
        )
    return rendering_parts.build_foldable_tree_node_from_children(
        prefix=rendering_parts.siblings(
            rendering_parts.maybe_qualified_type_name(type(node)), "("
        ),
        children=lines,
        suffix=")",
        path=path,
        background_color=_color(type(node)),
    )


def _render_ref(
    node: Any, path: str | None, subtree_renderer: _Renderer
) -> _Rendering | Any:
    try:
        value = node[...]
    except Exception:  # not readable here (inside a trace that owns it)
        return NotImplemented
    return rendering_parts.build_foldable_tree_node_from_children(
        prefix="Ref(",
        children=[
            rendering_parts.build_full_line_with_annotations(
                subtree_renderer(value, path=None if path is None else f"{path}[...]")
            )
        ],
        suffix=")",
        path=path,
    )


def _render_key_array(
    node: Any, path: str | None, subtree_renderer: _Renderer
) -> _Rendering:
    impl = str(node.dtype)  # "key<fry>"
    shape = ",".join(str(size) for size in node.shape)
    return rendering_parts.build_foldable_tree_node_from_children(
        prefix=f"{impl}[{shape}](",
        children=[
            rendering_parts.build_full_line_with_annotations(
                rendering_parts.siblings_with_annotations(
                    "key_data=",
                    subtree_renderer(jax.random.key_data(node), path=None),
                )
            )
        ],
        suffix=")",
        path=path,
    )


def render_object(node: Any, path: str | None, subtree_renderer: _Renderer) -> Any:
    """The `__treescope_repr__` of filterax's classes that are not Modules
    (`NonDifferentiable`, `SymbolicZero`, `State`): their rendering, shown
    even before anything else has imported this module."""
    for cls, render in _HANDLERS:
        if isinstance(node, cls):
            return render(node, path, subtree_renderer)
    return NotImplemented


def set_up() -> None:
    """Registers the handlers for the filterax types that are not Modules, and
    the public names of classes and functions (`filterax.nn.Linear`, not the
    module that defines it).

    Runs when this module is imported; running it again changes nothing.

    **Returns:** `None`.

    ```python
    >>> import jax, jax.numpy as jnp
    >>> import treescope
    >>> import filterax as fx
    >>> from filterax import _treescope
    >>> _treescope.set_up()
    >>> print(treescope.render_to_text(fx.NonDifferentiable(jnp.zeros(2))))
    NonDifferentiable(
      value=<jax.Array([0., 0.], dtype=float32)>,
    )

    ```
    """
    for cls, render in _HANDLERS:
        _registries.TREESCOPE_HANDLER_REGISTRY[cls] = render
    for namespace in (filterax, nn, debug):
        canonical_aliases.populate_from_public_api(
            namespace, canonical_aliases.prefix_filter("filterax")
        )


_HANDLERS: tuple[tuple[type[Any], Any], ...] = (
    (NonDifferentiable, _render_non_differentiable),
    (SymbolicZero, _render_symbolic_zero),
    (State, _render_state),
    (_REF_TYPE, _render_ref),
    (_KEY_ARRAY_TYPE, _render_key_array),
)
set_up()
