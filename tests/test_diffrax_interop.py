"""filterax Modules inside diffrax, optimistix and lineax (installed beside
filterax, with Equinox, by the `diffrax` extra): as a vector field trained
through `diffeqsolve`, as the function of a root find, as a matrix-free linear
operator (issue 39). The docs page `docs/diffrax.md` shows the same uses.

Without diffrax these tests are skipped, unless `FILTERAX_EQUINOX_REQUIRED` is
set (CI sets it where the `examples` extra is installed), and then they run or
fail.
"""

from __future__ import annotations

import importlib
import os
import types

import jax
import jax.numpy as jnp
import pytest

import filterax as fx


def _require(name: str) -> types.ModuleType:
    if os.environ.get("FILTERAX_EQUINOX_REQUIRED"):
        return importlib.import_module(name)
    return pytest.importorskip(name)


class VectorField(fx.Module):
    mlp: fx.nn.MLP

    def __call__(self, t: jax.Array, y: jax.Array, args: None) -> jax.Array:
        return self.mlp(y)


def _end_point(field):
    diffrax = _require("diffrax")
    solution = diffrax.diffeqsolve(
        diffrax.ODETerm(field),
        diffrax.Tsit5(),
        t0=0.0,
        t1=1.0,
        dt0=0.25,
        y0=jnp.array([1.0, 0.5]),
    )
    return solution.ys[-1]


def test_a_vector_field_module_trains_as_its_equinox_twin_does():
    # The same MLP (the same key gives the same weights) as a filterax and as
    # an Equinox vector field: the same solution and the same gradients, to
    # the last bit.
    eqx = _require("equinox")

    class EquinoxField(eqx.Module):
        mlp: eqx.nn.MLP

        def __call__(self, t, y, args):
            return self.mlp(y)

    key = jax.random.key(0)
    ours = VectorField(fx.nn.MLP(2, 2, width_size=8, depth=1, key=key))
    theirs = EquinoxField(eqx.nn.MLP(2, 2, width_size=8, depth=1, key=key))
    loss = lambda field: jnp.sum(_end_point(field) ** 2)  # noqa: E731
    our_loss, our_grads = fx.filter_jit(fx.filter_value_and_grad(loss))(ours)
    their_loss, their_grads = eqx.filter_jit(eqx.filter_value_and_grad(loss))(theirs)
    assert our_loss.tolist() == their_loss.tolist()
    assert [g.tolist() for g in jax.tree.leaves(our_grads)] == [
        g.tolist() for g in jax.tree.leaves(their_grads)
    ]


def test_a_non_differentiable_buffer_of_a_vector_field_gets_no_gradient():
    class Decay(fx.Module):
        rate: jax.Array
        source: fx.NonDifferentiable

        def __call__(self, t, y, args):
            return -self.rate * y + self.source.value

    decay = Decay(jnp.array(1.0), fx.NonDifferentiable(jnp.array(0.5)))
    grads = fx.filter_jit(fx.filter_grad(lambda f: _end_point(f).sum()))(decay)
    assert grads.source is None
    # y' = -r y + c: y(t) = c/r + (y0 - c/r) e^{-rt}, whose derivative in r at
    # r = 1, c = 0.5, t = 1 is -c + c e^{-1} - (y0 - c) e^{-1}.
    y0, c, decayed = jnp.array([1.0, 0.5]), 0.5, jnp.exp(-1.0)
    expected = jnp.sum(-c + c * decayed - (y0 - c) * decayed)
    assert jnp.allclose(grads.rate, expected, atol=1e-3)


def test_an_optimistix_root_is_differentiable_in_the_modules_parameters():
    optx = _require("optimistix")

    class Cubic(fx.Module):
        coefficients: jax.Array

        def __call__(self, y, args):
            a, b, c = self.coefficients
            return y**3 + a * y**2 + b * y + c

    def root(cubic):
        solver = optx.Newton(rtol=1e-6, atol=1e-6)
        return optx.root_find(cubic, solver, jnp.array(0.5)).value

    cubic = Cubic(jnp.array([0.0, 1.0, -2.0]))  # y**3 + y - 2, root 1
    value, grads = fx.filter_jit(fx.filter_value_and_grad(root))(cubic)
    assert jnp.allclose(value, 1.0, atol=1e-5)
    # d root / d (a, b, c) = -(root**2, root, 1) / f'(root), f'(1) = 4.
    assert jnp.allclose(grads.coefficients, jnp.array([-0.25, -0.25, -0.25]), atol=1e-4)


def test_a_lineax_solve_with_a_module_operator_matches_the_dense_solve():
    lx = _require("lineax")

    class Smoothing(fx.Module):
        strength: jax.Array

        def __call__(self, x):
            laplacian = jnp.convolve(x, jnp.array([1.0, -2.0, 1.0]), mode="same")
            return x - self.strength * laplacian

    b = jnp.arange(6.0)

    def solve(smoothing):
        operator = lx.FunctionLinearOperator(
            smoothing,
            jax.ShapeDtypeStruct(b.shape, b.dtype),
            tags=[lx.symmetric_tag, lx.positive_semidefinite_tag],
        )
        return lx.linear_solve(operator, b, solver=lx.CG(rtol=1e-7, atol=1e-7)).value

    def dense(smoothing):
        matrix = jax.vmap(smoothing, out_axes=1)(jnp.eye(6))
        return jnp.linalg.solve(matrix, b)

    smoothing = Smoothing(jnp.array(0.5))
    assert jnp.allclose(fx.filter_jit(solve)(smoothing), dense(smoothing), atol=1e-4)
    ours = fx.filter_grad(lambda s: solve(s).sum())(smoothing)
    expected = fx.filter_grad(lambda s: dense(s).sum())(smoothing)
    assert jnp.allclose(ours.strength, expected.strength, rtol=1e-3)
