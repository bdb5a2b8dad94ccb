"""`assert_max_traces` and `get_num_traces`: counting traces of functions and
callable Modules, shared by the copies JAX makes."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import pytest

import filterax as fx
from filterax.debug import assert_max_traces, get_num_traces


class Scale(fx.Module):
    weight: jax.Array

    def __call__(self, x):
        return self.weight * x


def test_calls_within_the_limit_run_the_function():
    double = jax.jit(assert_max_traces(lambda x: 2 * x, max_traces=1))
    assert float(double(jnp.array(1.0))) == 2.0
    assert float(double(jnp.array(3.0))) == 6.0
    assert get_num_traces(double) == 1


def test_one_trace_too_many_raises_and_names_the_argument():
    @fx.filter_jit
    @assert_max_traces(max_traces=1)
    def add(x, y):
        return x + y

    add(jnp.ones(2), jnp.ones(2))
    with pytest.raises(RuntimeError, match="can only be traced 1 times") as info:
        add(jnp.ones(2), jnp.ones(3))
    message = str(info.value)
    assert "'y' looks responsible" in message
    assert "f32[3]" in message and "f32[2]" in message


def test_a_new_static_value_is_named_too():
    @fx.filter_jit
    @assert_max_traces(max_traces=1)
    def power(x, n):
        return x**n

    power(jnp.ones(2), 2)
    with pytest.raises(RuntimeError, match="'n' looks responsible"):
        power(jnp.ones(2), 3)


def test_a_retrace_with_arguments_seen_before_says_so():
    counted = assert_max_traces(lambda x: x, max_traces=1)
    counted(1)
    with pytest.raises(RuntimeError, match="Every argument has been seen before"):
        counted(1)


def test_no_limit_still_counts():
    square = fx.filter_jit(assert_max_traces(lambda x: x**2, max_traces=None))
    for n in (1, 2, 3, 3, 2):
        square(jnp.ones(n))
    assert get_num_traces(square) == 3


def test_a_callable_module_keeps_its_arrays_traced():
    counted = assert_max_traces(Scale(jnp.array(2.0)), max_traces=1)
    # The Module's array is a leaf of the wrapper, not a static value.
    assert len(jax.tree.leaves(counted)) == 1
    model = fx.filter_jit(counted)
    assert float(model(jnp.array(3.0))) == 6.0
    assert float(model(jnp.array(4.0))) == 8.0
    assert get_num_traces(model) == 1


def test_copies_made_by_flattening_share_the_count():
    counted = assert_max_traces(Scale(jnp.array(2.0)), max_traces=2)
    leaves, treedef = jax.tree.flatten(counted)
    copy = jax.tree.unflatten(treedef, leaves)
    fx.filter_jit(counted)(jnp.array(1.0))
    assert get_num_traces(copy) == 1
    fx.filter_jit(copy)(jnp.array([1.0, 2.0]))
    assert get_num_traces(counted) == 2
    with pytest.raises(RuntimeError, match="can only be traced 2 times"):
        fx.filter_jit(counted)(jnp.ones(3))


def test_a_copy_with_new_weights_reuses_the_compilation():
    counted = assert_max_traces(Scale(jnp.array(2.0)), max_traces=1)
    call = fx.filter_jit(lambda model, x: model(x))
    call(counted, jnp.array(1.0))
    updated = fx.tree_at(lambda m: m.fn.weight, counted, jnp.array(5.0))
    assert float(call(updated, jnp.array(1.0))) == 5.0
    assert get_num_traces(updated) == 1


def test_separate_wrappers_count_separately():
    f = jax.jit(assert_max_traces(lambda x: x + 1, max_traces=1))
    g = jax.jit(assert_max_traces(lambda x: x + 1, max_traces=1))
    f(1.0)
    g(1.0)
    assert get_num_traces(f) == get_num_traces(g) == 1


def test_the_wrapper_keeps_the_functions_name_and_doc():
    def documented(x):
        """Adds one."""
        return x + 1

    wrapped = assert_max_traces(documented, max_traces=1)
    assert wrapped.__name__ == "documented"
    assert wrapped.__doc__ == "Adds one."


def test_get_num_traces_looks_through_functools_wraps():
    counted = assert_max_traces(lambda x: x, max_traces=None)

    @functools.wraps(counted)
    def outer(x):
        return counted(x)

    outer(1)
    assert get_num_traces(outer) == 1


def test_get_num_traces_of_an_unwrapped_function_is_an_error():
    with pytest.raises(ValueError, match="not wrapped by"):
        get_num_traces(jax.jit(lambda x: x))


@pytest.mark.parametrize("bad", [1.5, True, -1, "2"])
def test_an_invalid_max_traces_is_rejected(bad):
    with pytest.raises(TypeError, match="max_traces"):
        assert_max_traces(lambda x: x, max_traces=bad)


def test_max_traces_is_keyword_only_and_required():
    with pytest.raises(TypeError):
        assert_max_traces(lambda x: x, 1)  # type: ignore[misc]
    with pytest.raises(TypeError):
        assert_max_traces(lambda x: x)  # type: ignore[call-arg]
