"""`field` (and its deprecated alias `static_field`): declaring Module fields."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from .._warnings import FilteraxWarning, warn_deprecated

__all__ = [
    "AXES_KEY",
    "StaticArrayWarning",
    "check_axes_names",
    "field",
    "static_field",
]

# The metadata key under which `field(axes=...)` stores a field's logical axes.
AXES_KEY = "axes"


def check_axes_names(value: Any, where: str) -> tuple[str | None, ...]:
    """`value` as a tuple of logical axis names (each a `str` or `None`), or a
    `TypeError` naming `where` and saying what was expected."""
    if isinstance(value, (tuple, list)) and all(
        name is None or isinstance(name, str) for name in value
    ):
        return tuple(value)
    raise TypeError(
        f"{where}: logical axes must be a tuple with one entry per dimension, "
        f"each a str (a logical axis name) or None (never split); got {value!r}."
    )


class StaticArrayWarning(FilteraxWarning):
    """Warned once per field when a JAX array is stored in a static field.

    A static field lives in the treedef and is hashed on every transform call, so
    arrays belong in ordinary fields (or in a `NonDifferentiable`). JAX arrays
    are not hashable, so such a Module cannot be passed to `filter_jit` either.

    **Arguments:** the message, as for any
    [`FilteraxWarning`][filterax.FilteraxWarning].

    **Returns:** a warning instance (raised through `warnings.warn`).

    ```python
    >>> import warnings
    >>> import jax.numpy as jnp
    >>> import filterax as fx
    >>> class Table(fx.Module):
    ...     values: object = fx.field(static=True)
    >>> with warnings.catch_warnings(record=True) as caught:
    ...     warnings.simplefilter("always")
    ...     _ = Table(jnp.arange(3))
    >>> caught[0].category.__name__
    'StaticArrayWarning'

    ```
    """


StaticArrayWarning.__module__ = "filterax"  # its public name in messages


def field(
    *,
    static: bool = False,
    converter: Callable[[Any], Any] | None = None,
    axes: tuple[str | None, ...] | Mapping[str, tuple[str | None, ...]] | None = None,
    **kwargs: Any,
) -> Any:
    """Declares a `Module` field, like `dataclasses.field` with three additions.

    **Arguments:**

    - `static`: keep the value in the pytree structure (the treedef) instead of
      as a leaf. It must be hashable (an unhashable value is refused when the
      Module is built, naming the field); transforms treat it as a compile-time
      constant. Storing a JAX array here warns (`StaticArrayWarning`).
    - `converter`: a callable applied to the field's value once `__init__` (and
      `__post_init__`) return, before `__check_init__` runs. It is not applied
      when JAX rebuilds a Module from its leaves.
    - `axes`: logical names for the dimensions of the field's array, one per
      dimension: a `str` (such as `"embed"`) or `None` (that dimension is never
      split). A field holding a pytree of arrays gives the names to each array
      of matching rank (and `("stack", *axes)` to an array with one more
      dimension: a layer stacked by `filter_vmap`).
      [`sharding_of`][filterax.sharding_of] maps the names to mesh axes;
      [`logical_axes`][filterax.logical_axes] reads them. For a field holding
      a Module (a sub-layer), a mapping from that Module's field names to
      names: defaults for the sub-layer's parameters, below any `axes=` the
      sub-layer itself was built with (so the sub-layer stays an ordinary one,
      equal to one built on its own; a container of sub-layers gives them to
      each). A name the sub-layer has no field for is refused, naming this
      field, when the axes are read ([`logical_axes`][filterax.logical_axes],
      [`sharding_of`][filterax.sharding_of]). Stored in the field's
      `metadata["axes"]`.
    - `**kwargs`: passed to `dataclasses.field` (`default`, `default_factory`,
      `init`, `repr`, `kw_only`, `metadata`, ...).

    **Returns:** a `dataclasses.Field`.

    **Raises:** `ValueError` if `static`, `converter` or `axes` is passed inside
    `metadata`, or `axes` is given for a static field; `TypeError` if
    `converter` is not callable, `axes` is not a tuple of `str`/`None`, or
    a mapping's key is not a field name.

    ```python
    >>> import jax.numpy as jnp
    >>> import filterax as fx
    >>> class Scale(fx.Module):
    ...     factor: jnp.ndarray = fx.field(converter=jnp.asarray)
    ...     name: str = fx.field(static=True, default="scale")
    >>> Scale(2.0)
    Scale(factor=weak_f32[], name='scale')
    >>> class Table(fx.Module):
    ...     rows: jnp.ndarray = fx.field(axes=("vocab", "embed"))
    >>> fx.logical_axes(Table(jnp.zeros((5, 2))))
    Table(rows=('vocab', 'embed'))

    ```
    """
    metadata = dict(kwargs.pop("metadata", None) or {})
    if "static" in metadata or "converter" in metadata or AXES_KEY in metadata:
        raise ValueError(
            "Pass `static`, `converter` and `axes` as arguments of filterax.field, "
            "not inside `metadata`."
        )
    if axes is not None:
        if static:
            raise ValueError(
                "field(axes=...) names the dimensions of an array field; a static "
                "field holds no arrays."
            )
        if isinstance(axes, Mapping):
            for name in axes:
                if not (isinstance(name, str) and name.isidentifier()):
                    raise TypeError(
                        "field(axes={...}) maps the field names of the sub-layer "
                        "this field holds to their logical axes; a key must be "
                        f"a field name (a str), got {name!r}."
                    )
            metadata[AXES_KEY] = {
                name: check_axes_names(names, f"field(axes=...)[{name!r}]")
                for name, names in axes.items()
            }
        else:
            metadata[AXES_KEY] = check_axes_names(axes, "field(axes=...)")
    if static:
        metadata["static"] = True
    if converter is not None:
        if not callable(converter):
            raise TypeError(f"converter must be callable, got {converter!r}.")
        metadata["converter"] = converter
    return dataclasses.field(metadata=metadata, **kwargs)


def static_field(**kwargs: Any) -> Any:
    """Deprecated: use `field(static=True, ...)`, as in Equinox.

    **Arguments:** as for [`field`][filterax.field], without `static`.

    **Returns:** `field(static=True, **kwargs)`.

    ```python
    >>> import warnings
    >>> import filterax as fx
    >>> with warnings.catch_warnings(record=True) as caught:
    ...     warnings.simplefilter("always")
    ...     declared = fx.static_field(default=3)
    >>> caught[0].category.__name__, declared.metadata["static"]
    ('FilteraxDeprecationWarning', True)

    ```
    """
    warn_deprecated(
        "filterax.static_field is deprecated (as in Equinox): use "
        "`filterax.field(static=True, ...)` instead.",
        stacklevel=2,
    )
    return field(static=True, **kwargs)
