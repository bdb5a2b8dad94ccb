"""Tests for `tree_serialise_leaves` / `tree_deserialise_leaves` and their file format."""

from __future__ import annotations

import cmath
import dataclasses
import enum
import functools
import io
import json
import math
import os
import re
import select
import signal
import struct
import subprocess
import sys
import textwrap
import tracemalloc
import zlib
from typing import Any

import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

import filterax as fx

KEY_IMPLS = ["threefry2x32", "rbg", "unsafe_rbg"]


# --- helpers -----------------------------------------------------------------


def save_to_bytes(tree: Any, **kwargs: Any) -> bytes:
    file = io.BytesIO()
    fx.tree_serialise_leaves(file, tree, **kwargs)
    return file.getvalue()


def load_from_bytes(data: bytes, like: Any, **kwargs: Any) -> Any:
    return fx.tree_deserialise_leaves(io.BytesIO(data), like, **kwargs)


def leaf_signature(leaf: Any) -> tuple:
    """Everything that must survive a round trip, compared bitwise."""
    if isinstance(leaf, jax.Array) and fx.is_key_array(leaf):
        data = np.asarray(jax.random.key_data(leaf))
        return ("key", str(jax.random.key_impl(leaf)), leaf.shape, data.tobytes())
    if isinstance(leaf, (jax.Array, np.ndarray, np.generic)):
        array = np.asarray(leaf)
        return (type(leaf), array.dtype, array.shape, array.tobytes())
    if isinstance(leaf, float):
        return (type(leaf), struct.pack("<d", leaf))
    if isinstance(leaf, complex):
        return (type(leaf), struct.pack("<dd", leaf.real, leaf.imag))
    if isinstance(leaf, (bool, int)):
        return (type(leaf), leaf)
    return ("object", id(leaf))


def assert_bitwise_equal(actual: Any, expected: Any) -> None:
    assert jtu.tree_structure(actual) == jtu.tree_structure(expected)
    for (path, a), b in zip(
        jtu.tree_leaves_with_path(actual), jtu.tree_leaves(expected)
    ):
        assert leaf_signature(a) == leaf_signature(b), jtu.keystr(path)


def perturbed(leaf: Any) -> Any:
    """A leaf of the same type, shape and dtype, but different contents; other
    objects are kept (loading returns them from `like`)."""
    if isinstance(leaf, jax.Array) and fx.is_key_array(leaf):
        data = jax.random.key_data(leaf)
        return jax.random.wrap_key_data(data + 1, impl=jax.random.key_impl(leaf))
    if isinstance(leaf, jax.Array):
        return jnp.zeros_like(leaf) if leaf.dtype != bool else ~leaf
    if isinstance(leaf, np.ndarray):
        # `~` of a 0-d array is a NumPy scalar; `np.array` keeps it an array.
        return np.zeros_like(leaf) if leaf.dtype != bool else np.array(~leaf)
    if isinstance(leaf, np.generic):
        return np.zeros((), leaf.dtype)[()]
    if isinstance(leaf, bool):
        return not leaf
    if isinstance(leaf, (int, float, complex)):
        cls: Any = type(leaf)
        return (
            cls(leaf + 1) if isinstance(leaf, int) or cmath.isfinite(leaf) else cls(0)
        )
    return leaf


def header_paths(data: bytes) -> list[str]:
    """Parses the header as `docs/serialisation-format.md` describes it."""
    (length,) = struct.unpack_from("<Q", data, 16)
    return json.loads(data[24 : 24 + length])["leaves"]


def entries(data: bytes) -> list[tuple[dict, int, int]]:
    """(entry header, data offset, data length) per entry, parsed as the format
    document describes, checking every checksum on the way."""
    (length,) = struct.unpack_from("<Q", data, 16)
    (crc,) = struct.unpack_from("<I", data, 24 + length)
    assert crc == zlib.crc32(data[: 24 + length])
    offset = 24 + length + 4
    found = []
    for _ in header_paths(data):
        (size,) = struct.unpack_from("<I", data, offset)
        meta_bytes = data[offset + 4 : offset + 4 + size]
        (crc,) = struct.unpack_from("<I", data, offset + 4 + size)
        assert crc == zlib.crc32(data[offset : offset + 4 + size])
        meta = json.loads(meta_bytes)
        start = offset + 4 + size + 4
        (crc,) = struct.unpack_from("<I", data, start + meta["nbytes"])
        assert crc == zlib.crc32(data[start : start + meta["nbytes"]])
        found.append((meta, start, meta["nbytes"]))
        offset = start + meta["nbytes"] + 4
    magic, count, crc = struct.unpack_from("<8sQI", data, offset)
    assert (magic, count) == (b"FLTRXEND", len(found))
    assert crc == zlib.crc32(data[offset : offset + 16])
    assert offset + 20 == len(data)
    return found


def module_level_function(x: Any) -> Any:
    return x


class Pair(fx.Module):
    first: Any
    second: Any


class Tagged(fx.Module):
    value: Any
    tag: str = fx.field(static=True, default="tag")


@functools.partial(jtu.register_dataclass, data_fields=["x", "y"], meta_fields=["name"])
@dataclasses.dataclass
class RegisteredNode:
    x: Any
    y: Any
    name: str


# --- hypothesis strategies ---------------------------------------------------

JAX_DTYPES = [
    jnp.float32,
    jnp.float16,
    jnp.bfloat16,
    jnp.int8,
    jnp.int32,
    jnp.uint8,
    jnp.uint32,
    jnp.bool_,
    jnp.complex64,
    ml_dtypes.float8_e4m3fn,
]
NUMPY_DTYPES = [*JAX_DTYPES, np.float64, np.int64, np.uint16, np.complex128]
shapes = st.lists(st.integers(0, 3), max_size=2).map(tuple)


