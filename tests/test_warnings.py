"""Deprecated names and arguments kept for Equinox code warn with
`FilteraxDeprecationWarning`: shown by default, and a `UserWarning` as
Equinox's are; `tree_inference` does not warn, as in Equinox."""

from __future__ import annotations

import warnings

import jax.numpy as jnp
import pytest

import filterax as fx


def _layer_norm_with_elementwise_affine():
    fx.nn.LayerNorm(3, elementwise_affine=False)


def _dropout_deterministic():
    fx.nn.Dropout(0.5)(jnp.ones(3), deterministic=True)


def _static_field():
    fx.static_field(default=1)


def _defvjp():
    identity = fx.filter_custom_vjp(lambda x: x)
    identity.defvjp(lambda x: (x, None), lambda res, g, x: g)


@pytest.mark.parametrize(
    "deprecated",
    [
        _layer_norm_with_elementwise_affine,
        _dropout_deterministic,
        _static_field,
        _defvjp,
    ],
)
def test_deprecations_warn_as_user_and_future_warnings(deprecated):
    with pytest.warns(UserWarning, match="deprecated") as caught:
        deprecated()
    assert caught[0].category is fx.FilteraxDeprecationWarning
    assert issubclass(caught[0].category, FutureWarning)
    assert caught[0].filename == __file__  # points at the caller


def test_deprecations_are_shown_under_pythons_default_filters():
    with warnings.catch_warnings(record=True) as caught:
        warnings.resetwarnings()  # Python's defaults hide DeprecationWarning
        warnings.simplefilter("default")
        warnings.filterwarnings("ignore", category=DeprecationWarning)
        _static_field()
    assert [w.category for w in caught] == [fx.FilteraxDeprecationWarning]


def test_tree_inference_does_not_warn():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model = fx.tree_inference(fx.nn.Dropout(0.5), True)
    assert model.inference is True
    assert model == fx.nn.inference_mode(fx.nn.Dropout(0.5), True)


def test_a_stacklevel_past_the_top_of_the_stack_still_warns():
    from filterax._warnings import warn_at_caller

    with pytest.warns(UserWarning, match="past the top"):
        warn_at_caller("past the top", UserWarning, 10_000)
