"""Loss scales, `all_finite` and `select_tree`."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import filterax as fx

TRUE, FALSE = jnp.array(True), jnp.array(False)


def test_static_scale_multiplies_and_unscale_divides_floating_leaves():
    scale = fx.StaticLossScale(8.0)
    tree = {"x": jnp.array(2.0), "n": jnp.array(3), "none": None}
    scaled = scale.scale(tree)
    assert float(scaled["x"]) == 16.0 and scaled["n"] is tree["n"]
    unscaled = scale.unscale(scaled)
    assert float(unscaled["x"]) == 2.0 and unscaled["none"] is None
    assert scale.adjust(FALSE) is scale


def test_unscale_casts_narrower_than_float32_to_float32():
    scale = fx.StaticLossScale(2.0**10)
    grads = {"h": jnp.array(2.0**10, jnp.float16), "b": jnp.array(4.0, jnp.bfloat16)}
    out = scale.unscale(grads)
    assert out["h"].dtype == out["b"].dtype == jnp.float32
    assert float(out["h"]) == 1.0 and float(out["b"]) == 4.0 / 2**10
    # The scale is applied in the leaf's own dtype.
    assert scale.scale(jnp.array(1.0, jnp.float16)).dtype == jnp.float16


def test_no_op_scale_changes_no_value():
    scale = fx.NoOpLossScale()
    assert float(scale.scale(jnp.array(3.0))) == 3.0
    assert scale.unscale(jnp.array(3.0, jnp.float16)).dtype == jnp.float32
    assert scale.adjust(FALSE) is scale


def test_dynamic_scale_shrinks_on_overflow_and_never_below_the_minimum():
    scale = fx.DynamicLossScale(8.0, period=3, factor=2, min_scale=2.0)
    values = []
    for _ in range(4):
        scale = scale.adjust(FALSE)
        values.append(float(scale.loss_scale))
    assert values == [4.0, 2.0, 2.0, 2.0]


def test_dynamic_scale_grows_after_a_period_of_finite_steps_and_restarts():
    scale = fx.DynamicLossScale(4.0, period=3, factor=2)
    history = []
    for finite in [True, True, False, True, True, True, True]:
        scale = scale.adjust(jnp.array(finite))
        history.append((float(scale.loss_scale), int(scale.counter)))
    assert history == [
        (4.0, 1),
        (4.0, 2),
        (2.0, 0),  # an overflow restarts the count
        (2.0, 1),
        (2.0, 2),
        (4.0, 0),  # the third finite step in a row: grows
        (4.0, 1),
    ]


def test_dynamic_scale_does_not_grow_to_infinity():
    scale = fx.DynamicLossScale(3e38, period=1).adjust(TRUE)
    assert float(scale.loss_scale) == pytest.approx(3e38)


def test_a_changing_scale_never_recompiles():
    @fx.filter_jit
    @fx.debug.assert_max_traces(max_traces=1)
    def step(scale, finite):
        return scale.adjust(finite)

    scale = fx.DynamicLossScale(2.0**15, period=2)
    for finite in [False, True, True, True, False]:
        scale = step(scale, jnp.array(finite))
    assert fx.debug.get_num_traces(step) == 1
    assert float(scale.loss_scale) == 2.0**14  # down, up after 2, down again


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: fx.StaticLossScale(0.0), "must be positive"),
        (lambda: fx.DynamicLossScale(-1.0), "must be positive"),
        (lambda: fx.DynamicLossScale(period=0), "period"),
        (lambda: fx.DynamicLossScale(factor=1), "factor"),
        (lambda: fx.DynamicLossScale(min_scale=0), "min_scale"),
    ],
)
def test_bad_loss_scale_arguments_are_refused(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_all_finite_looks_at_every_floating_leaf():
    assert bool(fx.all_finite({"a": jnp.ones(2), "b": None, "i": jnp.array(3)}))
    assert not bool(fx.all_finite([jnp.ones(2), jnp.array([0.0, jnp.nan])]))
    assert not bool(fx.all_finite([jnp.array(jnp.inf, jnp.float16)]))
    assert bool(fx.all_finite({"none": None}))
    assert not bool(fx.filter_jit(fx.all_finite)([jnp.array([1.0, -jnp.inf])]))


def test_select_tree_picks_arrays_and_keeps_static_leaves():
    on_true = {"w": jnp.ones(2), "n": jnp.array(1), "key": jax.random.key(0), "s": "a"}
    on_false = {
        "w": jnp.zeros(2),
        "n": jnp.array(2),
        "key": jax.random.key(1),
        "s": "a",
    }
    picked = fx.filter_jit(fx.select_tree)(FALSE, on_true, on_false)
    np.testing.assert_array_equal(picked["w"], [0.0, 0.0])
    assert int(picked["n"]) == 2 and picked["s"] == "a"
    assert fx.tree_equal(picked["key"], on_false["key"])


def test_select_tree_errors_name_the_key_path():
    with pytest.raises(ValueError, match=r"at \['b'\]"):
        fx.select_tree(
            TRUE, {"a": 1, "b": [jnp.ones(1)]}, {"a": 1, "b": (jnp.ones(1),)}
        )
    with pytest.raises(ValueError, match=r"at \['w'\].*shape and dtype"):
        fx.select_tree(TRUE, {"w": jnp.ones(2)}, {"w": jnp.ones(3)})
    with pytest.raises(ValueError, match=r"at \['s'\].*must be equal"):
        fx.select_tree(TRUE, {"s": "a"}, {"s": "b"})
    with pytest.raises(TypeError, match="boolean scalar"):
        fx.select_tree(jnp.array([True]), 1, 1)
