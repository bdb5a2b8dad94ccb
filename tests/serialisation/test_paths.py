"""Which file a path names (the `.eqx` suffix), the temporary files of atomic
writes and their cleanup, and errors that name the destination."""

from __future__ import annotations

import fcntl
import os
import re
from pathlib import Path
from typing import Any

import jax.numpy as jnp
import numpy as np
import pytest

import filterax as fx

TREE = {"w": np.arange(3.0)}
LIKE = {"w": np.zeros(3)}


def temporary_name(base: str) -> str:
    return f".{base}.{os.urandom(6).hex()}.tmp"


# --- the .eqx suffix --------------------------------------------------------------------


@pytest.mark.parametrize(
    "given, written",
    [
        ("model", "model.eqx"),
        ("model.", "model..eqx"),
        (".model", ".model.eqx"),
        ("model.fx", "model.fx"),
        ("model.tar.gz", "model.tar.gz"),
        ("v1.2/model", "v1.2/model.eqx"),
    ],
)
def test_a_path_without_a_suffix_gets_eqx_appended(
    tmp_path: Path, given: str, written: str
) -> None:
    (tmp_path / "v1.2").mkdir()
    fx.tree_serialise_leaves(tmp_path / given, TREE)
    assert (tmp_path / written).is_file()
    assert fx.tree_deserialise_leaves(tmp_path / given, LIKE)["w"].tolist() == [0, 1, 2]
    assert fx.tree_deserialise_leaves(tmp_path / written, LIKE)["w"].tolist() == [
        0,
        1,
        2,
    ]


@pytest.mark.parametrize("kind", [str, Path, os.fsencode])
def test_the_suffix_rule_applies_to_every_kind_of_path(
    tmp_path: Path, kind: Any
) -> None:
    fx.tree_serialise_leaves(kind(str(tmp_path / "model")), TREE)
    assert os.listdir(tmp_path) == ["model.eqx"]
    fx.tree_deserialise_leaves(kind(str(tmp_path / "model")), LIKE)


def test_a_directory_path_writes_a_file_beside_it(tmp_path: Path) -> None:
    # As in Equinox: a suffix-less path that is a directory names `<dir>.eqx`.
    (tmp_path / "run").mkdir()
    fx.tree_serialise_leaves(tmp_path / "run", TREE)
    assert (tmp_path / "run.eqx").is_file()


def test_loading_a_suffixless_file_says_where_the_suffix_came_from(
    tmp_path: Path,
) -> None:
    with open(tmp_path / "model", "wb") as file:  # a file object is used as is
        fx.tree_serialise_leaves(file, TREE)
    with pytest.raises(FileNotFoundError) as error:
        fx.tree_deserialise_leaves(tmp_path / "model", LIKE)
    message = str(error.value)
    assert str(tmp_path / "model.eqx") in message
    assert "'.eqx' appended" in message and f"{str(tmp_path / 'model')!r}" in message
    with open(tmp_path / "model", "rb") as file:
        assert fx.tree_deserialise_leaves(file, LIKE)["w"].tolist() == [0, 1, 2]


# --- temporary files -------------------------------------------------------------------------


def test_a_successful_write_removes_stale_temporary_files_of_its_path(
    tmp_path: Path,
) -> None:
    stale = [temporary_name("model.eqx") for _ in range(3)]
    for name in stale:
        (tmp_path / name).write_bytes(b"half a checkpoint")
    fx.tree_serialise_leaves(tmp_path / "model.eqx", TREE)
    assert os.listdir(tmp_path) == ["model.eqx"]


def test_temporary_files_of_other_paths_are_left_alone(tmp_path: Path) -> None:
    others = [
        temporary_name("other.eqx"),
        temporary_name("model"),  # the temporary file of `model`, not `model.eqx`
        temporary_name("model.eqx.bak"),
        f".model.eqx.{'ab' * 5}.tmp",  # 10 hex digits: not our pattern
        f".model.eqx.{'AB' * 6}.tmp",  # upper case: not ours either
        f"{temporary_name('model.eqx')}.keep",
        "model.eqx.tmp",
    ]
    for name in others:
        (tmp_path / name).write_bytes(b"someone else's")
    fx.tree_serialise_leaves(tmp_path / "model.eqx", TREE)
    assert sorted(os.listdir(tmp_path)) == sorted([*others, "model.eqx"])


