"""Every public name documents its arguments and result, with a runnable example
(the examples themselves run as doctests)."""

import inspect

import pytest

import filterax as fx

PUBLIC_NAMES = sorted(
    name
    for name in dir(fx)
    if not name.startswith("_") and not isinstance(getattr(fx, name), str)
)


@pytest.mark.parametrize("name", PUBLIC_NAMES)
def test_public_name_has_arguments_returns_and_an_example(name):
    doc = inspect.getdoc(getattr(fx, name)) or ""
    assert doc.splitlines(), f"{name} has no docstring"
    for section in ("**Arguments", "**Returns", ">>>"):
        assert section in doc, f"{name}'s docstring lacks {section!r}"


def test_public_names_are_exactly_the_reexports():
    for name in PUBLIC_NAMES:
        module = getattr(getattr(fx, name), "__module__", "filterax")
        assert module.startswith("filterax"), f"{name} comes from {module}"
