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
- `jax.jit, returns its model`: not filterax but `jax.jit` returning the
  static-field model: JAX's own cost of rebuilding nested Modules rather than a
  list, for comparison with the row above;
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

Then the **matrix** (issue 30), so that no shape of model is missed: every
Module class {plain, a static field holding a float / a function / a default,
a function in an ordinary field, a converter, a custom `__init__`,
`__check_init__`, a `NonDifferentiable` buffer, a `jax.Ref`} x every container
of the layers {tuple, list, dict, nested Modules} x every way of handing the
model to `filter_jit` {function, lambda, closure, the Module itself, a bound
method, `filter_jit` as a decorator on a method}. Each row gives the dispatch
ratio to the flat-list floor, `jax.jit` called on the same pytree (the share
that is JAX's own cost of nested nodes; `n/a` where JAX cannot take a
function leaf), and flatten and unflatten as ratios to the same tree of
`jax.tree_util.register_dataclass` classes.

Run: `python benchmarks/bench_dispatch.py [--rounds R] [--calls C] [--clock C]
[--gc on|off] [--only rows|matrix] [--quick]` (`--quick`: N = 64 only and
fewer rounds).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import gc
import statistics
import time
import timeit
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
jax_identity = jax.jit(lambda model: model)


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
        "jax.jit, returns its model": (
            lambda: jax_identity(static_model),
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


# --- The matrix: every shape of Module, container and callable -------------------
#
# Issue 30: a benchmark of a few shapes missed the slow ones. Each row below is a
# Module class (how a layer keeps its values), a container (how the model holds
# its layers) and a callable (how it is handed to `filter_jit`).


def _relu(x: jax.Array) -> jax.Array:
    return jax.nn.relu(x)


class PlainLayer(fx.Module):
    weight: jax.Array
    bias: jax.Array

    def __call__(self, x: jax.Array) -> jax.Array:
        return jax.nn.relu(self.weight @ x + self.bias)


class StaticFloatLayer(fx.Module):
    weight: jax.Array
    bias: jax.Array
    scale: float = fx.field(static=True)

    def __call__(self, x: jax.Array) -> jax.Array:
        return jax.nn.relu(self.weight @ x + self.bias) * self.scale


class StaticFunctionLayer(fx.Module):
    weight: jax.Array
    bias: jax.Array
    activation: Callable = fx.field(static=True)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.activation(self.weight @ x + self.bias)


class StaticDefaultLayer(fx.Module):
    weight: jax.Array
    bias: jax.Array
    activation: Callable = fx.field(static=True, default=jax.nn.relu)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.activation(self.weight @ x + self.bias)


class FunctionFieldLayer(fx.Module):
    weight: jax.Array
    bias: jax.Array
    activation: Callable

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.activation(self.weight @ x + self.bias)


class ConverterLayer(fx.Module):
    weight: jax.Array
    bias: jax.Array = fx.field(converter=jnp.asarray)

    def __call__(self, x: jax.Array) -> jax.Array:
        return jax.nn.relu(self.weight @ x + self.bias)


class CustomInitLayer(fx.Module):
    weight: jax.Array
    bias: jax.Array

    def __init__(self, weight: jax.Array, bias: jax.Array, unused: int = 0):
        self.weight = weight
        self.bias = bias

    def __call__(self, x: jax.Array) -> jax.Array:
        return jax.nn.relu(self.weight @ x + self.bias)


class CheckInitLayer(fx.Module):
    weight: jax.Array
    bias: jax.Array

    def __check_init__(self) -> None:
        if self.weight.ndim != 2:
            raise ValueError("weight must be a matrix")

    def __call__(self, x: jax.Array) -> jax.Array:
        return jax.nn.relu(self.weight @ x + self.bias)


class BufferLayer(fx.Module):
    weight: jax.Array
    bias: fx.NonDifferentiable

    def __call__(self, x: jax.Array) -> jax.Array:
        return jax.nn.relu(self.weight @ x + self.bias.value)


class RefLayer(fx.Module):
    weight: jax.Array
    bias: jax.Ref

    def __call__(self, x: jax.Array) -> jax.Array:
        return jax.nn.relu(self.weight @ x + self.bias[...])


def _layer(kind: str, weight: jax.Array, bias: jax.Array) -> fx.Module:
    """One layer of the matrix's class `kind`, holding two arrays."""
    if kind == "plain":
        return PlainLayer(weight, bias)
    if kind == "static float":
        return StaticFloatLayer(weight, bias, 1.0)
    if kind == "static function":
        return StaticFunctionLayer(weight, bias, jax.nn.relu)
    if kind == "static default":
        return StaticDefaultLayer(weight, bias)
    if kind == "function field":
        return FunctionFieldLayer(weight, bias, jax.nn.relu)
    if kind == "converter":
        return ConverterLayer(weight, bias)
    if kind == "custom __init__":
        return CustomInitLayer(weight, bias)
    if kind == "__check_init__":
        return CheckInitLayer(weight, bias)
    if kind == "NonDifferentiable":
        return BufferLayer(weight, fx.NonDifferentiable(bias))
    if kind == "jax.Ref":
        return RefLayer(weight, jax.new_ref(bias))
    raise ValueError(kind)


LAYER_KINDS = (
    "plain",
    "static float",
    "static function",
    "static default",
    "function field",
    "converter",
    "custom __init__",
    "__check_init__",
    "NonDifferentiable",
    "jax.Ref",
)


class Forwards(fx.Module):
    """The two method rows of the matrix: a bound method, and `filter_jit` as a
    decorator on a method."""

    def forward(self, x: jax.Array) -> jax.Array:
        return self(x)  # type: ignore[operator]

    @fx.filter_jit
    def compiled_forward(self, x: jax.Array) -> jax.Array:
        return self(x)  # type: ignore[operator]


class Stack(Forwards):
    """A model holding its layers in a tuple, a list or a dict."""

    layers: Any

    def __call__(self, x: jax.Array) -> jax.Array:
        layers = self.layers
        for layer in layers.values() if isinstance(layers, dict) else layers:
            x = layer(x)
        return x


class Chain(Forwards):
    """A model of nested Modules: a layer, then the rest of the chain."""

    layer: Any  # a layer of the matrix: a callable Module
    rest: Chain | None

    def __call__(self, x: jax.Array) -> jax.Array:
        node: Chain | None = self
        while node is not None:
            x = node.layer(x)
            node = node.rest
        return x


CONTAINERS = ("tuple", "list", "dict", "nested Modules")
CALLABLES = (
    "function",
    "lambda",
    "closure",
    "Module",
    "bound method",
    "filter_jit method",
)


def make_model(kind: str, container: str, n_arrays: int) -> Stack | Chain:
    """A model of `n_arrays // 2` layers of class `kind`, held as `container`."""
    layers = [
        _layer(kind, jnp.full((4, 4), 0.01 * i), jnp.full((4,), 0.01))
        for i in range(n_arrays // 2)
    ]
    if container == "tuple":
        return Stack(tuple(layers))
    if container == "list":
        return Stack(layers)
    if container == "dict":
        return Stack({f"layer{i:03d}": layer for i, layer in enumerate(layers)})
    chain = None
    for layer in reversed(layers):
        chain = Chain(layer, chain)
    assert chain is not None
    return chain


def matrix_call(
    model: Stack | Chain, how: str
) -> tuple[Callable[[jax.Array], object], Any]:
    """`model`'s forward pass through `filter_jit`, handed over as `how`, and
    the `filter_jit` wrapper it calls: a fresh one each time (but for the
    decorated method, one per class), so that rows never share routes."""
    if how == "function":
        f = fx.filter_jit(apply)
        return functools.partial(f, model), f
    if how == "lambda":
        f = fx.filter_jit(lambda model, x: model(x))
        return functools.partial(f, model), f
    if how == "closure":
        scale = 1.0

        def closure(model: Any, x: jax.Array) -> jax.Array:
            return model(x) * scale

        f = fx.filter_jit(closure)
        return functools.partial(f, model), f
    if how == "Module":
        f = fx.filter_jit(model)
        return f, f
    if how == "bound method":
        f = fx.filter_jit(model.forward)
        return f, f
    if how == "filter_jit method":
        return model.compiled_forward, type(model).compiled_forward
    raise ValueError(how)


def matrix_floor(model: Any) -> tuple[Callable[[jax.Array], object], list[Any]]:
    """`jax.jit` of the same forward pass on the flat list of the model's
    arrays (and Refs), and that list."""
    leaves, treedef = jax.tree.flatten(model)
    dynamic = [leaf for leaf in leaves if fx.is_array(leaf) or fx.is_ref(leaf)]
    mask = [fx.is_array(leaf) or fx.is_ref(leaf) for leaf in leaves]
    static = [leaf for leaf, keep in zip(leaves, mask) if not keep]

    @jax.jit
    def floor(dynamic: list[Any], x: jax.Array) -> jax.Array:
        dynamic_iter, static_iter = iter(dynamic), iter(static)
        merged = [next(dynamic_iter) if keep else next(static_iter) for keep in mask]
        return jax.tree.unflatten(treedef, merged)(x)

    return (lambda x: floor(dynamic, x)), dynamic


def jax_jit_same_pytree(model: Any) -> Callable[[jax.Array], object] | None:
    """`jax.jit` called on the model itself, for comparison; `None` where JAX
    cannot take it (a function leaf)."""
    if not all(fx.is_array(leaf) or fx.is_ref(leaf) for leaf in jax.tree.leaves(model)):
        return None
    f = jax.jit(apply)
    return lambda x: f(model, x)


_MIRRORS: dict[type, type] = {}


def mirror(tree: Any) -> Any:
    """`tree` with every Module replaced by an instance of a frozen dataclass
    with the same fields, registered with `jax.tree_util.register_dataclass`:
    the reference for flattening and unflattening."""
    if isinstance(tree, fx.Module):
        cls = type(tree)
        twin = _MIRRORS.get(cls)
        names = [f.name for f in dataclasses.fields(cls)]
        if twin is None:
            twin = dataclasses.make_dataclass(
                f"Registered{cls.__name__}",
                [(name, Any) for name in names],
                frozen=True,
            )
            static = [
                f.name for f in dataclasses.fields(cls) if f.metadata.get("static")
            ]
            jax.tree_util.register_dataclass(
                twin,
                data_fields=[name for name in names if name not in static],
                meta_fields=static,
            )
            _MIRRORS[cls] = twin
        return twin(**{name: mirror(getattr(tree, name)) for name in names})
    if type(tree) in (list, tuple):
        return type(tree)(mirror(item) for item in tree)
    if type(tree) is dict:
        return {key: mirror(value) for key, value in tree.items()}
    return tree


def tree_times(tree: Any, rounds: int, number: int) -> tuple[float, float]:
    """Best seconds per flatten and per unflatten of `tree`."""
    leaves, treedef = jax.tree.flatten(tree)
    flatten = min(
        timeit.repeat(lambda: jax.tree.flatten(tree), number=number, repeat=rounds)
    )
    unflatten = min(
        timeit.repeat(lambda: treedef.unflatten(leaves), number=number, repeat=rounds)
    )
    return flatten / number, unflatten / number


def _dispatch_us(
    calls: list[Callable[[], object]], rounds: int, n: int, clock: Callable[[], float]
) -> list[float]:
    """Best per-call time of each of `calls`, their rounds interleaved."""
    for call in calls:
        for _ in range(3):
            jax.block_until_ready(call())
    best = [float("inf")] * len(calls)
    for _ in range(rounds):
        for i, call in enumerate(calls):
            best[i] = min(best[i], per_call_us(call, n, clock))
    return best


def matrix(
    sizes: tuple[int, ...], rounds: int, calls: int, clock: Callable[[], float]
) -> None:
    """Prints the matrix: per row, `filter_jit`'s dispatch and `jax.jit` on the
    same pytree as ratios to the flat-list floor, and flatten and unflatten as
    ratios to the same tree of `register_dataclass` classes."""
    x = jnp.ones(4)
    targets = {10: 1.25}
    for n_arrays in sizes:
        target = targets.get(n_arrays, 1.10)
        print(
            f"matrix, N = {n_arrays} (ratios to the floor, min of {rounds} rounds; "
            f"dispatch target {target}x, flatten 1.05x (1.10x converter and "
            "__check_init__), unflatten 1.00x)"
        )
        print(
            f"  {'class':18s} {'container':15s} {'callable':18s} {'dispatch':>8s} "
            f"{'jax.jit':>8s} {'flatten':>8s} {'unflat':>8s}"
        )
        for kind in LAYER_KINDS:
            for container in CONTAINERS:
                model = make_model(kind, container, n_arrays)
                ours_tree = tree_times(model, rounds, 50)
                ref_tree = tree_times(mirror(model), rounds, 50)
                floor, _ = matrix_floor(model)
                same = jax_jit_same_pytree(model)
                for how in CALLABLES:
                    ours, _ = matrix_call(model, how)
                    row = [functools.partial(ours, x), functools.partial(floor, x)]
                    if same is not None:
                        row.append(functools.partial(same, x))
                    times = _dispatch_us(row, rounds, calls, clock)
                    jax_text = f"{times[2] / times[1]:7.2f}x" if same else "     n/a"
                    print(
                        f"  {kind:18s} {container:15s} {how:18s} "
                        f"{times[0] / times[1]:7.2f}x {jax_text} "
                        f"{ours_tree[0] / ref_tree[0]:7.2f}x "
                        f"{ours_tree[1] / ref_tree[1]:7.2f}x"
                    )
                # Every row compiles a few programs; freed here, since XLA:CPU
                # maps memory for each, and the whole matrix (several thousand
                # programs) would otherwise run out of memory mappings.
                fx.clear_caches()


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--calls", type=int, default=100)
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="wall")
    parser.add_argument("--gc", choices=["on", "off"], default="on")
    parser.add_argument(
        "--only",
        choices=["rows", "matrix"],
        default=None,
        help="run only the named rows or only the matrix (default: both)",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="N = 64 only, 5 rounds of 30 calls: about two minutes",
    )
    options = parser.parse_args()
    sizes = (10, 64, 204)
    if options.quick:
        sizes, options.rounds, options.calls = (64,), 5, 30
    print(
        f"jax {jax.__version__}, backend {jax.default_backend()}, "
        f"clock {options.clock}, gc {options.gc}"
    )
    if options.gc == "off":
        gc.collect()
        gc.disable()
    clock = CLOCKS[options.clock]
    if options.only != "matrix":
        for n_arrays in sizes:
            bench(n_arrays, options.rounds, options.calls, clock)
    if options.only != "rows":
        matrix(sizes, options.rounds, options.calls, clock)


if __name__ == "__main__":
    main()
