"""Loading onto shardings, on the 8 simulated devices: every array lands on
its leaf's sharding, and only the slices the devices hold are read from the
file, each distinct one once."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

import filterax as fx
import filterax.safetensors as fxs
from filterax.safetensors import _load

# `sharding_of` matches `jax.tree_util.keystr` paths (`.layers[0].weight`).
RULES = [
    (r"\.layers\[0\]\.weight", P("data", "model")),
    (r"\.layers\[1\]\.weight", P(None, "data")),
]


def _mlp(seed: int) -> fx.nn.MLP:
    return fx.nn.MLP(4, 8, 8, 1, key=jax.random.key(seed))


def _abstract_sharded(mesh: jax.sharding.Mesh) -> Any:
    """`like` as a user writes it: the model's shapes from `filter_eval_shape`,
    with the shardings of `sharding_of`."""
    model = _mlp(1)
    return fx.filter_eval_shape(
        lambda m: m, fx.filter_shard(model, fx.sharding_of(model, mesh, RULES))
    )


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, tuple[int, ...]]]:
    """Every read from a file: the tensor's name and the shape of the part read."""
    seen: list[tuple[str, tuple[int, ...]]] = []
    original = _load.tensor_reader

    @contextlib.contextmanager
    def spying(file: str, name: str, shape: Any, dtype: Any) -> Iterator[Any]:
        with original(file, name, shape, dtype) as read:

            def spied(index: Any) -> np.ndarray:
                part = read(index)
                seen.append((name, part.shape))
                return part

            yield spied

    monkeypatch.setattr(_load, "tensor_reader", spying)
    return seen


def test_each_array_lands_on_its_leafs_sharding(
    tmp_path: Path, mesh: jax.sharding.Mesh
) -> None:
    model = _mlp(0)
    fxs.save(tmp_path / "m.safetensors", model)
    like = _abstract_sharded(mesh)
    loaded = fxs.load(tmp_path / "m.safetensors", like)
    arrays = [jax.tree.leaves(fx.filter(t, fx.is_array)) for t in (loaded, model)]
    templates = jax.tree.leaves(
        like, is_leaf=lambda x: isinstance(x, jax.ShapeDtypeStruct)
    )
    templates = [t for t in templates if isinstance(t, jax.ShapeDtypeStruct)]
    assert len(templates) == len(arrays[0]) == 4
    for got, want, template in zip(*arrays, templates, strict=True):
        assert got.sharding == template.sharding
        np.testing.assert_array_equal(got, want)
    assert loaded.layers[0].weight.sharding.spec == P("data", "model")
    assert loaded.layers[0].weight.addressable_shards[0].data.shape == (2, 2)


def test_only_the_slices_the_devices_hold_are_read_each_once(
    tmp_path: Path, mesh: jax.sharding.Mesh, reads: list[tuple[str, tuple[int, ...]]]
) -> None:
    fxs.save(tmp_path / "m.safetensors", _mlp(0))
    fxs.load(tmp_path / "m.safetensors", _abstract_sharded(mesh))
    by_name: dict[str, list[tuple[int, ...]]] = {}
    for name, shape in reads:
        by_name.setdefault(name, []).append(shape)
    # (8, 4) split 4 x 2: eight distinct (2, 2) blocks, never the whole.
    assert by_name["layers.0.weight"] == [(2, 2)] * 8
    # (8, 8) split over "data" only: 4 distinct column blocks, each held by
    # the 2 devices of a "model" row, read once.
    assert by_name["layers.1.weight"] == [(8, 2)] * 4
    # Replicated on the 8 devices: read once.
    assert by_name["layers.0.bias"] == [(8,)]


def test_a_concrete_sharded_like_gives_its_shardings(
    tmp_path: Path, mesh: jax.sharding.Mesh
) -> None:
    model = _mlp(0)
    fxs.save(tmp_path / "m.safetensors", model)
    other = _mlp(3)
    like = fx.filter_shard(other, fx.sharding_of(other, mesh, RULES))
    loaded = fxs.load(tmp_path / "m.safetensors", like)
    assert loaded.layers[1].weight.sharding == like.layers[1].weight.sharding
    np.testing.assert_array_equal(loaded.layers[1].weight, model.layers[1].weight)
    # An unplaced (uncommitted) leaf stays on the default device, uncommitted.
    loaded = fxs.load(tmp_path / "m.safetensors", other)
    assert not loaded.layers[0].weight.committed


def test_a_sharding_on_an_abstract_mesh_takes_the_mesh_set(
    tmp_path: Path, mesh: jax.sharding.Mesh
) -> None:
    fxs.save(tmp_path / "w.safetensors", {"w": jnp.arange(16.0).reshape(8, 2)})
    abstract = NamedSharding(mesh.abstract_mesh, P("data"))
    like = {"w": jax.ShapeDtypeStruct((8, 2), jnp.float32, sharding=abstract)}
    with pytest.raises(
        ValueError, match=r"\['w'\]: `like` gives it a sharding on an abstract mesh"
    ):
        fxs.load(tmp_path / "w.safetensors", like)
    with jax.set_mesh(mesh):
        loaded = fxs.load(tmp_path / "w.safetensors", like)
    assert loaded["w"].sharding == NamedSharding(mesh, P("data"))
    np.testing.assert_array_equal(loaded["w"], np.arange(16.0).reshape(8, 2))


def test_keys_and_refs_load_onto_their_shardings(
    tmp_path: Path, mesh: jax.sharding.Mesh
) -> None:
    replicated = NamedSharding(mesh, P())
    tree = {
        "keys": jax.random.split(jax.random.key(0), 4),
        "ref": jax.new_ref(jnp.ones(8)),
    }
    fxs.save(tmp_path / "k.safetensors", tree)
    like = {
        "keys": jax.ShapeDtypeStruct((4,), tree["keys"].dtype, sharding=replicated),
        "ref": jax.ShapeDtypeStruct(
            (8,), jnp.float32, sharding=NamedSharding(mesh, P("data")), is_ref=True
        ),
    }
    loaded = fxs.load(tmp_path / "k.safetensors", like)
    assert loaded["keys"].sharding.is_equivalent_to(replicated, 1)
    np.testing.assert_array_equal(
        jax.random.key_data(loaded["keys"]), jax.random.key_data(tree["keys"])
    )
    assert fx.is_ref(loaded["ref"])
    assert loaded["ref"][...].sharding == NamedSharding(mesh, P("data"))
