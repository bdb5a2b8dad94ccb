"""`filter_jit` and `filter_shard` across the 8 simulated CPU devices: data
parallelism gives the same numbers as one device."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

import filterax as fx

N_DEVICES = 8


class Linear(fx.Module):
    weight: jax.Array
    bias: jax.Array

    def __call__(self, x):
        return self.weight @ x + self.bias


class MLP(fx.Module):
    layers: tuple[Linear, ...]
    activation: str = fx.field(static=True, default="tanh")

    def __call__(self, x):
        for layer in self.layers[:-1]:
            x = getattr(jnp, self.activation)(layer(x))
        return self.layers[-1](x)


def make_mlp(key, sizes=(3, 16, 16, 1)) -> MLP:
    keys = jax.random.split(key, len(sizes) - 1)
    layers = tuple(
        Linear(
            jax.random.normal(k, (n_out, n_in)) / np.sqrt(n_in),
            jnp.full((n_out,), 0.1),
        )
        for k, n_in, n_out in zip(keys, sizes[:-1], sizes[1:])
    )
    return MLP(layers)


def loss_fn(model: MLP, x: jax.Array, y: jax.Array) -> jax.Array:
    prediction = jax.vmap(model)(x)[:, 0]
    return jnp.mean((prediction - y) ** 2)


@fx.filter_jit
def train_step(model: MLP, x: jax.Array, y: jax.Array, learning_rate: float):
    loss, grads = fx.filter_value_and_grad(loss_fn)(model, x, y)
    new_model = jax.tree.map(lambda p, g: p - learning_rate * g, model, grads)
    return new_model, loss, grads


@pytest.fixture
def mesh():
    assert jax.device_count() == N_DEVICES, "the root conftest sets 8 devices"
    return jax.make_mesh(
        (N_DEVICES,), ("data",), axis_types=(jax.sharding.AxisType.Auto,)
    )


@pytest.fixture
def data():
    key_x, key_y = jax.random.split(jax.random.key(1))
    x = jax.random.normal(key_x, (64, 3))
    y = jnp.sin(x.sum(axis=1)) + 0.1 * jax.random.normal(key_y, (64,))
    return x, y


def test_data_parallel_step_matches_one_device(mesh, data):
    model = make_mlp(jax.random.key(0))
    x, y = data
    one_device = jax.devices()[0]
    single_model, single_loss, single_grads = train_step(
        fx.filter_shard(model, one_device),
        *fx.filter_shard((x, y), one_device),
        0.1,
    )

    replicated = NamedSharding(mesh, P())
    batch_sharded = NamedSharding(mesh, P("data"))
    sharded_model = fx.filter_shard(model, replicated)
    sharded_x, sharded_y = fx.filter_shard((x, y), batch_sharded)
    assert len(sharded_x.addressable_shards) == N_DEVICES
    assert sharded_x.addressable_shards[0].data.shape == (64 // N_DEVICES, 3)

    new_model, loss, grads = train_step(sharded_model, sharded_x, sharded_y, 0.1)

    np.testing.assert_allclose(loss, single_loss, rtol=1e-5)
    for got, want in zip(jax.tree.leaves(grads), jax.tree.leaves(single_grads)):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)
    for got, want in zip(jax.tree.leaves(new_model), jax.tree.leaves(single_model)):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)
    # Parameters stay replicated over every device; static fields survive.
    assert new_model.activation == "tanh"
    for leaf in jax.tree.leaves(new_model):
        assert leaf.sharding.is_fully_replicated
        assert len(leaf.sharding.device_set) == N_DEVICES


def test_repeated_sharded_steps_do_not_recompile(mesh, data):
    traces = []

    @fx.filter_jit
    def step(model, x, y):
        traces.append(None)
        return loss_fn(model, x, y)

    replicated = NamedSharding(mesh, P())
    batch_sharded = NamedSharding(mesh, P("data"))
    x, y = fx.filter_shard(data, batch_sharded)
    for seed in range(3):
        model = fx.filter_shard(make_mlp(jax.random.key(seed)), replicated)
        step(model, x, y)
    assert len(traces) == 1


def test_filter_jit_keeps_input_shardings_through_elementwise_ops(mesh):
    batch_sharded = NamedSharding(mesh, P("data"))
    x = fx.filter_shard(jnp.arange(32.0).reshape(16, 2), batch_sharded)

    @fx.filter_jit
    def double(x, label):
        return 2 * x, label

    out, label = double(x, "doubled")
    assert out.sharding.is_equivalent_to(batch_sharded, out.ndim)
    assert label == "doubled"
    np.testing.assert_allclose(out, 2 * np.arange(32.0).reshape(16, 2))


def test_filter_shard_inside_filter_jit_sets_output_sharding(mesh):
    batch_sharded = NamedSharding(mesh, P("data"))

    @fx.filter_jit
    def make_batch(n):
        return fx.filter_shard({"x": jnp.ones((n, 4)), "n": n}, batch_sharded)

    batch = make_batch(16)
    assert batch["n"] == 16
    assert batch["x"].sharding.is_equivalent_to(batch_sharded, 2)


def test_donated_sharded_inputs_are_deleted(mesh):
    batch_sharded = NamedSharding(mesh, P("data"))
    x = fx.filter_shard(jnp.ones((16, 2)), batch_sharded)
    fx.filter_jit(lambda a: a + 1, donate="all")(x)
    assert x.is_deleted()