@st.composite
def numpy_arrays(draw: Any, dtypes: list = NUMPY_DTYPES) -> np.ndarray:
    dtype = np.dtype(draw(st.sampled_from(dtypes)))
    shape = draw(shapes)
    size = math.prod(shape)
    if dtype == np.bool_:
        return np.array(
            draw(st.lists(st.booleans(), min_size=size, max_size=size)), bool
        ).reshape(shape)
    # Any bit pattern, NaN payloads and subnormals included.
    raw = draw(
        st.binary(min_size=size * dtype.itemsize, max_size=size * dtype.itemsize)
    )
    return np.frombuffer(raw, dtype).reshape(shape).copy()


@st.composite
def key_arrays(draw: Any) -> jax.Array:
    impl = draw(st.sampled_from(KEY_IMPLS))
    key = jax.random.key(draw(st.integers(0, 2**31 - 1)), impl=impl)
    return jax.random.split(key, 2) if draw(st.booleans()) else key


leaves = st.one_of(
    numpy_arrays(JAX_DTYPES).map(jnp.asarray),
    numpy_arrays(),
    numpy_arrays().filter(lambda a: a.ndim == 0).map(lambda a: a[()]),
    st.booleans(),
    st.integers(),
    st.floats(),
    st.complex_numbers(),
    key_arrays(),
    st.text(max_size=4),
    st.sampled_from([module_level_function, math.sin, len]),
)


def nodes(children: Any) -> Any:
    return st.one_of(
        st.lists(children, max_size=3),
        st.tuples(children, children),
        st.dictionaries(st.text(max_size=3), children, max_size=3),
        st.builds(Pair, children, children),
        st.builds(Tagged, children, st.sampled_from(["a", "b"])),
        st.builds(fx.NonDifferentiable, children),
        st.builds(RegisteredNode, children, children, st.sampled_from(["n", "m"])),
    )


pytrees = st.recursive(leaves, nodes, max_leaves=12)


# --- round trips -------------------------------------------------------------


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pytrees)
def test_random_pytrees_round_trip_bitwise(tree: Any) -> None:
    like = jtu.tree_map(perturbed, tree)
    restored = load_from_bytes(save_to_bytes(tree), like)
    assert_bitwise_equal(restored, tree)
    for new, old in zip(jtu.tree_leaves(restored), jtu.tree_leaves(like)):
        if not fx.is_array_like(new):
            assert new is old  # non-array leaves come from `like`


@pytest.mark.parametrize("dtype", NUMPY_DTYPES, ids=lambda d: np.dtype(d).name)
def test_every_dtype_round_trips_bitwise(dtype: Any) -> None:
    raw = np.random.default_rng(0).integers(
        0, 256, 24 * np.dtype(dtype).itemsize, np.uint8
    )
    array = raw.view(dtype) if dtype != jnp.bool_ else raw.astype(bool)
    tree = {"numpy": array, "scalar": array[0]}
    if dtype in JAX_DTYPES:
        tree["jax"] = jnp.asarray(array)
    assert_bitwise_equal(
        load_from_bytes(save_to_bytes(tree), jtu.tree_map(perturbed, tree)), tree
    )


@pytest.mark.parametrize("impl", KEY_IMPLS)
def test_key_arrays_round_trip_with_implementation(impl: str) -> None:
    keys = {
        "one": jax.random.key(3, impl=impl),
        "many": jax.random.split(jax.random.key(4, impl=impl), 3),
    }
    meta = [meta for meta, _, _ in entries(save_to_bytes(keys))]
    assert {m["impl"] for m in meta} == {impl}
    restored = load_from_bytes(save_to_bytes(keys), jtu.tree_map(perturbed, keys))
    assert_bitwise_equal(restored, keys)
    assert jax.random.key_impl(restored["one"]) == jax.random.key_impl(keys["one"])


def test_python_scalars_keep_their_type_and_value() -> None:
    class Colour(enum.IntEnum):
        RED = 1
        BLUE = 2

    tree = [True, -(2**100) + 3, -0.0, float("nan"), complex(1.5, -2.0), Colour.BLUE]
    restored = load_from_bytes(
        save_to_bytes(tree), [False, 0, 1.0, 1.0, 0j, Colour.RED]
    )
    assert_bitwise_equal(restored, tree)
    assert restored[-1] is Colour.BLUE


def test_round_trips_through_str_and_pathlike_paths(tmp_path: Any) -> None:
    tree = {"w": jnp.arange(4.0), "n": 3}
    fx.tree_serialise_leaves(str(tmp_path / "a.fx"), tree)
    fx.tree_serialise_leaves(tmp_path / "b.fx", tree)
    assert_bitwise_equal(fx.tree_deserialise_leaves(tmp_path / "a.fx", tree), tree)
    assert_bitwise_equal(fx.tree_deserialise_leaves(str(tmp_path / "b.fx"), tree), tree)
    assert sorted(os.listdir(tmp_path)) == ["a.fx", "b.fx"]  # no temporary files left


def test_round_trips_through_open_binary_files(tmp_path: Any) -> None:
    tree = [np.arange(3), 2.5]
    with open(tmp_path / "c.fx", "wb") as file:
        fx.tree_serialise_leaves(file, tree)
    with open(tmp_path / "c.fx", "rb") as file:
        assert_bitwise_equal(fx.tree_deserialise_leaves(file, tree), tree)


