"""`Module`: frozen dataclasses that are JAX pytrees, and `BoundMethod`."""

from __future__ import annotations

import abc
import dataclasses
import functools
import types
import warnings
from collections.abc import Callable
from typing import Any

import jax.tree_util as jtu
from typing_extensions import dataclass_transform

from .._pretty import tree_pformat
from .._tree._utilities import tree_equal
from .._warnings import FilteraxWarning
from ._abstract import abstract_error, resolve_abstract_attributes
from ._attributes import copy_wrapped_attributes
from ._construction import (
    _BOUND_METHOD_TYPES,
    _MODULE_TYPES,
    ClassPlan,
    FieldsSetInNew,
    guard_replaced_init,
    make_generated_init,
    module_delattr,
    module_setattr,
    unpickle,
    wrap_custom_init,
    wrap_user_new,
)
from ._field import field

__all__ = ["BoundMethod", "Module", "StrictConfig", "is_dunder"]


def StrictConfig(  # noqa: N802 - Equinox's name, once a class
    force_abstract: bool = False, **kwargs: object
) -> bool | None:
    """The value of the `strict=` class keyword of Equinox code written for its
    former strict Modules: `class A(fx.Module, strict=fx.StrictConfig(...))`.
    Strictness is not checked (as in Equinox now); `force_abstract=True`
    (also under Equinox's spelling `force_abstact`) makes the class abstract,
    as `is_abstract=True` does. Other options are accepted and ignored.

    **Arguments:**

    - `force_abstract`: whether the class is abstract (cannot be
      instantiated) even though it leaves nothing abstract.
    - `**kwargs`: the other former options, ignored.

    **Returns:** `None` to make the class abstract, else `False`: what
    `strict=` takes.

    ```python
    >>> import filterax as fx
    >>> class Base(fx.Module, strict=fx.StrictConfig(force_abstract=True)):
    ...     x: int
    >>> try:
    ...     Base(1)
    ... except TypeError:
    ...     print("abstract")
    abstract

    ```
    """
    force_abstract = force_abstract or bool(kwargs.get("force_abstact", False))
    return None if force_abstract else False


def _user_new(namespace: dict[str, Any]) -> Callable[..., Any] | None:
    """The `__new__` a class body defines, unless it is filterax's own
    (`BoundMethod`'s, marked by `_own_new`)."""
    new = namespace.get("__new__")
    if isinstance(new, staticmethod):
        new = new.__func__
    if new is None or getattr(new, "__filterax_own_new__", False):
        return None
    return new


def _own_new(new: Callable[..., Any]) -> Callable[..., Any]:
    """Marks a `__new__` of filterax's own, which needs no wrapping (see
    `FieldsSetInNew`)."""
    new.__filterax_own_new__ = True  # type: ignore[attr-defined]
    return new


def is_dunder(name: str) -> bool:
    """Whether `name` is a dunder (`__call__`, `__doc__`...)."""
    return name.startswith("__") and name.endswith("__")


def _nearest_init(cls: type) -> Callable[..., None] | None:
    """The `__init__` that `cls` would inherit: the nearest one in the MRO, or
    `None` when that is `object`'s."""
    for base in cls.__mro__[1:]:
        if "__init__" in base.__dict__:
            init = base.__dict__["__init__"]
            return None if base is object else init
    return None  # pragma: no cover - `object` defines `__init__`


def _is_generated(init: Any) -> bool:
    return getattr(init, "__filterax_generated_init__", False)


def _warn_post_init_ignored(cls: type) -> None:
    warnings.warn(
        f"Class `{cls.__module__}.{cls.__qualname__}` has both an `__init__` "
        "method and a `__post_init__` method (one of them possibly inherited). "
        "The `__post_init__` method will not be run: it only follows a "
        "generated `__init__`. Move its logic into `__init__` (or into "
        "`__check_init__`, which always runs).",
        FilteraxWarning,
        stacklevel=3,
    )


