"""`Precision` and `mixed_precision`: what is cast, `keep`, and composition with
the filtered transforms."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import filterax as fx
from filterax import nn

BF16, F16, F32 = jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16), jnp.dtype(jnp.float32)


class Net(fx.Module):
    linear: nn.Linear
    norm: nn.LayerNorm
    steps: jax.Array
    activation: str = fx.field(static=True, default="relu")

    def __init__(self, key):
        self.linear = nn.Linear(3, 4, key=key)
        self.norm = nn.LayerNorm(4)
        self.steps = jnp.array(0)

    def __call__(self, x):
        return self.norm(jax.nn.relu(self.linear(x)))

    def dtypes(self, x):
        """The dtypes the method sees: of its module's leaves and of `x`."""
        return {
            "weight": self.linear.weight.dtype,
            "norm": self.norm.weight.dtype,
            "steps": self.steps.dtype,
            "x": x.dtype,
        }


def _net():
    return Net(jax.random.key(0))


def test_precision_reads_dtypes_and_short_names():
    policy = fx.Precision("f32", "bf16", "f16")
    assert (policy.param, policy.compute, policy.output) == (F32, BF16, F16)
    assert fx.Precision() == fx.Precision(jnp.float32, jnp.bfloat16, jnp.float32)
    assert hash(fx.Precision()) == hash(fx.Precision())


@pytest.mark.parametrize("argument", ["param", "compute", "output"])
@pytest.mark.parametrize("dtype", [jnp.int8, jnp.bool_, jnp.complex64, None])
def test_a_policy_with_a_non_floating_dtype_is_refused(argument, dtype):
    with pytest.raises(
        TypeError, match=rf"Precision\({argument}=...\) must be a floating"
    ):
        fx.Precision(**{argument: dtype})


def test_a_keep_leaf_that_is_no_filter_names_its_key_path():
    with pytest.raises(TypeError, match=r"keep\['norm'\]\[0\]"):
        fx.Precision(keep={"norm": [3]})


def test_arguments_compute_in_the_compute_dtype_and_outputs_come_back_in_output():
    seen = {}

    def fun(net, x, *, scale, count, key):
        seen.update(net.dtypes(x), scale=scale.dtype, count=count.dtype, key=key.dtype)
        return {"y": net(x) * scale, "count": count}

    out = fx.mixed_precision(fun, fx.Precision(compute="f16", output="bf16"))(
        _net(),
        jnp.ones(3),
        scale=jnp.array(2.0),
        count=jnp.array(3),
        key=jax.random.key(1),
    )
    assert seen["weight"] == seen["norm"] == seen["x"] == seen["scale"] == F16
    assert seen["steps"] == seen["count"] == jnp.dtype("int32")
    assert jnp.issubdtype(seen["key"], jax.dtypes.prng_key)
    assert out["y"].dtype == BF16 and out["count"].dtype == jnp.dtype("int32")


def test_keep_as_a_predicate_keeps_those_leaves_in_param():
    policy = fx.Precision(compute="bf16", keep=lambda leaf: leaf.ndim == 1)
    seen = fx.mixed_precision(Net.dtypes, policy)(_net(), jnp.ones(3))
    assert seen["norm"] == F32 and seen["weight"] == BF16 and seen["x"] == BF16


def test_keep_as_a_prefix_tree_of_the_first_argument():
    net = _net()
    keep = fx.tree_at(lambda k: k.norm, jax.tree.map(lambda _: False, net), True)
    policy = fx.Precision(compute="bf16", keep=keep)
    assert hash(policy) == hash(policy)  # a prefix tree keeps the policy hashable
    seen = fx.mixed_precision(Net.dtypes, policy)(net, jnp.ones(3))
    assert seen["norm"] == F32 and seen["weight"] == BF16


def test_a_keep_that_does_not_fit_the_first_argument_names_the_key_path():
    policy = fx.Precision(keep={"a": True, "b": [False]})
    with pytest.raises(ValueError, match=r"at args\[0\]\['b'\]"):
        fx.mixed_precision(lambda t: t, policy)({"a": jnp.ones(2), "b": jnp.ones(2)})
    net = _net()
    keep = {"linear": True}
    with pytest.raises(ValueError, match=r"at self keep has a dict"):
        fx.mixed_precision(net, fx.Precision(keep=keep))(jnp.ones(3))
    nested = fx.tree_at(lambda k: k.linear, jax.tree.map(lambda _: False, net), [True])
    with pytest.raises(ValueError, match=r"at self\.linear keep has a list"):
        fx.mixed_precision(net.dtypes, fx.Precision(keep=nested))(jnp.ones(3))


