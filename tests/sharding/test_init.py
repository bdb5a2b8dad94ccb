"""`sharded_init`: constructors run compiled, each array made on its shard."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

import filterax as fx

KEY = jax.random.key(0)
RULES = {"heads": "model", "embed": "data", "stack": "data", "out": "model"}


def test_same_values_as_eager_on_their_shardings(mesh):
    make = fx.sharded_init(fx.nn.MultiheadAttention, mesh, RULES)
    with jax.set_mesh(mesh):
        model = make(2, 8, key=KEY)
    eager = fx.nn.MultiheadAttention(2, 8, key=KEY)
    assert fx.tree_equal(model, eager)
    assert model.query_proj.weight.sharding == NamedSharding(mesh, P("model", "data"))
    assert model.query_proj.weight.addressable_shards[0].data.shape == (4, 2)
    assert model.num_heads == 2 and model.dropout == eager.dropout


def test_vmapped_constructor(mesh):
    make = fx.sharded_init(
        fx.filter_vmap(lambda k: fx.nn.Linear(8, 4, key=k)), mesh, RULES
    )
    keys = jax.random.split(KEY, 4)
    stack = make(keys)
    assert stack.weight.sharding == NamedSharding(mesh, P("data", "model", None))
    assert stack.weight.addressable_shards[0].data.shape == (1, 2, 8)
    eager = fx.filter_vmap(lambda k: fx.nn.Linear(8, 4, key=k))(keys)
    assert fx.tree_equal(stack, eager)


def test_traced_once_abstractly_then_run_with_each_device_holding_its_shard(mesh):
    traced = []

    def make(key):
        traced.append(key)
        return fx.nn.Linear(64, 64, key=key)

    model = fx.sharded_init(make, mesh, {"out": "model", "in": "data"})(KEY)
    assert len(traced) == 2  # the abstract evaluation, then the compiled run
    assert {shard.data.shape for shard in model.weight.addressable_shards} == {(32, 16)}
    assert len({shard.device for shard in model.weight.addressable_shards}) == 8


def test_errors_before_computing(mesh):
    calls = []

    def make(key):
        calls.append(key)
        return fx.nn.Linear(4, 6, key=key)

    try:
        fx.sharded_init(make, mesh, {"out": "data"})(KEY)
    except ValueError as error:
        assert "tree.weight" in str(error)
    else:
        raise AssertionError("expected a ValueError")
    assert len(calls) == 1  # only the abstract evaluation ran


def test_static_parts_are_rebuilt(mesh):
    def make(key):
        return {"layer": fx.nn.Linear(4, 8, key=key), "name": "probe", "act": jnp.tanh}

    out = fx.sharded_init(make, mesh, RULES)(KEY)
    assert out["name"] == "probe" and out["act"] is jnp.tanh
    assert out["layer"].weight.sharding.spec == P("model", None)


def _layers(key: jax.Array) -> list:
    return [fx.nn.Linear(16, 16, key=k) for k in jax.random.split(key, 3)]


def _make_counted(traced: list) -> Any:
    def make(key):
        traced.append(key)
        return {"layers": _layers(key), "name": "probe"}

    return make


def test_built_in_stages_gives_the_same_values(mesh):
    traced: list = []
    make = _make_counted(traced)
    rules = {"out": "model", "in": "data"}
    with jax.set_mesh(mesh):
        staged = fx.sharded_init(make, mesh, rules, stages=2)(KEY)
        whole = fx.sharded_init(make, mesh, rules)(KEY)
    assert fx.tree_equal(staged, whole)
    assert fx.tree_equal(staged, make(KEY))
    assert staged["name"] == "probe"
    assert staged["layers"][2].weight.sharding == NamedSharding(
        mesh, P("model", "data")
    )
    # `make` runs twice per build (abstractly, then traced once for all the
    # stages), whatever the number of stages, and once eagerly above.
    assert len(traced) == 2 + 2 + 1


def test_one_stage_per_array_when_stages_outnumber_them():
    mesh = jax.make_mesh((4, 2), ("data", "model"))
    traced: list = []
    make = _make_counted(traced)
    staged = fx.sharded_init(make, mesh, {"out": "model"}, stages=100)(KEY)
    assert fx.tree_equal(staged, make(KEY))
    assert len(traced) == 2 + 1


def test_stage_groups_are_runs_of_about_equal_size():
    from filterax._sharding._init import _stage_groups

    assert _stage_groups([4, 4, 4, 4], 2) == [[0, 1], [2, 3]]
    assert _stage_groups([1, 10, 1, 1], 4) == [[0], [1], [2, 3]]
    assert _stage_groups([3, 3, 3], 1) == [[0, 1, 2]]
    assert _stage_groups([], 8) == []


@pytest.mark.parametrize("stages", [0, -1, 1.5, True])
def test_stages_must_be_a_positive_int(mesh, stages):
    with pytest.raises(ValueError, match="stages"):
        fx.sharded_init(fx.nn.Linear, mesh, {}, stages=stages)
