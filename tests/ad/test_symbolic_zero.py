"""`SymbolicZero` and `zero_cotangent`."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np
import pytest

import filterax as fx


def test_records_shape_and_inexact_dtype():
    zero = fx.SymbolicZero((2, 3), jnp.float32)
    assert zero.shape == (2, 3)
    assert zero.dtype == jnp.float32


@pytest.mark.parametrize(
    "dtype", [jnp.int32, jnp.bool_, jnp.uint8, jax.random.key(0).dtype]
)
def test_non_inexact_dtypes_become_float0(dtype):
    assert fx.SymbolicZero((), dtype).dtype == jax.dtypes.float0


def test_is_a_leaf_for_tree_utilities():
    zero = fx.SymbolicZero((2,), jnp.float32)
    tree = {"a": zero, "b": [zero]}
    assert jax.tree.leaves(tree) == [zero, zero]
    assert jtu.tree_map(lambda x: x, tree) == tree
    kept, rest = fx.partition(tree, lambda x: isinstance(x, fx.SymbolicZero))
    assert kept == tree and rest == {"a": None, "b": [None]}


def test_hashable_and_equal_by_shape_and_dtype():
    a = fx.SymbolicZero((2,), jnp.float32)
    assert a == fx.SymbolicZero([2], np.dtype("float32"))
    assert a != fx.SymbolicZero((3,), jnp.float32)
    assert a != fx.SymbolicZero((2,), jnp.float16)
    assert len({a, fx.SymbolicZero((2,), jnp.float32)}) == 1


def test_can_be_static_under_jit():
    traces = []

    def f(x, zero):
        traces.append(zero)
        return x + zero.materialize()

    jitted = jax.jit(f, static_argnums=1)
    zero = fx.SymbolicZero((2,), jnp.float32)
    assert jnp.array_equal(jitted(jnp.ones(2), zero), jnp.ones(2))
    jitted(jnp.ones(2), fx.SymbolicZero((2,), jnp.float32))
    assert len(traces) == 1


def test_is_immutable():
    zero = fx.SymbolicZero((), jnp.float32)
    with pytest.raises(AttributeError):
        zero.shape = (1,)  # type: ignore[misc]


def test_materialize_gives_concrete_zeros():
    zeros = fx.SymbolicZero((2,), jnp.bfloat16).materialize()
    assert isinstance(zeros, jax.Array)
    assert zeros.dtype == jnp.bfloat16 and jnp.array_equal(zeros, jnp.zeros(2))


def test_materialize_float0_gives_numpy_float0():
    zeros = fx.SymbolicZero((3,), jnp.int32).materialize()
    assert isinstance(zeros, np.ndarray)
    assert zeros.dtype == jax.dtypes.float0 and zeros.shape == (3,)


def test_repr_shows_shape_and_dtype():
    assert repr(fx.SymbolicZero((2,), jnp.float32)) == (
        "SymbolicZero(shape=(2,), dtype=float32)"
    )
    assert "float0" in repr(fx.SymbolicZero((), jnp.int32))


def test_zero_cotangent_replaces_arrays_and_drops_other_leaves():
    tree = {
        "w": jnp.ones((2, 3)),
        "n": jnp.arange(2),
        "key": jax.random.key(0),
        "np": np.float64(1.0),
        "act": "relu",
        "scale": 1.5,
        "none": None,
    }
    zero = fx.zero_cotangent(tree)
    assert zero == {
        "w": fx.SymbolicZero((2, 3), jnp.float32),
        "n": fx.SymbolicZero((2,), jax.dtypes.float0),
        "key": fx.SymbolicZero((), jax.dtypes.float0),
        "np": fx.SymbolicZero((), np.float64),
        "act": None,
        "scale": None,
        "none": None,
    }


def test_zero_cotangent_descends_into_non_differentiable():
    tree = fx.NonDifferentiable({"buffer": jnp.ones(2)})
    zero = fx.zero_cotangent(tree)
    assert isinstance(zero, fx.NonDifferentiable)
    assert zero._value == {"buffer": fx.SymbolicZero((2,), jnp.float32)}


def test_zero_cotangent_of_module_keeps_its_type():
    class Layer(fx.Module):
        weight: jax.Array
        steps: jax.Array

    zero = fx.zero_cotangent(Layer(jnp.ones(2), jnp.arange(3)))
    assert isinstance(zero, Layer)
    assert zero.weight == fx.SymbolicZero((2,), jnp.float32)
    assert zero.steps == fx.SymbolicZero((3,), jax.dtypes.float0)


def test_zero_cotangent_is_accepted_by_vjp_fn():
    def f(x):
        return {"y": x * 2, "n": jnp.arange(2), "tag": "t"}

    out, vjp_fn = fx.filter_vjp(f, jnp.ones(3))
    (grad,) = vjp_fn(fx.zero_cotangent(out))
    assert jnp.array_equal(grad, jnp.zeros(3))


@pytest.mark.parametrize("shape", [(2, -1), (-3,)])
def test_negative_sizes_are_refused(shape):
    with pytest.raises(ValueError, match="negative size"):
        fx.SymbolicZero(shape, jnp.float32)


@pytest.mark.parametrize("shape", [(2.5,), (True,), ("2",), 3])
def test_non_integer_sizes_are_refused(shape):
    with pytest.raises(TypeError, match="SymbolicZero: shape"):
        fx.SymbolicZero(shape, jnp.float32)


def test_numpy_integer_sizes_are_accepted():
    assert fx.SymbolicZero((np.int64(2),), jnp.float32).shape == (2,)