def test_several_checkpoints_follow_each_other_in_one_file() -> None:
    file = io.BytesIO()
    fx.tree_serialise_leaves(file, [1.0])
    fx.tree_serialise_leaves(file, {"a": np.ones(2)})
    file.seek(0)
    assert fx.tree_deserialise_leaves(file, [0.0]) == [1.0]
    assert fx.tree_deserialise_leaves(file, {"a": np.zeros(2)})["a"].tolist() == [
        1.0,
        1.0,
    ]
    assert file.read() == b""


def test_non_seekable_streams_work_both_ways(read_only_stream) -> None:
    class WriteOnly(io.RawIOBase):
        def __init__(self) -> None:
            self.data = bytearray()

        def writable(self) -> bool:
            return True

        def write(self, b: Any) -> int:
            self.data += bytes(b)
            return len(b)

    sink = WriteOnly()
    tree = {"a": np.arange(5), "b": np.ones(3)}
    fx.tree_serialise_leaves(sink, tree)
    keep_b = {"a": fx.default_deserialise_filter_spec, "b": lambda f, like: like}
    restored = fx.tree_deserialise_leaves(
        read_only_stream(bytes(sink.data)), tree, keep_b
    )
    assert restored["b"] is tree["b"]  # the unread entry was skipped by reading past it
    assert_bitwise_equal(restored, tree)


# --- restored leaf types and placement ----------------------------------------


def test_restored_leaves_take_the_type_of_like() -> None:
    data = save_to_bytes([np.arange(3.0, dtype=np.float32)] * 3 + [np.float32(2)])
    like = [
        jnp.zeros(3),
        np.zeros(3, np.float32),
        jax.ShapeDtypeStruct((3,), jnp.float32),
        np.float32(0),
    ]
    as_jax, as_numpy, from_struct, scalar = load_from_bytes(data, like)
    assert isinstance(as_jax, jax.Array) and not as_jax.committed
    assert as_jax.devices() == {jax.devices()[0]}
    assert type(as_numpy) is np.ndarray
    assert isinstance(from_struct, jax.Array)
    assert type(scalar) is np.float32 and scalar == 2


def test_restored_jax_arrays_keep_the_sharding_of_like() -> None:
    devices = jax.devices()
    if len(devices) < 8:
        pytest.skip("needs the 8 simulated CPU devices of conftest.py")
    mesh = jax.sharding.Mesh(np.array(devices).reshape(4, 2), ("a", "b"))
    sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("a", "b"))
    tree = {
        "sharded": jax.device_put(jnp.arange(32.0).reshape(8, 4), sharding),
        "on_device_3": jax.device_put(jnp.ones(2), devices[3]),
        "keys": jax.device_put(jax.random.split(jax.random.key(0), 8), devices[5]),
    }
    restored = load_from_bytes(save_to_bytes(tree), jtu.tree_map(perturbed, tree))
    assert_bitwise_equal(restored, tree)
    assert restored["sharded"].sharding == sharding
    assert restored["on_device_3"].devices() == {devices[3]}
    assert restored["keys"].devices() == {devices[5]}


def test_shape_dtype_struct_like_gives_keys_and_sharded_arrays() -> None:
    tree = {"w": jnp.arange(4.0), "key": jax.random.key(1, impl="rbg")}
    like = jax.eval_shape(lambda: tree)
    assert_bitwise_equal(load_from_bytes(save_to_bytes(tree), like), tree)


def test_numpy_and_jax_arrays_load_into_each_other() -> None:
    data = save_to_bytes([np.arange(3, dtype=np.int32), jnp.arange(3)])
    as_jax, as_numpy = load_from_bytes(
        data, [jnp.zeros(3, jnp.int32), np.zeros(3, np.int32)]
    )
    assert isinstance(as_jax, jax.Array) and type(as_numpy) is np.ndarray


def test_non_differentiable_contents_are_saved_like_other_leaves() -> None:
    tree = {"frozen": fx.NonDifferentiable(jnp.arange(3.0)), "free": jnp.ones(2)}
    data = save_to_bytes(tree)
    assert header_paths(data) == ["['free']", "['frozen'].value"]
    restored = load_from_bytes(data, jtu.tree_map(perturbed, tree))
    assert isinstance(restored["frozen"], fx.NonDifferentiable)
    assert_bitwise_equal(restored, tree)


def test_non_array_leaves_are_kept_from_like() -> None:
    tree = {"act": "relu", "fn": module_level_function, "w": np.ones(1)}
    like = {"act": "gelu", "fn": len, "w": np.zeros(1)}
    restored = load_from_bytes(save_to_bytes(tree), like)
    assert restored["act"] == "gelu" and restored["fn"] is len


def test_modules_with_static_fields_round_trip() -> None:
    model = Pair(Tagged(jnp.ones(3), tag="x"), [jax.random.key(0), 1.5])
    data = save_to_bytes(model)
    assert header_paths(data) == [".first.value", ".second[0]", ".second[1]"]
    assert_bitwise_equal(load_from_bytes(data, jtu.tree_map(perturbed, model)), model)


# --- file format ---------------------------------------------------------------


def test_file_starts_with_magic_and_version_and_lists_key_paths() -> None:
    data = save_to_bytes({"b": jnp.ones((2, 3), jnp.bfloat16), "a": 7})
    assert data[:8] == b"\x89FLTRAX\n"
    assert struct.unpack_from("<II", data, 8) == (1, 0)
    assert header_paths(data) == ["['a']", "['b']"]
    (a, _, _), (b, start, size) = entries(data)
    assert a == {
        "path": "['a']",
        "kind": "int",
        "dtype": "int",
        "shape": [],
        "nbytes": 1,
    }
    assert b == {
        "path": "['b']",
        "kind": "jax_array",
        "dtype": "bfloat16",
        "shape": [2, 3],
        "nbytes": 12,
    }
    assert data[start : start + size] == np.ones(6, ml_dtypes.bfloat16).tobytes()


