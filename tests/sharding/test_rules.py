"""`sharding_of`: logical-name and key-path rules to `NamedSharding`s, and the
errors raised, naming the key path, before anything is placed."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

import filterax as fx

KEY = jax.random.key(0)


def _specs(shardings):
    return jax.tree.map(lambda s: s.spec, shardings)


def test_logical_names_map_to_mesh_axes(mesh):
    attention = fx.nn.MultiheadAttention(4, 16, key=KEY)
    shardings = fx.sharding_of(attention, mesh, {"heads": "model", "embed": "data"})
    assert shardings.query_proj.weight == NamedSharding(mesh, P("model", "data"))
    assert shardings.output_proj.weight.spec == P("data", "model")


def test_a_name_may_map_to_several_mesh_axes_or_none(mesh):
    linear = fx.nn.Linear(4, 16, key=KEY)
    shardings = fx.sharding_of(linear, mesh, [("out", ("data", "model")), ("in", None)])
    assert shardings.weight.spec == P(("data", "model"), None)
    assert linear.weight.shape[0] % 8 == 0


def test_unnamed_and_unmatched_arrays_are_replicated_and_other_leaves_none(mesh):
    tree = {"x": jnp.zeros((8, 2)), "f": jnp.tanh, "n": 3}
    shardings = fx.sharding_of(tree, mesh, {"out": "model"})
    assert shardings["x"].spec == P()
    assert shardings["f"] is None and shardings["n"] is None


def test_key_path_rules_come_first_in_order(mesh):
    mlp = fx.nn.MLP(8, 4, 16, depth=1, key=KEY)
    rules = [
        (r"layers\[0\]\.weight$", P(None, "data")),
        (r"\.weight$", P("model")),
        ("out", "data"),
    ]
    specs = _specs(fx.sharding_of(mlp, mesh, rules))
    assert specs.layers[0].weight == P(None, "data")
    assert specs.layers[1].weight == P("model")
    assert specs.layers[1].bias == P("data")


def test_equinox_style_model_without_annotations(mesh):
    class Plain(fx.Module):
        w: jax.Array
        b: jax.Array

    model = [Plain(jnp.zeros((8, 4)), jnp.zeros(8)) for _ in range(2)]
    specs = _specs(fx.sharding_of(model, mesh, [(r"\.w$", P("data", "model"))]))
    assert [layer.w for layer in specs] == [P("data", "model")] * 2
    assert [layer.b for layer in specs] == [P()] * 2


def test_stack_axis_takes_a_rule(mesh):
    stack = fx.filter_vmap(lambda k: fx.nn.Linear(4, 8, key=k))(
        jax.random.split(KEY, 4)
    )
    specs = _specs(fx.sharding_of(stack, mesh, {"stack": "data", "out": "model"}))
    assert specs.weight == P("data", "model", None)


def test_abstract_models(mesh):
    abstract = fx.filter_eval_shape(fx.nn.Linear, 4, 8, key=KEY)
    assert fx.sharding_of(abstract, mesh, {"out": "model"}).weight.spec == P(
        "model", None
    )


@pytest.mark.parametrize(
    "rules, message",
    [
        ({"out": "data"}, r"tree\.weight.*does not divide 6"),
        ({"out": "model", "in": "model"}, r"tree\.weight.*same mesh axis 'model'"),
        ({"out": "pipe"}, r"mesh axis 'pipe'"),
        ([(r"\.bias", P("model", None))], r"tree\.bias.*rank 1"),
        ([(r"\.bias", P("pipe"))], r"mesh axis 'pipe'"),
    ],
)
def test_bad_rules_name_the_key_path(mesh, rules, message):
    linear = fx.nn.Linear(4, 6, key=KEY)
    with pytest.raises(ValueError, match=message):
        fx.sharding_of(linear, mesh, rules)


@pytest.mark.parametrize(
    "rules", [[("out",)], {3: "model"}, {"out": 3}, [(3, P("model"))]]
)
def test_malformed_rules(mesh, rules):
    with pytest.raises(TypeError):
        fx.sharding_of(fx.nn.Linear(2, 2, key=KEY), mesh, rules)


def test_nothing_is_placed_when_one_leaf_is_wrong(mesh):
    model = (fx.nn.Linear(4, 8, key=KEY), fx.nn.Linear(4, 6, key=KEY))
    with pytest.raises(ValueError, match=r"tree\[1\]\.weight"):
        fx.filter_shard(model, fx.sharding_of(model, mesh, {"out": "data"}))
