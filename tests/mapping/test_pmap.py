"""Behaviour of `filterax.filter_pmap`, on the 8 simulated CPU devices."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import filterax as fx

N_DEVICES = 8


@pytest.fixture(autouse=True)
def _eight_devices():
    assert jax.local_device_count() == N_DEVICES, "the root conftest sets 8 devices"


class Counter:
    def __init__(self) -> None:
        self.count = 0

    def tick(self) -> None:
        self.count += 1


def test_maps_arrays_over_devices_and_broadcasts_the_rest():
    @fx.filter_pmap
    def f(x, scale, label):
        return x * scale, label

    out, label = f(jnp.arange(8.0), 2.0, "double")
    np.testing.assert_allclose(out, 2 * np.arange(8.0))
    assert label == "double"
    assert len(out.sharding.device_set) == N_DEVICES


def test_collectives_over_the_axis_name():
    f = fx.filter_pmap(lambda x: jax.lax.psum(x, "devices"), axis_name="devices")
    np.testing.assert_allclose(f(jnp.ones(N_DEVICES)), float(N_DEVICES))


def test_modules_and_key_arrays():
    class Noise(fx.Module):
        scale: jax.Array

        def __call__(self, key):
            return self.scale * jax.random.normal(key, (3,))

    keys = jax.random.split(jax.random.key(0), N_DEVICES)
    out = fx.filter_pmap(Noise(jnp.array(2.0)))(keys)
    assert out.shape == (N_DEVICES, 3)
    assert not np.allclose(out[0], out[1])


def test_in_axes_and_out_axes():
    f = fx.filter_pmap(lambda x, y: x + y, in_axes=(1, None), out_axes=1)
    out = f(jnp.ones((3, N_DEVICES)), jnp.arange(3.0))
    assert out.shape == (3, N_DEVICES)
    np.testing.assert_allclose(out[:, 0], [1.0, 2.0, 3.0])


def test_an_int_axis_on_non_arrays_passes_them_to_every_device():
    # As Equinox: an ensemble of MLPs (activation functions inside) with
    # `in_axes=(0, None)`. (`filter_vmap` refuses this: see its tests.)
    keys = jax.random.split(jax.random.key(0), N_DEVICES)
    ensemble = fx.filter_vmap(lambda k: fx.nn.MLP(2, 1, 4, 1, key=k))(keys)
    x = jnp.ones(2)
    out = fx.filter_pmap(lambda model, x: model(x), in_axes=(0, None))(ensemble, x)
    expected = fx.filter_vmap(
        lambda model, x: model(x), in_axes=(fx.if_array(0), None)
    )(ensemble, x)
    np.testing.assert_allclose(out, expected, rtol=1e-6)
    labelled = fx.filter_pmap(lambda x, label: (x * 2, label), in_axes=0)
    doubled, label = labelled(jnp.arange(8.0), "tag")
    assert label == "tag"
    np.testing.assert_allclose(doubled, 2 * np.arange(8.0))


def test_out_axes_none_for_replicated_outputs():
    f = fx.filter_pmap(
        lambda x: (x, jax.lax.psum(x, "d")), axis_name="d", out_axes=(0, None)
    )
    mapped, total = f(jnp.ones(N_DEVICES))
    assert mapped.shape == (N_DEVICES,) and total.shape == ()
    np.testing.assert_allclose(total, float(N_DEVICES))


def test_traced_values_do_not_recompile_and_static_ones_do():
    counter = Counter()

    @fx.filter_pmap
    def f(x, power):
        counter.tick()
        return x**power

    f(jnp.ones(N_DEVICES), 2)
    f(3 * jnp.ones(N_DEVICES), 2)
    assert counter.count == 1
    np.testing.assert_allclose(f(2 * jnp.ones(N_DEVICES), 3), 8.0)
    assert counter.count == 2


def test_axis_size_with_nothing_mapped():
    out = fx.filter_pmap(lambda: jnp.zeros(2), axis_size=N_DEVICES)()
    assert out.shape == (N_DEVICES, 2)


def test_donate_all_deletes_device_resident_inputs():
    x = fx.filter_pmap(lambda a: a + 1)(jnp.ones(N_DEVICES))
    fx.filter_pmap(lambda a: a * 2, donate="all")(x)
    assert x.is_deleted()


def test_unknown_donate_is_an_error():
    with pytest.raises(ValueError, match="donate='some'"):
        fx.filter_pmap(lambda x: x, donate="some")


def test_lower():
    lowered = fx.filter_pmap(lambda x: x + 1).lower(jnp.ones(N_DEVICES))
    assert "stablehlo" in lowered.as_text()


@pytest.mark.parametrize("donate", ["none", "all"])
def test_compiled_ahead_of_time_takes_the_original_arguments(donate):
    scale = fx.filter_pmap(lambda x, factor, name: (x * factor, name), donate=donate)
    compiled = scale.lower(jnp.ones(N_DEVICES), 3, "tag").compile()
    out, name = compiled(jnp.arange(N_DEVICES, dtype=jnp.float32), 3, "tag")
    np.testing.assert_array_equal(out, 3 * np.arange(N_DEVICES))
    assert name == "tag"


def test_compiler_options_are_passed_to_xla():
    lowered = fx.filter_pmap(lambda x: x + 1).lower(jnp.ones(N_DEVICES))
    compiled = lowered.compile(compiler_options={"xla_embed_ir_in_executable": True})
    np.testing.assert_array_equal(compiled(jnp.ones(N_DEVICES)), 2 * np.ones(8))


def test_compiled_call_with_other_statics_or_shapes_names_the_difference():
    compiled = (
        fx.filter_pmap(lambda x, n: x * n).lower(jnp.ones(N_DEVICES), 2).compile()
    )
    with pytest.raises(ValueError, match=r"\(args, kwargs\)\[0\]\[1\]: 2 vs 5"):
        compiled(jnp.ones(N_DEVICES), 5)
    with pytest.raises(ValueError, match=r"\[0\]\[0\]: f32\[8\] vs i32\[8\]"):
        compiled(jnp.ones(N_DEVICES, jnp.int32), 2)


def test_disagreeing_batch_sizes_name_the_paths():
    f = fx.filter_pmap(lambda a, b: a)
    with pytest.raises(ValueError, match=r"size 8: args\[0\].*size 4: args\[1\]"):
        f(jnp.ones(N_DEVICES), jnp.ones(4))


def test_unhashable_static_leaf_names_its_path():
    f = fx.filter_pmap(lambda x, config: x)
    with pytest.raises(TypeError, match=r"args\[1\]\['opts'\].*unhashable set"):
        f(jnp.ones(N_DEVICES), {"opts": {1}})


def test_decorated_method():
    class Shift(fx.Module):
        amount: jax.Array

        @fx.filter_pmap(in_axes=(None, 0))
        def apply(self, x):
            return x + self.amount

    out = Shift(jnp.array(1.0)).apply(jnp.zeros(N_DEVICES))
    np.testing.assert_allclose(out, 1.0)