# --- errors ----------------------------------------------------------------------

TREE = {"a": np.arange(4, dtype=np.int32), "w": jnp.ones((2, 2))}


def test_truncation_anywhere_is_detected() -> None:
    data = save_to_bytes(TREE)
    (_, a_start, _), (_, w_start, w_size) = entries(data)
    for cut in [
        0,
        5,
        12,
        20,
        30,
        a_start - 3,
        a_start + 2,
        w_start - 2,
        w_start + w_size // 2,
        len(data) - 1,
    ]:
        with pytest.raises(fx.SerialisationError, match="truncated|corrupted"):
            load_from_bytes(data[:cut], TREE)


def test_truncated_data_error_names_the_key_path() -> None:
    data = save_to_bytes(TREE)
    _, (_, w_start, _) = entries(data)
    with pytest.raises(fx.SerialisationError, match=r"truncated.*entry \['w'\]"):
        load_from_bytes(data[: w_start + 3], TREE)


def test_corrupted_header_is_detected() -> None:
    data = bytearray(save_to_bytes(TREE))
    data[26] ^= 0x01  # inside the header's JSON
    with pytest.raises(fx.SerialisationError, match="header is corrupted"):
        load_from_bytes(bytes(data), TREE)


@pytest.mark.parametrize("which", [0, 1])
def test_corrupted_entry_data_is_detected_and_named(which: int) -> None:
    data = bytearray(save_to_bytes(TREE))
    meta, start, _ = entries(bytes(data))[which]
    data[start + 1] ^= 0x40
    with pytest.raises(
        fx.SerialisationError,
        match=rf"entry {re.escape(meta['path'])} is corrupted",
    ):
        load_from_bytes(bytes(data), TREE)


def test_corrupted_entry_header_is_detected() -> None:
    data = bytearray(save_to_bytes(TREE))
    _, start, _ = entries(bytes(data))[1]
    data[start - 10] ^= 0x01  # inside the entry header's JSON
    with pytest.raises(fx.SerialisationError, match="entry.*corrupted"):
        load_from_bytes(bytes(data), TREE)


def test_wrong_magic_is_rejected() -> None:
    data = save_to_bytes(TREE)
    with pytest.raises(fx.SerialisationError, match="not a filterax checkpoint"):
        load_from_bytes(b"\x93NUMPY" + data[6:], TREE)


def test_unsupported_version_is_rejected() -> None:
    data = bytearray(save_to_bytes(TREE))
    data[8:12] = struct.pack("<I", 2)
    (length,) = struct.unpack_from("<Q", data, 16)
    data[24 + length : 28 + length] = struct.pack("<I", zlib.crc32(data[: 24 + length]))
    with pytest.raises(
        fx.SerialisationError, match="format version 2 is not supported"
    ):
        load_from_bytes(bytes(data), TREE)


def test_unknown_flags_are_rejected() -> None:
    data = bytearray(save_to_bytes(TREE))
    data[12:16] = struct.pack("<I", 1)
    (length,) = struct.unpack_from("<Q", data, 16)
    data[24 + length : 28 + length] = struct.pack("<I", zlib.crc32(data[: 24 + length]))
    with pytest.raises(fx.SerialisationError, match="format flags 0x1"):
        load_from_bytes(bytes(data), TREE)


def test_damaged_length_field_does_not_allocate_what_it_claims() -> None:
    data = bytearray(save_to_bytes(TREE))
    data[16:24] = struct.pack("<Q", 2**31)  # a 2 GiB header, in a tiny file
    tracemalloc.start()
    try:
        with pytest.raises(fx.SerialisationError, match="truncated.*the header"):
            load_from_bytes(bytes(data), TREE)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 2**24


def test_missing_entry_is_named() -> None:
    data = save_to_bytes({"a": TREE["a"]})
    with pytest.raises(fx.SerialisationError, match=r"no entry for: \['w'\]"):
        load_from_bytes(data, TREE)


def test_extra_entry_is_named() -> None:
    data = save_to_bytes({**TREE, "extra": 1.0})
    with pytest.raises(fx.SerialisationError, match=r"no leaf for: \['extra'\]"):
        load_from_bytes(data, TREE)


def test_a_like_that_is_one_subtree_of_the_saved_tree_loads_it_alone(
    read_only_stream,
) -> None:
    # The model of a `(model, opt_state)` checkpoint, by its key paths; the
    # other entries are skipped, through a stream too.
    model = fx.nn.MLP(2, 2, 4, 1, key=jax.random.key(0))
    moments = jax.tree.map(jnp.zeros_like, fx.filter(model, fx.is_array))
    state = {"count": jnp.array(3), "mu": moments, "nu": moments}
    data = save_to_bytes((state, model, 0.5))
    like = fx.nn.MLP(2, 2, 4, 1, key=jax.random.key(1))
    assert fx.tree_equal(load_from_bytes(data, like), model)
    assert fx.tree_equal(
        fx.tree_deserialise_leaves(read_only_stream(data), like), model
    )
    state_like = {"count": jnp.array(0), "mu": moments, "nu": moments}
    assert fx.tree_equal(load_from_bytes(data, state_like), state)
    with pytest.raises(fx.SerialisationError, match="does not match the structure"):
        load_from_bytes(data, moments)  # only at depth 2: not a top-level part


