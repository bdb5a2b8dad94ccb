"""`filter_jit(in_shardings=..., out_shardings=...)` on the 8 simulated CPU
devices: filtered prefixes on both routes, with donation, `.lower` and Module
methods; optax state laid out like the parameters, and a train step that
compiles once."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import jax
import jax.monitoring
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

import filterax as fx
from filterax._jit import JitWrapper

AXIS_TYPES = [AxisType.Auto, AxisType.Explicit]
_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
_compilations = [0]


def _count_compilation(event: str, duration: float, **kwargs: object) -> None:
    if event == _COMPILE_EVENT:
        _compilations[0] += 1


jax.monitoring.register_event_duration_secs_listener(_count_compilation)


@contextlib.contextmanager
def counting_compilations() -> Iterator[list[int]]:
    """Yields a one-item list holding, once the block is left, the number of
    backend compilations made inside it."""
    start = _compilations[0]
    counted = [0]
    yield counted
    counted[0] = _compilations[0] - start


def make_mesh(kind: AxisType = AxisType.Auto) -> jax.sharding.Mesh:
    return jax.make_mesh((4, 2), ("data", "model"), axis_types=(kind, kind))


def laid_out(array: jax.Array, sharding: jax.sharding.Sharding) -> bool:
    """Whether `array` is laid out as `sharding` says (`P("data")` and
    `P("data", None)` alike)."""
    return array.sharding.is_equivalent_to(sharding, array.ndim)


class Dense(fx.Module):
    weight: jax.Array
    bias: jax.Array
    activation: object = jnp.tanh  # a function leaf: the keyed route

    def __call__(self, x):
        return self.activation(x @ self.weight + self.bias)

    @fx.filter_jit(
        in_shardings=((None, NamedSharding(make_mesh(), P("data"))), None),
        out_shardings=NamedSharding(make_mesh(), P("data")),
    )
    def apply_sharded(self, x):
        return self(x)


def make_dense(mesh: jax.sharding.Mesh) -> tuple[Dense, Dense]:
    """A Dense layer and the tree of its shardings (the weight's columns split
    over `"model"`)."""
    dense = Dense(jnp.ones((4, 8)), jnp.zeros(8))
    shardings = Dense(
        NamedSharding(mesh, P(None, "model")), NamedSharding(mesh, P("model")), None
    )
    return dense, shardings


@pytest.mark.parametrize("kind", AXIS_TYPES)
def test_direct_route_places_arguments_and_lays_out_the_output(kind):
    mesh = make_mesh(kind)
    rows, columns = (
        NamedSharding(mesh, P("data")),
        NamedSharding(mesh, P(None, "model")),
    )
    f = fx.filter_jit(
        lambda x, w: x @ w, in_shardings=((rows, columns), None), out_shardings=rows
    )
    out = f(np.ones((8, 4), np.float32), jnp.ones((4, 2)))
    assert laid_out(out, rows)
    assert jnp.array_equal(out, jnp.full((8, 2), 4.0))
    assert f.compiled.direct_ok is True


@pytest.mark.parametrize("kind", AXIS_TYPES)
def test_keyed_route_applies_a_tree_of_shardings_to_a_module(kind):
    mesh = make_mesh(kind)
    dense, shardings = make_dense(mesh)
    rows = NamedSharding(mesh, P("data"))

    @fx.filter_jit(in_shardings=((shardings, rows), None), out_shardings=(None, rows))
    def forward(model, x):
        return model, model(x)

    model, y = forward(dense, jnp.ones((8, 4)))
    assert forward.compiled.direct_ok is False
    assert laid_out(model.weight, shardings.weight)  # follows the argument
    assert model.activation is jnp.tanh
    assert laid_out(y, rows)
    assert jnp.allclose(y, jnp.tanh(jnp.full((8, 8), 4.0)))


def test_one_sharding_covers_a_subtree_and_non_array_leaves_ignore_it():
    replicated = NamedSharding(make_mesh(), P())
    f = fx.filter_jit(
        lambda tree: tree, in_shardings=replicated, out_shardings=replicated
    )
    out = f({"a": jnp.ones(3), "b": (jnp.zeros(2), "label", 3)})
    assert out["b"][1:] == ("label", 3)
    assert all(leaf.sharding == replicated for leaf in (out["a"], out["b"][0]))


def test_partition_specs_are_read_on_the_mesh_set_by_set_mesh():
    mesh = make_mesh()
    f = fx.filter_jit(lambda x: 2 * x, in_shardings=P("data"), out_shardings=P())
    with jax.set_mesh(mesh):
        out = f(jnp.ones((8, 2)))
    assert out.sharding == NamedSharding(mesh, P())
    with pytest.raises(ValueError, match="PartitionSpec, which needs a mesh"):
        f(jnp.ones((8, 2)))


def test_an_array_committed_elsewhere_is_resharded_inside():
    mesh = make_mesh()
    columns = NamedSharding(mesh, P(None, "model"))
    x = jax.device_put(jnp.arange(32.0).reshape(8, 4), NamedSharding(mesh, P("data")))
    out = fx.filter_jit(lambda x: x + 1, in_shardings=columns, out_shardings=columns)(x)
    assert out.sharding == columns
    assert jnp.array_equal(out, jnp.arange(32.0).reshape(8, 4) + 1)


def test_a_prefix_that_does_not_match_the_arguments_names_the_key_path():
    rows = NamedSharding(make_mesh(), P("data"))
    f = fx.filter_jit(lambda x: x, in_shardings=(({"a": rows, "c": rows},), None))
    with pytest.raises(ValueError, match=r"in_shardings.*at args\[0\]"):
        f({"a": jnp.ones(8), "b": jnp.ones(8)})


def test_a_prefix_that_does_not_match_the_output_names_the_key_path():
    rows = NamedSharding(make_mesh(), P("data"))
    f = fx.filter_jit(lambda x: {"y": (x, x)}, out_shardings={"y": (rows, rows, rows)})
    with pytest.raises(ValueError, match=r"out_shardings.*at the output\['y'\]"):
        f(jnp.ones(8))


def test_a_leaf_that_is_no_sharding_is_refused_naming_where():
    with pytest.raises(TypeError, match=r"in_shardings\[0\]\[1\] is 'data'"):
        fx.filter_jit(lambda x: x, in_shardings=((None, "data"), None))


def test_donation_keeps_working_with_shardings():
    rows = NamedSharding(make_mesh(), P("data"))
    f = fx.filter_jit(
        lambda x, y: (x + y, "done"),
        donate="all",
        in_shardings=rows,
        out_shardings=(rows, None),
    )
    x = jax.device_put(jnp.ones(8), rows)
    out, label = f(x, jax.device_put(jnp.ones(8), rows))
    assert label == "done" and out.sharding == rows
    assert x.is_deleted()


def test_lower_compiles_with_the_shardings():
    mesh = make_mesh()
    rows = NamedSharding(mesh, P("data"))
    f = fx.filter_jit(lambda x, n: x * n, in_shardings=rows, out_shardings=rows)
    x = jax.device_put(jnp.ones((8, 2)), rows)
    lowered = f.lower(x, 3)
    assert "sharding" in lowered.as_text()
    out = lowered.compile()(x, 3)
    assert out.sharding == rows and jnp.array_equal(out, jnp.full((8, 2), 3.0))


def test_a_method_decorated_in_its_class_body_counts_self_among_args():
    dense, _ = make_dense(make_mesh())
    out = dense.apply_sharded(jnp.ones((8, 4)))
    assert laid_out(out, NamedSharding(make_mesh(), P("data")))
    assert dense.apply_sharded.lower(jnp.ones((8, 4))).compile()(
        jnp.ones((8, 4))
    ).shape == (8, 8)


def test_a_copy_made_by_unflattening_keeps_the_shardings():
    rows = NamedSharding(make_mesh(), P("data"))
    f = fx.filter_jit(fx.nn.Lambda(jnp.sin), out_shardings=rows)
    copy = jax.tree.unflatten(*reversed(jax.tree.flatten(f)))
    assert copy(jnp.zeros(8)).sharding == rows


def test_one_wrapper_class_with_its_policy_built_once():
    # Every mode and sharding is one class; calls without shardings, silencing
    # or a kept first argument take the plain path.
    wrappers = [
        fx.filter_jit(jnp.sin),
        fx.filter_jit(jnp.sin, out_shardings=P()),
        fx.filter_jit(jnp.sin, donate="all-except-first"),
    ]
    assert {type(wrapper) for wrapper in wrappers} == {JitWrapper}
    assert [wrapper.policy.plain for wrapper in wrappers] == [True, False, False]


@pytest.mark.parametrize("kind", AXIS_TYPES)
def test_optax_init_under_filter_jit_follows_the_parameters(kind):
    mesh = make_mesh(kind)
    dense, shardings = make_dense(mesh)
    params = fx.filter(dense, fx.is_array)
    init = fx.filter_jit(optax.adam(1e-2).init, in_shardings=((shardings,), None))
    state = init(params)[0]
    assert state.mu.weight.sharding == shardings.weight
    assert state.nu.bias.sharding == shardings.bias
    assert state.count.sharding == NamedSharding(mesh, P())


@pytest.mark.parametrize("kind", AXIS_TYPES)
@pytest.mark.parametrize("init_under_jit", [False, True], ids=["eager", "jit"])
def test_a_sharded_optax_step_compiles_once(kind, init_under_jit):
    mesh = make_mesh(kind)
    dense, shardings = make_dense(mesh)
    dense = fx.filter_shard(dense, shardings)
    rows = NamedSharding(mesh, P("data"))
    optimiser = optax.adam(1e-2)
    params = fx.filter(dense, fx.is_array)
    if init_under_jit:
        state = fx.filter_jit(optimiser.init, in_shardings=((shardings,), None))(params)
    else:
        state = optimiser.init(params)  # `count` on one device, uncommitted

    @fx.filter_jit(
        in_shardings=((shardings, None, rows, rows), None),
        out_shardings=(shardings, None, None),
    )
    def step(model, state, x, y):
        def loss(model):
            return jnp.mean((jax.vmap(model)(x) - y) ** 2)

        value, grads = fx.filter_value_and_grad(loss)(model)
        updates, state = optimiser.update(grads, state, fx.filter(model, fx.is_array))
        return fx.apply_updates(model, updates), state, value

    x, y = jnp.linspace(-1, 1, 32).reshape(8, 4), jnp.zeros((8, 8))
    losses = []
    with counting_compilations() as first:
        dense, state, value = step(dense, state, x, y)
    losses.append(value)
    with counting_compilations() as later:
        for _ in range(4):
            dense, state, value = step(dense, state, x, y)
            losses.append(value)
    assert first[0] >= 1
    assert later[0] == 0
    assert losses[-1] < losses[0]
    assert state[0].count.sharding == NamedSharding(mesh, P())
    assert state[0].mu.weight.sharding == shardings.weight
    assert dense.weight.sharding == shardings.weight


@pytest.mark.parametrize("kind", AXIS_TYPES)
def test_a_sharded_function_nests_in_filter_grad(kind):
    mesh = make_mesh(kind)
    rows = NamedSharding(mesh, P("data"))
    loss = fx.filter_jit(
        lambda w, x: jnp.sum((x * w) ** 2), in_shardings=((None, rows), None)
    )
    x = jnp.arange(8.0)
    with jax.set_mesh(mesh):  # JAX wants it for `Explicit` axes inside `grad`
        grad = fx.filter_grad(loss)(jnp.array(2.0), x)
    assert jnp.allclose(grad, 2 * 2.0 * jnp.sum(x**2))