def test_a_bound_method_and_a_callable_module_cast_their_module():
    net = _net()
    policy = fx.Precision(compute="f16", keep=lambda leaf: leaf.ndim == 1)
    seen = fx.mixed_precision(net.dtypes, policy)(jnp.ones(3))
    assert seen["weight"] == F16 and seen["norm"] == F32 and seen["x"] == F16
    out = fx.mixed_precision(net, policy)(jnp.ones(3))
    assert out.dtype == F32
    np.testing.assert_allclose(out, net(jnp.ones(3)), atol=2e-2)
    assert jax.tree.leaves(fx.mixed_precision(net, policy)) == jax.tree.leaves(net)


def test_as_a_decorator_in_a_class_body_self_is_the_first_argument():
    class Scaled(fx.Module):
        weight: jax.Array
        bias: jax.Array

        @fx.mixed_precision(policy=fx.Precision(keep=lambda leaf: leaf.ndim == 0))
        def __call__(self, x):
            return self.weight.dtype, self.bias.dtype, x.dtype

    weight, bias, x = Scaled(jnp.ones(2), jnp.array(0.0))(jnp.ones(2))
    assert (weight, bias, x) == (BF16, F32, BF16)


def test_gradients_come_back_in_the_parameter_dtype():
    def loss(net, x):
        return jnp.sum(net(x))

    grads = fx.filter_grad(fx.mixed_precision(loss, fx.Precision()))(
        _net(), jnp.ones(3)
    )
    assert {g.dtype for g in jax.tree.leaves(grads)} == {F32}
    assert grads.steps is None


def test_under_filter_jit_new_values_never_recompile():
    @fx.filter_jit
    @fx.debug.assert_max_traces(max_traces=1)
    def step(net, x):
        return fx.filter_grad(
            fx.mixed_precision(lambda n: jnp.sum(n(x)), fx.Precision())
        )(net)

    net = _net()
    for i in range(3):
        net = fx.apply_updates(
            net, jax.tree.map(lambda g: -0.1 * g, step(net, jnp.ones(3) * i))
        )
    assert fx.debug.get_num_traces(step) == 1


def test_composes_with_filter_vmap():
    net = _net()
    batched = fx.filter_vmap(fx.mixed_precision(net, fx.Precision(compute="f16")))
    out = batched(jnp.ones((5, 3)))
    assert out.shape == (5, 4) and out.dtype == F32
    np.testing.assert_allclose(out, jax.vmap(net)(jnp.ones((5, 3))), atol=2e-2)


def test_composes_with_filter_scan():
    def body(carry, w):
        return jnp.tanh(carry * w), carry.dtype

    def run(carry, ws):
        return fx.filter_scan(body, carry, ws)

    carry, dtypes = fx.mixed_precision(run, fx.Precision(compute="bf16"))(
        jnp.ones(3), jnp.full((4, 3), 0.5)
    )
    assert carry.dtype == F32 and dtypes == BF16

    grad = fx.filter_grad(
        lambda ws: jnp.sum(fx.mixed_precision(run, fx.Precision())(jnp.ones(3), ws)[0])
    )(jnp.full((4, 3), 0.5))
    assert grad.dtype == F32 and grad.shape == (4, 3)


def test_composes_with_stacked_layers():
    stacked = nn.Stacked(lambda k: nn.Linear(3, 3, key=k), 4, key=jax.random.key(0))
    policy = fx.Precision(compute="bf16")
    x = jnp.ones(3)

    def loss(stacked):
        return jnp.sum(fx.mixed_precision(stacked, policy)(x))

    grads = fx.filter_jit(fx.filter_grad(loss))(stacked)
    assert grads.layers.weight.shape == (4, 3, 3)
    assert {g.dtype for g in jax.tree.leaves(grads)} == {F32}
    reference = fx.filter_grad(lambda s: jnp.sum(s(x)))(stacked)
    np.testing.assert_allclose(
        grads.layers.weight, reference.layers.weight, rtol=0.05, atol=0.05
    )


