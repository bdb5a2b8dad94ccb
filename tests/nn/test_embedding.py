"""`filterax.nn.Embedding`."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import filterax as fx


@pytest.fixture(autouse=True)
def strict_promotion():
    with jax.numpy_dtype_promotion("strict"), jax.numpy_rank_promotion("raise"):
        yield


def test_lookup_is_indexing_the_table():
    embedding = fx.nn.Embedding(6, 4, key=jax.random.key(0))
    for index in (0, 3, 5):
        np.testing.assert_array_equal(
            embedding(jnp.array(index)), embedding.weight[index]
        )
    np.testing.assert_array_equal(embedding(2), embedding.weight[2])
    np.testing.assert_array_equal(embedding(jnp.array(-1)), embedding.weight[5])


def test_gradient_reaches_only_the_looked_up_row():
    embedding = fx.nn.Embedding(5, 3, key=jax.random.key(0))
    cotangent = jnp.array([1.0, -2.0, 0.5])
    grads = fx.filter_grad(lambda e: jnp.vdot(cotangent, e(jnp.array(2))))(embedding)
    np.testing.assert_array_equal(grads.weight, jnp.zeros((5, 3)).at[2].set(cotangent))


def test_gradients_of_repeated_lookups_add_up():
    embedding = fx.nn.Embedding(4, 2, key=jax.random.key(0))
    indices = jnp.array([1, 3, 1])
    grads = fx.filter_grad(lambda e: jnp.sum(jax.vmap(e)(indices)))(embedding)
    expected = jnp.zeros((4, 2)).at[1].set(2.0).at[3].set(1.0)
    np.testing.assert_array_equal(grads.weight, expected)


def test_table_is_a_standard_normal_draw():
    key = jax.random.key(3)
    embedding = fx.nn.Embedding(7, 3, key=key)
    np.testing.assert_array_equal(embedding.weight, jax.random.normal(key, (7, 3)))
    large = fx.nn.Embedding(1000, 100, key=key).weight
    assert abs(float(jnp.mean(large))) < 0.01
    assert abs(float(jnp.std(large)) - 1) < 0.01


def test_given_weight_sets_the_sizes():
    weight = jnp.arange(6.0).reshape(3, 2)
    embedding = fx.nn.Embedding(weight=weight)
    assert (embedding.num_embeddings, embedding.embedding_size) == (3, 2)
    assert embedding.weight is weight
    np.testing.assert_array_equal(embedding(1), jnp.array([2.0, 3.0]))
    assert fx.nn.Embedding(3, 2, weight=weight).weight is weight


def test_fields_are_equinox_s():
    assert [f.name for f in dataclasses.fields(fx.nn.Embedding)] == [
        "num_embeddings",
        "embedding_size",
        "weight",
        "axes",  # filterax: static per-instance logical axes, no leaf
    ]


@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16])
def test_low_precision_tables(dtype):
    embedding = fx.nn.Embedding(4, 3, dtype=dtype, key=jax.random.key(0))
    assert embedding(1).dtype == dtype


def test_float64_under_x64():
    with jax.enable_x64(True):
        assert fx.nn.Embedding(4, 3, key=jax.random.key(0)).weight.dtype == jnp.float64


def test_batched_lookup_with_vmap():
    embedding = fx.nn.Embedding(10, 4, key=jax.random.key(0))
    indices = jnp.array([[1, 2], [9, 0]])
    out = fx.filter_vmap(fx.filter_vmap(embedding))(indices)
    np.testing.assert_array_equal(out, embedding.weight[indices])


def test_missing_arguments():
    with pytest.raises(ValueError, match="either `weight=`"):
        fx.nn.Embedding(4, 3)
    with pytest.raises(ValueError, match="either `weight=`"):
        fx.nn.Embedding(embedding_size=3, key=jax.random.key(0))


@pytest.mark.parametrize(
    "kwargs",
    [
        {"weight": jnp.ones(3)},
        {"weight": jnp.ones((2, 3)), "num_embeddings": 3},
        {"weight": jnp.ones((2, 3)), "embedding_size": 2},
    ],
)
def test_weight_of_the_wrong_shape(kwargs):
    with pytest.raises(ValueError, match="weight"):
        fx.nn.Embedding(**kwargs)


def test_negative_sizes():
    with pytest.raises(ValueError, match="num_embeddings"):
        fx.nn.Embedding(-1, 3, key=jax.random.key(0))


def test_index_must_be_one_integer():
    embedding = fx.nn.Embedding(4, 3, key=jax.random.key(0))
    with pytest.raises(ValueError, match="one scalar index"):
        embedding(jnp.array([0, 1]))
    with pytest.raises(TypeError, match="integer"):
        embedding(jnp.array(1.0))
