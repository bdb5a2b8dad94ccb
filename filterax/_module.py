"""`Module`: frozen dataclasses that are JAX pytrees."""

from __future__ import annotations

import abc
import dataclasses
import re
import types
from collections.abc import Callable
from typing import Any, Generic, TypeVar, get_origin

import jax.tree_util as jtu

from ._bound_method import BoundMethod, MethodDescriptor
from ._construction import (
    ClassPlan,
    StaticArrayWarning,
    guard_replaced_init,
    make_generated_init,
    module_delattr,
    module_setattr,
    unpickle,
    wrap_custom_init,
)

__all__ = [
    "AbstractClassVar",
    "AbstractVar",
    "BoundMethod",
    "Module",
    "StaticArrayWarning",
    "field",
]

_T = TypeVar("_T")


def field(
    *,
    static: bool = False,
    converter: Callable[[Any], Any] | None = None,
    **kwargs: Any,
) -> Any:
    """Declares a `Module` field, like `dataclasses.field` with two additions.

    **Arguments:**

    - `static`: keep the value in the pytree structure (the treedef) instead of
      as a leaf. It must be hashable; transforms treat it as a compile-time
      constant. Storing an array here warns once (`StaticArrayWarning`).
    - `converter`: a callable applied to the value when it is assigned during
      `__init__` (by the generated `__init__` or by `self.name = value` in a
      custom one).
    - `**kwargs`: passed to `dataclasses.field` (`default`, `default_factory`,
      `repr`, `kw_only`, `metadata`, ...).

    **Returns:** a `dataclasses.Field`.

    ```python
    >>> import jax.numpy as jnp
    >>> import filterax as fx
    >>> class Scale(fx.Module):
    ...     factor: jnp.ndarray = fx.field(converter=jnp.asarray)
    ...     name: str = fx.field(static=True, default="scale")
    >>> Scale(2.0)
    Scale(factor=f32[], name='scale')

    ```
    """
    metadata = dict(kwargs.pop("metadata", None) or {})
    if "static" in metadata or "converter" in metadata:
        raise ValueError(
            "Pass `static` and `converter` as arguments of filterax.field, not "
            "inside `metadata`."
        )
    if static:
        metadata["static"] = True
    if converter is not None:
        if not callable(converter):
            raise TypeError(f"converter must be callable, got {converter!r}.")
        metadata["converter"] = converter
    return dataclasses.field(metadata=metadata, **kwargs)


class AbstractVar(Generic[_T]):
    """Annotates an attribute that concrete subclasses must provide.

    `x: AbstractVar[int]` is not a field. A subclass resolves it with a field of
    the same name, a class attribute, or a property; instantiating a class that
    leaves it unresolved raises `TypeError`.

    **Arguments:** the attribute's type, as a subscript: `AbstractVar[T]`.

    **Returns:** an annotation; it is never instantiated.

    ```python
    >>> import filterax as fx
    >>> class Shape(fx.Module):
    ...     sides: fx.AbstractVar[int]
    >>> class Square(Shape):
    ...     sides: int = 4
    >>> Square().sides
    4
    >>> Shape()
    Traceback (most recent call last):
    ...
    TypeError: Can't instantiate abstract Module Shape: AbstractVar 'sides' is not provided.

    ```
    """


class AbstractClassVar(Generic[_T]):
    """Annotates a class attribute that concrete subclasses must define.

    Like [`AbstractVar`][filterax.AbstractVar], but only a class attribute
    (for example `name: ClassVar[str] = "relu"`) resolves it, not a field.

    **Arguments:** the attribute's type, as a subscript: `AbstractClassVar[T]`.

    **Returns:** an annotation; it is never instantiated.

    ```python
    >>> from typing import ClassVar
    >>> import filterax as fx
    >>> class Activation(fx.Module):
    ...     name: fx.AbstractClassVar[str]
    >>> class ReLU(Activation):
    ...     name: ClassVar[str] = "relu"
    >>> ReLU().name
    'relu'

    ```
    """


_ABSTRACT_ANNOTATION = re.compile(r"^\s*(?:[\w.]+\.)?(AbstractVar|AbstractClassVar)\[")


def _abstract_kind(annotation: Any) -> str | None:
    """'var', 'classvar' or None for one class annotation (string or object)."""
    if isinstance(annotation, str):
        match = _ABSTRACT_ANNOTATION.match(annotation)
        if match is None:
            return None
        return "var" if match.group(1) == "AbstractVar" else "classvar"
    origin = get_origin(annotation)
    if origin is AbstractVar or annotation is AbstractVar:
        return "var"
    if origin is AbstractClassVar or annotation is AbstractClassVar:
        return "classvar"
    return None


def _is_dunder(name: str) -> bool:
    return name.startswith("__") and name.endswith("__")


def _strip_abstract_annotations(cls: type) -> tuple[frozenset[str], frozenset[str]]:
    """Removes `AbstractVar`/`AbstractClassVar` annotations from `cls` (they are
    not fields) and returns the names of each kind."""
    annotations = cls.__dict__.get("__annotations__", {})
    abstract_vars, abstract_class_vars = set(), set()
    kept = {}
    for name, annotation in annotations.items():
        kind = _abstract_kind(annotation)
        if kind == "var":
            abstract_vars.add(name)
        elif kind == "classvar":
            abstract_class_vars.add(name)
        else:
            kept[name] = annotation
    if abstract_vars or abstract_class_vars:
        cls.__annotations__ = kept
    return frozenset(abstract_vars), frozenset(abstract_class_vars)


