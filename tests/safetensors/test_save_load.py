"""`save` and `load` on one device: names by key path, what round-trips
(typed keys, `NonDifferentiable`, `State`, Refs, NumPy leaves, bfloat16), the
cast to `like`'s dtypes, and atomic writes."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
import safetensors.numpy
from safetensors import safe_open

import filterax as fx
import filterax.safetensors as fxs


class Model(fx.Module):
    mlp: fx.nn.MLP
    frozen: fx.NonDifferentiable
    keys: jax.Array
    half: jax.Array
    table: np.ndarray
    scale: np.float32
    counter: Any
    activation: Any
    name: str
    steps: int


def _model(seed: int) -> tuple[Model, fx.nn.State]:
    key = jax.random.key(seed)
    _, state = fx.nn.make_with_state(fx.nn.BatchNorm)(3, "batch", mode="batch")
    state = jax.tree.map(lambda x: x + seed, state)
    model = Model(
        mlp=fx.nn.MLP(3, 2, 4, 1, key=key),
        frozen=fx.NonDifferentiable(jnp.arange(4.0) + seed),
        keys=jax.random.split(jax.random.key(seed + 1), 3),
        half=(jnp.arange(5) + seed).astype(jnp.bfloat16),
        table=np.arange(6).reshape(2, 3) + seed,
        scale=np.float32(seed + 0.25),
        counter=jax.new_ref(jnp.array(seed, jnp.int32)),
        activation=jax.nn.relu,
        name="model",
        steps=seed,
    )
    return model, state


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


def _assert_same_arrays(a: Any, b: Any) -> None:
    assert jax.tree.structure(a) == jax.tree.structure(b)
    for x, y in zip(_values(a), _values(b), strict=True):
        if isinstance(x, np.ndarray):
            assert x.dtype == y.dtype and np.array_equal(x, y)


def _names(path: Path) -> list[str]:
    with safe_open(path, framework="numpy") as file:
        return sorted(file.keys())


def test_names_are_key_paths_joined_with_dots(tmp_path: Path) -> None:
    model, state = _model(0)
    fxs.save(tmp_path / "m.safetensors", (model, state))
    assert _names(tmp_path / "m.safetensors") == sorted(
        [
            "0.mlp.layers.0.weight",
            "0.mlp.layers.0.bias",
            "0.mlp.layers.1.weight",
            "0.mlp.layers.1.bias",
            "0.frozen.value",
            "0.keys",
            "0.half",
            "0.table",
            "0.scale",
            "0.counter",
            "1.BatchNorm.batch_counter",
            "1.BatchNorm.batch_state_index.0",
            "1.BatchNorm.batch_state_index.1",
        ]
    )


def test_round_trip_of_keys_non_differentiable_state_refs_and_numpy_leaves(
    tmp_path: Path,
) -> None:
    model, state = _model(1)
    fxs.save(tmp_path / "m.safetensors", (model, state))
    like = _model(5)
    loaded = fxs.load(tmp_path / "m.safetensors", like)
    _assert_same_arrays(loaded, (model, state))
    loaded_model = loaded[0]
    assert fx.is_key_array(loaded_model.keys)
    assert str(jax.random.key_impl(loaded_model.keys)) == "threefry2x32"
    assert loaded_model.half.dtype == jnp.bfloat16
    assert isinstance(loaded_model.table, np.ndarray)
    assert isinstance(loaded_model.scale, np.float32)
    # A new Ref holding the saved value; `like`'s Ref is left alone.
    assert (
        fx.is_ref(loaded_model.counter) and loaded_model.counter is not like[0].counter
    )
    assert int(like[0].counter[...]) == 5
    # Non-array leaves are `like`'s.
    assert loaded_model.steps == 5 and loaded_model.activation is jax.nn.relu


def test_load_into_an_abstract_like(tmp_path: Path) -> None:
    model, _ = _model(2)
    fxs.save(tmp_path / "m.safetensors", model)
    like = fx.filter_eval_shape(lambda: _model(7)[0])
    loaded = fxs.load(tmp_path / "m.safetensors", like)
    assert isinstance(loaded.mlp.layers[0].weight, jax.Array)
    assert fx.is_key_array(loaded.keys)
    np.testing.assert_array_equal(
        jax.random.key_data(loaded.keys), jax.random.key_data(model.keys)
    )
    np.testing.assert_array_equal(loaded.mlp.layers[1].bias, model.mlp.layers[1].bias)


def test_key_impl_is_in_the_metadata_and_checked(tmp_path: Path) -> None:
    keys = {"k": jax.random.split(jax.random.key(0, impl="rbg"), 2)}
    fxs.save(tmp_path / "k.safetensors", keys, metadata={"source": "test"})
    with safe_open(tmp_path / "k.safetensors", framework="numpy") as file:
        metadata = file.metadata()
    assert metadata["source"] == "test"
    assert metadata["filterax.key_impls"] == '{"k": "rbg"}'
    loaded = fxs.load(tmp_path / "k.safetensors", keys)
    assert str(jax.random.key_impl(loaded["k"])) == "rbg"
    threefry = {"k": jax.random.split(jax.random.key(0), 2)}
    with pytest.raises(fx.SerialisationError, match=r"'k' holds rbg keys.*\['k'\]"):
        fxs.load(tmp_path / "k.safetensors", threefry)


def test_each_tensor_is_cast_to_its_leafs_dtype(tmp_path: Path) -> None:
    values = np.arange(6, dtype=np.float64).reshape(2, 3) / 4
    safetensors.numpy.save_file(
        {
            "a": values,
            "b": values.astype(ml_dtypes.bfloat16),
            "c": values.astype(np.float32),
        },
        tmp_path / "f.safetensors",
    )
    like = {
        "a": jnp.zeros((2, 3), jnp.float32),
        "b": jnp.zeros((2, 3), jnp.float32),
        "c": jnp.zeros((2, 3), jnp.bfloat16),
    }
    loaded = fxs.load(tmp_path / "f.safetensors", like)
    assert {name: leaf.dtype for name, leaf in loaded.items()} == {
        "a": jnp.float32,
        "b": jnp.float32,
        "c": jnp.bfloat16,
    }
    for leaf in loaded.values():
        np.testing.assert_array_equal(np.asarray(leaf, np.float64), values)


def test_weakly_typed_leaves_stay_weakly_typed(tmp_path: Path) -> None:
    fxs.save(tmp_path / "w.safetensors", {"w": jnp.asarray(2.5)})
    loaded = fxs.load(tmp_path / "w.safetensors", {"w": jnp.asarray(0.0)})
    assert loaded["w"].weak_type and float(loaded["w"]) == 2.5


def test_empty_tensors_round_trip(tmp_path: Path) -> None:
    fxs.save(tmp_path / "e.safetensors", {"e": jnp.zeros((0, 3))})
    loaded = fxs.load(tmp_path / "e.safetensors", {"e": jnp.ones((0, 3))})
    assert loaded["e"].shape == (0, 3)


def test_save_refuses_what_it_cannot_store_and_names_the_key_path(
    tmp_path: Path,
) -> None:
    with pytest.raises(TypeError, match=r"\['b'\].*ShapeDtypeStruct"):
        fxs.save(tmp_path / "x", {"b": jax.ShapeDtypeStruct((2,), jnp.float32)})
    with pytest.raises(TypeError, match=r"\['c'\].*complex128"):
        fxs.save(tmp_path / "x", {"c": np.zeros(2, np.complex128)})
    with pytest.raises(TypeError, match="metadata must map str to str"):
        fxs.save(tmp_path / "x", {"a": jnp.zeros(2)}, metadata={"n": 1})  # type: ignore[dict-item]
    with pytest.raises(ValueError, match=r"\['a'\]\['b'\] and \['a.b'\].*'a.b'"):
        fxs.save(tmp_path / "x", {"a.b": jnp.zeros(1), "a": {"b": jnp.zeros(1)}})
    assert not os.listdir(tmp_path)  # nothing written


def test_a_failed_write_leaves_the_old_file_and_no_temporary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "m.safetensors"
    fxs.save(path, {"a": jnp.ones(3)})
    before = path.read_bytes()

    def killed_midway(tensors: Any, filename: str, metadata: Any = None) -> None:
        Path(filename).write_bytes(b"partial")
        raise KeyboardInterrupt

    monkeypatch.setattr(safetensors.numpy, "save_file", killed_midway)
    with pytest.raises(KeyboardInterrupt):
        fxs.save(path, {"a": jnp.zeros(3)})
    assert path.read_bytes() == before
    assert os.listdir(tmp_path) == ["m.safetensors"]


def test_save_replaces_an_existing_file(tmp_path: Path) -> None:
    path = tmp_path / "m.safetensors"
    fxs.save(path, {"a": jnp.ones(3)})
    fxs.save(path, {"a": jnp.full(3, 2.0)})
    np.testing.assert_array_equal(fxs.load(path, {"a": jnp.zeros(3)})["a"], 2.0)
    assert os.listdir(tmp_path) == ["m.safetensors"]
