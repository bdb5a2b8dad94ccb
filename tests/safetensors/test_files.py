"""Which files a path names: one file, a multi-file checkpoint by its index
or its directory; and the errors for files that are not safetensors, are
truncated, or are missing, each naming the path."""

from __future__ import annotations

import json
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest
import safetensors.numpy

import filterax as fx
import filterax.safetensors as fxs

LIKE = {"a": jnp.zeros((2, 3)), "b": jnp.zeros(4), "c": jnp.zeros((), jnp.int32)}


def _sharded_checkpoint(directory: Path) -> dict[str, np.ndarray]:
    """A checkpoint in two files with an index, as large models are published."""
    tensors = {
        "a": np.arange(6, dtype=np.float32).reshape(2, 3),
        "b": np.arange(4, dtype=np.float32) + 10,
        "c": np.array(7, np.int32),
    }
    safetensors.numpy.save_file(
        {"a": tensors["a"]}, directory / "model-00001-of-00002.safetensors"
    )
    safetensors.numpy.save_file(
        {"b": tensors["b"], "c": tensors["c"]},
        directory / "model-00002-of-00002.safetensors",
    )
    index = {
        "metadata": {"total_size": 44},
        "weight_map": {
            "a": "model-00001-of-00002.safetensors",
            "b": "model-00002-of-00002.safetensors",
            "c": "model-00002-of-00002.safetensors",
        },
    }
    (directory / "model.safetensors.index.json").write_text(json.dumps(index))
    return tensors


def _assert_loaded(
    loaded: dict[str, jnp.ndarray], tensors: dict[str, np.ndarray]
) -> None:
    for name, value in tensors.items():
        np.testing.assert_array_equal(loaded[name], value)


@pytest.mark.parametrize("by", ["directory", "index"])
def test_a_multi_file_checkpoint_loads_by_its_index_or_directory(
    tmp_path: Path, by: str
) -> None:
    tensors = _sharded_checkpoint(tmp_path)
    path = tmp_path if by == "directory" else tmp_path / "model.safetensors.index.json"
    _assert_loaded(fxs.load(path, LIKE), tensors)


def test_a_directory_with_one_file_loads_it(tmp_path: Path) -> None:
    fxs.save(tmp_path / "model.safetensors", {"a": jnp.ones((2, 3))})
    loaded = fxs.load(tmp_path, {"a": jnp.zeros((2, 3))})
    np.testing.assert_array_equal(loaded["a"], 1.0)


def test_an_index_naming_a_missing_file_names_both(tmp_path: Path) -> None:
    _sharded_checkpoint(tmp_path)
    (tmp_path / "model-00002-of-00002.safetensors").unlink()
    index = tmp_path / "model.safetensors.index.json"
    with pytest.raises(FileNotFoundError) as error:
        fxs.load(tmp_path, LIKE)
    assert str(index) in str(error.value)
    assert "'model-00002-of-00002.safetensors', which does not exist" in str(
        error.value
    )


def test_an_index_naming_a_tensor_its_file_lacks(tmp_path: Path) -> None:
    _sharded_checkpoint(tmp_path)
    index = tmp_path / "model.safetensors.index.json"
    content = json.loads(index.read_text())
    content["weight_map"]["b"] = "model-00001-of-00002.safetensors"
    index.write_text(json.dumps(content))
    with pytest.raises(
        fx.SerialisationError, match=r"puts the tensor 'b' in model-00001"
    ):
        fxs.load(index, LIKE)


def test_an_index_that_is_not_one(tmp_path: Path) -> None:
    index = tmp_path / "model.safetensors.index.json"
    index.write_text('{"metadata": {}}')
    with pytest.raises(
        fx.SerialisationError, match=f"{index} is not a safetensors index"
    ):
        fxs.load(index, LIKE)


def test_a_file_that_is_not_safetensors_names_its_path(tmp_path: Path) -> None:
    path = tmp_path / "model.safetensors"
    path.write_bytes(b"PK\x03\x04 this is a zip archive, not safetensors" * 4)
    with pytest.raises(
        fx.SerialisationError, match=f"{path} is not a safetensors file"
    ):
        fxs.load(path, LIKE)
    path.write_bytes(b"tiny")
    with pytest.raises(
        fx.SerialisationError, match=f"{path} is not a safetensors file"
    ):
        fxs.load(path, LIKE)


def test_a_truncated_file_names_its_path(tmp_path: Path) -> None:
    path = tmp_path / "model.safetensors"
    fxs.save(
        path, {"a": jnp.ones((2, 3)), "b": jnp.ones(4), "c": jnp.ones((), jnp.int32)}
    )
    whole = path.read_bytes()
    path.write_bytes(whole[:-5])  # in the tensors
    with pytest.raises(
        fx.SerialisationError, match=f"{path} is truncated: its tensors need"
    ):
        fxs.load(path, LIKE)
    path.write_bytes(whole[:40])  # in the header
    with pytest.raises(
        fx.SerialisationError, match=f"{path} is truncated: its header is"
    ):
        fxs.load(path, LIKE)


def test_no_checkpoint_names_the_path(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=f"{tmp_path / 'nope.safetensors'}"):
        fxs.load(tmp_path / "nope.safetensors", LIKE)
    with pytest.raises(FileNotFoundError, match=f"{tmp_path} holds no safetensors"):
        fxs.load(tmp_path, LIKE)
    fxs.save(tmp_path / "one.safetensors", {"a": jnp.ones(1)})
    fxs.save(tmp_path / "two.safetensors", {"a": jnp.ones(1)})
    with pytest.raises(fx.SerialisationError, match="several .safetensors files"):
        fxs.load(tmp_path, LIKE)