def _unresolved_abstract(cls: type, field_names: set[str]) -> list[str]:
    unresolved = []
    for base in cls.__mro__:
        for name in base.__dict__.get("__filterax_abstract_vars__", ()):
            provided = name in field_names or any(
                name in k.__dict__ for k in cls.__mro__
            )
            if not provided:
                unresolved.append(f"AbstractVar {name!r}")
        for name in base.__dict__.get("__filterax_abstract_class_vars__", ()):
            if not any(name in k.__dict__ for k in cls.__mro__):
                unresolved.append(f"AbstractClassVar {name!r}")
    return sorted(set(unresolved))


def _init_is_custom(cls: type, namespace: dict[str, Any]) -> bool:
    """A class has a custom `__init__` when it writes one, or inherits one
    written by an ancestor Module (a generated one is never inherited). Custom
    ones are wrapped by `wrap_custom_init`, which marks them."""
    if "__init__" in namespace:
        return True
    return getattr(cls.__init__, "__filterax_custom_init__", False)


class _ModuleMeta(abc.ABCMeta):
    """Makes every `Module` subclass a frozen dataclass whose `__init__` carries
    the construction hooks (see `_construction`)."""

    def __new__(
        mcs,
        name: str,
        bases: tuple[type, ...],
        namespace: dict[str, Any],
        **kwargs: Any,
    ) -> type:
        for attribute in ("__setattr__", "__delattr__"):
            if attribute in namespace:
                raise TypeError(
                    f"{name} defines {attribute}; Module instances are immutable "
                    "after __init__ and manage attribute assignment themselves."
                )
        cls = super().__new__(mcs, name, bases, namespace, **kwargs)
        abstract_vars, abstract_class_vars = _strip_abstract_annotations(cls)
        custom_init = _init_is_custom(cls, namespace)

        def set_attribute(attr: str, value: Any) -> None:
            type.__setattr__(cls, attr, value)

        set_attribute("__filterax_abstract_vars__", abstract_vars)
        set_attribute("__filterax_abstract_class_vars__", abstract_class_vars)
        dataclasses.dataclass(cls, init=False, repr=False, eq=False, frozen=True)
        # The frozen dataclass refuses all assignment; ours also allows it while
        # a custom __init__ runs.
        set_attribute("__setattr__", module_setattr)
        set_attribute("__delattr__", module_delattr)
        fields = dataclasses.fields(cls)
        for attr_name, value in namespace.items():
            if isinstance(value, types.FunctionType) and not _is_dunder(attr_name):
                set_attribute(attr_name, MethodDescriptor(value))
        unresolved = _unresolved_abstract(cls, {f.name for f in fields})
        abstract_error = None
        if unresolved:
            abstract_error = (
                f"Can't instantiate abstract Module {cls.__qualname__}: "
                + ", ".join(f"{u} is not provided" for u in unresolved)
                + "."
            )
        plan = ClassPlan(cls, custom_init, abstract_error)
        set_attribute("__filterax_plan__", plan)
        set_attribute(
            "__filterax_assign__", {f.name: f.metadata.get("converter") for f in fields}
        )
        if "__init__" in namespace:
            set_attribute("__init__", wrap_custom_init(namespace["__init__"]))
        elif not custom_init:
            set_attribute("__init__", make_generated_init(cls, plan))
        return cls

    def __setattr__(cls, name: str, value: Any) -> None:
        if name == "__init__":
            # A decorator replacing __init__ (jaxtyping's `jaxtyped`) must not
            # see JAX's unflatten calls.
            value = guard_replaced_init(cls, value)
        super().__setattr__(name, value)


class Module(metaclass=_ModuleMeta):
    """Base class for models: frozen dataclasses that are JAX pytrees.

    Subclasses are dataclasses automatically. Fields are pytree children in
    declaration order, with `GetAttrKey(name)` key paths; `field(static=True)`
    keeps a value in the treedef instead. A custom `__init__` may assign
    `self.name = value`; afterwards the instance is immutable. `__check_init__`,
    on any class of the MRO, runs after `__init__` for validation. Plain methods
    accessed on an instance are pytrees too (see
    [`BoundMethod`][filterax.BoundMethod]). `==` is
    [`tree_equal`][filterax.tree_equal]; `hash` works when every leaf is
    hashable; `repr` is [`tree_pformat`][filterax.tree_pformat].

    **Arguments:** a subclass's constructor takes its fields, in declaration
    order (positionally or by keyword), unless the subclass writes `__init__`.

    **Returns:** an immutable instance; `Module` itself is only subclassed.

    ```python
    >>> import jax, jax.numpy as jnp
    >>> import filterax as fx
    >>> class Linear(fx.Module):
    ...     weight: jax.Array
    ...     bias: jax.Array
    ...     def __init__(self, n_in, n_out, key):
    ...         self.weight = jax.random.normal(key, (n_out, n_in))
    ...         self.bias = jnp.zeros(n_out)
    ...     def __call__(self, x):
    ...         return self.weight @ x + self.bias
    >>> model = Linear(4, 8, jax.random.key(0))
    >>> model
    Linear(weight=f32[8,4], bias=f32[8])
    >>> model(jnp.ones(4)).shape
    (8,)
    >>> [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_leaves_with_path(model)]
    ['.weight', '.bias']
    >>> model.bias = jnp.ones(8)
    Traceback (most recent call last):
    ...
    dataclasses.FrozenInstanceError: cannot assign to field 'bias': Linear is immutable after __init__; use filterax.tree_at to make a modified copy.

    ```
    """

    def __repr__(self) -> str:
        from ._pretty import tree_pformat

        return tree_pformat(self)

    def __eq__(self, other: object) -> Any:
        from ._tree import tree_equal

        return tree_equal(self, other)

    def __hash__(self) -> int:
        leaves, treedef = jtu.tree_flatten(self)
        return hash((treedef, tuple(leaves)))

    def __reduce__(self) -> tuple[Any, ...]:
        return unpickle, (type(self), dict(self.__dict__))
