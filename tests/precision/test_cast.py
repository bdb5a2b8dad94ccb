"""`filterax.cast`: which leaves change dtype, the filter spec, cotangents and
shardings."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import filterax as fx


class Layer(fx.Module):
    weight: jax.Array
    steps: jax.Array
    key: jax.Array
    name: str = fx.field(static=True, default="layer")
    bias: jax.Array | None = None


def _layer():
    return Layer(jnp.ones((2, 3)), jnp.array(4), jax.random.key(0), bias=jnp.zeros(2))


def test_casts_floating_arrays_and_nothing_else():
    tree = {
        "layer": _layer(),
        "complex": jnp.ones(2, jnp.complex64),
        "python": 1.5,
        "zero": fx.zero_cotangent(jnp.ones(3)),
        "none": None,
        "flag": jnp.array(True),
    }
    out = fx.cast(tree, jnp.bfloat16)
    assert out["layer"].weight.dtype == out["layer"].bias.dtype == jnp.bfloat16
    for name in ("complex", "python", "zero", "none", "flag"):
        assert out[name] is tree[name]
    assert out["layer"].steps is tree["layer"].steps
    assert out["layer"].key is tree["layer"].key
    assert out["layer"].name == "layer"


def test_an_array_already_of_the_dtype_is_returned_as_is():
    weight = jnp.ones(3, jnp.float16)
    assert fx.cast([weight], "f16")[0] is weight


def test_numpy_arrays_stay_numpy():
    out = fx.cast({"a": np.ones(2, np.float32)}, jnp.float16)
    assert isinstance(out["a"], np.ndarray) and out["a"].dtype == np.float16


def test_where_as_a_predicate_and_as_a_prefix_tree():
    layer = _layer()
    only_bias = fx.cast(layer, "bf16", where=lambda x: x.ndim == 1)
    assert only_bias.weight.dtype == jnp.float32
    assert only_bias.bias.dtype == jnp.bfloat16
    spec = jax.tree.map(lambda _: False, layer)
    spec = fx.tree_at(lambda s: s.weight, spec, True)
    only_weight = fx.cast(layer, "bf16", where=spec)
    assert only_weight.weight.dtype == jnp.bfloat16
    assert only_weight.bias.dtype == jnp.float32


def test_a_where_that_is_not_a_prefix_names_the_key_path():
    with pytest.raises(ValueError, match=r"\['b'\]"):
        fx.cast(
            {"a": jnp.ones(2), "b": [jnp.ones(2)]},
            "bf16",
            where={"a": True, "b": (True,)},
        )


@pytest.mark.parametrize("dtype", [jnp.int32, jnp.bool_, jnp.complex64, None, "nope"])
def test_a_non_floating_dtype_is_refused(dtype):
    with pytest.raises(TypeError, match=r"cast\(dtype=...\) must be a floating dtype"):
        fx.cast(jnp.ones(2), dtype)


def test_cotangents_come_back_in_each_leaf_s_own_dtype():
    tree = {"f32": jnp.ones(2), "f16": jnp.ones(2, jnp.float16), "i": jnp.array(1)}

    def loss(tree):
        low = fx.cast(tree, jnp.bfloat16)
        return jnp.sum(low["f32"] * low["f16"]).astype(jnp.float32)

    grads = fx.filter_grad(loss)(tree)
    assert grads["f32"].dtype == jnp.float32
    assert grads["f16"].dtype == jnp.float16
    assert grads["i"] is None


def test_none_and_symbolic_zero_cotangents_pass_through_a_cast():
    tree = (jnp.ones(2), jnp.ones(3))
    out, vjp_fn = fx.filter_vjp(lambda t: fx.cast(t, jnp.float16), tree)
    assert [o.dtype for o in out] == [jnp.float16, jnp.float16]
    (ct,) = vjp_fn((None, fx.zero_cotangent(out[1])))
    assert [c.dtype for c in ct] == [jnp.float32, jnp.float32]
    assert not ct[0].any() and not ct[1].any()
    (ct,) = vjp_fn((jnp.full(2, 3.0, jnp.float16), None))
    np.testing.assert_array_equal(ct[0], [3.0, 3.0])
    assert ct[0].dtype == jnp.float32 and not ct[1].any()


def test_cast_of_a_cotangent_tree_leaves_none_and_symbolic_zeros_alone():
    zero = fx.zero_cotangent(jnp.ones(3, jnp.float16))
    out = fx.cast({"none": None, "zero": zero, "g": jnp.ones(2, jnp.float16)}, "f32")
    assert out["none"] is None and out["zero"] is zero
    assert out["g"].dtype == jnp.float32


def test_a_cast_keeps_each_array_s_sharding():
    mesh = jax.make_mesh((4, 2), ("data", "model"))
    spec = jax.sharding.PartitionSpec("data", "model")
    weight = jax.device_put(jnp.ones((8, 4)), jax.sharding.NamedSharding(mesh, spec))
    assert fx.cast(weight, "bf16").sharding == weight.sharding
    jitted = fx.filter_jit(lambda w: fx.cast(w, jnp.bfloat16))(weight)
    assert jitted.sharding == weight.sharding


def test_predicates_are_asked_about_floating_arrays_only():
    mlp = fx.nn.MLP(2, 2, 4, depth=1, key=jax.random.key(0))  # holds functions
    out = fx.cast(mlp, "bf16", where=lambda leaf: leaf.ndim == 1)
    assert out.layers[0].bias.dtype == jnp.bfloat16
    assert out.layers[0].weight.dtype == jnp.float32
    assert out.activation is mlp.activation
