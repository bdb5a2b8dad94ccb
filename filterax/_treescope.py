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

Nothing here runs on `import filterax`, which must not import treescope.
Each displayed class has a `__treescope_repr__` hook that imports this module
the first time treescope shows one of its instances and says what to show;
importing it registers the handlers for JAX's Ref and key types.

May import: `treescope` and `jax`, and nothing of filterax: this module sits
below every class it displays. The public names it teaches treescope
(`filterax.nn.Linear`) are read from the `filterax` package already imported
(`sys.modules`), never imported from here.
"""

from __future__ import annotations

import dataclasses
import sys
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

__all__ = ["render_constructor", "render_entries", "render_module", "set_up"]

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
    return render_constructor(module, attributes, path, subtree_renderer)


def render_constructor(
    node: Any,
    attributes: dict[str, Any],
    path: str | None,
    subtree_renderer: _Renderer,
    *,
    coloured: bool = True,
) -> _Rendering:
    """Renders `node` as `Name(attribute=..., ...)`: how `NonDifferentiable`
    and `SymbolicZero` show, which are not dataclasses.

    **Arguments:**

    - `node`: the object; its class gives the name (and the colour).
    - `attributes`: what to show, by name.
    - `path`, `subtree_renderer`: treescope's arguments to the hook.
    - `coloured`: whether to give it its class's background colour.

    **Returns:** the treescope rendering.
    """
    return repr_lib.render_object_constructor(
        object_type=type(node),
        attributes=attributes,
        path=path,
        subtree_renderer=subtree_renderer,
        color=_color(type(node)) if coloured else None,
    )


def render_entries(
    node: Any, path: str | None, subtree_renderer: _Renderer
) -> _Rendering | Any:
    """Renders a node as `Name(key=..., ...)` over its pytree children, named
    by their dictionary keys (or key paths): how an `nn.State` shows its
    entries (`Net.norm.batch_counter=...`).

    **Arguments:** as for `render_module`.

    **Returns:** the treescope rendering, or `NotImplemented` (treescope's
    fallback) where the node cannot be flattened: a superseded `State`, whose
    `repr` says so.
    """
    try:
        children, _ = jtu.tree_flatten_with_path(node, is_leaf=lambda x: x is not node)
    except Exception:
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


def set_up() -> None:
    """Registers the handlers for JAX's Ref and typed key arrays, and the
    public names of filterax's classes and functions (`filterax.nn.Linear`,
    not the module that defines it) from the namespaces already imported.

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
    _registries.TREESCOPE_HANDLER_REGISTRY[_REF_TYPE] = _render_ref
    _registries.TREESCOPE_HANDLER_REGISTRY[_KEY_ARRAY_TYPE] = _render_key_array
    for name in ("filterax", "filterax.nn", "filterax.debug"):
        namespace = sys.modules.get(name)
        if namespace is not None:
            canonical_aliases.populate_from_public_api(
                namespace, canonical_aliases.prefix_filter("filterax")
            )


set_up()
