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
    shardings = fx.sharding_of(tree, mesh, {})
    assert shardings["x"].spec == P()
    assert shardings["f"] is None and shardings["n"] is None


def test_key_path_rules_come_first_in_order(mesh):
    mlp = fx.nn.MLP(8, 4, 16, depth=1, key=KEY)
    rules = [
        (r"layers\[0\]\.weight$", P(None, "data")),
        (r"\.weight$", P("model")),
        ("out", "data"),
    ]
    # The second rule also matches `layers[0].weight`, where the first wins.
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
        (
            [(r"\.bias(", P("model"))],
            r"key-path rule '\\\\.bias\('.*not a valid regular",
        ),
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


# --- no silent typo: unused rules and misfitting axes are refused -----------


def test_a_logical_rule_no_array_uses_is_refused_listing_the_names(mesh):
    attention = fx.nn.MultiheadAttention(4, 16, key=KEY)
    with pytest.raises(ValueError) as caught:
        fx.sharding_of(attention, mesh, {"haeds": "model", "embed": "data"})
    message = str(caught.value)
    assert "rule 'haeds'" in message
    assert "'embed', 'heads'" in message  # the names in use
    assert "strict=False" in message


def test_a_key_path_rule_matching_nothing_is_refused_listing_paths(mesh):
    mlp = fx.nn.MLP(8, 4, 16, depth=1, key=KEY)
    with pytest.raises(ValueError) as caught:
        fx.sharding_of(mlp, mesh, [(r"layer\[0\]\.weight", P("model"))])
    message = str(caught.value)
    assert "key-path rule 'layer\\\\[0\\\\]\\\\.weight'" in message
    assert ".layers[0].weight" in message  # a path the tree has


def test_a_stack_rule_on_a_model_without_stack_says_so(mesh):
    with pytest.raises(ValueError, match="no stack of layers"):
        fx.sharding_of(
            fx.nn.Linear(4, 8, key=KEY), mesh, {"stack": "data", "out": "model"}
        )


def test_strict_false_warns_and_still_shards(mesh):
    linear = fx.nn.Linear(4, 8, key=KEY)
    rules = [("heads", "model"), ("out", "model"), (r"\.nothing$", P())]
    with pytest.warns(fx.FilteraxWarning) as caught:
        shardings = fx.sharding_of(linear, mesh, rules, strict=False)
    assert len(caught) == 2
    assert shardings.weight.spec == P("model", None)
    with pytest.warns(fx.FilteraxWarning, match="'heads'"):
        built = fx.sharded_init(fx.nn.Linear, mesh, rules[:2], strict=False)(
            4, 8, key=KEY
        )
    assert built.weight.sharding.spec == P("model", None)
    with pytest.raises(ValueError, match="'heads'"):
        fx.sharded_init(fx.nn.Linear, mesh, rules[:2])(4, 8, key=KEY)


class _Declared(fx.Module):
    w: jax.Array = fx.field(axes=("a", "b"))


@pytest.mark.parametrize(
    "shape, message",
    [
        ((8,), r"tree\.w.*\('a', 'b'\).*shape \(8,\).*more names"),
        ((2, 2, 8, 4), r"tree\.w.*\('a', 'b'\).*2 fewer names"),
    ],
)
def test_declared_axes_that_do_not_fit_the_rank_are_refused(mesh, shape, message):
    model = _Declared(jnp.zeros(shape))
    with pytest.raises(ValueError, match=message):
        fx.sharding_of(model, mesh, {"a": "data"})
    with pytest.warns(fx.FilteraxWarning, match=message):
        fx.sharding_of(model, mesh, {"a": "data"}, strict=False)


def test_one_more_dimension_is_a_stack_and_fits(mesh):
    model = _Declared(jnp.zeros((4, 8, 2)))
    assert fx.sharding_of(model, mesh, {"stack": "data", "a": "model"}).w.spec == P(
        "data", "model", None
    )


def test_strict_must_be_a_bool(mesh):
    with pytest.raises(TypeError, match="strict"):
        fx.sharding_of(fx.nn.Linear(2, 2, key=KEY), mesh, {}, strict=1)  # type: ignore[arg-type]
