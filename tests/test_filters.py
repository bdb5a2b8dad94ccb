"""Leaf predicates and `filter` / `partition` / `combine`."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import filterax as fx

# ------------------------------------------------------------------ predicates

KEY = jax.random.key(0)
LEGACY_KEY = jax.random.PRNGKey(0)

# (value, is_array, is_array_like, is_inexact_array, is_inexact_array_like, is_key_array)
CASES = {
    "jax float": (jnp.ones(2), True, True, True, True, False),
    "jax bfloat16": (jnp.ones(2, jnp.bfloat16), True, True, True, True, False),
    "jax float16": (jnp.ones(2, jnp.float16), True, True, True, True, False),
    "jax complex": (jnp.ones(2, jnp.complex64), True, True, True, True, False),
    "jax int": (jnp.arange(2), True, True, False, False, False),
    "jax bool": (jnp.ones(2, bool), True, True, False, False, False),
    "jax scalar": (jnp.float32(1), True, True, True, True, False),
    "numpy float": (np.ones(2), True, True, True, True, False),
    "numpy bfloat16": (np.ones(2, jnp.bfloat16), True, True, True, True, False),
    "numpy int": (np.arange(2), True, True, False, False, False),
    "numpy float scalar": (np.float32(1), True, True, True, True, False),
    "numpy int scalar": (np.int8(1), True, True, False, False, False),
    "numpy bool scalar": (np.bool_(True), True, True, False, False, False),
    "typed key": (KEY, True, True, False, False, True),
    "typed keys": (jax.random.split(KEY, 3), True, True, False, False, True),
    "rbg key": (jax.random.key(0, impl="rbg"), True, True, False, False, True),
    "legacy key": (LEGACY_KEY, True, True, False, False, False),
    "python bool": (True, False, True, False, False, False),
    "python int": (1, False, True, False, False, False),
    "python float": (1.0, False, True, False, True, False),
    "python complex": (1j, False, True, False, True, False),
    "string": ("1.0", False, False, False, False, False),
    "none": (None, False, False, False, False, False),
    "list": ([1.0], False, False, False, False, False),
    "shape dtype struct": (
        jax.ShapeDtypeStruct((2,), jnp.float32),
        False,
        False,
        False,
        False,
        False,
    ),
}
PREDICATES = [
    fx.is_array,
    fx.is_array_like,
    fx.is_inexact_array,
    fx.is_inexact_array_like,
    fx.is_key_array,
]


@pytest.mark.parametrize("name", CASES)
@pytest.mark.parametrize(
    "index", range(len(PREDICATES)), ids=[p.__name__ for p in PREDICATES]
)
def test_predicate(name, index):
    value, *expected = CASES[name]
    assert PREDICATES[index](value) is expected[index]


@pytest.mark.parametrize(
    "name", ["jax float", "jax int", "typed key", "legacy key", "jax bfloat16"]
)
def test_predicates_agree_on_tracers(name):
    value, *expected = CASES[name]
    seen = []

    @jax.jit
    def f(x):
        seen.append([predicate(x) for predicate in PREDICATES])
        return x

    f(value)
    assert seen == [expected]


def test_predicates_return_python_bools():
    for predicate in PREDICATES:
        assert type(predicate(jnp.ones(1))) is bool


# ------------------------------------------------------------------ filter


def test_filter_with_a_callable():
    tree = {"w": jnp.ones(2), "act": "relu", "n": 3}
    out = fx.filter(tree, fx.is_array)
    assert out["act"] is None and out["n"] is None and out["w"] is tree["w"]


def test_filter_with_a_bool():
    assert fx.filter([1, 2], True) == [1, 2]
    assert fx.filter([1, 2], False) == [None, None]


def test_filter_inverse():
    tree = [jnp.ones(1), "x"]
    assert fx.filter(tree, fx.is_array, inverse=True) == [None, "x"]


def test_filter_replace():
    assert fx.filter([1, "x"], lambda x: isinstance(x, int), replace=0) == [1, 0]


def test_filter_with_a_prefix_spec():
    tree = {"encoder": [1, 2], "head": (3, "x")}
    out = fx.filter(tree, {"encoder": False, "head": lambda x: isinstance(x, int)})
    assert out == {"encoder": [None, None], "head": (3, None)}


def test_filter_spec_leaf_may_be_a_full_spec():
    assert fx.filter([1, 2], [True, False]) == [1, None]


def test_filter_keeps_none_nodes():
    assert fx.filter([None, 1], fx.is_array_like) == [None, 1]


def test_filter_with_is_leaf_stops_at_wrappers():
    frozen = fx.NonDifferentiable(jnp.ones(2))
    out = fx.filter(
        [frozen, jnp.ones(1)], fx.is_inexact_array, is_leaf=fx.is_non_differentiable
    )
    assert out[0] is None
    out = fx.filter(
        [frozen, 1], fx.is_non_differentiable, is_leaf=fx.is_non_differentiable
    )
    assert out == [frozen, None]


def test_filter_without_is_leaf_sees_inside_wrappers():
    frozen = fx.NonDifferentiable(jnp.ones(2))
    out = fx.filter([frozen], fx.is_inexact_array)
    assert isinstance(out[0], fx.NonDifferentiable)


def test_filter_on_a_module():
    class Linear(fx.Module):
        weight: jax.Array
        size: int

    out = fx.filter(Linear(jnp.ones(2), 2), fx.is_array)
    assert type(out) is Linear and out.size is None


def test_filter_spec_not_a_prefix_names_the_key_path():
    with pytest.raises(
        ValueError, match=r"at \['a'\] filter_spec has a tuple .* tree has a list"
    ):
        fx.filter({"a": [1, 2]}, {"a": (True, False)})


def test_filter_spec_with_wrong_length_names_the_key_path():
    with pytest.raises(ValueError, match=r"at \['a'\]\[1\] filter_spec has a list"):
        fx.filter({"a": [1, [2]], "b": 3}, {"a": [True, [True, True]], "b": True})


def test_filter_spec_with_missing_keys_names_the_root():
    with pytest.raises(ValueError, match="at the root filter_spec has a dict"):
        fx.filter({"a": 1, "b": 2}, {"a": True})


def test_filter_spec_leaf_of_wrong_type_names_the_key_path():
    with pytest.raises(
        ValueError, match=r"leaf at \['a'\]\[1\] is 'x'; expected a bool"
    ):
        fx.filter({"a": [1, 2]}, {"a": [True, "x"]})
    with pytest.raises(ValueError, match=r"at \[1\] filter_spec has None"):
        fx.filter([1, 2], [True, None])


def test_filter_callable_must_return_a_bool():
    with pytest.raises(ValueError, match=r"callable at \[0\] returned 1 for a leaf"):
        fx.filter([1], [lambda x: 1])


def test_filter_callable_may_return_a_numpy_bool():
    assert fx.filter([1, 2], lambda x: np.bool_(x > 1)) == [None, 2]


# ------------------------------------------------------------------ partition, combine


def test_partition_splits_and_combine_rebuilds():
    tree = [jnp.zeros(2), "tanh", 3]
    kept, rest = fx.partition(tree, fx.is_array)
    assert kept[1:] == [None, None] and rest == [None, "tanh", 3]
    out = fx.combine(kept, rest)
    assert out[0] is tree[0] and out[1:] == ["tanh", 3]


def test_partition_replace():
    kept, rest = fx.partition([1, "x"], lambda x: isinstance(x, int), replace=0)
    assert kept == [1, 0] and rest == [0, "x"]


def test_partition_with_is_leaf():
    frozen = fx.NonDifferentiable(jnp.ones(2))
    kept, rest = fx.partition(
        [frozen, jnp.ones(1)], fx.is_inexact_array, is_leaf=fx.is_non_differentiable
    )
    assert kept[0] is None and rest[0] is frozen
    out = fx.combine(kept, rest, is_leaf=fx.is_non_differentiable)
    assert out[0] is frozen and out[1] is kept[1]


def test_combine_takes_the_first_non_none():
    assert fx.combine([1, None, None], [2, 3, None], [4, 5, 6]) == [1, 3, 6]


def test_combine_of_one_tree():
    assert fx.combine([1, None]) == [1, None]


def test_combine_needs_a_tree():
    with pytest.raises(TypeError, match="at least one pytree"):
        fx.combine()


def test_combine_requires_matching_structures():
    with pytest.raises(ValueError):
        fx.combine([1, None], [None])


def test_callable_module_in_a_filter_spec_is_descended_into():
    class Scale(fx.Module):
        weight: jax.Array
        bias: jax.Array

        def __call__(self, x):
            return self.weight * x + self.bias

    model = Scale(jnp.ones(2), jnp.zeros(2))
    spec = Scale(weight=True, bias=False)  # a Module-shaped spec, as Equinox documents
    kept = fx.filter(model, spec)
    assert kept.bias is None and kept.weight is model.weight


def test_combine_of_mismatched_trees_names_the_key_path():
    with pytest.raises(
        ValueError, match=r"pytree 1 .* at \['b'\]: a list of length 2 vs"
    ):
        fx.combine({"a": 1, "b": [1, 2]}, {"a": None, "b": [None, None, 3]})


def test_combine_with_none_for_a_subtree_of_the_first_names_the_key_path():
    arrays, _ = fx.partition(fx.nn.Linear(2, 3, key=KEY), fx.is_array)
    with pytest.raises(ValueError, match=r"pytree 1 has None at the root, where"):
        fx.combine(arrays, None)
    with pytest.raises(ValueError, match=r"pytree 2 has None at \['a'\]\['b'\]"):
        fx.combine({"a": {"b": [1]}}, {"a": {"b": [None]}}, {"a": {"b": None}})


def test_combine_takes_a_none_in_the_first_tree_for_a_whole_subtree():
    assert fx.combine({"a": None, "b": 1}, {"a": [2, 3], "b": None}) == {
        "a": [2, 3],
        "b": 1,
    }