def test_a_like_matching_only_part_of_a_subtree_is_still_an_error() -> None:
    data = save_to_bytes(({"a": jnp.ones(2), "b": jnp.ones(1)}, 1.0))
    with pytest.raises(
        fx.SerialisationError, match=r"no leaf for: \[0\]\['a'\], \[0\]\['b'\]"
    ):
        load_from_bytes(data, {"a": jnp.zeros(2)})
    # Two places fit: which one is meant cannot be told.
    data = save_to_bytes(({"a": jnp.ones(2)}, {"a": jnp.full(2, 2.0)}))
    with pytest.raises(fx.SerialisationError, match="does not match the structure"):
        load_from_bytes(data, {"a": jnp.zeros(2)})


def test_values_jax_would_convert_load_into_jax_arrays():
    # A Python int step, a float, NumPy float64 statistics, resumed into the
    # 32-bit JAX leaves they become under JAX with x64 disabled.
    saved = {"step": 5, "rate": 1.5, "stats": np.ones(3), "n": np.int64(7)}
    like = {
        "step": jnp.asarray(0),
        "rate": jnp.asarray(0.0),
        "stats": jnp.zeros(3),
        "n": jnp.asarray(0),
    }
    loaded = load_from_bytes(save_to_bytes(saved), like)
    for name in saved:
        assert loaded[name].dtype == like[name].dtype
        np.testing.assert_array_equal(loaded[name], saved[name])
    with pytest.raises(fx.SerialisationError, match="holds a Python int"):
        load_from_bytes(save_to_bytes({"x": 2**40}), {"x": jnp.asarray(0)})
    with pytest.raises(fx.SerialisationError, match="holds a float64"):
        load_from_bytes(
            save_to_bytes({"x": np.ones(2)}), {"x": np.zeros(2, np.float32)}
        )


@pytest.mark.parametrize(
    "saved, like, expected",
    [
        (1, 0.0, 1.0),
        (2, 0j, 2 + 0j),
        (2.5, 0j, 2.5 + 0j),
        (jnp.float32(2.5), 0.0, 2.5),
        (np.int32(7), 0, 7),
    ],
)
def test_python_scalars_load_what_converts_to_them_exactly(saved, like, expected):
    loaded = load_from_bytes(save_to_bytes({"x": saved}), {"x": like})["x"]
    assert type(loaded) is type(like) and loaded == expected


@pytest.mark.parametrize("saved", [2.5, 2**60 + 1, True, jnp.array([1.0])])
def test_python_scalars_refuse_what_would_change_them(saved):
    like = 0 if isinstance(saved, float) else 0.0
    if saved is True:
        like = 0
    with pytest.raises(fx.SerialisationError, match="but `like` has a Python"):
        load_from_bytes(save_to_bytes({"x": saved}), {"x": like})


@pytest.mark.parametrize(
    "like_w, expected",
    [
        (
            jnp.ones((2, 3)),
            r"\['w'\] holds a float32\[2,2\] array, but `like` has a float32\[2,3\]",
        ),
        (
            jnp.ones((2, 2), jnp.bfloat16),
            r"\['w'\] holds a float32\[2,2\] array, but `like` has a bfloat16\[2,2\]",
        ),
        (2.0, r"\['w'\] holds a float32\[2,2\] array, but `like` has a Python float"),
        ("text", r"\['w'\] holds a float32\[2,2\] array, but `like` has a str"),
    ],
)
def test_leaf_mismatch_with_like_is_named(like_w: Any, expected: str) -> None:
    with pytest.raises(fx.SerialisationError, match=expected):
        load_from_bytes(save_to_bytes(TREE), {**TREE, "w": like_w})


def test_key_implementation_mismatch_is_named() -> None:
    data = save_to_bytes({"key": jax.random.key(0, impl="rbg")})
    with pytest.raises(
        fx.SerialisationError,
        match=r"\['key'\] holds a rbg key array.*threefry2x32 key array",
    ):
        load_from_bytes(data, {"key": jax.random.key(0, impl="threefry2x32")})


def test_failed_load_returns_nothing_and_leaves_like_untouched() -> None:
    like = {"a": np.full(4, 9, np.int32), "w": np.full((2, 2), 9.0, np.float32)}
    data = bytearray(save_to_bytes(TREE))
    _, start, _ = entries(bytes(data))[1]
    data[start] ^= 0xFF  # the last entry is corrupted, the first one is fine
    with pytest.raises(fx.SerialisationError):
        load_from_bytes(bytes(data), like)
    assert (like["a"] == 9).all() and (like["w"] == 9.0).all()
    restored = load_from_bytes(save_to_bytes(TREE), like)
    assert not np.shares_memory(restored["a"], like["a"])


def test_unsupported_leaves_raise_type_error_naming_the_path() -> None:
    with pytest.raises(TypeError, match=r"\['bad'\].*dtype object"):
        save_to_bytes({"bad": np.array([None])})
    with pytest.raises(TypeError, match=r"\[0\].*traced array"):
        jax.jit(lambda x: save_to_bytes([x]) and x)(jnp.ones(2))


def test_text_mode_files_are_rejected(tmp_path: Any) -> None:
    with (
        open(tmp_path / "t.txt", "w") as file,
        pytest.raises(TypeError, match="binary file"),
    ):
        fx.tree_serialise_leaves(file, [1.0])


# --- atomic writes -----------------------------------------------------------------


