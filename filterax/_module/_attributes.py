"""What a wrapper copies from the callable it wraps, for every wrapper filterax
makes (the filtered transforms, `module_update_wrapper`, method stand-ins)."""

from __future__ import annotations

from typing import Any

__all__ = ["COPIED_ATTRIBUTES", "copy_wrapped_attributes"]

# As `functools.WRAPPER_ASSIGNMENTS`, in one place.
COPIED_ATTRIBUTES = ("__module__", "__name__", "__qualname__", "__doc__")

_ABSENT = object()


def copy_wrapped_attributes(
    attributes: dict[str, Any], wrapped: Any, *, annotations: bool
) -> None:
    """Sets `wrapped`'s `COPIED_ATTRIBUTES` that it has into `attributes` (a
    wrapper's `__dict__`), plus a copy of its `__annotations__` when
    `annotations` (not for a transform that changes the shapes the annotations
    describe, such as a batching one): the wrapped callable's, or none."""
    for name in COPIED_ATTRIBUTES:
        value = getattr(wrapped, name, _ABSENT)
        if value is not _ABSENT:
            attributes[name] = value
    if annotations:
        attributes["__annotations__"] = dict(getattr(wrapped, "__annotations__", {}))
