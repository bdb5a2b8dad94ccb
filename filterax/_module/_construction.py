"""How a Module instance comes to be: generated `__init__`, custom-`__init__`
wrapping, the checks that follow `__init__`, pytree registration and JAX's
unflatten.

Construction runs through `type.__call__` (C) straight into the class's
`__init__`; every hook lives in that `__init__`, so a plain Module costs one
Python frame to build, like a dataclass.

After the outermost `__init__` (and, for a generated one, `__post_init__`)
returns, in this order (`ClassPlan.finish`): fields a custom `__init__` left
unset get their defaults (no default: `TypeError`), converters run, static
values are checked (hashable; JAX arrays warn), JAX-transformed Modules
assigned as attributes warn, and every `__check_init__` of the MRO runs.

JAX unflattens a C++ dataclass node by calling `cls(**fields)`, which must not
run those steps (converters, checks, jaxtyping's argument checks). Three cases,
decided when the class is registered (see `ClassPlan.register`):

- A *plain* class (generated `__init__`, no converters, no checks): storing the
  fields (and re-checking static values, which is idempotent) is all `__init__`
  does, so the call needs nothing special.
- A custom `__init__` that cannot be called with every field by keyword (the
  usual `Linear(in_size, out_size, key)`): such a call can only be an
  unflatten, and the `__init__` wrapper recognises it by its keywords.
- Anything else is registered with one extra meta field, `__class__`, whose
  value is the class itself: finding it among the keyword arguments is how
  `__init__` recognises an unflatten.

A class with its own `__new__` (see `FieldsSetInNew`) is never plain: the
unflatten call reaches its `__new__` first, and the wrapper of that `__new__`
recognises it as the `__init__` does, and skips the user's code.

Both generated and wrapping `__init__`s take the fields (and `__class__`) as
named parameters rather than through `**kwargs`: binding keywords to named
parameters builds no dictionary, which keeps an unflatten within the cost of
a registered dataclass's.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import re
import sys
import threading
import types
import warnings
from collections.abc import Callable
from typing import Any

import jax

from .._compat import register_dataclass_node
from .._transformed import TRANSFORM_TYPES, wrapped_by_transform
from .._tree._filters import is_array, is_inexact_array_like
from .._warnings import GENERATED_FILENAME, FilteraxWarning, warn_at_caller
from ._field import StaticArrayWarning
from ._frozen import FROZEN_STATIC_TYPES, freeze_static

__all__ = [
    "ClassPlan",
    "FieldsSetInNew",
    "effective_fields",
    "guard_replaced_init",
    "make_generated_init",
    "module_delattr",
    "module_setattr",
    "unpickle",
    "wrap_custom_init",
    "wrap_user_new",
]

_UNFLATTEN_FIELD = "__class__"


class _Unset:
    """Default of the parameters that only JAX's unflatten call passes."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "<unset>"


_UNSET = _Unset()

# The builtins that generated `__init__`s call, under names no field can shadow
# (a field may well be called `type` or `id`: it is then a parameter).
_BUILTINS = {"_fx_type": type, "_fx_id": id, "_fx_TypeError": TypeError}
_REGISTRATION_LOCK = threading.Lock()

# Instances whose `__init__` (or `__post_init__`) is running, by `id`: only these
# accept attribute assignment.
_INITIALISING: set[int] = set()

# Instances made by a user-written `__new__` (see `FieldsSetInNew`), by `id`,
# from their creation until their `__init__` starts: they accept assignment to
# their fields too.
_MADE_IN_NEW: set[int] = set()

_warned_static_arrays: set[tuple[type, str]] = set()
_MISSING = dataclasses.MISSING