def test_failure_mid_write_keeps_the_old_file_and_cleans_up(tmp_path: Any) -> None:
    path = tmp_path / "model.fx"
    fx.tree_serialise_leaves(path, TREE)
    old = path.read_bytes()

    def fails_on_second_leaf(f: Any, leaf: Any) -> None:
        if isinstance(leaf, jax.Array):
            raise RuntimeError("simulated crash")
        fx.default_serialise_filter_spec(f, leaf)

    with pytest.raises(RuntimeError, match="simulated crash"):
        fx.tree_serialise_leaves(
            path, {"a": TREE["a"], "w": jnp.zeros(3)}, fails_on_second_leaf
        )
    assert path.read_bytes() == old
    assert os.listdir(tmp_path) == ["model.fx"]


WRITER_SCRIPT = textwrap.dedent(
    """
    import sys, time
    import numpy as np
    import filterax as fx

    def spec(f, leaf):
        fx.default_serialise_filter_spec(f, leaf)
        if leaf.shape == (1000,):  # the first leaf has been written: stall
            sys.stdout.write("written\\n")
            sys.stdout.flush()
            time.sleep(120)

    tree = [np.ones(1000), np.ones(1001)]
    fx.tree_serialise_leaves(sys.argv[1], tree, spec)
    """
)


