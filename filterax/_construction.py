"""How a Module instance comes to be: generated `__init__`, custom-`__init__`
wrapping, post-init checks, pytree registration and JAX's unflatten.

Construction runs through `type.__call__` (C) straight into the class's
`__init__`; every hook lives in that `__init__`, so a plain Module costs one
Python frame to build, like a dataclass.

JAX unflattens a C++ dataclass node by calling `cls(**fields)`, which must not
run `__init__` logic (converters, checks, jaxtyping's argument checks). Three
cases, decided when the class is registered (see `ClassPlan.register`):

- A *plain* class (generated `__init__`, no converters, no checks): storing the
  fields is all `__init__` does, so the call needs nothing special.
- A custom `__init__` that cannot be called with every field by keyword (the
  usual `Linear(in_size, out_size, key)`): such a call can only be an
  unflatten, and the `__init__` wrapper recognises it by its keywords.
- Anything else is registered with one extra meta field, `__class__`, whose
  value is the class itself: finding it among the keyword arguments is how
  `__init__` recognises an unflatten. It costs a little on every flatten, so it
  is only used where the keywords alone would be ambiguous.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import sys
import threading
import warnings
from collections.abc import Callable
from typing import Any

from ._compat import register_dataclass_node
from ._filters import is_array

__all__ = [
    "ClassPlan",
    "StaticArrayWarning",
    "guard_replaced_init",
    "make_generated_init",
    "module_delattr",
    "module_setattr",
    "unpickle",
    "wrap_custom_init",
]

_UNFLATTEN_FIELD = "__class__"
_REGISTRATION_LOCK = threading.Lock()

# Instances whose custom `__init__` (or `__post_init__`) is running, by `id`:
# only these accept attribute assignment.
_INITIALISING: set[int] = set()

_warned_static_arrays: set[tuple[type, str]] = set()
_object_setattr = object.__setattr__


class StaticArrayWarning(UserWarning):
    """Warned once per field when a JAX or NumPy array is stored in a static field.

    A static field lives in the treedef and is hashed on every transform call, so
    arrays belong in ordinary fields (or in a `NonDifferentiable`).

    **Arguments:** the message, as for `UserWarning`.

    **Returns:** a warning instance (raised through `warnings.warn`).

    ```python
    >>> import warnings
    >>> import numpy as np
    >>> import filterax as fx
    >>> class Table(fx.Module):
    ...     values: np.ndarray = fx.field(static=True)
    >>> with warnings.catch_warnings(record=True) as caught:
    ...     warnings.simplefilter("always")
    ...     _ = Table(np.arange(3))
    >>> caught[0].category.__name__
    'StaticArrayWarning'

    ```
    """


class ClassPlan:
    """What construction needs to know about one Module class, computed once."""

    __slots__ = (
        "abstract_error",
        "data_fields",
        "field_count",
        "field_names",
        "finish",
        "generated_init",
        "meta_fields",
        "plain",
        "registered",
        "uses_marker",
    )

    def __init__(self, cls: type, custom_init: bool, abstract_error: str | None):
        fields = dataclasses.fields(cls)
        self.abstract_error = abstract_error
        self.finish = _make_finish(cls, fields, custom_init)
        self.data_fields = [f.name for f in fields if not f.metadata.get("static")]
        self.meta_fields = [f.name for f in fields if f.metadata.get("static")]
        self.field_names = frozenset(f.name for f in fields)
        self.field_count = len(self.field_names)
        self.plain = not (
            custom_init
            or abstract_error
            or hasattr(cls, "__post_init__")
            or any("__check_init__" in k.__dict__ for k in cls.__mro__)
            or any(not f.init or "converter" in f.metadata for f in fields)
        )
        self.generated_init: Callable[..., None] | None = None
        self.registered = False
        self.uses_marker = True

    def register(self, cls: type) -> None:
        """Registers `cls` as a C++ dataclass pytree node, once.

        Deferred to the first construction so that decorators applied to the
        class after its creation are seen: jaxtyping's `jaxtyped` replaces
        `__init__`, and then even a plain class needs the unflatten marker.
        """
        with _REGISTRATION_LOCK:
            if self.registered:
                return
            init = cls.__init__
            self.uses_marker = not (
                (self.plain and init is self.generated_init)
                or (
                    getattr(init, "__filterax_custom_init__", False)
                    and self.field_names
                    and not _accepts_every_field_by_keyword(init, self.field_names)
                )
            )
            marker = [_UNFLATTEN_FIELD] if self.uses_marker else []
            register_dataclass_node(cls, self.data_fields, [*self.meta_fields, *marker])
            self.registered = True


def _accepts_every_field_by_keyword(
    init: Callable[..., None], field_names: frozenset[str]
) -> bool:
    """Whether a user could call `init` with every field by keyword (then such a
    call is not necessarily JAX's unflatten)."""
    try:
        signature = inspect.signature(init)  # follows `__wrapped__` to the user's
        signature.bind(None, **dict.fromkeys(field_names))
    except TypeError:
        return False
    except ValueError:  # no signature to inspect: assume the worst
        return True
    return True


def unpickle(cls: type, state: dict[str, Any]) -> Any:
    """Rebuilds a pickled Module without `__init__` (registering its class first,
    as a fresh process may not have constructed one yet)."""
    plan = cls.__dict__["__filterax_plan__"]
    if not plan.registered:
        plan.register(cls)
    self = object.__new__(cls)
    object.__setattr__(self, "__dict__", state)
    return self


# --- post-init checks ----------------------------------------------------------------


def _make_finish(
    cls: type, fields: tuple[dataclasses.Field, ...], custom_init: bool
) -> Callable[[Any], None] | None:
    """The checks that run once the outermost `__init__` returns, or `None` when
    a class needs none, so that construction pays nothing for them."""
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
                    stacklevel=4,
                )
        for check in check_inits:
            check(self)

    return finish


