"""`jax.vmap` formats the docstring of what it maps: a `{` in one made
`jax.vmap(layer).__wrapped__` silently not the layer. Every public Module class
of `filterax` and `filterax.nn` (what users map: layers, models, and their
instances, which show the class's docstring) keeps its identity there."""

from __future__ import annotations

import inspect

import jax
import pytest

import filterax as fx
from filterax import nn


def _public_module_classes() -> list[tuple[str, object]]:
    found = []
    for namespace, prefix in ((fx, "fx"), (nn, "nn")):
        for name in getattr(namespace, "__all__", dir(namespace)):
            value = getattr(namespace, name, None)
            if inspect.isclass(value) and issubclass(value, fx.Module):
                found.append((f"{prefix}.{name}", value))
    return found


@pytest.mark.parametrize(("name", "value"), _public_module_classes(), ids=str)
def test_vmap_keeps_the_wrapped_object(name: str, value: object) -> None:
    assert jax.vmap(value).__wrapped__ is value, name  # type: ignore[attr-defined]
