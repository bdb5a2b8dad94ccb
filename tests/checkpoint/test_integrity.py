"""Every byte of a checkpoint is checked on restore; leaves orbax cannot store
are refused before anything is written; a failed save leaves nothing behind;
arrays are stored under their key paths."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import orbax.checkpoint as ocp
import pytest

import filterax as fx
import filterax.checkpoint as fxc


def _tree() -> dict[str, Any]:
    return {
        "w": jnp.arange(64.0).reshape(8, 8),
        "b": jnp.arange(8, dtype=jnp.int32),
        "keys": jax.random.split(jax.random.key(1), 2),
        "table": np.linspace(0, 1, 5),
        "act": jax.nn.relu,
        "step": 3,
    }


def _like() -> dict[str, Any]:
    return {**_tree(), "w": jnp.zeros((8, 8)), "b": jnp.zeros(8, jnp.int32), "step": 0}


def _files(directory: Path) -> list[Path]:
    return sorted(path for path in directory.rglob("*") if path.is_file())


def _flip(path: Path, position: int, bit: int) -> None:
    data = bytearray(path.read_bytes())
    data[position] ^= 1 << bit
    path.write_bytes(bytes(data))


def test_every_bit_flip_in_every_file_is_detected(tmp_path: Path) -> None:
    directory = tmp_path / "ckpt"
    fxc.save(directory, _tree())
    files = _files(directory)
    assert any("ocdbt.process_0" in str(f) for f in files)  # array data
    assert any(f.parent.name == "filterax" for f in files)  # the description
    flips = 0
    for path in files:
        size = path.stat().st_size
        # The first, a middle and the last byte of every file, a different bit
        # each time.
        for position, bit in {(0, 0), (size // 2, 3), (size - 1, 7)}:
            _flip(path, position, bit)
            try:
                with pytest.raises(fx.SerialisationError) as caught:
                    fxc.restore(directory, _like())
                assert path.name in str(caught.value), (path, position)
                flips += 1
            finally:
                _flip(path, position, bit)  # undone: the next flip is alone
    assert flips >= 2 * len(files)
    restored = fxc.restore(directory, _like())  # intact again
    assert np.array_equal(restored["w"], np.arange(64.0).reshape(8, 8))


def test_a_truncated_or_missing_data_file_names_the_file(tmp_path: Path) -> None:
    directory = tmp_path / "ckpt"
    fxc.save(directory, _tree())
    data = max(
        (f for f in _files(directory) if f.parent.name == "d"),
        key=lambda f: f.stat().st_size,
    )
    original = data.read_bytes()
    data.write_bytes(original[: len(original) // 2])
    with pytest.raises(fx.SerialisationError, match=rf"{data.name}.*has \d+ bytes"):
        fxc.restore(directory, _like())
    data.unlink()
    with pytest.raises(fx.SerialisationError, match=rf"{data.name}.*missing"):
        fxc.restore(directory, _like())


def test_a_damaged_description_is_a_serialisation_error(tmp_path: Path) -> None:
    directory = tmp_path / "ckpt"
    fxc.save(directory, _tree())
    description = directory / "filterax" / "metadata"
    description.write_bytes(b"\xff\xfe not json")
    with pytest.raises(
        fx.SerialisationError, match=r"filterax/metadata \(the description"
    ):
        fxc.restore(directory, _like())


def test_a_damaged_checksum_file_is_a_serialisation_error(tmp_path: Path) -> None:
    directory = tmp_path / "ckpt"
    fxc.save(directory, _tree())
    (sums,) = (directory / "filterax.checksums").iterdir()
    sums.write_text(sums.read_text().replace('"check": ', '"check": 1'))
    with pytest.raises(fx.SerialisationError, match=r"checksum file .* damaged"):
        fxc.restore(directory, _like())


@pytest.mark.parametrize(
    ("leaf", "error", "message"),
    [
        (jnp.zeros(4, ml_dtypes.uint4), TypeError, r"\['bad'\].*uint4.*8 bits"),
        (jnp.zeros((2, 0)), ValueError, r"\['bad'\].*shape \(2, 0\).*no elements"),
        (np.zeros(0), ValueError, r"\['bad'\].*no elements"),
    ],
    ids=["uint4", "zero-size", "numpy-zero-size"],
)
def test_leaves_orbax_cannot_store_are_refused_up_front(
    tmp_path: Path, leaf: Any, error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        fxc.save(tmp_path / "ckpt", {"ok": jnp.ones(2), "bad": leaf})
    with fxc.Checkpointer(tmp_path / "steps") as checkpoints:
        with pytest.raises(error, match=message):
            checkpoints.save(1, {"ok": jnp.ones(2), "bad": leaf})
    assert os.listdir(tmp_path) == ["steps"]
    assert os.listdir(tmp_path / "steps") == []


def test_a_save_that_fails_while_writing_leaves_no_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def broken(self: Any, item: Any, directory: Any) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(ocp.JsonCheckpointHandler, "_save_fn", broken)
    with pytest.raises(OSError, match="No space left"):
        fxc.save(tmp_path / "ckpt", _tree())
    pending = fxc.save(tmp_path / "later", _tree(), wait=False)
    assert pending is not None
    with pytest.raises(OSError, match="No space left"):
        pending.wait()
    with fxc.Checkpointer(tmp_path / "steps") as checkpoints:
        checkpoints.save(1, _tree())
        with pytest.raises(OSError, match="No space left"):
            checkpoints.wait()
        assert checkpoints.steps() == []
    assert os.listdir(tmp_path) == ["steps"]
    assert os.listdir(tmp_path / "steps") == []


def test_orbax_sees_the_arrays_under_their_key_paths(tmp_path: Path) -> None:
    model = {"layers": [fx.nn.Linear(2, 3, key=jax.random.key(0))], "act": "relu"}
    fxc.save(tmp_path / "ckpt", model)
    metadata = ocp.StandardCheckpointHandler().metadata(tmp_path / "ckpt" / "arrays")
    tree = metadata.tree
    assert set(tree) == {"layers"}
    assert set(tree["layers"]["0"]) == {"weight", "bias"}
    assert tuple(tree["layers"]["0"]["weight"].shape) == (3, 2)
    assert tree["layers"]["0"]["weight"].name == "layers.0.weight"


def test_a_module_field_mismatch_names_the_field_by_key_path(tmp_path: Path) -> None:
    def model(width: int) -> dict[str, Any]:
        keys = jax.random.split(jax.random.key(0), 2)
        return {
            "layers": [
                fx.nn.Linear(4, 8, key=keys[0]),
                fx.nn.Linear(8, width, key=keys[1]),
            ]
        }

    fxc.save(tmp_path / "ckpt", model(32))
    with pytest.raises(
        fx.SerialisationError,
        match=r"at \['layers'\]\[1\]\.out_features .*: checkpoint 32, like 64",
    ):
        fxc.restore(tmp_path / "ckpt", model(64))


def test_keep_never_hides_a_complete_step_while_a_newer_one_is_written(
    tmp_path: Path, held_writes: threading.Event
) -> None:
    held_writes.set()
    with fxc.Checkpointer(tmp_path, keep=2) as checkpoints:
        for step in (1, 2, 3):
            checkpoints.save(step, {"w": jnp.full(2, float(step))}, wait=True)
        assert checkpoints.steps() == [2, 3]
        held_writes.clear()
        checkpoints.save(4, {"w": jnp.full(2, 4.0)})  # held back
        assert checkpoints.steps() == [2, 3]
        restored = checkpoints.restore({"w": jnp.zeros(2)}, step=2)
        assert np.array_equal(restored["w"], np.full(2, 2.0))
        held_writes.set()
        checkpoints.wait()
        assert checkpoints.steps() == [3, 4]


def test_a_step_is_a_non_negative_int(tmp_path: Path) -> None:
    with fxc.Checkpointer(tmp_path) as checkpoints:
        for step in (True, 1.0, "1"):
            with pytest.raises(TypeError, match="step must be an int"):
                checkpoints.save(step, {"w": jnp.ones(2)})  # type: ignore[arg-type]
        checkpoints.save(np.int64(2), {"w": jnp.ones(2)}, wait=True)  # type: ignore[arg-type]
        assert checkpoints.steps() == [2]


def test_readers_see_new_steps_and_a_second_writer_is_refused(tmp_path: Path) -> None:
    reader = fxc.Checkpointer(tmp_path)
    with fxc.Checkpointer(tmp_path) as writer:
        assert reader.steps() == []
        writer.save(1, {"w": jnp.ones(2)}, wait=True)
        assert reader.steps() == [1]  # without reopening
        second = fxc.Checkpointer(tmp_path)
        with pytest.raises(
            RuntimeError, match=rf"{tmp_path} is being written.*process {os.getpid()}"
        ):
            second.save(2, {"w": jnp.ones(2)})
        second.close()
        writer.save(2, {"w": jnp.ones(2)}, wait=True)
        assert reader.latest_step() == 2
    reader.close()
    # The first writer has closed: another may write now.
    with fxc.Checkpointer(tmp_path) as successor:
        successor.save(3, {"w": jnp.ones(2)}, wait=True)
        assert successor.steps() == [1, 2, 3]
    assert sorted(os.listdir(tmp_path)) == ["1", "2", "3"]


def test_one_description_and_one_vocabulary_with_tree_serialise_leaves() -> None:
    from filterax._serialisation._leaf import encode_leaf  # internals compared
    from filterax.checkpoint._describe import describe  # internals compared

    leaves = {
        "act": jax.nn.relu,
        "name": "adam",
        "sizes": frozenset({1, 2}),
        "w": jnp.ones(2),
        "keys": jax.random.key(0),
        "table": np.zeros(2),
        "scale": np.float32(1),
        "n": 3,
    }
    described = describe(leaves, saving=True)
    for path, record in zip(described.leaf_paths, described.leaf_records):
        leaf = leaves[path[0].key]
        meta, _ = encode_leaf(jax.tree_util.keystr(path), leaf)
        assert record["kind"] == meta.kind, path
        if meta.kind == "object":
            assert record["value"] == meta.extra["value"], path
