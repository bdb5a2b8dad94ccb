"""`filter_checkpoint`."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import filterax as fx


def _block(params, x):
    hidden = jnp.tanh(params["w"] * x)
    if params["act"] == "square":
        hidden = hidden**2
    return {"y": hidden * params["b"], "act": params["act"], "n": params["n"]}


def _params() -> dict:
    return {
        "w": jnp.array([0.5, -1.0]),
        "b": jnp.array(2.0, jnp.float32),
        "act": "square",
        "n": jnp.array(4),
    }


def _loss(block, params, x):
    return block(params, x)["y"].sum()


def test_outputs_are_unchanged_including_python_objects():
    out = fx.filter_checkpoint(_block)(_params(), jnp.ones(2))
    expected = _block(_params(), jnp.ones(2))
    assert out["act"] == "square" and out["n"] == 4
    assert jnp.allclose(out["y"], expected["y"])


@pytest.mark.parametrize(
    "checkpointed",
    [
        fx.filter_checkpoint(_block),
        fx.filter_checkpoint()(_block),
        fx.filter_checkpoint(prevent_cse=False)(_block),
        fx.filter_checkpoint(_block, policy=jax.checkpoint_policies.nothing_saveable),
        fx.filter_checkpoint(
            _block, policy=jax.checkpoint_policies.everything_saveable
        ),
    ],
    ids=["call", "factory", "no-cse", "nothing-saveable", "everything-saveable"],
)
def test_gradients_match_the_uncheckpointed_function(checkpointed):
    x = jnp.array([0.3, 0.7])
    grad = fx.filter_grad(lambda p: _loss(checkpointed, p, x))(_params())
    expected = fx.filter_grad(lambda p: _loss(_block, p, x))(_params())
    assert grad["act"] is None and grad["n"] is None
    assert jnp.allclose(grad["w"], expected["w"])
    assert jnp.allclose(grad["b"], expected["b"])


def test_backward_pass_rematerialises():
    checkpointed = fx.filter_checkpoint(_block)
    jaxpr = jax.make_jaxpr(
        lambda w: jax.grad(lambda w: _loss(checkpointed, {**_params(), "w": w}, 1.0))(w)
    )(jnp.ones(2))
    names = {eqn.primitive.name for eqn in jaxpr.jaxpr.eqns}
    assert any("remat" in name or "checkpoint" in name for name in names), names


def test_non_differentiable_arguments_stay_constant():
    frozen = fx.NonDifferentiable(jnp.array([1.0, 2.0]))

    @fx.filter_checkpoint
    def f(p):
        return (p["w"] * p["frozen"].value).sum()

    grad = fx.filter_grad(f)({"w": jnp.ones(2), "frozen": frozen})
    assert grad["frozen"] is None and jnp.array_equal(grad["w"], frozen.value)


def test_works_on_module_methods():
    class Scale(fx.Module):
        w: jax.Array

        @fx.filter_checkpoint
        def __call__(self, x):
            return self.w * x

    model = Scale(jnp.array([1.0, 2.0]))
    assert jnp.array_equal(model(3.0), jnp.array([3.0, 6.0]))
    grad = fx.filter_grad(lambda m: m(3.0).sum())(model)
    assert jnp.array_equal(grad.w, jnp.full(2, 3.0))


def test_inside_scan_under_jit():
    step = fx.filter_checkpoint(lambda w, x: (w - 0.1 * jnp.cos(w * x), None))

    @fx.filter_jit
    def run(w, xs):
        return jax.grad(lambda w: jax.lax.scan(step, w, xs)[0].sum())(w)

    grad = run(jnp.ones(2), jnp.ones(5))
    expected = jax.grad(
        lambda w: jax.lax.scan(
            lambda w, x: (w - 0.1 * jnp.cos(w * x), None), w, jnp.ones(5)
        )[0].sum()
    )(jnp.ones(2))
    assert jnp.allclose(grad, expected)


def test_a_checkpointed_function_may_read_refs():
    state = jax.new_ref(jnp.full(2, 3.0))

    @fx.filter_checkpoint
    def scale(x, ref):
        return x * ref[...]

    grad = fx.filter_grad(lambda x: scale(x, state).sum())(jnp.ones(2))
    np.testing.assert_allclose(grad, 3.0)


def test_writing_a_ref_in_a_checkpointed_function_is_refused_naming_it():
    state = {"count": jax.new_ref(jnp.zeros(()))}

    @fx.filter_checkpoint
    def step(x, s):
        s["count"][...] = s["count"][...] + 1
        return x * 2

    with pytest.raises(ValueError, match=r"args\[1\]\['count'\].*would happen twice"):
        fx.filter_grad(lambda x: step(x, state).sum())(jnp.ones(2))
    assert float(state["count"][...]) == 0.0


def test_a_refused_write_names_the_ref_also_under_differentiation():
    state = {"count": jax.new_ref(jnp.zeros(()))}

    @fx.filter_checkpoint
    def step(x, s):
        s["count"][...] = s["count"][...] + 1
        return x * 2

    def loss(x, s):
        return step(x, s).sum()

    with pytest.raises(ValueError, match=r"Ref at args\[1\]\['count'\]\. "):
        fx.filter_grad(loss)(jnp.ones(2), state)
