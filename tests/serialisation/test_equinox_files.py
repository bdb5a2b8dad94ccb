"""Loading checkpoints written by Equinox's `tree_serialise_leaves`.

`data/*.eqx` were written by Equinox 0.13.8 itself (see `data/README.md`);
the other Equinox-format bytes here are made with `numpy.save`, which is what
Equinox writes, record after record."""

from __future__ import annotations

import io
import shutil
import struct
import tracemalloc
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import filterax as fx

DATA = Path(__file__).parent / "data"


class Model(fx.Module):
    """The fields of the Equinox module saved in `data/equinox_model.eqx`."""

    weight: jax.Array
    bias: jax.Array
    step: jax.Array
    scale: jax.Array
    half: jax.Array
    table: np.ndarray
    column_major: np.ndarray
    count: np.float32
    flag: bool
    layers: int
    rate: float
    phase: complex
    activation: str


def model_like(**changes: Any) -> Model:
    fields = dict(
        weight=jnp.zeros((3, 2)),
        bias=jnp.zeros(2),
        step=jnp.zeros((), jnp.int32),
        scale=jnp.asarray(0.0),
        half=jnp.zeros(3, jnp.bfloat16),
        table=np.zeros((2, 2), np.int16),
        column_major=np.zeros((2, 3)),
        count=np.float32(0),
        flag=False,
        layers=0,
        rate=0.0,
        phase=0j,
        activation="relu",
    )
    return Model(**{**fields, **changes})


def keys_like() -> dict[str, Any]:
    return {
        "one": jax.random.key(0),
        "batch": jax.random.split(jax.random.key(0), 3),
        "rbg": jax.random.key(0, impl="rbg"),
        "noise": jnp.zeros(4),
    }


def npy_records(*arrays: Any) -> bytes:
    file = io.BytesIO()
    for array in arrays:
        np.save(file, array, allow_pickle=True)
    return file.getvalue()


# --- files Equinox wrote ------------------------------------------------------------


def test_an_equinox_module_checkpoint_loads_with_every_value() -> None:
    restored = fx.tree_deserialise_leaves(DATA / "equinox_model.eqx", model_like())
    np.testing.assert_array_equal(restored.weight, np.arange(6.0).reshape(3, 2) / 4)
    np.testing.assert_array_equal(restored.bias, [-1.5, 2.25])
    assert restored.step.dtype == jnp.int32 and int(restored.step) == 1234
    assert restored.scale.weak_type and float(restored.scale) == 0.5
    assert restored.half.dtype == jnp.bfloat16
    assert restored.half.tolist() == [1.0, -2.5, 3.75]
    assert type(restored.table) is np.ndarray and restored.table.dtype == np.int16
    assert restored.table.tolist() == [[1, -2], [3, -4]]
    assert restored.column_major.tolist() == [[0, 1, 2], [3, 4, 5]]
    assert type(restored.count) is np.float32 and restored.count == 7.5
    assert restored.flag is True
    assert type(restored.layers) is int and restored.layers == 3
    assert restored.rate == 1e-3 and restored.phase == 1.5 - 2j
    assert restored.activation == "relu"  # Equinox stores nothing for strings


def test_an_equinox_file_loads_into_shape_dtype_structs() -> None:
    abstract = fx.filter_eval_shape(keys_like)
    assert isinstance(abstract["rbg"], jax.ShapeDtypeStruct)
    restored = fx.tree_deserialise_leaves(DATA / "equinox_keys.eqx", abstract)
    assert jax.random.key_impl(restored["rbg"]) == jax.random.key_impl(
        jax.random.key(0, impl="rbg")
    )
    np.testing.assert_array_equal(
        jax.random.key_data(restored["batch"]),
        jax.random.key_data(jax.random.split(jax.random.key(7), 3)),
    )


def test_typed_keys_load_from_the_key_data_equinox_code_saves() -> None:
    restored = fx.tree_deserialise_leaves(DATA / "equinox_keys.eqx", keys_like())
    expected = {
        "one": jax.random.key(42),
        "batch": jax.random.split(jax.random.key(7), 3),
        "rbg": jax.random.key(5, impl="rbg"),
    }
    for name, key in expected.items():
        assert restored[name].dtype == key.dtype, name
        np.testing.assert_array_equal(
            jax.random.key_data(restored[name]), jax.random.key_data(key)
        )
    np.testing.assert_array_equal(restored["noise"], jnp.linspace(0.0, 1.0, 4))