@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs POSIX signals")
def test_killed_writer_process_leaves_the_old_file_intact(tmp_path: Any) -> None:
    path = tmp_path / "model.fx"
    fx.tree_serialise_leaves(path, TREE)
    old = path.read_bytes()
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    writer = subprocess.Popen(
        [sys.executable, "-c", WRITER_SCRIPT, str(path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )
    assert writer.stdout is not None and writer.stderr is not None
    try:
        ready, _, _ = select.select([writer.stdout], [], [], 120)  # never hang
        line = writer.stdout.readline() if ready else b"(timed out)"
        assert line == b"written\n", writer.stderr.read().decode()
        os.kill(writer.pid, signal.SIGKILL)
    finally:
        writer.kill()  # only if the assertion above failed
        writer.communicate(timeout=60)
    assert writer.returncode == -signal.SIGKILL
    assert path.read_bytes() == old
    assert_bitwise_equal(fx.tree_deserialise_leaves(path, TREE), TREE)
    leftovers = [name for name in os.listdir(tmp_path) if name != "model.fx"]
    assert len(leftovers) == 1 and leftovers[0].endswith(".tmp")  # killed mid-write


def test_writing_through_a_symlink_replaces_its_target(tmp_path: Any) -> None:
    (tmp_path / "real.fx").write_bytes(b"old")
    os.symlink(tmp_path / "real.fx", tmp_path / "link.fx")
    fx.tree_serialise_leaves(tmp_path / "link.fx", [1.0])
    assert os.path.islink(tmp_path / "link.fx")
    assert fx.tree_deserialise_leaves(tmp_path / "real.fx", [0.0]) == [1.0]


# --- custom filter specs ---------------------------------------------------------


def test_custom_callables_can_write_their_own_bytes() -> None:
    def save(f: Any, leaf: Any) -> None:
        np.save(f, np.asarray(leaf) * 2)

    def load(f: Any, like: Any) -> Any:
        return jnp.asarray(np.load(f) // 2)

    tree = {"a": jnp.arange(3), "b": jnp.arange(2)}
    data = save_to_bytes(
        tree, filter_spec={"a": save, "b": fx.default_serialise_filter_spec}
    )
    assert [meta["kind"] for meta, _, _ in entries(data)] == ["raw", "jax_array"]
    restored = load_from_bytes(
        data, tree, filter_spec={"a": load, "b": fx.default_deserialise_filter_spec}
    )
    assert_bitwise_equal(restored, tree)


def test_raw_entry_read_with_default_spec_is_a_clear_error() -> None:
    data = save_to_bytes([jnp.ones(2)], filter_spec=lambda f, leaf: f.write(b"abc"))
    with pytest.raises(
        fx.SerialisationError, match=r"\[0\] holds 3 bytes written by a custom"
    ):
        load_from_bytes(data, [jnp.ones(2)])


def test_skipped_leaf_keeps_like_when_loading_with_a_skipping_callable() -> None:
    tree = {"params": jnp.ones(2), "state": jnp.arange(3)}
    data = save_to_bytes(
        tree,
        filter_spec={
            "params": fx.default_serialise_filter_spec,
            "state": lambda f, x: None,
        },
    )
    like = {"params": jnp.zeros(2), "state": jnp.zeros(3, jnp.int32)}
    keep = {"params": fx.default_deserialise_filter_spec, "state": lambda f, x: x}
    restored = load_from_bytes(data, like, filter_spec=keep)
    assert restored["state"] is like["state"] and restored["params"].tolist() == [
        1.0,
        1.0,
    ]


def test_is_leaf_nodes_reach_custom_callables_whole() -> None:
    seen = []

    def save(f: Any, leaf: Any) -> None:
        seen.append(type(leaf))
        f.write(b"")

    tree = {"a": fx.NonDifferentiable(jnp.ones(2))}
    save_to_bytes(tree, filter_spec=save, is_leaf=fx.is_non_differentiable)
    assert seen == [fx.NonDifferentiable]
    with pytest.raises(
        TypeError, match=r"NonDifferentiable node at \['a'\] that contains arrays"
    ):
        save_to_bytes(tree, is_leaf=fx.is_non_differentiable)


def test_filter_spec_must_be_a_prefix_of_callables() -> None:
    with pytest.raises(ValueError, match="pytree prefix"):
        save_to_bytes({"a": 1.0}, filter_spec={"b": fx.default_serialise_filter_spec})
    with pytest.raises(TypeError, match=r"filter_spec leaf at \['a'\] is True"):
        save_to_bytes({"a": 1.0}, filter_spec={"a": True})


def test_default_specs_on_another_file_read_and_write_numpy_records() -> None:
    # As Equinox's: `numpy.save` of arrays and scalars, nothing for others.
    file = io.BytesIO()
    for leaf in (jnp.arange(2.0), 3, "label", np.float32(1.5)):
        fx.default_serialise_filter_spec(file, leaf)
    file.seek(0)
    np.testing.assert_array_equal(np.load(file), [0.0, 1.0])
    assert np.load(file).item() == 3
    file.seek(0)
    like = (jnp.zeros(2), 0, "other", np.float32(0))
    restored = [fx.default_deserialise_filter_spec(file, x) for x in like]
    assert restored[1:] == [3, "other", np.float32(1.5)]
    with pytest.raises(fx.SerialisationError, match="holds a float32\\[2\\] array"):
        file.seek(0)
        fx.default_deserialise_filter_spec(file, jnp.zeros(3))


def test_a_custom_spec_reads_default_entries_with_numpy_load(tmp_path: Any) -> None:
    # The Equinox pattern of loading into another dtype, and re-reading.
    path = tmp_path / "model.eqx"
    fx.tree_serialise_leaves(path, (jnp.arange(3.0), 7, jax.random.key(1)))

    def cast(f: Any, like: Any) -> Any:
        if isinstance(like, int):
            return int(np.load(f))
        start = f.tell()
        np.load(f)
        f.seek(start)
        return jnp.load(f).astype(like.dtype)

    like = (jnp.zeros(3, jnp.bfloat16), 0, jnp.zeros(2, jnp.uint32))
    weights, step, key_data = fx.tree_deserialise_leaves(path, like, filter_spec=cast)
    assert weights.dtype == jnp.bfloat16 and weights.tolist() == [0, 1, 2]
    assert step == 7
    np.testing.assert_array_equal(key_data, jax.random.key_data(jax.random.key(1)))


def test_the_default_spec_reads_numpy_records_a_custom_spec_wrote(
    tmp_path: Any,
) -> None:
    path = tmp_path / "model.eqx"
    tree = (jnp.arange(3.0), 4, np.ones(2, np.int8))
    fx.tree_serialise_leaves(path, tree, filter_spec=lambda f, x: np.save(f, x))
    restored = fx.tree_deserialise_leaves(path, (jnp.zeros(3), 0, np.zeros(2, np.int8)))
    assert fx.tree_equal(restored, tree) and type(restored[2]) is np.ndarray
    with pytest.raises(
        fx.SerialisationError, match=r"float32\[3\] array, but `like` has"
    ):
        fx.tree_deserialise_leaves(path, (jnp.zeros(4), 0, np.zeros(2, np.int8)))


# --- streaming -----------------------------------------------------------------------


def test_saving_and_loading_stream_one_leaf_at_a_time(tmp_path: Any) -> None:
    leaf_bytes = 2**22
    tree = [np.full(leaf_bytes // 4, i, np.float32) for i in range(8)]  # 32 MiB
    path = tmp_path / "big.fx"
    jax_like = [jnp.zeros(leaf_bytes // 4) for _ in tree]
    tracemalloc.start()
    try:
        fx.tree_serialise_leaves(path, tree)
        _, save_peak = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        before, _ = tracemalloc.get_traced_memory()
        restored = fx.tree_deserialise_leaves(path, tree)
        _, load_peak = tracemalloc.get_traced_memory()
        del restored
        tracemalloc.reset_peak()
        restored_jax = fx.tree_deserialise_leaves(path, jax_like)
        held, jax_peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert_bitwise_equal(restored_jax, [jnp.asarray(a) for a in tree])
    assert save_peak < leaf_bytes  # no copy of any leaf, let alone of the file
    assert load_peak - before < 8 * leaf_bytes + leaf_bytes // 2  # the result, no more
    # Host buffers are adopted by (CPU) or copied to (GPU) the device one at a time.
    assert jax_peak - held < leaf_bytes + leaf_bytes // 2


def test_weakly_typed_scalars_stay_weakly_typed():
    like = {"step": jnp.asarray(3), "lr": jnp.asarray(0.1), "w": jnp.ones(2)}
    buffer = io.BytesIO()
    fx.tree_serialise_leaves(buffer, like)
    buffer.seek(0)
    restored = fx.tree_deserialise_leaves(buffer, like)
    assert restored["step"].weak_type and restored["lr"].weak_type
    assert not restored["w"].weak_type
    assert restored["lr"].dtype == like["lr"].dtype and restored["lr"] == like["lr"]


def test_a_ref_is_stored_as_its_value_and_restored_as_a_new_ref(tmp_path):
    ref = jax.new_ref(jnp.arange(3.0))
    path = tmp_path / "state.fx"
    fx.tree_serialise_leaves(path, {"buffer": ref, "w": jnp.ones(2)})
    like = {"buffer": jax.new_ref(jnp.zeros(3)), "w": jnp.zeros(2)}
    loaded = fx.tree_deserialise_leaves(path, like)
    assert fx.is_ref(loaded["buffer"]) and loaded["buffer"] is not like["buffer"]
    np.testing.assert_array_equal(loaded["buffer"][...], [0.0, 1.0, 2.0])
    np.testing.assert_array_equal(like["buffer"][...], [0.0, 0.0, 0.0])


def test_a_ref_of_another_shape_is_a_clear_error(tmp_path):
    path = tmp_path / "state.fx"
    fx.tree_serialise_leaves(path, [jax.new_ref(jnp.zeros(3))])
    with pytest.raises(fx.SerialisationError, match=r"\[0\].*f32\[3\]|float32\[3\]"):
        fx.tree_deserialise_leaves(path, [jax.new_ref(jnp.zeros(4))])


# --- weak types --------------------------------------------------------------------


@pytest.mark.parametrize(
    "make_weak",
    [
        lambda: jnp.broadcast_to(1.5, (3,)),
        lambda: jax.jit(lambda: jnp.broadcast_to(2, (2, 2)))(),
        lambda: jnp.broadcast_to(1 - 2j, (0, 4)),
        lambda: jnp.asarray(0.25),
    ],
    ids=["broadcast-float", "jitted-int", "empty-complex", "scalar"],
)
def test_weakly_typed_arrays_of_any_shape_stay_weakly_typed(make_weak: Any) -> None:
    weak = make_weak()
    assert weak.weak_type
    restored = load_from_bytes(save_to_bytes([weak]), [jnp.zeros_like(weak)])[0]
    assert restored.weak_type and restored.dtype == weak.dtype
    assert_bitwise_equal(restored, weak)


def test_weakly_typed_arrays_keep_their_device_and_sharding() -> None:
    devices = jax.devices()
    mesh = jax.sharding.Mesh(np.array(devices).reshape(4, 2), ("a", "b"))
    sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("a", "b"))
    tree = {
        "sharded": jax.device_put(jnp.broadcast_to(3.0, (8, 4)), sharding),
        "on_device_3": jax.device_put(jnp.broadcast_to(1, (5,)), devices[3]),
        "scalar_on_device_2": jax.device_put(jnp.asarray(0.5), devices[2]),
    }
    restored = load_from_bytes(save_to_bytes(tree), tree)
    assert all(leaf.weak_type for leaf in restored.values())
    assert restored["sharded"].sharding == sharding
    assert restored["on_device_3"].devices() == {devices[3]}
    assert restored["scalar_on_device_2"].devices() == {devices[2]}
    assert_bitwise_equal(restored, tree)


def test_a_restored_model_does_not_make_filter_jit_retrace() -> None:
    model = Pair(jnp.broadcast_to(0.5, (4,)), jnp.arange(4.0))
    traces = []

    @fx.filter_jit
    def apply(m: Pair) -> jax.Array:
        traces.append(None)
        return m.first * m.second

    apply(model)
    restored = load_from_bytes(
        save_to_bytes(model), jtu.tree_map(jnp.zeros_like, model)
    )
    apply(restored)
    assert len(traces) == 1


def test_a_strongly_typed_like_gives_a_strongly_typed_leaf() -> None:
    data = save_to_bytes([jnp.broadcast_to(1.0, (3,))])
    assert not load_from_bytes(data, [jnp.zeros(3)])[0].weak_type


# --- arrays that cannot be saved ------------------------------------------------------


def test_a_deleted_array_is_a_clear_error_naming_the_key_path(tmp_path: Any) -> None:
    gone = jnp.arange(3.0)
    gone.delete()
    path = tmp_path / "model.fx"
    with pytest.raises(
        ValueError, match=r"leaf at \['w'\]: its array has been deleted"
    ):
        fx.tree_serialise_leaves(path, {"b": jnp.ones(2), "w": gone})
    assert os.listdir(tmp_path) == []  # nothing written, no temporary file left


def test_a_donated_array_is_a_clear_error_naming_the_key_path() -> None:
    donated = jnp.arange(3.0)
    jax.jit(lambda x: x + 1, donate_argnums=0)(donated)
    if not donated.is_deleted():  # this backend ignored the donation
        donated.delete()
    with pytest.raises(ValueError, match=r"leaf at \[0\]\.value: its array has been"):
        save_to_bytes([fx.NonDifferentiable(donated)])


# --- Refs and RngStream -----------------------------------------------------------------


def test_a_ref_holding_keys_round_trips_as_a_new_ref() -> None:
    keys = jax.new_ref(jax.random.split(jax.random.key(3), 2))
    like = jax.new_ref(jax.random.split(jax.random.key(0), 2))
    restored = load_from_bytes(save_to_bytes({"keys": keys}), {"keys": like})["keys"]
    assert fx.is_ref(restored) and restored is not like
    assert_bitwise_equal(restored[...], keys[...])


def test_a_restored_ref_is_independent_of_like() -> None:
    like = jax.new_ref(jnp.zeros(3))
    restored = load_from_bytes(save_to_bytes([jax.new_ref(jnp.ones(3))]), [like])[0]
    restored[...] = jnp.full(3, 5.0)
    assert like[...].tolist() == [0.0, 0.0, 0.0]


def test_a_ref_mismatch_says_that_like_holds_a_ref() -> None:
    data = save_to_bytes({"buffer": jnp.zeros(3, jnp.int32)})
    with pytest.raises(
        fx.SerialisationError,
        match=r"\['buffer'\] holds an int32\[3\] array, but `like` has a Ref holding "
        r"a float32\[3\] array",
    ):
        load_from_bytes(data, {"buffer": jax.new_ref(jnp.zeros(3))})


def test_an_rng_stream_round_trips_with_its_counter() -> None:
    stream = fx.RngStream(jax.random.key(11))
    stream()
    stream()
    like = fx.RngStream(jax.random.key(0))
    restored = load_from_bytes(save_to_bytes({"rng": stream}), {"rng": like})["rng"]
    assert int(restored.count[...]) == 2 and int(like.count[...]) == 0
    assert restored.count is not like.count
    assert_bitwise_equal(restored.key, stream.key)
    assert_bitwise_equal(restored(), stream())