def effective_fields(cls: type) -> tuple[dataclasses.Field, ...]:
    """The dataclass fields of `cls` that are instance state.

    A field that a subclass overrides with a plain class attribute or a
    property (without re-declaring it as a field) is resolved by the class, as
    an abstract attribute would be: it is not instance state, not a pytree
    child, and need not be set by `__init__`.
    """
    kept = []
    for f in dataclasses.fields(cls):
        for klass in cls.__mro__:
            if f.name in klass.__dict__.get("__annotations__", {}):
                kept.append(f)  # the nearest mention declares the field
                break
            if f.name in klass.__dict__:
                break  # overridden by a class attribute or property
        else:  # pragma: no cover - a field is always declared somewhere
            kept.append(f)
    return tuple(kept)


class ClassPlan:
    """What construction needs to know about one Module class, computed once."""

    __slots__ = (
        "abstract_error",
        "check_inits",
        "converters",
        "data_fields",
        "defaults",
        "field_count",
        "field_names",
        "field_order",
        "fields_in_new",
        "generated_init",
        "meta_fields",
        "not_init_fields",
        "plain",
        "registered",
        "uses_marker",
    )

    def __init__(self, cls: type, custom_init: bool, abstract_error: str | None):
        fields = effective_fields(cls)
        self.abstract_error = abstract_error
        self.data_fields = [f.name for f in fields if not f.metadata.get("static")]
        self.meta_fields = [f.name for f in fields if f.metadata.get("static")]
        self.field_names = frozenset(f.name for f in fields)
        self.field_order = tuple(f.name for f in fields)
        self.field_count = len(self.field_names)
        # `(name, declared default)` of each `init=False` field.
        self.not_init_fields = tuple((f.name, f.default) for f in fields if not f.init)
        self.converters = tuple(
            (f.name, f.metadata["converter"])
            for f in fields
            if "converter" in f.metadata
        )
        self.check_inits = tuple(
            k.__dict__["__check_init__"]
            for k in cls.__mro__
            if "__check_init__" in k.__dict__
        )
        # For fields a custom `__init__` leaves unset: how to make the value.
        self.defaults = tuple(
            (f.name, _default_maker(f))
            for f in fields
            if f.default is not _MISSING or f.default_factory is not _MISSING
        )
        self.fields_in_new = issubclass(cls, FieldsSetInNew)
        self.plain = not (
            custom_init
            or self.fields_in_new
            or abstract_error
            or hasattr(cls, "__post_init__")
            or self.check_inits
            or self.converters
            or any(not f.init for f in fields)
            # JAX's unflatten passes no InitVar: the generated `__init__` must
            # recognise it to accept the call.
            or any(
                _is_init_var(f.type)
                for f in cls.__dataclass_fields__.values()  # type: ignore[attr-defined]
            )
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

    def finish(self, instance: Any) -> None:
        """Everything that follows the outermost `__init__` (see the module
        docstring), for one new instance."""
        cls = type(instance)
        values = instance.__dict__
        if len(values) < self.field_count:
            _fill_unset_fields(cls, self, values)
        for name, converter in self.converters:
            try:
                values[name] = converter(values[name])
            except Exception as error:
                raise type(error)(
                    f"{cls.__qualname__}.{name}: the field's converter "
                    f"{getattr(converter, '__name__', converter)!r} raised: {error}"
                ) from error
        for name in self.meta_fields:
            value = values[name]
            if type(value) not in _ALWAYS_HASHABLE:
                values[name] = check_static_value(cls, name, value)
        if not TRANSFORM_TYPES.isdisjoint(map(type, values.values())):
            warn_if_transformed(instance)
        for name, default in self.not_init_fields:
            value = values[name]
            if (
                value is not default  # a constant declared as the default
                and (cls, name) not in _warned_not_init
                and _holds_inexact(value)
            ):
                _warned_not_init.add((cls, name))
                warn_at_caller(
                    _NOT_INIT_ARRAY.format(cls.__qualname__, name), FilteraxWarning, 2
                )
        for check in self.check_inits:
            check(instance)


def _holds_inexact(value: Any) -> bool:
    """Whether a pytree has a floating-point leaf: an array, or a Python float
    or complex (a leaf `filter_grad` differentiates once it is an array)."""
    return any(map(is_inexact_array_like, jax.tree_util.tree_leaves(value)))


# `(class, field)` pairs warned about by `_NOT_INIT_ARRAY` (once each).
_warned_not_init: set[tuple[type, str]] = set()
_NOT_INIT_ARRAY = (
    "{0}.{1} is a `field(init=False)` holding floating-point values, computed "
    "in `__init__`/`__post_init__` from other fields. They are leaves of their "
    "own: `filter_grad` differentiates with respect to them, not through the "
    "fields they were computed from, which get no gradient from their uses. "
    "Compute them in a method or property instead, or mark them "
    "`NonDifferentiable` if they are constants. (Equinox warns about this too.)"
)


def _default_maker(f: dataclasses.Field) -> Callable[[], Any]:
    if f.default_factory is not _MISSING:
        return f.default_factory
    default = f.default
    return lambda: default


def _fill_unset_fields(cls: type, plan: ClassPlan, values: dict[str, Any]) -> None:
    for name, make_default in plan.defaults:
        if name not in values:
            values[name] = make_default()
    missing = sorted(name for name in plan.field_names if name not in values)
    if missing:
        names = ", ".join(repr(name) for name in missing)
        subject = f"Field {names} was" if len(missing) == 1 else f"Fields {names} were"
        raise TypeError(
            f"{subject} not initialized. {cls.__qualname__}.__init__ must assign "
            f"every field without a default (`self.{missing[0]} = ...`) before it "
            "returns."
        )


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


# --- checks on field values ----------------------------------------------------------


def check_static_value(cls: type, name: str, value: Any) -> Any:
    """The value to store in static field `cls.name`, given `value`.

    A hashable value is stored as it is. An unhashable one is accepted, as in
    Equinox (JAX compares static values with `==`), but frozen (see
    `_frozen`): lists, dicts, sets and NumPy arrays become the read-only
    `FrozenStaticList`, `FrozenStaticDict`, `FrozenStaticSet` (still a `list`,
    `dict`, `set`) and `FrozenStaticArray` (a read-only copy, still an
    `np.ndarray`), inside tuples, lists and dicts too. A static value is part of the
    structure of every program compiled for the Module, and a change made in
    place after a call would not be seen by a compilation keyed on that same
    object: the change raises instead, naming the field. A JAX or NumPy array
    warns, once per class field (the contract; Equinox warns about JAX
    arrays).
    """
    try:
        hash(value)
        return value
    except TypeError:
        pass
    if any(map(is_array, jax.tree_util.tree_leaves(value))):
        if (cls, name) not in _warned_static_arrays:
            _warned_static_arrays.add((cls, name))
            warnings.warn(
                f"A JAX array is being set as static! ({cls.__qualname__}.{name}) "
                "Static fields are compile-time constants compared on every "
                "transform call, and arrays are not hashable; store arrays in "
                "ordinary fields, or wrap them in filterax.NonDifferentiable to "
                "exclude them from gradients.",
                StaticArrayWarning,
                stacklevel=4,
            )
    return freeze_static(value, f"{cls.__qualname__}.{name}")


# Types of static values that need no check: always hashable, or already
# frozen. Checked by type alone, so JAX's unflatten pays nothing for them.
_ALWAYS_HASHABLE = frozenset(
    {
        int,
        float,
        complex,
        bool,
        str,
        bytes,
        type(None),
        types.FunctionType,
        types.BuiltinFunctionType,
        type,
        frozenset,
        range,
        *TRANSFORM_TYPES,  # hashed by identity (`jax.nn.relu` is a custom_jvp)
        *FROZEN_STATIC_TYPES,
    }
)
_MODULE_TYPES: list[type] = []  # filled by `_module.py` with `Module`

# Values of a `TRANSFORM_TYPES` type found to wrap no Module (all of these
# types hash and compare by identity): a Module built again with the same
# function, and JAX's unflatten of one, find it here instead of looking
# through it again. Bounded, as it holds its values.
_INNOCENT: set[Any] = set()
_INNOCENT_LIMIT = 4096


def warn_if_transformed(instance: Any) -> None:
    """Warns about fields holding a JAX transform (`jax.jit`, `jax.grad`,
    `jax.vmap`, `jax.custom_vjp`...) applied directly to a Module: JAX treats
    the Module as a constant of the transformed function, so its arrays are
    neither traced nor seen by `filter_grad` or an optimiser."""
    module_type = _MODULE_TYPES[0]
    for name, value in instance.__dict__.items():
        if type(value) not in TRANSFORM_TYPES or value in _INNOCENT:
            continue
        inner = wrapped_by_transform(value)
        if not isinstance(inner, module_type):
            if len(_INNOCENT) >= _INNOCENT_LIMIT:
                _INNOCENT.clear()
            _INNOCENT.add(value)
        else:
            warnings.warn(
                "Possibly assigning a JAX-transformed callable as an attribute on "
                f"{type(instance).__qualname__}.{name}: it wraps a "
                f"{type(inner).__qualname__}, whose arrays are then hidden from "
                "every transform (never updated by an optimiser). Use the filtered "
                "transforms instead (`filterax.filter_jit(module)`, "
                "`filterax.filter_grad`...), which keep the Module a pytree.",
                FilteraxWarning,
                stacklevel=3,
            )


# --- generated __init__ ----------------------------------------------------------------


class _FactorySentinel:
    __slots__ = ()

    def __repr__(self) -> str:
        return "<factory>"


_FACTORY = _FactorySentinel()


def _converter_annotation(converter: Callable[[Any], Any]) -> Any:
    """The `__init__` annotation of a converted field: the type the converter
    accepts (its first parameter's annotation), or `Any`."""
    try:
        parameters = list(inspect.signature(converter).parameters.values())
    except (TypeError, ValueError):
        return Any
    if not parameters or parameters[0].annotation is inspect.Parameter.empty:
        return Any
    return parameters[0].annotation


def _is_init_var(annotation: Any) -> bool:
    """Whether a dataclass annotation is an `InitVar` (passed to `__init__` and
    `__post_init__`, never stored)."""
    if isinstance(annotation, str):
        return re.match(r"^\s*(?:dataclasses\.)?InitVar\b", annotation) is not None
    return isinstance(annotation, dataclasses.InitVar) or (
        annotation is dataclasses.InitVar
    )


def _inherited_init_doc(cls: type) -> str | None:
    for base in cls.__mro__[1:]:
        doc = getattr(base.__dict__.get("__init__"), "__doc__", None)
        if doc:
            return doc
    return None


def make_generated_init(cls: type, plan: ClassPlan) -> Callable[..., None]:
    """A dataclass-style `__init__` that stores into `__dict__` directly and runs
    the post-init steps; faster than a frozen dataclass's.

    Non-plain classes also accept the unflatten call (`__class__=cls` plus every
    field by keyword), and then only store the fields (see `_unflatten_entry`).
    """
    names = plan.field_names
    entries = [
        f
        for f in cls.__dataclass_fields__.values()  # type: ignore[attr-defined]
        if f.name in names or _is_init_var(f.type)
    ]
    init_vars: list[str] = []
    positional, keyword, body = [], [], []
    defaults: dict[str, Any] = {}
    closure: dict[str, Any] = {
        "_fx_factory": _FACTORY,
        "_fx_cls": cls,
        "_fx_plan": plan,
        "_fx_suspect": TRANSFORM_TYPES,
        "_fx_warn_transformed": warn_if_transformed,
        "_fx_check_static": check_static_value,
        "_fx_hashable": _ALWAYS_HASHABLE,
        "_fx_innocent": _INNOCENT,
        **_BUILTINS,
    }
    annotations: dict[str, Any] = {}
    seen_default = False
    for f in entries:
        if not f.init:
            if f.default is not _MISSING:
                closure[f"_fx_default_{f.name}"] = f.default
                body.append(f"_fx_d[{f.name!r}] = _fx_default_{f.name}")
            elif f.default_factory is not _MISSING:
                closure[f"_fx_factory_{f.name}"] = f.default_factory
                body.append(f"_fx_d[{f.name!r}] = _fx_factory_{f.name}()")
            continue
        converter = f.metadata.get("converter")
        annotations[f.name] = (
            f.type if converter is None else (_converter_annotation(converter))
        )
        has_default = f.default is not _MISSING or f.default_factory is not _MISSING
        if f.default_factory is not _MISSING:
            closure[f"_fx_factory_{f.name}"] = f.default_factory
            defaults[f.name] = _FACTORY
            body.append(
                f"if {f.name} is _fx_factory: {f.name} = _fx_factory_{f.name}()"
            )
        elif f.default is not _MISSING:
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
        if _is_init_var(f.type):
            init_vars.append(f.name)
        else:
            body.append(f"_fx_d[{f.name!r}] = {f.name}")
    if plan.plain:
        # A plain class checks static values and JAX-transformed Modules in the
        # generated `__init__` itself, with no finishing step. JAX's unflatten
        # calls this `__init__` too, with values that were checked when the
        # Module was built: written out per field, the checks then cost a type
        # lookup per field (static values of a type needing no check, frozen
        # ones included) and a set lookup per function (`_INNOCENT`),
        # and never call out. (A plain class has no InitVar and no
        # `init=False` field: every field is a parameter, read here as a
        # local.)
        body += [
            f"if _fx_type({name}) not in _fx_hashable: "
            f"_fx_d[{name!r}] = _fx_check_static(_fx_cls, {name!r}, {name})"
            for name in plan.meta_fields
        ]
        if plan.field_order:
            suspect = " or ".join(
                f"(_fx_type({name}) in _fx_suspect and {name} not in _fx_innocent)"
                for name in plan.field_order
            )
            body.append(f"if {suspect}: _fx_warn_transformed(_fx_self)")
    params = ["_fx_self", *positional]
    if keyword:
        params += ["*", *keyword]
    lines = ["if not _fx_plan.registered: _fx_plan.register(_fx_cls)"]
    if plan.fields_in_new:
        closure["_fx_made_in_new"] = _MADE_IN_NEW
        lines.append(_RELEASE_NEW_MARK)
    unflatten_only: frozenset[str] = frozenset()
    if not plan.plain:
        closure["_fx_unset"] = _UNSET
        unflatten_only = _unflatten_entry(
            plan, entries, params, keyword, lines, defaults
        )
        if plan.abstract_error is not None:
            lines.append(
                "if _fx_type(_fx_self) is _fx_cls: raise _fx_TypeError(_fx_plan.abstract_error)"
            )
    lines += ["_fx_d = _fx_self.__dict__", *body]
    if hasattr(cls, "__post_init__"):
        # Called through `super().__init__` from a subclass's custom
        # `__init__`, the instance is already marked as initialising: the mark
        # is the outer `__init__`'s to take off.
        post_init = f"_fx_self.__post_init__({', '.join(init_vars)})"
        lines += [
            "_fx_key = _fx_id(_fx_self)",
            f"if _fx_key in _fx_initialising: {post_init}",
            "else:",
            "  _fx_initialising.add(_fx_key)",
            f"  try: {post_init}",
            "  finally: _fx_initialising.discard(_fx_key)",
        ]
        closure["_fx_initialising"] = _INITIALISING
    if not plan.plain:
        # Only the outermost __init__ finishes; a subclass's custom __init__
        # calling this one through super() finishes itself.
        lines.append("if _fx_type(_fx_self) is _fx_cls: _fx_plan.finish(_fx_self)")
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
    exec(compile(source, GENERATED_FILENAME, "exec"), module_globals, namespace)  # noqa: S102
    init = namespace["_build"](**closure)
    init.__defaults__ = tuple(defaults[n] for n in positional if n in defaults) or None
    init.__kwdefaults__ = {
        n: value for n, value in defaults.items() if n not in positional
    } or None
    init.__annotations__ = {**annotations, "return": None}
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    init.__module__ = cls.__module__
    init.__doc__ = _inherited_init_doc(cls)
    init.__signature__ = _public_signature(init, unflatten_only)  # type: ignore[attr-defined]
    plan.generated_init = init
    return init


def _unflatten_entry(
    plan: ClassPlan,
    entries: list[dataclasses.Field],
    params: list[str],
    keyword: list[str],
    lines: list[str],
    defaults: dict[str, Any],
) -> frozenset[str]:
    """Makes a non-plain generated `__init__` accept JAX's unflatten call, which
    passes every field and `__class__=cls` by keyword, and only store the
    fields then. Extends `params`, `lines` and `defaults` in place; returns the
    parameters that only the unflatten call passes."""
    # Keyword-only parameters for what the unflatten call passes beyond the
    # public signature: the marker, and the fields `__init__` does not take.
    not_init = [f.name for f in entries if not f.init]
    if not keyword:
        params.append("*")
    params += [_UNFLATTEN_FIELD, *not_init]
    for name in [_UNFLATTEN_FIELD, *not_init]:
        defaults[name] = _UNSET
    stores = "; ".join(f"_fx_d[{n!r}] = {n}" for n in plan.field_order)
    lines += [
        f"if {_UNFLATTEN_FIELD} is _fx_cls:",
        f"  _fx_d = _fx_self.__dict__{'; ' if stores else ''}{stores}",
        "  return",
    ]
    for name in [_UNFLATTEN_FIELD, *not_init]:
        lines.append(
            f"if {name} is not _fx_unset: raise _fx_TypeError("
            f'f"{{_fx_cls.__qualname__}}.__init__() got an unexpected keyword '
            f'argument {name!r}")'
        )
    # The unflatten call passes no InitVar: required parameters get a hidden
    # default, and their absence in an ordinary call is reported here.
    if any(_is_init_var(f.type) for f in entries):
        for f in entries:
            if f.init and f.name not in defaults:
                defaults[f.name] = _UNSET
                lines.append(
                    f"if {f.name} is _fx_unset: raise _fx_TypeError("
                    f'f"{{_fx_cls.__qualname__}}.__init__() missing required '
                    f'argument: {f.name!r}")'
                )
    return frozenset([_UNFLATTEN_FIELD, *not_init])


def _public_signature(
    init: Callable[..., None], removed: frozenset[str]
) -> inspect.Signature:
    """The signature of a generated `__init__` as users call it: its first
    parameter named `self` (unless a field is), without the parameters only
    JAX's unflatten passes (`removed`), and with the hidden defaults of
    required parameters taken off."""
    signature = inspect.signature(init)
    first, *rest = signature.parameters.values()
    if "self" not in signature.parameters:
        first = first.replace(name="self")
    parameters = [first]
    for parameter in rest:
        if parameter.default is _UNSET:
            if parameter.name in removed:
                continue
            parameter = parameter.replace(default=inspect.Parameter.empty)
        parameters.append(parameter)
    return signature.replace(parameters=parameters)


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


def wrap_custom_init(
    user_init: Callable[..., None], cls: type, plan: ClassPlan
) -> Callable[..., None]:
    """Wraps a user-written `__init__` (or one inherited) for `cls`: allows
    `self.name = value` while it runs, then runs the post-init steps of the
    instance's class. Nested calls (`super().__init__(...)`) just run.

    The wrapper is generated per class, with the fields and `__class__` as
    keyword-only parameters: JAX's unflatten call (every field by keyword,
    plus `__class__=cls` for a class registered with the marker) binds to
    them without building a dictionary, and only stores the fields. In any
    other call, the keywords they caught go back to the user's `__init__`.
    """
    names = plan.field_order
    caught = [*names, _UNFLATTEN_FIELD]
    every_field = "".join(f"{name} is not _fx_unset and " for name in names)
    stores = "".join(f"; _fx_d[{name!r}] = {name}" for name in names)
    lines = [
        f"if {every_field}not _fx_args and not _fx_kwargs and "
        "_fx_type(_fx_self) is _fx_cls and (",
        f"  {_UNFLATTEN_FIELD} is _fx_cls if _fx_plan.uses_marker "
        f"else {_UNFLATTEN_FIELD} is _fx_unset",
        "):",
        f"  _fx_d = _fx_self.__dict__{stores}",
        "  return",
        *([_RELEASE_NEW_MARK] if plan.fields_in_new else []),
        *(
            f"if {name} is not _fx_unset: _fx_kwargs[{name!r}] = {name}"
            for name in caught
        ),
        "_fx_key = _fx_id(_fx_self)",
        "if _fx_key in _fx_initialising:",
        "  _fx_user_init(_fx_self, *_fx_args, **_fx_kwargs)",
        "  return",
        "_fx_own_plan = _fx_type(_fx_self).__filterax_plan__",
        "if not _fx_own_plan.registered: _fx_own_plan.register(_fx_type(_fx_self))",
        "if _fx_own_plan.abstract_error is not None:",
        "  raise _fx_TypeError(_fx_own_plan.abstract_error)",
        "_fx_initialising.add(_fx_key)",
        "try: _fx_user_init(_fx_self, *_fx_args, **_fx_kwargs)",
        "finally: _fx_initialising.discard(_fx_key)",
        "_fx_own_plan.finish(_fx_self)",
    ]
    closure = {
        "_fx_user_init": user_init,
        "_fx_cls": cls,
        "_fx_plan": plan,
        "_fx_unset": _UNSET,
        "_fx_initialising": _INITIALISING,
        "_fx_made_in_new": _MADE_IN_NEW,
        **_BUILTINS,
    }
    params = ", ".join(["_fx_self", "/", "*_fx_args", *caught, "**_fx_kwargs"])
    source = (
        f"def _build({', '.join(closure)}):\n"
        f" def __init__({params}):\n"
        + "\n".join(f"  {line}" for line in lines)
        + "\n return __init__\n"
    )
    namespace: dict[str, Any] = {}
    # Executed with the user's `__init__`'s globals: jaxtyping resolves the
    # string annotations the wrapper copies (`from __future__ import
    # annotations`) against them.
    user_globals = getattr(inspect.unwrap(user_init), "__globals__", {})
    exec(compile(source, GENERATED_FILENAME, "exec"), user_globals, namespace)  # noqa: S102
    init = namespace["_build"](**closure)
    init.__kwdefaults__ = dict.fromkeys(caught, _UNSET)
    functools.update_wrapper(init, user_init)
    init.__filterax_custom_init__ = True
    init.__filterax_user_init__ = user_init
    return init


def guard_replaced_init(
    cls: type, new_init: Callable[..., None]
) -> Callable[..., None]:
    """Wraps an `__init__` installed on a Module class after its creation (for
    example by `jaxtyping.jaxtyped`) so that JAX's unflatten still bypasses it."""

    @functools.wraps(new_init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        if kwargs and _store_unflattened(self, args, kwargs):
            return
        _MADE_IN_NEW.discard(id(self))
        new_init(self, *args, **kwargs)

    return __init__


# --- a user-written __new__ -----------------------------------------------------------

# Run first by the `__init__` of a class with a user-written `__new__`: from
# then on, `__init__`'s own rules apply.
_RELEASE_NEW_MARK = "_fx_made_in_new.discard(_fx_id(_fx_self))"


class _NewCalls(threading.local):
    """The user-written `__new__`s running in this thread: how many, and the
    ids of the instances they marked."""

    def __init__(self) -> None:
        self.depth = 0
        self.made: list[int] = []


_NEW_CALLS = _NewCalls()


class FieldsSetInNew:
    """The last base (before `object`) of a Module class that writes its own
    `__new__`, added by the metaclass, as in Equinox, where `Module.__new__`
    does this for every class:
    `super().__new__(cls, *args, **kwargs)` reaches this `__new__`, which
    ignores the arguments and marks the new instance, so that the user's
    `__new__` may assign its fields (`setattr(obj, "x", ...)`). The mark is
    taken off when the outermost user `__new__` returns (see
    `wrap_user_new`), and when `__init__` starts (a Module built inside
    another's `__new__`); `__init__`'s own rules apply then, and the instance
    is frozen when it returns.

    Classes without a `__new__` of their own do not have this base: their
    construction costs nothing more.
    """

    __slots__ = ()

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        del args, kwargs  # the user's `__new__` passes on its arguments, or not
        instance = object.__new__(cls)
        _MADE_IN_NEW.add(id(instance))
        _NEW_CALLS.made.append(id(instance))
        return instance


def wrap_user_new(user_new: Callable[..., Any]) -> Callable[..., Any]:
    """Wraps a Module class's own `__new__`. JAX's unflatten (every field by
    keyword, see the module docstring) gets a bare instance without calling
    it, as Equinox's does. Otherwise it runs, and the instances it marked
    (through `FieldsSetInNew`) lose their mark when it returns or fails,
    except the one it returns to an enclosing `__new__`: once the outermost
    returns, nothing made on the way is assignable.
    """

    @functools.wraps(user_new)
    def __new__(cls: type, /, *args: Any, **kwargs: Any) -> Any:
        if kwargs and not args:
            plan = cls.__dict__["__filterax_plan__"]
            if (
                kwargs.get(_UNFLATTEN_FIELD) is cls
                if plan.uses_marker
                else kwargs.keys() == plan.field_names
            ):
                return object.__new__(cls)
        calls = _NEW_CALLS
        made = calls.made
        start = len(made)
        kept = None
        calls.depth += 1
        try:
            instance = user_new(cls, *args, **kwargs)
            if isinstance(instance, cls):
                kept = id(instance)
            return instance
        finally:
            calls.depth -= 1
            # Marked during this call: the instance returned keeps its mark
            # while an enclosing `__new__` runs (the one that called this
            # through `super().__new__`, say), and stays listed for it to
            # decide again; the others lose it, and so does every one once
            # the outermost `__new__` returns.
            for key in made[start:]:
                if key != kept or not calls.depth:
                    _MADE_IN_NEW.discard(key)
            del made[start:]
            if kept is not None and calls.depth:
                made.append(kept)

    return __new__


# --- immutability ------------------------------------------------------------------------

_BOUND_METHOD_TYPES: list[type] = []  # filled by `_module.py` with `BoundMethod`


def module_setattr(self: Any, name: str, value: Any) -> None:
    # The second test only runs when the first fails, which is never during
    # an `__init__`: assignments there cost one set lookup.
    if id(self) in _INITIALISING or id(self) in _MADE_IN_NEW:
        if name not in type(self).__filterax_plan__.field_names:
            # An `AttributeError`, of the type Equinox raises here.
            raise dataclasses.FrozenInstanceError(
                f"{type(self).__qualname__} has no field {name!r}; declare it "
                f"in the class body (`{name}: <type>`) before assigning it."
            )
        if type(value) is _BOUND_METHOD_TYPES[0] and value.__self__ is self:
            raise ValueError(
                f"Cannot assign methods in __init__: {type(self).__qualname__}."
                f"{name} would be a method of the instance being built, which "
                "holds the instance itself (a reference cycle that makes the "
                "Module no longer a tree). Call the method where it is needed "
                "instead, or store a plain function."
            )
        self.__dict__[name] = value
        return
    if name == "__orig_class__":
        # `typing` records the subscripted class of `Generic` instances
        # (`A[int]()`) after construction.
        self.__dict__[name] = value
        return
    raise dataclasses.FrozenInstanceError(
        f"cannot assign to field {name!r}: {type(self).__qualname__} is "
        "immutable after __init__; use filterax.tree_at to make a modified copy."
    )


def module_delattr(self: Any, name: str) -> None:
    raise dataclasses.FrozenInstanceError(
        f"cannot delete field {name!r}: {type(self).__qualname__} is immutable."
    )