# --- generated __init__ ----------------------------------------------------------------


class _FactorySentinel:
    __slots__ = ()

    def __repr__(self) -> str:
        return "<factory>"


_FACTORY = _FactorySentinel()


def make_generated_init(cls: type, plan: ClassPlan) -> Callable[..., None]:
    """A dataclass-style `__init__` that stores into `__dict__` directly, applies
    converters, and runs the post-init hooks; faster than a frozen dataclass's.

    Non-plain classes also accept the unflatten call (`__class__=cls` plus every
    field by keyword) through `**unflatten`, and then only store the fields.
    """
    fields = dataclasses.fields(cls)
    positional, keyword, body = [], [], []
    defaults: dict[str, Any] = {}
    closure: dict[str, Any] = {
        "_fx_factory": _FACTORY,
        "_fx_cls": cls,
        "_fx_plan": plan,
    }
    annotations: dict[str, Any] = {}
    seen_default = False
    for f in fields:
        if not f.init:
            if f.default is not dataclasses.MISSING:
                closure[f"_fx_default_{f.name}"] = f.default
                body.append(f"_fx_d[{f.name!r}] = _fx_default_{f.name}")
            elif f.default_factory is not dataclasses.MISSING:
                closure[f"_fx_factory_{f.name}"] = f.default_factory
                body.append(f"_fx_d[{f.name!r}] = _fx_factory_{f.name}()")
            continue
        annotations[f.name] = f.type
        has_default = (
            f.default is not dataclasses.MISSING
            or f.default_factory is not dataclasses.MISSING
        )
        if f.default_factory is not dataclasses.MISSING:
            closure[f"_fx_factory_{f.name}"] = f.default_factory
            defaults[f.name] = _FACTORY
            body.append(
                f"if {f.name} is _fx_factory: {f.name} = _fx_factory_{f.name}()"
            )
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
        if "converter" in f.metadata:
            closure[f"_fx_convert_{f.name}"] = f.metadata["converter"]
            value = f"_fx_convert_{f.name}({f.name})"
        body.append(f"_fx_d[{f.name!r}] = {value}")
    params = ["self", *positional]
    if keyword:
        params += ["*", *keyword]
    init_names = [*positional, *keyword]
    lines = ["if not _fx_plan.registered: _fx_plan.register(_fx_cls)"]
    if not plan.plain:
        params.append("**_fx_unflatten")
        stores = "; ".join(f"_fx_d[{n!r}] = {n}" for n in init_names)
        lines += [
            "if _fx_unflatten:",
            f"  if _fx_unflatten.pop({_UNFLATTEN_FIELD!r}, None) is not _fx_cls:",
            "    raise TypeError(f'{_fx_cls.__qualname__}.__init__() got an unexpected "
            "keyword argument {next(iter(_fx_unflatten))!r}')",
            "  _fx_d = self.__dict__",
            *([f"  {stores}"] if stores else []),
            "  _fx_d.update(_fx_unflatten)",
            "  return",
        ]
        if plan.abstract_error is not None:
            lines.append(
                "if type(self) is _fx_cls: raise TypeError(_fx_plan.abstract_error)"
            )
    lines += ["_fx_d = self.__dict__", *body]
    if hasattr(cls, "__post_init__"):
        lines += [
            "_fx_initialising.add(id(self))",
            "try: self.__post_init__()",
            "finally: _fx_initialising.discard(id(self))",
        ]
        closure["_fx_initialising"] = _INITIALISING
    if plan.finish is not None:
        # Only the outermost __init__ finishes; a subclass's custom __init__
        # calling this one through super() finishes itself.
        lines.append("if type(self) is _fx_cls: _fx_plan.finish(self)")
    source = (
        f"def _build({', '.join(closure)}):\n"
        f" def __init__({', '.join(params)}):\n"
        + "\n".join(f"  {line}" for line in lines)
        + "\n return __init__\n"
    )
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
    plan.generated_init = init
    return init


