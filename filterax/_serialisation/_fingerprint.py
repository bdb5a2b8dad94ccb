"""The one description of the non-array part of a pytree, shared by
`tree_serialise_leaves` (its `object` entries) and `filterax.checkpoint` (its
description of static leaves and node metadata): a JSON fingerprint of a value,
made without pickling it.

Plain data stands for itself; functions and classes for their qualified name;
other objects for their type. Names from the script run as `__main__` are
given the script's own module name (`train` for `python train.py`), so that a
value fingerprints alike in the script and in a program importing it. A
fingerprint whose JSON is longer than `_LONGEST` characters is replaced by its
SHA-256 digest. Nothing here can run code when read back.

Imports the standard library and NumPy only.
"""

from __future__ import annotations

import enum
import functools
import hashlib
import json
import math
import os
import sys
from typing import Any

import numpy as np

__all__ = ["describe_value", "fingerprint", "module_name", "qualified_name"]

_DEPTH = 12
_LONGEST = 2048


@functools.cache
def _main_module_name() -> str:
    """The module name of the script run as `__main__`: what importing it
    would call it (`train` for `python train.py` or `python -m train`)."""
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    name = getattr(spec, "name", None)
    if isinstance(name, str) and name and name != "__main__":
        return name.removesuffix(".__main__")
    file = getattr(main, "__file__", None)
    if isinstance(file, str) and file:
        return os.path.splitext(os.path.basename(file))[0]
    return "__main__"


def module_name(obj: Any) -> str:
    """The module `obj` was defined in (`__main__` as the script's name)."""
    module = getattr(obj, "__module__", None) or "?"
    return _main_module_name() if module == "__main__" else module


def qualified_name(obj: Any) -> str:
    name = getattr(obj, "__qualname__", None) or getattr(obj, "__name__", "?")
    return f"{module_name(obj)}.{name}"


def fingerprint(value: Any, depth: int = 0) -> Any:
    """A JSON value that stands for `value` when two static parts are compared:
    equal for equal plain data and for the same function or class."""
    if depth > _DEPTH:
        return {"object": qualified_name(type(value))}
    deeper = functools.partial(fingerprint, depth=depth + 1)
    if value is None or type(value) in (bool, str, int):
        return value
    if type(value) is float:
        return value if math.isfinite(value) else {"float": repr(value)}
    if type(value) is complex:
        return {"complex": [repr(value.real), repr(value.imag)]}
    if isinstance(value, enum.Enum):
        return {"enum": qualified_name(type(value)), "name": value.name}
    if isinstance(value, bytes):
        return {"bytes": value.hex()}
    if isinstance(value, tuple):
        kind = "tuple" if type(value) is tuple else qualified_name(type(value))
        return {"tuple": kind, "items": [deeper(item) for item in value]}
    if isinstance(value, list):
        return {"list": [deeper(item) for item in value]}
    if isinstance(value, dict):
        return {"dict": [[deeper(k), deeper(v)] for k, v in value.items()]}
    if isinstance(value, (set, frozenset)):
        return {"set": sorted(json.dumps(deeper(item)) for item in value)}
    if isinstance(value, type):
        return {"type": qualified_name(value)}
    if isinstance(value, np.dtype):
        return {"dtype": str(value)}
    if isinstance(value, functools.partial):
        return {
            "partial": deeper(value.func),
            "args": deeper(value.args),
            "kwargs": deeper(value.keywords),
        }
    if callable(value) and hasattr(value, "__qualname__"):
        # Functions, builtins and wrapped functions (`jax.nn.relu`, a custom_jvp).
        return {"function": qualified_name(value)}
    return {"object": qualified_name(type(value))}


def describe_value(value: Any) -> Any:
    """`fingerprint(value)`, or its digest when its JSON is long."""
    described = fingerprint(value)
    text = json.dumps(described, sort_keys=True)
    if len(text) <= _LONGEST:
        return described
    return {"sha256": hashlib.sha256(text.encode()).hexdigest()}