def test_a_temporary_file_being_written_by_a_live_writer_is_left_alone(
    tmp_path: Path,
) -> None:
    live = tmp_path / temporary_name("model.eqx")
    stale = tmp_path / temporary_name("model.eqx")
    stale.write_bytes(b"left by a killed writer")
    # A live writer holds an exclusive lock on its temporary file while writing.
    descriptor = os.open(live, os.O_RDWR | os.O_CREAT | os.O_EXCL)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX)
        os.write(descriptor, b"being written")
        fx.tree_serialise_leaves(tmp_path / "model.eqx", TREE)
        assert sorted(os.listdir(tmp_path)) == sorted(["model.eqx", live.name])
    finally:
        os.close(descriptor)
    fx.tree_serialise_leaves(tmp_path / "model.eqx", TREE)  # its writer is gone now
    assert os.listdir(tmp_path) == ["model.eqx"]


def test_a_writer_holds_the_lock_on_its_temporary_file_while_writing(
    tmp_path: Path,
) -> None:
    seen = []

    def spec(f: Any, leaf: Any) -> None:
        fx.default_serialise_filter_spec(f, leaf)
        (name,) = [n for n in os.listdir(tmp_path) if n.endswith(".tmp")]
        descriptor = os.open(tmp_path / name, os.O_RDWR)
        try:
            with pytest.raises(BlockingIOError):
                fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        finally:
            os.close(descriptor)
        seen.append(name)

    fx.tree_serialise_leaves(tmp_path / "model.eqx", TREE, spec)
    assert len(seen) == 1 and re.fullmatch(r"\.model\.eqx\.[0-9a-f]{12}\.tmp", seen[0])
    assert os.listdir(tmp_path) == ["model.eqx"]


def test_a_failed_write_removes_its_own_temporary_file_and_keeps_the_old_file(
    tmp_path: Path,
) -> None:
    fx.tree_serialise_leaves(tmp_path / "model.eqx", TREE)
    old = (tmp_path / "model.eqx").read_bytes()
    with pytest.raises(TypeError, match="dtype object"):
        fx.tree_serialise_leaves(tmp_path / "model.eqx", {"w": np.array([None])})
    assert os.listdir(tmp_path) == ["model.eqx"]
    assert (tmp_path / "model.eqx").read_bytes() == old


def test_writing_through_a_symlink_cleans_up_beside_its_target(tmp_path: Path) -> None:
    (tmp_path / "store").mkdir()
    stale = tmp_path / "store" / temporary_name("real.eqx")
    stale.write_bytes(b"stale")
    os.symlink(tmp_path / "store" / "real.eqx", tmp_path / "link.eqx")
    fx.tree_serialise_leaves(tmp_path / "link.eqx", TREE)
    assert os.listdir(tmp_path / "store") == ["real.eqx"]
    assert os.path.islink(tmp_path / "link.eqx")


# --- errors name the destination ----------------------------------------------------------------


def read_only_directory(tmp_path: Path) -> Path:
    """A directory this process cannot create files in."""
    if os.geteuid() != 0:
        directory = tmp_path / "read-only"
        directory.mkdir()
        directory.chmod(0o555)
        return directory
    return Path("/sys")  # read-only even for root


def test_a_missing_directory_error_names_the_destination(tmp_path: Path) -> None:
    destination = tmp_path / "missing" / "model.eqx"
    with pytest.raises(FileNotFoundError) as error:
        fx.tree_serialise_leaves(destination, {"w": jnp.ones(2)})
    assert error.value.filename == str(destination)
    assert f"cannot write the checkpoint {str(destination)!r}" in str(error.value)
    assert ".tmp" not in str(error.value)


def test_a_read_only_directory_error_names_the_destination(tmp_path: Path) -> None:
    destination = read_only_directory(tmp_path) / "model.eqx"
    with pytest.raises(PermissionError) as error:
        fx.tree_serialise_leaves(destination, {"w": jnp.ones(2)})
    assert error.value.filename == str(destination)
    assert f"cannot write the checkpoint {str(destination)!r}" in str(error.value)
    assert ".tmp" not in str(error.value)


def test_a_destination_that_is_a_directory_is_named(tmp_path: Path) -> None:
    (tmp_path / "model.eqx").mkdir()
    with pytest.raises(IsADirectoryError) as error:
        fx.tree_serialise_leaves(tmp_path / "model.eqx", TREE)
    assert error.value.filename == str(tmp_path / "model.eqx")
    assert ".tmp" not in str(error.value)
    assert os.listdir(tmp_path) == ["model.eqx"]  # no temporary file left
