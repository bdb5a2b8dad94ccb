"""`filterax.checkpoint.save` / `restore`: every kind of leaf, restored onto
`like`'s shardings, and every mismatch named by its key path before anything
is read."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

import filterax as fx
import filterax.checkpoint as fxc


class Model(fx.Module):
    mlp: fx.nn.MLP
    frozen: fx.NonDifferentiable
    stream: fx.RngStream
    keys: jax.Array
    name: str
    steps: int
    rate: float
    phase: complex
    flag: bool
    table: np.ndarray
    scale: np.float32
    counter: Any
    weak: jax.Array


def _model(seed: int) -> tuple[Model, Any, Any]:
    key = jax.random.key(seed)
    mlp = fx.nn.MLP(4, 8, 16, 2, key=key)
    _, state = fx.nn.make_with_state(fx.nn.BatchNorm)(3, "batch", mode="ema")
    model = Model(
        mlp=mlp,
        frozen=fx.NonDifferentiable(jnp.arange(4.0) + seed),
        stream=fx.RngStream(jax.random.key(seed + 1)),
        keys=jax.random.split(jax.random.key(seed + 2), 8),
        name="model",
        steps=10 + seed,
        rate=0.5 + seed,
        phase=1 + 2j * seed,
        flag=bool(seed),
        table=np.arange(6).reshape(2, 3) + seed,
        scale=np.float32(seed + 0.25),
        counter=jax.new_ref(jnp.array(seed, jnp.int32)),
        weak=jnp.asarray(float(seed)),
    )
    optimiser = optax.adam(1e-3)
    opt_state = optimiser.init(fx.filter(model.mlp, fx.is_inexact_array))
    return model, state, opt_state


def _values(tree: Any) -> list[Any]:
    """Every leaf as a comparable host value (Refs read, keys as key data)."""
    out = []
    for leaf in jax.tree.leaves(tree):
        if fx.is_ref(leaf):
            leaf = leaf[...]
        if fx.is_key_array(leaf):
            leaf = jax.random.key_data(leaf)
        out.append(np.asarray(leaf) if fx.is_array(leaf) else leaf)
    return out


def _assert_same(a: Any, b: Any) -> None:
    assert jax.tree.structure(a) == jax.tree.structure(b)
    for x, y in zip(_values(a), _values(b)):
        if isinstance(x, np.ndarray):
            assert x.dtype == y.dtype and np.array_equal(x, y)
        else:
            assert type(x) is type(y) and x == y


def test_every_kind_of_leaf_round_trips(tmp_path: Path) -> None:
    saved = _model(1)
    fxc.save(tmp_path / "ckpt", saved)
    restored = fxc.restore(tmp_path / "ckpt", _model(0))
    _assert_same(restored, saved)
    model = restored[0]
    assert fx.is_ref(model.counter) and fx.is_ref(model.stream.count)
    assert model.mlp.activation is jax.nn.relu
    assert type(model.scale) is np.float32 and isinstance(model.table, np.ndarray)
    assert model.weak.weak_type and not model.frozen.value.weak_type


def test_a_ref_in_like_becomes_a_new_ref_holding_the_saved_value(
    tmp_path: Path,
) -> None:
    live = jax.new_ref(jnp.arange(3.0))
    fxc.save(tmp_path / "ckpt", {"buffer": live})
    live[...] = jnp.full(3, 7.0)  # training goes on after the save
    restored = fxc.restore(tmp_path / "ckpt", {"buffer": live})
    assert restored["buffer"] is not live
    assert np.array_equal(restored["buffer"][...], np.arange(3.0))
    assert np.array_equal(live[...], np.full(3, 7.0))


def test_restores_onto_the_shardings_of_an_abstract_like_on_another_mesh(
    tmp_path: Path,
) -> None:
    saved_mesh = jax.make_mesh((8,), ("data",))
    weight = jax.device_put(
        jnp.arange(64.0).reshape(8, 8), NamedSharding(saved_mesh, P("data"))
    )
    keys = jax.device_put(
        jax.random.split(jax.random.key(3), 8), NamedSharding(saved_mesh, P("data"))
    )
    fxc.save(tmp_path / "ckpt", {"w": weight, "keys": keys, "act": jax.nn.gelu})

    mesh = jax.make_mesh((2, 4), ("a", "b"))
    like = {
        "w": jax.ShapeDtypeStruct(
            (8, 8), jnp.float32, sharding=NamedSharding(mesh, P("b", "a"))
        ),
        "keys": jax.ShapeDtypeStruct(
            (8,), keys.dtype, sharding=NamedSharding(mesh, P("a"))
        ),
        "act": jax.nn.gelu,
    }
    restored = fxc.restore(tmp_path / "ckpt", like)
    assert restored["w"].sharding == like["w"].sharding
    assert restored["keys"].sharding == like["keys"].sharding
    assert np.array_equal(np.asarray(restored["w"]), np.arange(64.0).reshape(8, 8))
    assert np.array_equal(
        np.asarray(jax.random.key_data(restored["keys"])),
        np.asarray(jax.random.key_data(keys)),
    )


def test_a_template_sharding_that_does_not_fit_names_the_key_path(
    tmp_path: Path,
) -> None:
    fxc.save(tmp_path / "ckpt", {"w": jnp.zeros((6, 4))})
    mesh = jax.make_mesh((4, 2), ("a", "b"))
    like = {
        "w": jax.ShapeDtypeStruct(
            (6, 4), jnp.float32, sharding=NamedSharding(mesh, P("a", "b"))
        )
    }
    with pytest.raises(
        ValueError, match=r"restore: at like\['w'\]: .* 4 does not divide 6"
    ):
        fxc.restore(tmp_path / "ckpt", like)


def test_abstract_mesh_shardings_resolve_against_the_mesh_that_is_set(
    tmp_path: Path,
) -> None:
    mesh = jax.make_mesh((4, 2), ("x", "y"))
    model = fx.nn.Linear(8, 4, key=jax.random.key(0))
    fxc.save(tmp_path / "ckpt", model)

    def build() -> fx.nn.Linear:
        linear = fx.nn.Linear(8, 4, key=jax.random.key(1))
        return fx.filter_shard(linear, NamedSharding(mesh, P()))

    like = fx.filter_eval_shape(build)
    sharding = like.weight.sharding
    if isinstance(getattr(sharding, "mesh", None), jax.sharding.AbstractMesh):
        with pytest.raises(ValueError, match=r"\.weight.*jax\.set_mesh"):
            fxc.restore(tmp_path / "ckpt", like)
    with jax.set_mesh(mesh):
        restored = fxc.restore(tmp_path / "ckpt", like)
    assert restored.weight.sharding.mesh == mesh
    assert fx.tree_equal(restored, model)


def test_a_struct_without_sharding_lands_on_the_default_device(tmp_path: Path) -> None:
    fxc.save(tmp_path / "ckpt", [jnp.ones(3)])
    (restored,) = fxc.restore(
        tmp_path / "ckpt", [jax.ShapeDtypeStruct((3,), jnp.float32)]
    )
    assert restored.devices() == {jax.devices()[0]}


def test_a_struct_marked_is_ref_restores_as_a_ref(tmp_path: Path) -> None:
    fxc.save(tmp_path / "ckpt", jax.new_ref(jnp.ones(2)))
    restored = fxc.restore(
        tmp_path / "ckpt", jax.ShapeDtypeStruct((2,), jnp.float32, is_ref=True)
    )
    assert fx.is_ref(restored) and np.array_equal(restored[...], np.ones(2))


def _saved(tmp_path: Path, tree: Any) -> Path:
    fxc.save(tmp_path / "ckpt", tree)
    return tmp_path / "ckpt"


@pytest.mark.parametrize(
    ("saved", "like", "message"),
    [
        (
            {"w": jnp.zeros(3)},
            {"w": jnp.zeros(4)},
            r"at \['w'\].*float32\[3\].*float32\[4\]",
        ),
        (
            {"w": jnp.zeros(3)},
            {"w": jnp.zeros(3, jnp.int32)},
            r"at \['w'\].*int32\[3\]",
        ),
        ({"act": jax.nn.relu}, {"act": jax.nn.gelu}, r"at \['act'\].*relu.*gelu"),
        ({"name": "adam"}, {"name": "sgd"}, r"at \['name'\].*adam.*sgd"),
        (
            {"a": jnp.zeros(2)},
            {"a": jnp.zeros(2), "b": jnp.zeros(2)},
            r"structure.*\['b'\]",
        ),
        (
            (jnp.zeros(2), None),
            (jnp.zeros(2), jnp.zeros(1)),
            r"structure differs at \[1\]",
        ),
        (
            {"w": np.zeros(2)},
            {"w": jnp.zeros(2)},
            r"NumPy float64\[2\].*JAX float32\[2\]",
        ),
        ({"n": 1}, {"n": 1.0}, r"at \['n'\].*Python int.*Python float"),
    ],
    ids=[
        "shape",
        "dtype",
        "function",
        "string",
        "extra-leaf",
        "none",
        "numpy-vs-jax",
        "scalar",
    ],
)
def test_mismatches_name_the_key_path(
    tmp_path: Path, saved: Any, like: Any, message: str
) -> None:
    directory = _saved(tmp_path, saved)
    with pytest.raises(fx.SerialisationError, match=message):
        fxc.restore(directory, like)


def test_a_module_field_mismatch_names_the_field(tmp_path: Path) -> None:
    directory = _saved(tmp_path, fx.nn.MLP(2, 3, 4, 1, key=jax.random.key(0)))
    like = fx.nn.MLP(2, 3, 4, 1, activation=jax.nn.tanh, key=jax.random.key(0))
    with pytest.raises(fx.SerialisationError, match=r"\.activation.*relu.*tanh"):
        fxc.restore(directory, like)


def test_another_prng_implementation_is_a_mismatch(tmp_path: Path) -> None:
    directory = _saved(tmp_path, {"key": jax.random.key(0, impl="threefry2x32")})
    with pytest.raises(fx.SerialisationError, match=r"\['key'\].*threefry2x32.*rbg"):
        fxc.restore(directory, {"key": jax.random.key(0, impl="rbg")})


def test_nothing_is_read_before_the_whole_tree_matches(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    directory = _saved(tmp_path, {"a": jnp.ones(3), "z": "last"})
    array_reads = []
    original = ocp.args.StandardRestore
    monkeypatch.setattr(
        ocp.args,
        "StandardRestore",
        lambda *a, **k: array_reads.append(1) or original(*a, **k),
    )
    with pytest.raises(fx.SerialisationError, match=r"\['z'\]"):
        fxc.restore(directory, {"a": jnp.zeros(3), "z": "other"})
    assert array_reads == []
    fxc.restore(directory, {"a": jnp.zeros(3), "z": "last"})
    assert array_reads == [1]


def test_save_refuses_what_it_cannot_save_and_writes_nothing(tmp_path: Path) -> None:
    deleted = jnp.ones(3)
    deleted.delete()
    with pytest.raises(ValueError, match=r"\['b'\].*deleted"):
        fxc.save(tmp_path / "a", {"a": jnp.ones(2), "b": deleted})
    with pytest.raises(TypeError, match=r"\['s'\].*dtype <U1"):
        fxc.save(tmp_path / "a", {"s": np.array(["x"])})
    with pytest.raises(TypeError, match=r"\[0\].*ShapeDtypeStruct"):
        fxc.save(tmp_path / "a", [jax.ShapeDtypeStruct((2,), jnp.float32)])

    @jax.jit
    def inside(x: jax.Array) -> jax.Array:
        fxc.save(tmp_path / "a", {"x": x})
        return x

    with pytest.raises(TypeError, match=r"\['x'\].*traced"):
        inside(jnp.ones(2))
    assert os.listdir(tmp_path) == []


def test_save_does_not_overwrite(tmp_path: Path) -> None:
    fxc.save(tmp_path / "ckpt", [jnp.ones(2)])
    with pytest.raises(FileExistsError, match="Checkpointer"):
        fxc.save(tmp_path / "ckpt", [jnp.zeros(2)])
    assert np.array_equal(fxc.restore(tmp_path / "ckpt", [jnp.zeros(2)])[0], np.ones(2))


def test_restore_from_nothing_or_from_a_foreign_checkpoint(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        fxc.restore(tmp_path / "missing", [jnp.zeros(2)])
    with ocp.StandardCheckpointer() as checkpointer:
        checkpointer.save(tmp_path / "orbax", {"w": jnp.ones(2)})
    with pytest.raises(Exception, match=r"filterax"):
        fxc.restore(tmp_path / "orbax", {"w": jnp.zeros(2)})


def test_save_without_waiting_completes_on_wait(tmp_path: Path) -> None:
    pending = fxc.save(tmp_path / "ckpt", {"w": jnp.arange(3.0)}, wait=False)
    assert pending is not None
    pending.wait()
    pending.wait()  # a second wait does nothing
    restored = fxc.restore(tmp_path / "ckpt", {"w": jnp.zeros(3)})
    assert np.array_equal(restored["w"], np.arange(3.0))
