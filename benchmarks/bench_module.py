"""Speed of the Module core, measured side by side in one process.

Each ratio (filterax / reference) is the best of several interleaved rounds, so
that both sides see the same machine noise. The targets are those of the
dispatch issue:

- constructing a 3-field Module vs a plain frozen dataclass (target <= 1.3x);
- `jax.tree_util.tree_flatten` of a list of 100 Modules vs the same class built
  with `jax.tree_util.register_dataclass` (target <= 1.05x; 1.10x for the
  converter and `__check_init__` classes, which carry the unflatten marker), and
  `tree_unflatten` of the same (target <= 1.0x), for five kinds of class:
  plain fields; a `field(static=True)` (the reference registers it as a meta
  field); a field with a converter; a `__check_init__`; a custom `__init__`;
  a function in a static field, given or as its default, and in an ordinary
  field (issue 30: `jax.nn.relu` is a `custom_jvp`); a `NonDifferentiable`
  buffer (the reference: the same fields plus a nested registered node).

No assertion is made on the timings.

Run: `python benchmarks/bench_module.py`
"""

from __future__ import annotations

import dataclasses
import timeit
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

import filterax as fx


@dataclasses.dataclass(frozen=True)
class PlainDataclass:
    weight: jax.Array
    bias: jax.Array
    scale: float


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Registered:
    weight: jax.Array
    bias: jax.Array
    scale: float


@dataclasses.dataclass(frozen=True)
class RegisteredStatic:
    weight: jax.Array
    bias: jax.Array
    scale: float


jax.tree_util.register_dataclass(
    RegisteredStatic, data_fields=["weight", "bias"], meta_fields=["scale"]
)


class Plain(fx.Module):
    weight: jax.Array
    bias: jax.Array
    scale: float


class StaticField(fx.Module):
    weight: jax.Array
    bias: jax.Array
    scale: float = fx.field(static=True)


class Converter(fx.Module):
    weight: jax.Array
    bias: jax.Array
    scale: float = fx.field(converter=float)


class CheckInit(fx.Module):
    weight: jax.Array
    bias: jax.Array
    scale: float

    def __check_init__(self) -> None:
        if self.scale < 0:
            raise ValueError("scale must be non-negative")


class CustomInit(fx.Module):
    """The usual shape of a layer: a custom `__init__` taking sizes, not fields."""

    weight: jax.Array
    bias: jax.Array
    scale: float

    def __init__(self, size: int, scale: float):
        self.weight = jnp.ones((size, size))
        self.bias = jnp.zeros(size)
        self.scale = scale


class StaticFunction(fx.Module):
    weight: jax.Array
    bias: jax.Array
    activation: Callable = fx.field(static=True)


class StaticDefault(fx.Module):
    weight: jax.Array
    bias: jax.Array
    activation: Callable = fx.field(static=True, default=jax.nn.relu)


class FunctionField(fx.Module):
    weight: jax.Array
    bias: jax.Array
    activation: Callable


class Buffer(fx.Module):
    weight: jax.Array
    bias: fx.NonDifferentiable


@dataclasses.dataclass(frozen=True)
class RegisteredActivation:
    weight: jax.Array
    bias: jax.Array
    activation: Callable


jax.tree_util.register_dataclass(
    RegisteredActivation, data_fields=["weight", "bias"], meta_fields=["activation"]
)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class RegisteredFunctionField:
    weight: jax.Array
    bias: jax.Array
    activation: Callable


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class RegisteredBuffer:
    value: jax.Array


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class RegisteredPair:
    weight: jax.Array
    bias: Any


