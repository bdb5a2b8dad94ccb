"""Per-call dispatch cost of `filter_jit` against `jax.jit` on a flat list.

For N = 10, 64 and 204 array leaves, one process times:

- `jax.jit` called on a flat list of the N arrays: the floor;
- `filter_jit` called on a Module holding the same N arrays (an MLP-like stack
  of `Linear(weight, bias)` layers plus a static activation name);
- the same Module's `__call__`, decorated with `filter_jit` in the class body
  (one more array argument, `x`, than the floor);
- `filter_jit` called on the Module plus one string: a call with a non-array
  leaf takes the keyed path (see `filterax/_jit.py`).

The compiled functions do no work (they return one input array), so what is
timed is dispatch: flattening, the cache lookup and rebuilding the output.
Repeats are interleaved so that drifts in machine load hit every variant
alike; the minimum and the median per-call time over the repeats are reported,
with their ratios to the floor. No assertion is made on the timings.

Run: `python benchmarks/bench_dispatch.py [--repeats R] [--calls C]`.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp

import filterax as fx


class Linear(fx.Module):
    weight: jax.Array
    bias: jax.Array


class Stack(fx.Module):
    layers: tuple[Linear, ...]
    activation: str = fx.field(static=True, default="relu")

    @fx.filter_jit
    def __call__(self, x: jax.Array) -> jax.Array:
        return self.layers[0].bias + x


def make_stack(n_arrays: int) -> Stack:
    assert n_arrays % 2 == 0
    layers = tuple(
        Linear(jnp.full((4, 4), float(i)), jnp.full((4,), float(i)))
        for i in range(n_arrays // 2)
    )
    return Stack(layers)


@jax.jit
def floor_fn(arrays: list[jax.Array]) -> jax.Array:
    return arrays[1]


@fx.filter_jit
def filtered_fn(model: Stack) -> jax.Array:
    return model.layers[0].bias


@fx.filter_jit
def filtered_fn_with_label(model: Stack, label: str) -> jax.Array:
    return model.layers[0].bias


def per_call_us(call: Callable[[], object], calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        call()
    return (time.perf_counter() - start) / calls * 1e6


def bench(n_arrays: int, repeats: int, calls: int) -> None:
    model = make_stack(n_arrays)
    arrays = jax.tree.leaves(model)
    assert len(arrays) == n_arrays
    x = jnp.zeros(4)
    variants: dict[str, Callable[[], object]] = {
        "jax.jit(flat list)": lambda: floor_fn(arrays),
        "filter_jit(f)(model)": lambda: filtered_fn(model),
        "model(x) [method]": lambda: model(x),
        "f(model, 'relu') [keyed]": lambda: filtered_fn_with_label(model, "relu"),
    }
    for call in variants.values():  # compile, and warm up
        for _ in range(3):
            jax.block_until_ready(call())
    times: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(repeats):
        for name, call in variants.items():
            times[name].append(per_call_us(call, calls))
    floor_min = min(times["jax.jit(flat list)"])
    floor_median = statistics.median(times["jax.jit(flat list)"])
    print(f"N = {n_arrays}")
    for name, samples in times.items():
        low, mid = min(samples), statistics.median(samples)
        print(
            f"  {name:26s} min {low:7.2f} us  median {mid:7.2f} us   "
            f"ratio min {low / floor_min:4.2f}x  median {mid / floor_median:4.2f}x"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--calls", type=int, default=500)
    options = parser.parse_args()
    print(f"jax {jax.__version__}, backend {jax.default_backend()}")
    for n_arrays in (10, 64, 204):
        bench(n_arrays, options.repeats, options.calls)


if __name__ == "__main__":
    main()
