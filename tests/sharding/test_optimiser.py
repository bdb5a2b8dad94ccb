"""An optax state follows its sharded parameters: built by `filter_jit` of
`init` or with the model by `sharded_init`, every array on its parameter's
sharding and every scalar replicated on the mesh; a sharded adamw step
compiles once; a restore onto another mesh keeps every leaf's sharding."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jax
import jax.monitoring
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

import filterax as fx

KEY = jax.random.key(0)
RULES = {"out": "model", "in": "data"}
OPTIMISER = optax.adamw(1e-2)

_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
_compilations = [0]


def _count_compilation(event: str, duration: float, **kwargs: object) -> None:
    if event == _COMPILE_EVENT:
        _compilations[0] += 1


jax.monitoring.register_event_duration_secs_listener(_count_compilation)


@contextlib.contextmanager
def counting_compilations() -> Iterator[list[int]]:
    start = _compilations[0]
    counted = [0]
    yield counted
    counted[0] = _compilations[0] - start


def _under(mesh: jax.sharding.Mesh) -> Any:
    # JAX runs a model of `Explicit`-typed arrays only under its mesh.
    if AxisType.Explicit in mesh.axis_types:
        return jax.set_mesh(mesh)
    return contextlib.nullcontext()


def make(key: jax.Array) -> tuple[fx.nn.MLP, Any]:
    """The one recipe: the model and its optimiser state built together."""
    model = fx.nn.MLP(8, 4, 16, depth=2, key=key)
    return model, OPTIMISER.init(fx.filter(model, fx.is_array))


def _arrays_with_paths(tree: Any) -> list[tuple[str, Any]]:
    return [
        (jax.tree_util.keystr(path), leaf)
        for path, leaf in jax.tree_util.tree_leaves_with_path(tree)
        if isinstance(leaf, (jax.Array, jax.ShapeDtypeStruct))
    ]


def assert_follows(state: Any, params: Any, mesh: jax.sharding.Mesh) -> None:
    """Every array of the optax state `state` with a parameter's shape sits on
    that parameter's sharding (`mu` and `nu` have the parameters' structure);
    every scalar is replicated on `mesh`."""
    by_suffix = {path: leaf.sharding for path, leaf in _arrays_with_paths(params)}
    checked = 0
    for path, leaf in _arrays_with_paths(state):
        sharding = leaf.sharding
        assert isinstance(sharding, NamedSharding), (path, sharding)
        assert sharding.mesh.shape == mesh.shape, path
        if leaf.ndim == 0:
            assert sharding.spec == P(), path
            continue
        suffix = path[path.index(".layers") :]
        assert sharding.spec == by_suffix[suffix].spec, path
        checked += 1
    assert checked == 2 * len(by_suffix)  # mu and nu


@pytest.mark.parametrize("kind", [AxisType.Auto, AxisType.Explicit])
def test_filter_jit_of_init_follows_the_parameters(kind):
    mesh = jax.make_mesh((4, 2), ("data", "model"), axis_types=(kind,) * 2)
    model = fx.sharded_init(fx.nn.MLP, mesh, RULES)(8, 4, 16, depth=2, key=KEY)
    params = fx.filter(model, fx.is_array)
    with _under(mesh):
        state = fx.filter_jit(OPTIMISER.init)(params)
    assert_follows(state, params, mesh)


@pytest.mark.parametrize("kind", [AxisType.Auto, AxisType.Explicit])
def test_sharded_init_builds_model_and_state_together(kind):
    mesh = jax.make_mesh((4, 2), ("data", "model"), axis_types=(kind,) * 2)
    init = fx.sharded_init(make, mesh, RULES)
    model, state = init(KEY)
    assert_follows(state, fx.filter(model, fx.is_array), mesh)
    # The template of a restore: every leaf keeps its sharding.
    like = fx.filter_eval_shape(init, KEY)
    structs = _arrays_with_paths(like)
    assert structs and all(leaf.sharding is not None for _, leaf in structs)
    for (path, struct), (_, leaf) in zip(structs, _arrays_with_paths((model, state))):
        assert struct.sharding == leaf.sharding, path


def _step(model: Any, state: Any, x: jax.Array) -> tuple[Any, Any, jax.Array]:
    def loss(model: Any) -> jax.Array:
        return jnp.mean(jax.vmap(model)(x) ** 2)

    value, grads = fx.filter_value_and_grad(loss)(model)
    updates, state = OPTIMISER.update(grads, state, fx.filter(model, fx.is_array))
    return fx.apply_updates(model, updates), state, value


@pytest.mark.parametrize("kind", [AxisType.Auto, AxisType.Explicit])
@pytest.mark.parametrize("built_by", ["filter_jit", "sharded_init"])
def test_a_sharded_adamw_step_compiles_once_from_its_first_call(kind, built_by):
    mesh = jax.make_mesh((4, 2), ("data", "model"), axis_types=(kind,) * 2)
    with _under(mesh):
        if built_by == "sharded_init":
            model, state = fx.sharded_init(make, mesh, RULES)(KEY)
        else:
            model = fx.sharded_init(fx.nn.MLP, mesh, RULES)(8, 4, 16, depth=2, key=KEY)
            state = fx.filter_jit(OPTIMISER.init)(fx.filter(model, fx.is_array))
        x = jax.device_put(
            jnp.linspace(-1, 1, 64).reshape(8, 8), NamedSharding(mesh, P("data"))
        )
        # A new function: nothing compiled for it yet.
        step = fx.filter_jit(lambda model, state, x: _step(model, state, x))
        with counting_compilations() as first:
            model, state, loss0 = step(model, state, x)
        with counting_compilations() as later:
            for _ in range(3):
                model, state, loss = step(model, state, x)
    assert first[0] >= 1
    assert later[0] == 0
    assert float(loss) < float(loss0)
    assert_follows(state, fx.filter(model, fx.is_array), mesh)


def test_an_output_the_function_lays_out_itself_is_left_alone():
    mesh = jax.make_mesh((4, 2), ("data", "model"), axis_types=(AxisType.Auto,) * 2)
    rows = NamedSharding(mesh, P("data", None))
    columns = NamedSharding(mesh, P(None, "model"))
    x = jax.device_put(jnp.ones((8, 4)), rows)

    @fx.filter_jit
    def both(x: jax.Array) -> tuple[jax.Array, jax.Array]:
        return jnp.zeros_like(x), fx.filter_shard(jnp.zeros_like(x), columns)

    follows, chosen = both(x)
    assert follows.sharding.is_equivalent_to(rows, 2)
    assert chosen.sharding.is_equivalent_to(columns, 2)


def test_restore_onto_another_mesh_keeps_every_optimiser_sharding(tmp_path: Path):
    fxc = pytest.importorskip("filterax.checkpoint")
    wide = jax.make_mesh((2, 4), ("data", "model"), axis_types=(AxisType.Auto,) * 2)
    tall = jax.make_mesh((4, 2), ("data", "model"), axis_types=(AxisType.Auto,) * 2)
    saved = fx.sharded_init(make, wide, RULES)(KEY)
    fxc.save(tmp_path / "ckpt", saved)
    init = fx.sharded_init(make, tall, RULES)
    like = fx.filter_eval_shape(init, KEY)
    model, state = fxc.restore(tmp_path / "ckpt", like)
    assert_follows(state, fx.filter(model, fx.is_array), tall)
    for (path, leaf), (_, struct) in zip(
        _arrays_with_paths((model, state)), _arrays_with_paths(like)
    ):
        assert leaf.sharding == struct.sharding, path
        assert leaf.sharding.mesh.shape == tall.shape, path
    for ours, theirs in zip(jax.tree.leaves((model, state)), jax.tree.leaves(saved)):
        if isinstance(ours, jax.Array):
            np.testing.assert_array_equal(np.asarray(ours), np.asarray(theirs))
    # The restored state feeds a step that compiles once.
    step = fx.filter_jit(_step)
    x = jax.device_put(jnp.ones((8, 8)), NamedSharding(tall, P("data")))
    model, state, _ = step(model, state, x)
    with counting_compilations() as later:
        step(model, state, x)
    assert later[0] == 0


def test_following_keeps_refs_keys_and_leaves_one_device_calls_alone():
    mesh = jax.make_mesh((4, 2), ("data", "model"), axis_types=(AxisType.Auto,) * 2)
    replicated = NamedSharding(mesh, P())
    x = jax.device_put(jnp.ones((8, 4)), NamedSharding(mesh, P("data")))
    counter = jax.new_ref(jax.device_put(jnp.zeros(2), replicated))

    @fx.filter_jit
    def f(x, counter, key):
        counter[...] += 1
        return x * 2, counter, jax.random.split(key), jnp.sum(x)

    y, same, keys, total = f(x, counter, jax.random.key(0))
    assert same is counter and np.array_equal(np.asarray(counter[...]), [1, 1])
    assert y.sharding.spec == P("data")
    assert total.sharding == replicated
    assert keys.shape == (2,)
    # On one device nothing is laid out: the outputs stay there.
    one = f(jnp.ones((8, 4)), jax.new_ref(jnp.zeros(2)), jax.random.key(0))[3]
    assert len(one.sharding.device_set) == 1