# name -> (filterax instances, reference instances)
def trees() -> dict[str, tuple[list[Any], list[Any]]]:
    weight, bias = jnp.ones((4, 4)), jnp.zeros(4)
    registered = [Registered(weight, bias, 1.0) for _ in range(100)]
    # Each custom-`__init__` instance makes its own arrays: the reference holds
    # the same ones, its instances made in the same order (so that both sides'
    # objects lie alike in memory).
    custom, custom_reference = [], []
    for _ in range(100):
        custom.append(CustomInit(4, 1.0))
        layer = custom[-1]
        custom_reference.append(Registered(layer.weight, layer.bias, layer.scale))
    static_ref = [RegisteredStatic(weight, bias, 1.0) for _ in range(100)]
    return {
        "plain fields": ([Plain(weight, bias, 1.0) for _ in range(100)], registered),
        "a static field": (
            [StaticField(weight, bias, 1.0) for _ in range(100)],
            static_ref,
        ),
        "a converter": ([Converter(weight, bias, 1.0) for _ in range(100)], registered),
        "a __check_init__": (
            [CheckInit(weight, bias, 1.0) for _ in range(100)],
            registered,
        ),
        "a custom __init__": (custom, custom_reference),
        # Issue 30: classes holding functions (jax.nn.relu is a custom_jvp).
        "a static function": (
            [StaticFunction(weight, bias, jax.nn.relu) for _ in range(100)],
            [RegisteredActivation(weight, bias, jax.nn.relu) for _ in range(100)],
        ),
        "a static default function": (
            [StaticDefault(weight, bias) for _ in range(100)],
            [RegisteredActivation(weight, bias, jax.nn.relu) for _ in range(100)],
        ),
        "a function in an ordinary field": (
            [FunctionField(weight, bias, jax.nn.relu) for _ in range(100)],
            [RegisteredFunctionField(weight, bias, jax.nn.relu) for _ in range(100)],
        ),
        "a NonDifferentiable buffer": (
            [Buffer(weight, fx.NonDifferentiable(bias)) for _ in range(100)],
            [RegisteredPair(weight, RegisteredBuffer(bias)) for _ in range(100)],
        ),
    }


def best_time(statement, number: int) -> float:
    """Seconds per call: the minimum over repeats is the least noisy estimate."""
    return min(timeit.repeat(statement, number=number, repeat=3)) / number


def measure(rounds: int = 5) -> list[tuple[str, float, float, float]]:
    """Rows `(label, ours, reference, target)`, times in seconds."""
    weight, bias = jnp.ones((4, 4)), jnp.zeros(4)
    cases: list[tuple[str, Any, Any, float]] = [
        (
            "construct 3-field Module vs frozen dataclass",
            lambda: Plain(weight, bias, 1.0),
            lambda: PlainDataclass(weight, bias, 1.0),
            1.3,
        )
    ]
    for name, (ours, reference) in trees().items():
        ours_leaves, ours_def = jax.tree_util.tree_flatten(ours)
        ref_leaves, ref_def = jax.tree_util.tree_flatten(reference)
        cases.append(
            (
                f"flatten 100, {name}",
                lambda ours=ours: jax.tree_util.tree_flatten(ours),
                lambda reference=reference: jax.tree_util.tree_flatten(reference),
                1.10 if name in ("a converter", "a __check_init__") else 1.05,
            )
        )
        cases.append(
            (
                f"unflatten 100, {name}",
                lambda d=ours_def, leaves=ours_leaves: d.unflatten(leaves),
                lambda d=ref_def, leaves=ref_leaves: d.unflatten(leaves),
                1.0,
            )
        )
    best = {label: [float("inf"), float("inf")] for label, *_ in cases}
    for _ in range(rounds):
        for label, ours, reference, _ in cases:
            number = 20_000 if label.startswith("construct") else 500
            best[label][0] = min(best[label][0], best_time(ours, number))
            best[label][1] = min(best[label][1], best_time(reference, number))
    return [(label, *best[label], target) for label, _, _, target in cases]


def main() -> None:
    print(
        f"{'measurement (filterax vs reference)':48s} {'filterax':>10s} "
        f"{'reference':>10s} {'ratio':>6s} target"
    )
    for label, ours, reference, target in measure():
        ratio = ours / reference
        verdict = "ok" if ratio <= target else "OVER"
        print(
            f"{label:48s} {ours * 1e6:9.2f}us {reference * 1e6:9.2f}us {ratio:6.3f} "
            f"<= {target} {verdict}"
        )


if __name__ == "__main__":
    main()
