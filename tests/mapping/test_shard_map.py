"""`filter_shard_map` on the 8 simulated CPU devices: any pytree in and out,
Modules and methods as the function, nested in the other filtered transforms,
errors naming the key path, `Auto` and `Explicit` meshes."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

import filterax as fx

AXIS_TYPES = [AxisType.Auto, AxisType.Explicit]


def make_mesh(kind: AxisType = AxisType.Explicit) -> jax.sharding.Mesh:
    return jax.make_mesh((8,), ("data",), axis_types=(kind,))


class Scaled(fx.Module):
    scale: jax.Array
    activation: object = jnp.tanh

    def __call__(self, x):
        return self.activation(self.scale * x)

    @fx.filter_shard_map(
        mesh=make_mesh(), in_specs=(P(), P("data")), out_specs=P("data")
    )
    def sharded(self, x):
        return self(x)


@pytest.mark.parametrize("kind", AXIS_TYPES)
def test_arrays_are_split_and_other_leaves_pass_through(kind):
    @fx.filter_shard_map(mesh=make_mesh(kind), in_specs=P("data"), out_specs=P())
    def summary(batch):
        # `x.shape[0]` is a Python int of the trace: the shard's length.
        local = jnp.sum(batch["x"])
        return {"total": jax.lax.psum(local, "data"), "rows": batch["x"].shape[0]}

    out = summary({"x": jnp.arange(16.0), "tag": "train"})
    assert out["rows"] == 2
    assert out["total"] == jnp.sum(jnp.arange(16.0))


@pytest.mark.parametrize("kind", AXIS_TYPES)
def test_a_module_as_the_function_has_its_arrays_replicated(kind):
    model = Scaled(jnp.array(0.5))
    mapped = fx.filter_shard_map(
        fx.filter_vmap(model),
        mesh=make_mesh(kind),
        in_specs=P("data"),
        out_specs=P("data"),
    )
    x = jnp.linspace(-1.0, 1.0, 16)
    assert jnp.allclose(mapped(x), jnp.tanh(0.5 * x))


def test_a_method_decorated_in_its_class_body_takes_self_first():
    model = Scaled(jnp.array(2.0))
    x = jnp.linspace(-1.0, 1.0, 16)
    assert jnp.allclose(model.sharded(x), jnp.tanh(2.0 * x))
    # A pytree holding the model, whose arrays `filter_jit` would trace.
    assert jax.tree.leaves(fx.filter(model.sharded, fx.is_array)) == [model.scale]


def test_mesh_may_be_omitted_under_set_mesh():
    mesh = make_mesh()
    double = fx.filter_shard_map(
        lambda x: 2 * x, in_specs=P("data"), out_specs=P("data")
    )
    with jax.set_mesh(mesh):
        out = double(jnp.ones(16))
    assert out.sharding.is_equivalent_to(NamedSharding(mesh, P("data")), 1)
    with pytest.raises(ValueError, match="no mesh"):
        double(jnp.ones(16))


@pytest.mark.parametrize("kind", AXIS_TYPES)
def test_nested_in_filter_jit_it_is_traced_once(kind):
    traces = []

    @fx.filter_jit
    @fx.filter_shard_map(
        mesh=make_mesh(kind), in_specs=(P(), P("data")), out_specs=P("data")
    )
    def apply(model, x):
        traces.append(None)
        return model(x)

    model = Scaled(jnp.array(1.0))
    for scale in (1.0, 3.0):
        out = apply(Scaled(jnp.array(scale)), jnp.ones(16))
        assert jnp.allclose(out, jnp.tanh(scale))
    assert len(traces) == 1
    assert model.activation is jnp.tanh


def test_nested_in_filter_vmap_maps_each_example():
    mesh = make_mesh(AxisType.Auto)
    local_sum = fx.filter_shard_map(
        lambda x: jax.lax.psum(jnp.sum(x), "data"),
        mesh=mesh,
        in_specs=P("data"),
        out_specs=P(),
    )
    batch = jnp.arange(48.0).reshape(3, 16)
    assert jnp.allclose(fx.filter_vmap(local_sum)(batch), jnp.sum(batch, axis=1))


@pytest.mark.parametrize("kind", AXIS_TYPES)
def test_gradients_through_it_match_the_unsharded_loss(kind):
    x = jnp.linspace(-1.0, 1.0, 32).reshape(16, 2)
    params = {"w": jnp.array([1.0, 2.0]), "name": "linear"}
    mesh = make_mesh(kind)

    @fx.filter_shard_map(in_specs=(P(), P("data")), out_specs=P())
    def loss(params, x):
        return jax.lax.pmean(jnp.mean((x @ params["w"]) ** 2), "data")

    # Under `jax.grad` as under `jax.jit`, JAX wants `Explicit` axes under a
    # mesh context: it is entered around the outer transform.
    with jax.set_mesh(mesh):
        grads = fx.filter_grad(loss)(params, x)
    expected = jax.grad(lambda w: jnp.mean((x @ w) ** 2))(params["w"])
    assert grads["name"] is None
    assert jnp.allclose(grads["w"], expected)


def _grads_inside(reduce):
    """Gradients of replicated parameters taken inside the mapped function,
    the loss reduced by `reduce` before being differentiated."""
    x = jnp.linspace(-1.0, 1.0, 32).reshape(16, 2)

    @fx.filter_shard_map(
        mesh=make_mesh(AxisType.Auto), in_specs=(P(), P("data")), out_specs=P()
    )
    def grads(w, x):
        return jax.grad(lambda w: reduce(jnp.mean((x @ w) ** 2)))(w)

    expected = jax.grad(lambda w: jnp.mean((x @ w) ** 2))(jnp.array([1.0, 2.0]))
    return grads(jnp.array([1.0, 2.0]), x), expected


def test_replicated_gradients_are_right_when_the_loss_is_pmeaned_inside():
    grads, expected = _grads_inside(lambda loss: jax.lax.pmean(loss, "data"))
    assert jnp.allclose(grads, expected)


def test_replicated_gradients_are_n_times_too_large_without_the_pmean():
    # The pitfall the docs warn of: each device's loss is differentiated and
    # the replicated parameters' cotangents are summed over the 8 devices.
    grads, expected = _grads_inside(lambda loss: loss)
    assert jnp.allclose(grads, 8 * expected)


def test_in_specs_that_do_not_match_the_arguments_name_the_key_path():
    f = fx.filter_shard_map(
        lambda params, x: x,
        mesh=make_mesh(),
        in_specs=({"w": P()}, P("data")),
        out_specs=P(),
    )
    with pytest.raises(ValueError, match=r"in_specs.*at args\[0\]"):
        f({"w": jnp.ones(2), "b": jnp.ones(2)}, jnp.ones(16))


def test_out_specs_that_do_not_match_the_output_name_the_key_path():
    f = fx.filter_shard_map(
        lambda x: {"y": (x, x)},
        mesh=make_mesh(),
        in_specs=P("data"),
        out_specs={"z": P()},
    )
    with pytest.raises(ValueError, match=r"out_specs.*at the output"):
        f(jnp.ones(16))


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (P("data", None), r"at args\[0\]\['x'\] has 2 entries"),
        (P("model"), r"at args\[0\]\['x'\] names the mesh axis 'model'"),
    ],
)
def test_a_spec_that_does_not_fit_its_array_names_the_key_path(spec, message):
    f = fx.filter_shard_map(
        lambda b: b, mesh=make_mesh(), in_specs=spec, out_specs=spec
    )
    with pytest.raises(ValueError, match=message):
        f({"x": jnp.ones(16)})


def test_a_dimension_the_mesh_does_not_divide_is_named():
    f = fx.filter_shard_map(
        lambda b: b, mesh=make_mesh(), in_specs=P("data"), out_specs=P()
    )
    with pytest.raises(ValueError, match=r"args\[0\]\[1\].*size 12.*8 parts"):
        f((jnp.ones(16), jnp.ones(12)))


def test_a_leaf_that_is_no_partition_spec_is_refused():
    with pytest.raises(TypeError, match=r"in_specs\[1\] is 'data'"):
        fx.filter_shard_map(
            lambda x: x, mesh=make_mesh(), in_specs=(P(), "data"), out_specs=P()
        )