def test_a_sharded_computation_keeps_its_shardings():
    mesh = jax.make_mesh((4, 2), ("data", "model"))
    sharding = jax.sharding.NamedSharding(
        mesh, jax.sharding.PartitionSpec("data", None)
    )
    x = jax.device_put(jnp.ones((8, 3)), sharding)
    net = _net()
    out = fx.filter_jit(fx.filter_vmap(fx.mixed_precision(net, fx.Precision())))(x)
    assert out.sharding.is_equivalent_to(sharding, 2)
    np.testing.assert_allclose(out, jax.vmap(net)(x), atol=2e-2)


def test_bad_arguments_are_refused():
    with pytest.raises(TypeError, match="needs a filterax.Precision"):
        fx.mixed_precision(lambda x: x, jnp.bfloat16)  # pyright: ignore[reportArgumentType]
    with pytest.raises(TypeError, match="must be callable"):
        fx.mixed_precision(3, fx.Precision())  # pyright: ignore[reportArgumentType]


def test_normalisation_statistics_stay_float32_under_a_float16_policy():
    # Values near 1000: their mean square overflows float16 (largest 65504),
    # yet the layer normalises them, as its statistics are float32.
    norm = nn.LayerNorm(4)
    x = jnp.array([1000.0, 1001.0, 1002.0, 1003.0])
    out = fx.mixed_precision(norm, fx.Precision(compute="f16", output="f16"))(x)
    assert out.dtype == F16
    np.testing.assert_allclose(out, norm(x), atol=2e-2)


def test_a_state_keeps_its_dtype_through_the_wrapper_and_its_updates_survive():
    bn, state = nn.make_with_state(nn.BatchNorm)(3, "batch", mode="ema", momentum=0.99)
    policy = fx.Precision(compute="bf16", output="bf16")
    call = fx.filter_vmap(
        fx.mixed_precision(bn, policy),
        in_axes=(0, None),
        out_axes=(0, None),
        axis_name="batch",
    )
    _, state = call(jnp.ones((8, 3)), state)  # the first call sets the mean: 1
    out, new_state = call(jnp.full((8, 3), 1.5), state)
    assert out.dtype == BF16
    before, after = jax.tree.leaves(state), jax.tree.leaves(new_state)
    assert [leaf.dtype for leaf in after] == [leaf.dtype for leaf in before]
    # A 1% step from 1 towards 1.5 is 1.005, which bfloat16 (steps of 1/128
    # near 1) would round back to 1.
    means = [leaf for leaf in after if leaf.dtype == F32 and np.all(leaf > 0.5)]
    np.testing.assert_allclose(means[0], 1.005, rtol=1e-6)


def test_half_precision_halves_the_activations_kept_for_the_backward_pass():
    mlp = nn.MLP(64, 64, 256, depth=2, key=jax.random.key(0))
    x = jnp.ones((32, 64))

    def kept_bytes(policy, dtype):
        loss = lambda m: jnp.sum(fx.filter_vmap(fx.mixed_precision(m, policy))(x))  # noqa: E731
        _, vjp_fn = fx.filter_jit(lambda m: fx.filter_vjp(loss, m))(mlp)
        residuals = [leaf for leaf in jax.tree.leaves(vjp_fn) if fx.is_array(leaf)]
        assert {leaf.dtype for leaf in residuals} == {jnp.dtype(dtype), jnp.dtype(bool)}
        return sum(leaf.nbytes for leaf in residuals if leaf.dtype != bool)

    full = kept_bytes(fx.Precision(compute="f32"), jnp.float32)
    half = kept_bytes(fx.Precision(compute="bf16"), jnp.bfloat16)
    assert half * 2 == full


def test_the_wrapper_is_a_pytree_that_filter_jit_compiles_once():
    policy = fx.Precision(keep=lambda leaf: leaf.ndim == 1)
    first, second = _net(), Net(jax.random.key(1))
    jitted = fx.filter_jit(
        fx.debug.assert_max_traces(lambda wrapped, x: wrapped(x), max_traces=1)
    )
    out = jitted(fx.mixed_precision(first, policy), jnp.ones(3))
    jitted(fx.mixed_precision(second, policy), jnp.ones(3))  # new arrays only
    assert out.dtype == F32
    assert fx.debug.get_num_traces(jitted) == 1
