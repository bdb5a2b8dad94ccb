"""Training loops in mixed precision: float16 with a dynamic loss scale that
skips overflowing steps, and bfloat16 without scaling. The step is compiled once
however the loss scale changes."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax

import filterax as fx
from filterax import nn

OPTIMISER = optax.adam(3e-2)


def _data():
    x = jax.random.normal(jax.random.key(1), (64, 4))
    y = jnp.sin(x @ jnp.array([1.0, -2.0, 0.5, 1.5]))[:, None]
    return x, y


def _model():
    return nn.MLP(4, 1, 16, depth=2, key=jax.random.key(0))


def _make_step(policy):
    def loss_fn(model, x, y):
        pred = fx.filter_vmap(fx.mixed_precision(model, policy))(x)
        return jnp.mean((pred - y) ** 2)

    @fx.filter_jit
    @fx.debug.assert_max_traces(max_traces=1)
    def step(model, opt_state, loss_scale, x, y):
        scaled_loss = lambda m: loss_scale.scale(loss_fn(m, x, y))  # noqa: E731
        scaled, grads = fx.filter_value_and_grad(scaled_loss)(model)
        grads = loss_scale.unscale(grads)
        finite = fx.all_finite(grads)
        updates, new_opt_state = OPTIMISER.update(grads, opt_state, fx.trainable(model))
        new_model = fx.apply_updates(model, updates)
        # An overflowing step changes nothing: parameters and optimiser state
        # are those that went in.
        model, opt_state = fx.select_tree(
            finite, (new_model, new_opt_state), (model, opt_state)
        )
        return model, opt_state, loss_scale.adjust(finite), finite, loss_fn(model, x, y)

    return step


def test_float16_with_an_overflowing_start_skips_steps_then_learns():
    x, y = _data()
    model = _model()
    opt_state = OPTIMISER.init(fx.trainable(model))
    # 2**40 overflows float16 (largest value 65504) in the backward pass.
    loss_scale = fx.DynamicLossScale(2.0**40, period=10, factor=4)
    step = _make_step(fx.Precision(compute=jnp.float16))
    skipped, scales, losses = [], [], []
    for _ in range(40):
        before = (model, opt_state)
        model, opt_state, loss_scale, finite, loss = step(
            model, opt_state, loss_scale, x, y
        )
        if not finite:
            assert fx.tree_equal(before, (model, opt_state))
        skipped.append(not bool(finite))
        scales.append(float(loss_scale.loss_scale))
        losses.append(float(loss))
    assert skipped[0] and skipped[1]  # the first steps overflow and are skipped
    first_finite = skipped.index(False)
    # Each skipped step divided the scale by 4, down to one that fits.
    assert scales[:first_finite] == [2.0**40 / 4**n for n in range(1, first_finite + 1)]
    assert all(not s for s in skipped[first_finite : first_finite + 10])
    assert losses[-1] < 0.5 * losses[first_finite - 1]  # then the loss fell
    assert fx.debug.get_num_traces(step) == 1  # one compilation throughout
    parameters = jax.tree.leaves(fx.trainable(model))
    assert {leaf.dtype for leaf in parameters} == {jnp.dtype("float32")}


def test_bfloat16_without_scaling_learns_as_float32_does():
    x, y = _data()
    finals = {}
    for name, policy in {
        "f32": fx.Precision(compute=jnp.float32),
        "bf16": fx.Precision(compute=jnp.bfloat16),
    }.items():
        model, step = _model(), _make_step(policy)
        opt_state, loss_scale = OPTIMISER.init(fx.trainable(model)), fx.NoOpLossScale()
        for _ in range(30):
            model, opt_state, loss_scale, finite, loss = step(
                model, opt_state, loss_scale, x, y
            )
            assert finite
        finals[name] = float(loss)
    np.testing.assert_allclose(finals["bf16"], finals["f32"], rtol=0.2)
    assert finals["bf16"] < 0.2
