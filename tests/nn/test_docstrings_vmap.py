"""`jax.vmap` formats the docstring of what it maps, and drops its errors.

`jax.vmap(f)` builds its wrapper's docstring as `"Vectorized version of {fun}
..." + f.__doc__` and then calls `.format(fun=...)` on the whole of it, inside
a `try` whose `except Exception: pass` ends the copying of `f`'s attributes
(`jax._src.util.wraps`). A `{` or `}` in `f`'s docstring therefore leaves the
wrapper's `__wrapped__` at JAX's own inner function, and its `__doc__` and
`__qualname__` uncopied, silently: one in an `nn` class docstring made
`jax.vmap(layer).__wrapped__` not the layer. An
instance shows its class's docstring, and `wraps` also copies its `__dict__`
and `__annotations__`, so both the classes and an instance of each are checked.

Every public Module class of `filterax` and `filterax.nn` is checked as a
class, and each whose instances are callable (what users map: layers, models,
partials, bound methods) as an instance too; a new one without an instance
below fails `test_every_callable_public_module_class_has_an_instance_here`.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import pytest

import filterax as fx
from filterax import nn


def _public_module_classes() -> list[tuple[str, type[Any]]]:
    found = []
    for namespace, prefix in ((fx, "fx"), (nn, "nn")):
        for name in getattr(namespace, "__all__", dir(namespace)):
            value = getattr(namespace, name, None)
            if inspect.isclass(value) and issubclass(value, fx.Module):
                found.append((f"{prefix}.{name}", value))
    return found


class _Probe(fx.Module):
    """Scales its input."""

    scale: jax.Array

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.scale * x

    def scaled(self, x: jax.Array) -> jax.Array:
        """Also scales its input."""
        return self.scale * x


def _stateful(key: jax.Array) -> nn.StatefulLayer:
    # `StatefulLayer` is abstract: the smallest concrete subclass.
    class Counted(nn.StatefulLayer):
        def __call__(self, x: jax.Array, state: nn.State) -> Any:
            return x, state

    return Counted()


# One small instance of each public Module class, by the name the test ids use.
_INSTANCES: dict[str, Callable[[jax.Array], object]] = {
    "fx.BoundMethod": lambda key: _Probe(jnp.ones(2)).scaled,
    "fx.Partial": lambda key: fx.Partial(jnp.add, jnp.ones(2)),
    "fx.RngStream": lambda key: fx.RngStream(key),
    "nn.AdaptiveAvgPool1d": lambda key: nn.AdaptiveAvgPool1d(2),
    "nn.AdaptiveAvgPool2d": lambda key: nn.AdaptiveAvgPool2d(2),
    "nn.AdaptiveAvgPool3d": lambda key: nn.AdaptiveAvgPool3d(2),
    "nn.AdaptiveMaxPool1d": lambda key: nn.AdaptiveMaxPool1d(2),
    "nn.AdaptiveMaxPool2d": lambda key: nn.AdaptiveMaxPool2d(2),
    "nn.AdaptiveMaxPool3d": lambda key: nn.AdaptiveMaxPool3d(2),
    "nn.AdaptivePool": lambda key: nn.AdaptivePool(2, 1, jnp.max),
    "nn.AvgPool1d": lambda key: nn.AvgPool1d(2),
    "nn.AvgPool2d": lambda key: nn.AvgPool2d(2),
    "nn.AvgPool3d": lambda key: nn.AvgPool3d(2),
    "nn.BatchNorm": lambda key: nn.BatchNorm(3, "batch", mode="batch"),
    "nn.Conv": lambda key: nn.Conv(1, 2, 3, 3, key=key),
    "nn.Conv1d": lambda key: nn.Conv1d(2, 3, 3, key=key),
    "nn.Conv2d": lambda key: nn.Conv2d(2, 3, 3, key=key),
    "nn.Conv3d": lambda key: nn.Conv3d(2, 3, 3, key=key),
    "nn.ConvTranspose": lambda key: nn.ConvTranspose(1, 2, 3, 3, key=key),
    "nn.ConvTranspose1d": lambda key: nn.ConvTranspose1d(2, 3, 3, key=key),
    "nn.ConvTranspose2d": lambda key: nn.ConvTranspose2d(2, 3, 3, key=key),
    "nn.ConvTranspose3d": lambda key: nn.ConvTranspose3d(2, 3, 3, key=key),
    "nn.Dropout": lambda key: nn.Dropout(0.1),
    "nn.Embedding": lambda key: nn.Embedding(5, 3, key=key),
    "nn.GRUCell": lambda key: nn.GRUCell(2, 3, key=key),
    "nn.GroupNorm": lambda key: nn.GroupNorm(2, 4),
    "nn.Identity": lambda key: nn.Identity(),
    "nn.LSTMCell": lambda key: nn.LSTMCell(2, 3, key=key),
    "nn.Lambda": lambda key: nn.Lambda(jax.nn.relu),
    "nn.LayerNorm": lambda key: nn.LayerNorm(3),
    "nn.Linear": lambda key: nn.Linear(2, 3, key=key),
    "nn.MLP": lambda key: nn.MLP(2, 3, 4, 1, key=key),
    "nn.MaxPool1d": lambda key: nn.MaxPool1d(2),
    "nn.MaxPool2d": lambda key: nn.MaxPool2d(2),
    "nn.MaxPool3d": lambda key: nn.MaxPool3d(2),
    "nn.MultiheadAttention": lambda key: nn.MultiheadAttention(2, 4, key=key),
    "nn.PReLU": lambda key: nn.PReLU(),
    "nn.Pool": lambda key: nn.Pool(-jnp.inf, jax.lax.max, 1, 2),
    "nn.RMSNorm": lambda key: nn.RMSNorm(3),
    "nn.RotaryPositionalEmbedding": lambda key: nn.RotaryPositionalEmbedding(4),
    "nn.Sequential": lambda key: nn.Sequential([nn.Linear(2, 2, key=key)]),
    "nn.Shared": lambda key: nn.Shared(
        (nn.Linear(2, 2, key=key), nn.Linear(2, 2, key=key)),
        lambda pair: pair[1].weight,
        lambda pair: pair[0].weight,
    ),
    "nn.SpectralNorm": lambda key: nn.SpectralNorm(
        nn.Linear(2, 3, key=key), "weight", key=key
    ),
    "nn.Stacked": lambda key: nn.Stacked(lambda k: nn.Linear(2, 2, key=k), 2, key=key),
    "nn.StatefulLayer": _stateful,
    "nn.WeightNorm": lambda key: nn.WeightNorm(nn.Linear(2, 3, key=key)),
}


def _instances_are_callable(cls: type[Any]) -> bool:
    return any("__call__" in vars(base) for base in cls.__mro__)


@pytest.mark.parametrize(("name", "value"), _public_module_classes(), ids=str)
def test_vmap_keeps_the_wrapped_class(name: str, value: type[Any]) -> None:
    mapped = jax.vmap(value)
    assert mapped.__wrapped__ is value, name  # type: ignore[attr-defined]
    assert value.__doc__ is not None and value.__doc__ in (mapped.__doc__ or "")


@pytest.mark.parametrize("name", sorted(_INSTANCES))
def test_vmap_keeps_the_wrapped_instance(name: str) -> None:
    instance = _INSTANCES[name](jax.random.key(0))
    mapped = jax.vmap(instance)
    assert mapped.__wrapped__ is instance, name  # type: ignore[attr-defined]
    # The docstring is copied after the formatting, so it is there too.
    assert (instance.__doc__ or "") in (mapped.__doc__ or "")


def test_every_callable_public_module_class_has_an_instance_here() -> None:
    classes = dict(_public_module_classes())
    callable_classes = {n for n, c in classes.items() if _instances_are_callable(c)}
    # Not callable, so not mapped: checked as classes only.
    assert set(classes) - callable_classes == {
        "fx.DynamicLossScale",
        "fx.EnumerationItem",
        "fx.Module",
        "fx.NoOpLossScale",
        "fx.Precision",
        "fx.StaticLossScale",
        "nn.StateIndex",
    }
    assert callable_classes == set(_INSTANCES)
    for name, make in _INSTANCES.items():
        instance = make(jax.random.key(0))
        assert isinstance(instance, classes[name]) and callable(instance), name


def test_a_brace_in_a_docstring_is_what_breaks_it() -> None:
    # The failure this file guards against, on a class of its own: the
    # wrapper's `__wrapped__` is then JAX's inner function and its docstring
    # is lost. If JAX stops formatting the docstring, this fails and the
    # brace checks above can go.
    class Braced(fx.Module):
        """Holds a {dict} of arrays."""

        def __call__(self, x: jax.Array) -> jax.Array:
            return x

    mapped = jax.vmap(Braced())
    assert mapped.__wrapped__ is not None  # type: ignore[attr-defined]
    assert not isinstance(mapped.__wrapped__, Braced)  # type: ignore[attr-defined]
    assert mapped.__doc__ is None
    unbraced = jax.vmap(_Probe(jnp.ones(2)))
    assert isinstance(unbraced.__wrapped__, _Probe)  # type: ignore[attr-defined]
