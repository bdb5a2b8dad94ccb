"""`sharded_init`: constructors run compiled, each array made on its shard."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

import filterax as fx

KEY = jax.random.key(0)
RULES = {"heads": "model", "embed": "data", "stack": "data", "out": "model"}
ATTENTION_RULES = {"heads": "model", "embed": "data"}


def test_same_values_as_eager_on_their_shardings(mesh):
    make = fx.sharded_init(fx.nn.MultiheadAttention, mesh, ATTENTION_RULES)
    with jax.set_mesh(mesh):
        model = make(2, 8, key=KEY)
    eager = fx.nn.MultiheadAttention(2, 8, key=KEY)
    assert fx.tree_equal(model, eager)
    assert model.query_proj.weight.sharding == NamedSharding(mesh, P("model", "data"))
    assert model.query_proj.weight.addressable_shards[0].data.shape == (4, 2)
    assert model.num_heads == 2 and model.dropout == eager.dropout


def test_vmapped_constructor(mesh):
    make = fx.sharded_init(
        fx.filter_vmap(lambda k: fx.nn.Linear(8, 4, key=k)),
        mesh,
        {"stack": "data", "out": "model"},
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

    out = fx.sharded_init(make, mesh, {"out": "model"})(KEY)
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


def test_building_in_stages_keeps_the_peak_near_the_share():
    """The peak per device of the very computations `sharded_init` compiles
    (XLA's compiled memory analysis, nothing run, so deterministic), as a
    multiple of a device's share of the model. In one stage the random
    initialisers' temporaries reach about twice the share; in eight, only the
    last stage's temporaries come on top of the share (a few times its
    largest array), so the model must have many arrays: here 32 layers."""
    from filterax._sharding._init import _plan

    mesh = jax.make_mesh((8,), ("model",))
    rules = {"out": "model", "in": None}

    def make(key):
        return [fx.nn.Linear(256, 256, key=k) for k in jax.random.split(key, 32)]

    one, eight = (_plan(make, mesh, rules, n, (KEY,), {}) for n in (1, 8))
    share = sum(one.sizes)
    assert share == sum(eight.sizes) == 32 * (256 * 256 + 256) * 4 // 8
    assert (len(one.stages), len(eight.stages)) == (1, 8)
    ratio_one = one.peak_bytes_per_device() / share
    ratio_eight = eight.peak_bytes_per_device() / share
    assert ratio_eight <= 1.25 < 1.8 < ratio_one


def test_under_an_explicit_mesh_each_device_computes_only_its_part():
    """Under `jax.set_mesh` with `Explicit` axes the constructor's
    intermediates would be typed replicated, each device computing every
    parameter whole (about 18 times its share here): the build's peak must
    stay what it is on `Auto` axes."""
    from filterax._sharding._init import _plan

    def make(key):
        return [fx.nn.Linear(128, 128, key=k) for k in jax.random.split(key, 4)]

    ratios = {}
    for kind in (AxisType.Auto, AxisType.Explicit):
        mesh = jax.make_mesh((8,), ("model",), axis_types=(kind,))
        with jax.set_mesh(mesh):
            plan = _plan(make, mesh, {"out": "model"}, 1, (KEY,), {})
            ratios[kind] = plan.peak_bytes_per_device() / sum(plan.sizes)
            built = fx.sharded_init(make, mesh, {"out": "model"})(KEY)
        assert fx.tree_equal(built, make(KEY))
        assert built[0].weight.sharding.spec == P("model", None)
    assert ratios[AxisType.Explicit] == ratios[AxisType.Auto] < 3


class _Layer(fx.Module):
    embedding: fx.nn.Embedding
    mlp: fx.nn.MLP
    norm: fx.nn.LayerNorm

    def __init__(self, key: jax.Array):
        embedding_key, mlp_key = jax.random.split(key)
        self.embedding = fx.nn.Embedding(16, 8, key=embedding_key)
        self.mlp = fx.nn.MLP(8, 8, 16, 2, key=mlp_key)
        self.norm = fx.nn.LayerNorm(8)


@pytest.mark.parametrize("stages", [2, 5, 100])
def test_a_mapped_stack_built_in_runs_gives_the_values_of_one_call(mesh, stages):
    # 5 layers: in runs of 3 (the second overlapping the first), of 1, and of
    # 1 again (more stages than layers).
    make = fx.filter_vmap(_Layer)
    keys = jax.random.split(KEY, 5)
    rules = {"stack": None, "out": "model", "vocab": "data"}
    with jax.set_mesh(mesh):
        built = fx.sharded_init(make, mesh, rules, stages=stages, mapped=True)(keys)
    assert fx.tree_equal(built, make(keys))
    assert built.mlp.layers[0].weight.sharding == NamedSharding(
        mesh, P(None, "model", None)
    )
    assert built.embedding.weight.sharding.spec == P(None, "data", None)
    assert built.mlp.activation is make(keys).mlp.activation


def test_a_mapped_stack_in_runs_keeps_the_peak_near_the_share():
    """A stack is one array per parameter: whole-array stages cannot help,
    runs of the stack can (peak about 1 + 4 / runs times the share, plus
    the keys)."""
    from filterax._sharding._init import _plan

    mesh = jax.make_mesh((8,), ("model",))
    rules = {"stack": None, "out": "model", "in": None}
    make = fx.filter_vmap(lambda key: fx.nn.Linear(256, 256, key=key))
    keys = (jax.random.split(KEY, 32),)
    whole = _plan(make, mesh, rules, 16, keys, {})
    runs = _plan(make, mesh, rules, 32, keys, {}, mapped=True)
    share = sum(runs.sizes)
    assert share == 32 * (256 * 256 + 256) * 4 // 8
    assert runs.peak_bytes_per_device() / share <= 1.25
    assert whole.peak_bytes_per_device() / share > 3


def test_mapped_checks_the_stack(mesh):
    make = fx.filter_vmap(lambda key: fx.nn.Linear(8, 8, key=key))
    keys = jax.random.split(KEY, 4)
    rules = {"out": "model"}
    with pytest.raises(ValueError, match="one length"):
        fx.sharded_init(lambda a, b: make(a), mesh, rules, stages=2, mapped=True)(
            keys, jax.numpy.ones(3)
        )
    with pytest.raises(ValueError, match="leading axis of length 4"):
        fx.sharded_init(
            lambda k: (make(k), jax.numpy.ones(3)), mesh, rules, stages=2, mapped=True
        )(keys)
    with pytest.raises(ValueError, match="must not be split.*'data'"):
        fx.sharded_init(
            make, mesh, {"stack": "data", "out": "model"}, stages=2, mapped=True
        )(keys)
    with pytest.raises(TypeError, match="mapped"):
        fx.sharded_init(make, mesh, rules, mapped=1)  # type: ignore[arg-type]


def test_eval_shape_of_a_sharded_init_under_an_explicit_mesh_gives_concrete_shardings():
    # The restore template of the scaling-out recipe: `filter_eval_shape` of
    # the `sharded_init` function, whose own planning evaluates shapes inside
    # the outer trace, where only the abstract mesh exists.
    mesh = jax.make_mesh((2, 4), ("data", "model"), axis_types=(AxisType.Explicit,) * 2)
    rules = {"out": "model", "in": None}
    init = fx.sharded_init(lambda key: fx.nn.Linear(8, 8, key=key), mesh, rules)
    with jax.set_mesh(mesh):
        like = fx.filter_eval_shape(init, jax.random.key(0))
    assert like.weight.sharding == NamedSharding(mesh, P("model", None))
    assert like.bias.sharding == NamedSharding(mesh, P("model"))
