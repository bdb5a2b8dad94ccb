"""`filter_eval_shape`, `filter_make_jaxpr`, `filter_closure_convert`,
`filter_pure_callback` and `clear_caches`."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import filterax as fx


class Linear(fx.Module):
    weight: jax.Array
    bias: jax.Array
    name: str = "linear"

    def __call__(self, x):
        return self.weight @ x + self.bias


def make_linear() -> Linear:
    return Linear(jnp.ones((2, 3)), jnp.zeros(2))


# --- filter_eval_shape ---------------------------------------------------------------


def test_eval_shape_gives_structs_for_arrays_and_objects_for_the_rest():
    def f(x, n, label):
        return {"y": jnp.tile(x, n), "label": label + "!", "n": n}

    out = fx.filter_eval_shape(f, jnp.ones(3), 2, "tiled")
    assert out["y"] == jax.ShapeDtypeStruct((6,), jnp.float32)
    assert out["label"] == "tiled!" and out["n"] == 2


def test_eval_shape_accepts_shape_dtype_structs_and_keywords():
    out = fx.filter_eval_shape(
        lambda x, *, w: w @ x,
        jax.ShapeDtypeStruct((3,), jnp.float32),
        w=jax.ShapeDtypeStruct((5, 3), jnp.float32),
    )
    assert out == jax.ShapeDtypeStruct((5,), jnp.float32)


def test_eval_shape_of_a_module_and_of_a_module_output():
    out = fx.filter_eval_shape(make_linear(), jnp.ones(3))
    assert out.shape == (2,)
    abstract_model = fx.filter_eval_shape(make_linear)
    assert isinstance(abstract_model, Linear)
    assert abstract_model.weight == jax.ShapeDtypeStruct((2, 3), jnp.float32)
    assert abstract_model.name == "linear"


def test_eval_shape_calls_an_abstract_model():
    # The model itself made by `filter_eval_shape`: its leaves are structs.
    abstract = fx.filter_eval_shape(fx.nn.MLP, 2, 3, 8, 2, key=jax.random.key(0))
    assert isinstance(abstract.layers[0].weight, jax.ShapeDtypeStruct)
    x = jax.ShapeDtypeStruct((2,), jnp.float32)
    assert fx.filter_eval_shape(abstract, x) == jax.ShapeDtypeStruct((3,), jnp.float32)
    applied = fx.filter_eval_shape(fx.Partial(lambda m, x: m(x), abstract), x)
    assert applied.shape == (3,)


def test_eval_shape_does_not_run_the_computation():
    calls = []

    def f(x):
        calls.append(type(x))
        return x * 2

    fx.filter_eval_shape(f, jnp.ones(3))
    assert calls and all(issubclass(c, jax.core.Tracer) for c in calls)


# --- filter_make_jaxpr ---------------------------------------------------------------


def test_make_jaxpr_inputs_are_the_array_leaves():
    def f(model, x, scale):
        return model(x) * scale, model.name

    jaxpr, out_struct, out_static = fx.filter_make_jaxpr(f)(
        make_linear(), jnp.ones(3), 2.0
    )
    assert len(jaxpr.jaxpr.invars) == 3  # weight, bias, x
    assert out_struct == (jax.ShapeDtypeStruct((2,), jnp.float32), None)
    assert out_static == (None, "linear")


def test_make_jaxpr_static_values_are_baked_in():
    jaxpr, _, _ = fx.filter_make_jaxpr(lambda x, n: x**n)(jnp.ones(2), 3)
    assert [eqn.params.get("y") for eqn in jaxpr.jaxpr.eqns] == [3]


def test_make_jaxpr_evaluates_like_the_function():
    def f(model, x):
        return model(x)

    model, x = make_linear(), jnp.arange(3.0)
    jaxpr, _, _ = fx.filter_make_jaxpr(f)(model, x)
    arrays = [leaf for leaf in jax.tree.leaves((model, x)) if fx.is_array(leaf)]
    (out,) = jax.core.eval_jaxpr(jaxpr.jaxpr, jaxpr.consts, *arrays)
    np.testing.assert_allclose(out, model(x))


# --- filter_closure_convert ----------------------------------------------------------


def test_closure_convert_hoists_closed_over_tracers():
    def outer(scale):
        converted = fx.filter_closure_convert(lambda x: scale * x, jnp.ones(2))
        (const,) = jax.tree.leaves(converted)
        assert isinstance(const, jax.core.Tracer)
        return converted(jnp.arange(2.0)).sum()

    np.testing.assert_allclose(jax.grad(outer)(3.0), 1.0)


def test_closure_convert_hoists_integer_arrays_too():
    offset = jnp.array([1, 2], dtype=jnp.int32)

    def fun(x):
        return x + offset

    converted = fx.filter_closure_convert(fun, jnp.zeros(2, jnp.int32))
    assert any(np.array_equal(c, offset) for c in jax.tree.leaves(converted))
    np.testing.assert_array_equal(converted(jnp.ones(2, jnp.int32)), [2, 3])


def test_closure_convert_keeps_non_array_outputs_and_arguments():
    table = jnp.arange(4.0)

    def lookup(i, mode):
        return table[i] if mode == "get" else -table[i], mode

    converted = fx.filter_closure_convert(lookup, jnp.array(0), "get")
    value, mode = converted(jnp.array(2), "get")
    assert float(value) == 2.0 and mode == "get"


def test_closure_converted_function_checks_its_arguments():
    scale = jnp.array(2.0)
    converted = fx.filter_closure_convert(lambda x, mode: scale * x, jnp.ones(2), "a")
    with pytest.raises(ValueError, match=r"at \(args, kwargs\)\[0\]\[1\]: 'a' vs 'b'"):
        converted(jnp.ones(2), "b")
    with pytest.raises(ValueError, match=r"\[0\]\[0\]: f32\[2\] vs f32\[3\]"):
        converted(jnp.ones(3), "a")
    with pytest.raises(ValueError, match=r"tuple of length 2 vs a tuple of length 3"):
        converted(jnp.ones(2), "a", "extra")


def test_closure_convert_wraps_functions_without_closures_as_they_are():
    def plain(x):
        return {"y": x + 1, "tag": "plain"}

    converted = fx.filter_closure_convert(plain, jnp.ones(2))
    assert jax.tree.leaves(converted) == [plain]
    assert converted(jnp.ones(2))["tag"] == "plain"
    assert converted.out_struct == {
        "y": jax.ShapeDtypeStruct((2,), jnp.float32),
        "tag": "plain",
    }


def test_closure_converted_function_exposes_its_in_and_out_structs():
    scale = jnp.array(2.0)
    converted = fx.filter_closure_convert(lambda x: (scale * x, 3), jnp.ones(2))
    assert converted.out_struct == (jax.ShapeDtypeStruct((2,), jnp.float32), 3)
    assert converted.in_struct == ((jax.ShapeDtypeStruct((2,), jnp.float32),), {})


def test_closure_converted_function_is_a_pytree_for_filter_jit():
    scale = jnp.array(3.0)
    converted = fx.filter_closure_convert(lambda x: scale * x, jnp.ones(2))
    out = fx.filter_jit(lambda f, x: f(x))(converted, jnp.ones(2))
    np.testing.assert_allclose(out, 3.0)


# --- filter_pure_callback ------------------------------------------------------------


def test_pure_callback_passes_arrays_and_python_objects():
    seen = []

    def host(values, config):
        seen.append((type(values), config))
        return {"out": np.asarray(values) * config["scale"], "tag": config["tag"]}

    @fx.filter_jit
    def f(x):
        spec = {"out": jax.ShapeDtypeStruct(x.shape, x.dtype), "tag": "t"}
        config = {"scale": 2.0, "tag": "t"}
        return fx.filter_pure_callback(host, x, config, result_shape_dtypes=spec)

    out = f(jnp.arange(3.0))
    np.testing.assert_allclose(out["out"], [0.0, 2.0, 4.0])
    assert out["tag"] == "t"
    # Concrete host arrays (NumPy or CPU JAX arrays, as JAX passes them).
    assert issubclass(seen[0][0], (np.ndarray, jax.Array))
    assert not issubclass(seen[0][0], jax.core.Tracer)
    assert seen[0][1] == {"scale": 2.0, "tag": "t"}


def test_pure_callback_keywords_and_vmap_method():
    def host(x, *, power):
        return np.asarray(x) ** power

    @jax.vmap
    def f(x):
        return fx.filter_pure_callback(
            host,
            x,
            power=2,
            result_shape_dtypes=jax.ShapeDtypeStruct(x.shape, x.dtype),
            vmap_method="sequential",
        )

    np.testing.assert_allclose(f(jnp.arange(3.0)), [0.0, 1.0, 4.0])


def test_pure_callback_sharding_goes_to_jax_not_to_the_callback():
    def host(x, *, power):
        return np.asarray(x) ** power

    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    out = jax.jit(
        lambda x: fx.filter_pure_callback(
            host,
            x,
            power=2,
            result_shape_dtypes=jax.ShapeDtypeStruct(x.shape, x.dtype),
            sharding=device,
        )
    )(jnp.arange(3.0))
    np.testing.assert_allclose(out, [0.0, 1.0, 4.0])


@pytest.mark.parametrize(
    "vmap_method", ["sequential", "expand_dims", "broadcast_all", "legacy_vectorized"]
)
def test_pure_callback_vectorised_vmap_methods_return_batched_outputs(vmap_method):
    # Vectorised methods hand the callback the whole batch: its output has the
    # batch axes in front of the declared shape.
    calls = []

    def host(x, scale):
        calls.append(np.shape(x))
        return {"y": np.asarray(x) * 2, "scale": scale}

    def f(x):
        spec = {"y": jax.ShapeDtypeStruct(x.shape, x.dtype), "scale": "s"}
        return fx.filter_pure_callback(
            host, x, "s", result_shape_dtypes=spec, vmap_method=vmap_method
        )["y"]

    x = jnp.arange(6.0).reshape(2, 3)
    np.testing.assert_allclose(jax.vmap(f)(x), 2 * x)
    assert calls == ([(3,), (3,)] if vmap_method == "sequential" else [(2, 3)])


def test_pure_callback_mismatched_static_output_is_an_error():
    def host(x):
        return x, "other"

    spec = (jax.ShapeDtypeStruct((2,), jnp.float32), "expected")
    with pytest.raises(
        Exception, match=r"at out\[1\]: expected 'expected', got 'other'"
    ):
        jax.block_until_ready(
            fx.filter_pure_callback(host, jnp.ones(2), result_shape_dtypes=spec)
        )


def test_pure_callback_wrong_output_shape_names_the_output_path():
    def host(x):
        return {"y": np.zeros(3, np.float32)}

    spec = {"y": jax.ShapeDtypeStruct((2,), jnp.float32)}
    with pytest.raises(
        Exception, match=r"at out\['y'\]: expected f32\[2\], got f32\[3\]"
    ):
        jax.block_until_ready(
            fx.filter_pure_callback(host, jnp.ones(2), result_shape_dtypes=spec)
        )


def test_pure_callback_takes_numpy_64_bit_results_for_32_bit_declarations():
    # As `jax.pure_callback` does with 64-bit types disabled.
    def host(x):
        return np.asarray(x, np.float64) * 2, np.arange(2)  # float64, int64

    spec = (
        jax.ShapeDtypeStruct((2,), jnp.float32),
        jax.ShapeDtypeStruct((2,), jnp.int32),
    )
    doubled, counts = fx.filter_pure_callback(
        host, jnp.ones(2), result_shape_dtypes=spec
    )
    assert doubled.dtype == jnp.float32 and counts.dtype == jnp.int32
    np.testing.assert_allclose(doubled, [2.0, 2.0])
    np.testing.assert_array_equal(counts, [0, 1])


def test_pure_callback_wrong_output_dtype_is_an_error():
    def host(x):
        return np.zeros(2, np.int32)

    spec = jax.ShapeDtypeStruct((2,), jnp.float32)
    with pytest.raises(Exception, match=r"expected f32\[2\], got i32\[2\]"):
        jax.block_until_ready(
            fx.filter_pure_callback(host, jnp.ones(2), result_shape_dtypes=spec)
        )


# --- clear_caches --------------------------------------------------------------------


def test_clear_caches_retraces_every_filter_jit_function():
    traces = []

    @fx.filter_jit
    def a(x):
        traces.append("a")
        return x

    @fx.filter_jit
    def b(x, label):
        traces.append("b")
        return x

    a(jnp.ones(1))
    b(jnp.ones(1), "l")
    fx.clear_caches()
    a(jnp.ones(1))
    b(jnp.ones(1), "l")
    assert traces == ["a", "b", "a", "b"]
