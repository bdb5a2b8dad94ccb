"""Per-call cost of `filter_jit` against `jax.jit` on a flat list of the same arrays.

For N = 10, 64 and 204 array leaves (an MLP-like stack of `Linear(weight,
bias)` layers of 4x4), one process times, each against its floor:

- `static field`: `filter_jit(f)(model, x)` where the model keeps its
  activation function in a `field(static=True)` (every argument leaf is an
  array: the direct route); floor: `jax.jit` of the same forward pass on the
  list of arrays;
- `jax.jit, same Module`: not filterax but `jax.jit` called on the static-field
  model: the share of the first row's ratio that is JAX's own cost of
  flattening nested nodes rather than a flat list;
- `ordinary field`: the same with the activation in an ordinary field, as
  Equinox's `nn.MLP` stores it (a function leaf: the keyed route);
- `adam step`: a whole optax Adam training step, `filter_jit` of
  `filter_value_and_grad` plus the update, returning the new model and
  optimiser state (Modules rebuilt on every call); floor: the same step with
  `jax.jit`, `jax.value_and_grad` and lists;
- `returns its model`: `filter_jit` of a function returning its (function-
  holding) model unchanged, against `jax.jit` returning the list: what
  rebuilding the output costs.
- `mixed leaves`: the forward pass of a Module holding, beside its layers, an
  activation function, a string, an int, `None`, a typed PRNG key and a
  `NonDifferentiable` buffer; floor: `jax.jit` on the list of its arrays, key
  and buffer (the other values closed over);
- `mixed leaves + Ref`: the same Module also holding a `jax.Ref` counter that
  every call increments, against the floor given a Ref too. JAX dispatches a
  call with a Ref argument on a slower path (over 100 us here), so this row
  shows that filterax adds nothing measurable to it, not the floor's cost.

The compiled programs are the same (same HLO, same FLOPs): what differs is the
Python work per call. Rounds are interleaved so that drifts in machine load hit
both sides alike; the minimum and the median over the rounds are reported, as
ratios to the floor. No assertion is made on the timings.

`--clock wall` (default) times rounds with `time.perf_counter`; `--clock cpu`
with `time.thread_time`, the CPU time of the calling thread only: on a small
machine where XLA's threads compete with Python for the cores, that isolates
the dispatching thread's work (Python and JAX's C++ dispatch) from the noise.

`--gc off` pauses Python's garbage collector during the timed rounds (both
sides alike): what remains is the work of the call itself, without the
collections that the objects a call creates (returned Modules, arrays) bring
on.

Run: `python benchmarks/bench_dispatch.py [--rounds R] [--calls C] [--clock C]
[--gc on|off]`.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax

import filterax as fx


class Linear(fx.Module):
    weight: jax.Array
    bias: jax.Array


class StaticActivation(fx.Module):
    layers: tuple[Linear, ...]
    activation: Callable = fx.field(static=True)

    def __call__(self, x: jax.Array) -> jax.Array:
        for layer in self.layers:
            x = self.activation(layer.weight @ x + layer.bias)
        return x


class FieldActivation(fx.Module):
    layers: tuple[Linear, ...]
    activation: Callable

    def __call__(self, x: jax.Array) -> jax.Array:
        for layer in self.layers:
            x = self.activation(layer.weight @ x + layer.bias)
        return x


class Mixed(fx.Module):
    """Every kind of leaf a model carries, beside its layers."""

    layers: tuple[Linear, ...]
    activation: Callable
    name: str
    depth: int
    dropout: None
    key: jax.Array
    buffer: fx.NonDifferentiable
    calls: jax.Ref | None

    def __call__(self, x: jax.Array) -> jax.Array:
        if self.calls is not None:
            self.calls[...] += 1
        return mixed_body(
            [leaf for layer in self.layers for leaf in (layer.weight, layer.bias)],
            self.activation,
            self.key,
            self.buffer.value,
            x,
        )


def mixed_body(
    params: list[jax.Array],
    activation: Callable,
    key: jax.Array,
    buffer: jax.Array,
    x: jax.Array,
) -> jax.Array:
    for i in range(0, len(params), 2):
        x = activation(params[i] @ x + params[i + 1])
    return x + buffer + jax.random.key_data(key).sum()


def make_mixed(n_arrays: int, with_ref: bool) -> Mixed:
    """A `Mixed` model with `n_arrays` arrays in its layers, and a Ref
    counter if `with_ref`."""
    return Mixed(
        make_layers(n_arrays),
        jax.nn.relu,
        "mlp",
        n_arrays // 2,
        None,
        jax.random.key(0),
        fx.NonDifferentiable(jnp.zeros(4)),
        jax.new_ref(jnp.zeros((), jnp.int32)) if with_ref else None,
    )


OPTIMISER = optax.adam(1e-3)


def make_layers(n_arrays: int) -> tuple[Linear, ...]:
    return tuple(
        Linear(jnp.full((4, 4), 0.01 * i), jnp.full((4,), 0.01))
        for i in range(n_arrays // 2)
    )


def apply(model: Any, x: jax.Array) -> jax.Array:
    return model(x)


# One `filter_jit` function per row: a function once called with a non-array
# leaf keeps to the keyed route, so sharing one would mix the rows' routes.
forward_static = fx.filter_jit(apply)
forward_field = fx.filter_jit(lambda model, x: model(x))


forward_mixed = fx.filter_jit(lambda model, x: model(x))
forward_mixed_ref = fx.filter_jit(lambda model, x: model(x))


@fx.filter_jit
def identity(model: Any) -> Any:
    return model


@fx.filter_jit
def train_step(model: Any, state: Any, x: jax.Array, y: jax.Array) -> Any:
    def loss(model: Any) -> jax.Array:
        return ((model(x) - y) ** 2).sum()

    value, grads = fx.filter_value_and_grad(loss)(model)
    updates, state = OPTIMISER.update(grads, state, fx.trainable(model))
    return fx.apply_updates(model, updates), state, value


def floor_forward_body(params: list[jax.Array], x: jax.Array) -> jax.Array:
    for i in range(0, len(params), 2):
        x = jax.nn.relu(params[i] @ x + params[i + 1])
    return x


floor_forward = jax.jit(floor_forward_body)
# `jax.jit` itself called on the Module: what JAX's own flattening of nested
# nodes costs over a flat list, before anything filterax does.
jax_forward = jax.jit(apply)
floor_identity = jax.jit(lambda params: params)


@jax.jit
def floor_mixed(leaves: list, x: jax.Array) -> jax.Array:
    *params, key, buffer = leaves
    return mixed_body(params, jax.nn.relu, key, buffer, x)


@jax.jit
def floor_mixed_ref(leaves: list, calls: jax.Ref, x: jax.Array) -> jax.Array:
    calls[...] += 1
    return floor_mixed(leaves, x)


@jax.jit
def floor_step(params: list, state: Any, x: jax.Array, y: jax.Array) -> Any:
    def loss(params: list) -> jax.Array:
        return ((floor_forward_body(params, x) - y) ** 2).sum()

    value, grads = jax.value_and_grad(loss)(params)
    updates, state = OPTIMISER.update(grads, state, params)
    return optax.apply_updates(params, updates), state, value


CLOCKS = {"wall": time.perf_counter, "cpu": time.thread_time}


def per_call_us(
    call: Callable[[], object],
    calls: int,
    clock: Callable[[], float] = time.perf_counter,
) -> float:
    # Dispatch is asynchronous: the round ends once its last result is ready,
    # so that device work queued by one variant is not billed to the next.
    start = clock()
    for _ in range(calls - 1):
        call()
    jax.block_until_ready(call())
    return (clock() - start) / calls * 1e6


Step = tuple[Callable[[], None], dict[str, Any]]


def adam_steps(model: Any, x: jax.Array, y: jax.Array) -> tuple[Step, Step]:
    """The Adam training step of `model`, `filter_jit`'s and the flat-list
    floor's: each a call feeding its last outputs back in, and the dictionary
    holding those outputs."""
    params = [leaf for leaf in jax.tree.leaves(model) if fx.is_array(leaf)]
    ours = {"model": model, "state": OPTIMISER.init(fx.trainable(model))}
    floor = {"params": params, "state": OPTIMISER.init(params)}

    def ours_step() -> None:
        ours["model"], ours["state"], _ = train_step(ours["model"], ours["state"], x, y)

    def floor_train_step() -> None:
        floor["params"], floor["state"], _ = floor_step(
            floor["params"], floor["state"], x, y
        )

    return (ours_step, ours), (floor_train_step, floor)


def variants(n_arrays: int) -> dict[str, tuple[Callable[[], object], ...]]:
    x, y = jnp.ones(4), jnp.zeros(4)
    static_model = StaticActivation(make_layers(n_arrays), jax.nn.relu)
    field_model = FieldActivation(make_layers(n_arrays), jax.nn.relu)
    params = [leaf for leaf in jax.tree.leaves(field_model) if fx.is_array(leaf)]
    assert len(params) == n_arrays
    (ours_step, _), (floor_train_step, _) = adam_steps(field_model, x, y)
    mixed_model = make_mixed(n_arrays, with_ref=False)
    mixed_ref_model = make_mixed(n_arrays, with_ref=True)
    mixed_leaves = [*params, mixed_model.key, mixed_model.buffer.value]
    counter = jax.new_ref(jnp.zeros((), jnp.int32))

    return {
        "static field": (
            lambda: forward_static(static_model, x),
            lambda: floor_forward(params, x),
        ),
        "jax.jit, same Module": (
            lambda: jax_forward(static_model, x),
            lambda: floor_forward(params, x),
        ),
        "ordinary field": (
            lambda: forward_field(field_model, x),
            lambda: floor_forward(params, x),
        ),
        "adam step": (ours_step, floor_train_step),
        "returns its model": (
            lambda: identity(field_model),
            lambda: floor_identity(params),
        ),
        "mixed leaves": (
            lambda: forward_mixed(mixed_model, x),
            lambda: floor_mixed(mixed_leaves, x),
        ),
        "mixed leaves + Ref": (
            lambda: forward_mixed_ref(mixed_ref_model, x),
            lambda: floor_mixed_ref(mixed_leaves, counter, x),
        ),
    }


def bench(n_arrays: int, rounds: int, calls: int, clock: Callable[[], float]) -> None:
    print(f"N = {n_arrays} (per call: the row's call, then the flat-list floor)")
    for name, (ours, floor) in variants(n_arrays).items():
        for call in (ours, floor):  # compile, and warm up
            for _ in range(3):
                jax.block_until_ready(call())
        ours_times, floor_times = [], []
        for _ in range(rounds):
            ours_times.append(per_call_us(ours, calls, clock))
            floor_times.append(per_call_us(floor, calls, clock))
        low, floor_low = min(ours_times), min(floor_times)
        ratio_median = statistics.median(ours_times) / statistics.median(floor_times)
        print(
            f"  {name:20s} {low:8.1f} us  floor {floor_low:8.1f} us   "
            f"ratio min {low / floor_low:4.2f}x  median {ratio_median:4.2f}x"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--calls", type=int, default=100)
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="wall")
    parser.add_argument("--gc", choices=["on", "off"], default="on")
    options = parser.parse_args()
    print(
        f"jax {jax.__version__}, backend {jax.default_backend()}, "
        f"clock {options.clock}, gc {options.gc}"
    )
    if options.gc == "off":
        gc.collect()
        gc.disable()
    for n_arrays in (10, 64, 204):
        bench(n_arrays, options.rounds, options.calls, CLOCKS[options.clock])


if __name__ == "__main__":
    main()
