"""A sharded Adam training step: `filter_jit(in_shardings=, out_shardings=)`
against `jax.jit` with the same shardings on the same arrays.

On 8 simulated CPU devices, a mesh of 4 (`"data"`) x 2 (`"model"`): an MLP
whose hidden layers are split over `"model"` (the first layer's weight by
columns, the second's by rows, Megatron style) and a batch split over
`"data"`. The filterax side is a Module holding its activation function (the
keyed route), its optimiser state built by `filter_jit(optimiser.init,
in_shardings=...)`, the step `filter_value_and_grad` plus optax; the `jax.jit`
side is the same step written on a dict of the same arrays, with its
optimiser state placed by hand (`count` replicated on the mesh). A third side,
`plain`, is the filterax step with no shardings given at all: a plain
`filter_jit`, its optimiser state from `filter_jit(optimiser.init)(params)`,
relying on `filter_jit` laying out each output like the argument it updates.

Printed: the time per step of each (the minimum over interleaved rounds, so
that drifts in machine load hit both alike), their ratio, and the backend
compilations each side made over its first steps and over all the timed
rounds (counted with `jax.monitoring`, not timed). No assertion is made.

Run: `python benchmarks/bench_sharded_step.py [--rounds R] [--steps S]
[--width W] [--batch B]`.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from typing import Any

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import jax  # noqa: E402 - the device count is set before JAX starts
import jax.monitoring  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import optax  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec as P  # noqa: E402

import filterax as fx  # noqa: E402

_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
_COMPILATIONS = [0]


def _count(event: str, duration: float, **kwargs: Any) -> None:
    if event == _COMPILE_EVENT:
        _COMPILATIONS[0] += 1


jax.monitoring.register_event_duration_secs_listener(_count)


class Linear(fx.Module):
    weight: jax.Array
    bias: jax.Array

    def __call__(self, x: jax.Array) -> jax.Array:
        return x @ self.weight + self.bias


class MLP(fx.Module):
    first: Linear
    second: Linear
    activation: Callable[[jax.Array], jax.Array] = jax.nn.gelu

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.second(self.activation(self.first(x)))


def make_model(width: int, key: jax.Array) -> MLP:
    k1, k2 = jax.random.split(key)
    return MLP(
        Linear(
            jax.random.normal(k1, (width, 4 * width)) / width**0.5, jnp.zeros(4 * width)
        ),
        Linear(
            jax.random.normal(k2, (4 * width, width)) / (4 * width) ** 0.5,
            jnp.zeros(width),
        ),
    )


def model_shardings(mesh: jax.sharding.Mesh) -> MLP:
    def s(*spec: Any) -> NamedSharding:
        return NamedSharding(mesh, P(*spec))

    return MLP(
        Linear(s(None, "model"), s("model")), Linear(s("model", None), s()), None
    )  # type: ignore[arg-type]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--batch", type=int, default=512)
    options = parser.parse_args()

    mesh = jax.make_mesh(
        (4, 2), ("data", "model"), axis_types=(jax.sharding.AxisType.Auto,) * 2
    )
    rows = NamedSharding(mesh, P("data"))
    shardings = model_shardings(mesh)
    optimiser = optax.adam(1e-3)
    key_model, key_x = jax.random.split(jax.random.key(0))
    model = fx.filter_shard(make_model(options.width, key_model), shardings)
    x = jax.device_put(jax.random.normal(key_x, (options.batch, options.width)), rows)
    y = jax.device_put(jnp.zeros((options.batch, options.width)), rows)

    # --- filterax ---
    params = fx.filter(model, fx.is_array)
    opt_state = fx.filter_jit(optimiser.init, in_shardings=((shardings,), None))(params)

    @fx.filter_jit(
        in_shardings=((shardings, None, rows, rows), None),
        out_shardings=(shardings, None, None),
    )
    def fx_step(model: MLP, opt_state: Any, x: jax.Array, y: jax.Array) -> Any:
        def loss(model: MLP) -> jax.Array:
            return jnp.mean((model(x) - y) ** 2)

        value, grads = fx.filter_value_and_grad(loss)(model)
        updates, opt_state = optimiser.update(
            grads, opt_state, fx.filter(model, fx.is_array)
        )
        return fx.apply_updates(model, updates), opt_state, value

    # --- filterax without shardings: the arguments' layout is followed ---
    plain_state = fx.filter_jit(optimiser.init)(params)

    @fx.filter_jit
    def plain_step(model: MLP, opt_state: Any, x: jax.Array, y: jax.Array) -> Any:
        def loss(model: MLP) -> jax.Array:
            return jnp.mean((model(x) - y) ** 2)

        value, grads = fx.filter_value_and_grad(loss)(model)
        updates, opt_state = optimiser.update(
            grads, opt_state, fx.filter(model, fx.is_array)
        )
        return fx.apply_updates(model, updates), opt_state, value

    # --- jax.jit, on a dict of the same arrays ---
    flat_shardings = {
        "w1": shardings.first.weight,
        "b1": shardings.first.bias,
        "w2": shardings.second.weight,
        "b2": shardings.second.bias,
    }
    flat = {
        "w1": model.first.weight,
        "b1": model.first.bias,
        "w2": model.second.weight,
        "b2": model.second.bias,
    }
    flat_state = optimiser.init(flat)
    replicated = NamedSharding(mesh, P())
    flat_state = (
        flat_state[0]._replace(count=jax.device_put(flat_state[0].count, replicated)),
        flat_state[1],
    )
    state_shardings = jax.tree.map(lambda leaf: leaf.sharding, flat_state)

    def jax_loss(params: dict, x: jax.Array, y: jax.Array) -> jax.Array:
        hidden = jax.nn.gelu(x @ params["w1"] + params["b1"])
        return jnp.mean((hidden @ params["w2"] + params["b2"] - y) ** 2)

    def jax_step_body(params: dict, opt_state: Any, x: jax.Array, y: jax.Array) -> Any:
        value, grads = jax.value_and_grad(jax_loss)(params, x, y)
        updates, opt_state = optimiser.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, value

    jax_step = jax.jit(
        jax_step_body,
        in_shardings=(flat_shardings, state_shardings, rows, rows),
        out_shardings=(flat_shardings, state_shardings, replicated),
    )

    sides: dict[str, list[Any]] = {
        "filter_jit": [fx_step, model, opt_state],
        "plain": [plain_step, model, plain_state],
        "jax.jit": [jax_step, flat, flat_state],
    }
    first_compilations = {}
    for name, side in sides.items():
        before = _COMPILATIONS[0]
        for _ in range(3):
            side[1], side[2], value = side[0](side[1], side[2], x, y)
        jax.block_until_ready(value)
        first_compilations[name] = _COMPILATIONS[0] - before

    times: dict[str, list[float]] = {name: [] for name in sides}
    timed_compilations = dict.fromkeys(sides, 0)
    for round_index in range(options.rounds):
        # Rotating which side goes first, so that none always runs right
        # after another's work.
        order = list(sides.items())
        shift = round_index % len(order)
        for name, side in order[shift:] + order[:shift]:
            before = _COMPILATIONS[0]
            start = time.perf_counter()
            for _ in range(options.steps):
                side[1], side[2], value = side[0](side[1], side[2], x, y)
            jax.block_until_ready((side[1], value))
            times[name].append((time.perf_counter() - start) / options.steps)
            timed_compilations[name] += _COMPILATIONS[0] - before

    print(
        f"jax {jax.__version__}, {jax.device_count()} devices, mesh 4 (data) x 2 (model), "
        f"width {options.width}, batch {options.batch}"
    )
    for name in sides:
        print(
            f"  {name:<11} {min(times[name]) * 1e3:8.2f} ms/step   compilations: "
            f"{first_compilations[name]} over the first 3 steps, "
            f"{timed_compilations[name]} over {options.rounds * options.steps} more"
        )
    for name in ("filter_jit", "plain"):
        ratio = min(times[name]) / min(times["jax.jit"])
        print(
            f"  ratio {name} / jax.jit (min over {options.rounds} rounds): {ratio:.3f}x"
        )


if __name__ == "__main__":
    main()