@dataclass_transform(field_specifiers=(dataclasses.field, field))
class _ModuleMeta(abc.ABCMeta):
    """Makes every `Module` subclass a frozen dataclass whose `__init__` carries
    the construction hooks (see `_construction`)."""

    def __new__(
        mcs,
        name: str,
        bases: tuple[type, ...],
        namespace: dict[str, Any],
        *,
        is_abstract: bool = False,
        strict: bool | None = False,
        **kwargs: Any,
    ) -> type:
        # `strict` is accepted for Equinox code, which ignores it too, except
        # for the `None` of `StrictConfig(force_abstract=True)`.
        if strict is None:
            is_abstract = True
        del strict
        for attribute in ("__setattr__", "__delattr__"):
            if attribute in namespace:
                raise TypeError(
                    f"{name} defines {attribute}; Module instances are immutable "
                    "after __init__ and manage attribute assignment themselves."
                )
        user_new = _user_new(namespace)
        if user_new is not None and not any(
            issubclass(base, FieldsSetInNew) for base in bases
        ):
            bases = (*bases, FieldsSetInNew)
        cls = super().__new__(mcs, name, bases, namespace, **kwargs)
        abstract_vars, abstract_class_vars = resolve_abstract_attributes(cls, namespace)

        def set_attribute(attr: str, value: Any) -> None:
            type.__setattr__(cls, attr, value)

        set_attribute("__abstractvars__", abstract_vars)
        set_attribute("__abstractclassvars__", abstract_class_vars)
        dataclasses.dataclass(init=False, repr=False, eq=False, frozen=True)(cls)
        # The frozen dataclass refuses all assignment; ours also allows it while
        # `__init__` runs.
        set_attribute("__setattr__", module_setattr)
        set_attribute("__delattr__", module_delattr)
        if user_new is not None:
            set_attribute("__new__", staticmethod(wrap_user_new(user_new)))
        for attr_name, value in _methods_to_bind(cls, namespace):
            set_attribute(attr_name, method_descriptor(value))
        inherited = None if "__init__" in namespace else _nearest_init(cls)
        custom_init = "__init__" in namespace or (
            inherited is not None and not _is_generated(inherited)
        )
        if custom_init and hasattr(cls, "__post_init__"):
            _warn_post_init_ignored(cls)
        plan = ClassPlan(
            cls,
            custom_init,
            abstract_error(cls, abstract_vars, abstract_class_vars, is_abstract),
        )
        set_attribute("__filterax_plan__", plan)
        user_init = namespace.get("__init__", inherited)
        if user_init is not None and custom_init:
            # Wrapped per class, as the wrapper knows the class's fields. An
            # already wrapped one is a base's, inherited or restated with
            # `__init__ = Base.__init__` so that type checkers see it.
            user_init = getattr(user_init, "__filterax_user_init__", user_init)
            set_attribute("__init__", wrap_custom_init(user_init, cls, plan))
        else:
            init = make_generated_init(cls, plan)
            init.__filterax_generated_init__ = True  # type: ignore[attr-defined]
            set_attribute("__init__", init)
        return cls

    def __setattr__(cls, name: str, value: Any) -> None:
        if name == "__init__":
            # A decorator replacing __init__ (jaxtyping's `jaxtyped`) must not
            # see JAX's unflatten calls.
            value = guard_replaced_init(cls, value)
        elif _binds_like_a_method(name, value):
            value = method_descriptor(value)  # a method attached to the class later
        else:
            value = rebound_method(cls.__dict__.get(name), value)
        super().__setattr__(name, value)


def rebound_method(current: Any, value: Any) -> Any:
    """`value`, about to replace class attribute `current`; but when `current`
    is a `MethodDescriptor` and `value` a plain `staticmethod` of a wrapper of
    its function (what beartype's class decorator sets back), a
    `MethodDescriptor` of that wrapper, so that the method still binds."""
    if (
        type(value) is staticmethod
        and isinstance(current, MethodDescriptor)
        and getattr(value.__func__, "__wrapped__", None) is current.__func__
    ):
        return method_descriptor(value.__func__)
    return value


def _binds_like_a_method(name: str, value: Any) -> bool:
    """Whether `value`, found as class attribute `name`, gives a method bound
    to the instance when read from one: a function, or a callable such as a
    `jax.jit`-decorated function. Dunder methods are left as they are, and so
    are callables that are pytrees (`filter_jit` in a class body), which bind
    into pytrees themselves."""
    if is_dunder(name):
        return False
    if isinstance(value, types.FunctionType):
        return True
    kind = type(value)
    return (
        callable(value)
        and hasattr(kind, "__get__")
        and not hasattr(kind, "__set__")  # a data descriptor manages itself
        and not isinstance(
            value, (staticmethod, classmethod, _CallableMethodDescriptor)
        )
        and jtu.treedef_is_leaf(
            jtu.tree_structure(value, is_leaf=lambda x: x is not value)
        )
    )


