"""Data-parallel training over 8 (simulated) devices.

The batch is split across a one-dimensional device mesh along its leading
axis, while the model and the optimiser state are replicated on every device:
built together by `sharded_init` with no rules, which replicates every array.
`filterax.filter_shard` places the batch (it places, outside `filter_jit`, or
constrains, inside it, the array leaves of any pytree, Modules included; the
non-array leaves, like the activation function here, are left alone). The
training step is an ordinary `filter_jit` function, whose outputs keep the
layout of its inputs; XLA inserts the cross-device reduction of the gradients
itself.

To check the result, every step is also run on a single device, and the two
losses must agree to floating-point rounding.

On CPU the 8 devices are simulated; the first lines below must run before JAX
initialises its backends. On a machine with several accelerators, drop them.

    python examples/data_parallel.py [--small]
"""

import jax

jax.config.update("jax_num_cpu_devices", 8)

import argparse  # noqa: E402
import math  # noqa: E402
import sys  # noqa: E402
from collections.abc import Callable  # noqa: E402

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec  # noqa: E402

import filterax as fx  # noqa: E402


class Linear(fx.Module):
    weight: jax.Array
    bias: jax.Array

    def __init__(self, in_size: int, out_size: int, *, key: jax.Array):
        limit = 1 / math.sqrt(in_size)
        self.weight = jax.random.uniform(
            key, (out_size, in_size), minval=-limit, maxval=limit
        )
        self.bias = jnp.zeros(out_size)

    def __call__(self, x: jax.Array) -> jax.Array:
        return x @ self.weight.T + self.bias


class MLP(fx.Module):
    layers: list[Linear]
    activation: Callable[[jax.Array], jax.Array]

    def __init__(self, sizes: list[int], *, key: jax.Array):
        keys = jax.random.split(key, len(sizes) - 1)
        self.layers = [
            Linear(n_in, n_out, key=k)
            for n_in, n_out, k in zip(sizes[:-1], sizes[1:], keys)
        ]
        self.activation = jax.nn.silu

    def __call__(self, x: jax.Array) -> jax.Array:
        for layer in self.layers[:-1]:
            x = self.activation(layer(x))
        return self.layers[-1](x)


def loss_fn(model: MLP, x: jax.Array, y: jax.Array) -> jax.Array:
    return jnp.mean((model(x) - y) ** 2)


OPTIMISER = optax.adam(1e-2)


def step(model, opt_state, x, y):
    loss, grads = fx.filter_value_and_grad(loss_fn)(model, x, y)
    updates, opt_state = OPTIMISER.update(grads, opt_state)
    return fx.apply_updates(model, updates), opt_state, loss


def make_train_state(key: jax.Array) -> tuple[MLP, optax.OptState]:
    """The model and its optimiser state, built together (the one recipe of
    the sharded examples and docs)."""
    model = MLP([16, 128, 128, 1], key=key)
    return model, OPTIMISER.init(fx.filter(model, fx.is_inexact_array))


# One compiled step for both runs: arguments on the mesh give outputs on the
# mesh (each laid out like the argument it updates), arguments on one device
# outputs on that device.
train_step = fx.filter_jit(step)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", action="store_true", help="a quick run for CI")
    args = parser.parse_args(argv)
    steps = 20 if args.small else 300
    batch_size = 8 * 32

    devices = jax.devices()
    print(f"{len(devices)} devices: {devices}")
    if len(devices) < 8:
        print("FAILED: expected 8 devices", file=sys.stderr)
        return 1
    mesh = Mesh(np.array(devices[:8]), axis_names=("batch",))
    batch_sharded = NamedSharding(mesh, PartitionSpec("batch"))

    model_key, data_key, target_key = jax.random.split(jax.random.key(0), 3)
    true_weight = jax.random.normal(target_key, (16, 1)) / 4
    # Built on the mesh: with no rules, every array is replicated.
    model, opt_state = fx.sharded_init(make_train_state, mesh, {})(model_key)
    # The same model and optimiser state, on one device, to compare with.
    single = make_train_state(model_key)

    worst = 0.0
    for i in range(steps):
        data_key, x_key = jax.random.split(data_key)
        x = jax.random.normal(x_key, (batch_size, 16))
        y = jnp.tanh(x @ true_weight)

        x_sharded, y_sharded = fx.filter_shard((x, y), batch_sharded)
        model, opt_state, loss = train_step(model, opt_state, x_sharded, y_sharded)
        single_model, single_opt, single_loss = train_step(*single, x, y)
        single = (single_model, single_opt)

        difference = abs(float(loss) - float(single_loss)) / abs(float(single_loss))
        worst = max(worst, difference)
        if i % max(1, steps // 5) == 0 or i == steps - 1:
            print(
                f"step {i:4d}  loss {float(loss):.6f}  "
                f"single-device {float(single_loss):.6f}"
            )

    weight = model.layers[0].weight
    print(f"first-layer weight sharding: {weight.sharding.spec} (replicated)")
    count = opt_state[0].count
    print(f"optimiser step counter on {len(count.sharding.device_set)} devices")
    print(f"batch sharding: {x_sharded.sharding.spec}, shards of {batch_size // 8}")
    print(f"largest relative loss difference: {worst:.2e}")
    params_close = fx.tree_equal(model, single[0], rtol=1e-4, atol=1e-5)
    print(f"parameters match single-device run: {params_close}")
    laid_out = (
        weight.sharding.is_fully_replicated
        and len(weight.sharding.device_set) == 8
        and count.sharding.is_fully_replicated
        and len(count.sharding.device_set) == 8
    )
    if not (worst < 1e-4 and params_close and laid_out):
        print("FAILED", file=sys.stderr)
        return 1
    print("OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
