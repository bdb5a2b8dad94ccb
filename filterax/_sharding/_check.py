"""`check_shardings_fit`: shardings checked against the arrays they lay out,
before JAX sees them, each misfit named by its key path."""

from __future__ import annotations

from typing import Any

import jax
import jax.tree_util as jtu
from jax.sharding import PartitionSpec

from .._mapping._axes import specs_for_leaves
from .._mapping._shard import check_leaf_shardings, leaf_path

__all__ = ["check_shardings_fit"]


def _is_sharding_leaf(spec: Any) -> bool:
    # `PartitionSpec` is a tuple: it must be caught before being descended into.
    return spec is None or isinstance(spec, (jax.sharding.Sharding, PartitionSpec))


def check_shardings_fit(
    tree: Any, shardings: Any = None, *, who: str, root: str = "template"
) -> None:
    """Checks that every sharding fits the array it lays out: a
    `NamedSharding`'s (or a `PartitionSpec`'s, under `jax.set_mesh`) spec has
    no more entries than the array has dimensions, names only axes of its
    mesh and each once, and its mesh axes' sizes divide the dimensions they
    split. For the templates a restore is given, and anything else that
    hands shardings on to JAX, whose own errors name no key path.

    **Arguments:**

    - `tree`: a pytree whose array leaves (`jax.Array`s, NumPy arrays,
      `jax.ShapeDtypeStruct`s) give the shapes; other leaves are skipped.
    - `shardings`: a pytree prefix of `tree` whose leaves are shardings,
      `PartitionSpec`s or `None` (unchecked); `None` (default) checks each
      leaf's own `sharding` (a template of structs with shardings, say).
    - `who`: what is checking, the start of the error message (such as
      `"filterax.checkpoint.restore"`).
    - `root`: the name of `tree` in the key path (`template.layers[0].weight`).

    **Returns:** `None`.

    **Raises:** `ValueError` starting with `who`, naming the key path of the
    first array its sharding does not fit, the sharding and why;
    `ValueError` naming where `shardings` is not a prefix of `tree`.

    ```python
    >>> import jax, jax.numpy as jnp
    >>> from jax.sharding import NamedSharding, PartitionSpec as P
    >>> from filterax._sharding import check_shardings_fit
    >>> mesh = jax.make_mesh((4, 2), ("data", "model"))
    >>> rows = NamedSharding(mesh, P("data"))
    >>> template = {"w": jax.ShapeDtypeStruct((6, 2), jnp.float32, sharding=rows)}
    >>> check_shardings_fit(template, who="restore")
    Traceback (most recent call last):
    ...
    ValueError: restore: at template['w']: the sharding P('data',) splits dimension 0 (size 6) of an array of shape (6, 2) into 4 parts over ('data',); 4 does not divide 6.
    >>> check_shardings_fit({"w": jnp.zeros((8, 2))}, {"w": rows}, who="place")

    ```
    """
    if shardings is None:
        leaves = jtu.tree_leaves(tree)
        specs = [getattr(leaf, "sharding", None) for leaf in leaves]
    else:
        leaves, specs, _ = specs_for_leaves(
            shardings,
            tree,
            name=f"{who}: shardings",
            root=root,
            is_spec=_is_sharding_leaf,
        )
    check_leaf_shardings(leaves, specs, leaf_path(tree, root), who)
