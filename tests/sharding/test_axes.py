"""Logical axes on the model: `field(axes=...)`, the layers' defaults and
`axes=` overrides, the `"stack"` axis, and `logical_axes`."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import pytest

import filterax as fx

KEY = jax.random.key(0)


def _is_names(x):
    return isinstance(x, tuple) and all(n is None or isinstance(n, str) for n in x)


class Table(fx.Module):
    rows: jax.Array = fx.field(axes=("vocab", "embed"))
    frozen: fx.NonDifferentiable = fx.field(axes=("embed",))
    ref: object = fx.field(axes=("embed",))
    plain: jax.Array


def _table():
    return Table(
        jnp.zeros((6, 4)),
        fx.NonDifferentiable(jnp.zeros(4)),
        jax.new_ref(jnp.zeros(4)),
        jnp.zeros(3),
    )


def test_field_stores_axes_in_metadata():
    (rows,) = [f for f in dataclasses.fields(Table) if f.name == "rows"]
    assert rows.metadata["axes"] == ("vocab", "embed")


@pytest.mark.parametrize(
    "kwargs, error",
    [
        ({"axes": "embed"}, TypeError),
        ({"axes": ("embed", 3)}, TypeError),
        ({"axes": ("embed",), "static": True}, ValueError),
        ({"metadata": {"axes": ("embed",)}}, ValueError),
    ],
)
def test_field_refuses_malformed_axes(kwargs, error):
    with pytest.raises(error):
        fx.field(**kwargs)


def test_names_reach_non_differentiable_refs_and_stay_off_unannotated_leaves():
    names = fx.logical_axes(_table())
    assert names.rows == ("vocab", "embed")
    assert jax.tree.leaves(names.frozen, is_leaf=_is_names) == [("embed",)]
    assert names.ref == ("embed",)
    assert names.plain is None


def test_abstract_model_has_the_same_names():
    table = _table()
    abstract = fx.filter_eval_shape(lambda: fx.filter(table, fx.is_array))
    assert jax.tree.leaves(fx.logical_axes(abstract), is_leaf=_is_names) == [
        ("vocab", "embed"),
        ("embed",),
    ]


def test_same_structure_as_the_tree():
    model = fx.nn.MLP(3, 2, 4, depth=2, key=KEY)
    names = fx.logical_axes(model)
    flat = jax.tree.leaves(names, is_leaf=lambda x: x is None or _is_names(x))
    leaves = jax.tree.leaves(model)
    assert len(flat) == len(leaves)
    assert [n is None for n in flat] == [not fx.is_array(leaf) for leaf in leaves]


@pytest.mark.parametrize(
    "layer, expected",
    [
        (
            lambda: fx.nn.Linear(3, 4, key=KEY),
            {"weight": ("out", "in"), "bias": ("out",)},
        ),
        (lambda: fx.nn.Embedding(5, 3, key=KEY), {"weight": ("vocab", "embed")}),
        (
            lambda: fx.nn.Conv2d(2, 4, 3, key=KEY),
            {"weight": ("out", "in", None, None), "bias": ("out", None, None)},
        ),
        (
            lambda: fx.nn.ConvTranspose1d(2, 4, 3, key=KEY),
            {"weight": ("out", "in", None), "bias": ("out", None)},
        ),
        (lambda: fx.nn.LayerNorm((2, 4)), {"weight": (None, "embed")}),
        (lambda: fx.nn.RMSNorm(4), {"weight": ("embed",), "bias": ("embed",)}),
        (lambda: fx.nn.GroupNorm(2, 4), {"weight": ("channel",)}),
        (
            lambda: fx.nn.GRUCell(2, 3, key=KEY),
            {
                "weight_ih": ("gates", "in"),
                "weight_hh": ("gates", "hidden"),
                "bias": ("gates",),
                "bias_n": ("hidden",),
            },
        ),
        (lambda: fx.nn.LSTMCell(2, 3, key=KEY), {"weight_hh": ("gates", "hidden")}),
        (lambda: fx.nn.PReLU(jnp.ones(3)), {"negative_slope": ("channel",)}),
        (
            lambda: fx.nn.WeightNorm(fx.nn.Linear(3, 4, key=KEY)),
            {"g": ("out", None)},
        ),
    ],
)
def test_layer_defaults(layer, expected):
    names = fx.logical_axes(layer())
    for field_name, field_names in expected.items():
        assert getattr(names, field_name) == field_names


def test_attention_splits_over_heads():
    names = fx.logical_axes(fx.nn.MultiheadAttention(2, 8, key=KEY))
    assert names.query_proj.weight == ("heads", "embed")
    assert names.value_proj.weight == ("heads", "embed")
    assert names.output_proj.weight == ("embed", "heads")


def test_batch_norm_state_takes_its_index_names():
    bn, state = fx.nn.make_with_state(fx.nn.BatchNorm)(4, "batch", mode="batch")
    names = fx.logical_axes((bn, state))
    assert names[0].weight == ("channel",)
    assert jax.tree.leaves(names[1], is_leaf=_is_names) == [("channel",), ("channel",)]


def test_override_replaces_defaults_and_survives_tree_map():
    linear = fx.nn.Linear(3, 4, key=KEY, axes={"weight": ("mlp", "embed")})
    for model in (linear, jax.tree.map(lambda x: x + 1, linear)):
        names = fx.logical_axes(model)
        assert names.weight == ("mlp", "embed")
        assert names.bias == ("out",)


def test_sublayer_overrides():
    mlp = fx.nn.MLP(
        3, 2, 4, depth=1, key=KEY, axes={"first": {"weight": ("mlp", "embed")}}
    )
    assert fx.logical_axes(mlp).layers[0].weight == ("mlp", "embed")
    assert fx.logical_axes(mlp).layers[1].weight == ("out", "in")


def test_default_mlp_layers_are_plain_linears():
    mlp = fx.nn.MLP(3, 2, 4, depth=1, key=KEY)
    assert fx.tree_equal(
        mlp.layers[0], fx.nn.Linear(3, 4, key=jax.random.split(KEY)[0])
    )


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: fx.nn.Linear(3, 4, key=KEY, axes={"kernel": ("a", "b")}), "'kernel'"),
        (lambda: fx.nn.Linear(3, 4, key=KEY, axes={"weight": ("a",)}), "'weight'"),
        (
            lambda: fx.nn.Conv1d(1, 2, 3, key=KEY, axes={"weight": ("a", "b")}),
            "'weight'",
        ),
        (
            lambda: fx.nn.MultiheadAttention(2, 4, key=KEY, axes={"q": {}}),
            "'q'",
        ),
        (
            lambda: fx.nn.MLP(2, 2, 2, 1, key=KEY, axes={"first": {"w": ("a",)}}),
            "'w'",
        ),
    ],
)
def test_bad_overrides_name_the_field(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_override_names_must_be_str_or_none():
    with pytest.raises(TypeError, match="axes\\['bias'\\]"):
        fx.nn.Linear(3, 4, key=KEY, axes={"bias": (3,)})  # pyright: ignore[reportArgumentType]


def test_vmapped_constructor_gets_a_stack_axis():
    stack = fx.filter_vmap(lambda k: fx.nn.Linear(3, 4, key=k))(
        jax.random.split(KEY, 2)
    )
    names = fx.logical_axes(stack)
    assert names.weight == ("stack", "out", "in")
    assert names.bias == ("stack", "out")
    nested = fx.filter_vmap(fx.filter_vmap(lambda k: fx.nn.Linear(3, 4, key=k)))(
        jax.random.split(KEY, (2, 2))
    )
    assert fx.logical_axes(nested).weight == ("stack", None, "out", "in")


class _Block(fx.Module):
    proj: fx.nn.Linear = fx.field(axes={"wieght": ("mlp", "embed")})


class _Blocks(fx.Module):
    projs: list = fx.field(axes={"weight": ("mlp", "embed")})


class _Scale(fx.Module):
    w: jax.Array = fx.field(axes={"weight": ("a",)})


def test_field_axes_for_a_sublayer_refuse_an_unknown_field():
    block = _Block(fx.nn.Linear(3, 4, key=KEY))
    with pytest.raises(ValueError) as caught:
        fx.logical_axes(block)
    message = str(caught.value)
    assert "_Block.proj" in message and "'wieght'" in message
    assert "'weight', 'bias'" in message  # the fields it has
    mesh = jax.make_mesh((4, 2), ("data", "model"))
    with pytest.raises(ValueError, match="'wieght'"):
        fx.sharding_of(block, mesh, {"mlp": "model"})


def test_field_axes_reach_every_sublayer_of_a_container():
    blocks = _Blocks([fx.nn.Linear(3, 4, key=KEY), fx.nn.Linear(3, 4, key=KEY)])
    names = fx.logical_axes(blocks)
    assert [layer.weight for layer in names.projs] == [("mlp", "embed")] * 2
    assert names.projs[0].bias == ("out",)


def test_field_axes_mapping_on_an_array_field_is_refused():
    with pytest.raises(ValueError, match=r"_Scale\.w.*holds an array of shape \(3,\)"):
        fx.logical_axes(_Scale(jnp.zeros(3)))


def test_field_axes_mapping_keys_must_be_field_names():
    with pytest.raises(TypeError, match="a key must be a field name"):
        fx.field(axes={3: ("a",)})  # type: ignore[dict-item]