def test_the_eqx_suffix_is_appended_when_loading_an_equinox_file(
    tmp_path: Path,
) -> None:
    shutil.copy(DATA / "equinox_keys.eqx", tmp_path / "keys.eqx")
    restored = fx.tree_deserialise_leaves(tmp_path / "keys", keys_like())
    assert restored["noise"].shape == (4,)


def test_an_equinox_file_loads_from_a_stream_that_cannot_seek(read_only_stream) -> None:
    data = (DATA / "equinox_model.eqx").read_bytes()
    restored = fx.tree_deserialise_leaves(read_only_stream(data), model_like())
    assert restored.half.tolist() == [1.0, -2.5, 3.75] and restored.layers == 3


def test_custom_callables_read_equinox_records_as_equinox_passes_them() -> None:
    def load_noise_with_numpy(f: Any, like: Any) -> Any:
        if isinstance(like, jax.Array) and like.dtype == jnp.float32:
            return jnp.asarray(np.load(f)) * 2  # as Equinox users write them
        return fx.default_deserialise_filter_spec(f, like)

    with open(DATA / "equinox_keys.eqx", "rb") as file:
        restored = fx.tree_deserialise_leaves(file, keys_like(), load_noise_with_numpy)
    np.testing.assert_array_equal(restored["noise"], jnp.linspace(0.0, 1.0, 4) * 2)
    np.testing.assert_array_equal(
        jax.random.key_data(restored["rbg"]),
        jax.random.key_data(jax.random.key(5, impl="rbg")),
    )


# --- mismatches with `like` ----------------------------------------------------------------


@pytest.mark.parametrize(
    "changes, expected",
    [
        (
            {"weight": jnp.zeros((2, 3))},
            r"record of leaf \.weight holds a float32\[3,2\] array, but `like` has "
            r"a float32\[2,3\] array there",
        ),
        (
            {"step": jnp.zeros((), jnp.uint32)},
            r"record of leaf \.step holds an int32\[\] array",
        ),
        (
            {"half": jnp.zeros(3, jnp.float16)},
            r"record of leaf \.half holds a V2 \(raw 2-byte\)\[3\] array, but `like` "
            r"has a float16\[3\] array there",
        ),
        (
            {"rate": 0},
            r"record of leaf \.rate holds a float64\[\] array, but `like` has a Python int",
        ),
    ],
)
def test_a_mismatching_like_names_the_key_path(changes: dict, expected: str) -> None:
    with pytest.raises(fx.SerialisationError, match=expected) as error:
        fx.tree_deserialise_leaves(DATA / "equinox_model.eqx", model_like(**changes))
    assert "equinox_model.eqx" in str(error.value)
    assert isinstance(error.value, RuntimeError)  # what Equinox raises


def test_records_jax_would_convert_load_into_jax_arrays_as_equinox_loads_them():
    # Equinox reads with `jnp.asarray`: NumPy's 64-bit records (a Python int
    # step, float64 statistics) load into 32-bit JAX leaves with x64 disabled.
    data = npy_records(5, 1.5, np.ones(3), np.int64(7), True)
    like = [
        jnp.asarray(0),
        jnp.asarray(0.0),
        jnp.zeros(3),
        jnp.asarray(0),
        jnp.asarray(False),
    ]
    loaded = fx.tree_deserialise_leaves(io.BytesIO(data), like)
    assert [leaf.dtype for leaf in loaded] == [leaf.dtype for leaf in like]
    assert [leaf.tolist() for leaf in loaded] == [5, 1.5, [1.0] * 3, 7, True]
    # Into NumPy leaves, dtypes still match exactly.
    with pytest.raises(fx.SerialisationError, match="holds a float64"):
        fx.tree_deserialise_leaves(
            io.BytesIO(npy_records(np.ones(3))), np.zeros(3, np.float32)
        )


