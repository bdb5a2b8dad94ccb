"""`announce_transform`: the identity, announcing each transform applied to
its argument, in the order applied, ending with how it was computed."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import filterax as fx


def _run(transform, intermediates=False):
    said: list[str] = []

    def f(x):
        x = fx.debug.announce_transform(
            x, intermediates=intermediates, announce=said.append
        )
        return jnp.sin(x).sum()

    transform(f)
    return said


@pytest.mark.parametrize(
    "transform, expected",
    [
        (lambda f: f(jnp.ones(2)), ["impl"]),
        (lambda f: jax.jit(f)(jnp.ones(2)), ["abstract", "mlir"]),
        (lambda f: jax.vmap(f)(jnp.ones((3, 2))), ["vmap:impl"]),
        (
            lambda f: jax.jvp(f, (jnp.ones(2),), (jnp.ones(2),)),
            ["jvp_p:impl", "jvp_t:impl"],
        ),
        (
            lambda f: jax.grad(f)(jnp.ones(2)),
            ["jvp_p:impl", "jvp_t:abstract", "jvp_t:abstract", "jvp_t:transpose:impl"],
        ),
        (
            lambda f: jax.jit(jax.grad(f))(jnp.ones(2)),
            [
                "jvp_p:abstract",
                "jvp_t:abstract",
                "jvp_t:transpose:abstract",
                "jvp_p:mlir",
                "jvp_t:transpose:mlir",
            ],
        ),
    ],
    ids=["eager", "jit", "vmap", "jvp", "grad", "jit-grad"],
)
def test_each_transform_is_announced_in_order(transform, expected):
    said = _run(transform)
    # How often JAX re-traces a tangent (`jvp_t:abstract`) varies with its
    # caches; which announcements come, and in which order, does not.
    assert list(dict.fromkeys(said)) == list(dict.fromkeys(expected))


def test_intermediates_announce_each_transform_as_it_is_applied():
    said = _run(lambda f: jax.jit(jax.vmap(f))(jnp.ones((3, 2))), intermediates=True)
    assert said == ["vmap", "vmap:abstract", "vmap:mlir"]
    said = _run(lambda f: jax.jvp(f, (jnp.ones(2),), (jnp.ones(2),)), True)
    assert said == ["jvp", "jvp_p:impl", "jvp_t:impl"]


def test_values_and_derivatives_are_those_of_the_identity():
    tree = {"x": jnp.arange(3.0), "tag": "kept", "n": None}

    def f(tree):
        seen = fx.debug.announce_transform(tree, name="t", announce=lambda _: None)
        assert seen["tag"] == "kept" and seen["n"] is None
        return (jnp.sin(seen["x"]) * 2).sum()

    x = tree["x"]
    np.testing.assert_allclose(
        jax.grad(lambda x: f({**tree, "x": x}))(x), 2 * jnp.cos(x)
    )
    np.testing.assert_allclose(
        jax.hessian(lambda x: f({**tree, "x": x}))(x), jnp.diag(-2 * jnp.sin(x))
    )
    np.testing.assert_allclose(
        jax.jit(jax.vmap(lambda x: f({**tree, "x": x})))(jnp.ones((2, 3))),
        jnp.full(2, 6 * jnp.sin(1.0)),
        rtol=1e-6,
    )


def test_a_name_prefixes_each_announcement(capsys):
    fx.debug.announce_transform(jnp.ones(2), name="here")
    assert capsys.readouterr().out == "(here) impl\n"
    assert fx.debug.announce_transform("no arrays", name="here") == "no arrays"
    assert capsys.readouterr().out == ""