def _methods_to_bind(cls: type, namespace: dict[str, Any]) -> list[tuple[str, Any]]:
    """The methods of a new Module class to wrap so that instances bind them
    into a `BoundMethod`: those of its class body, and those it inherits from
    classes that are not Modules (mixins), which no Module class wrapped."""
    found = list(namespace.items())
    seen = set(namespace)
    for base in cls.__mro__[1:]:
        if base is object or isinstance(base, _ModuleMeta):
            seen.update(base.__dict__)
            continue
        for name, value in base.__dict__.items():
            if name not in seen:
                found.append((name, value))
        seen.update(base.__dict__)
    return [(name, value) for name, value in found if _binds_like_a_method(name, value)]


class Module(metaclass=_ModuleMeta):
    """Base class for models: frozen dataclasses that are JAX pytrees.

    Subclasses are dataclasses automatically. Fields are pytree children in
    declaration order, with `GetAttrKey(name)` key paths; `field(static=True)`
    keeps a value in the treedef instead. A custom `__init__` may assign
    `self.name = value` (and so may the class's own `__new__`, on the instance
    `super().__new__(cls)` gives, as in Equinox); afterwards the instance is
    immutable. Once `__init__`
    returns, converters run and then `__check_init__`, on every class of the
    MRO, for validation. Plain methods accessed on an instance are pytrees too
    (see [`BoundMethod`][filterax.BoundMethod]). `==` is
    [`tree_equal`][filterax.tree_equal]; `hash` works when every leaf is
    hashable; `repr` is [`tree_pformat`][filterax.tree_pformat].

    **Arguments:** a subclass's constructor takes its fields, in declaration
    order (positionally or by keyword), unless the subclass writes `__init__`.

    **Returns:** an immutable instance.

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
        return tree_pformat(self)

    def __eq__(self, other: object) -> Any:
        return tree_equal(self, other)

    def __hash__(self) -> int:
        leaves, treedef = jtu.tree_flatten(self)
        return hash((treedef, tuple(leaves)))

    def __reduce__(self) -> tuple[Any, ...]:
        return unpickle, (type(self), dict(self.__dict__))

    def __treescope_repr__(self, path: str | None, subtree_renderer: Any) -> Any:
        """Treescope's display hook: fields by name, arrays summarised."""
        # Imported here: treescope is an optional extra, and `import filterax`
        # must not import it; this runs only when treescope displays a Module.
        from .. import _treescope

        return _treescope.render_module(self, path, subtree_renderer)