# --- custom __init__ ----------------------------------------------------------------------


def _store_unflattened(self: Any, args: tuple, kwargs: dict[str, Any]) -> bool:
    """Stores the fields of an unflatten call; `False` for an ordinary call."""
    plan = type(self).__filterax_plan__
    if plan.uses_marker:
        if kwargs.get(_UNFLATTEN_FIELD) is not type(self):
            return False
        del kwargs[_UNFLATTEN_FIELD]
    elif args or kwargs.keys() != plan.field_names:
        return False
    self.__dict__.update(kwargs)
    return True


def wrap_custom_init(user_init: Callable[..., None]) -> Callable[..., None]:
    """Wraps a user-written `__init__`: allows `self.name = value` while it runs,
    then runs the post-init checks of the instance's class. Nested calls
    (`super().__init__(...)`) just run."""

    @functools.wraps(user_init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        if kwargs:
            # JAX's unflatten, inlined from `_store_unflattened`: this wrapper
            # runs on every unflatten of a Module with a custom __init__.
            plan = type(self).__filterax_plan__
            if not plan.uses_marker:
                if not args and plan.field_count == len(kwargs):
                    if plan.field_names.issuperset(kwargs):
                        _object_setattr(self, "__dict__", kwargs)
                        return
            elif _store_unflattened(self, args, kwargs):
                return
        key = id(self)
        if key in _INITIALISING:
            user_init(self, *args, **kwargs)
            return
        plan = type(self).__filterax_plan__
        if not plan.registered:
            plan.register(type(self))
        if plan.abstract_error is not None:
            raise TypeError(plan.abstract_error)
        _INITIALISING.add(key)
        try:
            user_init(self, *args, **kwargs)
        finally:
            _INITIALISING.discard(key)
        if plan.finish is not None:
            plan.finish(self)

    __init__.__filterax_custom_init__ = True  # type: ignore[attr-defined]
    return __init__


def guard_replaced_init(
    cls: type, new_init: Callable[..., None]
) -> Callable[..., None]:
    """Wraps an `__init__` installed on a Module class after its creation (for
    example by `jaxtyping.jaxtyped`) so that JAX's unflatten still bypasses it."""

    @functools.wraps(new_init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        if kwargs and _store_unflattened(self, args, kwargs):
            return
        new_init(self, *args, **kwargs)

    return __init__


# --- immutability ------------------------------------------------------------------------


def module_setattr(self: Any, name: str, value: Any) -> None:
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
        "immutable after __init__; use filterax.tree_at to make a modified copy."
    )


def module_delattr(self: Any, name: str) -> None:
    raise dataclasses.FrozenInstanceError(
        f"cannot delete field {name!r}: {type(self).__qualname__} is immutable."
    )
