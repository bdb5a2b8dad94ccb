"""Every public name documents its arguments and result, with a runnable example
(the examples themselves run as doctests)."""

import inspect
import types

import pytest

import filterax as fx
import filterax.checkpoint
import filterax.safetensors

NAMESPACES = {
    "filterax": fx,
    "filterax.nn": fx.nn,
    "filterax.debug": fx.debug,
    "filterax.checkpoint": filterax.checkpoint,
    "filterax.safetensors": filterax.safetensors,
}


def _public(namespace: types.ModuleType) -> list[str]:
    return sorted(
        name
        for name in dir(namespace)
        if not name.startswith("_")
        and not isinstance(getattr(namespace, name), (str, types.ModuleType))
    )


PUBLIC_NAMES = _public(fx)
EVERY_PUBLIC_NAME = [
    f"{prefix}.{name}"
    for prefix, namespace in NAMESPACES.items()
    for name in _public(namespace)
]


@pytest.mark.parametrize("qualified", EVERY_PUBLIC_NAME)
def test_public_name_has_arguments_returns_and_an_example(qualified):
    prefix, name = qualified.rsplit(".", 1)
    doc = inspect.getdoc(getattr(NAMESPACES[prefix], name)) or ""
    assert doc.splitlines(), f"{qualified} has no docstring"
    for section in ("**Arguments", "**Returns", ">>>"):
        assert section in doc, f"{qualified}'s docstring lacks {section!r}"


def test_public_names_are_exactly_the_reexports():
    for name in PUBLIC_NAMES:
        module = getattr(getattr(fx, name), "__module__", "filterax")
        assert module.startswith("filterax"), f"{name} comes from {module}"
