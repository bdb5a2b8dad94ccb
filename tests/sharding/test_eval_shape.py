"""`filter_eval_shape` keeps shardings (on `Auto` and `Explicit` axes) and turns
`jax.Ref`s into structs with `is_ref`, never leaking a tracer."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P

import filterax as fx

KEY = jax.random.key(0)


def test_passed_through_inputs_keep_their_sharding(mesh):
    model = fx.nn.Linear(4, 8, key=KEY)
    model = fx.filter_shard(model, fx.sharding_of(model, mesh, {"out": "model"}))
    abstract = fx.filter_eval_shape(lambda m: m, model)
    assert abstract.weight.sharding == NamedSharding(mesh, P("model", None))
    assert isinstance(abstract.weight.sharding.mesh, jax.sharding.Mesh)


def test_sharded_init_gives_a_concrete_sharded_template(mesh):
    make = fx.sharded_init(fx.nn.Linear, mesh, {"out": "model"})
    abstract = fx.filter_eval_shape(make, 4, 8, key=KEY)
    assert abstract.weight.sharding == NamedSharding(mesh, P("model", None))
    assert abstract.bias.sharding == NamedSharding(mesh, P("model"))


def test_constrained_outputs_keep_their_sharding(mesh):
    rows = NamedSharding(mesh, P("data"))
    with jax.set_mesh(mesh):
        out = fx.filter_eval_shape(lambda x: fx.filter_shard(x * 2, rows), jnp.zeros(8))
    assert out.sharding == rows


def test_explicit_axes_give_the_concrete_mesh():
    mesh = jax.make_mesh(
        (4, 2), ("data", "model"), axis_types=(jax.sharding.AxisType.Explicit,) * 2
    )
    x = jax.device_put(jnp.zeros((8, 2)), NamedSharding(mesh, P("data")))
    out = fx.filter_eval_shape(lambda x: x + 1, x)
    assert out.sharding == NamedSharding(mesh, P("data", None))
    assert out.sharding.is_fully_addressable


def test_auto_axes_leave_computed_outputs_to_the_compiler():
    mesh = jax.make_mesh((8,), ("data",), axis_types=(jax.sharding.AxisType.Auto,))
    x = jax.device_put(jnp.zeros(8), NamedSharding(mesh, P("data")))
    assert fx.filter_eval_shape(lambda x: x + 1, x).sharding is None


class Counter(fx.Module):
    count: Any
    size: int = fx.field(static=True)

    def __init__(self, size):
        self.count = jax.new_ref(jnp.zeros(size))
        self.size = size


def test_refs_made_inside_become_structs():
    abstract = fx.filter_eval_shape(Counter, 3)
    assert abstract.count == jax.ShapeDtypeStruct((3,), jnp.float32, is_ref=True)
    assert abstract.size == 3


def test_refs_passed_in_are_traced_and_come_out_as_structs():
    def bump(counter):
        counter.count[...] += 1
        return counter

    counter = Counter(2)
    abstract = fx.filter_eval_shape(bump, counter)
    assert abstract.count.is_ref and abstract.count.shape == (2,)
    assert (counter.count[...] == 0).all()  # nothing ran
    again = fx.filter_eval_shape(bump, abstract)
    assert again.count.is_ref