def test_a_key_of_another_implementation_is_a_clear_error() -> None:
    like = {**keys_like(), "one": jax.random.key(0, impl="rbg")}
    with pytest.raises(
        fx.SerialisationError,
        match=r"leaf \['one'\] holds a uint32\[2\] array, but `like` has a rbg key",
    ):
        fx.tree_deserialise_leaves(DATA / "equinox_keys.eqx", like)


def test_like_with_more_array_leaves_than_the_file_names_the_first_missing() -> None:
    like = {**keys_like(), "zz_extra": jnp.zeros(2)}
    with pytest.raises(
        fx.SerialisationError,
        match=r"ends before the NumPy record of leaf \['zz_extra'\] \(after 4 records\)"
        r".*Error at leaf with path \(DictKey\(key='zz_extra'\),\)",
    ):
        fx.tree_deserialise_leaves(DATA / "equinox_keys.eqx", like)


def test_like_with_fewer_leaves_than_the_file_loads_the_leading_ones(
    tmp_path: Path,
) -> None:
    # As Equinox reads it: the model alone from a `(model, opt_state)` file.
    path = tmp_path / "model_and_state.eqx"
    path.write_bytes(npy_records(np.arange(3.0, dtype=np.float32), np.int32(4)))
    model = fx.tree_deserialise_leaves(path, jnp.zeros(3))
    np.testing.assert_array_equal(model, np.arange(3.0))


def test_python_and_numpy_scalars_load_what_they_hold_exactly() -> None:
    # Equinox converts with `type(like)(value)`: a hyperparameter saved as `1`
    # loads into a field that is now `1.0`. Lossy conversions stay refused.
    data = npy_records(3, True, np.int64(2), 2.5, np.int64(2), np.float32(0.5))
    like = [0.0, 0, 0j, 0j, np.float64(0), np.float64(0)]
    loaded = fx.tree_deserialise_leaves(io.BytesIO(data), like)
    assert loaded[:4] == [3.0, 1, 2 + 0j, 2.5 + 0j]
    assert [type(value) for value in loaded[:4]] == [float, int, complex, complex]
    assert loaded[4] == 2.0 and type(loaded[4]) is np.float64
    assert loaded[5] == 0.5 and type(loaded[5]) is np.float64
    with pytest.raises(fx.SerialisationError, match="cannot hold exactly"):
        fx.tree_deserialise_leaves(io.BytesIO(npy_records(2**53 + 1)), 0.0)
    with pytest.raises(fx.SerialisationError, match="holds a float64"):
        fx.tree_deserialise_leaves(io.BytesIO(npy_records(2.5)), 0)


def test_a_corrupted_record_header_is_a_serialisation_error() -> None:
    record = bytearray(npy_records(np.zeros(3, np.float32)))
    record[record.index(b"{")] = 0xD9  # NumPy's tokeniser meets an open string
    with pytest.raises(fx.SerialisationError, match="malformed header"):
        fx.tree_deserialise_leaves(io.BytesIO(bytes(record)), jnp.zeros(3))


def test_a_custom_spec_may_write_any_bytes_first(tmp_path: Path) -> None:
    # Equinox's documented extension point writes what it likes.
    def write(file, value):
        file.write(struct.pack("<d", value))

    def read(file, like):
        return struct.unpack("<d", file.read(8))[0]

    path = tmp_path / "raw.eqx"
    with open(path, "wb") as file:
        file.write(struct.pack("<d", 0.25))
        np.save(file, np.ones(2, np.float32))
    loaded = fx.tree_deserialise_leaves(
        path, (0.0, jnp.zeros(2)), (read, lambda f, x: jnp.load(f))
    )
    assert loaded[0] == 0.25
    np.testing.assert_array_equal(loaded[1], np.ones(2))


