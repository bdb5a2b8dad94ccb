"""Speed of the Module core, measured side by side in one process.

Prints three ratios (filterax / reference), each the best of several
interleaved rounds so that both sides see the same machine noise:

- constructing a 3-field Module vs a plain frozen dataclass (target <= 2x);
- `jax.tree_util.tree_flatten` of a list of 100 Modules vs the same built with
  `jax.tree_util.register_dataclass` (target <= 1.2x);
- `jax.tree_util.tree_unflatten` of the same (target <= 1.2x);
- both again for Modules written with a custom `__init__`.

Run: `python benchmarks/bench_module.py`
"""

from __future__ import annotations

import dataclasses
import timeit

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
class RegisteredDataclass:
    weight: jax.Array
    bias: jax.Array
    scale: float


class ThreeFieldModule(fx.Module):
    weight: jax.Array
    bias: jax.Array
    scale: float


class CustomInitModule(fx.Module):
    """The usual shape of a layer: a custom `__init__` taking sizes, not fields."""

    weight: jax.Array
    bias: jax.Array
    scale: float

    def __init__(self, size: int, scale: float):
        self.weight = jnp.ones((size, size))
        self.bias = jnp.zeros(size)
        self.scale = scale


def best_time(statement, number: int) -> float:
    """Seconds per call: the minimum over repeats is the least noisy estimate."""
    return min(timeit.repeat(statement, number=number, repeat=3)) / number


def measure(rounds: int = 5) -> dict[str, float]:
    weight, bias = jnp.ones((4, 4)), jnp.zeros(4)
    registered = [RegisteredDataclass(weight, bias, 1.0) for _ in range(100)]
    modules = [ThreeFieldModule(weight, bias, 1.0) for _ in range(100)]
    custom = [CustomInitModule(4, 1.0) for _ in range(100)]
    registered_leaves, registered_def = jax.tree_util.tree_flatten(registered)
    module_leaves, module_def = jax.tree_util.tree_flatten(modules)
    custom_leaves, custom_def = jax.tree_util.tree_flatten(custom)
    best: dict[str, float] = {}

    def record(name: str, seconds: float) -> None:
        best[name] = min(best.get(name, float("inf")), seconds)

    for _ in range(rounds):
        record(
            "construct_ref",
            best_time(lambda: PlainDataclass(weight, bias, 1.0), 20_000),
        )
        record(
            "construct", best_time(lambda: ThreeFieldModule(weight, bias, 1.0), 20_000)
        )
        record(
            "flatten_ref",
            best_time(lambda: jax.tree_util.tree_flatten(registered), 500),
        )
        record("flatten", best_time(lambda: jax.tree_util.tree_flatten(modules), 500))
        record(
            "unflatten_ref",
            best_time(
                lambda: jax.tree_util.tree_unflatten(registered_def, registered_leaves),
                500,
            ),
        )
        record(
            "unflatten",
            best_time(
                lambda: jax.tree_util.tree_unflatten(module_def, module_leaves), 500
            ),
        )
        record(
            "custom_flatten", best_time(lambda: jax.tree_util.tree_flatten(custom), 500)
        )
        record(
            "custom_unflatten",
            best_time(
                lambda: jax.tree_util.tree_unflatten(custom_def, custom_leaves), 500
            ),
        )
    return best


def main() -> None:
    best = measure()
    rows = [
        ("construct 3-field Module vs frozen dataclass", "construct", 2.0),
        ("tree_flatten 100 Modules vs register_dataclass", "flatten", 1.2),
        ("tree_unflatten 100 Modules vs register_dataclass", "unflatten", 1.2),
        ("  same, Modules with a custom __init__: flatten", "custom_flatten", 1.2),
        ("  same, Modules with a custom __init__: unflatten", "custom_unflatten", 1.2),
    ]
    print(
        f"{'measurement':52s} {'filterax':>10s} {'reference':>10s} {'ratio':>6s} target"
    )
    for label, name, target in rows:
        ours, ref = best[name], best[f"{name.removeprefix('custom_')}_ref"]
        ratio = ours / ref
        verdict = "ok" if ratio <= target else "OVER"
        print(
            f"{label:52s} {ours * 1e6:9.2f}us {ref * 1e6:9.2f}us {ratio:6.2f} "
            f"<= {target} {verdict}"
        )


if __name__ == "__main__":
    main()
