"""Behaviour of `filterax.filter_shard`, on the 8 simulated CPU devices."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

import filterax as fx


@pytest.fixture
def mesh():
    assert jax.device_count() == 8, "the root conftest sets 8 devices"
    return jax.make_mesh((8,), ("data",))


class Model(fx.Module):
    weight: jax.Array
    bias: jax.Array
    activation: str = "relu"


def test_places_every_array_and_leaves_the_rest_alone(mesh):
    replicated = NamedSharding(mesh, P())
    model = Model(jnp.ones((4, 4)), jnp.zeros(4))
    placed = fx.filter_shard(model, replicated)
    assert placed.weight.sharding == replicated
    assert placed.bias.sharding == replicated
    assert placed.activation == "relu"
    np.testing.assert_allclose(placed.weight, model.weight)


def test_a_prefix_of_shardings_with_none_to_skip(mesh):
    rows = NamedSharding(mesh, P("data"))
    batch = {"x": jnp.ones((16, 3)), "y": jnp.ones(16), "mask": jnp.ones(5)}
    placed = fx.filter_shard(batch, {"x": rows, "y": rows, "mask": None})
    assert placed["x"].sharding == rows and placed["y"].sharding == rows
    assert placed["mask"] is batch["mask"]
    assert placed["x"].addressable_shards[0].data.shape == (2, 3)


def test_numpy_arrays_become_sharded_jax_arrays(mesh):
    rows = NamedSharding(mesh, P("data"))
    placed = fx.filter_shard([np.arange(8.0), "label", 3], rows)
    assert isinstance(placed[0], jax.Array) and placed[0].sharding == rows
    assert placed[1:] == ["label", 3]


def test_a_device_places_on_that_device():
    device = jax.devices()[3]
    placed = fx.filter_shard({"a": jnp.ones(2), "b": None, "c": 1.5}, device)
    assert placed["a"].devices() == {device}
    assert placed["b"] is None and placed["c"] == 1.5


def _primitives(jaxpr) -> set[str]:
    """Every primitive of a jaxpr, those of nested jaxprs (a nested `jit`) too."""
    names = set()
    for equation in jaxpr.eqns:
        names.add(equation.primitive.name)
        for param in equation.params.values():
            inner = getattr(param, "jaxpr", param)
            if hasattr(inner, "eqns"):
                names |= _primitives(inner)
    return names


@pytest.mark.parametrize("axis_type", ["Auto", "Explicit"])
def test_inside_jit_constrains_tracers(axis_type):
    kind = getattr(jax.sharding.AxisType, axis_type)
    mesh = jax.make_mesh((8,), ("data",), axis_types=(kind,))
    rows = NamedSharding(mesh, P("data"))

    @fx.filter_jit
    def f(x, label):
        y = fx.filter_shard({"y": x * 2, "label": label}, rows)
        return y["y"], y["label"]

    # Explicit mesh axes need a mesh context for unsharded inputs.
    with jax.set_mesh(mesh):
        jaxpr = jax.make_jaxpr(lambda x: f(x, "l")[0])(jnp.ones(16))
        out, label = f(jnp.ones(16), "l")
    assert _primitives(jaxpr.jaxpr) & {"sharding_constraint", "reshard"}
    assert out.sharding == rows and label == "l"


def test_not_a_prefix_names_where(mesh):
    rows = NamedSharding(mesh, P("data"))
    with pytest.raises(ValueError, match=r"filter_shard: sharding.*prefix.*pytree"):
        fx.filter_shard({"x": jnp.ones(8)}, {"y": rows})


# --- a tree of shardings from `sharding_of` (prefix, `None` leaves as is) ---


@pytest.mark.parametrize(
    "kind", [AxisType.Auto, AxisType.Explicit], ids=["auto", "explicit"]
)
def test_tree_of_shardings_eagerly_and_under_filter_jit(kind):
    mesh = jax.make_mesh((4, 2), ("data", "model"), axis_types=(kind, kind))
    model = fx.nn.MultiheadAttention(2, 8, key=jax.random.key(0))
    shardings = fx.sharding_of(model, mesh, {"heads": "model", "embed": "data"})
    placed = fx.filter_shard(model, shardings)
    assert placed.query_proj.weight.sharding.spec == P("model", "data")
    assert placed.dropout == model.dropout

    @fx.filter_jit
    def constrained(model):
        return fx.filter_shard(model, shardings)

    with jax.set_mesh(mesh):
        out = constrained(model)
    assert out.output_proj.weight.sharding.spec == P("data", "model")


def test_prefix_with_none_leaves_parts_as_they_are():
    mesh = jax.make_mesh((8,), ("data",), axis_types=(AxisType.Auto,))
    rows = NamedSharding(mesh, P("data"))
    tree = {"a": jnp.zeros(8), "b": (jnp.zeros(8), jnp.ones(8))}
    placed = fx.filter_shard(tree, {"a": rows, "b": None})
    assert placed["a"].sharding == rows
    assert placed["b"][0] is tree["b"][0]


def test_abstract_arrays_get_the_sharding():
    mesh = jax.make_mesh((4, 2), ("data", "model"), axis_types=(AxisType.Auto,) * 2)
    abstract = fx.filter_eval_shape(fx.nn.Linear, 4, 8, key=jax.random.key(0))
    template = fx.filter_shard(
        abstract, fx.sharding_of(abstract, mesh, {"out": "model"})
    )
    assert template.weight == jax.ShapeDtypeStruct(
        (8, 4), jnp.float32, sharding=NamedSharding(mesh, P("model", None))
    )
