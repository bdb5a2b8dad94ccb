"""`backward_nan`: the identity going forward; prints the primal and cotangent
going back, and stops on a NaN cotangent."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

import filterax as fx
from filterax.debug import backward_nan


@fx.filter_custom_vjp
def nan_gradient(x):
    return x


@nan_gradient.def_fwd
def _nan_gradient_fwd(perturbed, x):
    return x, None


@nan_gradient.def_bwd
def _nan_gradient_bwd(residuals, grad_x, perturbed, x):
    return jnp.full_like(x, jnp.nan)


def loss_with_nan_gradient(x, terminate):
    return jnp.sum(nan_gradient(backward_nan(x, name="x", terminate=terminate)))


def test_forward_values_are_unchanged():
    x = {"a": jnp.array([1.0, 2.0]), "tag": "kept"}
    assert backward_nan(x) is not None
    out = jax.jit(lambda t: backward_nan(t))(jnp.array([1.0, 2.0]))
    assert out.tolist() == [1.0, 2.0]


def test_prints_primals_and_cotangents_on_the_backward_pass(capfd):
    capfd.readouterr()
    gradient = fx.filter_jit(jax.grad(loss_with_nan_gradient))(jnp.array([1.0]), False)
    jax.effects_barrier()
    printed, _ = capfd.readouterr()
    assert jnp.isnan(gradient).all()
    assert printed == (
        "x:\n   primals=Array([1.], dtype=float32)\n"
        "cotangents=Array([nan], dtype=float32)\n"
    )


def test_without_a_name_only_the_values_are_printed(capfd):
    capfd.readouterr()
    jax.grad(lambda x: backward_nan(x, terminate=False) * 3)(jnp.array(2.0))
    jax.effects_barrier()
    printed, _ = capfd.readouterr()
    assert printed.startswith("   primals=Array(2., dtype=float32")
    assert "cotangents=Array(3., dtype=float32" in printed


def test_a_nan_cotangent_stops_the_backward_pass(capfd):
    grad = fx.filter_jit(jax.grad(loss_with_nan_gradient))
    with pytest.raises(fx.FilteraxRuntimeError, match="Encountered NaN"):
        grad(jnp.array([1.0]), True)


def test_a_nan_cotangent_stops_an_eager_backward_pass(capfd):
    with pytest.raises(fx.FilteraxRuntimeError, match="Encountered NaN"):
        jax.grad(loss_with_nan_gradient)(jnp.array([1.0]), True)


def test_finite_cotangents_pass(capfd):
    gradient = jax.jit(jax.grad(lambda x: jnp.sum(backward_nan(x) ** 2)))(
        jnp.array([1.0, 2.0])
    )
    assert gradient.tolist() == [2.0, 4.0]


def test_works_on_pytrees_with_non_array_leaves(capfd):
    def loss(tree):
        tree = backward_nan(tree, name="tree", terminate=False)
        return tree["w"].sum() * tree["scale"]

    capfd.readouterr()
    jax.grad(loss)({"w": jnp.ones(2), "scale": 3.0})
    jax.effects_barrier()
    printed, _ = capfd.readouterr()
    assert "tree:" in printed and "'scale'" in printed
    assert "Array([3., 3.], dtype=float32)" in printed


def test_works_under_vmap(capfd):
    capfd.readouterr()
    per_example = jax.vmap(jax.grad(lambda x: backward_nan(x, terminate=False) * 2))
    assert per_example(jnp.array([1.0, 2.0])).tolist() == [2.0, 2.0]
    jax.effects_barrier()
    assert "cotangents=" in capfd.readouterr()[0]


def test_a_non_string_name_is_rejected():
    with pytest.raises(TypeError, match="name"):
        backward_nan(jnp.ones(2), name=3)  # type: ignore[arg-type]