class BoundMethod(Module, functools.partial):
    """A method bound to a Module instance, itself a Module.

    Its only child is the instance (`__self__`), so `jax.tree.leaves(model.method)`
    sees the model's arrays and `filter_jit(model.method)` traces them; the
    function (`__func__`) is static. Built for you when a plain method is read
    from a Module instance.

    **Arguments:**

    - `__func__`: the function defined in the class body.
    - `__self__`: the Module instance it is bound to.

    **Returns:** a callable Module; calling it calls `__func__(__self__, ...)`.

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

    __func__: Callable[..., Any] = dataclasses.field(metadata={"static": True})
    __self__: Any

    @_own_new
    def __new__(cls, *args: Any, **kwargs: Any) -> BoundMethod:
        # A `functools.partial` of the function and the instance as well, so
        # that calling a bound method runs in C and adds no Python frame to
        # the function's own. Its fields come by position or by keyword (as
        # JAX's unflatten passes them).
        values = dict(zip(("__func__", "__self__"), args))
        for name in ("__func__", "__self__"):
            if name not in values and name not in kwargs:
                raise TypeError(f"BoundMethod() missing required argument: {name!r}")
        func = values.get("__func__", kwargs.get("__func__"))
        if not callable(func):
            raise TypeError(f"BoundMethod: `__func__` must be callable, got {func!r}.")
        return _new_partial(cls, func, values.get("__self__", kwargs.get("__self__")))

    @property
    def __wrapped__(self) -> Callable[..., Any]:
        return types.MethodType(self.__func__, self.__self__)

    def __reduce__(self) -> tuple[Any, ...]:
        # Bound again when unpickled: the function's docstring and annotations
        # are not pickled with it (annotations may be unpicklable types).
        return bind_method, (self.__func__, self.__self__)

    def __getattr__(self, name: str) -> Any:
        # The fields of an instance made by `bind_wrapper`, which sets only
        # the partial's function and arguments.
        if name == "__self__":
            return self.args[0]
        if name == "__func__":
            return self.func
        # `__name__`, `__qualname__` and `__doc__`-like metadata of the function.
        if name in ("__name__", "__qualname__", "__annotations__"):
            return getattr(self.__func__, name)
        if name == "lower" and hasattr(self.__func__, "lower"):
            # A transform with ahead-of-time lowering (`filter_jit`,
            # `filter_pmap`) used as a decorator in the class body.
            return functools.partial(_lower_bound, self.__func__, self.__self__)
        raise AttributeError(
            f"{type(self).__name__!r} object has no attribute {name!r}"
        )


def _lower_bound(
    func: Callable[..., Any], instance: Any, /, *args: Any, **kwargs: Any
) -> Any:
    """`bound.lower(*args, **kwargs)`: the transform's `lower` with the
    instance first; what it gives compiles to a function called without the
    instance, as the method is."""
    return func.lower(instance, *args, **kwargs).bound_to(instance)  # type: ignore[attr-defined]


_MODULE_TYPES.append(Module)
_BOUND_METHOD_TYPES.append(BoundMethod)
# Registered now rather than at its first construction: `bind_wrapper` makes
# instances without `__init__`.
_bound_method_plan: ClassPlan = BoundMethod.__dict__["__filterax_plan__"]
if not _bound_method_plan.registered:
    _bound_method_plan.register(BoundMethod)
_new_partial = functools.partial.__new__


def bind_wrapper(
    wrapper: Callable[..., Any], instance: Any, owner: type | None = None
) -> Any:
    """The `__get__` of the transforms' wrappers (`FunctionWrapper`): read from
    an instance, a wrapper in a class body becomes `BoundMethod(wrapper,
    instance)`, built without construction's checks (neither the wrapper nor
    the instance needs them) since a decorated `__call__` is bound on every
    `model(x)`; read from the class, the wrapper itself."""
    if instance is None:
        return wrapper
    # Only the partial's own slots are filled: `__getattr__` reads the fields
    # from them.
    return _new_partial(BoundMethod, wrapper, instance)


def bind_method(func: Callable[..., Any], instance: Any) -> BoundMethod:
    """`BoundMethod(func, instance)`, showing the function's docstring and
    annotations as a bound method does (for `help`, `typing.get_type_hints`,
    beartype). They are instance attributes: `BoundMethod`'s own, as a class,
    document the class and declare its fields."""
    bound = BoundMethod(func, instance)
    values = vars(bound)
    values["__doc__"] = getattr(func, "__doc__", None)
    values["__annotations__"] = getattr(func, "__annotations__", {})
    return bound


class MethodDescriptor(staticmethod):
    """Class-level stand-in for a plain method: instance access binds it into a
    `BoundMethod`; class access gives back the function itself.

    A `staticmethod` subclass, so that decorators that walk a class's
    `__dict__` wrapping its methods (beartype's class decorator,
    `beartype.claw`) reach the function: they set back a plain `staticmethod`
    of the wrapped function, which the metaclass turns into a
    `MethodDescriptor` again (see `rebound_method`). `staticmethod` also
    copies the function's name, docstring and annotations onto it, for
    `doctest`, `inspect` and documentation tools.
    """

    def __get__(self, instance: Any, owner: type | None = None) -> Any:
        if instance is None:
            return self.__func__
        return bind_method(self.__func__, instance)


class _CallableMethodDescriptor:
    """The stand-in for a callable that is not a plain function but binds like
    one (`jax.jit` of a method, say): its own binding decides, and a method
    bound to the instance becomes a `BoundMethod`. Not a `staticmethod`, so
    that beartype's class decorator leaves it alone, as it leaves the callable
    itself in a plain class."""

    def __init__(self, func: Callable[..., Any]):
        self.__func__ = func
        copy_wrapped_attributes(self.__dict__, func, annotations=False)
        self.__wrapped__ = func

    @property
    def __isabstractmethod__(self) -> bool:
        return getattr(self.__func__, "__isabstractmethod__", False)

    def __get__(self, instance: Any, owner: type | None = None) -> Any:
        bound = self.__func__.__get__(instance, owner)  # type: ignore[attr-defined]
        if (
            instance is not None
            and type(bound) is types.MethodType
            and bound.__self__ is instance
        ):
            return bind_method(bound.__func__, instance)
        return bound


def method_descriptor(
    value: Callable[..., Any],
) -> MethodDescriptor | _CallableMethodDescriptor:
    """The class-level stand-in for a method (see `_binds_like_a_method`)."""
    if isinstance(value, types.FunctionType):
        return MethodDescriptor(value)
    return _CallableMethodDescriptor(value)