def test_a_truncated_equinox_file_names_the_leaf(tmp_path: Path) -> None:
    data = (DATA / "equinox_model.eqx").read_bytes()
    (tmp_path / "cut.eqx").write_bytes(data[: len(data) // 2])
    with pytest.raises(fx.SerialisationError, match=r"truncated.*leaf \.\w+"):
        fx.tree_deserialise_leaves(tmp_path / "cut.eqx", model_like())


# --- crafted records ---------------------------------------------------------------------


def test_a_record_claiming_a_terabyte_allocates_nothing() -> None:
    record = bytearray(npy_records(np.zeros(3, np.float32)))
    record = record.replace(b"(3,)", b"(250000000000,)".ljust(4))
    header_length = record.index(b"\n") + 1 - 10
    record[8:10] = struct.pack("<H", header_length)
    like = [jax.ShapeDtypeStruct((250_000_000_000,), jnp.float32)]
    tracemalloc.start()
    try:
        with pytest.raises(
            fx.SerialisationError,
            match=r"the data of leaf \[0\] needs 1000000000000 bytes, but only",
        ):
            fx.tree_deserialise_leaves(io.BytesIO(bytes(record)), like)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 2**24


def test_a_pickled_record_is_never_unpickled() -> None:
    data = npy_records(np.array([{"payload": 1}], dtype=object))
    with pytest.raises(fx.SerialisationError, match=r"leaf \[0\] holds pickled Python"):
        fx.tree_deserialise_leaves(io.BytesIO(data), [np.zeros(1)])


def test_a_malformed_record_header_is_named() -> None:
    data = npy_records(np.zeros(2)).replace(b"'shape'", b"'shapes'")
    with pytest.raises(
        fx.SerialisationError,
        match=r"NumPy record of leaf \[0\] has a malformed header",
    ):
        fx.tree_deserialise_leaves(io.BytesIO(data), [np.zeros(2)])


def test_a_file_that_is_neither_format_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "archive.zip").write_bytes(b"PK\x03\x04" + bytes(60))
    with pytest.raises(
        fx.SerialisationError,
        match=r"archive\.zip': not a filterax checkpoint \(starts with "
        r"b'PK\\x03\\x04\\x00\\x00\\x00\\x00', expected b'\\x89FLTRAX\\n'\), nor an "
        r"Equinox one",
    ):
        fx.tree_deserialise_leaves(tmp_path / "archive.zip", [np.zeros(2)])


# --- what Equinox writes for other leaves ----------------------------------------------------


def test_records_of_big_endian_and_fortran_ordered_arrays_load_in_order() -> None:
    data = npy_records(
        np.arange(3, dtype=">i4"),
        np.asfortranarray(np.arange(6.0).reshape(2, 3)),
        np.ones(2, ml_dtypes.float8_e4m3fn),
    )
    like = [jnp.zeros(3, jnp.int32), np.zeros((2, 3)), jnp.zeros(2, jnp.float8_e4m3fn)]
    restored = fx.tree_deserialise_leaves(io.BytesIO(data), like)
    assert restored[0].tolist() == [0, 1, 2]
    assert np.asarray(restored[1]).tolist() == [[0, 1, 2], [3, 4, 5]]
    assert restored[2].astype(jnp.float32).tolist() == [1.0, 1.0]


def test_a_ref_in_like_reads_nothing_as_equinox_writes_nothing_for_it() -> None:
    data = npy_records(np.arange(2.0, dtype=np.float32), np.array(9, np.int32))
    like_ref = jax.new_ref(jnp.full(3, 4.0))
    like = [jnp.zeros(2), like_ref, jnp.zeros((), jnp.int32)]
    restored = fx.tree_deserialise_leaves(io.BytesIO(data), like)
    assert fx.is_ref(restored[1]) and restored[1] is not like_ref
    assert restored[1][...].tolist() == [4.0, 4.0, 4.0]
    restored[1][...] = jnp.zeros(3)
    assert like_ref[...].tolist() == [4.0, 4.0, 4.0]
    assert int(restored[2]) == 9


def test_an_empty_file_is_an_equinox_checkpoint_of_no_arrays() -> None:
    like = ["relu", len]
    assert fx.tree_deserialise_leaves(io.BytesIO(b""), like) == like
    with pytest.raises(
        fx.SerialisationError, match="file is truncated: there is no data"
    ):
        fx.tree_deserialise_leaves(io.BytesIO(b""), [jnp.zeros(2)])
