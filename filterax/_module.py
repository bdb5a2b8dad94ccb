"""`Module`: frozen dataclasses that are JAX pytrees."""

from __future__ import annotations

import abc
import dataclasses
import functools
import re
import sys
import types
import warnings
from collections.abc import Callable
from typing import Any, Generic, TypeVar, get_origin

import jax.tree_util as jtu

from ._compat import register_dataclass_node
from ._filters import is_array

__all__ = [
    "AbstractClassVar",
    "AbstractVar",
    "BoundMethod",
    "Module",
    "StaticArrayWarning",
    "field",
]

_T = TypeVar("_T")


class StaticArrayWarning(UserWarning):
    """Warned once per field when a JAX or NumPy array is stored in a static field."""


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


# --- Bound methods ---------------------------------------------------------------


class BoundMethod:
    """A method bound to a Module instance, itself a pytree.

    Its only child is the instance, so `jax.tree.leaves(model.method)` sees the
    model's arrays and `filter_jit(model.method)` traces them.

    ```python
    >>> import jax, jax.numpy as jnp
    >>> import filterax as fx
    >>> class Affine(fx.Module):
    ...     w: jax.Array
    ...     def apply(self, x):
    ...         return self.w * x
    >>> model = Affine(jnp.array(2.0))
    >>> jax.tree.leaves(model.apply)
    [Array(2., dtype=float32, weak_type=True)]
    >>> model.apply(3.0)
    Array(6., dtype=float32, weak_type=True)

    ```
    """

    __slots__ = ("__func__", "__self__")

    def __init__(self, func: Callable[..., Any], instance: Any):
        self.__func__ = func
        self.__self__ = instance

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.__func__(self.__self__, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        # `__name__`, `__qualname__`, `__doc__`, `__module__`... of the function.
        if name in ("__name__", "__qualname__", "__module__", "__doc__"):
            return getattr(self.__func__, name)
        raise AttributeError(name)

    @property
    def __wrapped__(self) -> Callable[..., Any]:
        return functools.partial(self.__func__, self.__self__)

    def __eq__(self, other: object) -> Any:
        if type(other) is not BoundMethod:
            return NotImplemented
        return self.__func__ == other.__func__ and self.__self__ == other.__self__

    def __hash__(self) -> int:
        return hash((BoundMethod, self.__func__, self.__self__))

    def __repr__(self) -> str:
        return f"<bound method {self.__func__.__qualname__} of {self.__self__!r}>"


jtu.register_pytree_with_keys(
    BoundMethod,
    lambda m: (((jtu.GetAttrKey("__self__"), m.__self__),), m.__func__),
    lambda func, children: BoundMethod(func, children[0]),
    flatten_func=lambda m: ((m.__self__,), m.__func__),
)


class _MethodDescriptor:
    """Class-level stand-in for a plain method: instance access binds it into a
    `BoundMethod` pytree; class access gives back the function itself."""

    __slots__ = ("__func__",)

    def __init__(self, func: Callable[..., Any]):
        self.__func__ = func

    def __get__(self, instance: Any, owner: type | None = None) -> Any:
        if instance is None:
            return self.__func__
        return BoundMethod(self.__func__, instance)

    @property
    def __isabstractmethod__(self) -> bool:
        return getattr(self.__func__, "__isabstractmethod__", False)

    @property
    def __doc__(self) -> str | None:  # type: ignore[override]
        return self.__func__.__doc__

    @property
    def __wrapped__(self) -> Callable[..., Any]:
        return self.__func__


# --- Construction ----------------------------------------------------------------

# JAX unflattens a C++ dataclass node by calling `cls(**fields)`. It also passes
# this extra meta field, whose value (read from the class attribute below) is a
# private token: that is how `_ModuleMeta.__call__` recognises an unflatten and
# skips `__init__`, converters and checks, as unflattening must.
_UNFLATTEN_FIELD = "__class__"


class _UnflattenToken:
    __slots__ = ()

    def __repr__(self) -> str:
        return "<filterax.Module>"


_UNFLATTEN_TOKEN = _UnflattenToken()

# Instances whose custom `__init__` (or `__post_init__`) is running, by `id`:
# only these accept attribute assignment.
_INITIALISING: set[int] = set()

_object_new = object.__new__
_object_setattr = object.__setattr__
_warned_static_arrays: set[tuple[type, str]] = set()


@dataclasses.dataclass(frozen=True)
class _ClassPlan:
    """What `_ModuleMeta.__call__` needs to know about one Module class."""

    abstract_error: str | None
    guards_assignment: bool
    finish: Callable[[Any], None] | None


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
    written by an ancestor Module (a generated one is never inherited)."""
    if "__init__" in namespace:
        return True
    for base in cls.__mro__[1:]:
        if "__filterax_custom_init__" in base.__dict__:
            return base.__dict__["__filterax_custom_init__"]
    return False


def _make_init(cls: type, fields: tuple[dataclasses.Field, ...]) -> Callable[..., None]:
    """Generates a dataclass-style `__init__` that stores into `__dict__` directly
    and applies converters; faster than a frozen dataclass's own."""
    positional, keyword, body = [], [], []
    defaults: dict[str, Any] = {}
    closure: dict[str, Any] = {"_FACTORY": _FACTORY}
    annotations: dict[str, Any] = {}
    seen_default = False
    for f in fields:
        if not f.init:
            if f.default is not dataclasses.MISSING:
                closure[f"_default_{f.name}"] = f.default
                body.append(f"  _d[{f.name!r}] = _default_{f.name}")
            elif f.default_factory is not dataclasses.MISSING:
                closure[f"_factory_{f.name}"] = f.default_factory
                body.append(f"  _d[{f.name!r}] = _factory_{f.name}()")
            continue
        annotations[f.name] = f.type
        has_default = (
            f.default is not dataclasses.MISSING
            or f.default_factory is not dataclasses.MISSING
        )
        if f.default_factory is not dataclasses.MISSING:
            closure[f"_factory_{f.name}"] = f.default_factory
            defaults[f.name] = _FACTORY
            body.append(f"  if {f.name} is _FACTORY: {f.name} = _factory_{f.name}()")
        elif f.default is not dataclasses.MISSING:
            defaults[f.name] = f.default
        if f.kw_only:
            keyword.append(f.name)
        else:
            if seen_default and not has_default:
                raise TypeError(
                    f"{cls.__qualname__}: field {f.name!r} without a default follows "
                    "a field with a default; give it a default or mark it kw_only."
                )
            seen_default = seen_default or has_default
            positional.append(f.name)
        value = f.name
        converter = f.metadata.get("converter")
        if converter is not None:
            closure[f"_convert_{f.name}"] = converter
            value = f"_convert_{f.name}({f.name})"
        body.append(f"  _d[{f.name!r}] = {value}")
    params = ["self", *positional]
    if keyword:
        params += ["*", *keyword]
    lines = [f"def __init__({', '.join(params)}):", "  _d = self.__dict__", *body]
    if "__post_init__" in dir(cls):
        lines.append("  self.__post_init__()")
    names = ", ".join(closure)
    source = f"def _build({names}):\n" + "\n".join(" " + line for line in lines)
    source += "\n return __init__\n"
    module_globals = getattr(sys.modules.get(cls.__module__), "__dict__", {})
    namespace: dict[str, Any] = {}
    # Executed with the class's module globals, as dataclasses does, so string
    # annotations (`from __future__ import annotations`) resolve for jaxtyping.
    exec(source, module_globals, namespace)  # noqa: S102
    init = namespace["_build"](**closure)
    init.__defaults__ = tuple(defaults[n] for n in positional if n in defaults) or None
    init.__kwdefaults__ = {n: defaults[n] for n in keyword if n in defaults} or None
    init.__annotations__ = {**annotations, "return": None}
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    init.__module__ = cls.__module__
    return init


class _FactorySentinel:
    __slots__ = ()

    def __repr__(self) -> str:
        return "<factory>"


_FACTORY = _FactorySentinel()


def _make_finish(
    cls: type,
    fields: tuple[dataclasses.Field, ...],
    custom_init: bool,
) -> Callable[[Any], None] | None:
    """The checks that run once the outermost `__init__` returns, or `None` when
    a class needs none (so construction pays nothing for them)."""
    check_inits = tuple(
        k.__dict__["__check_init__"]
        for k in cls.__mro__
        if "__check_init__" in k.__dict__
    )
    static_names = tuple(f.name for f in fields if f.metadata.get("static", False))
    must_be_set = tuple(
        f.name
        for f in fields
        if custom_init
        or (
            not f.init
            and f.default is dataclasses.MISSING
            and f.default_factory is dataclasses.MISSING
        )
    )
    if not (check_inits or static_names or must_be_set):
        return None

    def finish(self: Any) -> None:
        values = self.__dict__
        if must_be_set:
            missing = [name for name in must_be_set if name not in values]
            if missing:
                raise TypeError(
                    f"{type(self).__qualname__}.__init__ did not set the field(s) "
                    f"{', '.join(map(repr, missing))}; assign every field "
                    "(`self.name = value`) before __init__ returns."
                )
        for name in static_names:
            if is_array(values[name]) and (cls, name) not in _warned_static_arrays:
                _warned_static_arrays.add((cls, name))
                warnings.warn(
                    f"{cls.__qualname__}.{name} is a static field holding an array. "
                    "Static fields are compile-time constants hashed on every "
                    "transform call; store arrays in ordinary fields, or wrap them "
                    "in filterax.NonDifferentiable to exclude them from gradients.",
                    StaticArrayWarning,
                    stacklevel=3,
                )
        for check in check_inits:
            check(self)

    return finish


def _module_setattr(self, name: str, value: Any) -> None:
    if id(self) in _INITIALISING:
        assign = type(self).__filterax_assign__
        if name not in assign:
            raise AttributeError(
                f"{type(self).__qualname__} has no field {name!r}; declare it "
                f"in the class body (`{name}: <type>`) before assigning it."
            )
        converter = assign[name]
        self.__dict__[name] = value if converter is None else converter(value)
        return
    raise dataclasses.FrozenInstanceError(
        f"cannot assign to field {name!r}: {type(self).__qualname__} is "
        "immutable after __init__; use filterax.tree_at or dataclasses.replace "
        "to make a modified copy."
    )


def _module_delattr(self, name: str) -> None:
    raise dataclasses.FrozenInstanceError(
        f"cannot delete field {name!r}: {type(self).__qualname__} is immutable."
    )


class _ModuleMeta(abc.ABCMeta):
    """Makes every `Module` subclass a frozen dataclass and a C++-registered
    pytree, and runs the post-`__init__` checks."""

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
        cls.__filterax_abstract_vars__ = abstract_vars
        cls.__filterax_abstract_class_vars__ = abstract_class_vars
        custom_init = _init_is_custom(cls, namespace)
        cls.__filterax_custom_init__ = custom_init
        dataclasses.dataclass(cls, init=False, repr=False, eq=False, frozen=True)
        # The frozen dataclass refuses all assignment; ours also allows it while
        # a custom __init__ runs.
        cls.__setattr__ = _module_setattr
        cls.__delattr__ = _module_delattr
        fields = dataclasses.fields(cls)
        if not custom_init:
            cls.__init__ = _make_init(cls, fields)
        for attr_name, value in namespace.items():
            if isinstance(value, types.FunctionType) and not _is_dunder(attr_name):
                setattr(cls, attr_name, _MethodDescriptor(value))
        unresolved = _unresolved_abstract(cls, {f.name for f in fields})
        abstract_error = None
        if unresolved:
            abstract_error = (
                f"Can't instantiate abstract Module {cls.__qualname__}: "
                + ", ".join(f"{u} is not provided" for u in unresolved)
                + "."
            )
        cls.__filterax_plan__ = _ClassPlan(
            abstract_error=abstract_error,
            guards_assignment=custom_init or hasattr(cls, "__post_init__"),
            finish=_make_finish(cls, fields, custom_init),
        )
        cls.__filterax_assign__ = {f.name: f.metadata.get("converter") for f in fields}
        data_fields = [f.name for f in fields if not f.metadata.get("static", False)]
        meta_fields = [f.name for f in fields if f.metadata.get("static", False)]
        register_dataclass_node(cls, data_fields, [*meta_fields, _UNFLATTEN_FIELD])
        return cls

    def __call__(cls, /, *args: Any, **kwargs: Any) -> Any:
        if kwargs.pop(_UNFLATTEN_FIELD, None) is cls:
            self = _object_new(cls)
            # `kwargs` is a fresh dict holding exactly the fields: adopt it.
            _object_setattr(self, "__dict__", kwargs)
            return self
        plan = cls.__filterax_plan__
        if plan.abstract_error is not None:
            raise TypeError(plan.abstract_error)
        self = cls.__new__(cls)
        if plan.guards_assignment:
            key = id(self)
            _INITIALISING.add(key)
            try:
                self.__init__(*args, **kwargs)
            finally:
                _INITIALISING.discard(key)
        else:
            self.__init__(*args, **kwargs)
        if plan.finish is not None:
            plan.finish(self)
        return self


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
    dataclasses.FrozenInstanceError: cannot assign to field 'bias': Linear is immutable after __init__; use filterax.tree_at or dataclasses.replace to make a modified copy.

    ```
    """

    __filterax_unflatten__ = _UNFLATTEN_TOKEN

    def __repr__(self) -> str:
        from ._pretty import tree_pformat

        return tree_pformat(self)

    def __eq__(self, other: object) -> Any:
        from ._tree import tree_equal

        return tree_equal(self, other)

    def __hash__(self) -> int:
        leaves, treedef = jtu.tree_flatten(self)
        return hash((treedef, tuple(leaves)))
