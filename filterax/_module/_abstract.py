"""`AbstractVar` and `AbstractClassVar`: attributes that concrete subclasses must
provide, and the bookkeeping that tells which ones a class still lacks."""

from __future__ import annotations

import re
import warnings
from typing import Any, ClassVar, Generic, TypeVar, get_origin

from .._warnings import ClassVarFieldWarning

__all__ = [
    "AbstractClassVar",
    "AbstractVar",
    "abstract_error",
    "resolve_abstract_attributes",
]

_T = TypeVar("_T")


class AbstractVar(Generic[_T]):
    """Annotates an attribute that concrete subclasses must provide.

    `x: AbstractVar[int]` is not a field. A subclass resolves it with a field of
    the same name (`x: int`), a class attribute, or a property; instantiating a
    class that leaves it unresolved raises `TypeError`. The names a class still
    lacks are in its `__abstractvars__`.

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
    TypeError: Can't instantiate abstract Module Shape: abstract attributes not provided: AbstractVar 'sides'.

    ```
    """


class AbstractClassVar(Generic[_T]):
    """Annotates a class attribute that concrete subclasses must define.

    Like [`AbstractVar`][filterax.AbstractVar], but resolved by a class
    attribute (`name: ClassVar[str] = "relu"`, or plain `name = "relu"`). An
    instance field without a default is accepted too, as Equinox accepts it,
    with a [`ClassVarFieldWarning`][filterax.ClassVarFieldWarning] (the class
    then has no value to read); a field *with* a default is refused, because
    the class attribute it leaves behind would silently disagree with the
    instances. The names a class still lacks are in
    its `__abstractclassvars__`.

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


# `AbstractVar[int]`, `fx.AbstractVar[int]`, `ClassVar[int]`... as strings, for
# `from __future__ import annotations`. Only the outermost name matters.
_STRING_ANNOTATION = re.compile(
    r"^\s*(?:[\w.]+\.)?(AbstractVar|AbstractClassVar|ClassVar)\s*(\[)?"
)

_VAR, _CLASS_VAR, _PLAIN_CLASS_VAR = "var", "classvar", "plain classvar"


def _annotation_kind(cls_name: str, name: str, annotation: Any) -> str | None:
    """What an annotation declares: an abstract var, an abstract class var, a
    `ClassVar`, or (`None`) anything else."""
    if isinstance(annotation, str):
        match = _STRING_ANNOTATION.match(annotation)
        if match is None:
            return None
        kind, subscripted = match.group(1), match.group(2) is not None
    else:
        origin = get_origin(annotation)
        if annotation in (AbstractVar, AbstractClassVar):
            kind, subscripted = annotation.__name__, False
        elif origin in (AbstractVar, AbstractClassVar):
            kind, subscripted = origin.__name__, True
        elif annotation is ClassVar or origin is ClassVar:
            return _PLAIN_CLASS_VAR
        else:
            return None
    if kind == "ClassVar":
        return _PLAIN_CLASS_VAR
    if not subscripted:
        raise TypeError(
            f"{cls_name}.{name}: {kind} must be subscripted with the attribute's "
            f"type, e.g. `{name}: {kind}[int]`; an unsubscripted {kind} is not "
            "allowed."
        )
    return _VAR if kind == "AbstractVar" else _CLASS_VAR


_DECLARED = "__filterax_abstract_declared__"


def _concretely_defines(klass: type, name: str) -> bool:
    """Whether `klass` itself gives `name` a value or a (non-abstract) field or
    `ClassVar` declaration."""
    return name in klass.__dict__ or name in klass.__dict__.get("__annotations__", {})


def resolve_abstract_attributes(
    cls: type, namespace: dict[str, Any]
) -> tuple[frozenset[str], frozenset[str]]:
    """Processes the annotations of a class being created: removes the abstract
    ones (they are not fields) and returns the names still abstract for this
    class, as `(abstract vars, abstract class vars)`.

    For each name declared abstract anywhere in the MRO, the first class of the
    MRO that mentions it decides: an abstract declaration keeps it abstract, a
    value, field or `ClassVar` provides it. Once a class var, always a class
    var: redeclaring an `AbstractClassVar` as `AbstractVar` keeps the stricter
    kind.

    Raises `TypeError` for an abstract annotation with a value, an unsubscripted
    one, or an `AbstractClassVar` resolved by a field with a default; warns
    (`ClassVarFieldWarning`) for one resolved by a field without a default.
    """
    annotations = cls.__dict__.get("__annotations__", {})
    declared: dict[str, str] = {}
    kept: dict[str, Any] = {}
    for name, annotation in annotations.items():
        kind = _annotation_kind(cls.__qualname__, name, annotation)
        if kind in (_VAR, _CLASS_VAR):
            if name in namespace:
                raise TypeError(
                    f"{cls.__qualname__}.{name}: an abstract attribute cannot have "
                    "value; declare it without one (`x: AbstractVar[int]`) and "
                    "give it a value in a subclass."
                )
            declared[name] = kind
        else:
            kept[name] = annotation
    if declared:
        cls.__annotations__ = kept
    type.__setattr__(cls, _DECLARED, declared)

    abstract_vars: set[str] = set()
    abstract_class_vars: set[str] = set()
    names = {
        name for klass in cls.__mro__ for name in klass.__dict__.get(_DECLARED, ())
    }
    for name in names:
        kinds = [
            k.__dict__[_DECLARED][name]
            for k in cls.__mro__
            if name in k.__dict__.get(_DECLARED, ())
        ]
        is_class_var = _CLASS_VAR in kinds
        for klass in cls.__mro__:
            if name in klass.__dict__.get(_DECLARED, ()):
                (abstract_class_vars if is_class_var else abstract_vars).add(name)
                break
            if _concretely_defines(klass, name):
                if (
                    is_class_var
                    and klass is cls
                    and name in kept
                    and _annotation_kind(cls.__qualname__, name, kept[name]) is None
                ):
                    _check_instance_field_for_class_var(cls, name, namespace)
                break
    return frozenset(abstract_vars), frozenset(abstract_class_vars)


def _check_instance_field_for_class_var(
    cls: type, name: str, namespace: dict[str, Any]
) -> None:
    """An `AbstractClassVar` that `cls` resolves with an instance field: refused
    with a default (the class attribute would disagree with the instances),
    accepted with a `ClassVarFieldWarning` without one, as Equinox accepts it."""
    if name not in namespace:
        warnings.warn(
            f"{cls.__qualname__}.{name} resolves an AbstractClassVar with an "
            f"instance field, so `{cls.__qualname__}.{name}` is not defined on "
            "the class, which an AbstractClassVar promises. Declare it "
            f"`{name}: ClassVar[...] = ...` to give the class its value.",
            ClassVarFieldWarning,
            stacklevel=4,  # the `class` statement, above the metaclass and resolver
        )
    elif not isinstance(namespace[name], property):
        raise TypeError(
            f"{cls.__qualname__}.{name} resolves an AbstractClassVar "
            "with an instance field that has a default: the class "
            "attribute then disagrees with instances that set another "
            f"value. Declare it `{name}: ClassVar[...] = ...`, or give "
            "the field no default."
        )


def abstract_error(
    cls: type,
    abstract_vars: frozenset[str],
    abstract_class_vars: frozenset[str],
    declared_abstract: bool = False,
) -> str | None:
    """The message for instantiating `cls`, or `None` when nothing is missing
    and the class was not declared abstract (`is_abstract=True`)."""
    problems = []
    if declared_abstract:
        problems.append("it is declared with `is_abstract=True`")
    if abstract_vars:
        problems.append(
            "abstract attributes not provided: "
            + ", ".join(f"AbstractVar {name!r}" for name in sorted(abstract_vars))
        )
    if abstract_class_vars:
        problems.append(
            "abstract class attributes not provided: "
            + ", ".join(
                f"AbstractClassVar {name!r}" for name in sorted(abstract_class_vars)
            )
        )
    if not problems:
        return None
    return (
        f"Can't instantiate abstract Module {cls.__qualname__}: "
        + "; ".join(problems)
        + "."
    )
