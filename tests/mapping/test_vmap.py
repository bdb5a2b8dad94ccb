"""Behaviour of `filterax.filter_vmap` and `filterax.if_array`."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import filterax as fx


class Linear(fx.Module):
    weight: jax.Array
    bias: jax.Array
    activation: str = "tanh"  # a non-array leaf

    def __call__(self, x):
        return self.weight @ x + self.bias


def make_linear(key, n_in=3, n_out=2):
    return Linear(jax.random.normal(key, (n_out, n_in)), jnp.zeros(n_out))


# --- if_array ------------------------------------------------------------------------


def test_if_array_gives_the_axis_for_arrays_only():
    spec = fx.if_array(1)
    assert spec(jnp.zeros((2, 3))) == 1
    assert spec(np.zeros(3)) == 1
    assert spec(jax.random.key(0)) == 1
    assert spec(3.0) is None and spec("relu") is None


def test_if_array_is_comparable_and_hashable():
    assert fx.if_array(0) == fx.if_array(0) != fx.if_array(1)
    assert hash(fx.if_array(2)) == hash(fx.if_array(2))
    assert repr(fx.if_array(0)) == "if_array(0)"


def test_if_array_rejects_a_non_int_axis():
    with pytest.raises(TypeError, match="axis must be an int"):
        fx.if_array("0")


# --- Defaults ------------------------------------------------------------------------


def test_arrays_are_mapped_over_axis_0_and_the_rest_broadcast():
    @fx.filter_vmap
    def f(x, scale, label):
        return x * scale, label

    out, label = f(jnp.arange(6.0).reshape(3, 2), 2.0, "double")
    np.testing.assert_allclose(out, 2 * np.arange(6.0).reshape(3, 2))
    assert label == "double"


def test_numpy_arrays_are_mapped():
    out = fx.filter_vmap(lambda x: x.sum())(np.ones((4, 3), np.float32))
    np.testing.assert_allclose(out, 3.0)


def test_key_arrays_are_mapped():
    keys = jax.random.split(jax.random.key(0), 5)
    samples = fx.filter_vmap(lambda k: jax.random.normal(k, (2,)))(keys)
    assert samples.shape == (5, 2)
    assert not np.allclose(samples[0], samples[1])


def test_key_arrays_can_be_outputs_at_any_axis():
    keys = jax.random.split(jax.random.key(0), 4)
    split = fx.filter_vmap(jax.random.split, out_axes=1)(keys)
    assert fx.is_key_array(split) and split.shape == (2, 4)


def test_modules_map_over_their_arrays_and_keep_the_rest():
    keys = jax.random.split(jax.random.key(0), 4)
    ensemble = fx.filter_vmap(make_linear)(keys)
    assert ensemble.weight.shape == (4, 2, 3)
    assert ensemble.activation == "tanh"
    outputs = fx.filter_vmap(lambda model, x: model(x), in_axes=(fx.if_array(0), None))(
        ensemble, jnp.ones(3)
    )
    assert outputs.shape == (4, 2)
    np.testing.assert_allclose(outputs[1], ensemble.weight[1] @ jnp.ones(3))


def test_a_module_fun_is_broadcast():
    model = make_linear(jax.random.key(0))
    out = fx.filter_vmap(model)(jnp.ones((5, 3)))
    assert out.shape == (5, 2)
    np.testing.assert_allclose(out[0], model(jnp.ones(3)), rtol=1e-6)


def test_a_bound_method_fun_is_broadcast():
    model = make_linear(jax.random.key(0))
    out = fx.filter_vmap(model.__call__)(jnp.ones((5, 3)))
    assert out.shape == (5, 2)


def test_decorated_method_maps_over_self_by_default():
    class Scale(fx.Module):
        factor: jax.Array

        @fx.filter_vmap
        def apply(self, x):
            return self.factor * x

    batched = Scale(jnp.arange(3.0))
    np.testing.assert_allclose(batched.apply(jnp.ones(3)), [0.0, 1.0, 2.0])


# --- in_axes -------------------------------------------------------------------------


def test_in_axes_prefix_selects_axes_per_argument():
    f = fx.filter_vmap(lambda x, y: x + y, in_axes=(None, 1))
    out = f(jnp.array(1.0), jnp.array([[2.0, 3.0]]))
    np.testing.assert_allclose(out, [[3.0], [4.0]])


def test_in_axes_pytree_prefix_inside_an_argument():
    f = fx.filter_vmap(lambda d: d["a"] + d["b"], in_axes=({"a": 0, "b": None},))
    out = f({"a": jnp.arange(3.0), "b": jnp.ones(2)[:1]})
    np.testing.assert_allclose(out, [[1.0], [2.0], [3.0]])


def test_in_axes_callables_see_each_leaf():
    def spec(leaf):
        return 0 if getattr(leaf, "ndim", 0) == 2 else None

    f = fx.filter_vmap(lambda x, y: x.sum() + y.sum(), in_axes=spec)
    out = f(jnp.ones((4, 2)), jnp.ones(3))
    np.testing.assert_allclose(out, 5.0)


def test_negative_in_axes():
    out = fx.filter_vmap(lambda x: x.sum(), in_axes=-1)(jnp.ones((2, 5)))
    assert out.shape == (5,)


def test_int_in_axes_on_a_non_array_is_an_error_naming_its_path():
    with pytest.raises(ValueError, match=r"args\[1\] the axis 0, but it is a str"):
        fx.filter_vmap(lambda x, s: (x, s), in_axes=0)(jnp.ones(3), "s")
    with pytest.raises(TypeError, match=r"args\[1\] the axis 0"):  # as Equinox
        fx.filter_vmap(lambda x, f: x, in_axes=0)(jnp.ones(3), print)
    with pytest.raises(
        ValueError, match=r"args\[0\]\['n'\] the axis 0, but it is a int"
    ):
        fx.filter_vmap(lambda p: p, in_axes=0)({"w": jnp.ones(3), "n": 2})


def test_a_numpy_array_returned_untouched_comes_back_as_a_jax_array():
    # `jax.vmap` would hand back the argument itself, aliasing the caller's.
    x = np.arange(6.0).reshape(2, 3)
    out = fx.filter_vmap(lambda a: a)(x)
    assert isinstance(out, jax.Array)
    np.testing.assert_array_equal(out, x)
    both = fx.filter_vmap(lambda a, b: (a, b))(x, jnp.ones(2))
    assert all(isinstance(o, jax.Array) for o in both)


def test_int_out_axes_on_a_python_number_broadcasts_it_as_equinox():
    out = fx.filter_vmap(lambda x: (x, 1), out_axes=0)(jnp.ones(3))
    np.testing.assert_array_equal(out[1], [1, 1, 1])


def test_int_out_axes_on_another_non_array_is_an_error_naming_its_path():
    with pytest.raises(ValueError, match=r"out\[1\] the axis 0, but it is a str"):
        fx.filter_vmap(lambda x: (x, "s"), out_axes=0)(jnp.ones(3))
    with pytest.raises(TypeError, match=r"out\[1\] the axis 0"):  # as Equinox
        fx.filter_vmap(lambda x: (x, print), out_axes=0)(jnp.ones(3))


def test_in_axes_dict_names_parameters():
    f = fx.filter_vmap(lambda x, y: x + y, in_axes={"y": None})
    out = f(jnp.arange(3.0), jnp.ones(2)[:1])
    np.testing.assert_allclose(out, [[1.0], [2.0], [3.0]])


def test_in_axes_dict_with_an_unknown_name_is_an_error():
    f = fx.filter_vmap(lambda x: x, in_axes={"z": None})
    with pytest.raises(ValueError, match=r"\['z'\]"):
        f(jnp.ones(3))


def test_keyword_arguments_are_mapped_like_arrays():
    f = fx.filter_vmap(lambda x, *, y, mode: x + y if mode == "add" else x)
    out = f(jnp.ones(3), y=jnp.arange(3.0), mode="add")
    np.testing.assert_allclose(out, [1.0, 2.0, 3.0])


def test_axis_size_without_mapped_inputs():
    out = fx.filter_vmap(lambda: jnp.zeros(2), axis_size=4)()
    assert out.shape == (4, 2)


def test_axis_name_enables_collectives():
    f = fx.filter_vmap(lambda x: x / jax.lax.psum(x, "batch"), axis_name="batch")
    np.testing.assert_allclose(f(jnp.ones(4)), 0.25)


# --- out_axes ------------------------------------------------------------------------


def test_out_axes_moves_the_mapped_axis():
    out = fx.filter_vmap(lambda x: x * 2, out_axes=1)(jnp.ones((3, 2)))
    assert out.shape == (2, 3)
    out = fx.filter_vmap(lambda x: x * 2, out_axes=-1)(jnp.ones((3, 2, 4)))
    assert out.shape == (2, 4, 3)


def test_out_axes_none_returns_unmapped_outputs():
    f = fx.filter_vmap(
        lambda x, table: (x + 1, table * 2), in_axes=(0, None), out_axes=(0, None)
    )
    mapped, unmapped = f(jnp.ones(5), jnp.ones(2))
    assert mapped.shape == (5,) and unmapped.shape == (2,)


def test_unmapped_outputs_broadcast_under_integer_out_axes():
    out = fx.filter_vmap(lambda x, c: c, in_axes=(0, None))(jnp.ones(4), jnp.ones(2))
    assert out.shape == (4, 2)


def test_non_array_outputs_come_back_as_python_objects():
    out = fx.filter_vmap(lambda x: {"y": x, "name": "y", "n": 2})(jnp.ones(3))
    assert out["name"] == "y" and out["n"] == 2 and out["y"].shape == (3,)


# --- Errors --------------------------------------------------------------------------


def test_disagreeing_batch_sizes_name_both_paths_and_sizes():
    f = fx.filter_vmap(lambda a, b: a)
    with pytest.raises(ValueError) as info:
        f(jnp.ones(3), {"b": jnp.ones((4, 2))})
    message = str(info.value)
    assert "size 3: args[0] (axis 0)" in message
    assert "size 4: args[1]['b'] (axis 0)" in message


def test_axis_size_disagreeing_with_the_inputs_is_an_error():
    f = fx.filter_vmap(lambda a: a, axis_size=5)
    with pytest.raises(ValueError, match=r"axis_size.*size 3: args\[0\]"):
        f(jnp.ones(3))


def test_nothing_mapped_without_axis_size_is_an_error():
    f = fx.filter_vmap(lambda label: label)
    with pytest.raises(ValueError, match="nothing to map over.*axis_size"):
        f("no arrays here")


def test_in_axes_not_a_prefix_names_where():
    f = fx.filter_vmap(lambda a, b: a, in_axes=(0, {"x": 0}))
    with pytest.raises(ValueError, match=r"in_axes.*prefix.*args\[1\]"):
        f(jnp.ones(3), [jnp.ones(3)])


def test_in_axes_out_of_range_names_the_path():
    f = fx.filter_vmap(lambda a: a, in_axes=({"w": 2},))
    with pytest.raises(ValueError, match=r"args\[0\]\['w'\].*out of range.*\(3,\)"):
        f({"w": jnp.ones(3)})


def test_invalid_axis_spec_names_the_path():
    f = fx.filter_vmap(lambda a: a, in_axes=lambda leaf: "zero")
    with pytest.raises(ValueError, match=r"args\[0\].*'zero'"):
        f(jnp.ones(3))


def test_out_axes_none_on_a_mapped_output_names_it():
    f = fx.filter_vmap(lambda x: {"loss": x * 2}, out_axes={"loss": None})
    with pytest.raises(ValueError, match=r"out\['loss'\]"):
        f(jnp.ones(3))


def test_not_callable_is_an_error():
    with pytest.raises(TypeError, match="expected a callable"):
        fx.filter_vmap(3)


# --- Composition ---------------------------------------------------------------------


def test_inside_filter_jit_and_grad():
    @fx.filter_jit
    def loss(model, xs):
        return fx.filter_vmap(lambda x: model(x), in_axes=0)(xs).sum()

    model = make_linear(jax.random.key(0))
    grads = jax.grad(lambda w: loss(Linear(w, model.bias), jnp.ones((4, 3))))(
        model.weight
    )
    np.testing.assert_allclose(grads, 4 * np.ones((2, 3)))


def test_nested_filter_vmap():
    f = fx.filter_vmap(fx.filter_vmap(lambda x: x * 2))
    assert f(jnp.ones((2, 3, 4))).shape == (2, 3, 4)


# --- Refs and wrappers ------------------------------------------------------------------


def test_a_ref_with_an_integer_axis_is_per_example_state():
    state = jax.new_ref(jnp.zeros((3, 2)))

    def accumulate(ref, x):
        ref[...] = ref[...] + x
        return x.sum()

    out = fx.filter_vmap(accumulate)(state, jnp.arange(6.0).reshape(3, 2))
    np.testing.assert_allclose(out, [1.0, 5.0, 9.0])
    np.testing.assert_allclose(state[...], np.arange(6.0).reshape(3, 2))


def test_a_shared_ref_may_be_read_and_a_batched_write_is_a_clear_error():
    shared = jax.new_ref(jnp.full((2,), 10.0))
    out = fx.filter_vmap(lambda ref, x: ref[...] + x, in_axes=(None, 0))(
        shared, jnp.ones((3, 2))
    )
    np.testing.assert_allclose(out, 11.0)

    def write(ref, x):
        ref[...] = x
        return x

    with pytest.raises(
        ValueError,
        match="shared across the batch.*read inside filter_vmap, but not written",
    ):
        fx.filter_vmap(write, in_axes=(None, 0))(shared, jnp.ones((3, 2)))


def test_rng_streams_split_for_vmap_give_each_example_its_own_keys():
    streams = fx.RngStream(jax.random.key(0)).split(4)
    draws = fx.filter_vmap(lambda s: jax.random.normal(s(), ()))(streams)
    assert draws.shape == (4,) and len(set(np.asarray(draws).tolist())) == 4
    np.testing.assert_array_equal(streams.count[...], [1, 1, 1, 1])


def test_returned_refs_come_back_as_the_same_objects():
    state = jax.new_ref(jnp.zeros((3,)))
    out_ref, values = fx.filter_vmap(lambda r, x: (r, x * 2), out_axes=(None, 0))(
        state, jnp.ones(3)
    )
    assert out_ref is state
    np.testing.assert_allclose(values, 2.0)


def test_wrappers_are_pytrees_with_equal_static_parts():
    model = make_linear(jax.random.key(0))
    a, b = fx.filter_vmap(model), fx.filter_vmap(model)
    assert jax.tree_util.tree_structure(a) == jax.tree_util.tree_structure(b)
    a_arrays, b_arrays = fx.filter((a, b), fx.is_array)
    summed = jax.tree.map(lambda x, y: x + y, a_arrays, b_arrays)
    np.testing.assert_allclose(jax.tree.leaves(summed)[0], 2 * model.weight)


def test_an_unsplit_rng_stream_gets_a_hint_to_split_it():
    with pytest.raises(ValueError, match=r"stream\.split\(batch_size\)"):
        fx.filter_vmap(lambda s, x: x)(fx.RngStream(0), jnp.ones(3))
